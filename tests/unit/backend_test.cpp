// The backend interface (runtime/src/backend.h) through a CPU plan's session backend: a step run through it
// gives the logits the C API gives, on the host (a greedy step that screens the LM head: its token, then its
// logits when fetched); the CPU backend samples nothing on a device; KV rows go to
// host memory and back, and into another session of the plan, byte for byte.
#include "g4/g4.h"
#include "runtime/src/backend.h"
#include "runtime/src/engine.h"
#include "test_util.h"

#include <cstring>
#include <gtest/gtest.h>
#include <string>
#include <vector>

namespace {

using namespace g4test;

class Backend : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_             = new TempDir();
        std::string plan = dir_->file("t.g4plan");
        CmdResult r      = run_g4("compile --model '" + fixture("e2b_tiny") +
                                  "' --no-audio --no-vision --chunk 8 -o '" + plan + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        ASSERT_EQ(g4_engine_open(plan.c_str(), nullptr, &engine_), G4_OK) << g4_last_error_message();
    }
    static void TearDownTestSuite() {
        g4_engine_close(engine_);
        delete dir_;
    }
    static g4_session* create() {
        g4_session* s = nullptr;
        EXPECT_EQ(g4_session_create(engine_, nullptr, &s), G4_OK) << g4_last_error_message();
        return s;
    }
    static TempDir* dir_;
    static g4_engine* engine_;
};
TempDir* Backend::dir_             = nullptr;
g4_engine* Backend::engine_        = nullptr;
const std::vector<int32_t> kPrompt = {2, 100, 200, 300, 400, 17};

TEST_F(Backend, CpuStepGivesTheCApisLogits) {
    g4_session* a = create();
    g4_session* b = create();
    ASSERT_TRUE(a && b);
    // One step of the whole prompt (it fits a chunk), as the direct call below runs it.
    const int32_t V = engine_->plan.info().vocab_size;
    ASSERT_LE(kPrompt.size(), (size_t)engine_->plan.info().max_rows);
    ASSERT_EQ(g4_session_append_tokens(a, kPrompt.data(), kPrompt.size(), nullptr, 0), G4_OK)
        << g4_last_error_message();
    const float* want = nullptr;
    ASSERT_EQ(g4_session_get_logits(a, &want, nullptr), G4_OK);
    std::memcpy(b->ids, kPrompt.data(), kPrompt.size() * 4);
    g4::rt::LogitsAt at = g4::rt::LogitsAt::Device;
    std::string err;
    ASSERT_EQ(b->backend->run_step((int32_t)kPrompt.size(), 0, 1, false, &at, &err), G4_OK) << err;
    EXPECT_EQ(at, g4::rt::LogitsAt::Host);
    EXPECT_EQ(std::memcmp(b->logits, want, sizeof(float) * V), 0);
    EXPECT_EQ(b->backend->device_topk_max(), 0);
    // A step the caller may sample greedily (ahead) stops before the LM head where the plan screens it
    // (docs/runtime.md "LM-head screening on the CPU"): the greedy token without the logits, then the
    // logits when fetched.
    ASSERT_EQ(b->backend->run_step((int32_t)kPrompt.size(), 0, 1, true, &at, &err), G4_OK) << err;
    if (at == g4::rt::LogitsAt::Device) {
        int32_t best = 0;
        for (int32_t i = 1; i < V; ++i)
            if (want[i] > want[best]) best = i;
        EXPECT_EQ(b->backend->device_argmax(), best);
    }
    EXPECT_EQ(b->backend->fetch_logits(&err), G4_OK);
    EXPECT_EQ(std::memcmp(b->logits, want, sizeof(float) * V), 0);
    EXPECT_EQ(b->backend->state_changed(&err), G4_OK);
    g4_session_destroy(a);
    g4_session_destroy(b);
}

TEST_F(Backend, CpuKvRowsRoundTripAndCopyIntoAnotherSession) {
    g4_session* a = create();
    g4_session* b = create();
    ASSERT_TRUE(a && b);
    ASSERT_EQ(g4_session_append_tokens(a, kPrompt.data(), kPrompt.size(), nullptr, 0), G4_OK);
    const auto& p = engine_->plan;
    std::string err;
    int caches = 0;
    for (size_t t = 0; t < p.n_tensors(); ++t) {
        const auto& ten = p.tensor(t);
        if (ten.kind != (uint8_t)g4::plan::TensorKind::KvCache || ten.dims[0] <= 0) continue;
        const size_t bytes = ten.nbytes / (size_t)ten.dims[0] * kPrompt.size(); // the rows written
        std::vector<uint8_t> from_a(bytes), from_b(bytes, 0xAB), zero(bytes, 0);
        ASSERT_EQ(a->backend->kv_transfer(ten.offset, from_a.data(), bytes, true, &err), G4_OK) << err;
        EXPECT_NE(from_a, zero) << "cache " << p.str(ten.name) << " holds no rows after a prefill";
        ASSERT_EQ(a->backend->kv_copy(*b->backend, ten.offset, bytes, &err), G4_OK) << err;
        ASSERT_EQ(b->backend->kv_transfer(ten.offset, from_b.data(), bytes, true, &err), G4_OK) << err;
        EXPECT_EQ(from_a, from_b);
        // Back from host memory into a: the rows read again are those written.
        ASSERT_EQ(a->backend->kv_transfer(ten.offset, zero.data(), bytes, false, &err), G4_OK) << err;
        ASSERT_EQ(a->backend->kv_transfer(ten.offset, from_b.data(), bytes, true, &err), G4_OK) << err;
        EXPECT_EQ(from_b, zero);
        ++caches;
    }
    EXPECT_GT(caches, 0);
    g4_session_destroy(a);
    g4_session_destroy(b);
}

} // namespace
