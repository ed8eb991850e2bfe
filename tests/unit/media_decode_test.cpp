// Audio files through runtime/src/media/media_decode (FFmpeg's libraries where the build has them): every
// format to 16 kHz mono, the channels' mean resampled by libswresample measured against torchaudio, and
// bad files refused with one line naming them (tests/fixtures/towers/audio_files, made by
// tools/make_media_fixtures.py).
#include "runtime/src/media/media_decode.h"
#include "runtime/src/media/video_decode.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

namespace {

std::string dir() {
    return g4test::fixture("towers/audio_files");
}

std::vector<float> read_f32(const std::string& path) {
    const std::string b = g4test::read_file(path);
    std::vector<float> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), v.size() * 4);
    return v;
}

TEST(MediaDecode, EveryAudioFormatTo16kMono) {
    if (!g4::media::have_ffmpeg()) GTEST_SKIP() << "built without FFmpeg";
    for (const char* f :
         {"tones_44k1_stereo.wav", "tones_48k_stereo.flac", "tones.mp3", "tones.opus.ogg", "tones.m4a"}) {
        g4::media::AudioPcm pcm;
        ASSERT_EQ(g4::media::load_audio(dir() + "/" + f, 16000, 480000, &pcm), "") << f;
        EXPECT_EQ(pcm.sample_rate, 16000);
        double ss = 0;
        for (float v : pcm.samples)
            ss += double(v) * v;
        std::printf("  %-22s %zu samples, rms %.4f\n", f, pcm.samples.size(),
                    std::sqrt(ss / pcm.samples.size()));
        // 0.9 s; lossy codecs add a little padding
        EXPECT_NEAR(double(pcm.samples.size()), 14400.0, 14400.0 * 0.08) << f;
    }
}

// The MP3, FLAC and WAV as g4 decodes them are the samples the soft-token reference was fed
// (tools/make_audio_file_fixtures.py: the ffmpeg CLI with g4's settings;
// tests/e2e/media_audio_files_test.cpp).
TEST(MediaDecode, AudioFileSamplesAreTheFixtures) {
    if (!g4::media::have_ffmpeg()) GTEST_SKIP() << "built without FFmpeg";
    for (const char* f : {"tones.mp3", "tones_48k_stereo.flac", "tones_44k1_stereo.wav"}) {
        g4::media::AudioPcm pcm;
        ASSERT_EQ(g4::media::load_audio(dir() + "/" + f, 16000, 480000, &pcm), "") << f;
        const std::vector<float> ref = read_f32(dir() + "/" + f + ".g4_16k.f32");
        ASSERT_EQ(pcm.samples.size(), ref.size()) << f;
        float max_diff = 0;
        for (size_t i = 0; i < ref.size(); ++i)
            max_diff = std::max(max_diff, std::fabs(pcm.samples[i] - ref[i]));
        EXPECT_LT(max_diff, 1e-6f) << f;
    }
}

// The downmix is the mean of the channels (what librosa and torchaudio give; libswresample's own matrix
// would scale a stereo pair by sqrt(2)); the resampling is libswresample's default filter. Against
// torchaudio.functional.resample (defaults) of the channels' mean at the file's own rate.
TEST(MediaDecode, ResamplingAgainstTorchaudio) {
    if (!g4::media::have_ffmpeg()) GTEST_SKIP() << "built without FFmpeg";
    for (const char* f : {"tones.mp3", "tones_48k_stereo.flac", "tones_44k1_stereo.wav"}) {
        g4::media::AudioPcm pcm;
        ASSERT_EQ(g4::media::load_audio(dir() + "/" + f, 16000, 480000, &pcm), "") << f;
        const std::vector<float> ref = read_f32(dir() + "/" + f + ".torchaudio16k.f32");
        ASSERT_EQ(pcm.samples.size(), ref.size()) << f;
        const size_t n = ref.size();
        double gr = 0, rr = 0, e2 = 0;
        for (size_t i = 0; i < n; ++i) {
            gr += double(pcm.samples[i]) * ref[i], rr += double(ref[i]) * ref[i];
            e2 += (double(pcm.samples[i]) - ref[i]) * (double(pcm.samples[i]) - ref[i]);
        }
        const double scale = gr / rr, rel = std::sqrt(e2 / rr); // least squares: g4 ~ scale * ref
        std::printf("  %-22s libswresample vs torchaudio: scale %.4f, rel L2 %.3e\n", f, scale, rel);
        EXPECT_NEAR(scale, 1.0, 1e-2) << f; // the mean, not (L + R) / sqrt(2)
        // The filters differ near 8 kHz (libswresample: cutoff 0.97, torchaudio: rolloff 0.99), where the
        // clips' right channel has a 7 kHz tone.
        EXPECT_LT(rel, 4e-2) << f;
    }
}

TEST(MediaDecode, SoundTrackOfAVideo) {
    if (!g4::media::have_ffmpeg()) GTEST_SKIP() << "built without FFmpeg";
    g4::media::AudioPcm pcm;
    ASSERT_EQ(g4::media::load_audio(g4test::fixture("towers/video/with_sound_22k.mp4"), 16000, 480000, &pcm),
              "");
    EXPECT_NEAR(double(pcm.samples.size()), 16000.0, 16000.0 * 0.08);
    std::string e =
        g4::media::load_audio(g4test::fixture("towers/video/pattern_97x61_12.5fps.mp4"), 16000, 480000, &pcm);
    EXPECT_NE(e.find("pattern_97x61_12.5fps.mp4: has no audio stream"), std::string::npos) << e;
}

TEST(MediaDecode, BadFilesGiveOneLineNamingThem) {
    g4test::TempDir tmp;
    auto write = [&](const std::string& name, const std::string& bytes) {
        std::ofstream(tmp.file(name), std::ios::binary) << bytes;
        return tmp.file(name);
    };
    const std::string mp3                                        = g4test::read_file(dir() + "/tones.mp3");
    const std::vector<std::pair<std::string, std::string>> cases = {
        {write("empty.mp3", ""), "empty"},
        {write("noise.mp3", std::string(4000, '\x5a')), ""},
        {write("cut.m4a", g4test::read_file(dir() + "/tones.m4a").substr(0, 300)), ""},
        {tmp.file("missing.flac"), ""},
    };
    for (const auto& [path, want] : cases) {
        g4::media::AudioPcm pcm;
        const std::string e = g4::media::load_audio(path, 16000, 480000, &pcm);
        std::printf("  %s\n", e.c_str());
        EXPECT_NE(e.find(path), std::string::npos) << e;
        EXPECT_EQ(e.find('\n'), std::string::npos) << e;
        EXPECT_NE(e.find(want), std::string::npos) << e;
        EXPECT_TRUE(pcm.samples.empty());
    }
    if (!g4::media::have_ffmpeg()) {
        g4::media::AudioPcm pcm;
        const std::string e = g4::media::load_audio(dir() + "/tones.mp3", 16000, 480000, &pcm);
        EXPECT_NE(e.find("built without FFmpeg"), std::string::npos) << e;
        return;
    }
    // Files whose text names other files or URLs are refused: FFmpeg opens local files of plain containers
    // only (an HLS playlist or a concat list would otherwise read the files it names).
    const std::string wav_path = dir() + "/tones_44k1_stereo.wav";
    for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
             {"list.m3u8",
              "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10.0,\n" + wav_path + "\n#EXT-X-ENDLIST\n"},
             {"list.ffconcat", "ffconcat version 1.0\nfile '" + wav_path + "'\n"},
             {"remote.m3u8", "#EXTM3U\n#EXTINF:10.0,\nhttp://127.0.0.1:9/a.wav\n#EXT-X-ENDLIST\n"}}) {
        g4::media::AudioPcm pcm;
        const std::string path = write(name, text);
        const std::string e    = g4::media::load_audio(path, 16000, 480000, &pcm);
        EXPECT_NE(e.find(path), std::string::npos) << e;
        EXPECT_NE(e.find("not a media file FFmpeg recognises"), std::string::npos) << e;
        EXPECT_TRUE(pcm.samples.empty());
    }
    // A 7.6 KB MP4 whose sample table declares 1.4 GB: refused at open, nothing that large allocated
    // (FFmpeg's single allocations are capped at kMaxFfmpegAlloc), as audio and as video.
    {
        const std::string mp4 =
            g4test::fixtures_dir() + "/../fuzz/regressions/media/mp4_sample_table_1400mb.mp4";
        g4::media::AudioPcm pcm;
        std::string e = g4::media::load_audio(mp4, 16000, 480000, &pcm);
        EXPECT_NE(e.find("its header asks for more than 64 MiB at once"), std::string::npos) << e;
        EXPECT_TRUE(pcm.samples.empty());
        g4::media::VideoFrames v;
        e = g4::media::load_video(mp4, 4, int64_t(1) << 20, &v,
                                  [](size_t, const g4::media::ImageRGB8&) { return std::string(); });
        EXPECT_NE(e.find("its header asks for more than 64 MiB at once"), std::string::npos) << e;
    }
    // longer than the plan takes: refused (0.9 s against 0.5 s)
    for (const char* f : {"tones.mp3", "tones_44k1_stereo.wav", "tones_48k_stereo.flac"}) {
        g4::media::AudioPcm pcm;
        const std::string e = g4::media::load_audio(dir() + "/" + f, 16000, 8000, &pcm);
        EXPECT_NE(e.find("of audio but the plan takes at most 0.50 s"), std::string::npos) << f << ": " << e;
        EXPECT_TRUE(pcm.samples.empty());
    }
}

} // namespace
