// bf16 GEMM on Intel AMX tiles (AMX-TILE, AMX-BF16: Sapphire Rapids and later Xeons) for the towers' bf16
// precision: y = bf16(x) . bf16(W)^T, fp32 products and sums, as matmul_gemm_bf16 (gemm_bf16.cpp). Each task
// packs kGemmBf16Group panels of kGemmNr weight rows as k-pairs (the tiles' VNNI layout, as the AVX-512 BF16
// path packs them, with a vectorised 32-bit transpose; up to kGemmBf16AmxGroup for matmuls of many rows, so
// that each block of x, read from memory and rounded once per task, feeds more tiles), rounds 32-row blocks
// of x to bf16 with vcvtne2ps2bf16 (clamping them first where MatmulArgs asks), and accumulates 32 x 32
// blocks of y in four fp32 tiles with tdpbf16ps (2 A tiles of 16 rows x 32 k, 2 B tiles of 16 k-pairs x 16
// columns), clamping each finished block where asked. Like every AMX product (and vcvtne2ps2bf16), denormal
// inputs read as zero. Only the avx512 copy's AMX table (level_table.cpp) calls it, once dispatch.cpp has
// seen AMX in cpuid and been granted the tile state by the kernel.
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/row_tasks.h"

#include <algorithm>
#include <cstring>

#if defined(G4_CPU_AMX_TABLE)

namespace g4::cpu::G4_CPU_NS {
namespace {

using amx::load_pairs;
using amx::load_tile_config;
using amx::TileConfig;
using amx::transpose16;

constexpr int kGroup = kGemmBf16AmxGroup;
constexpr int kRows  = amx::kRows;
constexpr int kKp    = kGemmKc / 2; // k-pairs per packed panel
constexpr int kXs    = kKp + 16;    // pairs per row of the rounded x block (padded off a 1 KiB stride)
static_assert(kKp % 16 == 0 && kGemmNr == 32, "panels of whole tiles: 16 k-pairs x 2 x 16 columns");
static_assert(kGemmBf16AmxFixedFloats >= (size_t)kRows * kXs + kRows * kGemmNr + 16 &&
                  kGemmBf16AmxScratchFloats >= (size_t)kGroup * kKp * kGemmNr + kGemmBf16AmxFixedFloats,
              "gemm_bf16_scratch_floats covers the AMX task's panels, x block, y block and alignment");

// Weight rows [n0, n0 + nt) (nt <= kGemmNr), k in [k0, k0 + kc), as p[kp16][kGemmNr] pairs, kp16 the k-pairs
// rounded up to 16: p[q][j] = (w[n0 + j][k0 + 2q], w[n0 + j][k0 + 2q + 1]), zero past nt and kc.
G4_AMX_TARGET void pack_panel(const MatmulArgs& a, int64_t n0, int nt, int64_t k0, int kc, int kp16,
                              uint32_t* p) {
    const size_t es = a.dt == DType::BF16 ? 2 : 4;
    for (int qb = 0; qb < kp16; qb += 16)
        for (int h = 0; h < 2; ++h) {
            __m512i r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; ++i) {
                const int j = 16 * h + i;
                r[i] = j < nt ? load_pairs((const char*)a.w + ((n0 + j) * a.k + k0 + 2 * qb) * es, a.dt,
                                           kc - 2 * qb)
                              : _mm512_setzero_si512();
            }
            transpose16(r);
#pragma GCC unroll 16
            for (int q = 0; q < 16; ++q)
                _mm512_store_si512(p + (size_t)(qb + q) * kGemmNr + 16 * h, r[q]);
        }
}

// xs[i][q] = bf16 pairs of x[i][k0 + 2q, +1] (clamped where `bounds` are Bounds) for q < kp16 (zero past
// kc), rows < rows; rows up to kRows zero.
template <typename B>
G4_AMX_TARGET inline void round_rows(const MatmulArgs& a, int r, int rows, int64_t k0, int kc, int kp16,
                                     uint32_t* xs, B bounds) {
    for (int i = 0; i < kRows; ++i) {
        uint32_t* d = xs + (size_t)i * kXs;
        if (i >= rows) {
            std::memset(d, 0, sizeof(uint32_t) * kp16);
            continue;
        }
        const float* s = a.x + (int64_t)(r + i) * a.ldx + k0;
        for (int qb = 0; qb < kp16; qb += 16)
            _mm512_store_si512(d + qb, load_pairs(s + 2 * qb, DType::F32, kc - 2 * qb, bounds));
    }
}

// round_rows with MatmulArgs' x clamp where it has one.
G4_AMX_TARGET void round_block(const MatmulArgs& a, int r, int rows, int64_t k0, int kc, int kp16,
                               uint32_t* xs) {
    if (clamps_x(a))
        round_rows(a, r, rows, k0, kc, kp16, xs, amx::Bounds{_mm512_set1_ps(a.x_lo), _mm512_set1_ps(a.x_hi)});
    else
        round_rows(a, r, rows, k0, kc, kp16, xs, amx::NoBounds{});
}

// One task: rows [r0, r1) x panels [s0, s0 + ns) of y.
G4_AMX_TARGET void amx_task(const MatmulArgs& a, int s0, int ns, int r0, int r1, float* scratch) {
    uint32_t* panels   = (uint32_t*)(((uintptr_t)scratch + 63) & ~(uintptr_t)63); // [ns][kKp][kGemmNr] pairs
    uint32_t* xs       = panels + (size_t)ns * kKp * kGemmNr;                     // [kRows][kXs] pairs
    float* cb          = (float*)(xs + (size_t)kRows * kXs); // [kRows][kGemmNr] partial y blocks
    const bool clamp_y = clamps_y(a);
    load_tile_config();
    for (int64_t k0 = 0; k0 < a.k; k0 += kGemmKc) {
        const int kc = (int)std::min<int64_t>(kGemmKc, a.k - k0), kp16 = ((kc + 1) / 2 + 15) / 16 * 16;
        for (int s = 0; s < ns; ++s) {
            const int64_t n0 = (int64_t)(s0 + s) * kGemmNr;
            pack_panel(a, n0, (int)std::min<int64_t>(kGemmNr, a.n - n0), k0, kc, kp16,
                       panels + (size_t)s * kKp * kGemmNr);
        }
        for (int r = r0; r < r1; r += kRows) {
            const int rows = std::min(kRows, r1 - r);
            round_block(a, r, rows, k0, kc, kp16, xs);
            for (int s = 0; s < ns; ++s) {
                const int64_t n0  = (int64_t)(s0 + s) * kGemmNr;
                const int nt      = (int)std::min<int64_t>(kGemmNr, a.n - n0);
                float* y          = a.y + (int64_t)r * a.ldy + n0;
                const uint32_t* p = panels + (size_t)s * kKp * kGemmNr;
                if (rows == kRows && nt == kGemmNr)
                    amx::tile_block(xs, kXs, p, kp16, y, a.ldy, k0 > 0);
                else
                    amx::tile_block_partial(xs, kXs, p, kp16, y, a.ldy, rows, nt, cb, k0 > 0);
                if (clamp_y && k0 + kc >= a.k) clamp_block(y, a.ldy, rows, nt, a.y_lo, a.y_hi);
            }
        }
    }
    _tile_release();
}

// Tiles for gemm_block_bf16_amx: C 0-3 (rows 0-15 x cols 0-15, 0-15 x 16-31, 16-.. x 0-15, 16-.. x 16-31),
// A 4 (rows 0-15) and 5 (rows 16-..), B 6 and 7; r0 and r1 rows in the two row tiles (r1 may be 0).
G4_AMX_TARGET void load_block_config(int r0, int r1) {
    TileConfig t;
    const int rows[8] = {r0, r0, r1, r1, r0, r1, 16, 16};
    for (int i = 0; i < 8; ++i)
        if (rows[i] > 0) t.colsb[i] = 64, t.rows[i] = (uint8_t)rows[i];
    _tile_loadconfig(&t);
}

// Up to 32 rows of c[rows, cols] (+)= a . b, cols a multiple of 16 and kp of 16 (gemm_block_bf16's layout).
G4_AMX_TARGET void block_rows(int rows, int cols, int64_t kp, const uint32_t* a, int64_t lda,
                              const uint32_t* b, int64_t ldb, int64_t panel, float* c, int64_t ldc,
                              bool accumulate) {
    const bool two_rows = rows > 16;
    const int64_t sa = lda * 4, sb = ldb * 4, sc = ldc * 4;
    __asm__ volatile("" ::: "memory"); // as tile_block: tileloadd reads memory GCC does not know of
    for (int j = 0; j < cols; j += 32) {
        const bool two_cols = j + 16 < cols;
        const uint32_t* b0  = b + (j / kGemmNr) * panel + j % kGemmNr;
        const uint32_t* b1  = b + ((j + 16) / kGemmNr) * panel + (j + 16) % kGemmNr;
        float* c0           = c + j;
        float* c1           = c + 16 * ldc + j;
        if (accumulate) {
            _tile_loadd(0, c0, sc);
            if (two_cols) _tile_loadd(1, c0 + 16, sc);
            if (two_rows) _tile_loadd(2, c1, sc);
            if (two_rows && two_cols) _tile_loadd(3, c1 + 16, sc);
        } else {
            _tile_zero(0);
            _tile_zero(1);
            if (two_rows) {
                _tile_zero(2);
                _tile_zero(3);
            }
        }
        for (int64_t q = 0; q < kp; q += 16) {
            _tile_loadd(4, a + q, sa);
            _tile_loadd(6, b0 + q * ldb, sb);
            _tile_dpbf16ps(0, 4, 6);
            if (two_rows) {
                _tile_loadd(5, a + 16 * lda + q, sa);
                _tile_dpbf16ps(2, 5, 6);
            }
            if (two_cols) {
                _tile_loadd(7, b1 + q * ldb, sb);
                _tile_dpbf16ps(1, 4, 7);
                if (two_rows) _tile_dpbf16ps(3, 5, 7);
            }
        }
        _tile_stored(0, c0, sc);
        if (two_cols) _tile_stored(1, c0 + 16, sc);
        if (two_rows) _tile_stored(2, c1, sc);
        if (two_rows && two_cols) _tile_stored(3, c1 + 16, sc);
    }
}

} // namespace

G4_AMX_TARGET void gemm_block_bf16_amx(int rows, int cols, int64_t kp, const uint32_t* a, int64_t lda,
                                       const uint32_t* b, int64_t ldb, int64_t panel, float* c, int64_t ldc,
                                       bool accumulate) {
    if (rows < 1 || cols < 1) return;
    if (cols % 16 || kp % 16) {
        gemm_block_bf16_dpbf16(rows, cols, kp, a, lda, b, ldb, panel, c, ldc, accumulate);
        return;
    }
    int configured = 0; // the rows the loaded config is for
    for (int r = 0; r < rows; r += 32) {
        const int rb = std::min(32, rows - r);
        if (rb != configured) load_block_config(std::min(16, rb), std::max(0, rb - 16)), configured = rb;
        block_rows(rb, cols, kp, a + r * lda, lda, b, ldb, panel, c + r * ldc, ldc, accumulate);
    }
    _tile_release();
}

void matmul_gemm_bf16_amx(const Context& c, const MatmulArgs& a) {
    if (!gemm_bf16_amx_tiles(c, a)) { // gemm_bf16_clamps_amx counts this fallback's clamps too
        matmul_gemm_bf16_dpbf16(c, a);
        return;
    }
    const int max_group = gemm_bf16_amx_group(c.scratch_stride);
    // Panels a task packs. With many rows, up to max_group: as few column groups as give the pool about 4
    // tasks a thread with row chunks of at least 4 tile blocks (for_row_tasks below), as even as the strips
    // allow, so that each block of x, read and rounded once per task, feeds more tiles. With fewer rows,
    // kGemmBf16Group: each chunk packs its panels for fewer rows, and the larger groups measured slower
    // (the audio tower's 750 rows; the image tower's 2394 gain, docs/performance.md).
    constexpr int kManyRows = 1024;
    const int64_t strips    = (a.n + kGemmNr - 1) / kGemmNr;
    int group               = std::min(kGemmBf16Group, max_group);
    if (a.rows >= kManyRows) {
        const int64_t want = 4LL * c.pool->size(), max_chunks = std::max(1, a.rows / (4 * kRows));
        const int64_t g = std::min(
            strips, std::max((strips + max_group - 1) / max_group, (want + max_chunks - 1) / max_chunks));
        group = (int)((strips + g - 1) / g);
    }
    const int64_t groups = (strips + group - 1) / group;
    // Row chunks of at least 4 tile blocks: each chunk packs its panels.
    for_row_tasks<kRows, 4>(c, a.rows, groups, [&](int64_t g, int r0, int r1, int th) {
        const int s0 = (int)g * group, ns = (int)std::min<int64_t>(group, strips - s0);
        amx_task(a, s0, ns, r0, r1, c.thread_scratch(th));
    });
}

} // namespace g4::cpu::G4_CPU_NS

#endif // G4_CPU_AMX_TABLE
