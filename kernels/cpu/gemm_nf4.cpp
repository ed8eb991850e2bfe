// NF4 x int16 GEMM for prefill chunks (MatmulArgs::int16_x with more than q16::kMaxRows rows; see cpu.h): the
// same integer arithmetic as the GEMV of kernels/q16.h, register-blocked over many rows.
//
// x is quantized once per matmul (q16::quantize_block's values and scales) into tiles of kTileRows rows laid
// out k-pair by k-pair: dword r of pair p holds q[r][2p] (low half) and q[r][2p + 1] (high half), so that one
// vector holds one k-pair of kTileRows / lanes rows. A code byte is one k-pair of one weight row (high nibble
// element 2p, low nibble 2p + 1, kernels/nf4.h), and kPairs maps it to the matching dword of int16 codebook
// values, which is broadcast to every lane: pmaddwd (or AVX-512 VNNI vpdpwssd) multiplies both halves and
// adds them into the row's int32 lane. No weight panel is decoded; the codes are read in place.
//
// A lane sums one whole 64-element block exactly in int32 (64 products of |q| <= 8191 and |code| <= 4096 stay
// below 2^31), which is converted once and scaled by absmax * amax / (8191 * 4096) into the fp32 sum in
// `out`. The micro-kernel holds kCols columns x 2 vectors of int32 block sums in registers. Each output is
// one tile lane's sum over the blocks in k order, computed by one task whatever the thread count or the row
// count. A task is a group of columns of every tile, or of one tile and fewer columns for matmuls of few
// columns (so that they spread over the pool).
#include "kernels/cpu/level.h"
#include "kernels/cpu/nf4_blob.h"
#include "kernels/cpu/simd.h"
#include "kernels/nf4.h"
#include "kernels/q16.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace g4::cpu::G4_CPU_NS {

namespace {

constexpr int kTaskCols = 16; // output columns per task

// The dword of int16 codebook values for one code byte: element 2p (high nibble) low, 2p + 1 high.
struct PairTable {
    int32_t v[256];
    constexpr PairTable() : v() {
        for (int b = 0; b < 256; ++b)
            v[b] = (int32_t)(uint32_t)(uint16_t)q16::kNf4Int16.v[b >> 4] |
                   (int32_t)((uint32_t)(uint16_t)q16::kNf4Int16.v[b & 15] << 16);
    }
};
constexpr PairTable kPairs;

using gemv::load_f32;
using Blob = gemv::Nf4Blob;

// ---- vector types: one lane per row of a tile -------------------------------------------------------------
#if defined(__AVX512BW__)
struct V {
    static constexpr int kLanes = 16;
    using I                     = __m512i;
    using F                     = __m512;
    static I izero() { return _mm512_setzero_si512(); }
    static F fzero() { return _mm512_setzero_ps(); }
    static I iload(const int32_t* p) { return _mm512_loadu_si512(p); }
    static F fload(const float* p) { return _mm512_loadu_ps(p); }
    static I ibcast(int32_t v) { return _mm512_set1_epi32(v); }
    static F fbcast(float v) { return _mm512_set1_ps(v); }
    static I madd(I acc, I x, I w) { return _mm512_add_epi32(acc, _mm512_madd_epi16(x, w)); }
    static I vnni(I acc, I x, I w) {
        asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(w)); // AVX512_VNNI, checked at run time
        return acc;
    }
    static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
    static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
    static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
    static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
};
constexpr int kTileRows = 2 * V::kLanes;
constexpr int kCols     = 8; // columns per micro-kernel
#elif defined(__AVX2__)
struct V {
    static constexpr int kLanes = 8;
    using I                     = __m256i;
    using F                     = __m256;
    static I izero() { return _mm256_setzero_si256(); }
    static F fzero() { return _mm256_setzero_ps(); }
    static I iload(const int32_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
    static F fload(const float* p) { return _mm256_loadu_ps(p); }
    static I ibcast(int32_t v) { return _mm256_set1_epi32(v); }
    static F fbcast(float v) { return _mm256_set1_ps(v); }
    static I madd(I acc, I x, I w) { return _mm256_add_epi32(acc, _mm256_madd_epi16(x, w)); }
    static I vnni(I acc, I x, I w) { return madd(acc, x, w); }
    static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
    static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
    static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
    static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
};
constexpr int kTileRows = 2 * V::kLanes;
constexpr int kCols     = 4;
#else
constexpr int kTileRows = 16;
constexpr int kCols     = 1;
#endif

bool has_vnni() {
#if defined(__AVX512BW__) && defined(__x86_64__)
    static const bool v = [] {
        unsigned a, b, c, d;
        return __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((c >> 11) & 1u); // leaf 7 ECX 11: AVX512_VNNI
    }();
    return v;
#else
    return false;
#endif
}

// x quantized: tile t holds pairs [t][p][kTileRows] (int32) and scales [t][b][kTileRows] (float).
struct QX {
    int32_t* pairs;
    float* scales;
    int64_t kp, nb; // k-pairs and blocks per row
    const int32_t* tile_pairs(int64_t t) const { return pairs + t * kp * kTileRows; }
    const float* tile_scales(int64_t t) const { return scales + t * nb * kTileRows; }
};

// q16::quantize_block with vector instructions, the same values: amax is the largest |x| (exact), q =
// round-to-nearest-even(x * inv) (cvtps2dq under the default rounding, as std::nearbyint), and a block with
// an infinity or NaN, or an amax whose inverse overflows, gives q = 0.
float quantize_block(const float* x, int16_t* q) {
#if defined(__AVX512BW__)
    __m512 v[4], m = _mm512_setzero_ps();
    __mmask16 fin = 0xFFFF;
    for (int i = 0; i < 4; ++i) {
        v[i]           = _mm512_loadu_ps(x + 16 * i);
        const __m512 a = _mm512_abs_ps(v[i]);
        fin &= _mm512_cmp_ps_mask(a, _mm512_set1_ps(INFINITY), _CMP_LT_OQ);
        m = _mm512_max_ps(m, a);
    }
    if (fin != 0xFFFF) return q16::quantize_block(x, q);
    const float amax = _mm512_reduce_max_ps(m);
    float inv        = amax > 0.0f ? q16::kXMax / amax : 0.0f;
    if (!std::isfinite(inv)) inv = 0.0f;
    for (int i = 0; i < 4; ++i)
        _mm256_storeu_si256((__m256i*)(q + 16 * i), _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(
                                                        _mm512_mul_ps(v[i], _mm512_set1_ps(inv)))));
    return amax / (q16::kXMax * q16::kWMax);
#elif defined(__AVX2__)
    const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);
    __m256 v[8], m                                 = _mm256_setzero_ps();
    int fin = 0xFF;
    for (int i = 0; i < 8; ++i) {
            v[i]           = _mm256_loadu_ps(x + 8 * i);
            const __m256 a = _mm256_andnot_ps(sign, v[i]);
            fin &= _mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_LT_OQ));
            m = _mm256_max_ps(m, a);
    }
    if (fin != 0xFF) return q16::quantize_block(x, q);
    __m128 h         = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h                = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h                = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    float inv        = amax > 0.0f ? q16::kXMax / amax : 0.0f;
    if (!std::isfinite(inv)) inv = 0.0f;
    const __m256 vi = _mm256_set1_ps(inv);
    for (int i = 0; i < 8; i += 2) {
            const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vi));
            const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(v[i + 1], vi));
            _mm256_storeu_si256((__m256i*)(q + 8 * i), _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8));
    }
    return amax / (q16::kXMax * q16::kWMax);
#else
    return q16::quantize_block(x, q);
#endif
}

// Blocks [b0, b1) of the kTileRows rows from r0 (zeros for rows >= a.rows) into tile t of qx. A task writes
// whole 64-byte lines of the tile: rows quantized by different threads would share every line.
void quantize_tile(const MatmulArgs& a, int r0, const QX& qx, int64_t t, int64_t b0, int64_t b1) {
    alignas(64) int16_t q[q16::kBlock];
    int32_t qp[q16::kBlock / 2];
    int32_t* pairs = qx.pairs + t * qx.kp * kTileRows;
    float* scales  = qx.scales + t * qx.nb * kTileRows;
    for (int lane = 0; lane < kTileRows; ++lane) {
        const int r = r0 + lane;
        for (int64_t b = b0; b < b1; ++b) {
            if (r < a.rows) {
                scales[b * kTileRows + lane] = quantize_block(a.x + (int64_t)r * a.ldx + b * q16::kBlock, q);
                std::memcpy(qp, q, sizeof q); // dword p: q[2p] low, q[2p + 1] high
            } else {
                scales[b * kTileRows + lane] = 0.0f;
                std::memset(qp, 0, sizeof qp);
            }
            for (int p = 0; p < q16::kBlock / 2; ++p)
                pairs[(b * (q16::kBlock / 2) + p) * kTileRows + lane] = qp[p];
        }
    }
}

#if defined(__AVX512BW__) || defined(__AVX2__)
// out[c][kTileRows] = columns n0 .. n0 + NC of one tile.
template <int NC, bool DQ, bool VNNI>
void micro(const Blob& w, int64_t n0, const QX& qx, int64_t t, float* out) {
    using I           = typename V::I;
    using F           = typename V::F;
    const int32_t* xp = qx.tile_pairs(t);
    const float* sx   = qx.tile_scales(t);
    const uint8_t* codes[NC];
    for (int c = 0; c < NC; ++c)
        codes[c] = w.codes + (n0 + c) * qx.kp;
    for (int c = 0; c < NC; ++c) {
        V::store(out + c * kTileRows, V::fzero());
        V::store(out + c * kTileRows + V::kLanes, V::fzero());
    }
    for (int64_t b = 0; b < qx.nb; ++b) {
        I isum[NC][2];
        for (int c = 0; c < NC; ++c)
            isum[c][0] = isum[c][1] = V::izero();
        for (int j = 0; j < q16::kBlock / 2; ++j) {
            const int64_t p = b * (q16::kBlock / 2) + j;
            const I x0 = V::iload(xp + p * kTileRows), x1 = V::iload(xp + p * kTileRows + V::kLanes);
            for (int c = 0; c < NC; ++c) {
                const I wv = V::ibcast(kPairs.v[codes[c][p]]);
                if constexpr (VNNI) {
                    isum[c][0] = V::vnni(isum[c][0], x0, wv);
                    isum[c][1] = V::vnni(isum[c][1], x1, wv);
                } else {
                    isum[c][0] = V::madd(isum[c][0], x0, wv);
                    isum[c][1] = V::madd(isum[c][1], x1, wv);
                }
            }
        }
        const F s0 = V::fload(sx + b * kTileRows), s1 = V::fload(sx + b * kTileRows + V::kLanes);
        for (int c = 0; c < NC; ++c) {
            const F ws = V::fbcast(w.scale<DQ>((n0 + c) * qx.nb + b));
            float* o   = out + c * kTileRows;
            V::store(o, V::fma(V::cvt(isum[c][0]), V::mul(s0, ws), V::fload(o)));
            V::store(o + V::kLanes, V::fma(V::cvt(isum[c][1]), V::mul(s1, ws), V::fload(o + V::kLanes)));
        }
    }
}
#else
// The same sums lane by lane.
template <int NC, bool DQ, bool VNNI>
void micro(const Blob& w, int64_t n0, const QX& qx, int64_t t, float* out) {
    const int32_t* xp = qx.tile_pairs(t);
    const float* sx   = qx.tile_scales(t);
    for (int c = 0; c < NC; ++c) {
        const uint8_t* codes = w.codes + (n0 + c) * qx.kp;
        for (int l = 0; l < kTileRows; ++l) {
            float acc = 0.0f;
            for (int64_t b = 0; b < qx.nb; ++b) {
                int32_t isum = 0;
                for (int j = 0; j < q16::kBlock / 2; ++j) {
                    const int64_t p  = b * (q16::kBlock / 2) + j;
                    const int32_t xv = xp[p * kTileRows + l], wv = kPairs.v[codes[p]];
                    isum += (int32_t)(int16_t)(xv & 0xFFFF) * (int16_t)(wv & 0xFFFF) +
                            (int32_t)(int16_t)((uint32_t)xv >> 16) * (int16_t)((uint32_t)wv >> 16);
                }
                acc = std::fma((float)isum, sx[b * kTileRows + l] * w.scale<DQ>((n0 + c) * qx.nb + b), acc);
            }
            out[c * kTileRows + l] = acc;
        }
    }
}
#endif

// micro<nc> for a run-time nc in [1, NC].
template <int NC, bool DQ, bool VNNI>
void micro_n(int nc, const Blob& w, int64_t n0, const QX& qx, int64_t t, float* out) {
    if constexpr (NC > 1)
        if (nc < NC) return micro_n<NC - 1, DQ, VNNI>(nc, w, n0, qx, t, out);
    micro<NC, DQ, VNNI>(w, n0, qx, t, out);
}

// Columns [n0, n1) of tiles [t0, t1) of the pass of rows [r0, r0 + rows) from the tiles of qx.
template <bool DQ, bool VNNI>
void columns(const MatmulArgs& a, const Blob& w, const QX& qx, int r0, int rows, int64_t t0, int64_t t1,
             int64_t n0, int64_t n1) {
    alignas(64) float out[kCols * kTileRows];
    for (int64_t t = t0; t < t1; ++t) {
        const int lr = std::min(kTileRows, rows - (int)t * kTileRows);
        for (int64_t n = n0; n < n1; n += kCols) {
            const int nc = (int)std::min<int64_t>(kCols, n1 - n);
            micro_n<kCols, DQ, VNNI>(nc, w, n, qx, t, out);
            for (int l = 0; l < lr; ++l) {
                float* y = a.y + (int64_t)(r0 + t * kTileRows + l) * a.ldy + n;
                for (int c = 0; c < nc; ++c)
                    y[c] = out[c * kTileRows + l];
            }
        }
    }
}

} // namespace

void matmul_nf4_gemm_int16(const Context& c, const MatmulArgs& a) {
    const nf4::Layout l = nf4::layout(a.n * a.k, a.nf4_double_quant);
    const Blob w((const uint8_t*)a.w, l);
    const int64_t kp = a.k / 2, nb = a.k / q16::kBlock;
    // x's tiles go into the whole scratch of the pool (the kernel needs no other scratch); rows that do not
    // fit are run as further passes.
    const size_t tile_bytes = (size_t)kTileRows * ((size_t)kp * 4 + (size_t)nb * 4);
    const size_t have       = (size_t)c.pool->size() * c.scratch_stride * sizeof(float);
    const int64_t fit       = (int64_t)(have / tile_bytes);
    if (fit < 1) { // a Context sized for smaller matmuls: the GEMV's arithmetic, q16::kMaxRows rows a call
        for (int r = 0; r < a.rows; r += q16::kMaxRows) {
            MatmulArgs s = a;
            s.x += (int64_t)r * a.ldx, s.y += (int64_t)r * a.ldy,
                s.rows = std::min(q16::kMaxRows, a.rows - r);
            matmul(c, s);
        }
        return;
    }
    const int pass_rows  = (int)std::min<int64_t>(a.rows, fit * kTileRows);
    const int64_t ptiles = (pass_rows + kTileRows - 1) / kTileRows;
    const QX qx{(int32_t*)c.scratch, (float*)((int32_t*)c.scratch + ptiles * kp * kTileRows), kp, nb};
    const bool vnni = has_vnni();
    for (int r0 = 0; r0 < a.rows; r0 += pass_rows) {
        const int rows   = std::min(pass_rows, a.rows - r0);
        const int64_t nt = (rows + kTileRows - 1) / kTileRows;
        // a task: task_cols columns of every tile (the tiles share the columns' codes in cache), or, where
        // the matmul has few columns for the pool, of one tile, and narrower
        const int64_t want = 4 * (int64_t)c.pool->size();
        int64_t task_cols  = kTaskCols;
        const bool split   = (a.n + task_cols - 1) / task_cols < want;
        while (split && task_cols > kCols && nt * ((a.n + task_cols - 1) / task_cols) < want)
            task_cols /= 2;
        const int64_t col_tasks = (a.n + task_cols - 1) / task_cols;
        // x quantized by tile x range of blocks (the values do not depend on the split)
        const int64_t qb =
            std::clamp<int64_t>(nt * nb / (2 * (int64_t)c.pool->size()), 1, 16); // blocks per task
        const int64_t qtasks = (nb + qb - 1) / qb;
        const MatmulArgs ap  = [&] {
            MatmulArgs v = a;
            v.rows       = r0 + rows; // rows past the pass's end quantize to zeros
            return v;
        }();
        c.pool->parallel_for(nt * qtasks, [&](int64_t i, int) {
            const int64_t t = i / qtasks, b0 = i % qtasks * qb;
            quantize_tile(ap, r0 + (int)t * kTileRows, qx, t, b0, std::min(nb, b0 + qb));
        });
        c.pool->parallel_for((split ? nt : 1) * col_tasks, [&](int64_t task, int) {
            const int64_t t0 = split ? task / col_tasks : 0, t1 = split ? t0 + 1 : nt;
            const int64_t n0 = task % col_tasks * task_cols, n1 = std::min<int64_t>(a.n, n0 + task_cols);
            if (l.double_quant)
                vnni ? columns<true, true>(a, w, qx, r0, rows, t0, t1, n0, n1)
                     : columns<true, false>(a, w, qx, r0, rows, t0, t1, n0, n1);
            else
                vnni ? columns<false, true>(a, w, qx, r0, rows, t0, t1, n0, n1)
                     : columns<false, false>(a, w, qx, r0, rows, t0, t1, n0, n1);
        });
    }
}

} // namespace g4::cpu::G4_CPU_NS
