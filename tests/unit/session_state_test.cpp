// Session state through the C API: a state saved after a 2,000-token prompt and loaded in a new process
// gives bit-identical logits and continuations; rewind and re-append equals the original; a fork continues
// as its source; damaged or foreign states are refused; the prefill progress callback; the API version;
// multimodal chat rendering into ids. On a CUDA machine (G4_TEST_CUDA=1) the same checks run on a CUDA plan.
#include "capi_util.h"
#include "g4/g4.h"
#include "test_util.h"

#include <cstdlib>
#include <cstring>
#include <gtest/gtest.h>
#include <random>
#include <unistd.h>

namespace {

using namespace g4test;

constexpr int kPrompt = 2000; // prompt tokens; the plans hold 4096

using g4test::Engine;
using g4test::Session;

void open_engine(const std::string& plan, Engine* e) {
    ASSERT_EQ(g4_engine_open(plan.c_str(), nullptr, &e->e), G4_OK) << g4_last_error_message();
}
void new_session(const Engine& e, Session* s) {
    g4_session_params sp = g4_session_params_default();
    sp.n_threads         = 2;
    ASSERT_EQ(g4_session_create(e.e, &sp, &s->s), G4_OK) << g4_last_error_message();
}

std::vector<int32_t> prompt_ids(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> ids(n);
    ids[0] = 2;
    for (int i = 1; i < n; ++i)
        ids[i] = 3 + (int32_t)(rng() % 500);
    return ids;
}

std::vector<float> logits(g4_session* s) {
    const float* l = nullptr;
    int32_t v      = 0;
    EXPECT_EQ(g4_session_get_logits(s, &l, &v), G4_OK) << g4_last_error_message();
    return l ? std::vector<float>(l, l + v) : std::vector<float>();
}

// Feeds `tok`, then generates n tokens with `sp` (sample, feed), returning every logits row and token.
struct Continuation {
    std::vector<float> rows;
    std::vector<int32_t> tokens;
};
Continuation continue_with(g4_session* s, int32_t tok, int n, const g4_sampling_params& sp) {
    Continuation c;
    EXPECT_EQ(g4_session_append_tokens(s, &tok, 1, nullptr, 0), G4_OK) << g4_last_error_message();
    for (int i = 0; i < n; ++i) {
        std::vector<float> l = logits(s);
        c.rows.insert(c.rows.end(), l.begin(), l.end());
        int32_t t = -1;
        EXPECT_EQ(g4_session_sample(s, &sp, &t), G4_OK) << g4_last_error_message();
        c.tokens.push_back(t);
        EXPECT_EQ(g4_session_append_tokens(s, &t, 1, nullptr, 0), G4_OK) << g4_last_error_message();
    }
    return c;
}

g4_sampling_params sampled() {
    g4_sampling_params sp = g4_sampling_params_default();
    sp.temperature        = 0.9f;
    sp.top_k              = 40;
    sp.seed               = 7;
    return sp;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void write_f32(const std::string& path, const std::vector<float>& v) {
    write_file(path, std::string((const char*)v.data(), v.size() * sizeof(float)));
}

class SessionState : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_  = new TempDir();
        plan_ = dir_->file("tiny.g4plan");
        // CUDA: --deterministic, as the fused decode MLP's atomic adds otherwise vary the logits' last bits
        // from one run to the next, a state loaded or not.
        const std::string dev = on_cuda() ? " --device cuda --kv-dtype bf16 --deterministic" : "";
        CmdResult r = run_g4("compile --model '" + fixture("e2b_tiny") + "' --max-context 4096 --chunk 256" +
                             dev + " --no-fidelity -o '" + plan_ + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        other_ = dir_->file("other.g4plan");
        r      = run_g4("compile --model '" + fixture("e2b_tiny") + "' --max-context 4000 --chunk 256" + dev +
                        " --no-fidelity -o '" + other_ + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    static void TearDownTestSuite() {
        delete dir_;
        dir_ = nullptr;
    }
    static TempDir* dir_;
    static std::string plan_, other_;
};
TempDir* SessionState::dir_ = nullptr;
std::string SessionState::plan_, SessionState::other_;

// The child half of SavedStateLoadsInANewProcess (skipped unless G4_STATE_CHILD names the folder): loads
// state.bin into a fresh session and writes its logits, and those of the continuation, next to it.
TEST(SessionStateChild, LoadAndContinue) {
    const char* dir = std::getenv("G4_STATE_CHILD");
    if (!dir) GTEST_SKIP() << "run by SessionState.SavedStateLoadsInANewProcess";
    const std::string d = dir;
    Engine e;
    Session s;
    ASSERT_NO_FATAL_FAILURE(open_engine(d + "/plan.g4plan", &e));
    ASSERT_NO_FATAL_FAILURE(new_session(e, &s));
    ASSERT_EQ(g4_session_load_state_file(s.s, (d + "/state.bin").c_str()), G4_OK) << g4_last_error_message();
    EXPECT_EQ(g4_session_position(s.s), kPrompt);
    write_f32(d + "/child_logits.f32", logits(s.s));
    Continuation c = continue_with(s.s, 17, 8, sampled());
    write_f32(d + "/child_rows.f32", c.rows);
    write_file(d + "/child_tokens.i32", std::string((const char*)c.tokens.data(), c.tokens.size() * 4));
}

TEST_F(SessionState, SavedStateLoadsInANewProcess) {
    Engine e;
    Session s;
    ASSERT_NO_FATAL_FAILURE(open_engine(plan_, &e));
    ASSERT_NO_FATAL_FAILURE(new_session(e, &s));
    std::vector<int32_t> ids = prompt_ids(kPrompt, 1);
    ASSERT_EQ(g4_session_append_tokens(s.s, ids.data(), ids.size(), nullptr, 0), G4_OK)
        << g4_last_error_message();
    TempDir td;
    ASSERT_EQ(symlink(plan_.c_str(), td.file("plan.g4plan").c_str()), 0);
    ASSERT_EQ(g4_session_save_state_file(s.s, td.file("state.bin").c_str()), G4_OK)
        << g4_last_error_message();
    size_t size = 0;
    ASSERT_EQ(g4_session_state_size(s.s, &size), G4_OK);
    EXPECT_EQ(read_file(td.file("state.bin")).size(), size);
    std::vector<float> before = logits(s.s);
    Continuation c            = continue_with(s.s, 17, 8, sampled());

    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ASSERT_GT(n, 0);
    self[n]     = 0;
    CmdResult r = run_cmd("G4_STATE_CHILD='" + td.path + "' '" + std::string(self) +
                          "' --gtest_filter=SessionStateChild.LoadAndContinue");
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    ASSERT_NE(r.out.find("[  PASSED  ] 1 test"), std::string::npos) << r.out;
    EXPECT_TRUE(same_bits(read_f32(td.file("child_logits.f32")), before));
    EXPECT_TRUE(same_bits(read_f32(td.file("child_rows.f32")), c.rows));
    std::string toks = read_file(td.file("child_tokens.i32"));
    ASSERT_EQ(toks.size(), c.tokens.size() * 4);
    EXPECT_EQ(std::memcmp(toks.data(), c.tokens.data(), toks.size()), 0);
}

TEST_F(SessionState, BufferRoundTripAndSizeQuery) {
    Engine e;
    Session a, b;
    ASSERT_NO_FATAL_FAILURE(open_engine(plan_, &e));
    ASSERT_NO_FATAL_FAILURE(new_session(e, &a));
    ASSERT_NO_FATAL_FAILURE(new_session(e, &b));
    std::vector<int32_t> ids = prompt_ids(300, 2);
    ASSERT_EQ(g4_session_append_tokens(a.s, ids.data(), ids.size(), nullptr, 0), G4_OK);
    size_t need = 0;
    EXPECT_EQ(g4_session_save_state(a.s, nullptr, 0, &need), G4_ERR_BUFFER_TOO_SMALL);
    std::vector<uint8_t> buf(need);
    size_t n = 0;
    ASSERT_EQ(g4_session_save_state(a.s, buf.data(), buf.size(), &n), G4_OK) << g4_last_error_message();
    EXPECT_EQ(n, need);
    ASSERT_EQ(g4_session_load_state(b.s, buf.data(), n), G4_OK) << g4_last_error_message();
    EXPECT_EQ(g4_session_position(b.s), 300);
    g4_sampling_params greedy = g4_sampling_params_default();
    EXPECT_TRUE(same_bits(continue_with(b.s, 5, 6, greedy).rows, continue_with(a.s, 5, 6, greedy).rows));
}

TEST_F(SessionState, RewindAndReappendEqualsTheOriginal) {
    Engine e;
    Session s;
    ASSERT_NO_FATAL_FAILURE(open_engine(plan_, &e));
    ASSERT_NO_FATAL_FAILURE(new_session(e, &s));
    std::vector<int32_t> a = prompt_ids(1500, 3), b = prompt_ids(101, 4), c = prompt_ids(90, 5);
    ASSERT_EQ(g4_session_append_tokens(s.s, a.data(), a.size(), nullptr, 0), G4_OK);
    ASSERT_EQ(g4_session_append_tokens(s.s, b.data() + 1, 100, nullptr, 0), G4_OK);
    std::vector<float> original = logits(s.s);
    g4_sampling_params greedy   = g4_sampling_params_default();
    Continuation cont           = continue_with(s.s, 9, 5, greedy);
    // Back to the end of a (the 100 tokens and the 6 after them forgotten), other tokens, back again.
    ASSERT_EQ(g4_session_rewind(s.s, 1500), G4_OK) << g4_last_error_message();
    EXPECT_EQ(g4_session_position(s.s), 1500);
    const float* l = nullptr;
    EXPECT_EQ(g4_session_get_logits(s.s, &l, nullptr), G4_ERR_INVALID_ARGUMENT); // no logits until fed
    ASSERT_EQ(g4_session_append_tokens(s.s, c.data() + 1, 80, nullptr, 0), G4_OK);
    EXPECT_FALSE(same_bits(logits(s.s), original));
    ASSERT_EQ(g4_session_rewind(s.s, 1500), G4_OK) << g4_last_error_message();
    ASSERT_EQ(g4_session_append_tokens(s.s, b.data() + 1, 100, nullptr, 0), G4_OK);
    EXPECT_TRUE(same_bits(logits(s.s), original));
    EXPECT_TRUE(same_bits(continue_with(s.s, 9, 5, greedy).rows, cont.rows));
    // The sliding-window rings (8-token window, 263 slots) no longer hold what the tokens before 1000 need.
    EXPECT_EQ(g4_session_rewind(s.s, 1000), G4_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(g4_last_error_message()).find("sliding-window caches"), std::string::npos)
        << g4_last_error_message();
    EXPECT_EQ(g4_session_position(s.s), 1606);
    EXPECT_EQ(g4_session_rewind(s.s, 1607), G4_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(g4_session_rewind(s.s, -1), G4_ERR_INVALID_ARGUMENT);
}

// A prompt's shared prefix reused (rewind, reseed, feed the rest) samples as a fresh session fed the whole
// prompt: the same tokens with the same seed.
TEST_F(SessionState, ReseedAfterRewindSamplesAsAFreshSession) {
    Engine e;
    Session a, b;
    ASSERT_NO_FATAL_FAILURE(open_engine(plan_, &e));
    ASSERT_NO_FATAL_FAILURE(new_session(e, &a));
    ASSERT_NO_FATAL_FAILURE(new_session(e, &b));
    const std::vector<int32_t> ids = prompt_ids(300, 8), other = prompt_ids(60, 9);
    const g4_sampling_params sp = sampled();
    ASSERT_EQ(g4_session_append_tokens(a.s, ids.data(), ids.size(), nullptr, 0), G4_OK);
    int32_t first_a = -1;
    ASSERT_EQ(g4_session_sample(a.s, &sp, &first_a), G4_OK);
    const Continuation ca = continue_with(a.s, first_a, 12, sp);
    // b: the first 200 tokens, others after them and a sample (the random state moves on), then back.
    ASSERT_EQ(g4_session_append_tokens(b.s, ids.data(), 200, nullptr, 0), G4_OK);
    ASSERT_EQ(g4_session_append_tokens(b.s, other.data() + 1, 59, nullptr, 0), G4_OK);
    int32_t t = -1;
    ASSERT_EQ(g4_session_sample(b.s, &sp, &t), G4_OK);
    ASSERT_EQ(g4_session_rewind(b.s, 200), G4_OK) << g4_last_error_message();
    ASSERT_EQ(g4_session_reseed(b.s), G4_OK);
    ASSERT_EQ(g4_session_append_tokens(b.s, ids.data() + 200, 100, nullptr, 0), G4_OK);
    int32_t first_b = -1;
    ASSERT_EQ(g4_session_sample(b.s, &sp, &first_b), G4_OK);
    EXPECT_EQ(first_b, first_a);
    EXPECT_EQ(continue_with(b.s, first_b, 12, sp).tokens, ca.tokens);
    EXPECT_EQ(g4_session_reseed(nullptr), G4_ERR_INVALID_ARGUMENT);
}

TEST_F(SessionState, ForkContinuesAsItsSource) {
    Engine e, e2;
    Session a, b, c;
    ASSERT_NO_FATAL_FAILURE(open_engine(plan_, &e));
    ASSERT_NO_FATAL_FAILURE(open_engine(plan_, &e2));
    ASSERT_NO_FATAL_FAILURE(new_session(e, &a));
    ASSERT_NO_FATAL_FAILURE(new_session(e, &b));
    ASSERT_NO_FATAL_FAILURE(new_session(e2, &c)); // another engine on the same plan
    std::vector<int32_t> ids = prompt_ids(700, 6);
    ASSERT_EQ(g4_session_append_tokens(a.s, ids.data(), ids.size(), nullptr, 0), G4_OK);
    // Sampled tokens: the generator's state is forked too.
    g4_sampling_params sp = sampled();
    int32_t first         = -1;
    ASSERT_EQ(g4_session_sample(a.s, &sp, &first), G4_OK);
    ASSERT_EQ(g4_session_fork(a.s, b.s), G4_OK) << g4_last_error_message();
    ASSERT_EQ(g4_session_fork(a.s, c.s), G4_OK) << g4_last_error_message();
    EXPECT_EQ(g4_session_position(b.s), 700);
    Continuation ca = continue_with(a.s, first, 10, sp);
    Continuation cb = continue_with(b.s, first, 10, sp);
    Continuation cc = continue_with(c.s, first, 10, sp);
    EXPECT_TRUE(same_bits(ca.rows, cb.rows));
    EXPECT_TRUE(same_bits(ca.rows, cc.rows));
    EXPECT_EQ(ca.tokens, cb.tokens);
    EXPECT_EQ(ca.tokens, cc.tokens);
    Engine o;
    Session d;
    ASSERT_NO_FATAL_FAILURE(open_engine(other_, &o));
    ASSERT_NO_FATAL_FAILURE(new_session(o, &d));
    EXPECT_EQ(g4_session_fork(a.s, d.s), G4_ERR_INVALID_ARGUMENT);
}

TEST_F(SessionState, DamagedOrForeignStatesAreRefused) {
    Engine e, o;
    Session s, t, other;
    ASSERT_NO_FATAL_FAILURE(open_engine(plan_, &e));
    ASSERT_NO_FATAL_FAILURE(open_engine(other_, &o));
    ASSERT_NO_FATAL_FAILURE(new_session(e, &s));
    ASSERT_NO_FATAL_FAILURE(new_session(e, &t));
    ASSERT_NO_FATAL_FAILURE(new_session(o, &other));
    std::vector<int32_t> ids = prompt_ids(200, 7);
    ASSERT_EQ(g4_session_append_tokens(s.s, ids.data(), ids.size(), nullptr, 0), G4_OK);
    ASSERT_EQ(g4_session_append_tokens(t.s, ids.data(), 50, nullptr, 0), G4_OK);
    size_t n = 0;
    g4_session_save_state(s.s, nullptr, 0, &n);
    std::vector<uint8_t> good(n);
    ASSERT_EQ(g4_session_save_state(s.s, good.data(), n, &n), G4_OK);
    std::vector<float> t_logits = logits(t.s);
    auto refused                = [&](g4_session* into, std::vector<uint8_t> bytes, const char* why) {
        EXPECT_EQ(g4_session_load_state(into, bytes.data(), bytes.size()), G4_ERR_BAD_STATE) << why;
        std::string msg = g4_last_error_message();
        EXPECT_NE(msg.find(why), std::string::npos) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    };
    std::vector<uint8_t> b = good;
    b[good.size() / 2] ^= 1;
    refused(t.s, b, "checksum mismatch");
    refused(t.s, std::vector<uint8_t>(good.begin(), good.end() - 8), "truncated or extended");
    refused(t.s, std::vector<uint8_t>(good.begin(), good.begin() + 20), "truncated");
    b    = good;
    b[0] = 'X';
    refused(t.s, b, "bad magic");
    b = good;
    b[8]++; // version
    refused(t.s, b, "state version");
    refused(other.s, good, "saved on another plan");
    // The refused loads left t as it was.
    EXPECT_EQ(g4_session_position(t.s), 50);
    EXPECT_TRUE(same_bits(logits(t.s), t_logits));
    // Files: a missing one is an i/o error naming it; a damaged one names it too.
    TempDir td;
    EXPECT_EQ(g4_session_load_state_file(t.s, td.file("none.bin").c_str()), G4_ERR_IO);
    EXPECT_NE(std::string(g4_last_error_message()).find("none.bin"), std::string::npos);
    b = good;
    b[good.size() - 1] ^= 0x40;
    write_file(td.file("bad.bin"), std::string(b.begin(), b.end()));
    EXPECT_EQ(g4_session_load_state_file(t.s, td.file("bad.bin").c_str()), G4_ERR_BAD_STATE);
    EXPECT_NE(std::string(g4_last_error_message()).find("bad.bin: session state: checksum"),
              std::string::npos)
        << g4_last_error_message();
    EXPECT_EQ(g4_session_save_state_file(s.s, td.file("no/such/dir/x.bin").c_str()), G4_ERR_IO);
}

// A prefill of several steps reports each; a non-zero return cancels with the completed steps fed.
TEST_F(SessionState, ProgressCallbackReportsAndCancels) {
    Engine e;
    Session s;
    ASSERT_NO_FATAL_FAILURE(open_engine(plan_, &e));
    ASSERT_NO_FATAL_FAILURE(new_session(e, &s));
    struct Seen {
        std::vector<std::pair<int64_t, int64_t>> calls;
        int64_t stop_at = -1;
    } seen;
    auto cb = [](void* u, int64_t done, int64_t total) -> int32_t {
        auto* z = (Seen*)u;
        z->calls.push_back({done, total});
        return z->stop_at >= 0 && done >= z->stop_at;
    };
    ASSERT_EQ(g4_session_set_progress_callback(s.s, cb, &seen), G4_OK);
    std::vector<int32_t> ids = prompt_ids(1000, 8);
    ASSERT_EQ(g4_session_append_tokens(s.s, ids.data(), ids.size(), nullptr, 0), G4_OK);
    ASSERT_EQ(seen.calls.size(), 4u); // chunks of 256
    EXPECT_EQ(seen.calls[0], (std::pair<int64_t, int64_t>(256, 1000)));
    EXPECT_EQ(seen.calls.back(), (std::pair<int64_t, int64_t>(1000, 1000)));
    seen.calls.clear();
    ASSERT_EQ(g4_session_append_tokens(s.s, ids.data(), 100, nullptr, 0), G4_OK); // one step: no call
    EXPECT_TRUE(seen.calls.empty());
    ASSERT_EQ(g4_session_reset(s.s), G4_OK);
    seen.stop_at = 500;
    EXPECT_EQ(g4_session_append_tokens(s.s, ids.data(), ids.size(), nullptr, 0), G4_ERR_CANCELLED);
    EXPECT_EQ(g4_session_position(s.s), 512);
    ASSERT_EQ(g4_session_set_progress_callback(s.s, nullptr, nullptr), G4_OK);
}

TEST(CApi, VersionMacrosMatchTheLibrary) {
    EXPECT_EQ(g4_api_version(), (uint32_t)G4_API_VERSION);
    EXPECT_EQ(g4_api_version() >> 16, (uint32_t)G4_API_VERSION_MAJOR);
    EXPECT_STREQ(g4_status_string(G4_ERR_BAD_STATE), "bad session state");
}

// g4_chat_render_ids: the text of g4_chat_render tokenized around each medium, which becomes its begin id,
// n_tokens placeholders and its end id (e2b_tiny_mm's in-vocabulary media ids).
TEST(CApi, ChatRenderIdsPlacesTheMedia) {
    if (on_cuda()) GTEST_SKIP() << "CPU plan check";
    TempDir td;
    const std::string plan = td.file("mm.g4plan");
    CmdResult r = run_g4("compile --model '" + fixture("e2b_tiny_mm") + "' --no-fidelity -o '" + plan + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    Engine e;
    ASSERT_NO_FATAL_FAILURE(open_engine(plan, &e));
    g4_media_info mi;
    ASSERT_EQ(g4_engine_get_media_info(e.e, &mi), G4_OK);
    const g4_chat_media media[2]       = {{G4_MEDIA_IMAGE, 3}, {G4_MEDIA_AUDIO, 2}};
    const g4_chat_media_message msgs[] = {{"system", "be brief", nullptr, 0},
                                          {"user", "what is this", media, 2},
                                          {"assistant", "a cat", nullptr, 0}};
    size_t n                           = 0;
    ASSERT_EQ(g4_chat_render_ids(e.e, msgs, 3, 1, nullptr, 0, &n), G4_ERR_BUFFER_TOO_SMALL);
    std::vector<int32_t> ids(n);
    ASSERT_EQ(g4_chat_render_ids(e.e, msgs, 3, 1, ids.data(), n, &n), G4_OK) << g4_last_error_message();
    // The same text rendered with the markers, tokenized piece by piece.
    const std::string text =
        "<bos><|turn>system\nbe brief<turn|>\n<|turn>user\n\n\n<|image|>\n\n<|audio|>what "
        "is this<turn|>\n<|turn>model\na cat<turn|>\n<|turn>model\n";
    auto tok = [&](const std::string& s) {
        size_t k = 0;
        g4_tokenize(e.e, s.data(), s.size(), 0, nullptr, 0, &k);
        std::vector<int32_t> v(k);
        EXPECT_EQ(g4_tokenize(e.e, s.data(), s.size(), 0, v.data(), k, &k), G4_OK);
        return v;
    };
    const size_t im = text.find("<|image|>"), au = text.find("<|audio|>");
    std::vector<int32_t> want = tok(text.substr(0, im));
    want.insert(want.end(),
                {mi.boi_token_id, mi.image_token_id, mi.image_token_id, mi.image_token_id, mi.eoi_token_id});
    std::vector<int32_t> mid = tok(text.substr(im + 9, au - im - 9));
    want.insert(want.end(), mid.begin(), mid.end());
    want.insert(want.end(), {mi.boa_token_id, mi.audio_token_id, mi.audio_token_id, mi.eoa_token_id});
    std::vector<int32_t> rest = tok(text.substr(au + 9));
    want.insert(want.end(), rest.begin(), rest.end());
    EXPECT_EQ(ids, want);
    // Media in the system turn, unknown kinds, negative counts.
    const g4_chat_media bad_kind[1]    = {{7, 1}};
    const g4_chat_media_message sys[]  = {{"system", "x", media, 1}};
    const g4_chat_media_message badk[] = {{"user", "x", bad_kind, 1}};
    const g4_chat_media neg[1]         = {{G4_MEDIA_IMAGE, -1}};
    const g4_chat_media_message negm[] = {{"user", "x", neg, 1}};
    EXPECT_EQ(g4_chat_render_ids(e.e, sys, 1, 1, ids.data(), ids.size(), &n), G4_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(g4_chat_render_ids(e.e, badk, 1, 1, ids.data(), ids.size(), &n), G4_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(g4_chat_render_ids(e.e, negm, 1, 1, ids.data(), ids.size(), &n), G4_ERR_INVALID_ARGUMENT);
}

} // namespace
