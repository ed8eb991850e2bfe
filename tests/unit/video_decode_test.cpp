// Video files through runtime/src/media/video_decode (FFmpeg's libraries): the frames and timestamps
// transformers 5.17's Gemma 4 video processor samples, the decoded pixels against OpenCV's FFmpeg-backed
// decode of the same frames (equal) (tests/fixtures/towers/video, made by tools/make_media_fixtures.py), and
// bad files refused.
#include "runtime/src/media/image_io.h"
#include "runtime/src/media/media_decode.h"
#include "runtime/src/media/video_decode.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>

namespace {

std::string dir() {
    return g4test::fixture("towers/video");
}

TEST(VideoDecode, SamplesAsTheProcessor) {
    // torch.arange(0, total, total / n).int()
    EXPECT_EQ(g4::media::video_sample_indices(25, 8), (std::vector<int64_t>{0, 3, 6, 9, 12, 15, 18, 21}));
    EXPECT_EQ(g4::media::video_sample_indices(100, 32).size(), 32u);
    EXPECT_EQ(g4::media::video_sample_indices(100, 32)[31], 96);    // 31 * 3.125 = 96.875
    EXPECT_EQ(g4::media::video_sample_indices(10, 32).size(), 10u); // fewer frames than asked: every frame
    EXPECT_TRUE(g4::media::video_sample_indices(0, 32).empty());
    EXPECT_EQ(g4::media::video_timestamp(21, 12.5), "00:01");
    EXPECT_EQ(g4::media::video_timestamp(1500, 12.5), "02:00");
    EXPECT_EQ(g4::media::video_timestamp(1499, 12.5), "01:59");
}

TEST(VideoDecode, FramesMatchOpenCvsDecode) {
    if (!g4::media::have_ffmpeg()) GTEST_SKIP() << "built without FFmpeg";
    for (const char* f : {"pattern_97x61_12.5fps.mp4", "pattern_97x61_12.5fps.webm"}) {
        g4::media::VideoFrames v;
        ASSERT_EQ(g4::media::load_video(dir() + "/" + f, 8, 0, &v), "") << f;
        EXPECT_EQ(v.total_frames, 25) << f;
        EXPECT_NEAR(v.fps, 12.5, 1e-9) << f;
        ASSERT_EQ(v.indices, (std::vector<int64_t>{0, 3, 6, 9, 12, 15, 18, 21})) << f;
        ASSERT_EQ(v.frames.size(), 8u);
        EXPECT_EQ(v.times.front(), "00:00");
        EXPECT_EQ(v.times.back(), "00:01");
        for (int k : {0, 7}) {
            g4::media::ImageRGB8 ref;
            const std::string png = dir() + "/" + f + ".cv2_frame" + std::to_string(v.indices[k]) + ".png";
            ASSERT_EQ(g4::media::load_image(png, &ref), "");
            const g4::media::ImageRGB8& got = v.frames[k];
            ASSERT_EQ(got.width, 97);
            ASSERT_EQ(got.height, 61);
            ASSERT_EQ(ref.rgb.size(), got.rgb.size());
            double sum = 0;
            int worst  = 0;
            for (size_t i = 0; i < ref.rgb.size(); ++i) {
                const int d = std::abs(int(got.rgb[i]) - int(ref.rgb[i]));
                sum += d;
                worst = std::max(worst, d);
            }
            const double mean = sum / double(ref.rgb.size());
            std::printf("%s frame %lld: mean |g4 - OpenCV| %.3f, max %d\n", f, (long long)v.indices[k], mean,
                        worst);
            EXPECT_EQ(worst, 0) << f; // libswscale, bicubic, as OpenCV converts
        }
    }
}

TEST(VideoDecode, FramesOneAtATime) {
    if (!g4::media::have_ffmpeg()) GTEST_SKIP() << "built without FFmpeg";
    const std::string f = dir() + "/pattern_97x61_12.5fps.webm";
    g4::media::VideoFrames all, one;
    ASSERT_EQ(g4::media::load_video(f, 8, 0, &all), "");
    size_t seen = 0;
    ASSERT_EQ(g4::media::load_video(f, 8, 0, &one,
                                    [&](size_t k, const g4::media::ImageRGB8& img) {
                                        EXPECT_EQ(k, seen++);
                                        EXPECT_EQ(img.rgb, all.frames[k].rgb);
                                        return std::string();
                                    }),
              "");
    EXPECT_EQ(seen, 8u);
    EXPECT_TRUE(one.frames.empty());
    EXPECT_EQ(one.times, all.times);
    // The callback's error ends the decode and is returned.
    EXPECT_EQ(g4::media::load_video(f, 8, 0, &one,
                                    [](size_t k, const g4::media::ImageRGB8&) {
                                        return k == 2 ? std::string("stop at 2") : std::string();
                                    }),
              "stop at 2");
}

TEST(VideoDecode, BadFilesAreOneLine) {
    g4test::TempDir tmp;
    const std::string empty = tmp.file("empty.mp4"), junk = tmp.file("junk.mp4"), cut = tmp.file("cut.mp4");
    std::ofstream(empty).close();
    std::ofstream(junk) << "this is not a video at all";
    const std::string whole = g4test::read_file(dir() + "/pattern_97x61_12.5fps.mp4");
    std::ofstream(cut, std::ios::binary) << whole.substr(0, whole.size() / 3);
    g4::media::VideoFrames v;
    for (const std::string& f : {empty, junk, tmp.file("missing.mp4")}) {
        std::string e = g4::media::load_video(f, 8, 0, &v);
        EXPECT_NE(e.find(f), std::string::npos) << e;
        EXPECT_EQ(e.find('\n'), std::string::npos) << e;
        EXPECT_TRUE(v.frames.empty());
    }
    if (!g4::media::have_ffmpeg()) return;
    // A sound-only file has no video stream.
    std::string e = g4::media::load_video(g4test::fixture("towers/audio_files/tones.mp3"), 8, 0, &v);
    EXPECT_NE(e.find("has no video stream"), std::string::npos) << e;
    // A truncated file: refused or decoded to fewer frames, never a crash.
    e = g4::media::load_video(cut, 8, 0, &v);
    if (e.empty()) {
        EXPECT_EQ(v.frames.size(), v.indices.size());
    }
    // Frames over the pixel limit are refused before decoding.
    e = g4::media::load_video(dir() + "/pattern_97x61_12.5fps.webm", 8, 1000, &v);
    EXPECT_NE(e.find("97x61"), std::string::npos) << e;
}

} // namespace
