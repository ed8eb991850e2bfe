// The NF4 x int16 GEMV (MatmulArgs::int16_x, kernels/q16.h) without a namespace of its own: gemv_int16.cpp
// includes it once per variant, each time in its own namespace, with G4_INT16_VNNI 0 or 1 (vpdpwssd, AVX-512
// VNNI, in place of pmaddwd + paddd: the same integer sums). No include guard, by design.
//
// x is quantized once per matmul into thread 0's scratch, each 64-element block reordered (kIntOrder) to the
// order in which the level's kernel unpacks a block of codes into int16 codebook values: AVX-512 widens the
// 32 code bytes to words and looks the high nibbles (elements 0, 2, .., 62) and the low ones up with vpermw;
// AVX2 looks nibbles up as the low and high bytes of the values (vpshufb) and interleaves them
// (vpunpck{l,h}bw, which take bytes 0-7 and 16-23, or 8-15 and 24-31). pmaddwd multiplies and adds pairs;
// each block's int32 lanes are converted and scaled by absmax * amax / (8191 * 4096) into fp32
// accumulators (two per row, alternate blocks, so that consecutive blocks do not wait on one FMA). AVX-512
// computes the factors 16 blocks at a time into a stack array and broadcasts them from memory (the same
// floats; docs/performance.md "CPU" has the measurement). Advanced SIMD (aarch64): gemv_int16_neon.h.

struct IntOrder {
    int e[nf4::kBlock];
    constexpr IntOrder() : e() {
        for (int i = 0; i < nf4::kBlock; ++i) {
#if defined(__AVX2__) && !defined(__AVX512BW__)
            const int seg = i / 16, j = i % 16, byte = (j < 8 ? j : j + 8) + (seg % 2 ? 8 : 0);
            e[i] = 2 * byte + (seg >= 2);
#else
            e[i] = i < 32 ? 2 * i : 2 * (i - 32) + 1;
#endif
        }
    }
};
constexpr IntOrder kIntOrder;

struct IntX {
    const int16_t* q; // [rows, K] reordered blocks
    const float* sx;  // [rows, K / 64]: amax / (8191 * 4096)
    int64_t nb;       // blocks per row
    IntX rows_from(int r) const { return {q + 64 * nb * r, sx + nb * r, nb}; }
};

IntX quantize_x(const MatmulArgs& a, float* scratch) {
    const int64_t nb = a.k / q16::kBlock;
    int16_t* q       = (int16_t*)scratch;
    float* sx        = (float*)(q + (int64_t)a.rows * a.k);
    alignas(64) int16_t tmp[q16::kBlock];
#if defined(__AVX512BW__)
    // kIntOrder as two vpermt2w index vectors into tmp (lo: elements 0-31, hi: 32-63): its first half (the
    // even elements) and, one higher each, its second half (the odd ones).
    alignas(64) static constexpr std::array<uint16_t, 32> kEven = [] {
        std::array<uint16_t, 32> v{};
        for (int i = 0; i < 32; ++i)
            v[i] = (uint16_t)kIntOrder.e[i];
        return v;
    }();
    static_assert(
        [] {
            for (int i = 0; i < 32; ++i)
                if (kEven[i] > 62 || kIntOrder.e[32 + i] != kEven[i] + 1) return false;
            return true;
        }(),
        "the odd indices are the even ones + 1, all within the 64 elements of lo and hi");
    const __m512i even = _mm512_load_si512(kEven.data()), odd = _mm512_add_epi16(even, _mm512_set1_epi16(1));
#endif
    for (int t = 0; t < a.rows; ++t)
        for (int64_t b = 0; b < nb; ++b) {
            const int64_t xb = t * nb + b;
            sx[xb]           = q16::quantize_block(a.x + t * a.ldx + b * q16::kBlock, tmp);
#if defined(__AVX512BW__)
            const __m512i lo = _mm512_load_si512(tmp), hi = _mm512_load_si512(tmp + 32);
            _mm512_storeu_si512(q + 64 * xb, _mm512_permutex2var_epi16(lo, even, hi));
            _mm512_storeu_si512(q + 64 * xb + 32, _mm512_permutex2var_epi16(lo, odd, hi));
#else
            for (int i = 0; i < q16::kBlock; ++i)
                q[64 * xb + i] = tmp[kIntOrder.e[i]];
#endif
        }
    return {q, sx, nb};
}

#if defined(__AVX512BW__)
template <int R, bool DQ> void int_blocks(const Nf4Blob& w, int64_t b0, const IntX& x, float* out) {
    const uint8_t* codes = w.codes + b0 * (nf4::kBlock / 2);
    const __m512i lut    = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i*)q16::kNf4Int16.v));
    const __m512i m4     = _mm512_set1_epi16(15);
    __m512 acc0[R], acc1[R];
    for (int t = 0; t < R; ++t)
        acc0[t] = acc1[t] = _mm512_setzero_ps();
    alignas(64) float f[R][16]; // the next 16 blocks' factors s * sx (broadcast from memory)
    int64_t i0 = 0;
    auto block = [&](int64_t i, __m512* acc) {
        const uint8_t* c = codes + 32 * i;
        if ((i & 1) == 0) _mm_prefetch((const char*)c + kPrefetchBytes, _MM_HINT_T0);
        const __m512i v  = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)c));
        const __m512i wh = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), lut);
        const __m512i wl = _mm512_permutexvar_epi16(_mm512_and_si512(v, m4), lut);
        for (int t = 0; t < R; ++t) {
            const int16_t* xq = x.q + 64 * (t * x.nb + i);
#if G4_INT16_VNNI // the same exact int32 sums: at most 4 products a lane, < 2^31
            const __m512i d = _mm512_dpwssd_epi32(_mm512_madd_epi16(wh, _mm512_loadu_si512(xq)), wl,
                                                  _mm512_loadu_si512(xq + 32));
#else
            const __m512i d = _mm512_add_epi32(_mm512_madd_epi16(wh, _mm512_loadu_si512(xq)),
                                               _mm512_madd_epi16(wl, _mm512_loadu_si512(xq + 32)));
#endif
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_set1_ps(f[t][i - i0]), acc[t]);
        }
    };
    for (; i0 < x.nb; i0 += 16) {
        const int m = (int)std::min<int64_t>(16, x.nb - i0);
        for (int j = 0; j < m; ++j) {
            const float s = w.scale<DQ>(b0 + i0 + j);
            for (int t = 0; t < R; ++t)
                f[t][j] = s * x.sx[t * x.nb + i0 + j];
        }
        int j = 0;
        for (; j + 1 < m; j += 2) {
            block(i0 + j, acc0);
            block(i0 + j + 1, acc1);
        }
        if (j < m) block(i0 + j, acc0);
    }
    for (int t = 0; t < R; ++t)
        out[t] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t]));
}
#elif defined(__AVX2__)
struct Nf4Int16Bytes { // kNf4Int16 as its low and high bytes
    uint8_t lo[16], hi[16];
    constexpr Nf4Int16Bytes() : lo(), hi() {
        for (int c = 0; c < 16; ++c)
            lo[c] = (uint8_t)((uint16_t)q16::kNf4Int16.v[c] & 0xFF),
            hi[c] = (uint8_t)((uint16_t)q16::kNf4Int16.v[c] >> 8);
    }
};
constexpr Nf4Int16Bytes kNf4Int16Bytes;

template <int R, bool DQ> void int_blocks(const Nf4Blob& w, int64_t b0, const IntX& x, float* out) {
    const uint8_t* codes = w.codes + b0 * (nf4::kBlock / 2);
    const __m256i lo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)kNf4Int16Bytes.lo));
    const __m256i hi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)kNf4Int16Bytes.hi));
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256 acc0[R], acc1[R];
    for (int t = 0; t < R; ++t)
        acc0[t] = acc1[t] = _mm256_setzero_ps();
    auto block = [&](int64_t i, __m256* acc) {
        const uint8_t* c = codes + 32 * i;
        if ((i & 1) == 0) _mm_prefetch((const char*)c + kPrefetchBytes, _MM_HINT_T0);
        const __m256i v = _mm256_loadu_si256((const __m256i*)c);
        const __m256i h = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), l = _mm256_and_si256(v, m4);
        const __m256i hl = _mm256_shuffle_epi8(lo, h), hh = _mm256_shuffle_epi8(hi, h);
        const __m256i ll = _mm256_shuffle_epi8(lo, l), lh = _mm256_shuffle_epi8(hi, l);
        const __m256i w0 = _mm256_unpacklo_epi8(hl, hh), w1 = _mm256_unpackhi_epi8(hl, hh);
        const __m256i w2 = _mm256_unpacklo_epi8(ll, lh), w3 = _mm256_unpackhi_epi8(ll, lh);
        const float s = w.scale<DQ>(b0 + i);
        for (int t = 0; t < R; ++t) { // 8 products a lane: at most 8 * 8191 * 4096 < 2^31
            const int64_t xb = t * x.nb + i;
            const __m256i* xq = (const __m256i*)(x.q + 64 * xb);
            const __m256i d01 = _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(xq)),
                                                 _mm256_madd_epi16(w1, _mm256_loadu_si256(xq + 1)));
            const __m256i d23 = _mm256_add_epi32(_mm256_madd_epi16(w2, _mm256_loadu_si256(xq + 2)),
                                                 _mm256_madd_epi16(w3, _mm256_loadu_si256(xq + 3)));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(d01, d23)),
                                     _mm256_set1_ps(s * x.sx[xb]), acc[t]);
        }
    };
    int64_t i = 0;
    for (; i + 1 < x.nb; i += 2) {
        block(i, acc0);
        block(i + 1, acc1);
    }
    if (i < x.nb) block(i, acc0);
    for (int t = 0; t < R; ++t) {
        const __m256 v = _mm256_add_ps(acc0[t], acc1[t]);
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        out[t] = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
    }
}
#elif defined(__ARM_NEON)
#include "kernels/cpu/gemv_int16_neon.h"
#else
template <int R, bool DQ> void int_blocks(const Nf4Blob& w, int64_t b0, const IntX& x, float* out) {
    float acc[R] = {};
    for (int64_t i = 0; i < x.nb; ++i) {
        const uint8_t* codes = w.codes + (b0 + i) * (nf4::kBlock / 2);
        const float s        = w.scale<DQ>(b0 + i);
        for (int t = 0; t < R; ++t) {
            const int64_t xb  = t * x.nb + i;
            const int16_t* xq = x.q + 64 * xb;
            int64_t d         = 0;
            for (int j = 0; j < 32; ++j)
                d += (int32_t)q16::kNf4Int16.v[codes[j] >> 4] * xq[j] +
                     (int32_t)q16::kNf4Int16.v[codes[j] & 15] * xq[32 + j];
            acc[t] += (float)d * (s * x.sx[xb]);
        }
    }
    for (int t = 0; t < R; ++t)
        out[t] = acc[t];
}
#endif

template <bool DQ>
void int_columns(const MatmulArgs& a, const Nf4Blob& w, const IntX& x, int64_t n0, int64_t n1) {
    float out[q16::kMaxRows];
    for (int64_t n = n0; n < n1; ++n) {
        const int64_t b0 = n * x.nb;
        for (int r0 = 0; r0 < a.rows; r0 += kGemvGroupRows) {
            const IntX xr = x.rows_from(r0);
            switch (std::min(kGemvGroupRows, a.rows - r0)) {
            case 1:
                int_blocks<1, DQ>(w, b0, xr, out + r0);
                break;
            case 2:
                int_blocks<2, DQ>(w, b0, xr, out + r0);
                break;
            case 3:
                int_blocks<3, DQ>(w, b0, xr, out + r0);
                break;
            default:
                int_blocks<4, DQ>(w, b0, xr, out + r0);
                break;
            }
        }
        for (int t = 0; t < a.rows; ++t)
            a.y[t * a.ldy + n] = out[t];
    }
}

void run(const Context& c, const MatmulArgs& a) {
    const nf4::Layout l = nf4::layout(a.n * a.k, a.nf4_double_quant);
    const Nf4Blob w((const uint8_t*)a.w, l);
    const IntX x        = quantize_x(a, c.thread_scratch(0));
    const int64_t tiles = (a.n + kGemvTileRows - 1) / kGemvTileRows;
    auto tile           = [&](int64_t t) {
        const int64_t n0 = t * kGemvTileRows, n1 = std::min<int64_t>(a.n, n0 + kGemvTileRows);
        if (l.double_quant)
            int_columns<true>(a, w, x, n0, n1);
        else
            int_columns<false>(a, w, x, n0, n1);
    };
    if (a.n * a.k < kGemvInlineElems)
        for (int64_t t = 0; t < tiles; ++t)
            tile(t);
    else
        c.pool->parallel_for(tiles, [&](int64_t t, int) { tile(t); });
}
