// CUDA plans whose layers span devices (--place layers=A-B:gpu0,C-D:gpu1,E-F:cpu), without a GPU: the
// compiler's cross-device rewrite (copy steps, mirrored KV caches of donors on another device, the
// split of the weights and KV arenas) is checked by running the plan on the CPU kernels with each
// GPU's memory replaced by a separate host arena (rt::run_step_split). Any value a copy step fails to
// bring over is stale there, so the logits must equal, bit for bit, those of the same plan compiled
// without --place, run the same way, over a chunked prompt past the sliding window and greedy decode
// steps. The real GPU runs of these plans are bench/e2e/cross_device_bench.sh (H100/H200, one or two GPUs).
#include "runtime/src/engine.h"
#include "runtime/src/executor.h"
#include "test_util.h"

#include <cstring>
#include <gtest/gtest.h>
#include <map>
#include <nlohmann/json.hpp>

namespace {

using namespace g4test;

struct Emulated {
    g4_engine e;
    g4_session s;
    std::vector<uint64_t> act, kv;                  // host arenas
    std::map<int, std::vector<uint64_t>> gact, gkv; // per GPU: stand-ins of its arenas
    std::map<int, uint8_t*> gpu_act;
    std::vector<float> scratch;
    std::vector<int32_t> ids;

    explicit Emulated(const std::string& plan) {
        std::string err;
        EXPECT_EQ(e.plan.load(plan, false, &err), G4_OK) << err;
        EXPECT_EQ(g4::rt::check_ops(e.plan), "");
        const auto& in = e.plan.info();
        s.engine       = &e;
        s.pool         = std::make_unique<g4::cpu::ThreadPool>(2);
        size_t stride  = g4::cpu::scratch_floats_per_thread(in.max_k, in.max_slots);
        scratch.assign(stride * 2, 0.0f);
        s.ctx = {s.pool.get(), scratch.data(), stride};
        act.assign(in.act_arena_bytes / 8 + 8, 0);
        kv.assign((in.kv_arena_bytes - in.kv_host_begin) / 8 + 8, 0);
        ids.assign(in.max_rows, 0);
        s.act        = (uint8_t*)act.data();
        s.kv         = (uint8_t*)kv.data();
        s.kv_offset0 = in.kv_host_begin;
        s.ids        = ids.data();
        g4::rt::bind_ops(&s);
        for (const auto& g : in.gpus) {
            gact[g.index].assign(in.act_arena_bytes / 8 + 8, 0);
            gkv[g.index].assign((g.kv_end - g.kv_begin) / 8 + 8, 0);
            gpu_act[g.index] = (uint8_t*)gact[g.index].data();
            g4::rt::bind_gpu_ops(&s, g.index, gpu_act[g.index], (uint8_t*)gkv[g.index].data());
        }
    }
    // Logits of the last row of a step of `tok` at positions pos.. (read from the GPU stand-in).
    std::vector<float> step(const std::vector<int32_t>& tok, int pos) {
        std::copy(tok.begin(), tok.end(), ids.begin());
        std::string err;
        EXPECT_EQ(g4::rt::run_step_split(&s, gpu_act, (int)tok.size(), pos, 1, &err), G4_OK) << err;
        const auto& in = e.plan.info();
        const float* l =
            (const float*)(gpu_act.at(e.plan.cuda_device()) + e.plan.tensor(in.logits_tensor).offset);
        return std::vector<float>(l, l + in.vocab_size);
    }
};

// Prefill of 21 tokens in chunks of 8, then 6 greedy steps: every step's logits.
std::vector<std::vector<float>> generate(const std::string& plan) {
    Emulated m(plan);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 21; ++i)
        prompt.push_back(2 + (i * 37 + 11) % 500);
    std::vector<std::vector<float>> out;
    int pos = 0;
    for (size_t c = 0; c < prompt.size(); c += 8) {
        std::vector<int32_t> chunk(prompt.begin() + c, prompt.begin() + std::min(prompt.size(), c + 8));
        out.push_back(m.step(chunk, pos));
        pos += (int)chunk.size();
    }
    for (int i = 0; i < 6; ++i) {
        const auto& l = out.back();
        int32_t next  = (int32_t)(std::max_element(l.begin(), l.end()) - l.begin());
        out.push_back(m.step({next}, pos++));
    }
    return out;
}

// Every step's logits equal, bit for bit.
void expect_same_logits(const std::vector<std::vector<float>>& got,
                        const std::vector<std::vector<float>>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k)
        EXPECT_EQ(std::memcmp(got[k].data(), want[k].data(), got[k].size() * 4), 0)
            << "step " << k << ": relative L2 " << rel_l2(got[k].data(), want[k].data(), got[k].size());
}

std::string compile(const TempDir& d, const std::string& name, const std::string& place) {
    const std::string plan = d.file(name + ".g4plan");
    // --deterministic: the CPU kernels standing in for the GPU read row-major NF4, not the fused MLP's tiled
    // down weights (an sm_90 plan's default).
    CmdResult r = run_g4("compile --model '" + fixture("e2b_tiny_text") +
                         "' --device cuda --target sm_90 --deterministic --chunk 8 --no-fidelity " +
                         (place.empty() ? "" : "--place " + place + " ") + "-o '" + plan + "'");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (!place.empty()) {
        EXPECT_NE(r.err.find("cross-device:"), std::string::npos) << r.err;
    }
    return plan;
}

TEST(CrossDevice, CpuPlacedLayersGiveTheSameLogitsAsTheGpuOnlyPlan) {
    G4_SKIP_WITHOUT_NVRTC();
    TempDir d;
    const auto want = generate(compile(d, "gpu", ""));
    // The fixture: 10 layers, 6-9 KV-shared (6-8 read layer 5's sliding cache, 9 layer 4's full one).
    for (const std::string place : {"layers=0-6:gpu,7-9:cpu",                    // CPU readers of GPU donors
                                    "layers=0-5:cpu,6-9:gpu",                    // GPU readers of CPU donors
                                    "layers=0-1:cpu,2-4:gpu,5-7:cpu,8-9:gpu"}) { // both, several boundaries
        SCOPED_TRACE(place);
        const std::string plan = compile(d, "hybrid", place);
        g4::plan::Plan p;
        std::string err;
        ASSERT_EQ(p.load(plan, false, &err), G4_OK) << err;
        ASSERT_TRUE(p.hybrid());
        size_t copies = 0;
        for (size_t i = 0; i < p.n_ops(); ++i)
            copies += p.op(i).code == (uint16_t)g4::OpCode::Copy;
        EXPECT_GT(copies, 0u);
        ASSERT_EQ(p.info().gpus.size(), 1u);
        ASSERT_EQ(p.info().gpus[0].weights.size(), 1u);
        EXPECT_LT(p.info().gpus[0].weights[0].second,
                  p.weights_bytes()); // the CPU layers' weights stay on the host
        EXPECT_LT(p.info().kv_host_begin, p.info().kv_arena_bytes);
        expect_same_logits(generate(plan), want);
    }
}

// Layers on two GPUs (and the CPU): each GPU uploads only the weights its ops read, owns its part of
// the KV arena, and the logits equal the one-GPU plan's bit for bit.
TEST(CrossDevice, LayersOnTwoGpusGiveTheSameLogitsAsTheOneGpuPlan) {
    G4_SKIP_WITHOUT_NVRTC();
    TempDir d;
    const auto want = generate(compile(d, "gpu", ""));
    for (const std::string place : {"layers=0-4:gpu0,5-9:gpu1", // GPU 1 reads GPU 0's donors
                                    "layers=0-5:gpu1,6-9:gpu0", // the plan's GPU reads GPU 1's
                                    "layers=0-2:gpu0,3-5:gpu1,6-7:cpu,8-9:gpu1"}) { // two GPUs and the CPU
        SCOPED_TRACE(place);
        const std::string plan = compile(d, "two", place);
        g4::plan::Plan p;
        std::string err;
        ASSERT_EQ(p.load(plan, false, &err), G4_OK) << err;
        const auto& in = p.info();
        ASSERT_EQ(in.gpus.size(), 2u);
        EXPECT_EQ(in.gpus[0].index, 0);
        EXPECT_EQ(in.gpus[1].index, 1);
        size_t peer = 0;
        for (size_t i = 0; i < p.n_ops(); ++i)
            peer += p.op(i).code == (uint16_t)g4::OpCode::Copy && p.op(i).ip[1] >= 0 && p.op(i).ip[2] >= 0;
        EXPECT_GT(peer, 0u);
        uint64_t w[2] = {0, 0};
        for (int g = 0; g < 2; ++g)
            for (auto [b, e] : in.gpus[g].weights)
                w[g] += e - b;
        EXPECT_LT(w[0], p.weights_bytes());
        EXPECT_LT(w[1], p.weights_bytes());
        EXPECT_GT(w[1], 0u);
        EXPECT_LE(in.gpus[0].kv_end, in.gpus[1].kv_begin); // disjoint parts of the KV arena
        EXPECT_GT(in.gpus[1].kv_end, in.gpus[1].kv_begin);
        expect_same_logits(generate(plan), want);
    }
}

// The memory plan moves the CPU layers' weights and caches from the GPU's figure to the host's.
TEST(CrossDevice, MemoryPlanMovesTheCpuLayersToTheHost) {
    G4_SKIP_WITHOUT_NVRTC();
    TempDir d;
    auto table = [&](const std::string& place) {
        const std::string plan = compile(d, "m", place);
        g4::plan::Plan p;
        std::string err;
        EXPECT_EQ(p.load(plan, false, &err), G4_OK) << err;
        return nlohmann::json::parse(p.meta_json())["memory"];
    };
    auto part = [](const nlohmann::json& dev, const std::string& prefix) {
        for (const auto& x : dev["parts"])
            if (x["what"].get<std::string>().rfind(prefix, 0) == 0) return x["bytes"].get<uint64_t>();
        return (uint64_t)0;
    };
    const auto all = table(""), split = table("layers=0-6:gpu,7-9:cpu");
    EXPECT_LT(part(split[0], "weights"), part(all[0], "weights"));
    EXPECT_GT(part(split[1], "CPU layers' weights"), 0u);
    // Equal up to the alignment padding where the weights split into two groups.
    EXPECT_NEAR((double)(part(split[0], "weights") + part(split[1], "CPU layers' weights")),
                (double)part(all[0], "weights"), (double)g4::plan::kWeightAlign);
    EXPECT_GT(part(split[1], "CPU layers' KV cache"), 0u); // mirrors of layers 4 and 5's caches
    EXPECT_EQ(split[1]["device"], "host");
}

} // namespace
