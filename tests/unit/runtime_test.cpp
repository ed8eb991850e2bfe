// Runtime contracts: no allocation after session creation, deterministic compiles, the C API's
// handling of misuse (NULL handles, bad sampling values, context overflow, cancellation), and
// `g4 inspect`.
#include "capi_util.h"
#include "g4/g4.h"
#include "test_util.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <gtest/gtest.h>
#include <malloc.h>
#include <thread>

// Count every heap allocation made by any thread while g_counting is set (glibc interposition). Sanitizer
// builds (G4_SANITIZE) own malloc themselves: there the counting tests are skipped.
static std::atomic<bool> g_counting{false};
static std::atomic<long> g_allocs{0};
#ifndef G4_SANITIZED
extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
}
extern "C" void* malloc(size_t n) {
    if (g_counting.load(std::memory_order_relaxed)) g_allocs++;
    return __libc_malloc(n);
}
extern "C" void* calloc(size_t a, size_t b) {
    if (g_counting.load(std::memory_order_relaxed)) g_allocs++;
    return __libc_calloc(a, b);
}
extern "C" void* realloc(void* p, size_t n) {
    if (g_counting.load(std::memory_order_relaxed)) g_allocs++;
    return __libc_realloc(p, n);
}
extern "C" void* aligned_alloc(size_t a, size_t n) {
    if (g_counting.load(std::memory_order_relaxed)) g_allocs++;
    return __libc_memalign(a, n);
}
extern "C" int posix_memalign(void** out, size_t a, size_t n) {
    if (g_counting.load(std::memory_order_relaxed)) g_allocs++;
    *out = __libc_memalign(a, n);
    return *out ? 0 : 12;
}
#endif

namespace {

using namespace g4test;

std::string compile_fixture(const TempDir& td, const std::string& name, const std::string& flags = "") {
    std::string plan = td.file(name + ".g4plan");
    CmdResult r      = run_g4("compile --model '" + fixture(name) + "' " + flags + " -o '" + plan + "'");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return plan;
}

// Opens `plan` and a two-thread session on it (s->s stays null on failure, which is reported).
void open_session(const std::string& plan, Engine* e, Session* s) {
    ASSERT_EQ(g4_engine_open(plan.c_str(), nullptr, &e->e), G4_OK) << g4_last_error_message();
    g4_session_params sp = g4_session_params_default();
    sp.n_threads         = 2;
    ASSERT_EQ(g4_session_create(e->e, &sp, &s->s), G4_OK) << g4_last_error_message();
}

TEST(Runtime, NothingAllocatedAfterSessionCreate) {
#ifdef G4_SANITIZED
    GTEST_SKIP() << "allocation counting needs glibc's malloc; a sanitizer replaces it";
#endif
    TempDir td;
    std::string plan = compile_fixture(td, "e4b_tiny", "--chunk 8 --logits-rows 4");
    Engine e;
    Session s;
    open_session(plan, &e, &s);
    ASSERT_TRUE(s.s);
    std::vector<int32_t> prompt(30);
    for (int i = 0; i < 30; ++i)
        prompt[i] = 3 + (i * 37) % 500;
    std::vector<float> logits(30 * 512);
    g4_sampling_params greedy = g4_sampling_params_default();
    g4_sampling_params random = g4_sampling_params_default();
    random.temperature = 0.8f, random.top_k = 40, random.top_p = 0.9f, random.min_p = 0.01f,
    random.repeat_penalty = 1.1f;

    // The counter must see an allocation made from this binary, or a zero below proves nothing.
    g_allocs             = 0;
    g_counting           = true;
    void* volatile probe = std::malloc(64);
    g_counting           = false;
    std::free(probe);
    ASSERT_EQ(g_allocs.load(), 1);

    g_allocs      = 0;
    g_counting    = true;
    g4_status st1 = g4_session_append_tokens(s.s, prompt.data(), prompt.size(), logits.data(), logits.size());
    int32_t tok   = 0;
    g4_status st2 = G4_OK;
    for (int i = 0; i < 20 && st2 == G4_OK; ++i) {
        st2 = g4_session_sample(s.s, i % 2 ? &random : &greedy, &tok);
        if (st2 == G4_OK) st2 = g4_session_append_tokens(s.s, &tok, 1, nullptr, 0);
    }
    g4_status st3 = g4_session_reset(s.s);
    g4_status st4 = g4_session_append_tokens(s.s, prompt.data(), prompt.size(), nullptr, 0);
    g_counting    = false;
    EXPECT_EQ(st1, G4_OK);
    EXPECT_EQ(st2, G4_OK);
    EXPECT_EQ(st3, G4_OK);
    EXPECT_EQ(st4, G4_OK);
    EXPECT_EQ(g_allocs.load(), 0) << "heap allocations during prefill/decode/sampling";
}

// The session-state calls on buffers (g4.h: only the file variants allocate) and the progress callback.
TEST(Runtime, NothingAllocatedBySessionStateCalls) {
#ifdef G4_SANITIZED
    GTEST_SKIP() << "allocation counting needs glibc's malloc; a sanitizer replaces it";
#endif
    TempDir td;
    std::string plan = compile_fixture(td, "e4b_tiny", "--chunk 8");
    Engine e;
    Session s, t;
    open_session(plan, &e, &s);
    ASSERT_TRUE(s.s);
    g4_session_params sp = g4_session_params_default();
    sp.n_threads         = 2;
    ASSERT_EQ(g4_session_create(e.e, &sp, &t.s), G4_OK);
    std::vector<int32_t> prompt(30);
    for (int i = 0; i < 30; ++i)
        prompt[i] = 3 + (i * 37) % 500;
    size_t need = 0;
    std::vector<uint8_t> buf(1 << 20);
    auto cb    = [](void*, int64_t, int64_t) -> int32_t { return 0; };
    g_allocs   = 0;
    g_counting = true;
    g4_status st[9];
    st[0]      = g4_session_set_progress_callback(s.s, cb, nullptr);
    st[1]      = g4_session_append_tokens(s.s, prompt.data(), prompt.size(), nullptr, 0);
    st[2]      = g4_session_state_size(s.s, &need);
    st[3]      = g4_session_save_state(s.s, buf.data(), buf.size(), &need);
    st[4]      = g4_session_load_state(t.s, buf.data(), need);
    st[5]      = g4_session_rewind(t.s, 28);
    st[6]      = g4_session_fork(s.s, t.s);
    st[7]      = g4_session_append_tokens(t.s, prompt.data(), 1, nullptr, 0);
    st[8]      = g4_session_reseed(t.s);
    g_counting = false;
    for (int i = 0; i < 9; ++i)
        EXPECT_EQ(st[i], G4_OK) << i << ": " << g4_last_error_message();
    EXPECT_EQ(g_allocs.load(), 0) << "heap allocations in the session-state calls";
}

TEST(Runtime, NothingAllocatedByImagesAndAudio) {
#ifdef G4_SANITIZED
    GTEST_SKIP() << "allocation counting needs glibc's malloc; a sanitizer replaces it";
#endif
    TempDir td;
    std::string plan = compile_fixture(td, "e2b_tiny", "--image-tokens 70");
    Engine e;
    Session s;
    open_session(plan, &e, &s);
    ASSERT_TRUE(s.s);
    g4_media_info mi{};
    ASSERT_EQ(g4_engine_get_media_info(e.e, &mi), G4_OK);
    ASSERT_TRUE(mi.has_vision && mi.has_audio);
    std::vector<uint8_t> rgb(200 * 150 * 3);
    for (size_t i = 0; i < rgb.size(); ++i)
        rgb[i] = (uint8_t)(i * 7 % 251);
    std::vector<float> pcm(16000);
    for (size_t i = 0; i < pcm.size(); ++i)
        pcm[i] = 0.3f * std::sin(0.05f * (float)i);
    std::vector<int32_t> ids(400, 0);
    g_allocs   = 0;
    g_counting = true;
    int32_t ni = 0, na = 0;
    g4_status st1 = g4_session_add_image(s.s, rgb.data(), 200, 150, &ni);
    g4_status st2 = g4_session_add_audio(s.s, pcm.data(), (int64_t)pcm.size(), &na);
    size_t n      = 0;
    if (st1 == G4_OK && st2 == G4_OK && ni + na + 6 <= 400) {
        ids[n++] = 2;
        ids[n++] = 300;
        for (int i = 0; i < ni; ++i)
            ids[n++] = mi.image_token_id;
        ids[n++] = 301;
        ids[n++] = 302;
        for (int i = 0; i < na; ++i)
            ids[n++] = mi.audio_token_id;
        ids[n++] = 303;
    }
    g4_status st3 = g4_session_append_tokens(s.s, ids.data(), n, nullptr, 0);
    g_counting    = false;
    ASSERT_EQ(st1, G4_OK) << g4_last_error_message();
    ASSERT_EQ(st2, G4_OK) << g4_last_error_message();
    EXPECT_EQ(st3, G4_OK) << g4_last_error_message();
    EXPECT_GT(ni, 0);
    EXPECT_GT(na, 0);
    EXPECT_EQ(g_allocs.load(), 0) << "heap allocations while encoding an image and a clip and feeding them";
}

TEST(Runtime, CompileIsDeterministic) {
    TempDir td;
    std::string a = td.file("a.g4plan"), b = td.file("b.g4plan");
    ASSERT_EQ(run_g4("compile --model '" + fixture("e4b_tiny") + "' -o '" + a + "'").exit_code, 0);
    ASSERT_EQ(run_g4("compile --model '" + fixture("e4b_tiny") + "' -o '" + b + "'").exit_code, 0);
    EXPECT_TRUE(read_file(a) == read_file(b));
}

TEST(Runtime, InspectListsTensorsBytesAndOps) {
    TempDir td;
    std::string plan = compile_fixture(td, "e2b_tiny");
    CmdResult r      = run_g4("inspect '" + plan + "' --all"); // (the default is the summary alone)
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const char* s :
         {"weights by dtype", "bf16", "memory by device", "KV cache", "layers.9.mlp.down_proj.weight",
          "cache_k-5", "attention", "attn-9", "result_softcap", "sliding_attention"})
        EXPECT_NE(r.out.find(s), std::string::npos) << "missing '" << s << "'";
    // KV-shared layers 6..9 own no cache: only layers 0..5 have cache tensors.
    EXPECT_EQ(r.out.find("cache_k-6"), std::string::npos);
    EXPECT_NE(r.out.find("cache_k-4"), std::string::npos);
}

TEST(Runtime, CApiRejectsMisuse) {
    TempDir td;
    std::string plan = compile_fixture(td, "e2b_tiny", "--max-context 40");
    EXPECT_EQ(g4_engine_open(nullptr, nullptr, nullptr), G4_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(g4_last_error_message()).size(), 0u);
    g4_session* s = nullptr;
    EXPECT_EQ(g4_session_create(nullptr, nullptr, &s), G4_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(s, nullptr);
    EXPECT_EQ(g4_session_append_tokens(nullptr, nullptr, 1, nullptr, 0), G4_ERR_INVALID_ARGUMENT);
    g4_session_destroy(nullptr);
    g4_engine_close(nullptr);

    Engine e;
    ASSERT_EQ(g4_engine_open(plan.c_str(), nullptr, &e.e), G4_OK);
    Session ss;
    ASSERT_EQ(g4_session_create(e.e, nullptr, &ss.s), G4_OK);
    int32_t tok;
    EXPECT_EQ(g4_session_sample(ss.s, nullptr, &tok), G4_ERR_INVALID_ARGUMENT); // no logits yet
    std::vector<int32_t> ids(41, 5);
    EXPECT_EQ(g4_session_append_tokens(ss.s, ids.data(), 41, nullptr, 0), G4_ERR_CONTEXT_FULL);
    EXPECT_NE(std::string(g4_last_error_message()).find("40"), std::string::npos);
    EXPECT_EQ(g4_session_position(ss.s), 0);
    ASSERT_EQ(g4_session_append_tokens(ss.s, ids.data(), 40, nullptr, 0), G4_OK);
    EXPECT_EQ(g4_session_append_tokens(ss.s, ids.data(), 1, nullptr, 0), G4_ERR_CONTEXT_FULL);
    std::vector<float> small(10);
    ASSERT_EQ(g4_session_reset(ss.s), G4_OK);
    EXPECT_EQ(g4_session_append_tokens(ss.s, ids.data(), 2, small.data(), small.size()),
              G4_ERR_INVALID_ARGUMENT);
    ids[1] = -3;
    EXPECT_EQ(g4_session_append_tokens(ss.s, ids.data(), 2, nullptr, 0), G4_ERR_INVALID_ARGUMENT);
    ids[1] = 5;
    ASSERT_EQ(g4_session_append_tokens(ss.s, ids.data(), 2, nullptr, 0), G4_OK);
    for (auto bad : {-1.0f, NAN}) {
        g4_sampling_params p = g4_sampling_params_default();
        p.temperature        = bad;
        EXPECT_EQ(g4_session_sample(ss.s, &p, &tok), G4_ERR_INVALID_ARGUMENT);
    }
    g4_sampling_params p = g4_sampling_params_default();
    p.top_p              = 1.5f;
    EXPECT_EQ(g4_session_sample(ss.s, &p, &tok), G4_ERR_INVALID_ARGUMENT);
    p       = g4_sampling_params_default();
    p.min_p = -0.1f;
    EXPECT_EQ(g4_session_sample(ss.s, &p, &tok), G4_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(g4_session_sample(ss.s, nullptr, &tok), G4_OK);
}

TEST(Runtime, CancelStopsPrefillAndIsConsumed) {
    TempDir td;
    std::string plan = compile_fixture(td, "e2b_tiny", "--chunk 4");
    Engine e;
    ASSERT_EQ(g4_engine_open(plan.c_str(), nullptr, &e.e), G4_OK);
    Session s;
    ASSERT_EQ(g4_session_create(e.e, nullptr, &s.s), G4_OK);
    std::vector<int32_t> ids(64, 7);
    g4_session_cancel(s.s);
    EXPECT_EQ(g4_session_append_tokens(s.s, ids.data(), ids.size(), nullptr, 0), G4_ERR_CANCELLED);
    EXPECT_EQ(g4_session_position(s.s), 0);
    EXPECT_EQ(g4_session_append_tokens(s.s, ids.data(), ids.size(), nullptr, 0), G4_OK);
    EXPECT_EQ(g4_session_position(s.s), 64);
    // From another thread while a prefill runs: either it finished first or it stopped on a chunk boundary.
    ASSERT_EQ(g4_session_reset(s.s), G4_OK);
    std::vector<int32_t> many(2000, 9);
    std::thread t([&] { g4_session_cancel(s.s); });
    g4_status st = g4_session_append_tokens(s.s, many.data(), many.size(), nullptr, 0);
    t.join();
    EXPECT_TRUE(st == G4_OK || st == G4_ERR_CANCELLED);
    EXPECT_EQ(g4_session_position(s.s) % 4, 0);
}

TEST(Runtime, SeededSamplingIsReproducible) {
    TempDir td;
    std::string plan = compile_fixture(td, "e2b_tiny");
    auto gen         = [&](uint64_t seed) {
        CmdResult r =
            run_g4("run '" + plan + "' --tokens 2,10,11,12 -n 12 --temp 1.0 --top-k 50 --top-p 0.95 --seed " +
                           std::to_string(seed) + " --ignore-eos --print-ids");
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return r.out;
    };
    EXPECT_EQ(gen(7), gen(7));
    EXPECT_NE(gen(7), gen(8));
}

// G4_CPU_PROFILE=1: a CPU session prints its text program's prefill chunks and decode steps when destroyed.
TEST(Runtime, CpuProfilePrintsTheTextProgramsSteps) {
    TempDir td;
    std::string plan = compile_fixture(td, "e2b_tiny", "--chunk 8");
    setenv("G4_CPU_PROFILE", "1", 1);
    testing::internal::CaptureStderr();
    {
        Engine e;
        Session s;
        open_session(plan, &e, &s);
        std::vector<int32_t> ids(20, 7);
        if (s.s) {
            EXPECT_EQ(g4_session_append_tokens(s.s, ids.data(), ids.size(), nullptr, 0), G4_OK);
            for (int i = 0; i < 2; ++i)
                EXPECT_EQ(g4_session_append_tokens(s.s, ids.data(), 1, nullptr, 0), G4_OK);
        }
    }
    const std::string err = testing::internal::GetCapturedStderr();
    unsetenv("G4_CPU_PROFILE");
    EXPECT_NE(err.find("text program, prefill steps, 3 steps, 20 rows"), std::string::npos) << err;
    EXPECT_NE(err.find("text program, decode steps, 2 steps, 2 rows"), std::string::npos) << err;
    EXPECT_NE(err.find("matmul k"), std::string::npos) << err;
    EXPECT_NE(err.find("GFLOP/s"), std::string::npos) << err;
}

} // namespace

namespace {

TEST(Compile, DryRunPrintsTheMemoryPlanAndWritesNothing) {
    TempDir td;
    CmdResult r = run_g4("compile --model '" + fixture("e2b_tiny") + "' --dry-run --max-context 1024 -o '" +
                         td.file("p.g4plan") + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const char* s : {"nothing written", "memory plan", "KV cache", "mlp_proj", "sliding ring 263 slots"})
        EXPECT_NE(r.err.find(s), std::string::npos) << "missing '" << s << "' in " << r.err;
    EXPECT_FALSE(file_exists(td.file("p.g4plan")));
    // The KV figure is the one the real compile allocates.
    CmdResult real = run_g4("compile --model '" + fixture("e2b_tiny") +
                            "' --max-context 1024 --no-fidelity -o '" + td.file("q.g4plan") + "'");
    ASSERT_EQ(real.exit_code, 0);
    auto kv = [](const std::string& s) {
        const std::string key = "KV cache (f32) "; // the memory table's part, "KV cache (f32) 1.04 MiB"
        size_t a              = s.find(key);
        if (a == std::string::npos) return std::string();
        a += key.size();
        return s.substr(a, s.find(" ", s.find(" ", a) + 1) - a);
    };
    EXPECT_FALSE(kv(r.err).empty()) << r.err;
    EXPECT_EQ(kv(r.err), kv(real.err));
    // Three planned sessions (--max-sessions=3): each KV cache counted three times, and g4 inspect says so.
    CmdResult three =
        run_g4("compile --model '" + fixture("e2b_tiny") +
               "' --max-context 1024 --no-fidelity --max-sessions=3 -o '" + td.file("s.g4plan") + "'");
    ASSERT_EQ(three.exit_code, 0) << three.err;
    EXPECT_NE(three.err.find("KV cache (f32) (3 sessions)"), std::string::npos) << three.err;
    CmdResult shown = run_g4("inspect '" + td.file("s.g4plan") + "'");
    EXPECT_NE(shown.out.find("3 sessions (g4 compile --max-sessions)"), std::string::npos) << shown.out;
    CmdResult cuda = run_g4("compile --model '" + fixture("e2b_tiny") + "' --device cuda:0 --dry-run");
    EXPECT_EQ(cuda.exit_code, 0) << cuda.err;
    EXPECT_NE(cuda.err.find("    cuda:0   "), std::string::npos) << cuda.err;
    EXPECT_NE(cuda.err.find("workspaces"), std::string::npos) << cuda.err;
}

} // namespace
