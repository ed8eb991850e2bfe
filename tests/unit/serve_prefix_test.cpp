// g4 serve's prompt prefix reuse without a model (tools/serve/prefix.*): the prefix a slot's tokens share
// with a prompt, media passed over only where their content is the same, and the media digests.
#include "g4/g4.h"
#include "tools/serve/prefix.h"

#include <gtest/gtest.h>

namespace {

using g4::serve::match_prefix;
using g4::serve::MediaKey;
using g4::serve::MediaTokens;
using g4::serve::SlotHistory;

// Marker ids of a made-up plan: <boi> 90, image 91, <eoi> 92, <boa> 93, audio 94, <eoa> 95.
const MediaTokens kMarks{90, 92, 91, 93, 95, 94};

MediaKey image(const std::string& digest, int32_t n = 0) {
    return {G4_MEDIA_IMAGE, digest, n};
}
MediaKey audio(const std::string& digest, int32_t n = 0) {
    return {G4_MEDIA_AUDIO, digest, n};
}

TEST(ServePrefix, TextSharesItsCommonPrefixButNotItsLastTokens) {
    const SlotHistory held{{2, 10, 11, 12, 13, 14, 15}, {}};
    EXPECT_EQ(match_prefix(held, {2, 10, 11, 20, 21}, {}, kMarks).tokens, 3);
    // The whole prompt held (a repeated request): its last token is fed again for the logits.
    EXPECT_EQ(match_prefix(held, {2, 10, 11, 12}, {}, kMarks).tokens, 3);
    // A prompt that continues what is held (the next turn of a conversation).
    EXPECT_EQ(match_prefix(held, {2, 10, 11, 12, 13, 14, 15, 16, 17}, {}, kMarks).tokens, 7);
    EXPECT_EQ(match_prefix(held, {3, 10}, {}, kMarks).tokens, 0);
    EXPECT_EQ(match_prefix(held, {}, {}, kMarks).tokens, 0);
    EXPECT_EQ(match_prefix(SlotHistory{}, {2, 10, 11}, {}, kMarks).tokens, 0);
    // At least `keep` tokens are left to feed.
    EXPECT_EQ(match_prefix(held, {2, 10, 11, 12, 13, 14, 15, 16, 17}, {}, kMarks, 4).tokens, 5);
    EXPECT_EQ(match_prefix(held, {2, 10, 11}, {}, kMarks, 4).tokens, 0);
}

TEST(ServePrefix, MediaArePassedOverOnlyWithTheSameContent) {
    // Held: text, an image of 3 soft tokens, text, an audio clip of 2, text.
    const SlotHistory held{{2, 10, 90, 91, 91, 91, 92, 11, 93, 94, 94, 95, 12, 13},
                           {image("a", 3), audio("x", 2)}};
    // The probe renders each item at 0 soft tokens: <boi><eoi>.
    const std::vector<int32_t> probe = {2, 10, 90, 92, 11, 93, 95, 12, 40, 41};
    auto m                           = match_prefix(held, probe, {image("a"), audio("x")}, kMarks);
    EXPECT_EQ(m.tokens, 13); // up to 12, in the held tokens' positions
    EXPECT_EQ(m.media, 2u);
    // Another image at the same place: the match ends before its <boi>, no media reused.
    m = match_prefix(held, probe, {image("b"), audio("x")}, kMarks);
    EXPECT_EQ(m.tokens, 2);
    EXPECT_EQ(m.media, 0u);
    // The same image, another clip: the image is reused, the clip is not.
    m = match_prefix(held, probe, {image("a"), audio("y")}, kMarks);
    EXPECT_EQ(m.tokens, 8);
    EXPECT_EQ(m.media, 1u);
    // The same digest under another kind is not the same content.
    EXPECT_EQ(match_prefix(held, probe, {audio("a"), audio("x")}, kMarks).tokens, 2);
    // A held item whose placeholders are cut short (its request stopped while they were fed).
    const SlotHistory cut{{2, 10, 90, 91, 91}, {image("a", 3)}};
    EXPECT_EQ(match_prefix(cut, probe, {image("a"), audio("x")}, kMarks).tokens, 2);
    // A media item at the probe's end is fed again with its end marker.
    EXPECT_EQ(match_prefix(held, {2, 10, 90, 92}, {image("a")}, kMarks).tokens, 2);
}

TEST(ServePrefix, PlaceholdersOutsideAMediaItemEndTheMatch) {
    const SlotHistory held{{2, 91, 91, 10, 11}, {}};
    EXPECT_EQ(match_prefix(held, {2, 91, 91, 10, 11, 12}, {}, kMarks).tokens, 1);
    const SlotHistory no_media{{2, 90, 91, 92, 10}, {}};
    EXPECT_EQ(match_prefix(no_media, {2, 90, 92, 10, 11}, {image("a")}, kMarks).tokens, 1);
}

TEST(ServePrefix, DigestsFollowTheContent) {
    const std::vector<uint8_t> px(2 * 3 * 3, 7);
    std::vector<uint8_t> other = px;
    other[5]                   = 8;
    EXPECT_EQ(g4::serve::image_digest(px.data(), 2, 3), g4::serve::image_digest(px.data(), 2, 3));
    EXPECT_NE(g4::serve::image_digest(px.data(), 2, 3), g4::serve::image_digest(other.data(), 2, 3));
    EXPECT_NE(g4::serve::image_digest(px.data(), 2, 3), g4::serve::image_digest(px.data(), 3, 2));
    const std::vector<float> pcm = {0.1f, -0.2f, 0.3f};
    EXPECT_NE(g4::serve::audio_digest(pcm.data(), 3), g4::serve::audio_digest(pcm.data(), 2));
    EXPECT_EQ(g4::serve::audio_digest(pcm.data(), 3).size(), 64u);
}

} // namespace
