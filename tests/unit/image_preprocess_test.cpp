// Gemma 4 image loading and preprocessing against Hugging Face (tests/fixtures/towers/image, made by
// tools/make_image_fixtures.py with transformers 5.23's default torchvision Gemma4ImageProcessor).
#include "kernels/cpu/thread_pool.h"
#include "runtime/src/frontend/image.h"
#include "runtime/src/media/image_io.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>

using g4::media::ImageRGB8;
using g4::media::load_image;
using g4::towers::image_layout;
using g4::towers::ImageLayout;
using g4::towers::preprocess_image;
using g4::towers::preprocess_scratch_bytes;
using g4::towers::preprocess_scratch_bytes_for;

namespace {

constexpr int kPatch = 16, kPool = 3;

std::string dir() {
    return g4test::fixture("towers/image");
}

nlohmann::json manifest() {
    return nlohmann::json::parse(g4test::read_file(dir() + "/manifest.json"));
}

std::vector<int32_t> read_i32(const std::string& path) {
    const std::string b = g4test::read_file(path);
    std::vector<int32_t> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), v.size() * 4);
    return v;
}

// tools/make_image_fixtures.py's formula_image: a large input rebuilt here instead of stored.
ImageRGB8 formula_image(int h, int w) {
    ImageRGB8 img;
    img.height = h, img.width = w;
    img.rgb.resize(size_t(h) * w * 3);
    for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x)
            for (int64_t c = 0; c < 3; ++c)
                img.rgb[(size_t(y) * w + x) * 3 + c] =
                    uint8_t(((x * 3 + y * 2 + c * 85) / 16 + ((x ^ y) & 15) * 4) & 255);
    return img;
}

struct Buffers {
    std::vector<uint64_t> scratch; // 8-byte aligned
    std::vector<float> patches;
    std::vector<int32_t> pos;
    Buffers(size_t scratch_bytes, int max_soft)
        : scratch((scratch_bytes + 7) / 8), patches(size_t(max_soft) * kPool * kPool * 3 * kPatch * kPatch),
          pos(size_t(max_soft) * kPool * kPool * 2) {}
};

} // namespace

TEST(ImagePreprocess, MatchesHuggingFace) {
    const auto m = manifest();
    ASSERT_EQ(m["patch"].get<int>(), kPatch);
    ASSERT_EQ(m["pool"].get<int>(), kPool);
    ASSERT_GE(m["cases"].size(), 9u);
    size_t total = 0, exact = 0;
    for (const auto& c : m["cases"]) {
        const std::string name = c["image"].get<std::string>();
        const int tokens       = c["max_soft_tokens"].get<int>();
        SCOPED_TRACE(name + " @ " + std::to_string(tokens) + " soft tokens");
        ImageRGB8 img;
        if (name.rfind("formula_", 0) == 0)
            img = formula_image(c["in_h"].get<int>(), c["in_w"].get<int>());
        else
            ASSERT_EQ(load_image(dir() + "/" + name, &img), "");
        ASSERT_EQ(img.height, c["in_h"].get<int>());
        ASSERT_EQ(img.width, c["in_w"].get<int>());

        const size_t need  = preprocess_scratch_bytes_for(img.height, img.width, tokens, kPatch, kPool);
        const size_t bound = preprocess_scratch_bytes(int64_t(img.height) * img.width, tokens, kPatch, kPool);
        ASSERT_GT(need, 0u);
        EXPECT_LE(need, bound);
        Buffers buf(need, tokens);
        ImageLayout lay;
        ASSERT_EQ(preprocess_image(img.rgb.data(), img.height, img.width, tokens, kPatch, kPool,
                                   buf.scratch.data(), need, buf.patches.data(), buf.pos.data(), &lay),
                  "");
        EXPECT_EQ(lay.out_h, c["out_h"].get<int>());
        EXPECT_EQ(lay.out_w, c["out_w"].get<int>());
        EXPECT_EQ(lay.grid_h, c["grid_h"].get<int>());
        EXPECT_EQ(lay.grid_w, c["grid_w"].get<int>());
        ASSERT_EQ(lay.n_patches, c["n_patches"].get<int>());
        EXPECT_EQ(lay.n_soft, c["n_soft"].get<int>());

        const std::vector<int32_t> pos = read_i32(dir() + "/" + c["pos"].get<std::string>());
        ASSERT_EQ(pos.size(), size_t(lay.n_patches) * 2);
        EXPECT_EQ(std::memcmp(pos.data(), buf.pos.data(), pos.size() * 4), 0) << "image_position_ids differ";

        // HF's pixel_values, stored losslessly as the uint8 image they are float32(u8) * float32(1/255) of.
        ImageRGB8 want;
        ASSERT_EQ(load_image(dir() + "/" + c["resized"].get<std::string>(), &want), "");
        ASSERT_EQ(want.height, lay.out_h);
        ASSERT_EQ(want.width, lay.out_w);
        const float inv255 = float(1.0 / 255.0);
        size_t n_exact = 0, n = 0;
        float max_abs = 0.0f;
        for (int y = 0; y < lay.out_h; ++y)
            for (int x = 0; x < lay.out_w; ++x)
                for (int ch = 0; ch < 3; ++ch) {
                    const float hf   = float(want.rgb[(size_t(y) * lay.out_w + x) * 3 + ch]) * inv255;
                    const size_t idx = ((size_t(y / kPatch) * lay.grid_w + x / kPatch) * kPatch * kPatch +
                                        size_t(y % kPatch) * kPatch + x % kPatch) *
                                           3 +
                                       ch;
                    const float got = buf.patches[idx];
                    max_abs         = std::max(max_abs, std::abs(got - hf));
                    n_exact += std::memcmp(&got, &hf, 4) == 0;
                    ++n;
                }
        std::printf("  %-16s %4d tokens: %dx%d -> %dx%d, %zu values, %zu bit-exact, max |err| %.3g\n",
                    name.c_str(), tokens, img.height, img.width, lay.out_h, lay.out_w, n, n_exact,
                    double(max_abs));
        EXPECT_EQ(n_exact, n) << "max abs error " << max_abs;
        // Row blocks on a pool (each thread its own row buffer): the same bits as one thread.
        for (int threads : {2, 3, 5}) {
            g4::cpu::ThreadPool tp(threads);
            const size_t stride = g4::towers::preprocess_thread_floats(tokens, kPatch, kPool);
            std::vector<float> ts(stride * threads);
            const g4::cpu::Context ctx{&tp, ts.data(), stride};
            Buffers par(need, tokens);
            ImageLayout lp;
            ASSERT_EQ(preprocess_image(img.rgb.data(), img.height, img.width, tokens, kPatch, kPool,
                                       par.scratch.data(), need, par.patches.data(), par.pos.data(), &lp,
                                       &ctx),
                      "");
            const size_t vals = size_t(lay.n_patches) * kPatch * kPatch * 3;
            EXPECT_EQ(std::memcmp(par.patches.data(), buf.patches.data(), vals * 4), 0)
                << threads << " threads";
            EXPECT_EQ(std::memcmp(par.pos.data(), buf.pos.data(), size_t(lay.n_patches) * 8), 0);
        }
        EXPECT_LE(max_abs, 1.0f / 255.0f + 1e-7f);
        total += n, exact += n_exact;
    }
    std::printf("  all cases: %zu / %zu pixel values bit-exact\n", exact, total);
}

TEST(ImagePreprocess, LayoutMatchesHuggingFaceTable) {
    const auto m = manifest();
    ASSERT_GE(m["layouts"].size(), 100u);
    for (const auto& c : m["layouts"]) {
        const int h = c["in_h"].get<int>(), w = c["in_w"].get<int>(), t = c["max_soft_tokens"].get<int>();
        SCOPED_TRACE(std::to_string(h) + "x" + std::to_string(w) + " @ " + std::to_string(t));
        ImageLayout lay;
        ASSERT_EQ(image_layout(h, w, t, kPatch, kPool, &lay), "");
        EXPECT_EQ(lay.out_h, c["out_h"].get<int>());
        EXPECT_EQ(lay.out_w, c["out_w"].get<int>());
        EXPECT_EQ(lay.grid_h * kPatch, lay.out_h);
        EXPECT_EQ(lay.grid_w * kPatch, lay.out_w);
        EXPECT_EQ(lay.n_patches, lay.grid_h * lay.grid_w);
        EXPECT_EQ(lay.n_soft, (lay.grid_h / kPool) * (lay.grid_w / kPool));
        EXPECT_LE(lay.n_soft, t);
        EXPECT_EQ(lay.out_h % (kPatch * kPool), 0);
        EXPECT_EQ(lay.out_w % (kPatch * kPool), 0);
    }
}

// Every (value, alpha) pair: alpha dropped, the colour under it kept, as PIL's convert("RGB") (what
// transformers' load_image and the Gemma 4 processor do); grey expanded.
TEST(ImageIo, AlphaIsDroppedAndGreyExpanded) {
    ImageRGB8 got;
    ASSERT_EQ(load_image(dir() + "/alpha_table.png", &got), "");
    ASSERT_EQ(got.width, 256);
    ASSERT_EQ(got.height, 256);
    size_t diff = 0;
    for (int a = 0; a < 256; ++a)
        for (int v = 0; v < 256; ++v) { // tools/make_image_fixtures.py: R v, G 255 - v, B 7v mod 256, A a
            const uint8_t* p = &got.rgb[(size_t(a) * 256 + v) * 3];
            diff += p[0] != v || p[1] != 255 - v || p[2] != (v * 7) % 256;
        }
    EXPECT_EQ(diff, 0u);

    ImageRGB8 grey;
    ASSERT_EQ(load_image(dir() + "/grey_50x90.png", &grey), "");
    ASSERT_EQ(grey.rgb.size(), size_t(50) * 90 * 3);
    bool same = true, varies = false;
    for (size_t i = 0; i < grey.rgb.size(); i += 3) {
        same &= grey.rgb[i] == grey.rgb[i + 1] && grey.rgb[i] == grey.rgb[i + 2];
        varies |= grey.rgb[i] != grey.rgb[0];
    }
    EXPECT_TRUE(same);
    EXPECT_TRUE(varies);
}

TEST(ImagePreprocess, ScratchBoundCoversEveryShape) {
    for (int tokens : {70, 280, 1120}) {
        for (int64_t n : {1, 7, 2304, 10000, 161280, 1000000}) {
            const size_t bound = preprocess_scratch_bytes(n, tokens, kPatch, kPool);
            ASSERT_GT(bound, 0u);
            std::vector<int64_t> hs = {1, 2, 3, 5, 12, 47, 48, 49, 100, 1000, n / 2, n};
            for (int64_t h = 1; h * h <= n; h = h * 3 / 2 + 1)
                hs.push_back(h), hs.push_back(n / h);
            for (int64_t h : hs) {
                if (h < 1 || h > n) continue;
                const int64_t w = n / h;
                for (auto [a, b] : {std::pair{h, w}, std::pair{w, h}}) {
                    const size_t need = preprocess_scratch_bytes_for(int(a), int(b), tokens, kPatch, kPool);
                    ASSERT_GT(need, 0u) << a << "x" << b;
                    EXPECT_LE(need, bound) << a << "x" << b << " @ " << tokens;
                }
            }
        }
    }
    // A typical photo needs little: 3000x4000 at 280 tokens.
    EXPECT_LT(preprocess_scratch_bytes_for(3000, 4000, 280, kPatch, kPool), size_t(1) << 20);
}

TEST(ImageIo, BadFiles) {
    ImageRGB8 img;
    std::string e = load_image(dir() + "/no_such_image.png", &img);
    EXPECT_NE(e.find("no_such_image.png"), std::string::npos) << e;
    EXPECT_NE(e.find("No such file"), std::string::npos) << e;

    g4test::TempDir tmp;
    const std::string png = g4test::read_file(dir() + "/rgb_37x53.png");
    g4test::write_file(tmp.file("truncated.png"), png.substr(0, png.size() / 2));
    e = load_image(tmp.file("truncated.png"), &img);
    EXPECT_NE(e.find("truncated.png"), std::string::npos) << e;
    EXPECT_NE(e.find("corrupt or truncated"), std::string::npos) << e;
    EXPECT_TRUE(img.rgb.empty());

    g4test::write_file(tmp.file("text.png"), "this is not an image, just some text\n");
    e = load_image(tmp.file("text.png"), &img);
    EXPECT_NE(e.find("text.png"), std::string::npos) << e;
    EXPECT_NE(e.find("unsupported"), std::string::npos) << e;

    g4test::write_file(tmp.file("empty.png"), "");
    e = load_image(tmp.file("empty.png"), &img);
    EXPECT_NE(e.find("empty"), std::string::npos) << e;

    e = load_image(tmp.path, &img); // a directory
    EXPECT_FALSE(e.empty());
}

TEST(ImagePreprocess, BadInput) {
    Buffers buf(1 << 20, 70);
    ImageLayout lay;
    const std::vector<uint8_t> rgb(64 * 64 * 3, 128);
    std::string e = preprocess_image(rgb.data(), 0, 64, 70, kPatch, kPool, buf.scratch.data(), 1 << 20,
                                     buf.patches.data(), buf.pos.data(), &lay);
    EXPECT_NE(e.find("empty image"), std::string::npos) << e;
    e = image_layout(64, 0, 70, kPatch, kPool, &lay);
    EXPECT_NE(e.find("empty image"), std::string::npos) << e;
    e = image_layout(64, 64, 0, kPatch, kPool, &lay);
    EXPECT_NE(e.find("max_soft_tokens"), std::string::npos) << e;
    e = image_layout(64, 64, 70, 0, kPool, &lay);
    EXPECT_NE(e.find("patch"), std::string::npos) << e;
    EXPECT_EQ(preprocess_scratch_bytes(0, 70, kPatch, kPool), 0u);

    const size_t need = preprocess_scratch_bytes_for(64, 64, 70, kPatch, kPool);
    e                 = preprocess_image(rgb.data(), 64, 64, 70, kPatch, kPool, buf.scratch.data(), need - 1,
                                         buf.patches.data(), buf.pos.data(), &lay);
    EXPECT_NE(e.find("scratch too small"), std::string::npos) << e;
    e = preprocess_image(rgb.data(), 64, 64, 70, kPatch, kPool, nullptr, need, buf.patches.data(),
                         buf.pos.data(), &lay);
    EXPECT_NE(e.find("scratch"), std::string::npos) << e;
    e = preprocess_image(nullptr, 64, 64, 70, kPatch, kPool, buf.scratch.data(), need, buf.patches.data(),
                         buf.pos.data(), &lay);
    EXPECT_NE(e.find("null"), std::string::npos) << e;

    // A flat image stays flat, whatever the resampling.
    ASSERT_EQ(preprocess_image(rgb.data(), 64, 64, 70, kPatch, kPool, buf.scratch.data(), need,
                               buf.patches.data(), buf.pos.data(), &lay),
              "");
    const float v = float(128) * float(1.0 / 255.0);
    for (size_t i = 0; i < size_t(lay.n_patches) * 3 * kPatch * kPatch; ++i)
        ASSERT_EQ(buf.patches[i], v) << i;
}

// An image already at its target size is not resampled (HF returns it unchanged): patches are the input
// pixels / 255 in HF's patch layout.
TEST(ImagePreprocess, ImageOnTheGridIsOnlyPatchified) {
    const int h = 48, w = 3360, tokens = 70; // 48*3360 = 70 * 9 * 256 pixels exactly
    std::vector<uint8_t> rgb(size_t(h) * w * 3);
    uint32_t s = 12345;
    for (auto& v : rgb)
        v = uint8_t((s = s * 1664525u + 1013904223u) >> 24);
    const size_t need = preprocess_scratch_bytes_for(h, w, tokens, kPatch, kPool);
    Buffers buf(need, tokens);
    ImageLayout lay;
    ASSERT_EQ(preprocess_image(rgb.data(), h, w, tokens, kPatch, kPool, buf.scratch.data(), need,
                               buf.patches.data(), buf.pos.data(), &lay),
              "");
    ASSERT_EQ(lay.out_h, h);
    ASSERT_EQ(lay.out_w, w);
    ASSERT_EQ(lay.n_patches, 3 * 210);
    EXPECT_EQ(lay.n_soft, 70);
    const float inv255 = float(1.0 / 255.0);
    for (int p = 0; p < lay.n_patches; ++p) {
        const int gy = p / lay.grid_w, gx = p % lay.grid_w;
        ASSERT_EQ(buf.pos[2 * p], gx);
        ASSERT_EQ(buf.pos[2 * p + 1], gy);
        for (int py = 0; py < kPatch; ++py)
            for (int px = 0; px < kPatch; ++px)
                for (int c = 0; c < 3; ++c) {
                    const uint8_t v = rgb[((size_t(gy) * kPatch + py) * w + gx * kPatch + px) * 3 + c];
                    ASSERT_EQ(buf.patches[size_t(p) * 768 + (py * kPatch + px) * 3 + c], float(v) * inv255);
                }
    }
}

// JPEGs whose Huffman tables declare more than 256 codes (found by tests/fuzz/fuzz_image against stb_image,
// which JPEG no longer goes through): libjpeg refuses them, naming the file. A well-formed JPEG still
// decodes.
TEST(ImageIo, JpegHuffmanTableOverflowIsRefused) {
    for (const char* name : {"jpeg_dht_over_256_codes.jpg", "jpeg_dht_over_256_codes_in_info.jpg",
                             "jpeg_dht_over_256_codes_after_fill_bytes.jpg"}) {
        std::string bad =
            g4test::read_file(std::string(G4_SOURCE_DIR) + "/tests/fuzz/regressions/image/" + name);
        ImageRGB8 img;
        std::string e = g4::media::decode_image(reinterpret_cast<const uint8_t*>(bad.data()), bad.size(),
                                                "bad.jpg", &img);
        EXPECT_EQ(img.width, 0) << name;
        EXPECT_NE(e.find("image bad.jpg"), std::string::npos) << name << ": " << e;
    }
    ImageRGB8 img;
    std::string good = g4test::read_file(std::string(G4_SOURCE_DIR) + "/tests/fuzz/seeds/image/rgb_5x3.jpg");
    ASSERT_EQ(
        g4::media::decode_image(reinterpret_cast<const uint8_t*>(good.data()), good.size(), "good.jpg", &img),
        "");
    EXPECT_EQ(img.width, 5);
    EXPECT_EQ(img.height, 3);
}

// A 77-byte PNG whose IDAT chunk declares 1.3 GB (found by tests/fuzz/fuzz_image): stb_image would reserve
// that much before finding the bytes missing; decode_image refuses it first, naming the chunk.
TEST(ImageIo, PngChunkPastTheEndIsRefusedBeforeAllocating) {
    std::string bad = g4test::read_file(std::string(G4_SOURCE_DIR) +
                                        "/tests/fuzz/regressions/image/png_idat_length_past_end.png");
    ImageRGB8 img;
    std::string e =
        g4::media::decode_image(reinterpret_cast<const uint8_t*>(bad.data()), bad.size(), "bad.png", &img);
    EXPECT_NE(e.find("PNG chunk 'IDAT' declares"), std::string::npos) << e;
    EXPECT_NE(e.find("truncated"), std::string::npos) << e;
    // Every fixture PNG (chunks that fit, IEND last) still decodes.
    ASSERT_EQ(load_image(dir() + "/rgb_37x53.png", &img), "");
    EXPECT_EQ(img.width * img.height, 37 * 53);
}

// A PGM whose header's width has more digits than an int holds (found by tests/fuzz/fuzz_image): refused by
// the PNM reader before anything is allocated. The largest value an int holds is read, and refused as an
// image over the pixel limit.
TEST(ImageIo, PnmHeaderNumberOverflowIsRefused) {
    std::string bad = g4test::read_file(std::string(G4_SOURCE_DIR) +
                                        "/tests/fuzz/regressions/image/pgm_width_overflows_int.pgm");
    ImageRGB8 img;
    std::string e =
        g4::media::decode_image(reinterpret_cast<const uint8_t*>(bad.data()), bad.size(), "bad.pgm", &img);
    EXPECT_NE(e.find("is not a number of at most 10 digits"), std::string::npos) << e;
    const std::string edge = "P5\n# c\n2147483647 1\n255\n";
    e = g4::media::decode_image(reinterpret_cast<const uint8_t*>(edge.data()), edge.size(), "edge.pgm", &img);
    EXPECT_NE(e.find("more than the limit"), std::string::npos) << e;
    const std::string over = "P6 21474836480 1 255 ";
    e = g4::media::decode_image(reinterpret_cast<const uint8_t*>(over.data()), over.size(), "over.ppm", &img);
    EXPECT_NE(e.find("is not a number of at most 10 digits"), std::string::npos) << e;
}
