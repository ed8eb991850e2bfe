// JPEG decoding through libjpeg-turbo with Pillow's settings, and EXIF orientation (see image_io.h).
#include "runtime/src/media/image_io.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>

#include <jerror.h>
#include <jpeglib.h>

namespace g4::media {
namespace {

constexpr int kMaxScans =
    1000; // a progressive JPEG with more is treated as hostile (decoding time grows with it)

struct ErrorMgr {
    jpeg_error_mgr pub;
    std::jmp_buf jump;
    char message[JMSG_LENGTH_MAX] = {0};
    bool truncated                = false;
};

void on_error(j_common_ptr c) {
    auto* e = reinterpret_cast<ErrorMgr*>(c->err);
    (*c->err->format_message)(c, e->message);
    std::longjmp(e->jump, 1);
}

void on_message(j_common_ptr c, int level) {
    auto* e = reinterpret_cast<ErrorMgr*>(c->err);
    if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) e->truncated = true;
}

void on_progress(j_common_ptr c) {
    if (c->is_decompressor && reinterpret_cast<j_decompress_ptr>(c)->input_scan_number > kMaxScans) {
        auto* e = reinterpret_cast<ErrorMgr*>(c->err);
        std::snprintf(e->message, sizeof(e->message), "more than %d progressive scans", kMaxScans);
        std::longjmp(e->jump, 1);
    }
}

// Pillow's cmyk2rgb (Convert.c): nk = 255 - k, each channel nk - nk * c / 255 rounded as MULDIV255.
uint8_t cmyk_channel(unsigned c, unsigned k) {
    const unsigned nk = 255 - k, t = c * nk + 128;
    const int v = int(nk) - int(((t >> 8) + t) >> 8);
    return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

uint16_t rd16(const uint8_t* p, bool le) {
    return le ? uint16_t(p[0] | p[1] << 8) : uint16_t(p[0] << 8 | p[1]);
}
uint32_t rd32(const uint8_t* p, bool le) {
    return le ? uint32_t(p[0] | p[1] << 8 | p[2] << 16 | uint32_t(p[3]) << 24)
              : uint32_t(uint32_t(p[0]) << 24 | p[1] << 16 | p[2] << 8 | p[3]);
}

// The frame header's size (SOFn), read by walking the segments before libjpeg runs: libjpeg reports it only
// once it has reached the first scan. False when no frame header comes before the scan data.
bool jpeg_declared_size(const uint8_t* d, size_t size, int64_t* w, int64_t* h) {
    for (size_t pos = 2; pos + 4 <= size;) {
        if (d[pos] != 0xFF) return false;
        const uint8_t m = d[pos + 1];
        if (m == 0xFF) { // fill byte
            ++pos;
            continue;
        }
        const size_t len = size_t(d[pos + 2]) << 8 | d[pos + 3];
        if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
            if (pos + 9 > size) return false;
            *h = int64_t(d[pos + 5]) << 8 | d[pos + 6];
            *w = int64_t(d[pos + 7]) << 8 | d[pos + 8];
            return true;
        }
        if (m == 0xDA || len < 2) return false;
        pos += 2 + len;
    }
    return false;
}

std::string too_large(const std::string& what, int64_t w, int64_t h, int64_t max_pixels) {
    return "image " + what + " is " + std::to_string(w) + "x" + std::to_string(h) +
           " pixels, more than the limit of " + std::to_string(max_pixels) +
           " (downscale it; a plan's limit is g4 compile --max-image-pixels)";
}

} // namespace

int exif_orientation(const uint8_t* tiff, size_t size) {
    if (size < 8) return 1;
    const bool le = tiff[0] == 'I' && tiff[1] == 'I';
    if (!le && !(tiff[0] == 'M' && tiff[1] == 'M')) return 1;
    if (rd16(tiff + 2, le) != 42) return 1;
    const uint32_t ifd = rd32(tiff + 4, le);
    if (ifd > size - 2 || size < 2) return 1;
    const unsigned n = rd16(tiff + ifd, le);
    for (unsigned i = 0; i < n; ++i) {
        const size_t at = size_t(ifd) + 2 + size_t(i) * 12;
        if (at + 12 > size) break;
        if (rd16(tiff + at, le) == 0x0112 && rd16(tiff + at + 2, le) == 3) {
            const unsigned v = rd16(tiff + at + 8, le);
            return v >= 1 && v <= 8 ? int(v) : 1;
        }
    }
    return 1;
}

void apply_orientation(ImageRGB8* img, int orientation) {
    if (orientation <= 1 || orientation > 8) return;
    const int w = img->width, h = img->height;
    const bool swap = orientation >= 5;
    const int ow = swap ? h : w, oh = swap ? w : h;
    std::vector<uint8_t> out(img->rgb.size());
    // (x, y) of the output pixel's source, per PIL.ImageOps.exif_transpose's transposition.
    for (int y = 0; y < oh; ++y)
        for (int x = 0; x < ow; ++x) {
            int sx = x, sy = y;
            switch (orientation) {
            case 2:
                sx = w - 1 - x;
                break; // FLIP_LEFT_RIGHT
            case 3:
                sx = w - 1 - x, sy = h - 1 - y;
                break; // ROTATE_180
            case 4:
                sy = h - 1 - y;
                break; // FLIP_TOP_BOTTOM
            case 5:
                sx = y, sy = x;
                break; // TRANSPOSE
            case 6:
                sx = y, sy = h - 1 - x;
                break; // ROTATE_270
            case 7:
                sx = w - 1 - y, sy = h - 1 - x;
                break; // TRANSVERSE
            case 8:
                sx = w - 1 - y, sy = x;
                break; // ROTATE_90
            }
            std::memcpy(&out[(size_t(y) * ow + x) * 3], &img->rgb[(size_t(sy) * w + sx) * 3], 3);
        }
    img->rgb    = std::move(out);
    img->width  = ow;
    img->height = oh;
}

std::string decode_jpeg(const uint8_t* data, size_t size, const std::string& what, int64_t max_pixels,
                        ImageRGB8* out) {
    int64_t dw = 0, dh = 0;
    if (jpeg_declared_size(data, size, &dw, &dh) && dh > 0 && dw > max_pixels / dh)
        return too_large(what, dw, dh, max_pixels);
    // libjpeg-turbo decodes data that ends early as if the rest were zero, so a few bytes declaring millions
    // of pixels would cost a full decode. Some component has at least pixels / 256 blocks (sampling factors
    // 1-4) and each block's DC difference takes at least one bit: size >= pixels / 2048.
    if (dw > 0 && dh > 0 && uint64_t(size) * 2048 < uint64_t(dw) * uint64_t(dh))
        return "image " + what + " is truncated (JPEG of " + std::to_string(dw) + "x" + std::to_string(dh) +
               " needs at least " + std::to_string(uint64_t(dw) * uint64_t(dh) / 2048) +
               " bytes of coded data; the file has " + std::to_string(size) + ")";
    jpeg_decompress_struct cinfo;
    ErrorMgr err;
    jpeg_progress_mgr progress{};
    cinfo.err                 = jpeg_std_error(&err.pub);
    err.pub.error_exit        = on_error;
    err.pub.emit_message      = on_message;
    progress.progress_monitor = on_progress;
    std::vector<uint8_t> row;
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        *out = ImageRGB8{};
        return "image " + what + " is corrupt or unsupported JPEG (" + err.message + ")";
    }
    jpeg_create_decompress(&cinfo);
    cinfo.progress = &progress;
    jpeg_mem_src(&cinfo, data, (unsigned long)size);
    jpeg_save_markers(&cinfo, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(&cinfo, TRUE);
    const int64_t w = cinfo.image_width, h = cinfo.image_height;
    if (w < 1 || h < 1 || w > max_pixels / h) {
        jpeg_destroy_decompress(&cinfo);
        if (w < 1 || h < 1)
            return "image " + what + " has no pixels (" + std::to_string(w) + "x" + std::to_string(h) + ")";
        return too_large(what, w, h, max_pixels);
    }
    if (uint64_t(size) * 2048 < uint64_t(w) * uint64_t(h)) {
        jpeg_destroy_decompress(&cinfo);
        return "image " + what + " is truncated (JPEG of " + std::to_string(w) + "x" + std::to_string(h) +
               " has " + std::to_string(size) + " bytes, fewer than one bit a block)";
    }
    int orientation = 1;
    for (jpeg_saved_marker_ptr m = cinfo.marker_list; m; m = m->next)
        if (m->marker == JPEG_APP0 + 1 && m->data_length > 6 && std::memcmp(m->data, "Exif\0\0", 6) == 0) {
            orientation = exif_orientation(m->data + 6, m->data_length - 6);
            break;
        }
    const bool cmyk       = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    const bool grey       = cinfo.jpeg_color_space == JCS_GRAYSCALE;
    cinfo.out_color_space = cmyk ? JCS_CMYK : grey ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&cinfo);
    const int ch = cinfo.output_components;
    out->width   = int(cinfo.output_width);
    out->height  = int(cinfo.output_height);
    out->rgb.resize(size_t(out->width) * out->height * 3);
    row.resize(size_t(out->width) * ch);
    // Pillow reads every CMYK JPEG as inverted ("CMYK;I", Adobe's convention).
    const bool inverted = cmyk;
    while (cinfo.output_scanline < cinfo.output_height) {
        const size_t y = cinfo.output_scanline;
        JSAMPROW r     = row.data();
        jpeg_read_scanlines(&cinfo, &r, 1);
        uint8_t* o = &out->rgb[y * size_t(out->width) * 3];
        for (int x = 0; x < out->width; ++x) {
            const uint8_t* p = &row[size_t(x) * ch];
            if (ch == 1) {
                o[3 * x] = o[3 * x + 1] = o[3 * x + 2] = p[0];
            } else if (ch == 3) {
                std::memcpy(o + 3 * x, p, 3);
            } else {
                auto v       = [&](int i) { return inverted ? 255u - p[i] : unsigned(p[i]); };
                o[3 * x]     = cmyk_channel(v(0), v(3));
                o[3 * x + 1] = cmyk_channel(v(1), v(3));
                o[3 * x + 2] = cmyk_channel(v(2), v(3));
            }
        }
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    if (err.truncated) {
        *out = ImageRGB8{};
        return "image " + what + " is truncated (the JPEG data ends early)";
    }
    apply_orientation(out, orientation);
    return "";
}

} // namespace g4::media
