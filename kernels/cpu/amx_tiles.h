// Pieces the AMX kernels share (gemm_bf16_amx.cpp, gemm_nf4_amx.cpp): the tile configuration, a 16 x 16
// dword transpose in registers, bf16 pairs from fp32 (clamped where asked) or bf16 rows, and a 32 x 32 block
// of y on four fp32 tiles. Included by level sources of the AMX table only (G4_CPU_AMX_TABLE,
// kernels/cpu/level.h).
#pragma once
#include "kernels/cpu/level.h"
#include "kernels/cpu/simd.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#if defined(G4_CPU_AMX_TABLE)

#define G4_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512bf16")))

namespace g4::cpu::G4_CPU_NS::amx {

constexpr int kRows = 32; // rows of y per tile block (two A tiles of 16)

// The 64-byte operand of ldtilecfg, palette 1.
struct alignas(64) TileConfig {
    uint8_t palette   = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14]{};
    uint16_t colsb[16]{};
    uint8_t rows[16]{};
};

// Tiles 0-7 all 16 rows x 64 bytes.
G4_AMX_TARGET inline void load_tile_config() {
    TileConfig t;
    for (int i = 0; i < 8; ++i)
        t.colsb[i] = 64, t.rows[i] = 16;
    _tile_loadconfig(&t);
}

// r[i] (16 x 32-bit, row i) -> r[i] = column i (16 rows), in registers.
G4_AMX_TARGET inline void transpose16(__m512i* r) {
    __m512i t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
        t[i]     = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    // u[4g + m], 128-bit lane L: rows 4g..4g+3 of column 4L + m.
    __m512i u[16];
#pragma GCC unroll 4
    for (int i = 0; i < 16; i += 4) {
        u[i]     = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) {
        const __m512i x0 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x44),
                      x1 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xEE);
        const __m512i y0 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x44),
                      y1 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xEE);
        r[m]             = _mm512_shuffle_i32x4(x0, y0, 0x88);
        r[4 + m]         = _mm512_shuffle_i32x4(x0, y0, 0xDD);
        r[8 + m]         = _mm512_shuffle_i32x4(x1, y1, 0x88);
        r[12 + m]        = _mm512_shuffle_i32x4(x1, y1, 0xDD);
    }
}

// load_pairs' clamp of fp32 values to [lo, hi] (min(max(x, lo), hi), a NaN kept: vmaxps / vminps return
// their second operand when either is NaN), and its absence.
struct Bounds {
    __m512 lo, hi;
};
struct NoBounds {};

// 32 values from n <= 32 (zero past n) as 16 bf16 pairs: bf16 as they are, fp32 rounded (clamped first where
// given Bounds).
template <typename B = NoBounds>
G4_AMX_TARGET inline __m512i load_pairs(const void* src, DType dt, int n, B bounds = {}) {
    static_assert(std::is_same_v<B, Bounds> || std::is_same_v<B, NoBounds>);
    if (n <= 0) return _mm512_setzero_si512();
    if (dt == DType::BF16) {
        const __mmask32 m = n >= 32 ? ~0u : (1u << n) - 1u;
        return _mm512_maskz_loadu_epi16(m, src);
    }
    const float* s     = (const float*)src;
    const __mmask16 m0 = n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1u);
    const __mmask16 m1 = n >= 32 ? 0xFFFF : (__mmask16)((1u << std::max(0, n - 16)) - 1u);
    __m512 v0 = _mm512_maskz_loadu_ps(m0, s), v1 = _mm512_maskz_loadu_ps(m1, s + 16);
    if constexpr (std::is_same_v<B, Bounds>) { // zero past n, as loaded
        v0 = _mm512_maskz_min_ps(m0, bounds.hi, _mm512_max_ps(bounds.lo, v0));
        v1 = _mm512_maskz_min_ps(m1, bounds.hi, _mm512_max_ps(bounds.lo, v1));
    }
    return (__m512i)_mm512_cvtne2ps_pbh(v1, v0);
}

// c[32][32] (+)= xs[32 rows][kp16 pairs] . p[kp16][kGemmNr], xs row stride lxs pairs, c row stride ldc
// floats.
G4_AMX_TARGET inline void tile_block(const uint32_t* xs, int64_t lxs, const uint32_t* p, int kp16, float* c,
                                     int64_t ldc, bool accumulate) {
    const int64_t sc = ldc * 4, sx = lxs * 4;
    // GCC's tileloadd (unlike its tilestored) tells the compiler of no memory access: the stores to xs, the
    // panels and c before it must not move past it.
    __asm__ volatile("" ::: "memory");
    if (accumulate) {
        _tile_loadd(0, c, sc);
        _tile_loadd(1, c + 16, sc);
        _tile_loadd(2, c + 16 * ldc, sc);
        _tile_loadd(3, c + 16 * ldc + 16, sc);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int q = 0; q < kp16; q += 16) {
        _tile_loadd(4, xs + q, sx);
        _tile_loadd(5, xs + 16 * lxs + q, sx);
        _tile_loadd(6, p + (size_t)q * kGemmNr, kGemmNr * 4);
        _tile_loadd(7, p + (size_t)q * kGemmNr + 16, kGemmNr * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, sc);
    _tile_stored(1, c + 16, sc);
    _tile_stored(2, c + 16 * ldc, sc);
    _tile_stored(3, c + 16 * ldc + 16, sc);
}

// tile_block for a block of y with rows < 32 or nt < kGemmNr columns at y (row stride ldy): through the
// 32 x kGemmNr block cb (64-byte aligned), writing only rows x nt of y.
G4_AMX_TARGET inline void tile_block_partial(const uint32_t* xs, int64_t lxs, const uint32_t* p, int kp16,
                                             float* y, int64_t ldy, int rows, int nt, float* cb,
                                             bool accumulate) {
    const __mmask32 m = nt >= 32 ? ~0u : (__mmask32)((1u << nt) - 1u);
    if (accumulate)
        for (int i = 0; i < rows; ++i) {
            _mm512_store_ps(cb + i * kGemmNr, _mm512_maskz_loadu_ps((__mmask16)m, y + i * ldy));
            _mm512_store_ps(cb + i * kGemmNr + 16,
                            _mm512_maskz_loadu_ps((__mmask16)(m >> 16), y + i * ldy + 16));
        }
    tile_block(xs, lxs, p, kp16, cb, kGemmNr, accumulate);
    for (int i = 0; i < rows; ++i) {
        _mm512_mask_storeu_ps(y + i * ldy, (__mmask16)m, _mm512_load_ps(cb + i * kGemmNr));
        _mm512_mask_storeu_ps(y + i * ldy + 16, (__mmask16)(m >> 16), _mm512_load_ps(cb + i * kGemmNr + 16));
    }
}

} // namespace g4::cpu::G4_CPU_NS::amx

#endif // G4_CPU_AMX_TABLE
