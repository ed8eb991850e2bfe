// The plan's "vision" encoder program (models/gemma4/vision_graph.cpp, replayed by the CPU executor) against
// Hugging Face float32 get_image_features() on the tiny e2b checkpoint (tools/make_vision_fixtures.py,
// tests/fixtures/towers/vision/), with fp32 and bf16 matmuls; also the programs table it lives in,
// thread-count and padding invariance and the grid checks of the front end.
#include "g4/g4.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dispatch.h"
#include "runtime/src/encoder_program.h"
#include "runtime/src/engine.h"
#include "runtime/src/frontend/media.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

using namespace g4;
using g4test::fixture;
using g4test::rel_l2;

namespace {

const char* kDir = "towers/vision/";

nlohmann::json meta() {
    return nlohmann::json::parse(g4test::read_file(fixture(std::string(kDir) + "meta.json")));
}

struct Image {
    std::vector<float> pixels; // [n, 768]
    std::vector<int32_t> pos;  // [n, 2]
    std::vector<float> out;    // [n_soft, text hidden] HF
    int n = 0, n_soft = 0;
    std::string name;
};

Image load_image(const nlohmann::json& e) {
    Image im;
    std::string u8 = g4test::read_file(fixture(kDir + e["pixels"]["file"].get<std::string>()));
    im.pixels.resize(u8.size());
    for (size_t i = 0; i < u8.size(); ++i) // bit-exact HF pixel_values (see make_vision_fixtures.py)
        im.pixels[i] = (float)((double)(uint8_t)u8[i] * (1.0 / 255.0));
    std::string p = g4test::read_file(fixture(kDir + e["pos"]["file"].get<std::string>()));
    im.pos.resize(p.size() / 4);
    std::memcpy(im.pos.data(), p.data(), p.size());
    im.out    = g4test::read_f32(fixture(kDir + e["out"]["file"].get<std::string>()));
    im.n      = e["n_patches"].get<int>();
    im.n_soft = e["n_soft"].get<int>();
    im.name   = e["name"].get<std::string>();
    return im;
}

// One CPU plan of the fixture checkpoint (f32 weights: the float32 model HF ran) with the fixture's patch
// budget, and a session on it.
class VisionProgram : public ::testing::Test {
protected:
    static void compile(const std::string& plan, const std::string& extra) {
        const int tokens    = meta()["max_patches"].get<int>() / 9;
        g4test::CmdResult r = g4test::run_g4("compile --model '" + fixture("e2b_tiny") +
                                             "' --weights f32 --no-audio --no-fidelity " + "--image-tokens " +
                                             std::to_string(tokens) + extra + " -o '" + plan + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    static void SetUpTestSuite() {
        dir_ = new g4test::TempDir();
        compile(dir_->file("v.g4plan"), "");
        ASSERT_EQ(g4_engine_open(dir_->file("v.g4plan").c_str(), nullptr, &engine_), G4_OK)
            << g4_last_error_message();
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
    // The program over one image's patches: its soft tokens, or "" and the error.
    static std::string run(g4_session* s, const float* px, const int32_t* pos, int n,
                           std::vector<float>* out) {
        int32_t n_soft = 0;
        std::string err;
        if (rt::media_vision_patches(s, px, pos, n, &n_soft, &err) != G4_OK) return err.empty() ? "?" : err;
        const int H = s->media->H;
        out->assign(s->media->soft, s->media->soft + (size_t)n_soft * H);
        return "";
    }
    static inline g4test::TempDir* dir_ = nullptr;
    static inline g4_engine* engine_    = nullptr;
};

} // namespace

TEST_F(VisionProgram, PlanHoldsTheProgram) {
    const plan::Plan& p = engine_->plan;
    ASSERT_EQ(p.n_programs(), 2u);
    EXPECT_STREQ(p.str(p.program(0).name), "text");
    const int v = p.find_program("vision");
    ASSERT_EQ(v, 1);
    const plan::PlanProgram& g = p.program(v);
    EXPECT_EQ(g.device, -1);
    EXPECT_EQ(g.op_begin, p.n_ops());
    EXPECT_EQ(g.op_end, p.n_ops_all());
    EXPECT_EQ(g.max_rows[0], meta()["max_patches"].get<int>());
    EXPECT_EQ(g.max_rows[1], meta()["max_patches"].get<int>() / 9);
    EXPECT_GT(g.arena_bytes, 0u);
    for (uint32_t i = g.op_begin; i < g.op_end; ++i)
        EXPECT_GE(p.op(i).row_mode, plan::kRowCountBase) << i;
}

// g4_engine_info's session figure counts the program's arena, as large as the one a session allocates.
TEST_F(VisionProgram, SessionFigureCoversTheProgramArena) {
    const plan::Plan& p = engine_->plan;
    const int v         = p.find_program("vision");
    ASSERT_GT(v, 0);
    const uint64_t arena = rt::encoder_arena_bytes(p, v);
    EXPECT_GE(arena, p.program(v).arena_bytes);
    g4_engine_info info{};
    ASSERT_EQ(g4_engine_get_info(engine_, &info), G4_OK);
    const auto& in = p.info();
    EXPECT_GE(info.session_bytes, in.act_arena_bytes + in.kv_arena_bytes + in.tower_session_bytes + arena);
    g4_session* s = session(engine_, 1);
    ASSERT_NE(s, nullptr);
    ASSERT_NE(s->media, nullptr);
    EXPECT_EQ(s->media->vision_run.program, v); // the CPU session bound (allocated) the program's arena
    EXPECT_NE(s->media->vision_run.arena, nullptr);
    g4_session_destroy(s);
}

TEST_F(VisionProgram, MatchesHuggingFaceFloat32) {
    g4_session* s = session(engine_, 2);
    const auto m  = meta();
    ASSERT_EQ(m["images"].size(), 2u);
    for (const auto& e : m["images"]) {
        Image im = load_image(e);
        std::vector<float> out;
        ASSERT_EQ(run(s, im.pixels.data(), im.pos.data(), im.n, &out), "");
        ASSERT_EQ(out.size(), im.out.size());
        const double err = rel_l2(out.data(), im.out.data(), out.size());
        std::printf("  %s (%d patches, %d soft tokens): rel L2 vs HF = %.3g\n", im.name.c_str(), im.n,
                    im.n_soft, err);
        EXPECT_LT(err, 2e-6) << im.name;
    }
    g4_session_destroy(s);
}

TEST_F(VisionProgram, SameResultWithOneAndTwoThreads) {
    g4_session *s1 = session(engine_, 1), *s2 = session(engine_, 2);
    Image im = load_image(meta()["images"][0]);
    std::vector<float> a, b;
    ASSERT_EQ(run(s1, im.pixels.data(), im.pos.data(), im.n, &a), "");
    ASSERT_EQ(run(s2, im.pixels.data(), im.pos.data(), im.n, &b), "");
    EXPECT_EQ(a, b);
    g4_session_destroy(s1);
    g4_session_destroy(s2);
}

TEST_F(VisionProgram, PaddingIsInvisibleAndBadGridsAreRefused) {
    g4_session* s = session(engine_, 2);
    Image im      = load_image(meta()["images"][0]);
    std::vector<float> a, b;
    ASSERT_EQ(run(s, im.pixels.data(), im.pos.data(), im.n, &a), "");
    const int max = meta()["max_patches"].get<int>();
    if (im.n < max) { // HF padding rows (-1, -1) after the real ones change nothing
        std::vector<float> px    = im.pixels;
        std::vector<int32_t> pos = im.pos;
        px.resize((size_t)(im.n + 1) * 768, 0.25f);
        pos.push_back(-1), pos.push_back(-1);
        ASSERT_EQ(run(s, px.data(), pos.data(), im.n + 1, &b), "");
        EXPECT_EQ(a, b);
    }
    std::vector<int32_t> dup = im.pos;
    dup[2] = dup[0], dup[3] = dup[1]; // two patches at one position
    EXPECT_NE(run(s, im.pixels.data(), dup.data(), im.n, &b).find("share position"), std::string::npos);
    EXPECT_NE(run(s, im.pixels.data(), im.pos.data(), max + 1, &b), "");
    g4_session_destroy(s);
}

// bf16 GEMMs and attention (--tower-precision bf16, Matmul ip4 = 2, SelfAttention ip3 = 1): close to HF
// float32, and visibly not the fp32 program where the CPU has AVX-512 BF16; elsewhere the fp32 kernels run.
TEST_F(VisionProgram, Bf16MatmulsStayCloseToHuggingFaceFloat32) {
    const std::string plan = dir_->file("bf16.g4plan");
    compile(plan, " --tower-precision bf16");
    g4_engine* e = nullptr;
    ASSERT_EQ(g4_engine_open(plan.c_str(), nullptr, &e), G4_OK) << g4_last_error_message();
    const plan::Plan& p        = e->plan;
    const plan::PlanProgram& g = p.program(p.find_program("vision"));
    for (uint32_t i = g.op_begin; i < g.op_end; ++i)
        if (p.op(i).code == (uint16_t)OpCode::Matmul) {
            EXPECT_EQ(p.op(i).ip[4], 2);
        } else if (p.op(i).code == (uint16_t)OpCode::SelfAttention) {
            EXPECT_EQ(p.op(i).ip[3], 1); // the bf16 attention (where the CPU has AVX-512 BF16)
        }
    g4_session* s               = session(e, 2);
    const nlohmann::json images = meta()["images"]; // a copy: a range-for over meta()["images"] dangles
    for (const auto& m : images) {
        Image im = load_image(m);
        std::vector<float> out;
        ASSERT_EQ(run(s, im.pixels.data(), im.pos.data(), im.n, &out), "");
        const double err = rel_l2(out.data(), im.out.data(), im.out.size());
        std::printf("  %s bf16 matmuls: rel L2 vs HF float32 = %.3g\n", im.name.c_str(), err);
        if (cpu::gemm_bf16_preferred()) {
            EXPECT_LT(err, 1e-2) << im.name;
            EXPECT_GT(err, 1e-5) << im.name;
        } else {
            EXPECT_LT(err, 1e-5) << im.name; // as MatchesHuggingFaceFloat32
        }
    }
    g4_session_destroy(s);
    g4_engine_close(e);
}
