// Hostile and malformed inputs to every parser g4 has: each must fail closed, with a one-line error naming
// the file (and field or tensor) and what is wrong; never a crash, a hang, an unbounded allocation or a
// silently wrong result. The inputs are made here, byte by byte.
#include "compiler/error.h"
#include "compiler/lora.h"
#include "compiler/safetensors.h"
#include "runtime/src/json_fields.h"
#include "runtime/src/json_limits.h"
#include "runtime/src/media/audio_io.h"
#include "runtime/src/media/image_io.h"
#include "runtime/src/tokenizer.h"
#include "test_util.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace {

using namespace g4test;
namespace fs = std::filesystem;
using json   = nlohmann::json;
using Clock  = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool one_line(const std::string& s) {
    return !s.empty() && s.find('\n') == std::string::npos;
}

std::string be16(uint32_t v) {
    return {char(v >> 8), char(v & 255)};
}
std::string be32(uint32_t v) {
    return {char(v >> 24), char((v >> 16) & 255), char((v >> 8) & 255), char(v & 255)};
}
std::string le16(uint32_t v) {
    return {char(v & 255), char(v >> 8)};
}
std::string le32(uint32_t v) {
    return {char(v & 255), char((v >> 8) & 255), char((v >> 16) & 255), char(v >> 24)};
}

std::string decode(const std::string& bytes, g4::media::ImageRGB8* img,
                   int64_t max_pixels = g4::media::kMaxImagePixels) {
    return g4::media::decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "'x.pnm'",
                                   img, max_pixels);
}

// ---- 16-bit PPM / PGM: decoded as Pillow does (PpmImagePlugin), never read past the buffer
// --------------------

// Pillow's 8-bit value of sample v: round(v / maxval * out_max) (Python's round: half to even), capped; grey
// with maxval > 255 is mode "I" (v itself at 65535), which convert("RGB") clips to 255.
uint8_t pillow_value(uint32_t v, uint32_t maxval, bool grey) {
    double x;
    if (grey && maxval > 255)
        x = maxval == 65535 ? v : std::min(65535.0, std::nearbyint(double(v) / maxval * 65535.0));
    else
        x = maxval == 255 ? v : std::nearbyint(double(v) / maxval * 255.0);
    return uint8_t(std::min(255.0, x));
}

std::string pnm(bool rgb, int w, int h, uint32_t maxval, const std::vector<uint32_t>& samples,
                const std::string& sep = " ") {
    std::string s = std::string(rgb ? "P6" : "P5") + sep + std::to_string(w) + sep + std::to_string(h) + sep +
                    std::to_string(maxval) + "\n";
    for (uint32_t v : samples)
        s += maxval > 255 ? be16(v) : std::string(1, char(v));
    return s;
}

TEST(HostileInput, Pnm16BitDecodesLikePillow) {
    for (bool rgb : {true, false}) {
        for (uint32_t maxval : {65535u, 1000u, 300u, 255u, 15u, 2u}) {
            const int w = 211, h = 203; // past the 200x200 where the 16-bit path used to crash
            std::vector<uint32_t> v(size_t(w) * h * (rgb ? 3 : 1));
            for (size_t i = 0; i < v.size(); ++i)
                v[i] = uint32_t((i * 2654435761u) % (maxval + 1));
            g4::media::ImageRGB8 img;
            ASSERT_EQ(decode(pnm(rgb, w, h, maxval, v), &img), "") << rgb << " " << maxval;
            ASSERT_EQ(img.width, w);
            ASSERT_EQ(img.height, h);
            ASSERT_EQ(img.rgb.size(), size_t(w) * h * 3);
            for (size_t p = 0; p < size_t(w) * h; ++p)
                for (int c = 0; c < 3; ++c)
                    ASSERT_EQ(img.rgb[3 * p + c], pillow_value(v[rgb ? 3 * p + c : p], maxval, !rgb))
                        << rgb << " " << maxval << " " << p;
        }
    }
    // Values Pillow gives, worked by hand: half rounds to even (3 / 10 * 255 = 76.5 -> 76, 1 / 2 * 255 =
    // 127.5
    // -> 128); a 16-bit grey sample of 300 clips to white, 200 stays 200.
    g4::media::ImageRGB8 img;
    ASSERT_EQ(decode(pnm(true, 1, 1, 10, {3, 10, 0}), &img), "");
    EXPECT_EQ(img.rgb, (std::vector<uint8_t>{76, 255, 0}));
    ASSERT_EQ(decode(pnm(false, 2, 1, 2, {1, 2}), &img), "");
    EXPECT_EQ(img.rgb, (std::vector<uint8_t>{128, 128, 128, 255, 255, 255}));
    ASSERT_EQ(decode(pnm(false, 2, 1, 65535, {200, 300}), &img), "");
    EXPECT_EQ(img.rgb, (std::vector<uint8_t>{200, 200, 200, 255, 255, 255}));
    ASSERT_EQ(decode(pnm(true, 1, 1, 65535, {0x8080, 0x7F7F, 0xFFFF}), &img), "");
    EXPECT_EQ(img.rgb, (std::vector<uint8_t>{128, 127, 255}));
    // Comments and any whitespace between header fields.
    ASSERT_EQ(decode("P6 # comment\n1\t#x\n 1\r\n255\n" + std::string("\x01\x02\x03", 3), &img), "");
    EXPECT_EQ(img.rgb, (std::vector<uint8_t>{1, 2, 3}));
}

TEST(HostileInput, PnmMalformed) {
    g4::media::ImageRGB8 img;
    auto err = [&](const std::string& bytes, const std::string& needle) {
        std::string e = decode(bytes, &img);
        EXPECT_NE(e.find(needle), std::string::npos) << e;
        EXPECT_NE(e.find("x.pnm"), std::string::npos) << e;
        EXPECT_TRUE(one_line(e)) << e;
        EXPECT_TRUE(img.rgb.empty());
    };
    std::vector<uint32_t> six(6, 1000);
    err(pnm(true, 2, 1, 65535, six).substr(0, 20), "truncated"); // 16-bit samples cut short
    err(pnm(true, 2, 1, 255, {1, 2, 3, 4, 5}), "truncated");
    err("P6 2 1", "truncated");
    err("P6 2 1 0\n" + std::string(6, 'x'), "maxval");
    err("P6 2 1 70000\n" + std::string(12, 'x'), "maxval");
    err("P5 0 5 255\n", "no pixels");
    err("P5 12345678901 1 255\n", "10 digits");
    err("P5 -3 1 255\n", "not a number");
    err("P3 1 1 255\n1 2 3\n", "not supported");
}

// ---- declared image size checked before decoding, for every format
// -------------------------------------------

TEST(HostileInput, ImageSizeCheckedBeforeDecoding) {
    const uint32_t n      = 10000; // 10^8 pixels, more than the default limit
    const std::string png = std::string("\x89PNG\r\n\x1a\n", 8) + be32(13) + "IHDR" + be32(n) + be32(n) +
                            std::string("\x08\x02\x00\x00\x00", 5) + be32(0) + be32(0) + "IEND" + be32(0);
    const std::string jpeg = std::string("\xFF\xD8\xFF\xC0", 4) + be16(17) + "\x08" + be16(n) + be16(n) +
                             std::string("\x03\x01\x11\x00\x02\x11\x00\x03\x11\x00", 10) +
                             std::string(64, '\0');
    const std::string bmp = "BM" + le32(54) + le32(0) + le32(54) + le32(40) + le32(n) + le32(n) + le16(1) +
                            le16(24) + le32(0) + le32(0) + le32(0) + le32(0) + le32(0) + le32(0);
    const std::string gif =
        "GIF89a" + le16(n) + le16(n) + std::string("\x00\x00\x00", 3) + std::string(16, '\0');
    const std::string pgm =
        "P5 20000 20000 255\n" + std::string(256, '\x7f'); // 275 bytes declaring 4 * 10^8 pixels
    for (const std::string* f : {&png, &jpeg, &bmp, &gif, &pgm}) {
        g4::media::ImageRGB8 img;
        const auto t0 = Clock::now();
        std::string e = decode(*f, &img);
        EXPECT_LT(seconds_since(t0), 0.5);
        EXPECT_NE(e.find("pixels, more than the limit of " + std::to_string(g4::media::kMaxImagePixels)),
                  std::string::npos)
            << e;
        EXPECT_TRUE(one_line(e)) << e;
        EXPECT_TRUE(img.rgb.empty());
    }
    // The caller's bound (a plan's --max-image-pixels).
    g4::media::ImageRGB8 img;
    std::vector<uint32_t> px(11 * 10, 7);
    std::string e = decode(pnm(false, 11, 10, 255, px), &img, 100);
    EXPECT_NE(e.find("11x10 pixels, more than the limit of 100"), std::string::npos) << e;
    EXPECT_EQ(decode(pnm(false, 10, 10, 255, std::vector<uint32_t>(100, 7)), &img, 100), "");
}

// A file too short to hold the pixels its header declares is refused before decoding (stb decodes the
// missing bytes as zeros): a 150-byte BMP declaring 16711428x3 pixels took over 10 s under ASan.
TEST(HostileInput, ImageDataCheckedAgainstDeclaredSize) {
    const uint32_t w = 4000, h = 4000; // within the pixel limit
    const std::string bmp = "BM" + le32(54 + 64) + le32(0) + le32(54) + le32(40) + le32(w) + le32(h) +
                            le16(1) + le16(24) + le32(0) + le32(0) + le32(0) + le32(0) + le32(0) + le32(0) +
                            std::string(64, '\x40');
    const std::string jpeg = std::string("\xFF\xD8\xFF\xC0", 4) + be16(17) + "\x08" + be16(uint16_t(h)) +
                             be16(uint16_t(w)) + std::string("\x03\x01\x11\x00\x02\x11\x00\x03\x11\x00", 10) +
                             std::string(64, '\0');
    // stb reads compression values other than RLE's as raw rows.
    const std::string bmp_odd_compression = bmp.substr(0, 30) + le32(0xFFFF0208u) + bmp.substr(34);
    for (const std::string* f : {&bmp, &bmp_odd_compression, &jpeg}) {
        g4::media::ImageRGB8 img;
        const auto t0 = Clock::now();
        std::string e = decode(*f, &img);
        EXPECT_LT(seconds_since(t0), 0.5);
        EXPECT_NE(e.find("is truncated ("), std::string::npos) << e;
        EXPECT_NE(e.find("4000x4000"), std::string::npos) << e;
        EXPECT_TRUE(one_line(e)) << e;
        EXPECT_TRUE(img.rgb.empty());
    }
    // A complete BMP of the same kind decodes (rows padded to 4 bytes; the last row's padding may be absent).
    const uint32_t sw = 3, sh = 2;
    std::string rows;
    for (uint32_t y = 0; y < sh; ++y)
        rows += std::string(sw * 3, char(10 + y)) + (y + 1 < sh ? std::string(3, '\0') : "");
    const std::string small = "BM" + le32(54 + uint32_t(rows.size())) + le32(0) + le32(54) + le32(40) +
                              le32(sw) + le32(sh) + le16(1) + le16(24) + le32(0) + le32(0) + le32(0) +
                              le32(0) + le32(0) + le32(0) + rows;
    g4::media::ImageRGB8 img;
    ASSERT_EQ(decode(small, &img), "");
    EXPECT_EQ(img.width, int(sw));
    EXPECT_EQ(img.height, int(sh));
    EXPECT_EQ(img.rgb[0], 11); // bottom-up: the first row in the file is the image's last
    EXPECT_EQ(img.rgb[3 * sw], 10);
}

// ---- WAV: every header field validated before it is used
// ------------------------------------------------------

std::string wav(uint16_t format, uint16_t channels, uint32_t rate, uint16_t bits, uint16_t block,
                const std::string& data, uint32_t data_size) {
    std::string fmt =
        le16(format) + le16(channels) + le32(rate) + le32(rate * block) + le16(block) + le16(bits);
    std::string body =
        "WAVE" + std::string("fmt ") + le32(uint32_t(fmt.size())) + fmt + "data" + le32(data_size) + data;
    return "RIFF" + le32(uint32_t(body.size())) + body;
}

TEST(HostileInput, WavHeaderFields) {
    TempDir tmp;
    const std::string path = tmp.file("a.wav");
    auto load              = [&](const std::string& bytes, g4::media::AudioPcm* a, int64_t max_frames = -1) {
        write_file(path, bytes);
        return g4::media::load_wav(path, a, max_frames);
    };
    auto err = [&](const std::string& bytes, const std::string& needle) {
        g4::media::AudioPcm a;
        std::string e = load(bytes, &a);
        EXPECT_NE(e.find(needle), std::string::npos) << e;
        EXPECT_NE(e.find(path), std::string::npos) << e;
        EXPECT_TRUE(one_line(e)) << e;
        EXPECT_TRUE(a.samples.empty());
    };
    // The 44-byte reproducer: block_align 0 and a streamed data size (a division by zero before).
    const std::string streamed0 = wav(1, 1, 16000, 16, 0, "", 0xFFFFFFFFu);
    ASSERT_EQ(streamed0.size(), 44u);
    err(streamed0, "block size 0");
    err(wav(1, 0, 16000, 16, 0, "", 0xFFFFFFFFu), "0 channels");
    err(wav(1, 2, 16000, 16, 2, std::string(8, '\0'), 8), "block size 2");
    err(wav(1, 1, 44100, 16, 2, std::string(8, '\0'), 8), "44100 Hz");
    err(wav(1, 1, 16000, 12, 2, std::string(8, '\0'), 8), "12-bit");
    err(wav(7, 1, 16000, 16, 2, std::string(8, '\0'), 8), "format code 7");
    err(wav(1, 1, 16000, 16, 2, std::string(8, '\0'), 100), "truncated");
    err(wav(1, 1, 16000, 16, 2, std::string(7, '\0'), 7), "whole number");
    float nan = std::nanf(""), one = 1.0f;
    err(wav(3, 1, 16000, 32, 4, std::string((const char*)&one, 4) + std::string((const char*)&nan, 4), 8),
        "sample 1");
    // A streamed size with a sound header reads the frames present.
    g4::media::AudioPcm a;
    std::string d = le16(16384) + le16(0xC000) + "\x01"; // 2 frames and a stray byte
    ASSERT_EQ(load(wav(1, 1, 16000, 16, 2, d, 0xFFFFFFFFu), &a), "");
    EXPECT_EQ(a.samples, (std::vector<float>{0.5f, -0.5f}));
    // The caller's bound is checked before the samples are converted.
    std::string e = load(wav(1, 1, 16000, 16, 2, std::string(64, '\0'), 64), &a, 10);
    EXPECT_NE(e.find("plan takes at most"), std::string::npos) << e;
    EXPECT_TRUE(a.samples.empty());
}

// ---- file names in every read error
// ---------------------------------------------------------------------------

TEST(HostileInput, UnreadablePathsNamed) {
    TempDir tmp;
    g4::media::AudioPcm a;
    g4::media::ImageRGB8 img;
    for (const std::string& e : {g4::media::load_wav(tmp.path, &a), g4::media::load_image(tmp.path, &img)}) {
        EXPECT_NE(e.find("'" + tmp.path + "'"), std::string::npos) << e;
        EXPECT_NE(e.find("is a directory"), std::string::npos) << e;
        EXPECT_TRUE(one_line(e)) << e;
    }
    for (const std::string& e :
         {g4::media::load_wav(tmp.file("none.wav"), &a), g4::media::load_image(tmp.file("none.png"), &img)}) {
        EXPECT_NE(e.find(tmp.file("none.")), std::string::npos) << e;
        EXPECT_NE(e.find("No such file"), std::string::npos) << e;
    }
}

// ---- JSON nesting: bounded before any parser, copy or walk recurses
// -------------------------------------------

std::string nested(int depth, const std::string& inner = "1") {
    return std::string(depth, '[') + inner + std::string(depth, ']');
}

TEST(HostileInput, JsonDepthBound) {
    EXPECT_EQ(g4::json_depth_error(nested(g4::kMaxJsonDepth)), "");
    std::string e = g4::json_depth_error(nested(g4::kMaxJsonDepth + 1));
    EXPECT_NE(e.find("deeper than 64"), std::string::npos) << e;
    EXPECT_NE(g4::json_depth_error(nested(70000)), "");
    // Brackets inside strings (escaped quotes too) do not count.
    EXPECT_EQ(
        g4::json_depth_error("{\"a\": \"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"}"),
        "");
    EXPECT_NE(g4::json_depth_error("{\"a\\\\\": " + nested(100) + "}"), "");
}

std::string tiny_tokenizer(const std::string& vocab, const std::string& extra = "") {
    return "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\", \"vocab\": " + vocab + ", \"merges\": []}" +
           extra + "}";
}

TEST(HostileInput, TokenizerNestingAndIds) {
    g4::Tokenizer tk;
    std::string err;
    ASSERT_TRUE(g4::Tokenizer::load_from_json(tiny_tokenizer("{\"a\": 0, \"b\": 1}"), &tk, &err)) << err;
    // ~45,000 nested normalizer Sequences: refused by the depth bound, no stack overflow.
    std::string norm = "{\"type\": \"Replace\", \"pattern\": {\"String\": \"a\"}, \"content\": \"b\"}";
    std::string seq;
    for (int i = 0; i < 45000; ++i)
        seq += "{\"type\": \"Sequence\", \"normalizers\": [";
    seq += norm;
    for (int i = 0; i < 45000; ++i)
        seq += "]}";
    g4::Tokenizer deep;
    EXPECT_FALSE(g4::Tokenizer::load_from_json(
        tiny_tokenizer("{\"a\": 0, \"b\": 1}", ", \"normalizer\": " + seq), &deep, &err));
    EXPECT_NE(err.find("tokenizer.json"), std::string::npos) << err;
    EXPECT_NE(err.find("deeper than"), std::string::npos) << err;
    // A nesting within the bound still loads.
    EXPECT_TRUE(g4::Tokenizer::load_from_json(
        tiny_tokenizer(
            "{\"a\": 0, \"b\": 1}",
            ", \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Sequence\", "
            "\"normalizers\": [" +
                norm + "]}]}"),
        &deep, &err))
        << err;
    // One id of 2^28 (1.6 GiB of tables before), a hole, a duplicate, a negative id.
    for (const char* vocab : {"{\"a\": 0, \"b\": 268435456}", "{\"a\": 0, \"b\": 2}", "{\"b\": -1, \"a\": 0}",
                              "{\"a\": 0, \"b\": 1e3}", "{\"a\": 0, \"b\": 18446744073709551615}"}) {
        g4::Tokenizer bad;
        const auto t0 = Clock::now();
        EXPECT_FALSE(g4::Tokenizer::load_from_json(tiny_tokenizer(vocab), &bad, &err)) << vocab;
        EXPECT_LT(seconds_since(t0), 0.5);
        EXPECT_NE(err.find("vocab id"), std::string::npos) << err;
        EXPECT_NE(err.find("'b'"), std::string::npos) << err;
        EXPECT_TRUE(one_line(err)) << err;
    }
    g4::Tokenizer dup;
    EXPECT_FALSE(g4::Tokenizer::load_from_json(tiny_tokenizer("{\"a\": 0, \"b\": 0}"), &dup, &err));
    EXPECT_NE(err.find("share id 0"), std::string::npos) << err;
}

// ---- META fields: typed reads name the field
// -----------------------------------------------------------------

TEST(HostileInput, TypedJsonFields) {
    json j    = json::parse(R"({"max_rows": "8", "big": 4294967296, "ok": 7, "ids": [1, "x"], "name": 3})");
    auto what = [&](auto f) {
        try {
            f();
        } catch (const std::runtime_error& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_EQ(g4::jsonf::get<int32_t>(j, "ok"), 7);
    EXPECT_EQ(what([&] { g4::jsonf::get<int32_t>(j, "max_rows"); }),
              "META field max_rows: expected an integer in [-2147483648, 2147483647], got \"8\"");
    EXPECT_NE(what([&] { g4::jsonf::get<int32_t>(j, "big"); }).find("META field big: expected an integer"),
              std::string::npos);
    EXPECT_EQ(what([&] { g4::jsonf::get<int32_t>(j, "absent"); }), "META field absent is missing");
    EXPECT_NE(what([&] {
                  g4::jsonf::get<std::vector<int32_t>>(j, "ids");
              }).find("META field ids: expected an array"),
              std::string::npos);
    EXPECT_EQ(what([&] { g4::jsonf::value<std::string>(j, "name", "?"); }),
              "META field name: expected a string, got 3");
    EXPECT_EQ(g4::jsonf::value<std::string>(j, "absent", "?"), "?");
}

// ---- safetensors: validated as the safetensors library does
// ---------------------------------------------------

struct StTensor {
    std::string name, dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
};

// A safetensors file: the header padded with spaces to `header_len` bytes (at least its JSON), the length
// prefix header_len + len_delta.
std::string safetensors(const std::vector<StTensor>& ts, const std::string& data, size_t header_len = 0,
                        int64_t len_delta = 0) {
    json h = json::object();
    for (const auto& t : ts)
        h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
    std::string hs = h.dump();
    if (header_len > hs.size()) hs.append(header_len - hs.size(), ' ');
    const uint64_t n = uint64_t(int64_t(hs.size()) + len_delta);
    std::string out(8, '\0');
    std::memcpy(out.data(), &n, 8);
    return out + hs + data;
}

std::string open_error(const std::string& path) {
    try {
        g4::st::File::open(path);
    } catch (const g4::CompileError& e) {
        return e.what();
    }
    return "";
}

TEST(HostileInput, SafetensorsLayout) {
    TempDir tmp;
    const std::string path = tmp.file("m.safetensors");
    const float vals[4]    = {1.5f, -2.0f, 3.25f, 0.0f};
    const std::string data((const char*)vals, 16);
    const std::vector<StTensor> good = {{"a", "F32", {2}, 0, 8}, {"b", "F32", {2}, 8, 16}};
    write_file(path, safetensors(good, data, 128));
    EXPECT_EQ(open_error(path), "");
    // The off-by-one header length: padding absorbs it, the data start one byte early, the reference rejects
    // it.
    write_file(path, safetensors(good, data, 128, -1));
    std::string e = open_error(path);
    EXPECT_NE(e.find(path), std::string::npos) << e;
    EXPECT_NE(e.find("17 bytes but its tensors cover 16"), std::string::npos) << e;
    EXPECT_TRUE(one_line(e)) << e;
    write_file(path, safetensors(good, data + "x", 64)); // trailing bytes
    EXPECT_NE(open_error(path).find("cover 16"), std::string::npos);
    write_file(path, safetensors({{"a", "F32", {2}, 0, 8}, {"b", "F32", {1}, 12, 16}}, data, 128)); // a gap
    e = open_error(path);
    EXPECT_NE(e.find("bytes [8, 12) of the data section belong to no tensor"), std::string::npos) << e;
    write_file(path,
               safetensors({{"a", "F32", {2}, 0, 8}, {"b", "F32", {2}, 4, 12}, {"c", "F32", {1}, 12, 16}},
                           data, 128));
    e = open_error(path);
    EXPECT_NE(e.find("tensor 'b' data_offsets [4, 12) overlap tensor 'a'"), std::string::npos) << e;
    write_file(path, safetensors({{"a", "F32", {2}, 0, 8}, {"e", "F32", {0}, 4, 4}, {"b", "F32", {2}, 8, 16}},
                                 data, 128)); // empty, misplaced
    EXPECT_NE(open_error(path).find("tensor 'e'"), std::string::npos);
    write_file(path, safetensors({{"a", "F32", {3}, 0, 8}, {"b", "F32", {2}, 8, 16}}, data,
                                 128)); // shape x dtype != span
    EXPECT_NE(open_error(path).find("needs 12 bytes"), std::string::npos);
    std::string deep = nested(100000);
    uint64_t n       = deep.size();
    std::string f(8, '\0');
    std::memcpy(f.data(), &n, 8);
    deep[0] = '{'; // starts as a header does; nesting refused before parsing
    write_file(path, f + deep);
    EXPECT_NE(open_error(path).find("deeper than"), std::string::npos);
}

TEST(HostileInput, SafetensorsUnalignedData) {
    // A header of 7 bytes mod 8 puts the data at an odd address: valid, and read without unaligned loads.
    TempDir tmp;
    const std::string path = tmp.file("odd.safetensors");
    const float vals[3]    = {1.5f, -2.0f, 3.25f};
    const uint16_t bf[2]   = {0x3FC0, 0xC000}; // 1.5, -2.0
    std::string data((const char*)vals, 12);
    data.append((const char*)bf, 4);
    const std::vector<StTensor> ts = {{"f", "F32", {3}, 0, 12}, {"h", "BF16", {2}, 12, 16}};
    size_t len                     = 200;
    while (len % 8 != 7)
        ++len;
    write_file(path, safetensors(ts, data, len));
    auto f         = g4::st::File::open(path);
    const auto& tf = f->tensors().at("f");
    EXPECT_EQ(reinterpret_cast<uintptr_t>(tf.data) % 2, 1u);
    std::vector<float> out(3);
    g4::st::to_f32(tf, out.data());
    EXPECT_EQ(out, (std::vector<float>{1.5f, -2.0f, 3.25f}));
    out.resize(2);
    g4::st::to_f32(f->tensors().at("h"), out.data());
    EXPECT_EQ(out, (std::vector<float>{1.5f, -2.0f}));
}

// ---- adapter patterns: linear-time matching
// ------------------------------------------------------------------

std::string adapter_copy(const TempDir& tmp, const std::string& name) {
    const std::string dir = tmp.file(name);
    fs::create_directory(dir);
    for (auto& e : fs::directory_iterator(fixture("adapters/" + name)))
        if (e.is_regular_file()) fs::copy_file(e.path(), dir + "/" + e.path().filename().string());
    return dir;
}

TEST(HostileInput, AdapterPatternsMatchInLinearTime) {
    TempDir tmp;
    const std::string dir      = adapter_copy(tmp, "e2b_rslora_patterns");
    nlohmann::ordered_json cfg = nlohmann::ordered_json::parse(read_file(dir + "/adapter_config.json"));
    const auto reference       = g4::lora::Adapter::open(dir)->merges();
    // Keys on which a backtracking matcher takes exponential time in the module name's length; they match
    // no module, so every rank and alpha stays what the adapter's own patterns give.
    nlohmann::ordered_json rank = {{"(.*)*x", 3}, {"(a|aa|.)*(.*)*(.*)*y", 5}};
    for (auto& [k, v] : cfg["rank_pattern"].items())
        rank[k] = v;
    nlohmann::ordered_json alpha = {{"((.+)+)+z", 1}};
    for (auto& [k, v] : cfg["alpha_pattern"].items())
        alpha[k] = v;
    cfg["rank_pattern"]  = rank;
    cfg["alpha_pattern"] = alpha;
    write_file(dir + "/adapter_config.json", cfg.dump());
    const auto t0  = Clock::now();
    const auto got = g4::lora::Adapter::open(dir)->merges();
    EXPECT_LT(seconds_since(t0), 5.0);
    ASSERT_EQ(got.size(), reference.size());
    for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].module, reference[i].module);
        EXPECT_EQ(got[i].r, reference[i].r) << got[i].module;
        EXPECT_EQ(got[i].alpha, reference[i].alpha) << got[i].module;
    }
    // Backreferences and lookaround: refused by name.
    cfg["rank_pattern"] = {{"(?=q)q_proj", 6}};
    write_file(dir + "/adapter_config.json", cfg.dump());
    try {
        g4::lora::Adapter::open(dir);
        ADD_FAILURE() << "a lookahead key was accepted";
    } catch (const g4::CompileError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("rank_pattern"), std::string::npos) << m;
        EXPECT_NE(m.find("(?=q)q_proj"), std::string::npos) << m;
        EXPECT_TRUE(one_line(m)) << m;
    }
}

TEST(HostileInput, AdapterConfigNesting) {
    TempDir tmp;
    const std::string dir = adapter_copy(tmp, "e2b_lora");
    json cfg              = json::parse(read_file(dir + "/adapter_config.json"));
    std::string text      = cfg.dump();
    text.insert(text.size() - 1, ", \"deep\": " + nested(70000));
    write_file(dir + "/adapter_config.json", text);
    try {
        g4::lora::Adapter::open(dir);
        ADD_FAILURE() << "accepted";
    } catch (const g4::CompileError& e) {
        EXPECT_NE(std::string(e.what()).find("adapter_config.json: JSON nests deeper than"),
                  std::string::npos)
            << e.what();
    }
}

} // namespace
