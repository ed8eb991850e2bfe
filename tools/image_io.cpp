// Image file decoding for the g4 CLI through stb_image (see image_io.h).
#include "image_io.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sys/stat.h>

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

std::string decode_image(const uint8_t* data, size_t size, const std::string& what, ImageRGB8* out) {
    if (!out) return "decode_image: null output";
    *out = ImageRGB8{};
    if (!data || size == 0) return "image " + what + " is empty (0 bytes)";
    if (size > size_t(INT32_MAX)) return "image " + what + " is too large (" + std::to_string(size) + " bytes)";
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
