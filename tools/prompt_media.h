// Where the CLI puts images, clips and videos in a prompt: each file's block (<boi> n placeholders <eoi>)
// goes at its marker, or, with no marker of its kind, after <bos> before the text, in command-line order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace g4::tools {

enum class MediaKind { Image, Audio, Video };

// One file's soft tokens, in the order the files were given. A video gives `n` placeholders for each of
// its frames, each frame's block preceded by `prefix[f]` (its timestamp's ids, already tokenized).
struct MediaBlock {
    MediaKind kind = MediaKind::Image;
    std::string file;
    int32_t n = 0;                            // soft tokens (a video: per frame)
    std::vector<std::vector<int32_t>> prefix; // a video: one entry a frame (its "mm:ss " ids)
    std::vector<int32_t> separator;           // a video: ids between two frames (" ")
};

struct MediaIds {
    int32_t bos = 2;
    int32_t boi = -1, image = -1, eoi = -1; // image and video blocks open/close with boi/eoi
    int32_t boa = -1, audio = -1, eoa = -1;
    int32_t video = -1;
};

// The ids of one block: <boi> n x image <eoi> / <boa> n x audio <eoa> / per frame "mm:ss <boi> n x video
// <eoi>" joined by the separator.
std::vector<int32_t> media_block_ids(const MediaBlock& b, const MediaIds& ids);

// Puts every block into *prompt exactly once. For each kind:
//  - `written_out_ok` (a --tokens list) and the prompt already holds all that kind's soft tokens as written
//    out blocks (as many open ids as files and placeholders as soft tokens): left as it is;
//  - as many lone placeholder ids (markers) as files of that kind: the i-th marker becomes the i-th file's
//    block (a video marker is the video id);
//  - none: the blocks go right after <bos> (or first, without <bos>), before the text, in the order given;
//  - anything else: an error naming both counts.
// Returns "" or the error.
std::string place_media(std::vector<int32_t>* prompt, const std::vector<MediaBlock>& blocks,
                        const MediaIds& ids, bool written_out_ok);

// The marker strings of a -p text, in the order they appear: the text between them (segments.size() ==
// markers.size() + 1). Recognised: <|image|>, <|audio|>, <|video|>.
struct MarkedText {
    std::vector<std::string> segments;
    std::vector<MediaKind> markers;
};
MarkedText split_media_markers(std::string_view text);

const char* media_kind_name(MediaKind k);

} // namespace g4::tools
