// g4 serve: prompt prefix reuse. Each session slot remembers the tokens its session holds and the images and
// audio whose soft tokens fill their placeholders; a new prompt reuses the longest prefix it shares with
// them (the session rewound there), passing over a media item only where its content is the same.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace g4::serve {

// One image or audio clip: its kind (g4_media_kind), the SHA-256 of its size and samples, and its soft
// tokens (what the session's add call returned; 0 while not yet known).
struct MediaKey {
    int32_t kind = 0;
    std::string digest;
    int32_t n_tokens = 0;
};

// The plan's media marker ids (g4_media_info's; -1 where the plan has no such tower).
struct MediaTokens {
    int32_t boi = -1, eoi = -1, image = -1, boa = -1, eoa = -1, audio = -1;
};

// What a slot's session holds: its tokens, and the media of their placeholders in the order they appear.
struct SlotHistory {
    std::vector<int32_t> tokens;
    std::vector<MediaKey> media;
};

struct PrefixMatch {
    int32_t tokens = 0; // of the held tokens, the reusable prefix
    size_t media   = 0; // the media items inside it (the first ones of both lists)
};

// The prefix of `held` that a prompt can reuse. `probe` is the prompt's ids with every media item rendered
// at 0 soft tokens (its begin and end markers side by side), `probe_media` its media in the order they
// appear. Tokens match one for one; a media item is passed over only when the held tokens have the same
// begin marker, its n_tokens placeholders and end marker, and the held item at the same place in the list
// has the same kind and digest. The last `keep` probe tokens (at least 1: the prompt's logits come from its
// last token) are never part of the match, and the match stops at a placeholder or end marker outside a media
// item.
PrefixMatch match_prefix(const SlotHistory& held, const std::vector<int32_t>& probe,
                         const std::vector<MediaKey>& probe_media, const MediaTokens& mt, size_t keep = 1);

// The length of the common prefix of two id lists.
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

// MediaKey::digest of an image (RGB8 rows) or an audio clip (float samples).
std::string image_digest(const uint8_t* rgb, int32_t width, int32_t height);
std::string audio_digest(const float* samples, int64_t n);

} // namespace g4::serve
