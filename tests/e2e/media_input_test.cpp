// Images and audio from files and encoded bytes through the C API (g4_session_add_image_file, _encoded,
// g4_session_add_audio_file, _encoded) on the tiny multimodal plan (e2b_tiny_mm): each gives exactly the soft
// tokens and prompt logits of decoding the same input with runtime/src/media and feeding the pixels /
// samples, and bad files or bytes are refused with the right status and one line naming the input.
#include "g4/g4.h"
#include "runtime/src/media/audio_io.h"
#include "runtime/src/media/image_io.h"
#include "runtime/src/media/media_decode.h"
#include "test_util.h"

#include <cstdint>
#include <gtest/gtest.h>
#include <string>
#include <vector>

namespace {

using namespace g4test;

class MediaInput : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_          = new TempDir();
        const auto pl = dir_->file("mm.g4plan");
        CmdResult r   = run_g4("compile --model '" + fixture("e2b_tiny_mm") +
                               "' --weights f32 --image-tokens 70 --no-fidelity -o '" + pl + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        ASSERT_EQ(g4_engine_open(pl.c_str(), nullptr, &engine_), G4_OK) << g4_last_error_message();
        ASSERT_EQ(g4_engine_get_media_info(engine_, &mi_), G4_OK);
    }
    static void TearDownTestSuite() {
        g4_engine_close(engine_);
        delete dir_;
    }
    void SetUp() override {
        g4_session_params sp = g4_session_params_default();
        sp.n_threads         = 2;
        ASSERT_EQ(g4_session_create(engine_, &sp, &s_), G4_OK) << g4_last_error_message();
    }
    void TearDown() override { g4_session_destroy(s_); }

    // The logits of <bo?> n placeholders <eo?> after the media call, on a fresh session state.
    std::vector<float> prompt_logits(bool image, int32_t n) {
        std::vector<int32_t> ids{image ? mi_.boi_token_id : mi_.boa_token_id};
        ids.insert(ids.end(), (size_t)n, image ? mi_.image_token_id : mi_.audio_token_id);
        ids.push_back(image ? mi_.eoi_token_id : mi_.eoa_token_id);
        std::vector<float> got(ids.size() * 512);
        const g4_status st = g4_session_append_tokens(s_, ids.data(), ids.size(), got.data(), got.size());
        EXPECT_EQ(st, G4_OK) << g4_last_error_message();
        g4_session_reset(s_);
        return got;
    }
    // The reference: pixels / samples decoded by runtime/src/media, fed through the plain calls.
    std::vector<float> image_reference(const std::string& path, int32_t* n) {
        g4::media::ImageRGB8 img;
        EXPECT_EQ(g4::media::load_image(path, &img, mi_.max_image_pixels), "");
        EXPECT_EQ(g4_session_add_image(s_, img.rgb.data(), img.width, img.height, n), G4_OK);
        return prompt_logits(true, *n);
    }
    std::vector<float> audio_reference(const std::string& path, int32_t* n) {
        g4::media::AudioPcm pcm;
        EXPECT_EQ(g4::media::load_audio(path, mi_.audio_sample_rate, mi_.max_audio_samples, &pcm), "");
        EXPECT_EQ(g4_session_add_audio(s_, pcm.samples.data(), (int64_t)pcm.samples.size(), n), G4_OK);
        return prompt_logits(false, *n);
    }
    // A failing call: status, one line naming `name`, nothing queued (a placeholder then has no row).
    void expect_refused(g4_status got, g4_status want, const std::string& name, bool image) {
        EXPECT_EQ(got, want) << g4_last_error_message();
        const std::string msg = g4_last_error_message();
        EXPECT_NE(msg.find(name), std::string::npos) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
        const int32_t ph = image ? mi_.image_token_id : mi_.audio_token_id;
        EXPECT_EQ(g4_session_append_tokens(s_, &ph, 1, nullptr, 0), G4_ERR_INVALID_ARGUMENT);
        g4_session_reset(s_);
    }

    static TempDir* dir_;
    static g4_engine* engine_;
    static g4_media_info mi_;
    g4_session* s_ = nullptr;
};
TempDir* MediaInput::dir_      = nullptr;
g4_engine* MediaInput::engine_ = nullptr;
g4_media_info MediaInput::mi_{};

TEST_F(MediaInput, ImageFileAndBytesMatchPixels) {
    for (const char* f : {"towers/image/rgb_37x53.png", "towers/formats/exif_o6.jpg"}) {
        const std::string path = fixture(f);
        int32_t n_ref = 0, n_file = 0, n_bytes = 0;
        const std::vector<float> ref = image_reference(path, &n_ref);
        ASSERT_GT(n_ref, 0) << f;
        ASSERT_EQ(g4_session_add_image_file(s_, path.c_str(), &n_file), G4_OK) << g4_last_error_message();
        EXPECT_EQ(n_file, n_ref) << f;
        EXPECT_EQ(prompt_logits(true, n_file), ref) << f;
        const std::string bytes = read_file(path);
        ASSERT_EQ(g4_session_add_image_encoded(s_, bytes.data(), bytes.size(), &n_bytes), G4_OK)
            << g4_last_error_message();
        EXPECT_EQ(n_bytes, n_ref) << f;
        EXPECT_EQ(prompt_logits(true, n_bytes), ref) << f;
    }
}

TEST_F(MediaInput, AudioFileAndWavBytesMatchSamples) {
    const std::string wav = fixture("towers/audio/clip0.wav");
    int32_t n_ref = 0, n_file = 0, n_bytes = 0;
    const std::vector<float> ref = audio_reference(wav, &n_ref);
    ASSERT_GT(n_ref, 0);
    ASSERT_EQ(g4_session_add_audio_file(s_, wav.c_str(), &n_file), G4_OK) << g4_last_error_message();
    EXPECT_EQ(n_file, n_ref);
    EXPECT_EQ(prompt_logits(false, n_file), ref);
    const std::string bytes = read_file(wav);
    ASSERT_EQ(g4_session_add_audio_encoded(s_, bytes.data(), bytes.size(), &n_bytes), G4_OK)
        << g4_last_error_message();
    EXPECT_EQ(n_bytes, n_ref);
    EXPECT_EQ(prompt_logits(false, n_bytes), ref);
}

TEST_F(MediaInput, CompressedAudioFileMatchesDecoder) {
    const std::string mp3 = fixture("towers/audio_files/tones.mp3");
    int32_t n             = 0;
    if (!g4::media::have_ffmpeg()) {
        expect_refused(g4_session_add_audio_file(s_, mp3.c_str(), &n), G4_ERR_INVALID_ARGUMENT, mp3, false);
        GTEST_SKIP() << "built without FFmpeg: compressed audio is refused (checked)";
    }
    int32_t n_ref                = 0;
    const std::vector<float> ref = audio_reference(mp3, &n_ref);
    ASSERT_GT(n_ref, 0);
    ASSERT_EQ(g4_session_add_audio_file(s_, mp3.c_str(), &n), G4_OK) << g4_last_error_message();
    EXPECT_EQ(n, n_ref);
    EXPECT_EQ(prompt_logits(false, n), ref);
    // From memory only WAV is read.
    const std::string bytes = read_file(mp3);
    expect_refused(g4_session_add_audio_encoded(s_, bytes.data(), bytes.size(), &n), G4_ERR_INVALID_ARGUMENT,
                   "not a WAV file", false);
}

TEST_F(MediaInput, BadFilesAndBytesAreRefused) {
    int32_t n                 = 0;
    const std::string missing = dir_->file("no_such.png");
    expect_refused(g4_session_add_image_file(s_, missing.c_str(), &n), G4_ERR_IO, missing, true);
    expect_refused(g4_session_add_audio_file(s_, missing.c_str(), &n), G4_ERR_IO, missing, false);
    const std::string folder = fixture("towers/image");
    expect_refused(g4_session_add_image_file(s_, folder.c_str(), &n), G4_ERR_IO, "directory", true);
    expect_refused(g4_session_add_audio_file(s_, folder.c_str(), &n), G4_ERR_IO, "directory", false);

    // Not an image; a PNG cut short; a header declaring more pixels than the plan takes.
    const std::string junk = "this is not an image at all";
    expect_refused(g4_session_add_image_encoded(s_, junk.data(), junk.size(), &n), G4_ERR_INVALID_ARGUMENT,
                   std::to_string(junk.size()) + " bytes", true);
    const std::string png = read_file(fixture("towers/image/rgb_37x53.png"));
    const std::string cut = dir_->file("cut.png");
    write_file(cut, png.substr(0, png.size() / 2));
    expect_refused(g4_session_add_image_file(s_, cut.c_str(), &n), G4_ERR_INVALID_ARGUMENT, cut, true);
    const std::string big = "P5\n" + std::to_string(mi_.max_image_pixels + 1) + " 1\n255\n";
    expect_refused(g4_session_add_image_encoded(s_, big.data(), big.size(), &n), G4_ERR_INVALID_ARGUMENT,
                   std::to_string(mi_.max_image_pixels + 1) + "x1", true);

    // Not a WAV; a WAV cut short; a clip longer than the plan takes (max_audio_samples + 1 frames).
    expect_refused(g4_session_add_audio_encoded(s_, junk.data(), junk.size(), &n), G4_ERR_INVALID_ARGUMENT,
                   "not a WAV file", false);
    const std::string wav = read_file(fixture("towers/audio/clip0.wav"));
    expect_refused(g4_session_add_audio_encoded(s_, wav.data(), 40, &n), G4_ERR_INVALID_ARGUMENT, "40 bytes",
                   false);
    const uint32_t frames = (uint32_t)mi_.max_audio_samples + 1, data_bytes = frames * 2;
    std::string longwav = "RIFF" + std::string(4, '\0') + "WAVEfmt " + std::string(20, '\0') + "data" +
                          std::string(4, '\0') + std::string(data_bytes, '\0');
    auto put = [&](size_t at, uint32_t v, int bytes) {
        for (int i = 0; i < bytes; ++i)
            longwav[at + i] = char((v >> (8 * i)) & 0xff);
    };
    put(4, (uint32_t)longwav.size() - 8, 4);
    put(16, 16, 4);    // fmt chunk size
    put(20, 1, 2);     // PCM
    put(22, 1, 2);     // mono
    put(24, 16000, 4); // rate
    put(28, 32000, 4); // bytes a second
    put(32, 2, 2);     // block
    put(34, 16, 2);    // bits
    put(40, data_bytes, 4);
    expect_refused(g4_session_add_audio_encoded(s_, longwav.data(), longwav.size(), &n),
                   G4_ERR_INVALID_ARGUMENT, "bytes given to g4_session_add_audio_encoded", false);
    const std::string longpath = dir_->file("long.wav");
    write_file(longpath, longwav);
    expect_refused(g4_session_add_audio_file(s_, longpath.c_str(), &n), G4_ERR_INVALID_ARGUMENT, longpath,
                   false);

    // NULL arguments and handles.
    EXPECT_EQ(g4_session_add_image_file(s_, nullptr, &n), G4_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(g4_session_add_image_encoded(s_, nullptr, 4, &n), G4_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(g4_session_add_audio_file(nullptr, missing.c_str(), &n), G4_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(g4_session_add_audio_encoded(s_, nullptr, 4, &n), G4_ERR_INVALID_ARGUMENT);
}

TEST_F(MediaInput, TextOnlyPlanRefusesBeforeDecoding) {
    const std::string plan = dir_->file("text.g4plan");
    CmdResult r            = run_g4("compile --model '" + fixture("e2b_tiny") +
                                    "' --no-vision --no-audio --no-fidelity -o '" + plan + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    g4_engine* e = nullptr;
    ASSERT_EQ(g4_engine_open(plan.c_str(), nullptr, &e), G4_OK) << g4_last_error_message();
    g4_session* s = nullptr;
    ASSERT_EQ(g4_session_create(e, nullptr, &s), G4_OK) << g4_last_error_message();
    const std::string png = fixture("towers/image/rgb_37x53.png");
    int32_t n             = 0;
    EXPECT_EQ(g4_session_add_image_file(s, png.c_str(), &n), G4_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(g4_last_error_message()).find("no vision tower"), std::string::npos);
    const std::string wav = fixture("towers/audio/clip0.wav");
    EXPECT_EQ(g4_session_add_audio_file(s, wav.c_str(), &n), G4_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(g4_last_error_message()).find("no audio tower"), std::string::npos);
    g4_session_destroy(s);
    g4_engine_close(e);
}

} // namespace
