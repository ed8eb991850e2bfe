// tools/prompt_media: the exact id sequence the CLI builds for two images and a clip in each prompt form
// (-p with markers, -p without, --tokens with lone markers, with none, with the blocks written out).
#include "tools/prompt_media.h"

#include <gtest/gtest.h>

namespace {

using g4::tools::MediaBlock;
using g4::tools::MediaKind;

constexpr int32_t P = 258880, A = 258881, V = 258884;
const g4::tools::MediaIds kIds{
    .bos = 2, .boi = 300, .image = P, .eoi = 301, .boa = 500, .audio = A, .eoa = 501, .video = V};

MediaBlock blk(MediaKind k, const char* file, int32_t n) {
    MediaBlock b;
    b.kind = k;
    b.file = file;
    b.n    = n;
    return b;
}

// Command-line order: image (3 soft tokens), clip (4), image (2).
std::vector<MediaBlock> two_images_and_a_clip() {
    return {blk(MediaKind::Image, "a.png", 3), blk(MediaKind::Audio, "c.wav", 4),
            blk(MediaKind::Image, "b.png", 2)};
}

std::vector<int32_t> placed(std::vector<int32_t> p, bool tokens, std::string* err = nullptr) {
    std::string e = g4::tools::place_media(&p, two_images_and_a_clip(), kIds, tokens);
    if (err)
        *err = e;
    else
        EXPECT_EQ(e, "");
    return p;
}

TEST(PromptMedia, EachMarkerTakesItsFileInOrder) {
    // "x<|image|>y<|audio|>z<|image|>w" tokenized around its markers, as -p does; --tokens alike.
    const std::vector<int32_t> want = {2, 17, 300, P,   P,  P,   301, 18, 500, A,
                                       A, A,  A,   501, 19, 300, P,   P,  301, 20};
    for (bool tokens : {false, true})
        EXPECT_EQ(placed({2, 17, P, 18, A, 19, P, 20}, tokens), want) << tokens;
}

TEST(PromptMedia, WithoutMarkersTheFilesPrecedeTheTextInOrder) {
    const std::vector<int32_t> want = {2, 300, P, P, P, 301, 500, A, A, A, A, 501, 300, P, P, 301, 17, 18};
    for (bool tokens : {false, true})
        EXPECT_EQ(placed({2, 17, 18}, tokens), want) << tokens;
    // no <bos>: first
    EXPECT_EQ(placed({17}, true),
              (std::vector<int32_t>{300, P, P, P, 301, 500, A, A, A, A, 501, 300, P, P, 301, 17}));
}

TEST(PromptMedia, SecondImageDoesNotLandInTheFirstBlock) {
    // The list the CLI once built wrongly ([2, B, p, p, B, p, p, E, E, 17, p, 18]).
    std::vector<int32_t> p      = {2, P, 17, P, 18};
    std::vector<MediaBlock> two = {blk(MediaKind::Image, "a.png", 2), blk(MediaKind::Image, "b.png", 2)};
    ASSERT_EQ(g4::tools::place_media(&p, two, kIds, true), "");
    EXPECT_EQ(p, (std::vector<int32_t>{2, 300, P, P, 301, 17, 300, P, P, 301, 18}));
}

TEST(PromptMedia, KindsPlaceIndependently) {
    // images marked, the clip not: the clip goes after <bos>, the images at their markers
    EXPECT_EQ(placed({2, P, 17, P}, false),
              (std::vector<int32_t>{2, 500, A, A, A, A, 501, 300, P, P, P, 301, 17, 300, P, P, 301}));
}

TEST(PromptMedia, WrittenOutBlocksAreFedAsTheyAre) {
    const std::vector<int32_t> full = {2, 300, P, P, P, 301, 17, 500, A, A, A, A, 501, 300, P, P, 301, 18};
    EXPECT_EQ(placed(full, true), full);
    std::string err;
    placed(full, false, &err); // -p text cannot write blocks out
    EXPECT_NE(err.find("5 image placeholders"), std::string::npos) << err;
}

TEST(PromptMedia, OtherCountsAreRefusedWithBoth) {
    std::string err;
    placed({2, P, 17}, true, &err);
    EXPECT_NE(err.find("the prompt has 1 image placeholders (id 258880) but 2 image files (5 soft tokens)"),
              std::string::npos)
        << err;
    std::vector<int32_t> p = {2, A, 17};
    err                    = g4::tools::place_media(&p, {blk(MediaKind::Image, "a.png", 3)}, kIds, false);
    EXPECT_NE(err.find("audio placeholders (<|audio|>, id 258881) but no audio file was given"),
              std::string::npos)
        << err;
}

TEST(PromptMedia, VideoFramesCarryTheirTimestamps) {
    MediaBlock v = blk(MediaKind::Video, "v.mp4", 2);
    v.prefix     = {{40, 41}, {42, 43}};
    v.separator  = {9};
    EXPECT_EQ(g4::tools::media_block_ids(v, kIds),
              (std::vector<int32_t>{40, 41, 300, V, V, 301, 9, 42, 43, 300, V, V, 301}));
    std::vector<int32_t> p = {2, V, 17};
    ASSERT_EQ(g4::tools::place_media(&p, {v}, kIds, false), "");
    EXPECT_EQ(p, (std::vector<int32_t>{2, 40, 41, 300, V, V, 301, 9, 42, 43, 300, V, V, 301, 17}));
}

TEST(PromptMedia, MarkersSplitTheText) {
    auto m = g4::tools::split_media_markers("<|image|>Describe <|audio|> and<|video|>");
    EXPECT_EQ(m.segments, (std::vector<std::string>{"", "Describe ", " and", ""}));
    EXPECT_EQ(m.markers, (std::vector<MediaKind>{MediaKind::Image, MediaKind::Audio, MediaKind::Video}));
    EXPECT_TRUE(g4::tools::split_media_markers("plain <|image| text").markers.empty());
}

} // namespace
