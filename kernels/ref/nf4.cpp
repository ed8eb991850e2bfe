// NF4 blob layout and dequantization (see kernels/nf4.h). The dequant loop runs inside every NF4 matmul:
// per 64-element block it builds the 16 scaled code values once (codebook[c] * absmax, the exact fp32
// products bitsandbytes computes), then maps each packed byte to two of them (AVX-512 / AVX2 permutes
// when the build targets them, a scalar table lookup otherwise; all three give identical bits).
#include "kernels/nf4.h"

#include <algorithm>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 flags its own AVX-512 intrinsic headers (_mm512_undefined_* self-initialisation) when inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace g4::nf4 {
G4_NF4_LEVEL_BEGIN

namespace {

constexpr uint64_t align16(uint64_t v) {
    return (v + 15) & ~uint64_t(15);
}

inline float load_f32(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, sizeof f);
    return f;
}

// Decodes `nbytes` packed bytes (2 * nbytes elements, high nibble first) of one block with scale s.
inline void decode_block_bytes(const uint8_t* src, int64_t nbytes, float s, float* out) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 lut   = _mm512_mul_ps(_mm512_loadu_ps(kCodebook), _mm512_set1_ps(s));
    const __m512i sh   = _mm512_setr_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
    const __m512i mask = _mm512_set1_epi32(15);
    // 16 bytes -> 32 values: even elements (high nibbles) and odd ones (low nibbles) looked up separately,
    // then interleaved
    const __m512i ilo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i ihi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (; i + 16 <= nbytes; i += 16) {
        __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(src + i)));
        __m512 ev = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut);
        __m512 od = _mm512_permutexvar_ps(_mm512_and_si512(v, mask), lut);
        _mm512_storeu_ps(out + 2 * i, _mm512_permutex2var_ps(ev, ilo, od));
        _mm512_storeu_ps(out + 2 * i + 16, _mm512_permutex2var_ps(ev, ihi, od));
    }
    for (; i + 8 <= nbytes; i += 8) {
        __m128i b = _mm_loadl_epi64((const __m128i*)(src + i));
        b         = _mm_unpacklo_epi8(b, b); // b0 b0 b1 b1 ... b7 b7
        __m512i v = _mm512_and_si512(_mm512_srlv_epi32(_mm512_cvtepu8_epi32(b), sh), mask);
        _mm512_storeu_ps(out + 2 * i, _mm512_permutexvar_ps(v, lut));
    }
#elif defined(__AVX2__)
    const __m256 vs    = _mm256_set1_ps(s);
    const __m256 lut0  = _mm256_mul_ps(_mm256_loadu_ps(kCodebook), vs);
    const __m256 lut1  = _mm256_mul_ps(_mm256_loadu_ps(kCodebook + 8), vs);
    const __m256i sh   = _mm256_setr_epi32(4, 0, 4, 0, 4, 0, 4, 0);
    const __m256i mask = _mm256_set1_epi32(15);
    for (; i + 4 <= nbytes; i += 4) {
        int32_t w;
        std::memcpy(&w, src + i, 4);
        __m128i b  = _mm_cvtsi32_si128(w);
        b          = _mm_unpacklo_epi8(b, b);
        __m256i v  = _mm256_and_si256(_mm256_srlv_epi32(_mm256_cvtepu8_epi32(b), sh), mask);
        __m256 lo  = _mm256_permutevar8x32_ps(lut0, v); // uses index bits 0..2
        __m256 hi  = _mm256_permutevar8x32_ps(lut1, v);
        __m256 sel = _mm256_castsi256_ps(_mm256_slli_epi32(v, 28)); // index bit 3 -> sign bit
        _mm256_storeu_ps(out + 2 * i, _mm256_blendv_ps(lo, hi, sel));
    }
#endif
    if (i < nbytes) {
        float lut[16];
        for (int c = 0; c < 16; ++c)
            lut[c] = kCodebook[c] * s;
        for (; i < nbytes; ++i) {
            uint8_t b      = src[i];
            out[2 * i]     = lut[b >> 4];
            out[2 * i + 1] = lut[b & 15];
        }
    }
}

} // namespace

Layout layout(int64_t n, bool double_quant) {
    Layout l;
    if (n < 0) n = 0;
    l.n            = n;
    l.nblocks      = (n + kBlock - 1) / kBlock;
    l.double_quant = double_quant;
    l.codes_off    = 0;
    l.codes_bytes  = (uint64_t)(n + 1) / 2;
    l.absmax_off   = align16(l.codes_bytes);
    if (!double_quant) {
        l.total = l.absmax_off + 4 * (uint64_t)l.nblocks;
        return l;
    }
    l.nblocks2    = (l.nblocks + kBlock2 - 1) / kBlock2;
    l.absmax2_off = align16(l.absmax_off + (uint64_t)l.nblocks);
    l.offset_off  = l.absmax2_off + 4 * (uint64_t)l.nblocks2;
    l.code2_off   = align16(l.offset_off + 4);
    l.total       = l.code2_off + 4 * 256;
    return l;
}

float block_absmax(const uint8_t* blob, const Layout& l, int64_t b) {
    if (!l.double_quant) return load_f32(blob + l.absmax_off + 4 * (uint64_t)b);
    uint8_t q = blob[l.absmax_off + (uint64_t)b];
    return mul_then_add(load_f32(blob + l.code2_off + 4 * (uint64_t)q),
                        load_f32(blob + l.absmax2_off + 4 * (uint64_t)(b / kBlock2)),
                        load_f32(blob + l.offset_off));
}

float element(const uint8_t* blob, const Layout& l, int64_t i) {
    uint8_t byte = blob[l.codes_off + (uint64_t)(i >> 1)];
    int c        = (i & 1) ? (byte & 15) : (byte >> 4);
    return kCodebook[c] * block_absmax(blob, l, i / kBlock);
}

void dequantize(const uint8_t* blob, const Layout& l, int64_t start, int64_t count, float* out) {
    const uint8_t* codes = blob + l.codes_off;
    int64_t i = start, end = start + count;
    while (i < end) {
        int64_t b    = i / kBlock;
        int64_t bend = std::min<int64_t>(end, (b + 1) * kBlock);
        float s      = block_absmax(blob, l, b);
        if (i & 1) { // only possible at the start of the range: blocks start on even elements
            *out++ = kCodebook[codes[i >> 1] & 15] * s;
            ++i;
        }
        int64_t nbytes = (bend - i) >> 1;
        decode_block_bytes(codes + (i >> 1), nbytes, s, out);
        out += 2 * nbytes;
        i += 2 * nbytes;
        if (i < bend) { // odd end of the range (or of an odd-length tensor)
            *out++ = kCodebook[codes[i >> 1] >> 4] * s;
            ++i;
        }
    }
}

G4_NF4_LEVEL_END
} // namespace g4::nf4
