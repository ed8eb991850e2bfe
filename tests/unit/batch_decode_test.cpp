// g4_sessions_decode (runtime/include/g4/g4.h "batched decode", runtime/src/batch.cpp): sessions decoding
// in batched steps give the logits and greedy tokens of the same sessions decoding alone, on the tiny
// fixture with sliding (window 8: the decode runs past it) and global layers and KV-shared layers; sessions
// join and leave between steps; batches above the NF4 GEMV's 8 rows; and every refused call. Plans: NF4 with
// --cpu-precision f32 (float32 arithmetic) and the default fast (int16 activations); G4_TEST_CUDA=1 adds a
// CUDA plan, its groups of 2..16 batched (G4_CUDA_BATCH=1) and by default (groups of up to 8 as lone steps,
// the 11 sessions' groups of 9..11 batched).
#include "capi_util.h"
#include "g4/g4.h"
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <gtest/gtest.h>
#include <string>
#include <vector>

namespace {

using namespace g4test;

double rel_l2(const float* a, const float* b, int n) {
    double d = 0, r = 0;
    for (int i = 0; i < n; ++i)
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
    return std::sqrt(d / (r > 0 ? r : 1));
}

struct PlanCase {
    const char* name;
    const char* flags;
    double tol; // relative L2 of a batched step's logits from the same session's lone step
    bool cuda;
    const char* cuda_batch = "1"; // G4_CUDA_BATCH for a CUDA plan ("" unset: groups of 9..16 batched)
};

// The prompts (different lengths: the sessions sit at different positions) and the steps decoded.
constexpr int kSessions = 11, kSteps = 14;
std::vector<int32_t> prompt_of(int i) {
    std::vector<int32_t> p = {2};
    for (int k = 0; k < 3 + 2 * i; ++k)
        p.push_back(10 + (i * 37 + k * 11) % 400);
    return p;
}

class BatchDecode : public ::testing::TestWithParam<PlanCase> {
protected:
    void SetUp() override {
        if (GetParam().cuda && !on_cuda())
            GTEST_SKIP() << "needs a GPU (G4_TEST_CUDA=1) and a build with the CUDA toolkit (NVRTC)";
        if (GetParam().cuda && *GetParam().cuda_batch) setenv("G4_CUDA_BATCH", GetParam().cuda_batch, 1);
        if (GetParam().cuda && !*GetParam().cuda_batch) unsetenv("G4_CUDA_BATCH"); // env.h CudaBatch::Auto
        // One plan per case for the whole run (both tests of a case open it).
        static TempDir dir; // removed at exit
        plan_ = dir.file(std::string(GetParam().name) + ".g4plan");
        if (!file_exists(plan_)) {
            // G4_TEST_BATCH_MODEL: a checkpoint for the CUDA cases instead of the tiny fixture, e.g. one at
            // Gemma 4 E2B's shapes (bench/e2e/e2e_bench.py --checkpoint-only), whose matmuls of 9..16 rows
            // split K and whose split sums run the norms after them (the tiny fixture's K is too short).
            const char* big         = std::getenv("G4_TEST_BATCH_MODEL");
            const std::string model = GetParam().cuda && big && *big ? std::string(big) : fixture("e2b_tiny");
            CmdResult r             = run_g4("compile --model '" + model + "' " + GetParam().flags +
                                             " --no-fidelity --max-context 64 -o '" + plan_ + "'");
            ASSERT_EQ(r.exit_code, 0) << r.err;
        }
        ASSERT_EQ(g4_engine_open(plan_.c_str(), nullptr, &eng_.e), G4_OK) << g4_last_error_message();
        g4_engine_info info{};
        ASSERT_EQ(g4_engine_get_info(eng_.e, &info), G4_OK);
        vocab_ = info.vocab_size;
    }
    g4_session* create(Session& s) {
        g4_session_params sp = g4_session_params_default();
        sp.n_threads         = 2;
        EXPECT_EQ(g4_session_create(eng_.e, &sp, &s.s), G4_OK) << g4_last_error_message();
        return s.s;
    }
    // Each of the n sessions decoding alone: each one's greedy tokens and the logits of every decode step.
    void lone_steps(int n, std::vector<std::vector<int32_t>>* tok, std::vector<std::vector<float>>* logits) {
        tok->assign(n, {});
        logits->assign(n, {});
        for (int i = 0; i < n; ++i) {
            Session s;
            ASSERT_TRUE(create(s));
            const std::vector<int32_t> p = prompt_of(i);
            ASSERT_EQ(g4_session_append_tokens(s.s, p.data(), p.size(), nullptr, 0), G4_OK);
            for (int k = 0; k < kSteps; ++k) {
                int32_t t = -1;
                ASSERT_EQ(g4_session_sample(s.s, nullptr, &t), G4_OK);
                ASSERT_EQ(g4_session_append_tokens(s.s, &t, 1, nullptr, 0), G4_OK) << g4_last_error_message();
                const float* l = nullptr;
                ASSERT_EQ(g4_session_get_logits(s.s, &l, nullptr), G4_OK);
                (*tok)[i].push_back(t);
                (*logits)[i].insert((*logits)[i].end(), l, l + vocab_);
            }
        }
    }
    std::string plan_;
    Engine eng_;
    int vocab_ = 0;
};

TEST_P(BatchDecode, BatchedStepsGiveTheLogitsAndTokensOfLoneSteps) {
    std::vector<std::vector<int32_t>> ref_tok;
    std::vector<std::vector<float>> ref_logits;
    ASSERT_NO_FATAL_FAILURE(lone_steps(kSessions, &ref_tok, &ref_logits));
    // Batched: every session prefilled alone, then batched steps where session i sits out the steps with
    // (step + i) % 5 == 0 (it leaves and joins again), until each has decoded kSteps tokens.
    std::vector<Session> ss(kSessions);
    for (int i = 0; i < kSessions; ++i) {
        ASSERT_TRUE(create(ss[i]));
        const std::vector<int32_t> p = prompt_of(i);
        ASSERT_EQ(g4_session_append_tokens(ss[i].s, p.data(), p.size(), nullptr, 0), G4_OK);
    }
    const size_t lim = (size_t)g4_engine_max_batch(eng_.e);
    ASSERT_GE(lim, (size_t)kSessions); // 16, the plan's logits rows
    std::vector<int> done(kSessions, 0);
    double worst = 0;
    for (int step = 0; step < 3 * kSteps; ++step) {
        std::vector<g4_session*> batch;
        std::vector<int32_t> toks;
        std::vector<int> who;
        for (int i = 0; i < kSessions; ++i) {
            if (done[i] == kSteps || (step + i) % 5 == 0) continue;
            int32_t t = -1;
            ASSERT_EQ(g4_session_sample(ss[i].s, nullptr, &t), G4_OK);
            ASSERT_EQ(t, ref_tok[i][done[i]]) << "session " << i << " token " << done[i];
            batch.push_back(ss[i].s), toks.push_back(t), who.push_back(i);
        }
        if (batch.empty()) break;
        for (size_t j = 0; j < batch.size(); j += lim)
            ASSERT_EQ(g4_sessions_decode(batch.data() + j, std::min(lim, batch.size() - j), toks.data() + j),
                      G4_OK)
                << g4_last_error_message();
        for (int i : who) {
            const float* l = nullptr;
            ASSERT_EQ(g4_session_get_logits(ss[i].s, &l, nullptr), G4_OK);
            const double e = rel_l2(l, ref_logits[i].data() + (size_t)done[i] * vocab_, vocab_);
            worst          = std::max(worst, e);
            EXPECT_LE(e, GetParam().tol) << "session " << i << " step " << done[i];
            EXPECT_EQ(g4_session_position(ss[i].s), (int32_t)prompt_of(i).size() + done[i] + 1);
            ++done[i];
        }
    }
    for (int i = 0; i < kSessions; ++i)
        EXPECT_EQ(done[i], kSteps) << "session " << i;
    std::printf("batched vs lone steps, %s plan: worst relative L2 %.3g\n", GetParam().name, worst);
    g4_session_stats st{};
    ASSERT_EQ(g4_session_get_stats(ss[0].s, &st), G4_OK);
    EXPECT_EQ(st.decode_tokens, kSteps);
}

// The same group of sessions stepping together again and again (on CUDA its step is captured as a graph on
// the second step and replayed after): the tokens and logits of lone steps.
TEST_P(BatchDecode, AnUnchangedGroupGivesTheLogitsAndTokensOfLoneSteps) {
    constexpr int kGroup = 5;
    std::vector<std::vector<int32_t>> ref_tok;
    std::vector<std::vector<float>> ref_logits;
    ASSERT_NO_FATAL_FAILURE(lone_steps(kGroup, &ref_tok, &ref_logits));
    std::vector<Session> ss(kGroup);
    std::vector<g4_session*> batch;
    for (int i = 0; i < kGroup; ++i) {
        ASSERT_TRUE(create(ss[i]));
        const std::vector<int32_t> p = prompt_of(i);
        ASSERT_EQ(g4_session_append_tokens(ss[i].s, p.data(), p.size(), nullptr, 0), G4_OK);
        batch.push_back(ss[i].s);
    }
    double worst = 0;
    for (int k = 0; k < kSteps; ++k) {
        std::vector<int32_t> toks(kGroup);
        for (int i = 0; i < kGroup; ++i) {
            ASSERT_EQ(g4_session_sample(ss[i].s, nullptr, &toks[i]), G4_OK);
            ASSERT_EQ(toks[i], ref_tok[i][k]) << "session " << i << " token " << k;
        }
        ASSERT_EQ(g4_sessions_decode(batch.data(), kGroup, toks.data()), G4_OK) << g4_last_error_message();
        for (int i = 0; i < kGroup; ++i) {
            const float* l = nullptr;
            ASSERT_EQ(g4_session_get_logits(ss[i].s, &l, nullptr), G4_OK);
            const double e = rel_l2(l, ref_logits[i].data() + (size_t)k * vocab_, vocab_);
            worst          = std::max(worst, e);
            EXPECT_LE(e, GetParam().tol) << "session " << i << " step " << k;
        }
    }
    std::printf("unchanged group vs lone steps, %s plan: worst relative L2 %.3g\n", GetParam().name, worst);
}

TEST_P(BatchDecode, RefusedCallsFeedNothing) {
    const int lim = g4_engine_max_batch(eng_.e);
    ASSERT_GT(lim, 0);
    EXPECT_EQ(g4_engine_max_batch(nullptr), 0);
    std::vector<Session> ss(lim + 1);
    std::vector<g4_session*> ptr;
    for (auto& s : ss) {
        ASSERT_TRUE(create(s));
        const int32_t p[2] = {2, 20};
        ASSERT_EQ(g4_session_append_tokens(s.s, p, 2, nullptr, 0), G4_OK);
        ptr.push_back(s.s);
    }
    std::vector<int32_t> toks(lim + 1, 30);
    auto refused = [&](g4_status want, g4_session* const* s, size_t n, const int32_t* t, const char* what) {
        EXPECT_EQ(g4_sessions_decode(s, n, t), want) << what;
        EXPECT_NE(std::string(g4_last_error_message()), "") << what;
        for (auto& x : ss)
            EXPECT_EQ(g4_session_position(x.s), 2) << what;
    };
    refused(G4_ERR_INVALID_ARGUMENT, nullptr, 2, toks.data(), "NULL sessions");
    refused(G4_ERR_INVALID_ARGUMENT, ptr.data(), 2, nullptr, "NULL tokens");
    refused(G4_ERR_INVALID_ARGUMENT, ptr.data(), lim + 1, toks.data(), "above the limit");
    g4_session* dup[3] = {ptr[0], ptr[1], ptr[0]};
    refused(G4_ERR_INVALID_ARGUMENT, dup, 3, toks.data(), "a session twice");
    std::vector<int32_t> bad = {30, vocab_, 30};
    refused(G4_ERR_INVALID_ARGUMENT, ptr.data(), 3, bad.data(), "a token outside the vocabulary");
    bad[1] = -1;
    refused(G4_ERR_INVALID_ARGUMENT, ptr.data(), 3, bad.data(), "a negative token");
    g4_session* gone[2] = {ptr[0], reinterpret_cast<g4_session*>(&toks)};
    refused(G4_ERR_INVALID_ARGUMENT, gone, 2, toks.data(), "an invalid handle");
    {
        Engine other;
        ASSERT_EQ(g4_engine_open(plan_.c_str(), nullptr, &other.e), G4_OK);
        Session o;
        ASSERT_EQ(g4_session_create(other.e, nullptr, &o.s), G4_OK);
        const int32_t p[2] = {2, 20};
        ASSERT_EQ(g4_session_append_tokens(o.s, p, 2, nullptr, 0), G4_OK);
        g4_session* mixed[2] = {ptr[0], o.s};
        refused(G4_ERR_INVALID_ARGUMENT, mixed, 2, toks.data(), "sessions of two engines");
    }
    g4_session_cancel(ptr[1]);
    refused(G4_ERR_CANCELLED, ptr.data(), 2, toks.data(), "a cancelled session");
    // The cancellation was consumed: the same call now feeds both.
    ASSERT_EQ(g4_sessions_decode(ptr.data(), 2, toks.data()), G4_OK) << g4_last_error_message();
    EXPECT_EQ(g4_session_position(ptr[0]), 3);
    EXPECT_EQ(g4_session_position(ptr[1]), 3);
    // A full context (max context 64): sessions[1] is full, sessions[0] is not; neither is fed.
    std::vector<int32_t> fill(61, 40);
    ASSERT_EQ(g4_session_append_tokens(ptr[1], fill.data(), fill.size(), nullptr, 0), G4_OK);
    EXPECT_EQ(g4_sessions_decode(ptr.data(), 2, toks.data()), G4_ERR_CONTEXT_FULL);
    EXPECT_NE(std::string(g4_last_error_message()).find("sessions[1]"), std::string::npos)
        << g4_last_error_message();
    EXPECT_EQ(g4_session_position(ptr[0]), 3);
    EXPECT_EQ(g4_session_position(ptr[1]), 64);
    EXPECT_EQ(g4_sessions_decode(ptr.data(), 0, toks.data()), G4_OK);
}

// Tolerances: with --cpu-precision f32 the bf16 matmuls (LM head, per-layer projections) run as Eigen
// products, whose float32 sums over several rows round differently from the one-row product's (measured worst
// on this fixture 2.5e-6 after 14 steps, each step's difference carried on through the KV cache); the fast
// plan's matmuls of 1-8 rows are the int16 GEMVs, row by row (measured: bit-identical), its bound that of a
// rounding step of 1/16383 of a block's largest value. CUDA: a lone decode step runs the fused decode
// kernels, a batched one the prefill kernels (float32 products both with --mlp-precision f32; the default
// packed-f16 MLP products differ from them by ~1e-3 a step, enough to flip near-tied greedy tokens of the
// random fixture); the two paths' bf16 intermediates (KV cache, attention inputs) round apart, measured worst
// 1.5e-3 over 14 steps on an H200, so the bound is one bf16 rounding step (2^-8). The test prints the worst
// it saw.
INSTANTIATE_TEST_SUITE_P(Plans, BatchDecode,
                         ::testing::Values(PlanCase{"nf4_f32", "--cpu-precision f32", 1e-5, false},
                                           PlanCase{"nf4_fast", "", 2e-3, false},
                                           PlanCase{"cuda", "--device cuda --mlp-precision f32", 4e-3, true},
                                           PlanCase{"cuda_auto", "--device cuda --mlp-precision f32", 4e-3,
                                                    true, ""}),
                         [](const auto& i) { return std::string(i.param.name); });

} // namespace
