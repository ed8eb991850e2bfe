// Several sessions of one engine on several threads at once, through the C API (runtime/include/g4/g4.h):
// four sessions on four threads give the single-threaded tokens, sessions created and destroyed
// concurrently, g4_session_cancel from another thread, and vision and audio towers running in several
// sessions at once (each checked against Hugging Face's logits). tools/sanitize.sh runs these under
// ThreadSanitizer. G4_TEST_CUDA=1 adds four CUDA sessions on four threads.
#include "g4/g4.h"
#include "test_util.h"

#include <atomic>
#include <cstring>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace g4test;
using json = nlohmann::json;

class Concurrency : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_  = new TempDir();
        plan_ = dir_->file("mm.g4plan");
        // f32 weights: the float32 model Hugging Face's reference logits come from.
        CmdResult r = run_g4("compile --model '" + fixture("e2b_tiny") +
                             "' --weights f32 --image-tokens 70 --chunk 8 -o '" + plan_ + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        ASSERT_EQ(g4_engine_open(plan_.c_str(), nullptr, &engine_), G4_OK) << g4_last_error_message();
    }
    static void TearDownTestSuite() {
        g4_engine_close(engine_);
        delete dir_;
    }
    static g4_session* create(int threads = 2) {
        g4_session_params sp = g4_session_params_default();
        sp.n_threads         = threads;
        g4_session* s        = nullptr;
        EXPECT_EQ(g4_session_create(engine_, &sp, &s), G4_OK) << g4_last_error_message();
        return s;
    }
    // Greedy continuation of `prompt` on a fresh session: n tokens, or empty on any failure.
    static std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, int n) {
        g4_session* s = create();
        std::vector<int32_t> out;
        if (!s) return out;
        bool ok = g4_session_append_tokens(s, prompt.data(), prompt.size(), nullptr, 0) == G4_OK;
        for (int i = 0; ok && i < n; ++i) {
            int32_t t = -1;
            ok        = g4_session_sample(s, nullptr, &t) == G4_OK &&
                 g4_session_append_tokens(s, &t, 1, nullptr, 0) == G4_OK;
            if (ok) out.push_back(t);
        }
        g4_session_destroy(s);
        return ok ? out : std::vector<int32_t>();
    }
    static TempDir* dir_;
    static std::string plan_;
    static g4_engine* engine_;
};
TempDir* Concurrency::dir_ = nullptr;
std::string Concurrency::plan_;
g4_engine* Concurrency::engine_ = nullptr;

TEST_F(Concurrency, FourSessionsOnFourThreadsGiveTheSingleThreadTokens) {
    const std::vector<int32_t> prompt = {2, 10, 11, 12, 40, 41, 42, 43, 44, 45, 46};
    const std::vector<int32_t> ref    = greedy(prompt, 8);
    ASSERT_EQ(ref.size(), 8u);
    std::vector<std::vector<int32_t>> got(4);
    std::vector<std::vector<int32_t>> toks(4);
    std::vector<std::thread> th;
    for (int i = 0; i < 4; ++i)
        th.emplace_back([&, i] {
            got[i] = greedy(prompt, 8);
            // The engine's text functions are shared by every thread.
            int32_t ids[64];
            size_t n = 0;
            if (g4_tokenize(engine_, "the cat sat", 11, 1, ids, 64, &n) == G4_OK)
                toks[i].assign(ids, ids + n);
        });
    for (auto& t : th)
        t.join();
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(got[i], ref) << "thread " << i;
        EXPECT_EQ(toks[i], toks[0]) << "thread " << i;
    }
    EXPECT_FALSE(toks[0].empty());
}

TEST_F(Concurrency, SessionsCreatedAndDestroyedConcurrently) {
    std::atomic<int> ok{0};
    std::vector<std::thread> th;
    for (int i = 0; i < 4; ++i)
        th.emplace_back([&, i] {
            for (int k = 0; k < 4; ++k) {
                g4_session* s = create(1 + (i + k) % 2);
                if (!s) continue;
                const int32_t ids[3] = {2, 20 + i, 30 + k};
                int32_t t            = -1;
                if (g4_session_append_tokens(s, ids, 3, nullptr, 0) == G4_OK &&
                    g4_session_sample(s, nullptr, &t) == G4_OK && t >= 0 && t < 512)
                    ok++;
                g4_session_destroy(s);
            }
        });
    for (auto& t : th)
        t.join();
    EXPECT_EQ(ok.load(), 16);
}

TEST_F(Concurrency, CancelFromAnotherThread) {
    g4_session* s = create();
    ASSERT_TRUE(s);
    std::vector<int32_t> ids(200, 9);
    ids[0] = 2;
    std::atomic<bool> stop{false};
    std::thread canceller([&] {
        while (!stop.load()) {
            g4_session_cancel(s);
            std::this_thread::yield();
        }
    });
    int cancelled = 0;
    for (int k = 0; k < 6; ++k) {
        ASSERT_EQ(g4_session_reset(s), G4_OK);
        const g4_status st = g4_session_append_tokens(s, ids.data(), ids.size(), nullptr, 0);
        EXPECT_TRUE(st == G4_OK || st == G4_ERR_CANCELLED) << g4_status_string(st);
        if (st == G4_ERR_CANCELLED) cancelled++;
        EXPECT_EQ(g4_session_position(s) % 8, 0) << "stopped inside a chunk"; // --chunk 8
    }
    stop = true;
    canceller.join();
    EXPECT_GT(cancelled, 0);
    // At most one request is still pending; after it the session runs to the end.
    ASSERT_EQ(g4_session_reset(s), G4_OK);
    g4_status st = g4_session_append_tokens(s, ids.data(), ids.size(), nullptr, 0);
    if (st == G4_ERR_CANCELLED)
        st = g4_session_append_tokens(s, ids.data() + g4_session_position(s),
                                      ids.size() - g4_session_position(s), nullptr, 0);
    EXPECT_EQ(st, G4_OK);
    EXPECT_EQ(g4_session_position(s), (int32_t)ids.size());
    g4_session_destroy(s);
}

// The vision fixture's first image rebuilt from its patches (as tests/e2e/media_test.cpp does).
std::vector<uint8_t> vision_image(const json& meta, int* w, int* h) {
    const json& im = meta.at("images").at(0);
    *h             = im.at("image_hw").at(0).get<int>();
    *w             = im.at("image_hw").at(1).get<int>();
    std::string px = read_file(fixture("towers/vision/" + im.at("pixels").at("file").get<std::string>()));
    std::string pb = read_file(fixture("towers/vision/" + im.at("pos").at("file").get<std::string>()));
    std::vector<int32_t> pos(pb.size() / 4);
    std::memcpy(pos.data(), pb.data(), pos.size() * 4);
    const int n = im.at("n_patches").get<int>();
    std::vector<uint8_t> rgb((size_t)*w * *h * 3, 0);
    for (int p = 0; p < n; ++p)
        for (int py = 0; py < 16; ++py)
            for (int qx = 0; qx < 16; ++qx)
                for (int c = 0; c < 3; ++c)
                    rgb[((size_t)(pos[2 * p + 1] * 16 + py) * *w + pos[2 * p] * 16 + qx) * 3 + c] =
                        (uint8_t)px[(size_t)p * 768 + (py * 16 + qx) * 3 + c];
    return rgb;
}

TEST_F(Concurrency, VisionAndAudioTowersInSeveralSessionsAtOnce) {
    const json vmeta = json::parse(read_file(fixture("towers/vision/meta.json")));
    const json ameta = json::parse(read_file(fixture("towers/audio/audio.json")));
    int w = 0, h = 0;
    const std::vector<uint8_t> rgb = vision_image(vmeta, &w, &h);
    const auto vids                = vmeta.at("e2e").at("ids").get<std::vector<int32_t>>();
    const auto vref =
        read_f32(fixture("towers/vision/" + vmeta.at("e2e").at("logits").at("file").get<std::string>()));
    const json& ae  = ameta.at("e2e");
    const auto pcm  = read_f32(fixture("towers/audio/" + ae.at("clip").get<std::string>() + ".pcm.f32"));
    const auto aids = ae.at("ids").get<std::vector<int32_t>>();
    const auto aref = read_f32(fixture("towers/audio/" + ae.at("logits").get<std::string>()));
    ASSERT_EQ(vref.size(), vids.size() * 512);
    ASSERT_EQ(aref.size(), aids.size() * 512);

    // Threads 0-2 run the image prompt, 3-4 the audio prompt, all on their own sessions at once.
    std::vector<double> err(5, -1.0);
    std::vector<std::thread> th;
    for (int i = 0; i < 5; ++i)
        th.emplace_back([&, i] {
            g4_session* s = create();
            if (!s) return;
            const bool image = i < 3;
            const auto& ids  = image ? vids : aids;
            int32_t n        = 0;
            g4_status st     = image ? g4_session_add_image(s, rgb.data(), w, h, &n)
                                     : g4_session_add_audio(s, pcm.data(), (int64_t)pcm.size(), &n);
            std::vector<float> got(ids.size() * 512);
            if (st == G4_OK) st = g4_session_append_tokens(s, ids.data(), ids.size(), got.data(), got.size());
            if (st == G4_OK) err[i] = rel_l2(got.data(), (image ? vref : aref).data(), got.size());
            g4_session_destroy(s);
        });
    for (auto& t : th)
        t.join();
    for (int i = 0; i < 5; ++i) {
        EXPECT_GE(err[i], 0.0) << "thread " << i << " failed";
        EXPECT_LT(err[i], 1e-4) << "thread " << i << " logits vs HF float32";
    }
}

// A CUDA plan (G4_TEST_CUDA=1): sessions on four threads prefill at once through the GPU's one cuBLAS
// handle (a 24-token prompt: the cuBLAS tier takes matmuls of more than 8 rows) and give the tokens of one
// session alone.
TEST(ConcurrencyCuda, FourSessionsOnFourThreadsGiveTheSingleThreadTokens) {
    if (!on_cuda()) GTEST_SKIP() << "needs a GPU (G4_TEST_CUDA=1) and a build with the CUDA toolkit (NVRTC)";
    TempDir dir;
    const std::string plan = dir.file("cuda.g4plan");
    CmdResult r = run_g4("compile --model '" + fixture("e2b_tiny") + "' --device cuda -o '" + plan + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    g4_engine* e = nullptr;
    ASSERT_EQ(g4_engine_open(plan.c_str(), nullptr, &e), G4_OK) << g4_last_error_message();
    std::vector<int32_t> prompt;
    for (int i = 0; i < 24; ++i)
        prompt.push_back(i == 0 ? 2 : 10 + 7 * i % 400);
    auto greedy = [&](std::vector<int32_t>* out) {
        g4_session* s = nullptr;
        if (g4_session_create(e, nullptr, &s) != G4_OK) return;
        bool ok = g4_session_append_tokens(s, prompt.data(), prompt.size(), nullptr, 0) == G4_OK;
        for (int i = 0; ok && i < 8; ++i) {
            int32_t t = -1;
            ok        = g4_session_sample(s, nullptr, &t) == G4_OK &&
                 g4_session_append_tokens(s, &t, 1, nullptr, 0) == G4_OK;
            if (ok) out->push_back(t);
        }
        g4_session_destroy(s);
    };
    std::vector<int32_t> ref;
    greedy(&ref);
    ASSERT_EQ(ref.size(), 8u) << g4_last_error_message();
    std::vector<std::vector<int32_t>> got(4);
    std::vector<std::thread> th;
    for (int i = 0; i < 4; ++i)
        th.emplace_back([&, i] { greedy(&got[i]); });
    for (auto& t : th)
        t.join();
    for (int i = 0; i < 4; ++i)
        EXPECT_EQ(got[i], ref) << "thread " << i;
    g4_engine_close(e);
}

} // namespace
