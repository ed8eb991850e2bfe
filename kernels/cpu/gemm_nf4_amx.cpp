// NF4 GEMM on Intel AMX tiles for the prefill chunks of `--cpu-precision bf16` plans: the amx level's
// matmul takes the NF4 matmuls of more than q16::kMaxRows rows with MatmulArgs::bf16_rows, which
// matmul_nf4_gemm_int16 takes on other levels (and without the flag). y = bf16(x) . bf16(W)^T, W the NF4
// weights dequantized to fp32 as nf4::dequantize does (codebook value times the block's scale) and rounded to
// nearest even bf16, each product exact in fp32, fp32 sums in the tiles' order (as matmul_gemm_bf16 of the
// dequantized weights, within ~1e-6 of it).
//
// x is rounded once per pass into the pool's scratch as bf16 k-pairs, rows padded with zeros to 32. A task
// is up to kGroupMax panels of kGemmNr weight rows (and, where the pool has more threads than panels, a
// range of 32-row blocks): per kGemmKc of k it decodes its panels' codes into the tiles' pair layout (one
// code byte is one k-pair: vpermps looks both nibbles up in the codebook, a multiply by the block scale,
// vcvtne2ps2bf16, vpermw interleaves the pairs, a 16 x 16 dword transpose) and accumulates 32 x 32 blocks
// of y in four fp32 tiles with tdpbf16ps. Denormal inputs read as zero, as in every AMX product.
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/nf4_blob.h"
#include "kernels/nf4.h"
#include "kernels/q16.h"

#include <algorithm>
#include <cstring>

#if defined(G4_CPU_AMX_TABLE)

namespace g4::cpu::G4_CPU_NS {
namespace {

constexpr int kGroupMax = 4; // panels per task at most
static_assert(kGemmKc % nf4::kBlock == 0, "a k chunk holds whole NF4 blocks");

using Blob = gemv::Nf4Blob;

template <typename T> T* align64(T* p) {
    return (T*)(((uintptr_t)p + 63) & ~(uintptr_t)63);
}

// vpermw's indices that interleave vcvtne2ps2bf16's halves (the even elements low, the odd ones high) into
// pairs: element 2i is i, element 2i + 1 is 16 + i.
struct Interleave {
    alignas(64) uint16_t v[32];
    constexpr Interleave() : v() {
        for (int i = 0; i < 16; ++i)
            v[2 * i] = (uint16_t)i, v[2 * i + 1] = (uint16_t)(16 + i);
    }
};
constexpr Interleave kInterleave;

// 16 code bytes (16 k-pairs of one weight row) times the row's block scale as 16 bf16 pairs, the even
// element (the high nibble) in the low half.
G4_AMX_TARGET inline __m512i decode16(const uint8_t* codes, __m512 scale, __m512 book, __m512i interleave) {
    const __m512i b   = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)codes));
    const __m512 even = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), book), scale);
    const __m512 odd  = _mm512_mul_ps(_mm512_permutexvar_ps(b, book), scale); // vpermps reads bits 0-3
    return _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(odd, even));
}

// Weight rows [n0, n0 + nt) (nt <= kGemmNr), k-pairs [q0, q0 + kp) (whole blocks), as p[kp][kGemmNr] bf16
// pairs, zero past nt.
template <bool DQ>
G4_AMX_TARGET void decode_panel(const Blob& w, int64_t kpr, int64_t nb, int64_t n0, int nt, int64_t q0,
                                int kp, uint32_t* p) {
    const __m512 book        = _mm512_loadu_ps(nf4::kCodebook);
    const __m512i interleave = _mm512_load_si512(kInterleave.v);
    for (int qb = 0; qb < kp; qb += 16) {
        const int64_t b = (q0 + qb) / (nf4::kBlock / 2);
        for (int h = 0; h < 2; ++h) {
            __m512i r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; ++i) {
                const int64_t j = 16 * h + i;
                r[i]            = j < nt ? decode16(w.codes + (n0 + j) * kpr + q0 + qb,
                                                    _mm512_set1_ps(w.scale<DQ>((n0 + j) * nb + b)), book, interleave)
                                         : _mm512_setzero_si512();
            }
            amx::transpose16(r);
#pragma GCC unroll 16
            for (int q = 0; q < 16; ++q)
                _mm512_store_si512(p + (size_t)(qb + q) * kGemmNr + 16 * h, r[q]);
        }
    }
}

// Rows [r0, r1) of x as bf16 pairs into xa (row stride lx pairs); rows past a.rows are zeros.
G4_AMX_TARGET void round_rows(const MatmulArgs& a, int r0, int r1, uint32_t* xa, int64_t lx, int xr0) {
    const int64_t kp = a.k / 2;
    for (int r = r0; r < r1; ++r) {
        uint32_t* d = xa + (int64_t)(r - xr0) * lx;
        if (r >= a.rows) {
            std::memset(d, 0, sizeof(uint32_t) * kp);
            continue;
        }
        const float* s = a.x + (int64_t)r * a.ldx;
        for (int64_t q = 0; q < kp; q += 16)
            _mm512_storeu_si512(
                d + q, amx::load_pairs(s + 2 * q, DType::F32, (int)std::min<int64_t>(32, a.k - 2 * q)));
    }
}

// One decoded panel: min(k, kGemmKc) / 2 k-pairs of kGemmNr weight rows.
size_t panel_floats(int64_t k) {
    return (size_t)(std::min<int64_t>(k, kGemmKc) / 2) * kGemmNr;
}

// A thread's part of the scratch: `group` panels, a 32 x kGemmNr block of y for partial blocks, alignment.
size_t task_floats(int64_t k, int group) {
    return (size_t)group * panel_floats(k) + (size_t)amx::kRows * kGemmNr + 16;
}

// Panels [s0, s0 + ns) x rows [r0, r1) of the pass that starts at row xr0 (xa's row 0).
template <bool DQ>
G4_AMX_TARGET void task(const MatmulArgs& a, const Blob& w, const uint32_t* xa, int64_t lx, int xr0, int s0,
                        int ns, int r0, int r1, float* scratch) {
    const size_t pf   = panel_floats(a.k);
    uint32_t* panels  = align64((uint32_t*)scratch); // [ns][pf]
    float* cb         = (float*)(panels + (size_t)ns * pf);
    const int64_t kpr = a.k / 2, nb = a.k / nf4::kBlock;
    amx::load_tile_config();
    for (int64_t k0 = 0; k0 < a.k; k0 += kGemmKc) {
        const int kp = (int)std::min<int64_t>(kGemmKc, a.k - k0) / 2;
        for (int s = 0; s < ns; ++s) {
            const int64_t n0 = (int64_t)(s0 + s) * kGemmNr;
            decode_panel<DQ>(w, kpr, nb, n0, (int)std::min<int64_t>(kGemmNr, a.n - n0), k0 / 2, kp,
                             panels + (size_t)s * pf);
        }
        for (int r = r0; r < r1; r += amx::kRows) {
            const int rows     = std::min(amx::kRows, r1 - r);
            const uint32_t* xs = xa + (int64_t)(r - xr0) * lx + k0 / 2;
            for (int s = 0; s < ns; ++s) {
                const int64_t n0  = (int64_t)(s0 + s) * kGemmNr;
                const int nt      = (int)std::min<int64_t>(kGemmNr, a.n - n0);
                float* y          = a.y + (int64_t)r * a.ldy + n0;
                const uint32_t* p = panels + (size_t)s * pf;
                if (rows == amx::kRows && nt == kGemmNr)
                    amx::tile_block(xs, lx, p, kp, y, a.ldy, k0 > 0);
                else
                    amx::tile_block_partial(xs, lx, p, kp, y, a.ldy, rows, nt, cb, k0 > 0);
            }
        }
    }
    _tile_release();
}

} // namespace

// Only through matmul_amx: a.dt is NF4, a.k a multiple of the NF4 block and a.rows more than q16::kMaxRows
// (q16::applies_gemm).
void matmul_nf4_gemm_amx(const Context& c, const MatmulArgs& a) {
    const int threads  = c.pool->size();
    const int strips   = (int)((a.n + kGemmNr - 1) / kGemmNr);
    const int group    = std::clamp(strips / (4 * threads), 1, kGroupMax);
    const int groups   = (strips + group - 1) / group;
    const size_t total = (size_t)threads * c.scratch_stride;
    const int64_t lx   = a.k / 2 + 16; // pairs per row of rounded x (off a power-of-two stride)
    const size_t tf    = task_floats(a.k, group);
    const size_t tasks = (size_t)threads * tf;
    const int64_t fit =
        total > tasks + 16 ? (int64_t)((total - tasks - 16) / lx) / amx::kRows * amx::kRows : 0;
    if (fit < amx::kRows) {
        matmul_nf4_gemm_int16(c, a); // a Context sized for smaller matmuls
        return;
    }
    const nf4::Layout l = nf4::layout(a.n * a.k, a.nf4_double_quant);
    const Blob w((const uint8_t*)a.w, l);
    uint32_t* xa     = align64((uint32_t*)c.scratch);
    float* task_area = c.scratch + (total - tasks);
    const int pass   = (int)std::min<int64_t>(fit, (a.rows + amx::kRows - 1) / amx::kRows * amx::kRows);
    for (int p0 = 0; p0 < a.rows; p0 += pass) {
        const int p1 = std::min(a.rows, p0 + pass), blocks = (p1 - p0 + amx::kRows - 1) / amx::kRows;
        c.pool->parallel_for(blocks, [&](int64_t b, int) {
            const int r0 = p0 + (int)b * amx::kRows;
            round_rows(a, r0, r0 + amx::kRows, xa, lx, p0);
        });
        // where the panels are fewer than the threads, split the rows too (each split decodes its panels)
        const int chunks = groups >= threads ? 1 : std::min(blocks, (threads + groups - 1) / groups);
        const int crows  = (blocks + chunks - 1) / chunks * amx::kRows;
        c.pool->parallel_for((int64_t)groups * chunks, [&](int64_t t, int th) {
            const int g = (int)(t % groups), r0 = p0 + (int)(t / groups) * crows,
                      r1 = std::min(p1, r0 + crows);
            if (r0 >= r1) return;
            const int s0 = g * group, ns = std::min(group, strips - s0);
            float* scratch = task_area + (size_t)th * tf;
            if (l.double_quant)
                task<true>(a, w, xa, lx, p0, s0, ns, r0, r1, scratch);
            else
                task<false>(a, w, xa, lx, p0, s0, ns, r0, r1, scratch);
        });
    }
}

void matmul_amx(const Context& c, const MatmulArgs& a) {
    if (a.bf16_rows && q16::applies_gemm(a.int16_x, a.dt == DType::NF4, a.k, a.rows))
        matmul_nf4_gemm_amx(c, a);
    else
#if defined(G4_CPU_VNNI_VARIANT)
        matmul_vnni(c, a);
#else
        matmul(c, a);
#endif
}

} // namespace g4::cpu::G4_CPU_NS

#endif // G4_CPU_AMX_TABLE
