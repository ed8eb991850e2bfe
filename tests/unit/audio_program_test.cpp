// The plan's "audio" encoder program (models/gemma4/audio_graph.cpp, replayed by the CPU executor after the
// log-mel front end, runtime/src/log_mel.*) against Hugging Face float32 get_audio_features() on the tiny
// e2b checkpoint (tools/make_audio_fixtures.py, tests/fixtures/towers/audio/), with fp32 and bf16 matmuls;
// also the program and META records the compiler writes, thread-count invariance, soft-token counts, bad
// clips, the clamps fused into the bf16 matmuls, a plan whose audio op parameters were edited, and the
// program on the plan's GPU (the CUDA encoder runner; skipped without a GPU).
#include "g4/g4.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dispatch.h"
#include "models/gemma4/audio_config.h"
#include "runtime/plan/op_params.h"
#include "runtime/src/cuda/driver.h"
#include "runtime/src/encoder_program.h"
#include "runtime/src/engine.h"
#include "runtime/src/executor.h"
#include "runtime/src/frontend/media.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

using namespace g4;
using g4test::fixture;
using json = nlohmann::json;

namespace {

std::string dir() {
    return fixture("towers/audio");
}
json meta() {
    return json::parse(g4test::read_file(dir() + "/audio.json"));
}

g4_engine* open_plan(const std::string& path) {
    g4_engine* e = nullptr;
    EXPECT_EQ(g4_engine_open(path.c_str(), nullptr, &e), G4_OK) << g4_last_error_message();
    return e;
}

// CPU plans of the fixture checkpoint (f32 weights: the float32 model HF ran): fp32 and bf16 matmuls, and one
// that takes clips of one second at most.
class AudioProgram : public ::testing::Test {
protected:
    static void compile(const std::string& plan, const std::string& extra) {
        g4test::CmdResult r =
            g4test::run_g4("compile --model '" + fixture("e2b_tiny") +
                           "' --weights f32 --no-vision --no-fidelity" + extra + " -o '" + plan + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    static void SetUpTestSuite() {
        dir_ = new g4test::TempDir();
        compile(dir_->file("a.g4plan"), "");
        compile(dir_->file("bf16.g4plan"), " --tower-precision bf16");
        compile(dir_->file("short.g4plan"), " --max-audio-seconds 1");
        engine_ = open_plan(dir_->file("a.g4plan"));
    }
    static void TearDownTestSuite() {
        g4_engine_close(engine_);
        delete dir_;
    }
    static g4_session* session(g4_engine* e, int threads) {
        g4_session_params sp = g4_session_params_default();
        sp.n_threads         = threads;
        g4_session* s        = nullptr;
        EXPECT_EQ(g4_session_create(e, &sp, &s), G4_OK) << g4_last_error_message();
        return s;
    }
    // The clip through the front end and the program: its soft tokens, or "" and the error.
    static std::string run(g4_session* s, const float* pcm, int64_t n, std::vector<float>* out,
                           g4_status* status = nullptr) {
        int32_t n_soft = 0;
        std::string err;
        const g4_status st = rt::media_add_audio(s, pcm, n, &n_soft, &err);
        if (status) *status = st;
        rt::media_clear(s);
        if (st != G4_OK) return err.empty() ? "?" : err;
        const int H = s->media->H;
        out->assign(s->media->soft, s->media->soft + (size_t)n_soft * H);
        return "";
    }
    static inline g4test::TempDir* dir_ = nullptr;
    static inline g4_engine* engine_    = nullptr;
};

} // namespace

TEST_F(AudioProgram, PlanHoldsTheProgramAndTheFrontEnd) {
    const plan::Plan& p = engine_->plan;
    ASSERT_EQ(p.n_programs(), 2u);
    const int a = p.find_program("audio");
    ASSERT_EQ(a, 1);
    const plan::PlanProgram& g = p.program(a);
    EXPECT_EQ(g.device, -1);
    EXPECT_EQ(g.op_end, p.n_ops_all());
    EXPECT_EQ(g.max_rows[0], 2999); // the valid frames of HF's 30 s
    EXPECT_EQ(g.max_rows[1], 1500);
    EXPECT_EQ(g.max_rows[2], 750);
    EXPECT_GT(g.max_rows[3], 0);
    EXPECT_GT(g.arena_bytes, 0u);
    int sequence_ops = 0;
    for (uint32_t i = g.op_begin; i < g.op_end; ++i) {
        EXPECT_GE(p.op(i).row_mode, plan::kRowCountBase) << i;
        sequence_ops += p.op(i).code >= (uint16_t)OpCode::Conv2dNormRelu;
    }
    EXPECT_GT(sequence_ops, 0);
    const auto& m = p.meta().towers->audio;
    ASSERT_TRUE(m);
    EXPECT_EQ(m->program, "audio");
    EXPECT_EQ(m->sample_rate, 16000);
    EXPECT_EQ(m->frame_length, 320);
    EXPECT_EQ(m->hop_length, 160);
    EXPECT_EQ(m->fft_length, 512);
    EXPECT_EQ(m->mel_bins, meta()["mel_bins"].get<int>());
    EXPECT_EQ(m->max_hz, 8000.0);
    EXPECT_EQ(m->mel_floor, 1e-3);
    EXPECT_EQ(p.tensor(g.inputs[0]).dims[1], m->mel_bins);
}

TEST_F(AudioProgram, MatchesHuggingFaceFloat32) {
    g4_session* s = session(engine_, 2);
    const json m  = meta();
    ASSERT_GE(m["clips"].size(), 2u);
    for (const auto& c : m["clips"]) {
        auto pcm  = g4test::read_f32(dir() + "/" + c["pcm"].get<std::string>());
        auto want = g4test::read_f32(dir() + "/" + c["tower"].get<std::string>());
        std::vector<float> got;
        ASSERT_EQ(run(s, pcm.data(), (int64_t)pcm.size(), &got), "");
        ASSERT_EQ(got.size(), want.size()) << c["name"];
        const double e = g4test::rel_l2(got.data(), want.data(), want.size());
        std::printf("  %s: %zu soft tokens, rel L2 vs HF %.3g\n", c["name"].get<std::string>().c_str(),
                    got.size() / s->media->H, e);
        EXPECT_LT(e, 1e-5);
    }
    g4_session_destroy(s);
}

TEST_F(AudioProgram, Bf16MatmulsStayCloseToHuggingFaceFloat32) {
    g4_engine* e  = open_plan(dir_->file("bf16.g4plan"));
    g4_session* s = session(e, 2);
    const json m  = meta(); // the clips list of a json that outlives the loop
    ASSERT_GE(m["clips"].size(), 2u);
    for (const auto& c : m["clips"]) {
        auto pcm  = g4test::read_f32(dir() + "/" + c["pcm"].get<std::string>());
        auto want = g4test::read_f32(dir() + "/" + c["tower"].get<std::string>());
        std::vector<float> got;
        ASSERT_EQ(run(s, pcm.data(), (int64_t)pcm.size(), &got), "");
        ASSERT_EQ(got.size(), want.size());
        const double err = g4test::rel_l2(got.data(), want.data(), want.size());
        std::printf("  %s, bf16 matmuls: rel L2 vs HF %.3g\n", c["name"].get<std::string>().c_str(), err);
        if (cpu::gemm_bf16_preferred()) {
            EXPECT_LT(err, 1e-2);
            EXPECT_GT(err, 1e-6); // the bf16 kernels did run
        } else {
            EXPECT_LT(err, 1e-5); // the fp32 GEMM on the same weights, as MatchesHuggingFaceFloat32
        }
    }
    g4_session_destroy(s);
    g4_engine_close(e);
}

// The ClippableLinear clamps the bf16 matmuls apply themselves (rt::find_clamp_fusion): every linear's
// input and output clamp, not the clip before a norm; the soft tokens bit for bit those of the program
// with every Clamp op run on its own.
TEST_F(AudioProgram, FusedClampsGiveTheUnfusedResult) {
    g4_engine* e = open_plan(dir_->file("bf16.g4plan"));
    int next = 0, prev = 0, norms = 0, clamps = 0, linears = 0;
    const plan::PlanProgram& g = e->plan.program((size_t)e->plan.find_program("audio"));
    for (size_t i = g.op_begin; i < g.op_end; ++i) {
        const plan::PlanOp& op = e->plan.op(i);
        clamps += (OpCode)op.code == OpCode::Clamp;
        linears += (OpCode)op.code == OpCode::Matmul && i + 1 < g.op_end &&
                   (OpCode)e->plan.op(i + 1).code == OpCode::Clamp && e->plan.op(i + 1).in[0] == op.out[0] &&
                   e->plan.op(i + 1).out[0] == op.out[0]; // a ClippableLinear's output clamp
        next += e->clamp_fusion[i] == rt::kClampIntoNext;
        prev += e->clamp_fusion[i] == rt::kClampIntoPrev;
        norms += e->clamp_fusion[i] == rt::kClampIntoNorm &&
                 (OpCode)e->plan.op(i + 1).code == OpCode::RmsNorm; // a gradient clip before a norm
    }
    std::printf(
        "  %d clamps: %d into the next matmul, %d into the previous one, %d into a norm, %d linears\n",
        clamps, next, prev, norms, linears);
    EXPECT_GT(linears, 0);
    EXPECT_EQ(next, linears);
    EXPECT_EQ(prev, linears);
    EXPECT_GT(norms, 0);
    EXPECT_EQ(next + prev + norms, clamps); // every clamp is applied by its neighbour
    auto pcm = g4test::read_f32(dir() + "/clip1.pcm.f32");
    std::vector<float> fused, plain;
    g4_session* s = session(e, 2);
    ASSERT_EQ(run(s, pcm.data(), (int64_t)pcm.size(), &fused), "");
    g4_session_destroy(s);
    e->clamp_fusion.assign(e->clamp_fusion.size(), 0);
    s = session(e, 2);
    ASSERT_EQ(run(s, pcm.data(), (int64_t)pcm.size(), &plain), "");
    g4_session_destroy(s);
    ASSERT_EQ(fused.size(), plain.size());
    EXPECT_EQ(std::memcmp(fused.data(), plain.data(), sizeof(float) * fused.size()), 0);
    g4_engine_close(e);
}

TEST_F(AudioProgram, SameResultWithOneAndTwoThreads) {
    auto pcm        = g4test::read_f32(dir() + "/clip1.pcm.f32");
    g4_session* one = session(engine_, 1);
    g4_session* two = session(engine_, 2);
    std::vector<float> a, b;
    ASSERT_EQ(run(one, pcm.data(), (int64_t)pcm.size(), &a), "");
    ASSERT_EQ(run(two, pcm.data(), (int64_t)pcm.size(), &b), "");
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * a.size()), 0);
    g4_session_destroy(one);
    g4_session_destroy(two);
}

// The soft tokens of a clip are HF's count (the valid frames halved, rounding up, by each stride-2 conv),
// down to the shortest clips.
TEST_F(AudioProgram, SoftTokenCountsMatchHf) {
    json cfg = json::parse(g4test::read_file(fixture("e2b_tiny/config.json")));
    gemma4::AudioHParams hp{};
    ASSERT_EQ(gemma4::parse_audio_hparams(cfg["audio_config"].dump(), cfg["text_config"]["hidden_size"], &hp),
              "");
    const gemma4::AudioFrontEnd fe = gemma4::audio_front_end(hp);
    g4_session* s                  = session(engine_, 2);
    auto noise                     = g4test::randn(16000, 7, 0.1f);
    for (int64_t n : {161, 200, 320, 321, 481, 641, 801, 1601, 4003, 16000}) {
        std::vector<float> out;
        ASSERT_EQ(run(s, noise.data(), n, &out), "") << n;
        EXPECT_EQ((int)(out.size() / s->media->H), gemma4::audio_soft_tokens(fe, n)) << n;
    }
    g4_session_destroy(s);
}

TEST_F(AudioProgram, BadClipsAreRefused) {
    g4_engine* e  = open_plan(dir_->file("short.g4plan"));
    g4_session* s = session(e, 2);
    auto pcm      = g4test::randn(16001, 3, 0.1f);
    std::vector<float> out;
    g4_status st    = G4_OK;
    std::string err = run(s, pcm.data(), 16001, &out, &st);
    EXPECT_EQ(st, G4_ERR_INVALID_ARGUMENT);
    EXPECT_NE(err.find("at most 16000"), std::string::npos) << err;
    err = run(s, pcm.data(), 0, &out, &st);
    EXPECT_NE(err.find("empty"), std::string::npos) << err;
    err = run(s, nullptr, 100, &out, &st);
    EXPECT_NE(err.find("empty"), std::string::npos) << err;
    err = run(s, pcm.data(), 160, &out, &st);
    EXPECT_EQ(st, G4_ERR_INVALID_ARGUMENT);
    EXPECT_NE(err.find("shorter than one analysis frame"), std::string::npos) << err;
    pcm[500] = NAN;
    err      = run(s, pcm.data(), 1000, &out, &st);
    EXPECT_EQ(st, G4_ERR_INVALID_ARGUMENT);
    EXPECT_NE(err.find("sample 500"), std::string::npos) << err;
    pcm[500] = 0;
    EXPECT_EQ(run(s, pcm.data(), 16000, &out), "");
    EXPECT_EQ(out.size() / s->media->H, 25u);
    g4_session_destroy(s);
    g4_engine_close(e);
}

// A plan whose audio ops' parameters were edited is refused at open, naming the op.
TEST_F(AudioProgram, EditedOpParametersAreRefused) {
    const std::string bytes = g4test::read_file(dir_->file("a.g4plan"));
    const auto [off, size]  = g4test::plan_section(bytes, (uint32_t)plan::SectionKind::Ops);
    ASSERT_GT(size, 0u);
    struct Edit {
        OpCode code;
        void (*apply)(plan::PlanOp&);
        const char* says;
    };
    const Edit edits[] = {
        {OpCode::LocalAttention,
         [](plan::PlanOp& op) {
             auto a   = plan::params<plan::LocalAttentionParams>(op);
             a.window = 100000;
             plan::set_params(op, a);
         },
         "local_attention"},
        {OpCode::Conv2dNormRelu,
         [](plan::PlanOp& op) {
             auto a  = plan::params<plan::Conv2dNormReluParams>(op);
             a.f_out = a.f_out + 1;
             plan::set_params(op, a);
         },
         "not half"},
        {OpCode::CausalConv1d,
         [](plan::PlanOp& op) {
             auto a = plan::params<plan::CausalConv1dParams>(op);
             a.k += 1;
             plan::set_params(op, a);
         },
         "conv weight"},
        {OpCode::SoftplusScale,
         [](plan::PlanOp& op) {
             auto a = plan::params<plan::SoftplusScaleParams>(op);
             a.cols += 1;
             plan::set_params(op, a);
         },
         "softplus_scale"},
    };
    for (const Edit& ed : edits) {
        std::string b = bytes;
        bool found    = false;
        for (uint64_t at = off; at + sizeof(plan::PlanOp) <= off + size && !found;
             at += sizeof(plan::PlanOp)) {
            plan::PlanOp op;
            std::memcpy(&op, b.data() + at, sizeof op);
            if (op.code != (uint16_t)ed.code) continue;
            ed.apply(op);
            std::memcpy(b.data() + at, &op, sizeof op);
            found = true;
        }
        ASSERT_TRUE(found) << ed.says;
        g4test::reseal_plan(&b);
        const std::string path = dir_->file("edited.g4plan");
        g4test::write_file(path, b);
        g4_engine* e = nullptr;
        EXPECT_EQ(g4_engine_open(path.c_str(), nullptr, &e), G4_ERR_PLAN_CORRUPT) << ed.says;
        EXPECT_NE(std::string(g4_last_error_message()).find(ed.says), std::string::npos)
            << g4_last_error_message();
        if (e) g4_engine_close(e);
    }
}

// Where the GPU's kernels cannot hold the program's per-block data in shared memory (here a query's attention
// window of 12289 keys: 49156 bytes, over the 48 KiB the kernel takes) a CUDA plan keeps the audio program on
// the CPU and says why; --place audio=gpu is refused naming the flag that runs it on the CPU. No GPU needed.
TEST_F(AudioProgram, GpuSharedMemoryLimitKeepsItOnTheCpu) {
    const std::string model = dir_->file("wide_window");
    std::filesystem::create_directory(model);
    for (const auto& e : std::filesystem::directory_iterator(fixture("e2b_tiny")))
        if (e.is_regular_file())
            std::filesystem::copy_file(e.path(), model + "/" + e.path().filename().string());
    json cfg                                      = json::parse(g4test::read_file(model + "/config.json"));
    cfg["audio_config"]["attention_context_left"] = 12290;
    g4test::write_file(model + "/config.json", cfg.dump());
    const std::string base =
        "compile --model '" + model +
        "' --device cuda --target sm_86 --weights bf16 --no-vision --no-fidelity --dry-run";
    g4test::CmdResult r = g4test::run_g4(base);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("audio tower: cpu (its attention window of 12289 keys (audio_config "
                         "attention_context_left) needs 49156 bytes of GPU shared memory"),
              std::string::npos)
        << r.err;
    r = g4test::run_g4(base + " --place audio=gpu");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("--place audio=gpu: its attention window"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--place audio=cpu runs it on the CPU"), std::string::npos) << r.err;
}

// The audio program on the plan's GPU (a CUDA plan with bf16 tower weights places it there): the program and
// META records, and its soft tokens against HF float32 (bf16 matmul operands with fp32 accumulation; the
// convolutions, norms, attention and residual stream fp32) and against the CPU program with bf16 matmuls, for
// both clips and a one-frame clip through the same buffers. Skipped without a GPU.
TEST_F(AudioProgram, RunsOnTheGpu) {
    std::string why;
    const cu::Driver* d = cu::driver(&why);
    int gpus            = 0;
    if (!d || d->cuDeviceGetCount(&gpus) != 0 || gpus < 1) GTEST_SKIP() << "no NVIDIA GPU here: " << why;
    G4_SKIP_WITHOUT_NVRTC();
    const std::string plan = dir_->file("gpu.g4plan");
    g4test::CmdResult r =
        g4test::run_g4("compile --model '" + fixture("e2b_tiny") +
                       "' --device cuda --weights bf16 --no-vision --no-fidelity -o '" + plan + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("audio tower: cuda:0"), std::string::npos) << r.err;
    g4_engine* e = open_plan(plan);
    ASSERT_TRUE(e);
    const plan::Plan& p = e->plan;
    const int a         = p.find_program("audio");
    ASSERT_GT(a, 0);
    EXPECT_EQ(p.program(a).device, p.cuda_device());
    EXPECT_TRUE(p.info().audio_gpu);
    EXPECT_EQ(p.info().audio_gpu_bytes, rt::encoder_arena_bytes(p, a) + rt::kEncoderStepBytes);
    g4_engine* cpu = open_plan(dir_->file("bf16.g4plan"));
    g4_session* s  = session(e, 2);
    g4_session* c  = session(cpu, 2);
    ASSERT_TRUE(s->media->audio_run.gpu);
    const json m = meta();
    ASSERT_GE(m["clips"].size(), 2u);
    for (const auto& clip : m["clips"]) {
        auto pcm  = g4test::read_f32(dir() + "/" + clip["pcm"].get<std::string>());
        auto want = g4test::read_f32(dir() + "/" + clip["tower"].get<std::string>());
        std::vector<float> got, on_cpu;
        ASSERT_EQ(run(s, pcm.data(), (int64_t)pcm.size(), &got), "");
        ASSERT_EQ(run(c, pcm.data(), (int64_t)pcm.size(), &on_cpu), "");
        ASSERT_EQ(got.size(), want.size());
        ASSERT_EQ(got.size(), on_cpu.size());
        const double hf = g4test::rel_l2(got.data(), want.data(), want.size()),
                     vs = g4test::rel_l2(got.data(), on_cpu.data(), got.size());
        std::printf("  %s on the GPU: rel L2 vs HF %.3g, vs the CPU program (bf16 matmuls) %.3g\n",
                    clip["name"].get<std::string>().c_str(), hf, vs);
        EXPECT_LT(hf, 1e-2);
        EXPECT_GT(hf, 0.0); // bf16 operands: not bit-equal to float32
        EXPECT_LT(vs, 1e-2);
    }
    std::vector<float> one(161, 0.1f), out;
    ASSERT_EQ(run(s, one.data(), 161, &out), "");
    EXPECT_EQ(out.size(), (size_t)s->media->H);
    for (float v : out)
        EXPECT_TRUE(std::isfinite(v));
    g4_session_destroy(c);
    g4_session_destroy(s);
    g4_engine_close(cpu);
    g4_engine_close(e);
}
