// The runtime's log-mel front end (runtime/src/log_mel.*) with Gemma 4's parameters
// (models/gemma4/audio_config.h) against Hugging Face's Gemma4AudioFeatureExtractor (float32 numbers from
// tools/make_audio_fixtures.py, tests/fixtures/towers/audio).
#include "kernels/cpu/cpu.h"
#include "models/gemma4/audio_config.h"
#include "runtime/src/log_mel.h"
#include "test_util.h"

#include <cmath>
#include <cstring>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using json = nlohmann::json;
using namespace g4;

namespace {

media::LogMelParams params(int mel_bins) {
    gemma4::AudioHParams hp{};
    hp.mel_bins                    = mel_bins;
    const gemma4::AudioFrontEnd fe = gemma4::audio_front_end(hp);
    return {fe.sample_rate, fe.frame_length, fe.hop_length, fe.fft_length,
            fe.mel_bins,    fe.min_hz,       fe.max_hz,     fe.mel_floor};
}

std::vector<int32_t> read_i32(const std::string& path) {
    std::string b = g4test::read_file(path);
    std::vector<int32_t> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), v.size() * 4);
    return v;
}

} // namespace

TEST(LogMel, FeaturesMatchHf) {
    const std::string dir = g4test::fixture("towers/audio");
    const json m          = json::parse(g4test::read_file(dir + "/audio.json"));
    media::LogMel lm;
    ASSERT_EQ(lm.init(params(m["mel_bins"].get<int>())), "");
    cpu::ThreadPool pool(2);
    std::vector<float> scratch(lm.thread_floats() * pool.size() + 16);
    cpu::Context ctx{&pool, scratch.data(), lm.thread_floats()};
    const int M = m["mel_bins"];
    ASSERT_GE(m["clips"].size(), 2u);
    for (const auto& c : m["clips"]) {
        auto pcm  = g4test::read_f32(dir + "/" + c["pcm"].get<std::string>());
        auto ref  = g4test::read_f32(dir + "/" + c["features"].get<std::string>());
        auto mask = read_i32(dir + "/" + c["mask"].get<std::string>());
        int valid = 0;
        for (int32_t k : mask)
            valid += k != 0;
        ASSERT_EQ(lm.valid_frames((int64_t)pcm.size()), valid);
        std::vector<float> feat((size_t)valid * M, NAN);
        lm.compute(ctx, pcm.data(), (int64_t)pcm.size(), feat.data());
        const double e = g4test::rel_l2(feat.data(), ref.data(), feat.size());
        double mx      = 0;
        for (size_t i = 0; i < feat.size(); ++i)
            mx = std::max(mx, (double)std::fabs(feat[i] - ref[i]));
        std::printf("%s: %d frames, rel L2 %.3g, max abs %.3g\n", c["name"].get<std::string>().c_str(), valid,
                    e, mx);
        EXPECT_LT(e, 2e-6);
        EXPECT_LT(mx, 2e-4);
    }
}

// The released models' 128 mel bins on clip0.
TEST(LogMel, ReleasedMelBinsMatchHf) {
    const std::string dir = g4test::fixture("towers/audio");
    const json m          = json::parse(g4test::read_file(dir + "/audio.json"));
    const json& c         = m["mid"];
    media::LogMel lm;
    ASSERT_EQ(lm.init(params(128)), "");
    cpu::ThreadPool pool(2);
    std::vector<float> scratch(lm.thread_floats() * pool.size() + 16);
    cpu::Context ctx{&pool, scratch.data(), lm.thread_floats()};
    auto pcm     = g4test::read_f32(dir + "/" + c["clip"].get<std::string>() + ".pcm.f32");
    auto ref     = g4test::read_f32(dir + "/" + c["features"].get<std::string>());
    const int nv = c["n_valid_frames"];
    ASSERT_EQ(lm.valid_frames((int64_t)pcm.size()), nv);
    ASSERT_GE(ref.size(), (size_t)nv * 128);
    std::vector<float> feat((size_t)nv * 128, NAN);
    lm.compute(ctx, pcm.data(), (int64_t)pcm.size(), feat.data());
    const double e = g4test::rel_l2(feat.data(), ref.data(), feat.size());
    std::printf("mid: %d frames x 128 mel, rel L2 %.3g\n", nv, e);
    EXPECT_LT(e, 2e-6);
}

TEST(LogMel, InconsistentParametersAreRefused) {
    media::LogMel lm;
    media::LogMelParams p = params(128);
    ASSERT_EQ(lm.init(p), "");
    EXPECT_EQ(lm.valid_frames(160), 0);
    EXPECT_EQ(lm.valid_frames(161), 1);
    p.fft_length = 500; // not a power of two
    EXPECT_NE(lm.init(p), "");
    p        = params(128);
    p.max_hz = 9000; // past Nyquist
    EXPECT_NE(lm.init(p), "");
    p = params(0);
    EXPECT_NE(lm.init(p), "");
}
