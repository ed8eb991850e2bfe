// Image preprocessing (see image.h): target size, torch-exact uint8 bicubic antialiased resize,
// rescale, patchify.
#include "runtime/src/frontend/image.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace g4::towers {
namespace {

constexpr size_t kAlign = 64;
size_t align_up(size_t n) {
    return (n + kAlign - 1) / kAlign * kAlign;
}

std::string check_params(int max_soft_tokens, int patch, int pool) {
    if (patch <= 0 || pool <= 0)
        return "image preprocessing: patch size (" + std::to_string(patch) + ") and pooling kernel (" +
               std::to_string(pool) + ") must be positive";
    if (max_soft_tokens <= 0)
        return "image preprocessing: max_soft_tokens must be positive, got " +
               std::to_string(max_soft_tokens);
    const int64_t side = int64_t(patch) * pool;
    if (int64_t(max_soft_tokens) * side * side > (int64_t(1) << 31) / 4)
        return "image preprocessing: max_soft_tokens " + std::to_string(max_soft_tokens) + " with patch " +
               std::to_string(patch) + " and pool " + std::to_string(pool) + " gives an image too large";
    return "";
}

// Pillow's bicubic kernel (a = -0.5), as torch's antialiased bicubic uses it.
double cubic_aa(double x) {
    constexpr double a = -0.5;
    x                  = std::abs(x);
    if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
    return 0.0;
}

// One resized axis: for output i, taps [start[i], start[i] + count[i]) of the input with int16 weights
// w[i * kmax + j], fixed point with `precision` fractional bits.
struct Axis {
    int in = 0, out = 0, kmax = 0;
    double scale = 1.0, support = 2.0;
};

Axis make_axis(int in, int out) {
    Axis a;
    a.in = in, a.out = out;
    a.scale   = double(in) / double(out);
    a.support = a.scale >= 1.0 ? 2.0 * a.scale : 2.0;
    a.kmax    = int(std::ceil(a.support)) * 2 + 1;
    return a;
}

// Window of output i and its normalised float64 weights (written to w[0..kmax), zero past the window).
void window(const Axis& a, int i, int* start, int* count, double* w) {
    const double center   = a.scale * (i + 0.5);
    const double invscale = a.scale >= 1.0 ? 1.0 / a.scale : 1.0;
    const int64_t lo      = std::max<int64_t>(int64_t(center - a.support + 0.5), 0);
    const int64_t hi      = std::min<int64_t>(int64_t(center + a.support + 0.5), a.in);
    const int n           = int(hi - lo);
    double total          = 0.0;
    for (int j = 0; j < n; ++j) {
        const double v = cubic_aa((double(j + lo) - center + 0.5) * invscale);
        w[j]           = v;
        total += v;
    }
    for (int j = 0; j < n; ++j)
        if (total != 0.0) w[j] /= total;
    for (int j = std::max(n, 0); j < a.kmax; ++j)
        w[j] = 0.0;
    *start = int(lo);
    *count = n;
}

// Fills the int16 table and window bounds; returns the fixed-point precision. wtmp: kmax doubles.
int build_axis(const Axis& a, int16_t* k, int32_t* bounds, double* wtmp) {
    double wmax = 0.0;
    bool first  = true;
    for (int i = 0; i < a.out; ++i) {
        int s, n;
        window(a, i, &s, &n, wtmp);
        for (int j = 0; j < a.kmax; ++j)
            if (first || wmax < wtmp[j]) wmax = wtmp[j], first = false;
    }
    int prec = 0;
    for (; prec < 22; ++prec)
        if (int(0.5 + wmax * double(1 << (prec + 1))) >= (1 << 15)) break;
    for (int i = 0; i < a.out; ++i) {
        int s, n;
        window(a, i, &s, &n, wtmp);
        bounds[2 * i]     = s;
        bounds[2 * i + 1] = n;
        for (int j = 0; j < a.kmax; ++j) {
            const double v            = wtmp[j] * double(1 << prec);
            k[size_t(i) * a.kmax + j] = int16_t(v < 0 ? int(-0.5 + v) : int(0.5 + v));
        }
    }
    return prec;
}

inline uint8_t clamp_u8(int32_t v) {
    return uint8_t(std::min(std::max(v, 0), 255));
}

struct Plan {
    ImageLayout lay;
    bool need_h = false, need_v = false;
    Axis ah, av;
    size_t off_kh = 0, off_bh = 0, off_kv = 0, off_bv = 0, off_row = 0, off_wtmp = 0, bytes = 0;
};

std::string make_plan(int in_h, int in_w, int max_soft_tokens, int patch, int pool, Plan* p) {
    if (std::string e = image_layout(in_h, in_w, max_soft_tokens, patch, pool, &p->lay); !e.empty()) return e;
    p->need_h    = p->lay.out_w != in_w;
    p->need_v    = p->lay.out_h != in_h;
    p->ah        = make_axis(in_w, p->lay.out_w);
    p->av        = make_axis(in_h, p->lay.out_h);
    size_t off   = 0;
    int kmax_tmp = 0;
    if (p->need_h) {
        p->off_kh = off, off = align_up(off + sizeof(int16_t) * size_t(p->ah.out) * p->ah.kmax);
        p->off_bh = off, off = align_up(off + sizeof(int32_t) * 2 * size_t(p->ah.out));
        p->off_row = off, off = align_up(off + 3 * size_t(p->ah.out));
        kmax_tmp = p->ah.kmax;
    }
    if (p->need_v) {
        p->off_kv = off, off = align_up(off + sizeof(int16_t) * size_t(p->av.out) * p->av.kmax);
        p->off_bv = off, off = align_up(off + sizeof(int32_t) * 2 * size_t(p->av.out));
        kmax_tmp = std::max(kmax_tmp, p->av.kmax);
    }
    p->off_wtmp = off, off = align_up(off + sizeof(double) * size_t(kmax_tmp));
    p->bytes = std::max(off, kAlign); // never 0: 0 means invalid arguments
    return "";
}

// Flat index in the patches buffer of pixel (y, x), channel 0.
inline size_t patch_index(const ImageLayout& l, int patch, int y, int x) {
    const int gy = y / patch, py = y % patch, gx = x / patch, px = x % patch;
    return ((size_t(gy) * l.grid_w + gx) * patch * patch + size_t(py) * patch + px) * 3;
}

// Horizontal pass of one input row: src [in_w, 3] -> dst [out_w, 3].
void resample_row(const uint8_t* src, uint8_t* dst, const Axis& a, const int16_t* k, const int32_t* bounds,
                  int prec) {
    const int32_t half = int32_t(1) << (prec - 1);
    for (int x = 0; x < a.out; ++x) {
        const int s = bounds[2 * x], n = bounds[2 * x + 1];
        const int16_t* w = k + size_t(x) * a.kmax;
        const uint8_t* p = src + size_t(s) * 3;
        int32_t r = half, g = half, b = half;
        for (int j = 0; j < n; ++j) {
            r += int32_t(w[j]) * p[3 * j];
            g += int32_t(w[j]) * p[3 * j + 1];
            b += int32_t(w[j]) * p[3 * j + 2];
        }
        dst[3 * x]     = clamp_u8(r >> prec);
        dst[3 * x + 1] = clamp_u8(g >> prec);
        dst[3 * x + 2] = clamp_u8(b >> prec);
    }
}

} // namespace

std::string image_layout(int in_h, int in_w, int max_soft_tokens, int patch, int pool, ImageLayout* out) {
    if (!out) return "image_layout: null output";
    *out = ImageLayout{};
    if (std::string e = check_params(max_soft_tokens, patch, pool); !e.empty()) return e;
    if (in_h <= 0 || in_w <= 0)
        return "image preprocessing: empty image (" + std::to_string(in_h) + "x" + std::to_string(in_w) +
               " pixels); an image needs at least one pixel";
    const int64_t side        = int64_t(patch) * pool;
    const int64_t max_patches = int64_t(max_soft_tokens) * pool * pool;
    const double total_px     = double(int64_t(in_h) * in_w);
    const double target_px    = double(max_patches * patch * patch);
    const double factor       = std::sqrt(target_px / total_px);
    const double ideal_h = factor * in_h, ideal_w = factor * in_w;
    int64_t th = int64_t(std::floor(ideal_h / double(side))) * side;
    int64_t tw = int64_t(std::floor(ideal_w / double(side))) * side;
    if (th == 0 && tw == 0)
        return "image preprocessing: a " + std::to_string(in_h) + "x" + std::to_string(in_w) +
               " image resizes to 0x0 with max_soft_tokens " + std::to_string(max_soft_tokens);
    const int64_t max_side = (max_patches / (int64_t(pool) * pool)) * side;
    if (th == 0) {
        th = side;
        tw = std::min(int64_t(std::floor(double(in_w) / double(in_h))) * side, max_side);
    } else if (tw == 0) {
        tw = side;
        th = std::min(int64_t(std::floor(double(in_h) / double(in_w))) * side, max_side);
    }
    if (double(th * tw) > target_px)
        return "image preprocessing: resizing " + std::to_string(in_h) + "x" + std::to_string(in_w) + " to " +
               std::to_string(th) + "x" + std::to_string(tw) + " exceeds " + std::to_string(max_patches) +
               " patches";
    out->out_h     = int(th);
    out->out_w     = int(tw);
    out->grid_h    = int(th / patch);
    out->grid_w    = int(tw / patch);
    out->n_patches = out->grid_h * out->grid_w;
    out->n_soft    = (out->grid_h / pool) * (out->grid_w / pool);
    return "";
}

size_t preprocess_scratch_bytes_for(int in_h, int in_w, int max_soft_tokens, int patch, int pool) {
    Plan p;
    if (!make_plan(in_h, in_w, max_soft_tokens, patch, pool, &p).empty()) return 0;
    return p.bytes;
}

size_t preprocess_scratch_bytes(int64_t max_in_pixels, int max_soft_tokens, int patch, int pool) {
    if (max_in_pixels <= 0 || !check_params(max_soft_tokens, patch, pool).empty()) return 0;
    // Both output sides are at most max_side (HF's cap; the normal case gives out_h*out_w <= target_px with
    // both sides >= patch*pool). An axis table holds out*kmax int16 with kmax <= 2*support + 3, support =
    // max(2*in/out, 2): at most 4*in + 5*out entries; in_h + in_w <= max_in_pixels + 1.
    const size_t side     = size_t(patch) * pool;
    const size_t max_side = size_t(max_soft_tokens) * side;
    const size_t n        = size_t(max_in_pixels);
    const size_t k16      = 4 * (n + 1) + 10 * max_side + 2 * 3; // +3 per axis: ceil() slack
    const size_t kmax     = 4 * n / side + 8;                    // the widest window, for the float64 temp
    return align_up(2 * k16) + align_up(sizeof(int32_t) * 4 * max_side) + align_up(3 * max_side) +
           align_up(sizeof(double) * kmax) + 6 * kAlign;
}

std::string preprocess_image(const uint8_t* rgb, int in_h, int in_w, int max_soft_tokens, int patch, int pool,
                             void* scratch, size_t scratch_bytes, float* patches, int32_t* pos,
                             ImageLayout* layout, const cpu::Context* ctx) {
    if (!rgb || !patches || !pos || !layout) return "preprocess_image: null image, output or layout pointer";
    Plan p;
    if (std::string e = make_plan(in_h, in_w, max_soft_tokens, patch, pool, &p); !e.empty()) return e;
    if (!scratch || scratch_bytes < p.bytes)
        return "preprocess_image: scratch too small for a " + std::to_string(in_h) + "x" +
               std::to_string(in_w) + " image (" + std::to_string(scratch_bytes) + " bytes, needs " +
               std::to_string(p.bytes) +
               "); size it with preprocess_scratch_bytes() for the largest image you accept";
    if (reinterpret_cast<uintptr_t>(scratch) % alignof(double) != 0)
        return "preprocess_image: scratch must be 8-byte aligned";
    const ImageLayout& L = p.lay;
    uint8_t* base        = static_cast<uint8_t*>(scratch);
    double* wtmp         = reinterpret_cast<double*>(base + p.off_wtmp);

    int prec_h = 0, prec_v = 0;
    const int16_t* kh = nullptr;
    const int32_t* bh = nullptr;
    uint8_t* row      = nullptr; // [out_w, 3] one horizontally resampled row
    if (p.need_h) {
        prec_h = build_axis(p.ah, reinterpret_cast<int16_t*>(base + p.off_kh),
                            reinterpret_cast<int32_t*>(base + p.off_bh), wtmp);
        kh     = reinterpret_cast<const int16_t*>(base + p.off_kh);
        bh     = reinterpret_cast<const int32_t*>(base + p.off_bh);
        row    = base + p.off_row;
    }
    // Input row r after the horizontal pass, in buf [out_w, 3] (the input row itself without one).
    auto hrow = [&](int r, uint8_t* buf) -> const uint8_t* {
        const uint8_t* src = rgb + size_t(r) * in_w * 3;
        if (!p.need_h) return src;
        resample_row(src, buf, p.ah, kh, bh, prec_h);
        return buf;
    };
    float lut[256];
    const float inv255 = float(1.0 / 255.0); // HF: uint8 tensor * (1/255) in float32
    for (int v = 0; v < 256; ++v)
        lut[v] = float(v) * inv255;
    const int seg     = patch * 3; // one patch row: patch pixels x 3 channels
    int32_t* kvbounds = nullptr;
    int16_t* kv       = nullptr;
    if (p.need_v) {
        kvbounds = reinterpret_cast<int32_t*>(base + p.off_bv);
        kv       = reinterpret_cast<int16_t*>(base + p.off_kv);
        prec_v   = build_axis(p.av, kv, kvbounds, wtmp);
    }
    const int32_t half = p.need_v ? int32_t(1) << (prec_v - 1) : 0;

    // Output rows [y0, y1) with the row buffer buf. The vertical pass accumulates in int32 in place of the
    // output floats (same slot per pixel and channel), one horizontally resampled input row at a time: exact
    // integer sums, so neither the order nor the split into row blocks changes a bit.
    auto rows = [&](int y0, int y1, uint8_t* buf) {
        if (!p.need_v) {
            for (int y = y0; y < y1; ++y) {
                const uint8_t* src = hrow(y, buf);
                for (int gx = 0; gx < L.grid_w; ++gx) {
                    float* dst       = patches + patch_index(L, patch, y, gx * patch);
                    const uint8_t* s = src + size_t(gx) * seg;
                    for (int j = 0; j < seg; ++j)
                        dst[j] = lut[s[j]];
                }
            }
            return;
        }
        int r0 = in_h, r1 = 0; // input rows the block's windows cover
        for (int y = y0; y < y1; ++y) {
            r0 = std::min(r0, kvbounds[2 * y]);
            r1 = std::max(r1, kvbounds[2 * y] + kvbounds[2 * y + 1]);
            for (int gx = 0; gx < L.grid_w; ++gx) {
                float* dst = patches + patch_index(L, patch, y, gx * patch);
                for (int j = 0; j < seg; ++j)
                    std::memcpy(dst + j, &half, sizeof half);
            }
        }
        int lo = y0; // first output row of the block whose window has not ended before input row r
        for (int r = r0; r < r1; ++r) {
            while (lo < y1 && kvbounds[2 * lo] + kvbounds[2 * lo + 1] <= r)
                ++lo;
            const uint8_t* src = nullptr;
            for (int y = lo; y < y1 && kvbounds[2 * y] <= r; ++y) {
                if (r >= kvbounds[2 * y] + kvbounds[2 * y + 1]) continue;
                const int32_t w = kv[size_t(y) * p.av.kmax + (r - kvbounds[2 * y])];
                if (w == 0) continue;
                if (!src) src = hrow(r, buf);
                for (int gx = 0; gx < L.grid_w; ++gx) {
                    float* dst       = patches + patch_index(L, patch, y, gx * patch);
                    const uint8_t* s = src + size_t(gx) * seg;
                    for (int j = 0; j < seg; ++j) {
                        int32_t acc;
                        std::memcpy(&acc, dst + j, sizeof acc);
                        acc += w * int32_t(s[j]);
                        std::memcpy(dst + j, &acc, sizeof acc);
                    }
                }
            }
        }
        for (int y = y0; y < y1; ++y)
            for (int gx = 0; gx < L.grid_w; ++gx) {
                float* dst = patches + patch_index(L, patch, y, gx * patch);
                for (int j = 0; j < seg; ++j) {
                    int32_t acc;
                    std::memcpy(&acc, dst + j, sizeof acc);
                    dst[j] = lut[clamp_u8(acc >> prec_v)];
                }
            }
    };
    // With a pool: blocks of output rows, each thread resampling into its own row buffer (input rows shared
    // by two blocks' windows are resampled twice). Without: one block, the scratch's row buffer.
    const int threads      = ctx && ctx->pool ? ctx->pool->size() : 1;
    const size_t row_bytes = size_t(L.out_w) * 3;
    if (threads > 1 && ctx->scratch && ctx->scratch_stride * sizeof(float) >= row_bytes &&
        L.out_h >= 2 * threads) {
        const int blocks = std::min(L.out_h, 4 * threads);
        ctx->pool->parallel_for(blocks, [&](int64_t b, int th) {
            rows(int(b * L.out_h / blocks), int((b + 1) * L.out_h / blocks),
                 reinterpret_cast<uint8_t*>(ctx->thread_scratch(th)));
        });
    } else {
        rows(0, L.out_h, row);
    }
    for (int i = 0; i < L.n_patches; ++i) {
        pos[2 * i]     = i % L.grid_w;
        pos[2 * i + 1] = i / L.grid_w;
    }
    *layout = L;
    return "";
}

size_t preprocess_thread_floats(int max_soft_tokens, int patch, int pool) {
    return (size_t(max_soft_tokens) * patch * pool * 3 + 3) /
           4; // one row of the widest output (max_side x 3 bytes)
}

size_t preprocess_reserve_bytes(int64_t max_in_pixels, int max_soft_tokens, int patch, int pool) {
    return std::min(preprocess_scratch_bytes(max_in_pixels, max_soft_tokens, patch, pool),
                    kPreprocessReserveCap);
}

} // namespace g4::towers
