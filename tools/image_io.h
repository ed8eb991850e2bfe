// Image file decoding for the g4 CLI (not the runtime): PNG, JPEG, BMP, GIF (first frame) to RGB8 through
// stb_image (Debian package libstb-dev), binary PPM/PGM (8 or 16 bits a sample) by a reader of its own.
// Transparency is composited onto white exactly as Hugging Face's convert_to_rgb does it (PIL alpha_composite
// over an opaque white background); grey is expanded to RGB.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace g4::tools {

struct ImageRGB8 {
    int width = 0, height = 0;
    std::vector<uint8_t> rgb; // [height, width, 3]
};

// Width x height an image may have when the caller gives no bound (max_pixels < 1).
constexpr int64_t kMaxImagePixels = int64_t(1) << 26;

// Returns "" or an error naming the file and the reason (missing, unreadable, unsupported, corrupt, or more
// than max_pixels pixels: checked against the header's size before anything is decoded).
std::string load_image(const std::string& path, ImageRGB8* out, int64_t max_pixels = kMaxImagePixels);

// Decodes an in-memory file (the same formats); `what` names it in errors.
std::string decode_image(const uint8_t* data, size_t size, const std::string& what, ImageRGB8* out,
                         int64_t max_pixels = kMaxImagePixels);

// PIL's alpha_composite of one channel value v with alpha a over opaque white (255).
inline uint8_t composite_over_white(uint8_t v, uint8_t a) {
    if (a == 0) return 255;
    // PIL: coef1 = a*255*255*128 / (a*255 + 255*(255-a)) = 128*a, coef2 = 255*128 - coef1
    const uint32_t coef1 = 128u * a, coef2 = 255u * 128u - coef1;
    const uint32_t t = uint32_t(v) * coef1 + 255u * coef2 + (0x80u << 7);
    return uint8_t((((t >> 8) + t) >> 8) >> 7);
}

} // namespace g4::tools
