// The WAV reader (runtime/src/media/audio_io.*): the fixture clip (tests/fixtures/towers/audio, from
// tools/make_audio_fixtures.py) against its float samples, the formats and channel layouts it converts, and
// malformed files.
#include "runtime/src/media/audio_io.h"
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <gtest/gtest.h>
#include <string>
#include <vector>

using namespace g4;

namespace {

std::string dir() {
    return g4test::fixture("towers/audio");
}

double max_abs_diff(const float* a, const float* b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; ++i)
        m = std::max(m, (double)std::fabs(a[i] - b[i]));
    return m;
}

} // namespace

namespace {

void put16(std::string& s, uint16_t v) {
    s += (char)(v & 255);
    s += (char)(v >> 8);
}
void put32(std::string& s, uint32_t v) {
    for (int i = 0; i < 4; ++i)
        s += (char)((v >> (8 * i)) & 255);
}

std::string make_wav(int format, int channels, uint32_t rate, int bits, const std::string& data,
                     bool extensible = false) {
    std::string fmt;
    put16(fmt, extensible ? 0xFFFE : format);
    put16(fmt, channels);
    put32(fmt, rate);
    put32(fmt, rate * channels * bits / 8);
    put16(fmt, channels * bits / 8);
    put16(fmt, bits);
    if (extensible) {
        put16(fmt, 22);
        put16(fmt, bits);
        put32(fmt, 0);
        put16(fmt, format);
        fmt += std::string("\x00\x00\x00\x00\x10\x00\x80\x00\x00\xAA\x00\x38\x9B\x71", 14);
    }
    std::string body = "WAVE";
    body += "fmt ";
    put32(body, (uint32_t)fmt.size());
    body += fmt;
    body += "LIST"; // an unrelated chunk of odd size, padded
    put32(body, 3);
    body += std::string("abc\0", 4);
    body += "data";
    put32(body, (uint32_t)data.size());
    body += data;
    std::string s = "RIFF";
    put32(s, (uint32_t)body.size());
    return s + body;
}

} // namespace

TEST(AudioWav, FixtureWavEqualsThePcm) {
    media::AudioPcm a;
    ASSERT_EQ(media::load_wav(dir() + "/clip0.wav", &a), "");
    auto pcm = g4test::read_f32(dir() + "/clip0.pcm.f32");
    EXPECT_EQ(a.sample_rate, 16000);
    ASSERT_EQ(a.samples.size(), pcm.size());
    EXPECT_LE(max_abs_diff(a.samples.data(), pcm.data(), pcm.size()), 1.0 / 32768);
}

TEST(AudioWav, FormatsAndChannels) {
    g4test::TempDir tmp;
    const std::vector<double> x = {0.0, 0.5, -0.5, 0.25, -1.0, 0.999};
    auto load                   = [&](const std::string& bytes, media::AudioPcm* a) {
        g4test::write_file(tmp.file("t.wav"), bytes);
        return media::load_wav(tmp.file("t.wav"), a);
    };
    { // stereo 16-bit: left x, right -x/2 -> mono x/4
        std::string d;
        for (double v : x) {
            put16(d, (uint16_t)(int16_t)std::lround(std::min(v * 32768, 32767.0)));
            put16(d, (uint16_t)(int16_t)std::lround(-v * 16384));
        }
        media::AudioPcm a;
        ASSERT_EQ(load(make_wav(1, 2, 16000, 16, d), &a), "");
        ASSERT_EQ(a.samples.size(), x.size());
        for (size_t i = 0; i < x.size(); ++i)
            EXPECT_NEAR(a.samples[i], x[i] / 4, 1.0 / 32768) << i;
    }
    { // 24-bit mono
        std::string d;
        for (double v : x) {
            int32_t s = (int32_t)std::lround(std::min(v * 8388608, 8388607.0));
            d += (char)(s & 255);
            d += (char)((s >> 8) & 255);
            d += (char)((s >> 16) & 255);
        }
        media::AudioPcm a;
        ASSERT_EQ(load(make_wav(1, 1, 16000, 24, d), &a), "");
        for (size_t i = 0; i < x.size(); ++i)
            EXPECT_NEAR(a.samples[i], x[i], 1.0 / 8388608) << i;
    }
    { // 32-bit integer, 3 channels (x, x, x)
        std::string d;
        for (double v : x)
            for (int c = 0; c < 3; ++c)
                put32(d, (uint32_t)(int32_t)std::llround(std::min(v * 2147483648.0, 2147483647.0)));
        media::AudioPcm a;
        ASSERT_EQ(load(make_wav(1, 3, 16000, 32, d), &a), "");
        for (size_t i = 0; i < x.size(); ++i)
            EXPECT_NEAR(a.samples[i], x[i], 1e-7) << i;
    }
    { // 32-bit float stereo, WAVE_FORMAT_EXTENSIBLE
        std::string d;
        for (double v : x) {
            float l = (float)v, r = (float)(v * 0.5);
            d.append((const char*)&l, 4);
            d.append((const char*)&r, 4);
        }
        media::AudioPcm a;
        ASSERT_EQ(load(make_wav(3, 2, 16000, 32, d, true), &a), "");
        for (size_t i = 0; i < x.size(); ++i)
            EXPECT_FLOAT_EQ(a.samples[i], (float)(((float)x[i] + (float)(x[i] * 0.5)) / 2.0)) << i;
    }
}

TEST(AudioWav, BadFilesGiveClearErrors) {
    g4test::TempDir tmp;
    std::string d16;
    for (int i = 0; i < 100; ++i)
        put16(d16, (uint16_t)(i * 100));
    auto err = [&](const std::string& bytes) {
        g4test::write_file(tmp.file("bad.wav"), bytes);
        media::AudioPcm a;
        return media::load_wav(tmp.file("bad.wav"), &a);
    };
    std::string e = err(make_wav(1, 1, 44100, 16, d16));
    EXPECT_NE(e.find("44100 Hz"), std::string::npos) << e;
    EXPECT_NE(e.find("ffmpeg -i in.wav -ar 16000 -ac 1"), std::string::npos) << e;
    EXPECT_NE(e.find(tmp.file("bad.wav")), std::string::npos) << e;

    std::string full = g4test::read_file(dir() + "/clip0.wav");
    e                = err(full.substr(0, full.size() / 2));
    EXPECT_NE(e.find("truncated"), std::string::npos) << e;
    e = err(full.substr(0, 30));
    EXPECT_NE(e.find("truncated"), std::string::npos) << e;
    e = err("this is not a wave file at all, just some text");
    EXPECT_NE(e.find("not a WAV file"), std::string::npos) << e;
    e = err(make_wav(1, 1, 16000, 8, d16));
    EXPECT_NE(e.find("8-bit"), std::string::npos) << e;
    e = err(make_wav(2, 1, 16000, 16, d16)); // ADPCM
    EXPECT_NE(e.find("unsupported WAV encoding"), std::string::npos) << e;
    e = err(make_wav(1, 1, 16000, 16, ""));
    EXPECT_NE(e.find("no audio samples"), std::string::npos) << e;
    media::AudioPcm a;
    e = media::load_wav(tmp.file("does_not_exist.wav"), &a);
    EXPECT_NE(e.find("does_not_exist.wav"), std::string::npos) << e;
    EXPECT_NE(e.find("cannot open"), std::string::npos) << e;
}
