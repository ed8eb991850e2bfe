// The SIMD preamble of the sources compiled once per instruction-set level (kernels/CMakeLists.txt): the
// intrinsics the target has (x86: immintrin.h, whose functions beyond the level's flags only compile under a
// function-level target; aarch64: arm_neon.h, Advanced SIMD, and with __ARM_FEATURE_DOTPROD the dot product
// instructions), and GCC's false -Wmaybe-uninitialized turned off for the rest of the source (GCC 12 flags
// its own AVX-512 intrinsic headers, _mm512_undefined_* self-initialisation, when inlined, and Eigen's reads
// of stack buffers the kernels fill).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#if defined(__AVX512F__) && defined(G4_CPU_NS)
namespace g4::cpu::G4_CPU_NS {
// 16 floats -> 16 bf16, round to nearest even exactly as f32_to_bf16 (denormals kept, NaN quieted).
inline __m256i to_bf16x16(__m512 x) {
    const __m512i u   = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                  _mm512_set1_epi32(0x7F800000));
    r                   = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}
} // namespace g4::cpu::G4_CPU_NS
#endif
