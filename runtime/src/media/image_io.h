// Image file decoding for the runtime's media input (g4_session_add_image_file / _encoded) and the CLI to the
// RGB8 pixels Hugging Face's load_image gives (PIL.ImageOps.exif_transpose, then convert("RGB")): PNG, BMP,
// GIF (first frame) through stb_image (Debian package libstb-dev), JPEG through libjpeg-turbo (as Pillow
// decodes it, CMYK converted as Pillow does), binary PPM/PGM (8 or 16 bits a sample) by a reader of its own.
// Alpha is dropped (the colour under a transparent pixel is kept), grey and palettes are expanded, 16-bit
// samples keep their high byte except 16-bit grey, which Pillow clips to 255; the EXIF orientation of a JPEG
// (APP1) or PNG (eXIf) is applied.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace g4::media {

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

// The EXIF orientation (1..8, 1 when absent or unreadable) of a TIFF-structured EXIF block ("II"/"MM" ...).
int exif_orientation(const uint8_t* tiff, size_t size);
// Transposes *img as PIL.ImageOps.exif_transpose does for that orientation.
void apply_orientation(ImageRGB8* img, int orientation);
// A JPEG file (image_jpeg.cpp); the declared size is checked against max_pixels before decoding.
std::string decode_jpeg(const uint8_t* data, size_t size, const std::string& what, int64_t max_pixels,
                        ImageRGB8* out);

} // namespace g4::media
