// Compressed and resampled audio files end to end: an MP3 (48 kHz stereo), a 48 kHz stereo FLAC and a 44.1
// kHz stereo WAV through g4_session_add_audio_file (FFmpeg decode, mean of the channels, libswresample to 16
// kHz, the CPU audio tower of a float32 plan) give the soft tokens Hugging Face's feature extractor and audio
// tower compute on the same decoded and resampled samples (tools/make_audio_file_fixtures.py,
// tests/fixtures/towers/audio_files/audio_file_tokens.json). Skipped in a build without FFmpeg.
#include "g4/g4.h"
#include "runtime/src/media/media_decode.h"
#include "test_util.h"

#include <cstdlib>
#include <functional>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace {

using namespace g4test;
using json = nlohmann::json;

TEST(MediaAudioFiles, SoftTokensMatchHFOnTheDecodedSamples) {
    if (!g4::media::have_ffmpeg())
        GTEST_SKIP() << "this build has no FFmpeg (G4_WITH_FFMPEG): MP3/FLAC untested";
    TempDir dir;
    const std::string plan = dir.file("audio.g4plan");
    CmdResult r            = run_g4("compile --model '" + fixture("e2b_tiny") +
                                    "' --weights f32 --no-vision --no-fidelity -o '" + plan + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    g4_engine* e = nullptr;
    ASSERT_EQ(g4_engine_open(plan.c_str(), nullptr, &e), G4_OK) << g4_last_error_message();
    g4_session_params sp = g4_session_params_default();
    sp.n_threads         = 2;
    g4_session* s        = nullptr;
    ASSERT_EQ(g4_session_create(e, &sp, &s), G4_OK) << g4_last_error_message();

    // The soft tokens of one add call (G4_DUMP_MEDIA), checked against the reference rows.
    int dumps  = 0;
    auto check = [&](const std::string& what, const std::vector<float>& ref, int n_ref, double tol,
                     const std::function<g4_status(int32_t*)>& add) {
        const std::string dump = dir.file("soft" + std::to_string(dumps++) + ".f32");
        setenv("G4_DUMP_MEDIA", dump.c_str(), 1);
        int32_t n            = 0;
        const g4_status st   = add(&n);
        const std::string em = st == G4_OK ? "" : g4_last_error_message();
        unsetenv("G4_DUMP_MEDIA");
        ASSERT_EQ(st, G4_OK) << what << ": " << em;
        const std::vector<float> got = read_f32(dump);
        ASSERT_EQ(n, n_ref) << what;
        ASSERT_EQ(got.size(), ref.size()) << what;
        const double err = rel_l2(got.data(), ref.data(), ref.size());
        std::printf("  %-36s %d soft tokens: rel L2 vs HF float32 %.3e\n", what.c_str(), n, err);
        EXPECT_LT(err, tol) << what;
        ASSERT_EQ(g4_session_clear_media(s), G4_OK);
    };
    const std::string fx = fixture("towers/audio_files/");
    const json meta      = json::parse(read_file(fx + "audio_file_tokens.json"));
    ASSERT_EQ(meta.at("clips").size(), 3u);
    for (const json& clip : meta.at("clips")) {
        const std::string file       = clip.at("file").get<std::string>();
        const std::vector<float> ref = read_f32(fx + clip.at("tower").get<std::string>());
        const int n_soft             = clip.at("n_soft").get<int>();
        // The file, decoded by g4. Its samples are within 1.2e-7 of the reference's (the ffmpeg CLI rounds
        // the downmix differently), which moves these soft tokens by up to 1.7e-5.
        check(file, ref, n_soft, 5e-5,
              [&](int32_t* n) { return g4_session_add_audio_file(s, (fx + file).c_str(), n); });
        // The reference's samples themselves: the tower alone.
        const std::vector<float> pcm = read_f32(fx + clip.at("g4_16k").get<std::string>());
        check(file + " (reference samples)", ref, n_soft, 2e-6,
              [&](int32_t* n) { return g4_session_add_audio(s, pcm.data(), (int64_t)pcm.size(), n); });
    }
    g4_session_destroy(s);
    g4_engine_close(e);
}

} // namespace
