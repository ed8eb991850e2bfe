// Every pixel format as Hugging Face sees it: g4's decoded RGB against transformers' load_image (EXIF
// orientation applied, then PIL convert("RGB"): alpha dropped) on tests/fixtures/towers/formats (made by
// tools/make_media_fixtures.py), and the RGBA image's pixel_values against Gemma4ImageProcessor's.
#include "runtime/src/frontend/image.h"
#include "runtime/src/media/image_io.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>

namespace {

std::string dir() {
    return g4test::fixture("towers/formats");
}

TEST(ImageFormats, DecodedPixelsEqualTheReference) {
    const auto m = nlohmann::json::parse(g4test::read_file(dir() + "/formats.json"));
    ASSERT_GE(m["images"].size(), 20u);
    for (const auto& c : m["images"]) {
        const std::string file = c["file"].get<std::string>();
        SCOPED_TRACE(file + " (PIL mode " + c["pil_mode"].get<std::string>() + ")");
        g4::media::ImageRGB8 got, want;
        ASSERT_EQ(g4::media::load_image(dir() + "/" + file, &got), "");
        ASSERT_EQ(g4::media::load_image(dir() + "/" + c["ref"].get<std::string>(), &want), "");
        if (got.width != c["size_wh"][0].get<int>() || got.height != c["size_wh"][1].get<int>() ||
            want.rgb.size() != got.rgb.size()) {
            ADD_FAILURE() << got.width << "x" << got.height << ", the reference " << c["size_wh"];
            continue;
        }
        size_t differ = 0;
        int worst     = 0;
        for (size_t i = 0; i < got.rgb.size(); ++i) {
            const int d = std::abs(int(got.rgb[i]) - int(want.rgb[i]));
            differ += d != 0;
            worst = std::max(worst, d);
        }
        std::printf("  %-18s %-5s %zu of %zu values differ (max %d)\n", file.c_str(),
                    c["pil_mode"].get<std::string>().c_str(), differ, got.rgb.size(), worst);
        EXPECT_EQ(differ, 0u) << "max difference " << worst;
    }
}

TEST(ImageFormats, RgbaPixelValuesEqualTheProcessor) {
    const auto m    = nlohmann::json::parse(g4test::read_file(dir() + "/formats.json"));
    const auto& e2e = m["e2e_rgba"];
    g4::media::ImageRGB8 img, want;
    ASSERT_EQ(g4::media::load_image(dir() + "/" + e2e["image"].get<std::string>(), &img), "");
    ASSERT_EQ(g4::media::load_image(dir() + "/" + e2e["resized"].get<std::string>(), &want), "");
    constexpr int kPatch = 16, kPool = 3, kTokens = 70;
    const size_t need =
        g4::towers::preprocess_scratch_bytes_for(img.height, img.width, kTokens, kPatch, kPool);
    std::vector<uint64_t> scratch((need + 7) / 8);
    std::vector<float> patches(size_t(kTokens) * kPool * kPool * 3 * kPatch * kPatch);
    std::vector<int32_t> pos(size_t(kTokens) * kPool * kPool * 2);
    g4::towers::ImageLayout lay;
    ASSERT_EQ(g4::towers::preprocess_image(img.rgb.data(), img.height, img.width, kTokens, kPatch, kPool,
                                           scratch.data(), need, patches.data(), pos.data(), &lay),
              "");
    ASSERT_EQ(lay.out_h, want.height);
    ASSERT_EQ(lay.out_w, want.width);
    EXPECT_EQ(lay.n_soft, e2e["n_soft"].get<int>());
    const std::string pb = g4test::read_file(dir() + "/" + e2e["pos"].get<std::string>());
    ASSERT_EQ(pb.size(), size_t(lay.n_patches) * 8);
    EXPECT_EQ(std::memcmp(pb.data(), pos.data(), pb.size()), 0) << "image_position_ids differ";
    size_t differ = 0;
    for (int y = 0; y < lay.out_h; ++y)
        for (int x = 0; x < lay.out_w; ++x)
            for (int ch = 0; ch < 3; ++ch) {
                const float hf   = float(want.rgb[(size_t(y) * lay.out_w + x) * 3 + ch]) * float(1.0 / 255.0);
                const size_t idx = ((size_t(y / kPatch) * lay.grid_w + x / kPatch) * kPatch * kPatch +
                                    size_t(y % kPatch) * kPatch + x % kPatch) *
                                       3 +
                                   ch;
                differ += std::memcmp(&patches[idx], &hf, 4) != 0;
            }
    EXPECT_EQ(differ, 0u) << "pixel_values not bit-exact";
}

} // namespace
