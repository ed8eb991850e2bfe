// Image file decoding for the g4 CLI through stb_image (see image_io.h).
#include "image_io.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sys/stat.h>
#include <vector>

#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_ONLY_BMP
#define STBI_ONLY_GIF
#define STBI_ONLY_PNM
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
#include <stb/stb_image.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

namespace g4::tools {
namespace {

// stb_image as packaged by Debian (git 2022-09-08) builds a JPEG Huffman table from the 16 code counts of
// a DHT segment without checking that they add up to at most 256, the size of its symbol arrays: larger
// sums write past them (fixed upstream in 2.28 by rejecting n > 256). Any FF C4 pair may be where stb
// reads such a segment (its marker search skips fill bytes and stray data), so each is checked: its tables,
// read as stb reads them (17 bytes of header and counts, then n symbols; bytes past the end read as 0, as
// stbi__get8 returns them), must all count at most 256 codes. True if one does not.
// Linear time: bad[q] is the distance from a table starting at q to the first oversized table of the chain
// it begins (saturated at 65535, past any segment's length), computed once from the end of the file.
bool jpeg_has_oversized_huffman_table(const uint8_t* data, size_t size) {
    size_t soi = 1; // stb finds SOI as it finds every marker: after any number of FF fill bytes
    while (soi < size && data[soi] == 0xFF)
        ++soi;
    if (data[0] != 0xFF || soi >= size || data[soi] != 0xD8) return false; // not a JPEG
    if (!std::memchr(data, 0xC4, size)) return false;
    auto byte = [&](size_t i) -> unsigned { return i < size ? data[i] : 0u; };
    std::vector<uint16_t> bad(size + 1, 0xFFFF); // tables starting at or past the end count 0 codes
    for (size_t q = size; q-- > 0;) {
        unsigned n = 0;
        for (size_t i = q + 1; i <= q + 16; ++i)
            n += byte(i);
        const size_t next = q + 17 + n;
        bad[q] =
            n > 256 ? 0 : uint16_t(std::min<size_t>(0xFFFF, 17 + n + (next < size ? bad[next] : 0xFFFF)));
    }
    for (size_t p = 0; p + 1 < size; ++p) {
        if (data[p] != 0xFF || data[p + 1] != 0xC4 || p + 4 >= size) continue;
        const unsigned len = (byte(p + 2) << 8 | byte(p + 3)); // the segment's tables start at p + 4
        if (len > 2 && bad[p + 4] < len - 2) return true;
    }
    return false;
}

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

// stb_image parses a PPM/PGM header's width, height and maximum value into an int without a bound, so more
// than ten digits overflow it (undefined behaviour; upstream 2.28 rejects them). The header is read here as
// stb reads it (whitespace and # comments between the numbers); true if a number would exceed INT_MAX.
bool pnm_header_number_overflows(const uint8_t* data, size_t size) {
    if (size < 2 || data[0] != 'P' || (data[1] != '5' && data[1] != '6')) return false;
    auto space = [](uint8_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
    size_t pos = 2;
    for (int field = 0; field < 3; ++field) {
        while (pos < size && (space(data[pos]) || data[pos] == '#')) {
            while (pos < size && space(data[pos]))
                ++pos;
            if (pos < size && data[pos] == '#')
                while (pos < size && data[pos] != '\n' && data[pos] != '\r')
                    ++pos;
        }
        int64_t value = 0;
        for (; pos < size && data[pos] >= '0' && data[pos] <= '9'; ++pos)
            if ((value = value * 10 + (data[pos] - '0')) > INT32_MAX) return true;
    }
    return false;
}

} // namespace

std::string decode_image(const uint8_t* data, size_t size, const std::string& what, ImageRGB8* out) {
    if (!out) return "decode_image: null output";
    *out = ImageRGB8{};
    if (!data || size == 0) return "image " + what + " is empty (0 bytes)";
    if (size > size_t(INT32_MAX)) return "image " + what + " is too large (" + std::to_string(size) + " bytes)";
    if (jpeg_has_oversized_huffman_table(data, size))
        return "image " + what + " is corrupt (a JPEG Huffman table declares more than 256 codes)";
    if (pnm_header_number_overflows(data, size))
        return "image " + what + " is corrupt (a PPM/PGM header number exceeds 2147483647)";
    if (std::string e = png_chunk_overrun(data, size); !e.empty())
        return "image " + what + " is corrupt or truncated (" + e + ")";
    int w = 0, h = 0, ch = 0;
    if (!stbi_info_from_memory(data, int(size), &w, &h, &ch))
        return "image " + what + ": unsupported or unrecognised format (" + stbi_failure_reason() +
               "); g4 reads PNG, JPEG, BMP, GIF and PPM/PGM";
    // Always decoded as RGBA (grey replicated, palette and tRNS expanded, alpha 255 where there is none):
    // compositing an opaque pixel over white leaves it unchanged.
    int cw = 0, chh = 0, got = 0;
    stbi_uc* px = stbi_load_from_memory(data, int(size), &cw, &chh, &got, 4);
    if (!px) return "image " + what + " is corrupt or truncated (" + std::string(stbi_failure_reason()) + ")";
    if (cw <= 0 || chh <= 0) {
        stbi_image_free(px);
        return "image " + what + " has no pixels (" + std::to_string(cw) + "x" + std::to_string(chh) + ")";
    }
    out->width = cw;
    out->height = chh;
    const size_t n = size_t(cw) * size_t(chh);
    out->rgb.resize(n * 3);
    for (size_t i = 0; i < n; ++i) {
        const uint8_t a = px[4 * i + 3];
        for (int c = 0; c < 3; ++c) out->rgb[3 * i + c] = composite_over_white(px[4 * i + c], a);
    }
    stbi_image_free(px);
    return "";
}

std::string load_image(const std::string& path, ImageRGB8* out) {
    if (!out) return "load_image: null output";
    *out = ImageRGB8{};
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return "cannot open image '" + path + "': " + std::strerror(errno);
    if (!S_ISREG(st.st_mode)) return "cannot read image '" + path + "': not a regular file";
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return "cannot open image '" + path + "': " + std::strerror(errno);
    std::vector<uint8_t> bytes(size_t(st.st_size));
    const size_t got = bytes.empty() ? 0 : std::fread(bytes.data(), 1, bytes.size(), f);
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    if (failed || got != bytes.size()) return "cannot read image '" + path + "': read error";
    return decode_image(bytes.data(), bytes.size(), "'" + path + "'", out);
}

} // namespace g4::tools
