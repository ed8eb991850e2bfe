// Integer activations for NF4 matrix-vector products (MatmulArgs::int16_x), shared by the reference and the
// CPU kernels so that every tier quantizes x to the same values.
//
// x is quantized per block of 64 elements (the NF4 block): q = round_half_even(x * 8191 / amax), amax the
// block's largest |x|, so |q| <= 8191; the NF4 codebook is mapped to int16 as round(codebook * 4096)
// (kNf4Int16, |value| <= 4096). A block's product is one exact integer dot product of the codes' int16 values
// with q: its 64 products sum to less than 2^31, so an int32 lane may hold a whole block (the prefill GEMM's
// register tiles do). It is scaled by absmax * amax / (8191 * 4096) in float32, and the blocks' terms are
// summed in float32. The roundings are below 2^-13 of the block's largest value: about 3e-4 relative error a
// matmul (1.0-1.3e-3 in the tiny fixtures' logits), where int8 (x at 1/127 of amax, the codebook at 1/127)
// gives ~8.5e-3, which the random-weight fixtures amplify to 4-7e-2 in the logits.
#pragma once
#include "kernels/nf4.h"

#include <cmath>
#include <cstdint>

namespace g4::q16 {

inline constexpr int kBlock   = nf4::kBlock; // x's quantization block: one NF4 block
inline constexpr int kMaxRows = 8;           // int16_x matmuls take at most this many rows (decode steps)
inline constexpr float kXMax  = 8191.0f;     // largest |q| of x
inline constexpr float kWMax  = 4096.0f;     // codebook scale
// A block's 64 products fit one int32 lane (the prefill GEMM sums a whole block there before converting).
static_assert((double)kBlock * kXMax * kWMax < 2147483648.0,
              "a block's integer dot product must fit in int32");

constexpr int16_t round_code(float c) {
    return (int16_t)(c >= 0 ? (int)(c * kWMax + 0.5f) : -(int)(-c * kWMax + 0.5f));
}

// round(kCodebook[c] * kWMax).
struct Nf4Int16 {
    int16_t v[16];
    constexpr Nf4Int16() : v() {
        for (int c = 0; c < 16; ++c)
            v[c] = round_code(nf4::kCodebook[c]);
    }
};
inline constexpr Nf4Int16 kNf4Int16;

// Quantizes one block of kBlock floats into q; returns amax / (kXMax * kWMax), the factor that with the
// weight block's absmax turns the integer dot product into the block's float32 term. A block holding an
// infinity or NaN gives q = 0 and a NaN factor, so the outputs it reaches are NaN, as in float32. A block
// whose largest value is so small (subnormal) that kXMax / amax overflows gives q = 0: its term is below
// float32's resolution of any sum it joins.
inline float quantize_block(const float* x, int16_t* q) {
    float amax  = 0.0f;
    bool finite = true;
    for (int i = 0; i < kBlock; ++i) {
        const float v = std::fabs(x[i]);
        // A comparison, which inlines where std::fmax is a libm call a value; it leaves a NaN out of amax,
        // and `finite` decides such a block below.
        amax = v > amax ? v : amax;
        finite &= std::isfinite(x[i]);
    }
    float inv = finite && amax > 0.0f ? kXMax / amax : 0.0f;
    if (!std::isfinite(inv)) inv = 0.0f;
    for (int i = 0; i < kBlock; ++i)
        q[i] = (int16_t)(inv > 0.0f ? std::nearbyint(x[i] * inv) : 0.0f);
    return finite ? amax / (kXMax * kWMax) : NAN;
}

// True when a matmul with these arguments takes the integer path (else it is the float32 NF4 matmul).
inline bool applies(bool int16_x, bool nf4, int64_t k, int rows) {
    return int16_x && nf4 && k % kBlock == 0 && rows >= 1 && rows <= kMaxRows;
}

// ---- prefill GEMM (kernels/cpu/gemm_nf4.cpp)
// ---------------------------------------------------------------- True when a matmul of more than kMaxRows
// rows takes the integer path: x quantized per block as above, the same products, summed by
// cpu::matmul_nf4_gemm_int16.
inline bool applies_gemm(bool int16_x, bool nf4, int64_t k, int rows) {
    return int16_x && nf4 && k % kBlock == 0 && rows > kMaxRows;
}

} // namespace g4::q16
