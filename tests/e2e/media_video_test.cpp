// Video prompts against transformers' own video path (tools/make_media_fixtures.py video): an H.264 MP4
// (99x57, 15000/1001 fps, 45 frames) and a VP9 WebM (83x65, 24000/1001 fps, 40 frames) decoded by
// transformers' load_video (OpenCV's FFmpeg backend), sampled, resized and patched by Gemma4VideoProcessor
// (32 frames, 70 soft tokens a frame), written out by Gemma4Processor.replace_video_token and run through the
// float32 e2b_tiny_mm. g4's decoder must give the same frames, indices and prompt ids; its preprocessing the
// same pixel values; its plans the same logits and greedy tokens. G4_TEST_CUDA=1 runs the prompt checks on a
// CUDA plan (fed the reference's frames: they need no FFmpeg).
#include "g4/g4.h"
#include "runtime/src/frontend/image.h"
#include "runtime/src/media/image_io.h"
#include "runtime/src/media/media_decode.h"
#include "runtime/src/media/video_decode.h"
#include "test_util.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace {

using namespace g4test;
using json = nlohmann::json;

constexpr int kVocab = 512;

std::string vdir() {
    return fixture("towers/video");
}

const json& reference() {
    static const json m = json::parse(read_file(vdir() + "/video_ref.json"));
    return m;
}

// The k-th frame of a stack of equal frames laid top to bottom.
g4::media::ImageRGB8 frame_of(const g4::media::ImageRGB8& stack, int frames, int k) {
    g4::media::ImageRGB8 f;
    f.width            = stack.width;
    f.height           = stack.height / frames;
    const size_t bytes = size_t(f.width) * f.height * 3;
    f.rgb.assign(stack.rgb.begin() + k * bytes, stack.rgb.begin() + (k + 1) * bytes);
    return f;
}

// The reference's sampled frames (as load_video decoded them).
std::vector<g4::media::ImageRGB8> reference_frames(const json& c) {
    g4::media::ImageRGB8 stack;
    EXPECT_EQ(g4::media::load_image(vdir() + "/" + c.at("frames").get<std::string>(), &stack), "");
    const int n = (int)c.at("frames_indices").size();
    std::vector<g4::media::ImageRGB8> out;
    for (int k = 0; k < n && stack.height % n == 0; ++k)
        out.push_back(frame_of(stack, n, k));
    return out;
}

class VideoParity : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_  = new TempDir();
        plan_ = dir_->file("video.g4plan");
        std::string dev =
            on_cuda() ? " --device cuda --kv-dtype f32 --prefill-precision fp32 --no-fidelity" : "";
        const CmdResult r = run_g4("compile --model '" + fixture("e2b_tiny_mm") +
                                   "' --weights f32 --max-media-tokens 4096" + dev + " -o '" + plan_ + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        ASSERT_EQ(g4_engine_open(plan_.c_str(), nullptr, &engine_), G4_OK) << g4_last_error_message();
    }
    static void TearDownTestSuite() {
        g4_engine_close(engine_);
        delete dir_;
    }
    // The prompt's logits at the reference's rows, and greedy tokens after it, with `frames` queued.
    static void run_prompt(const json& c, const std::vector<g4::media::ImageRGB8>& frames,
                           std::vector<float>* rows, std::vector<int32_t>* greedy) {
        g4_session* s        = nullptr;
        g4_session_params sp = g4_session_params_default();
        sp.n_threads         = 2;
        ASSERT_EQ(g4_session_create(engine_, &sp, &s), G4_OK) << g4_last_error_message();
        for (const g4::media::ImageRGB8& f : frames) {
            int32_t n = 0;
            ASSERT_EQ(g4_session_add_video_frame(s, f.rgb.data(), f.width, f.height, &n), G4_OK)
                << g4_last_error_message();
            EXPECT_EQ(n, c.at("n_soft").get<int>());
        }
        const auto ids = c.at("ids").get<std::vector<int32_t>>();
        std::vector<float> all(ids.size() * kVocab);
        ASSERT_EQ(g4_session_append_tokens(s, ids.data(), ids.size(), all.data(), all.size()), G4_OK)
            << g4_last_error_message();
        for (int r : c.at("rows").get<std::vector<int>>())
            rows->insert(rows->end(), all.begin() + size_t(r) * kVocab, all.begin() + size_t(r + 1) * kVocab);
        for (size_t i = 0; i < c.at("greedy").size(); ++i) {
            int32_t t = 0;
            ASSERT_EQ(g4_session_sample(s, nullptr, &t), G4_OK);
            greedy->push_back(t);
            ASSERT_EQ(g4_session_append_tokens(s, &t, 1, nullptr, 0), G4_OK);
        }
        g4_session_destroy(s);
    }
    static TempDir* dir_;
    static std::string plan_;
    static g4_engine* engine_;
};
TempDir* VideoParity::dir_ = nullptr;
std::string VideoParity::plan_;
g4_engine* VideoParity::engine_ = nullptr;

// g4's decoder against load_video + the processor's sampling: the frame count, the sampled indices, the
// frames' pixels and the prompt ids (timestamps text included) as g4 builds them.
TEST_F(VideoParity, DecodedFramesAndPromptEqualTheReference) {
    if (on_cuda()) GTEST_SKIP() << "CPU-side check";
    if (!g4::media::have_ffmpeg()) GTEST_SKIP() << "built without FFmpeg: g4 cannot decode video";
    ASSERT_EQ(reference().at("clips").size(), 2u);
    for (const json& c : reference().at("clips")) {
        ASSERT_FALSE(c.contains("error")) << c.dump();
        const std::string file = c.at("file");
        g4::media::VideoFrames v;
        ASSERT_EQ(g4::media::load_video(vdir() + "/" + file, g4::media::kVideoFrames, 0, &v), "");
        EXPECT_EQ(v.total_frames, c.at("metadata").at("total_num_frames").get<int64_t>()) << file;
        EXPECT_EQ(v.indices, c.at("frames_indices").get<std::vector<int64_t>>()) << file;
        const auto want = reference_frames(c);
        ASSERT_EQ(v.frames.size(), want.size()) << file;
        size_t differ = 0;
        for (size_t k = 0; k < want.size(); ++k) {
            ASSERT_EQ(v.frames[k].width, want[k].width);
            ASSERT_EQ(v.frames[k].height, want[k].height);
            for (size_t i = 0; i < want[k].rgb.size(); ++i)
                differ += v.frames[k].rgb[i] != want[k].rgb[i];
        }
        EXPECT_EQ(differ, 0u) << file << ": decoded frames differ from load_video's";
        // The prompt: bos, 17, per frame "mm:ss " <boi> n x <|video|> <eoi> joined by " ", then 18.
        g4_media_info mi{};
        ASSERT_EQ(g4_engine_get_media_info(engine_, &mi), G4_OK);
        std::vector<int32_t> ids = {2, 17};
        for (size_t f = 0; f < v.times.size(); ++f) {
            const std::string text = (f ? " " : "") + v.times[f] + " ";
            size_t n               = 0;
            g4_tokenize(engine_, text.data(), text.size(), false, nullptr, 0, &n);
            std::vector<int32_t> t(n);
            ASSERT_EQ(g4_tokenize(engine_, text.data(), text.size(), false, t.data(), t.size(), &n), G4_OK);
            ids.insert(ids.end(), t.begin(), t.end());
            ids.push_back(mi.boi_token_id);
            ids.insert(ids.end(), c.at("n_soft").get<size_t>(), mi.video_token_id);
            ids.push_back(mi.eoi_token_id);
        }
        ids.push_back(18);
        EXPECT_EQ(ids, c.at("ids").get<std::vector<int32_t>>()) << file << ": " << c.at("text");
    }
}

// The processor's pixel values (of the first and last sampled frames): resized and patched at 70 soft tokens,
// bit for bit.
TEST_F(VideoParity, PixelValuesEqualTheProcessor) {
    if (on_cuda()) GTEST_SKIP() << "CPU-side check";
    constexpr int kPatch = 16, kPool = 3, kTokens = 70;
    for (const json& c : reference().at("clips")) {
        ASSERT_FALSE(c.contains("error")) << c.dump();
        const auto frames = reference_frames(c);
        g4::media::ImageRGB8 stack;
        ASSERT_EQ(g4::media::load_image(vdir() + "/" + c.at("resized").get<std::string>(), &stack), "");
        const auto keep = c.at("resized_frames").get<std::vector<int>>(); // the frames kept (first, last)
        ASSERT_EQ(stack.height % (int)keep.size(), 0);
        size_t differ = 0;
        for (size_t j = 0; j < keep.size(); ++j) {
            const g4::media::ImageRGB8& img = frames.at(keep[j]);
            const g4::media::ImageRGB8 want = frame_of(stack, (int)keep.size(), (int)j);
            const size_t need =
                g4::towers::preprocess_scratch_bytes_for(img.height, img.width, kTokens, kPatch, kPool);
            std::vector<uint64_t> scratch((need + 7) / 8);
            std::vector<float> patches(size_t(kTokens) * kPool * kPool * 3 * kPatch * kPatch);
            std::vector<int32_t> pos(size_t(kTokens) * kPool * kPool * 2);
            g4::towers::ImageLayout lay;
            ASSERT_EQ(g4::towers::preprocess_image(img.rgb.data(), img.height, img.width, kTokens, kPatch,
                                                   kPool, scratch.data(), need, patches.data(), pos.data(),
                                                   &lay),
                      "");
            ASSERT_EQ(lay.out_h, want.height);
            ASSERT_EQ(lay.out_w, want.width);
            EXPECT_EQ(lay.n_soft, c.at("n_soft").get<int>());
            for (int y = 0; y < lay.out_h; ++y)
                for (int x = 0; x < lay.out_w; ++x)
                    for (int ch = 0; ch < 3; ++ch) {
                        const float hf =
                            float(want.rgb[(size_t(y) * lay.out_w + x) * 3 + ch]) * float(1.0 / 255.0);
                        const size_t i = ((size_t(y / kPatch) * lay.grid_w + x / kPatch) * kPatch * kPatch +
                                          size_t(y % kPatch) * kPatch + x % kPatch) *
                                             3 +
                                         ch;
                        differ += std::memcmp(&patches[i], &hf, 4) != 0;
                    }
        }
        EXPECT_EQ(differ, 0u) << c.at("file") << ": pixel_values_videos not bit-exact";
    }
}

// The prompt's logits and greedy tokens against Hugging Face float32, with the reference's own frames.
TEST_F(VideoParity, PromptLogitsMatchHF) {
    for (const json& c : reference().at("clips")) {
        ASSERT_FALSE(c.contains("error")) << c.dump();
        std::vector<float> got;
        std::vector<int32_t> greedy;
        run_prompt(c, reference_frames(c), &got, &greedy);
        const std::vector<float> ref = read_f32(vdir() + "/" + c.at("logits").get<std::string>());
        ASSERT_EQ(got.size(), ref.size());
        const double err = rel_l2(got.data(), ref.data(), ref.size());
        std::printf("%s: %zu prompt ids, %zu rows: rel L2 vs HF float32 %.3e, greedy",
                    c.at("file").get<std::string>().c_str(), c.at("ids").size(), c.at("rows").size(), err);
        for (int32_t t : greedy)
            std::printf(" %d", t);
        std::printf("\n");
        EXPECT_LT(err, on_cuda() ? 2e-3 : 1e-4) << c.at("file");
        EXPECT_EQ(greedy, c.at("greedy").get<std::vector<int32_t>>()) << c.at("file");
    }
}

// `g4 run --video` on the clip at a lone <|video|> in --tokens: the same rows as the reference.
TEST_F(VideoParity, CliVideoMatchesHF) {
    if (on_cuda()) GTEST_SKIP() << "CPU plan check";
    if (!g4::media::have_ffmpeg()) GTEST_SKIP() << "built without FFmpeg: g4 cannot decode video";
    for (const json& c : reference().at("clips")) {
        ASSERT_FALSE(c.contains("error")) << c.dump();
        const std::string dump = dir_->file("video.f32");
        const CmdResult r = run_g4("run '" + plan_ + "' --tokens 2,17,258884,18 --video '" + vdir() + "/" +
                                   c.at("file").get<std::string>() +
                                   "' -n 1 --temp 0 --threads 2 --dump-logits '" + dump + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        const std::vector<float> all = read_f32(dump);
        ASSERT_EQ(all.size(), c.at("ids").size() * kVocab);
        std::vector<float> got;
        for (int row : c.at("rows").get<std::vector<int>>())
            got.insert(got.end(), all.begin() + size_t(row) * kVocab, all.begin() + size_t(row + 1) * kVocab);
        const std::vector<float> ref = read_f32(vdir() + "/" + c.at("logits").get<std::string>());
        const double err             = rel_l2(got.data(), ref.data(), ref.size());
        std::printf("g4 run --video %s: rel L2 vs HF float32 %.3e\n", c.at("file").get<std::string>().c_str(),
                    err);
        EXPECT_LT(err, 1e-4) << c.at("file");
    }
}

} // namespace

namespace {

// `g4 chat`'s /video FILE --audio (and --video FILE --video-audio) gives the reply `g4 run` gives for the
// same rendered prompt with --video and its sound track (--video-audio, or the file again as --audio): the
// template writes "\n\n<|video|>\n\n" then "<|audio|>" before the text, each marker its file's blocks.
TEST_F(VideoParity, ChatVideoWithItsSoundGivesTheTokensOfRun) {
    if (on_cuda()) GTEST_SKIP() << "CPU plan check";
    if (!g4::media::have_ffmpeg()) GTEST_SKIP() << "built without FFmpeg: g4 cannot decode video";
    const std::string v  = vdir() + "/with_sound_22k.mp4";
    const std::string in = dir_->file("chat.txt");
    write_file(in, "/video '" + v + "' --audio\nWhat happens?\n/video " + dir_->file("missing.mp4") +
                       "\n/video\n");
    const std::string opts = " -n 4 --temp 0 --threads 2 --print-ids";
    const CmdResult c =
        run_cmd("('" + cli_path() + "' chat '" + plan_ + "'" + opts + " --stats < '" + in + "')");
    ASSERT_EQ(c.exit_code, 0) << c.err;
    EXPECT_NE(c.err.find("with_sound_22k.mp4 attached to the next message: 10 of its 10 frames (10.00 fps), "
                         "with its sound track"),
              std::string::npos)
        << c.err;
    EXPECT_NE(c.err.find("g4 chat: error: video file " + dir_->file("missing.mp4") + ": cannot be read"),
              std::string::npos)
        << c.err;
    EXPECT_NE(c.err.find("g4 chat: error: /video needs a file"), std::string::npos) << c.err;
    const std::string reply = c.out.substr(0, c.out.find('\n'));
    ASSERT_FALSE(reply.empty()) << c.out;
    const std::string p = "-p '<|turn>user\n\n\n<|video|>\n\n<|audio|>What happens?<turn|>\n<|turn>model\n'";
    for (const std::string media :
         {" --video '" + v + "' --audio '" + v + "'", " --video '" + v + "' --video-audio"}) {
        const CmdResult r = run_g4("run '" + plan_ + "' " + p + media + opts);
        ASSERT_EQ(r.exit_code, 0) << media << ": " << r.err;
        EXPECT_EQ(r.out.substr(0, r.out.find('\n')), reply) << media;
    }
    // --video on the command line goes with the first message.
    write_file(in, "What happens?\n");
    const CmdResult o = run_cmd("('" + cli_path() + "' chat '" + plan_ + "'" + opts + " --video '" + v +
                                "' --video-audio < '" + in + "')");
    ASSERT_EQ(o.exit_code, 0) << o.err;
    EXPECT_EQ(o.out.substr(0, o.out.find('\n')), reply);
}

} // namespace
