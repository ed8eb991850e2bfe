// Video limits recorded in the plan (g4 compile --video-frames, --max-video-seconds,
// --max-video-stream-frames, --max-video-pixels, --max-video-bytes; META towers.vision.video):
// g4_media_info gives them, g4 run takes them as its defaults and its flags of the same names override them.
// And the default --max-media-tokens of a plan with video holds a whole default video and an image:
// `g4 run --video` on a near-16:9 clip (32 frames x 66 soft tokens, more than 2048) works with a
// default-compiled plan. Skipped without FFmpeg.
#include "g4/g4.h"
#include "runtime/src/media/media_decode.h"
#include "runtime/src/media/video_decode.h"
#include "test_util.h"

#include <algorithm>
#include <gtest/gtest.h>
#include <string>
#include <vector>

namespace {

using namespace g4test;

class VideoPlanLimits : public ::testing::Test {
protected:
    void SetUp() override {
        if (!g4::media::have_ffmpeg()) GTEST_SKIP() << "built without FFmpeg: g4 cannot decode video";
    }
    std::string compile(const std::string& name, const std::string& flags) {
        const std::string plan = dir_.file(name);
        // --cpu-precision f32: plans that differ in their limits (and so in their prompt chunks) give the
        // same logits to ~1e-6; the default int16 activations would put the chunking's rounding (~3e-4)
        // between them.
        CmdResult c = run_g4("compile --model '" + fixture("e2b_tiny_mm") +
                             "' --no-fidelity --cpu-precision f32 " + flags + " -o '" + plan + "'");
        EXPECT_EQ(c.exit_code, 0) << c.err;
        return plan;
    }
    static g4_media_info media_info(const std::string& plan) {
        g4_engine* e = nullptr;
        g4_media_info mi{};
        EXPECT_EQ(g4_engine_open(plan.c_str(), nullptr, &e), G4_OK) << g4_last_error_message();
        if (e) EXPECT_EQ(g4_engine_get_media_info(e, &mi), G4_OK);
        g4_engine_close(e);
        return mi;
    }
    // `g4 run PLAN --tokens 2 -n 1 --video FILE ARGS`; with dump, the prompt's logits go to that file.
    CmdResult run_video(const std::string& plan, const std::string& video, const std::string& args,
                        const std::string& dump = "") {
        return run_g4("run '" + plan + "' --tokens 2 -n 1 --temp 0 --video '" + video + "' " + args +
                      (dump.empty() ? "" : " --dump-logits '" + dump + "'"));
    }
    TempDir dir_;
};

TEST_F(VideoPlanLimits, DefaultPlanHoldsAWholeVideo) {
    const std::string plan = compile("default.g4plan", "");
    const g4_media_info mi = media_info(plan);
    ASSERT_GE(mi.video_token_id, 0);
    // The defaults recorded: today's run-time defaults.
    EXPECT_EQ(mi.video_frames, g4::media::kVideoFrames);
    EXPECT_EQ(mi.max_video_seconds, g4::media::kMaxVideoSeconds);
    EXPECT_EQ(mi.max_video_stream_frames, g4::media::kMaxVideoStreamFrames);
    EXPECT_EQ(mi.max_video_pixels, mi.max_image_pixels);
    EXPECT_EQ(mi.max_video_bytes, g4::media::kMaxMediaFileBytes);
    // A video at the processor's frame budget and an image besides.
    EXPECT_GE(mi.max_queued_tokens, mi.video_frames * mi.max_video_frame_tokens + mi.max_image_tokens);
    const std::string clip = fixture("towers/video/clip_99x57_14.985fps.mp4"); // 32 frames x 66 soft tokens
    CmdResult r            = run_video(plan, clip, "");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    // The queue of the former default (2048) cannot take it.
    const std::string small = compile("small.g4plan", "--max-media-tokens 2048");
    r                       = run_video(small, clip, "");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("2048"), std::string::npos) << r.err;
}

TEST_F(VideoPlanLimits, PlanRecordsThemAndRunFlagsOverride) {
    const std::string plan =
        compile("limits.g4plan", "--video-frames 4 --max-video-seconds 1 --max-video-stream-frames 10 "
                                 "--max-video-pixels 5000 --max-video-bytes 1000");
    const g4_media_info mi = media_info(plan);
    EXPECT_EQ(mi.video_frames, 4);
    EXPECT_EQ(mi.max_video_seconds, 1.0);
    EXPECT_EQ(mi.max_video_stream_frames, 10);
    EXPECT_EQ(mi.max_video_pixels, 5000);
    EXPECT_EQ(mi.max_video_bytes, 1000);
    // pattern_97x61: 13 KB, 97x61 pixels, 2 s, 25 frames. Each limit of the plan refuses it in turn until
    // the run-time flags lift it.
    const std::string f = fixture("towers/video/pattern_97x61_12.5fps.webm");
    struct Case {
        std::string args, want;
    } cases[] = {
        {"", "more than the limit of 1000 (--max-video-bytes)"},
        {"--max-video-bytes 100000", "frames of 97x61 pixels, outside 1..5000 (--max-video-pixels)"},
        {"--max-video-bytes 100000 --max-video-pixels 6000", "longer than the limit (--max-video-seconds 1)"},
        {"--max-video-bytes 100000 --max-video-pixels 6000 --max-video-seconds 5",
         "has more than 10 frames (--max-video-stream-frames)"},
    };
    for (const Case& k : cases) {
        CmdResult r = run_video(plan, f, k.args);
        EXPECT_EQ(r.exit_code, 1) << k.args << ": " << r.err;
        EXPECT_NE(r.err.find(k.want), std::string::npos) << k.args << ": " << r.err;
        EXPECT_NE(r.err.find(f), std::string::npos) << r.err;
    }
    const std::string lifted = "--max-video-bytes 100000 --max-video-pixels 6000 --max-video-seconds 5 "
                               "--max-video-stream-frames 100";
    const std::string dump = dir_.file("plan4.f32"), dump_flag = dir_.file("flag4.f32"),
                      dump8 = dir_.file("flag8.f32");
    CmdResult r             = run_video(plan, f, lifted, dump);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // The plan's 4 frames: the prompt a default plan builds with --video-frames 4, not its 32 (the clip's
    // 25).
    const std::string dflt = compile("default.g4plan", "");
    r                      = run_video(dflt, f, "--video-frames 4", dump_flag);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<float> a = read_f32(dump), b = read_f32(dump_flag);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_LT(rel_l2(a.data(), b.data(), b.size()), 1e-4); // two runs of NF4 plans on threads: ~1e-6 apart
    r = run_video(plan, f, lifted + " --video-frames 8", dump8);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_GT(read_f32(dump8).size(), a.size());
    // A run-time frame size over the plan's image size, and compile flags out of range: one line each.
    r = run_video(plan, f, "--max-video-pixels 99999999999");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("is over the plan's"), std::string::npos) << r.err;
    for (const char* bad :
         {"--max-video-pixels 99999999999", "--video-frames 2000", "--max-video-seconds 0"}) {
        CmdResult c = run_g4("compile --model '" + fixture("e2b_tiny_mm") + "' --no-fidelity " + bad +
                             " -o '" + dir_.file("bad.g4plan") + "'");
        EXPECT_NE(c.exit_code, 0) << bad;
        EXPECT_EQ(std::count(c.err.begin(), c.err.end(), '\n'), 1) << bad << ": " << c.err;
        EXPECT_NE(c.err.find(std::string(bad).substr(0, std::string(bad).find(' '))), std::string::npos)
            << bad << ": " << c.err;
    }
}

} // namespace
