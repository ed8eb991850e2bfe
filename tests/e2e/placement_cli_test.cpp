// `g4 compile --gpu-mem/--cpu-mem/--place` through the CLI on the tiny E2B fixture: refusals exit 1
// with the message on stderr, the smallest budget and --max-context they name really fit, and the
// placement and memory plan land in the plan's META (g4 inspect, plan reader). CUDA plans are sized
// with --dry-run --target, which needs no GPU.
#include "runtime/plan/plan_reader.h"
#include "test_util.h"

#include <algorithm>
#include <gtest/gtest.h>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

namespace {

using namespace g4test;

std::string cuda_dry(const std::string& args) {
    return "compile --model '" + fixture("e2b_tiny") + "' --device cuda --target sm_90 --dry-run " + args;
}

// The first group of `re` in `s`, or "".
std::string match(const std::string& s, const std::string& re) {
    std::smatch m;
    return std::regex_search(s, m, std::regex(re)) ? m[1].str() : "";
}

void expect_refused(const CmdResult& r, const std::vector<std::string>& needles) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    for (const auto& n : needles)
        EXPECT_NE(r.err.find(n), std::string::npos) << "expected '" << n << "' in: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
}

TEST(PlacementCli, RefusalNamesTheSmallestBudgetAndItFits) {
    CmdResult r = run_g4(cuda_dry("--gpu-mem 0:1MiB"));
    expect_refused(r, {"g4 compile: error: cuda:0 needs", "but --gpu-mem 0:1MiB was given", "KV cache",
                       "the smallest budget that fits this plan is --gpu-mem 0:"});
    const std::string flag =
        match(r.err, "smallest budget that fits this plan is (--gpu-mem 0:[0-9.]+[KMG]iB)");
    const std::string bytes = match(
        r.err, "smallest budget that fits this plan is --gpu-mem 0:[0-9.]+[KMG]iB \\(([0-9]+) bytes\\)");
    ASSERT_FALSE(flag.empty()) << r.err;
    ASSERT_FALSE(bytes.empty()) << r.err;
    // The exact figure fits, one byte less does not, and the rounded flag value fits.
    CmdResult exact = run_g4(cuda_dry("--gpu-mem 0:" + bytes));
    EXPECT_EQ(exact.exit_code, 0) << exact.err;
    EXPECT_NE(exact.err.find("cuda:0"), std::string::npos);
    CmdResult less = run_g4(cuda_dry("--gpu-mem 0:" + std::to_string(std::stoull(bytes) - 1)));
    expect_refused(less, {"the smallest budget that fits this plan is " + flag + " (" + bytes + " bytes)"});
    EXPECT_EQ(run_g4(cuda_dry(flag)).exit_code, 0) << flag;
}

TEST(PlacementCli, PleMovesToHostOnlyWhenNeeded) {
    CmdResult roomy = run_g4(cuda_dry("--gpu-mem 8GiB"));
    ASSERT_EQ(roomy.exit_code, 0) << roomy.err;
    EXPECT_NE(roomy.err.find("PLE table on cuda:0"), std::string::npos) << roomy.err;
    const uint64_t all_on_gpu =
        std::stoull(match(run_g4(cuda_dry("--place ple=gpu --gpu-mem 1KiB")).err, "\\(([0-9]+) bytes\\)"));
    // One byte short of everything on the GPU: the PLE table goes to host memory and it fits.
    CmdResult tight = run_g4(cuda_dry("--gpu-mem " + std::to_string(all_on_gpu - 1)));
    ASSERT_EQ(tight.exit_code, 0) << tight.err;
    EXPECT_NE(tight.err.find("PLE table in pinned host memory (ple=host, chosen automatically"),
              std::string::npos)
        << tight.err;
    EXPECT_NE(tight.err.find("PLE table 160.0 KiB"), std::string::npos) << tight.err;
    // With the PLE table forced onto the GPU the same budget is refused.
    std::string figure = "(";
    figure += std::to_string(all_on_gpu) + " bytes)";
    expect_refused(run_g4(cuda_dry("--place ple=gpu --gpu-mem " + std::to_string(all_on_gpu - 1))), {figure});
}

// Budgets for two GPUs and no layers= in --place: a plan that does not fit the first GPU even with the
// PLE table on the host is split across both, the first GPU taking as many layers as fit.
TEST(PlacementCli, LayersSplitAcrossBudgetedGpusWhenOneDoesNotFit) {
    const uint64_t ple_host_min =
        std::stoull(match(run_g4(cuda_dry("--place ple=host --gpu-mem 1KiB")).err, "\\(([0-9]+) bytes\\)"));
    const std::string b0 = std::to_string(ple_host_min - 1);
    expect_refused(run_g4(cuda_dry("--gpu-mem 0:" + b0 + " --gpu-mem 1:1KiB")),
                   {"ple=host, tried automatically",
                    "splitting the text layers across the GPUs with a --gpu-mem budget does not fit either"});
    G4_SKIP_WITHOUT_NVRTC();
    TempDir d;
    const std::string plan = d.file("split.g4plan");
    CmdResult r            = run_g4("compile --model '" + fixture("e2b_tiny") +
                                    "' --device cuda --target sm_90 --no-fidelity --gpu-mem 0:" + b0 +
                                    " --gpu-mem 1:1GiB -o '" + plan + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("its text layers are split across the budgeted GPUs"), std::string::npos) << r.err;
    g4::plan::Plan p;
    std::string err;
    ASSERT_EQ(p.load(plan, false, &err), G4_OK) << err;
    const auto& ld = p.info().layer_device;
    ASSERT_EQ((int)ld.size(), p.info().num_layers);
    EXPECT_EQ(ld.front(), 0);
    EXPECT_EQ(ld.back(), 1);
    EXPECT_TRUE(std::is_sorted(ld.begin(), ld.end())); // one contiguous range per GPU, the plan's GPU first
    ASSERT_EQ(p.info().gpus.size(), 2u);
    const nlohmann::json meta = nlohmann::json::parse(p.meta_json()); // kept: the loop reads a part of it
    for (const auto& dev : meta["memory"])
        if (dev["device"] == "cuda:0") {
            EXPECT_LE(dev["total"].get<uint64_t>(), ple_host_min - 1);
        }
}

TEST(PlacementCli, SmallerMaxContextNamedByTheRefusalFits) {
    const uint64_t need =
        std::stoull(match(run_g4(cuda_dry("--place ple=gpu --gpu-mem 1KiB")).err, "\\(([0-9]+) bytes\\)"));
    const std::string budget = std::to_string(need - 64 * 1024);
    CmdResult r              = run_g4(cuda_dry("--place ple=gpu --gpu-mem " + budget));
    expect_refused(r, {"or reduce --max-context: at --max-context"});
    const std::string ctx = match(r.err, "at --max-context ([0-9]+) cuda:0 needs");
    ASSERT_FALSE(ctx.empty()) << r.err;
    EXPECT_LT(std::stoi(ctx), 4096);
    CmdResult ok = run_g4(cuda_dry("--place ple=gpu --gpu-mem " + budget + " --max-context " + ctx));
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST(PlacementCli, BadOptionsExitNonZeroWithTheReason) {
    struct Case {
        std::string args;
        std::vector<std::string> needles;
    };
    const Case cases[] = {
        {"--place tower=cpu", {"unknown component 'tower'", "vision, audio, ple, embed, lm_head, layers"}},
        {"--place ple=tpu", {"unknown target 'tpu'"}},
        {"--gpu-mem 12XB", {"--gpu-mem '12XB'", "unknown unit", "12GiB"}},
        {"--cpu-mem lots", {"--cpu-mem 'lots' is not a size"}},
        {"--place layers=0-4:gpu,6-9:gpu", {"layer(s) 5 have no target"}},
        {"--place layers=0-5:gpu,5-9:gpu", {"overlap"}},
        {"--place layers=0-10:gpu", {"goes past", "10 layers, 0-9"}},
        {"--place layers=0-4:gpu0,5-9:gpu1 --gpu-mem 0:1GiB",
         {"cuda:1", "no --gpu-mem budget", "--gpu-mem 1:SIZE"}},
        {"--place layers=0-4:gpu0,5-9:gpu1 --gpu-mem 0:1GiB --gpu-mem 1:1MiB",
         {"cuda:1 needs", "--gpu-mem 1:1MiB was given", "--gpu-mem 1:"}},
        {"--gpu-mem 1:1GiB", {"nothing ever lands on a GPU that was not given a budget", "--gpu-mem 0:SIZE"}},
        {"--max-context 99999999", {"--max-context", "max_position_embeddings"}},
        {"--kv-dtype f16", {"unknown --kv-dtype 'f16'", "expected bf16 or f32"}},
    };
    for (const auto& c : cases)
        expect_refused(run_g4(cuda_dry(c.args)), c.needles);
    expect_refused(run_g4("compile --model '" + fixture("e2b_tiny") + "' --dry-run --gpu-mem 1GiB"),
                   {"CPU plan", "--device cuda"});
}

// The KV cache's bytes in a plan's META memory table, and that part's label.
std::pair<uint64_t, std::string> kv_part(const std::string& plan) {
    g4::plan::Plan p;
    std::string err;
    EXPECT_EQ(p.load(plan, false, &err), G4_OK) << err;
    const nlohmann::json meta = nlohmann::json::parse(p.meta_json());
    for (const auto& part : meta["memory"][0]["parts"])
        if (part["what"].get<std::string>().rfind("KV cache", 0) == 0)
            return {part["bytes"].get<uint64_t>(), part["what"].get<std::string>()};
    ADD_FAILURE() << "no KV cache in the memory plan of " << plan;
    return {0, ""};
}

TEST(PlacementCli, KvDtypeBf16HalvesTheKvCache) {
    TempDir td;
    // --chunk 57: sliding rings of 64 slots, so no cache tensor needs alignment padding and bf16 is exactly
    // half.
    std::map<std::string, std::pair<uint64_t, std::string>> kv;
    for (const std::string dt : {"f32", "bf16"}) {
        const std::string plan = td.file(dt + ".g4plan");
        CmdResult r            = run_g4("compile --model '" + fixture("e2b_tiny") +
                                        "' --no-fidelity --chunk 57 --kv-dtype " + dt + " -o '" + plan + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_NE(r.err.find("KV cache (" + dt + ")"), std::string::npos) << r.err;
        kv[dt] = kv_part(plan);
        EXPECT_EQ(kv[dt].second, "KV cache (" + dt + ")");
        CmdResult i = run_g4("inspect '" + plan + "' --ops");
        EXPECT_NE(i.out.find("KV cache " + dt), std::string::npos) << i.out;
    }
    ASSERT_GT(kv["bf16"].first, 0u);
    EXPECT_EQ(kv["f32"].first, 2 * kv["bf16"].first);
    // Defaults: bf16 for CUDA plans, f32 for CPU plans.
    EXPECT_NE(run_g4(cuda_dry("")).err.find("KV cache: bf16"), std::string::npos);
    EXPECT_NE(run_g4("compile --model '" + fixture("e2b_tiny") + "' --dry-run").err.find("KV cache: f32"),
              std::string::npos);
}

TEST(PlacementCli, BudgetCheckCountsTheKvDtype) {
    auto need = [](const std::string& dt) {
        return std::stoull(match(run_g4(cuda_dry("--kv-dtype " + dt + " --place ple=gpu --gpu-mem 1KiB")).err,
                                 "\\(([0-9]+) bytes\\)"));
    };
    const uint64_t n32 = need("f32"), n16 = need("bf16");
    ASSERT_LT(n16, n32);
    // A budget that holds the bf16 plan: it fits; the f32 plan is refused and told a smaller --max-context
    // that fits.
    const std::string budget = " --place ple=gpu --gpu-mem " + std::to_string(n16);
    EXPECT_EQ(run_g4(cuda_dry("--kv-dtype bf16" + budget)).exit_code, 0);
    CmdResult r = run_g4(cuda_dry("--kv-dtype f32" + budget));
    expect_refused(r, {"KV cache (f32)", "or reduce --max-context: at --max-context"});
    const std::string ctx = match(r.err, "at --max-context ([0-9]+) cuda:0 needs");
    ASSERT_FALSE(ctx.empty()) << r.err;
    EXPECT_LT(std::stoi(ctx), 4096);
    EXPECT_EQ(run_g4(cuda_dry("--kv-dtype f32" + budget + " --max-context " + ctx)).exit_code, 0);
}

TEST(PlacementCli, CpuPlanRecordsItsMemoryPlan) {
    TempDir td;
    std::string plan = td.file("p.g4plan");
    CmdResult tiny   = run_g4("compile --model '" + fixture("e2b_tiny") +
                              "' --no-fidelity --cpu-mem 1KiB -o '" + plan + "'");
    expect_refused(tiny, {"cpu needs", "--cpu-mem 1KiB was given", "scratch"});
    EXPECT_FALSE(file_exists(plan));
    CmdResult r = run_g4("compile --model '" + fixture("e2b_tiny") + "' --no-fidelity --cpu-mem 64MiB -o '" +
                         plan + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    CmdResult i = run_g4("inspect '" + plan + "' --ops");
    ASSERT_EQ(i.exit_code, 0) << i.err;
    for (const char* s : {"placement: text layers 0-9 on cpu", "memory by device", "64.00 MiB",
                          "scratch 32.0 KiB per thread"})
        EXPECT_NE(i.out.find(s), std::string::npos) << "missing '" << s << "' in " << i.out;
    g4::plan::Plan p;
    std::string err;
    ASSERT_EQ(p.load(plan, false, &err), G4_OK) << err;
    auto meta = nlohmann::json::parse(p.meta_json());
    EXPECT_EQ(meta["placement"]["device"], "cpu");
    EXPECT_EQ(meta["memory"][0]["device"], "cpu");
    EXPECT_EQ(meta["memory"][0]["budget"], 64ull << 20);
    EXPECT_EQ(meta["memory"][0]["parts"][2]["bytes"], p.info().kv_arena_bytes);
    EXPECT_FALSE(p.ple_on_host());
}

TEST(PlacementCli, CudaPlanWithThePleTableOnTheHost) {
    TempDir td;
    std::string plan = td.file("c.g4plan");
    CmdResult r =
        run_g4("compile --model '" + fixture("e2b_tiny") +
               "' --device cuda --target sm_86 --no-fidelity --place ple=host,vision=cpu,audio=cpu " +
               "--gpu-mem 0:1GiB --cpu-mem 64MiB -o '" + plan + "'");
    if (r.exit_code != 0 && r.err.find("without the CUDA toolkit") != std::string::npos)
        GTEST_SKIP() << "built without NVRTC";
    ASSERT_EQ(r.exit_code, 0) << r.err;
    g4::plan::Plan p;
    std::string err;
    ASSERT_EQ(p.load(plan, false, &err), G4_OK) << err;
    EXPECT_TRUE(p.ple_on_host());
    auto meta = nlohmann::json::parse(p.meta_json());
    EXPECT_EQ(meta["placement"]["ple"], "host");
    EXPECT_EQ(meta["placement"]["ple_auto"], false);
    ASSERT_EQ(meta["memory"].size(), 2u);
    EXPECT_EQ(meta["memory"][0]["device"], "cuda:0");
    EXPECT_EQ(meta["memory"][1]["device"], "host");
    uint64_t ple = 0;
    for (size_t t = 0; t < p.n_tensors(); ++t)
        if (std::string(p.str(p.tensor(t).name)) == "embed_tokens_per_layer.weight") ple = p.tensor(t).nbytes;
    ASSERT_GT(ple, 0u);
    // The GPU holds the text weights less the PLE table; the towers' weights stay in host memory too.
    const uint64_t towers = p.info().towers_end - p.info().towers_begin;
    ASSERT_GT(towers, 0u);
    EXPECT_EQ(meta["memory"][0]["parts"][0]["bytes"], p.weights_bytes() - ple - towers);
    EXPECT_EQ(meta["memory"][1]["parts"][1]["bytes"], ple);
    EXPECT_EQ(meta["memory"][1]["parts"][2]["what"], "towers' weights");
    EXPECT_EQ(meta["memory"][1]["parts"][2]["bytes"], towers);
    // A host budget below the towers' share names it and the smallest budget that fits.
    CmdResult small = run_g4("compile --model '" + fixture("e2b_tiny") +
                             "' --device cuda --target sm_86 --no-fidelity --place ple=host " +
                             "--gpu-mem 0:1GiB --cpu-mem 1MiB -o '" + td.file("d.g4plan") + "'");
    EXPECT_NE(small.exit_code, 0);
    EXPECT_NE(small.err.find("towers' buffers"), std::string::npos) << small.err;
    EXPECT_NE(small.err.find("the smallest budget that fits this plan is --cpu-mem"), std::string::npos)
        << small.err;
    CmdResult i = run_g4("inspect '" + plan + "' --ops");
    EXPECT_NE(i.out.find("PLE table in pinned host memory (ple=host)"), std::string::npos) << i.out;
}

} // namespace
