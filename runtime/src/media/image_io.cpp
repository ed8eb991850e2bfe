// Image file decoding through stb_image (see image_io.h).
#include "runtime/src/media/image_io.h"
#include "runtime/src/media/read_file.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sys/stat.h>
#include <vector>

#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#define STBI_ONLY_BMP
#define STBI_ONLY_GIF
#define STBI_NO_HDR
#define STBI_NO_LINEAR
#define STBI_FAILURE_USERMSG
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#endif
// stb_image copies zero bytes from a null buffer for an empty first IDAT chunk (memcpy(NULL, p, 0)):
// harmless, but UndefinedBehaviorSanitizer's nonnull check stops on it, so that one check is off in stb's
// functions.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((no_sanitize("nonnull-attribute"))), apply_to = function)
#endif
#include <stb/stb_image.h>
#if defined(__clang__)
#pragma clang attribute pop
#endif
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

namespace g4::media {
namespace {

// stb_image reserves a PNG IDAT chunk's declared length before it reads the chunk, so a file of a few bytes
// can ask for gigabytes. Every chunk must fit in the file (stb fails on one that does not anyway): returns
// "" or what is wrong. Chunks are walked as stb walks them, up to IEND's header.
std::string png_chunk_overrun(const uint8_t* data, size_t size) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    if (size < 8 || std::memcmp(data, sig, 8) != 0) return "";
    for (size_t pos = 8; pos + 8 <= size;) {
        const uint64_t len =
            uint64_t(data[pos]) << 24 | data[pos + 1] << 16 | data[pos + 2] << 8 | data[pos + 3];
        const std::string type(reinterpret_cast<const char*>(data) + pos + 4, 4);
        if (type == "IEND") break; // stb stops at its header
        if (len + 12 > size - pos)
            return "PNG chunk '" + type + "' declares " + std::to_string(len) + " bytes but only " +
                   std::to_string(size - pos < 12 ? 0 : size - pos - 12) + " remain";
        pos += 12 + len;
    }
    return "";
}

struct PngInfo {
    int bit_depth = 0, color_type = -1, orientation = 1;
};

// IHDR's depth and colour type, and the orientation of an eXIf chunk (Pillow applies it as it does a JPEG's).
// The chunks were checked to fit in the file (png_chunk_overrun).
PngInfo png_info(const uint8_t* data, size_t size) {
    PngInfo info;
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    if (size < 33 || std::memcmp(data, sig, 8) != 0) return info;
    info.bit_depth  = data[24];
    info.color_type = data[25];
    for (size_t pos = 8; pos + 12 <= size;) {
        const size_t len = size_t(data[pos]) << 24 | data[pos + 1] << 16 | data[pos + 2] << 8 | data[pos + 3];
        if (len > size - pos - 12) break;
        if (std::memcmp(data + pos + 4, "eXIf", 4) == 0) {
            info.orientation = exif_orientation(data + pos + 8, len);
            break;
        }
        if (std::memcmp(data + pos + 4, "IEND", 4) == 0) break;
        pos += 12 + len;
    }
    return info;
}

// A GIF's first frame: the colour of its transparent palette index, where it has one (Pillow keeps the
// palette colour under transparent pixels; stb_image leaves them black). False when there is none.
bool gif_transparent_colour(const uint8_t* d, size_t size, uint8_t rgb[3]) {
    if (size < 13 || std::memcmp(d, "GIF8", 4) != 0) return false;
    size_t pos           = 13;
    const uint8_t* table = nullptr;
    size_t entries       = 0;
    if (d[10] & 0x80) {
        entries = size_t(2) << (d[10] & 7);
        if (pos + 3 * entries > size) return false;
        table = d + pos;
        pos += 3 * entries;
    }
    int transparent = -1;
    while (pos < size) {
        if (d[pos] == 0x21 && pos + 1 < size) { // extension: a graphic control one holds the index
            const uint8_t label = d[pos + 1];
            pos += 2;
            if (label == 0xF9 && pos + 5 < size && d[pos] == 4)
                transparent = (d[pos + 1] & 1) ? d[pos + 4] : -1;
            while (pos < size && d[pos] != 0) // sub-blocks
                pos += 1 + size_t(d[pos]);
            ++pos;
        } else if (d[pos] == 0x2C && pos + 10 <= size) { // the first image: its own table, if any
            if (d[pos + 9] & 0x80) {
                entries = size_t(2) << (d[pos + 9] & 7);
                if (pos + 10 + 3 * entries > size) return false;
                table = d + pos + 10;
            }
            break;
        } else {
            return false;
        }
    }
    if (transparent < 0 || !table || size_t(transparent) >= entries) return false;
    std::memcpy(rgb, table + 3 * transparent, 3);
    return true;
}

std::string too_many_pixels(const std::string& what, int64_t w, int64_t h, int64_t max_pixels) {
    return "image " + what + " is " + std::to_string(w) + "x" + std::to_string(h) +
           " pixels, more than the limit of " + std::to_string(max_pixels) +
           " (downscale it; a plan's limit is g4 compile --max-image-pixels)";
}

bool pnm_space(uint8_t c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// Binary PGM (P5) and PPM (P6), 8 or 16 bits a sample, read as Pillow's PpmImagePlugin does: header tokens
// separated by whitespace and '#' comments, one whitespace byte after maxval, then the samples (big-endian
// when maxval > 255). Samples scale to 8 bits as Pillow does: RGB round(v / maxval * 255) capped at 255;
// grey with maxval <= 255 the same; grey with maxval > 255 becomes Pillow's 32-bit mode "I" (v itself when
// maxval is 65535, else round(v / maxval * 65535)), which convert("RGB") clips to 255 (so only values below
// 256 / 65536 of maxval stay below white).
std::string decode_pnm(const uint8_t* data, size_t size, const std::string& what, int64_t max_pixels,
                       ImageRGB8* out) {
    const bool rgb = data[1] == '6';
    if (data[1] != '5' && data[1] != '6')
        return "image " + what + ": plain or bitmap PNM (P" + std::string(1, char(data[1])) +
               ") is not supported; g4 reads binary PGM (P5) and PPM (P6): convert it to PNG";
    size_t pos = 2;
    int64_t tok[3];
    for (int i = 0; i < 3; ++i) {
        std::string t;
        for (;;) {
            if (pos >= size) break;
            const uint8_t c = data[pos++];
            if (pnm_space(c)) {
                if (t.empty()) continue;
                break;
            }
            if (c == '#') {
                while (pos < size && data[pos] != '\n' && data[pos] != '\r')
                    ++pos;
                continue;
            }
            if (c < '0' || c > '9' || t.size() >= 10)
                return "image " + what + ": PNM header field " + std::to_string(i + 1) +
                       " is not a number of at most 10 digits";
            t += char(c);
        }
        if (t.empty())
            return "image " + what + " is truncated: the PNM header ends before its width, height and maxval";
        tok[i] = std::stoll(t);
    }
    const int64_t w = tok[0], h = tok[1], maxval = tok[2];
    if (w < 1 || h < 1)
        return "image " + what + " has no pixels (" + std::to_string(w) + "x" + std::to_string(h) + ")";
    if (maxval < 1 || maxval > 65535)
        return "image " + what + ": PNM maxval " + std::to_string(maxval) +
               " is outside 1..65535 (corrupt file)";
    if (w > max_pixels / h) return too_many_pixels(what, w, h, max_pixels);
    const int ch = rgb ? 3 : 1, bytes = maxval > 255 ? 2 : 1;
    const uint64_t need = uint64_t(w) * uint64_t(h) * ch * bytes;
    if (size - pos < need)
        return "image " + what + " is truncated: its " + std::to_string(w) + "x" + std::to_string(h) + " " +
               (rgb ? "PPM" : "PGM") + " pixels need " + std::to_string(need) + " bytes but " +
               std::to_string(size - pos) + " follow the header";
    // One 8-bit value for every sample value.
    std::vector<uint8_t> lut(size_t(1) << (8 * bytes));
    for (size_t v = 0; v < lut.size(); ++v) {
        double x;
        if (!rgb && maxval > 255)
            x = maxval == 65535 ? double(v)
                                : std::min(65535.0, std::nearbyint(double(v) / double(maxval) * 65535.0));
        else
            x = maxval == 255 ? double(v) : std::nearbyint(double(v) / double(maxval) * 255.0);
        lut[v] = uint8_t(std::min(255.0, x));
    }
    const uint8_t* p = data + pos;
    const size_t n   = size_t(w) * size_t(h);
    out->rgb.resize(n * 3);
    for (size_t i = 0; i < n * ch; ++i) {
        const uint32_t v = bytes == 2 ? (uint32_t(p[2 * i]) << 8 | p[2 * i + 1]) : p[i];
        if (rgb)
            out->rgb[i] = lut[v];
        else
            out->rgb[3 * i] = out->rgb[3 * i + 1] = out->rgb[3 * i + 2] = lut[v];
    }
    out->width  = int(w);
    out->height = int(h);
    return "";
}

// stb_image decodes a BMP or JPEG whose data ends early as if the missing bytes were zero, so a file of a
// few bytes declaring millions of pixels costs a full decode. Each format's least possible data for its
// declared size is checked first: returns "" or what is wrong.
// - BMP: stb reads every compression value but RLE's (1, 2) as raw rows: the pixel rows at bfOffBits, each
//   padded to 4 bytes (the last row's padding may be absent).
// - JPEG: some component has ceil(w/8) blocks a row and at least ceil(h/32) block rows (sampling factors are
//   1-4), and every block's DC difference takes at least one bit of Huffman code: size >= pixels / 2048.
std::string too_little_data(const uint8_t* data, size_t size, int w, int h) {
    auto le16 = [&](size_t i) -> uint32_t {
        return i + 2 <= size ? uint32_t(data[i] | data[i + 1] << 8) : 0;
    };
    auto le32 = [&](size_t i) -> uint32_t { return i + 4 <= size ? le16(i) | le16(i + 2) << 16 : 0; };
    const uint64_t pixels = uint64_t(w) * uint64_t(h);
    if (size >= 2 && data[0] == 'B' && data[1] == 'M') {
        const uint32_t offset = le32(10), header = le32(14);
        const uint32_t bpp = header == 12 ? le16(24) : le16(28), compression = header == 12 ? 0 : le32(30);
        if (compression == 1 || compression == 2) return ""; // RLE: stb refuses it; other values read as raw
        const uint64_t stride = (uint64_t(w) * bpp + 31) / 32 * 4, last = (uint64_t(w) * bpp + 7) / 8;
        const uint64_t need = uint64_t(offset) + stride * uint64_t(h - 1) + last;
        if (need > size)
            return "BMP of " + std::to_string(w) + "x" + std::to_string(h) + " at " + std::to_string(bpp) +
                   " bits a pixel needs " + std::to_string(need) + " bytes; the file has " +
                   std::to_string(size);
        return "";
    }
    size_t soi = 1; // after any FF fill bytes, as stb finds it
    while (soi < size && data[soi] == 0xFF)
        ++soi;
    if (data[0] == 0xFF && soi < size && data[soi] == 0xD8 && uint64_t(size) * 2048 < pixels)
        return "JPEG of " + std::to_string(w) + "x" + std::to_string(h) + " needs at least " +
               std::to_string(pixels / 2048) + " bytes of coded data; the file has " + std::to_string(size);
    return "";
}

} // namespace

std::string decode_image(const uint8_t* data, size_t size, const std::string& what, ImageRGB8* out,
                         int64_t max_pixels) {
    if (!out) return "decode_image: null output";
    *out = ImageRGB8{};
    if (!data || size == 0) return "image " + what + " is empty (0 bytes)";
    if (size > size_t(INT32_MAX))
        return "image " + what + " is too large (" + std::to_string(size) + " bytes)";
    if (max_pixels < 1) max_pixels = kMaxImagePixels;
    if (size >= 2 && data[0] == 'P' && data[1] >= '1' && data[1] <= '6') {
        std::string err = decode_pnm(data, size, what, max_pixels, out);
        if (!err.empty()) *out = ImageRGB8{};
        return err;
    }
    if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF)
        return decode_jpeg(data, size, what, max_pixels, out);
    if (std::string e = png_chunk_overrun(data, size); !e.empty())
        return "image " + what + " is corrupt or truncated (" + e + ")";
    // The declared size is checked before anything is decoded or allocated.
    int w = 0, h = 0, ch = 0;
    if (!stbi_info_from_memory(data, int(size), &w, &h, &ch))
        return "image " + what + ": unsupported or unrecognised format (" + stbi_failure_reason() +
               "); g4 reads PNG, JPEG, BMP, GIF and PPM/PGM";
    if (w <= 0 || h <= 0)
        return "image " + what + " has no pixels (" + std::to_string(w) + "x" + std::to_string(h) + ")";
    if (int64_t(w) * h > max_pixels) return too_many_pixels(what, w, h, max_pixels);
    if (std::string e = too_little_data(data, size, w, h); !e.empty())
        return "image " + what + " is truncated (" + e + ")";
    // 16-bit grey PNG is Pillow's mode "I;16", which convert("RGB") clips to 255; every other PNG keeps
    // the high byte of 16-bit samples, as stb_image does.
    const PngInfo png = png_info(data, size);
    const bool grey16 = png.bit_depth == 16 && png.color_type == 0;
    int cw = 0, chh = 0, got = 0;
    void* px = grey16 ? (void*)stbi_load_16_from_memory(data, int(size), &cw, &chh, &got, 1)
                      : (void*)stbi_load_from_memory(data, int(size), &cw, &chh, &got, 4);
    if (!px) return "image " + what + " is corrupt or truncated (" + std::string(stbi_failure_reason()) + ")";
    if (cw != w || chh != h) {
        stbi_image_free(px);
        return "image " + what + " is corrupt: its header says " + std::to_string(w) + "x" +
               std::to_string(h) + " but it decodes to " + std::to_string(cw) + "x" + std::to_string(chh);
    }
    out->width     = cw;
    out->height    = chh;
    const size_t n = size_t(cw) * size_t(chh);
    out->rgb.resize(n * 3);
    uint8_t under[3];
    const bool gif_trns = gif_transparent_colour(data, size, under);
    for (size_t i = 0; i < n; ++i) {
        if (gif_trns && static_cast<const uint8_t*>(px)[4 * i + 3] == 0) {
            std::memcpy(&out->rgb[3 * i], under, 3);
        } else if (grey16) {
            const uint16_t v    = static_cast<const uint16_t*>(px)[i];
            out->rgb[3 * i]     = uint8_t(v > 255 ? 255 : v);
            out->rgb[3 * i + 1] = out->rgb[3 * i + 2] = out->rgb[3 * i];
        } else {
            std::memcpy(&out->rgb[3 * i], static_cast<const uint8_t*>(px) + 4 * i, 3); // alpha dropped
        }
    }
    stbi_image_free(px);
    apply_orientation(out, png.orientation);
    return "";
}

std::string load_image(const std::string& path, ImageRGB8* out, int64_t max_pixels) {
    if (!out) return "load_image: null output";
    *out = ImageRGB8{};
    std::vector<uint8_t> bytes;
    if (std::string err = read_file_bytes(path, "image", uint64_t(INT32_MAX), &bytes); !err.empty())
        return err;
    return decode_image(bytes.data(), bytes.size(), "'" + path + "'", out, max_pixels);
}

} // namespace g4::media
