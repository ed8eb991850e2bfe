// The CPU's LM-head screening through the C API (runtime/src/cpu_lm_screen.h): greedy decode on the tiny
// fixture (512-token vocabulary: several screening tasks) gives the tokens of a plan compiled with
// --no-lm-screen over many steps, the steps are screened (g4_session_stats.lm_screened), and whatever reads
// the logits of a screened step (g4_session_get_logits, a non-greedy sample, a saved state) gets the full
// head's bits. The kernel's bound and argmax at every CPU level: tests/ops/cpu_kernels_test.cpp (LmScreen.*).
#include "capi_util.h"
#include "g4/g4.h"
#include "test_util.h"

#include <cstring>
#include <gtest/gtest.h>
#include <string>
#include <vector>

namespace {

using namespace g4test;

class LmScreenCpu : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = new TempDir();
        for (const char* flags : {"", "--no-lm-screen"}) {
            const std::string plan = dir_->file(*flags ? "full.g4plan" : "screen.g4plan");
            CmdResult r            = run_g4("compile --model '" + fixture("e2b_tiny") + "' " + flags +
                                            " --no-fidelity --max-context 256 -o '" + plan + "'");
            ASSERT_EQ(r.exit_code, 0) << r.err;
        }
    }
    static void TearDownTestSuite() {
        delete dir_;
        dir_ = nullptr;
    }
    void SetUp() override {
        ASSERT_EQ(g4_engine_open(dir_->file("screen.g4plan").c_str(), nullptr, &screen_.e), G4_OK)
            << g4_last_error_message();
        ASSERT_EQ(g4_engine_open(dir_->file("full.g4plan").c_str(), nullptr, &full_.e), G4_OK)
            << g4_last_error_message();
        g4_engine_info info{};
        ASSERT_EQ(g4_engine_get_info(full_.e, &info), G4_OK);
        vocab_ = info.vocab_size;
    }
    static g4_session* create(Engine& e, Session& s) {
        g4_session_params sp = g4_session_params_default();
        sp.n_threads         = 2;
        EXPECT_EQ(g4_session_create(e.e, &sp, &s.s), G4_OK) << g4_last_error_message();
        return s.s;
    }
    static TempDir* dir_;
    Engine screen_, full_;
    int vocab_ = 0;
};
TempDir* LmScreenCpu::dir_ = nullptr;

TEST_F(LmScreenCpu, GreedyTokensAreTheFullHeads) {
    for (int prompt = 0; prompt < 3; ++prompt) {
        Session a, b;
        ASSERT_TRUE(create(screen_, a) && create(full_, b));
        std::vector<int32_t> p = {2};
        for (int k = 0; k < 4 + 9 * prompt; ++k)
            p.push_back(10 + (prompt * 53 + k * 17) % 480);
        ASSERT_EQ(g4_session_append_tokens(a.s, p.data(), p.size(), nullptr, 0), G4_OK);
        ASSERT_EQ(g4_session_append_tokens(b.s, p.data(), p.size(), nullptr, 0), G4_OK);
        for (int step = 0; step < 60; ++step) {
            int32_t ta = -1, tb = -2;
            ASSERT_EQ(g4_session_sample(a.s, nullptr, &ta), G4_OK);
            ASSERT_EQ(g4_session_sample(b.s, nullptr, &tb), G4_OK);
            ASSERT_EQ(ta, tb) << "prompt " << prompt << " step " << step;
            ASSERT_EQ(g4_session_append_tokens(a.s, &ta, 1, nullptr, 0), G4_OK);
            ASSERT_EQ(g4_session_append_tokens(b.s, &tb, 1, nullptr, 0), G4_OK);
        }
        g4_session_stats sa{}, sb{};
        ASSERT_EQ(g4_session_get_stats(a.s, &sa), G4_OK);
        ASSERT_EQ(g4_session_get_stats(b.s, &sb), G4_OK);
        EXPECT_GE(sa.lm_screened, 55) << "the greedy steps are screened";
        EXPECT_EQ(sb.lm_screened, 0);
    }
}

TEST_F(LmScreenCpu, LogitsOfAScreenedStepAreTheFullHeads) {
    Session a, b;
    ASSERT_TRUE(create(screen_, a) && create(full_, b));
    const std::vector<int32_t> p = {2, 40, 41, 300, 7};
    ASSERT_EQ(g4_session_append_tokens(a.s, p.data(), p.size(), nullptr, 0), G4_OK);
    ASSERT_EQ(g4_session_append_tokens(b.s, p.data(), p.size(), nullptr, 0), G4_OK);
    g4_sampling_params hot = g4_sampling_params_default();
    hot.temperature = 0.9f, hot.seed = 5;
    for (int step = 0; step < 12; ++step) {
        int32_t ta = -1, tb = -2;
        ASSERT_EQ(g4_session_sample(a.s, nullptr, &ta), G4_OK); // greedy: screened
        ASSERT_EQ(g4_session_sample(b.s, nullptr, &tb), G4_OK);
        ASSERT_EQ(ta, tb);
        const float *la = nullptr, *lb = nullptr;
        if (step % 3 == 0) { // the logits read after the screened token
            ASSERT_EQ(g4_session_get_logits(a.s, &la, nullptr), G4_OK);
            ASSERT_EQ(g4_session_get_logits(b.s, &lb, nullptr), G4_OK);
            ASSERT_EQ(std::memcmp(la, lb, sizeof(float) * vocab_), 0) << "step " << step;
        }
        if (step % 3 == 1) { // a non-greedy sample of the same step
            ASSERT_EQ(g4_session_sample(a.s, &hot, &ta), G4_OK);
            ASSERT_EQ(g4_session_sample(b.s, &hot, &tb), G4_OK);
            ASSERT_EQ(ta, tb) << "step " << step;
        }
        if (step % 3 == 2) { // a saved state holds the full logits
            size_t n = 0;
            ASSERT_EQ(g4_session_state_size(a.s, &n), G4_OK);
            std::vector<uint8_t> st(n);
            ASSERT_EQ(g4_session_save_state(a.s, st.data(), n, &n), G4_OK) << g4_last_error_message();
            Session c;
            ASSERT_TRUE(create(screen_, c));
            ASSERT_EQ(g4_session_load_state(c.s, st.data(), n), G4_OK) << g4_last_error_message();
            ASSERT_EQ(g4_session_get_logits(c.s, &la, nullptr), G4_OK);
            ASSERT_EQ(g4_session_get_logits(b.s, &lb, nullptr), G4_OK);
            ASSERT_EQ(std::memcmp(la, lb, sizeof(float) * vocab_), 0) << "step " << step;
        }
        ASSERT_EQ(g4_session_append_tokens(a.s, &ta, 1, nullptr, 0), G4_OK);
        ASSERT_EQ(g4_session_append_tokens(b.s, &tb, 1, nullptr, 0), G4_OK);
    }
    g4_session_stats st{};
    ASSERT_EQ(g4_session_get_stats(a.s, &st), G4_OK);
    EXPECT_GT(st.lm_screened, 0);
}

} // namespace
