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
