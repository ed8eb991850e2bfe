// Video limits and bad video files (runtime/src/media/video_decode.cpp): a codec FFmpeg cannot decode, a
// video stream without frames, a declared duration past the limit, and each run-time limit (frames sampled,
// seconds, stream frames, pixels) give one line naming the file, before anything is decoded where the
// container says enough; `g4 run` reports them the same way. Files are made from the fixtures by patching
// their headers.
#include "runtime/src/media/media_decode.h"
#include "runtime/src/media/video_decode.h"
#include "test_util.h"

#include <cstring>
#include <gtest/gtest.h>
#include <string>

namespace {

using g4::media::VideoFrames;
using g4::media::VideoLimits;

std::string webm() {
    return g4test::read_file(g4test::fixture("towers/video/pattern_97x61_12.5fps.webm"));
}

// A copy of the fixture with `from` (found once) replaced by `to`, written to dir/name.
std::string patched(g4test::TempDir& dir, const std::string& name, const std::string& from,
                    const std::string& to) {
    std::string d   = webm();
    const size_t at = d.find(from);
    EXPECT_NE(at, std::string::npos);
    EXPECT_EQ(d.find(from, at + 1), std::string::npos);
    d.replace(at, from.size(), to);
    const std::string path = dir.file(name);
    g4test::write_file(path, d);
    return path;
}

std::string load(const std::string& path, const VideoLimits& lim = {}) {
    VideoFrames v;
    const std::string e = g4::media::load_video(path, lim, &v);
    EXPECT_TRUE(e.empty() || (v.frames.empty() && v.indices.empty())) << "frames kept after an error";
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    return e;
}

class VideoLimitsTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (!g4::media::have_ffmpeg()) GTEST_SKIP() << "built without FFmpeg: g4 cannot decode video";
    }
    g4test::TempDir dir_;
};

TEST_F(VideoLimitsTest, CodecThisFfmpegLacks) {
    const std::string f = patched(dir_, "unknown_codec.webm", "V_VP9", "V_XYZ");
    const std::string e = load(f);
    EXPECT_EQ(e.rfind("video file " + f + ": ", 0), 0u) << e;
    EXPECT_NE(e.find("codec"), std::string::npos) << e;
}

TEST_F(VideoLimitsTest, StreamWithoutFrames) {
    // The H.264 fixture with its sample table's count set to 0: a video track that holds no frame.
    std::string d   = g4test::read_file(g4test::fixture("towers/video/pattern_97x61_12.5fps.mp4"));
    const size_t at = d.find("stsz");
    ASSERT_NE(at, std::string::npos);
    d.replace(at + 12, 4, std::string(4, '\0'));
    const std::string f = dir_.file("no_frames.mp4");
    g4test::write_file(f, d);
    EXPECT_EQ(load(f), "video file " + f + ": its video stream holds no frames");
}

TEST_F(VideoLimitsTest, AbsurdDeclaredDuration) {
    // Segment duration 2000 ms (an 8-byte float) declared as 1e12 ms: refused before decoding.
    double ms = 1e12;
    std::string big(8, '\0');
    for (int i = 0; i < 8; ++i)
        big[i] = char(reinterpret_cast<const unsigned char*>(&ms)[7 - i]); // EBML floats are big-endian
    const std::string f = patched(dir_, "long.webm", std::string("\x44\x89\x88\x40\x9f\x40\0\0\0\0\0", 11),
                                  "\x44\x89\x88" + big);
    const std::string e = load(f);
    EXPECT_NE(
        e.find("video file " + f + ": declares 1e+09 s, longer than the limit (--max-video-seconds 3600)"),
        std::string::npos)
        << e;
}

TEST_F(VideoLimitsTest, RunTimeLimits) {
    const std::string f = g4test::fixture("towers/video/pattern_97x61_12.5fps.webm"); // 2 s, 25 frames, 97x61
    VideoLimits lim;
    EXPECT_EQ(load(f, lim), "");
    lim.max_seconds = 1.5;
    EXPECT_NE(load(f, lim).find("longer than the limit (--max-video-seconds 1.5)"), std::string::npos);
    lim                   = {};
    lim.max_stream_frames = 10;
    EXPECT_NE(load(f, lim).find("has more than 10 frames (--max-video-stream-frames)"), std::string::npos);
    lim            = {};
    lim.max_pixels = 97 * 61 - 1;
    EXPECT_NE(load(f, lim).find("frames of 97x61 pixels, outside 1..5916"), std::string::npos);
    lim            = {};
    lim.num_frames = 0;
    EXPECT_NE(load(f, lim).find("0 frames asked for, outside 1..1024"), std::string::npos);
    lim.num_frames = 5; // fewer frames than the processor's 32: sampled the same way
    VideoFrames v;
    ASSERT_EQ(g4::media::load_video(f, lim, &v), "");
    EXPECT_EQ(v.indices, (std::vector<int64_t>{0, 5, 10, 15, 20}));
    EXPECT_EQ(v.frames.size(), 5u);
}

// The CLI: each limit as a flag, bad files as one line naming the file, exit 1.
TEST_F(VideoLimitsTest, CliReportsThemInOneLine) {
    const std::string plan = dir_.file("mm.g4plan");
    g4test::CmdResult c =
        g4test::run_g4("compile --model '" + g4test::fixture("e2b_tiny_mm") + "' -o '" + plan + "'");
    ASSERT_EQ(c.exit_code, 0) << c.err;
    const std::string f   = g4test::fixture("towers/video/pattern_97x61_12.5fps.webm");
    const std::string cut = patched(dir_, "unknown.webm", "V_VP9", "V_XYZ");
    const std::string mp3 = g4test::fixture("towers/audio_files/tones.mp3"); // 0.9 s
    struct Case {
        std::string args, want;
        int code;
    } cases[] = {
        {"--video '" + f + "' --max-video-seconds 1", "longer than the limit (--max-video-seconds 1)", 1},
        {"--video '" + f + "' --max-video-stream-frames 3", "has more than 3 frames", 1},
        {"--video '" + f + "' --max-image-pixels 100", "frames of 97x61 pixels, outside 1..100", 1},
        {"--video '" + f + "' --video-frames 0", "--video-frames", 2},
        {"--video '" + f + "' --max-image-pixels 99999999999", "is over the plan's", 2},
        {"--video '" + cut + "'", "video file " + cut + ": ", 1},
        {"--audio '" + mp3 + "' --max-audio-seconds 0.5", mp3, 1},
    };
    for (const Case& k : cases) {
        const g4test::CmdResult r = g4test::run_g4("run '" + plan + "' --tokens 2 -n 1 " + k.args);
        EXPECT_EQ(r.exit_code, k.code) << k.args << ": " << r.err;
        EXPECT_NE(r.err.find(k.want), std::string::npos) << k.args << ": " << r.err;
    }
    // Fewer frames asked for: a shorter prompt.
    const g4test::CmdResult few = g4test::run_g4(
        "run '" + plan + "' --tokens 2 -n 1 --temp 0 --stats --video '" + f + "' --video-frames 4");
    EXPECT_EQ(few.exit_code, 0) << few.err;
}

} // namespace
