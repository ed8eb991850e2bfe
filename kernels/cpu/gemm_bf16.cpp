// bf16 GEMM for the towers' opt-in bf16 precision (see cpu.h): y = bf16(x) . bf16(W)^T with every product
// exact in fp32 and summed in fp32. With AVX-512 BF16 the weights are packed as k-pairs into
// kGemmBf16Group panels of kGemmKc x kGemmNr bf16, each kGemmMr-row block of x is rounded once per panel
// group, and _mm512_dpbf16_ps accumulates in registers; the portable path rounds both operands to bf16-valued
// floats and runs gemm_block (the AVX-512 fp32 kernel where the level has it, else Eigen). With AMX the amx
// level runs gemm_bf16_amx.cpp instead.
#include "kernels/cpu/level.h"
#include "kernels/cpu/row_tasks.h"
#include "kernels/cpu/simd.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

// G4_GEMM_BF16_NATIVE: the _mm512_dpbf16_ps kernel is compiled, as this copy's matmul_gemm_bf16 where the
// level's flags include AVX-512 BF16, else (G4_CPU_BF16_TABLE, level.h) as matmul_gemm_bf16_dpbf16 with a
// function-level target, which only the level's BF16 table calls.
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define G4_GEMM_BF16_NATIVE 1
#define G4_BF16_TARGET
#elif defined(G4_CPU_BF16_TABLE)
#define G4_GEMM_BF16_NATIVE 1
#define G4_BF16_TARGET __attribute__((target("avx512bf16")))
#endif

namespace g4::cpu::G4_CPU_NS {

namespace {

constexpr int kGroup = kGemmBf16Group;

// bf16_to_f32(f32_to_bf16(f)) without a branch, so that loops of it vectorise.
inline float bf16_round(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u, q = (u | 0x00400000u) & 0xFFFF0000u;
    const uint32_t b = (u & 0x7FFFFFFFu) > 0x7F800000u ? q : r;
    std::memcpy(&f, &b, 4);
    return f;
}

inline uint16_t weight_bf16(const MatmulArgs& a, int64_t off) {
    return a.dt == DType::BF16 ? ((const uint16_t*)a.w)[off] : f32_to_bf16(((const float*)a.w)[off]);
}

// Tasks of whole kGemmMr-row blocks, at least 8 a chunk (as matmul_gemm splits).
template <typename Task> void for_tasks(const Context& c, const MatmulArgs& a, int64_t groups, Task&& task) {
    for_row_tasks<kGemmMr, 8>(c, a.rows, groups, task);
}

#if G4_GEMM_BF16_NATIVE

constexpr int kNv = kGemmNr / 16;

// min(max(x, lo), hi) with a NaN x kept (vmaxps / vminps return their second operand when either is NaN).
inline __m512 clamp16(__m512 x, __m512 lo, __m512 hi) {
    return _mm512_min_ps(hi, _mm512_max_ps(lo, x));
}

// xs[rows][kp pairs] = bf16(clamp(x[rows, k], lo, hi)) with a zero past an odd k.
void round_rows(int rows, int kc, const float* x, int64_t ldx, uint16_t* xs, int kp, float lo, float hi) {
    const __m512 vl = _mm512_set1_ps(lo), vh = _mm512_set1_ps(hi);
    for (int i = 0; i < rows; ++i) {
        const float* s = x + (int64_t)i * ldx;
        uint16_t* d    = xs + (size_t)i * 2 * kp;
        int p          = 0;
        for (; p + 16 <= kc; p += 16)
            _mm256_storeu_si256((__m256i*)(d + p), to_bf16x16(clamp16(_mm512_loadu_ps(s + p), vl, vh)));
        if (p < kc) {
            const __mmask16 m = (__mmask16)((1u << (kc - p)) - 1u);
            _mm256_mask_storeu_epi16(d + p, m, to_bf16x16(clamp16(_mm512_maskz_loadu_ps(m, s + p), vl, vh)));
        }
        if (kc & 1) d[kc] = 0;
    }
}

// c[MR, cols] (+)= a . b over kp k-pairs: a[i * lda + q] = (x[i][2q], x[i][2q+1]) as bf16 pairs,
// b[q * ldb + j] = (w[j][2q], w[j][2q+1]) (read only below cols; FULL: cols >= kGemmNr, plain loads). The
// two loads variants are separate loops: a select inside the loop made GCC keep the accumulators in memory.
template <int MR, bool FULL>
G4_BF16_TARGET void micro_loop(int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                               float* c, int64_t ldc, int cols, bool accumulate) {
    __mmask16 m[kNv];
    for (int v = 0; v < kNv; ++v)
        m[v] = (__mmask16)((1u << std::clamp(cols - 16 * v, 0, 16)) - 1u);
    __m512 acc[MR][kNv];
    for (int i = 0; i < MR; ++i)
        for (int v = 0; v < kNv; ++v)
            acc[i][v] = accumulate ? _mm512_maskz_loadu_ps(m[v], c + i * ldc + 16 * v) : _mm512_setzero_ps();
    for (int64_t q = 0; q < kp; ++q) {
        __m512bh bv[kNv];
        for (int v = 0; v < kNv; ++v)
            bv[v] = FULL ? (__m512bh)_mm512_loadu_si512(b + q * ldb + 16 * v)
                         : (__m512bh)_mm512_maskz_loadu_epi32(m[v], b + q * ldb + 16 * v);
        for (int i = 0; i < MR; ++i) {
            const __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[i * lda + q]);
            for (int v = 0; v < kNv; ++v)
                acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
        }
    }
    for (int i = 0; i < MR; ++i)
        for (int v = 0; v < kNv; ++v)
            _mm512_mask_storeu_ps(c + i * ldc + 16 * v, m[v], acc[i][v]);
}

template <int MR>
G4_BF16_TARGET void micro(int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                          float* c, int64_t ldc, int cols, bool accumulate) {
    if (cols >= kGemmNr)
        micro_loop<MR, true>(kp, a, lda, b, ldb, c, ldc, cols, accumulate);
    else
        micro_loop<MR, false>(kp, a, lda, b, ldb, c, ldc, cols, accumulate);
}

using MicroFn = void (*)(int64_t, const uint32_t*, int64_t, const uint32_t*, int64_t, float*, int64_t, int,
                         bool);
template <int... I> constexpr auto micro_table(std::integer_sequence<int, I...>) {
    return std::array<MicroFn, sizeof...(I)>{&micro<I + 1>...};
}
constexpr auto kMicro = micro_table(std::make_integer_sequence<int, kGemmMr>{});

// Columns [n0, n0 + nt) of W^T, k in [k0, k0 + kc), as k-pairs p[kp][kGemmNr] (zero past nt and past kc).
void pack_w(const MatmulArgs& a, int64_t n0, int nt, int64_t k0, int kc, uint16_t* p) {
    const int kp = (kc + 1) / 2;
    if (nt < kGemmNr || (kc & 1)) std::memset(p, 0, sizeof(uint16_t) * 2 * (size_t)kp * kGemmNr);
    for (int j = 0; j < nt; ++j) {
        const int64_t off = (n0 + j) * a.k + k0;
        uint16_t* d       = p + 2 * j;
        if (a.dt == DType::BF16) {
            const uint16_t* s = (const uint16_t*)a.w + off;
            for (int q = 0; q < kc; ++q)
                d[(size_t)(q >> 1) * 2 * kGemmNr + (q & 1)] = s[q];
        } else {
            for (int q = 0; q < kc; ++q)
                d[(size_t)(q >> 1) * 2 * kGemmNr + (q & 1)] = weight_bf16(a, off + q);
        }
    }
}

#endif // G4_GEMM_BF16_NATIVE

} // namespace

// What this file's GEMMs need a thread (a plan's smaller scratch, from before the AMX tasks grew, still
// runs them).
static size_t own_scratch_floats() {
    const size_t portable = (size_t)kGemmKc * (kGemmNr + kGemmMr);
    const size_t native   = (size_t)kGemmKc * (kGroup * kGemmNr + kGemmMr) / 2 + 16;
    return std::max(portable, native);
}

size_t gemm_bf16_scratch_floats() {
    // And the AMX table's tasks (gemm_bf16_amx.cpp): one size at every level, so that a plan runs on any CPU.
    return std::max(own_scratch_floats(), kGemmBf16AmxScratchFloats);
}

// Weights the bf16 GEMMs read, and at least one row.
static bool bf16_gemm_operands(const MatmulArgs& a) {
    return (a.dt == DType::BF16 || a.dt == DType::F32) && a.rows >= 1;
}

// Where matmul_gemm_bf16_portable and matmul_gemm_bf16_dpbf16 run (and so apply the clamps); elsewhere they
// are matmul. Every table but the AMX one has one of them as matmul_gemm_bf16.
bool gemm_bf16_clamps(const Context& c, const MatmulArgs& a) {
    return bf16_gemm_operands(a) && c.scratch_stride >= own_scratch_floats();
}

#if defined(G4_CPU_AMX_TABLE)
// matmul_gemm_bf16_amx's test (gemm_bf16_amx.cpp): tiles where a task's scratch holds at least one panel.
bool gemm_bf16_amx_tiles(const Context& c, const MatmulArgs& a) {
    return bf16_gemm_operands(a) && gemm_bf16_amx_group(c.scratch_stride) > 0;
}

bool gemm_bf16_clamps_amx(const Context& c, const MatmulArgs& a) {
    return gemm_bf16_amx_tiles(c, a) || gemm_bf16_clamps(c, a); // the tiles, else matmul_gemm_bf16_dpbf16
}
#endif

bool gemm_has_avx512_bf16() {
#if G4_GEMM_BF16_NATIVE && !defined(G4_CPU_BF16_TABLE)
    return true;
#else
    return false;
#endif
}

void matmul_gemm_bf16_portable(const Context& c, const MatmulArgs& a) {
    if (!gemm_bf16_clamps(c, a)) { // matmul, which ignores the clamps
        matmul(c, a);
        return;
    }
    // kGroup panels of kKc x kGemmNr bf16-valued weights and one kGemmMr x kKc block of bf16-valued x per
    // task, so that each block of x is rounded once per kGroup panels.
    constexpr int kKc    = kGemmKc / 2;
    const int64_t strips = (a.n + kGemmNr - 1) / kGemmNr;
    const int64_t groups = (strips + kGroup - 1) / kGroup;
    static_assert((size_t)kKc * (kGroup * kGemmNr + kGemmMr) <=
                      (size_t)kGemmKc * (kGroup * kGemmNr + kGemmMr) / 2,
                  "the portable panels fit the scratch gemm_bf16_scratch_floats gives");
    const bool clamp_y = clamps_y(a);
    for_tasks(c, a, groups, [&](int64_t g, int r0, int r1, int th) {
        const int s0 = (int)(g * kGroup), ns = (int)std::min<int64_t>(kGroup, strips - s0);
        float* p  = c.thread_scratch(th);               // [ns][kKc][kGemmNr] bf16-valued weights
        float* xs = p + (size_t)kGroup * kKc * kGemmNr; // [kGemmMr][kKc] bf16-valued activations
        for (int64_t k0 = 0; k0 < a.k; k0 += kKc) {
            const int kc    = (int)std::min<int64_t>(kKc, a.k - k0);
            const bool last = k0 + kc >= a.k;
            for (int s = 0; s < ns; ++s) {
                const int64_t n0 = (int64_t)(s0 + s) * kGemmNr;
                const int nt     = (int)std::min<int64_t>(kGemmNr, a.n - n0);
                float* ps        = p + (size_t)s * kKc * kGemmNr;
                for (int j = 0; j < nt; ++j)
                    for (int q = 0; q < kc; ++q)
                        ps[(size_t)q * kGemmNr + j] = bf16_to_f32(weight_bf16(a, (n0 + j) * a.k + k0 + q));
            }
            for (int r = r0; r < r1; r += kGemmMr) {
                const int rows = std::min(kGemmMr, r1 - r);
                for (int i = 0; i < rows; ++i)
                    for (int q = 0; q < kc; ++q)
                        xs[(size_t)i * kc + q] =
                            bf16_round(clamp_value(a.x[(int64_t)(r + i) * a.ldx + k0 + q], a.x_lo, a.x_hi));
                for (int s = 0; s < ns; ++s) {
                    const int64_t n0 = (int64_t)(s0 + s) * kGemmNr;
                    const int nt     = (int)std::min<int64_t>(kGemmNr, a.n - n0);
                    float* y         = a.y + (int64_t)r * a.ldy + n0;
                    gemm_block(rows, nt, kc, xs, kc, p + (size_t)s * kKc * kGemmNr, kGemmNr, y, a.ldy,
                               k0 > 0);
                    if (last && clamp_y) clamp_block(y, a.ldy, rows, nt, a.y_lo, a.y_hi);
                }
            }
        }
    });
}

#if G4_GEMM_BF16_NATIVE
void matmul_gemm_bf16_dpbf16(const Context& c, const MatmulArgs& a) {
    if (!gemm_bf16_clamps(c, a)) { // matmul, which ignores the clamps
        matmul(c, a);
        return;
    }
    const int64_t strips = (a.n + kGemmNr - 1) / kGemmNr;
    const int64_t groups = (strips + kGroup - 1) / kGroup;
    const bool clamp_y   = clamps_y(a);
    for_tasks(c, a, groups, [&](int64_t g, int r0, int r1, int th) {
        const int s0 = (int)(g * kGroup), ns = (int)std::min<int64_t>(kGroup, strips - s0);
        uint16_t* panels = (uint16_t*)c.thread_scratch(th);             // [ns][kGemmKc/2][kGemmNr] pairs
        uint16_t* xs     = panels + (size_t)kGroup * kGemmKc * kGemmNr; // [kGemmMr][kGemmKc/2] pairs
        for (int64_t k0 = 0; k0 < a.k; k0 += kGemmKc) {
            const int kc = (int)std::min<int64_t>(kGemmKc, a.k - k0), kp = (kc + 1) / 2;
            const bool last = k0 + kc >= a.k;
            for (int s = 0; s < ns; ++s) {
                const int64_t n0 = (int64_t)(s0 + s) * kGemmNr;
                pack_w(a, n0, (int)std::min<int64_t>(kGemmNr, a.n - n0), k0, kc,
                       panels + (size_t)s * 2 * kp * kGemmNr);
            }
            for (int r = r0; r < r1; r += kGemmMr) {
                const int rows = std::min(kGemmMr, r1 - r);
                round_rows(rows, kc, a.x + (int64_t)r * a.ldx + k0, a.ldx, xs, kp, a.x_lo, a.x_hi);
                for (int s = 0; s < ns; ++s) {
                    const int64_t n0 = (int64_t)(s0 + s) * kGemmNr;
                    const int nt     = (int)std::min<int64_t>(kGemmNr, a.n - n0);
                    float* y         = a.y + (int64_t)r * a.ldy + n0;
                    kMicro[rows - 1](kp, (const uint32_t*)xs, kp,
                                     (const uint32_t*)(panels + (size_t)s * 2 * kp * kGemmNr), kGemmNr, y,
                                     a.ldy, nt, k0 > 0);
                    if (last && clamp_y) clamp_block(y, a.ldy, rows, nt, a.y_lo, a.y_hi);
                }
            }
        }
    });
}
G4_BF16_TARGET void gemm_block_bf16_dpbf16(int rows, int cols, int64_t kp, const uint32_t* a, int64_t lda,
                                           const uint32_t* b, int64_t ldb, int64_t panel, float* c,
                                           int64_t ldc, bool accumulate) {
    for (int j = 0; j < cols; j += kGemmNr) {
        const uint32_t* bj = b + (j / kGemmNr) * panel;
        const int nt       = std::min(kGemmNr, cols - j);
        int r              = 0;
        for (; r + kGemmMr <= rows; r += kGemmMr)
            micro<kGemmMr>(kp, a + r * lda, lda, bj, ldb, c + r * ldc + j, ldc, nt, accumulate);
        if (r < rows)
            kMicro[rows - r - 1](kp, a + r * lda, lda, bj, ldb, c + r * ldc + j, ldc, nt, accumulate);
    }
}
#endif // G4_GEMM_BF16_NATIVE

void gemm_block_bf16(int rows, int cols, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b,
                     int64_t ldb, int64_t panel, float* c, int64_t ldc, bool accumulate) {
#if G4_GEMM_BF16_NATIVE && !defined(G4_CPU_BF16_TABLE)
    gemm_block_bf16_dpbf16(rows, cols, kp, a, lda, b, ldb, panel, c, ldc, accumulate);
#else
    auto lo = [](uint32_t u) { return bf16_to_f32((uint16_t)(u & 0xFFFF)); };
    auto hi = [](uint32_t u) { return bf16_to_f32((uint16_t)(u >> 16)); };
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j) {
            const uint32_t* bj = b + (j / kGemmNr) * panel + j % kGemmNr;
            float s            = accumulate ? c[i * ldc + j] : 0.0f;
            for (int64_t q = 0; q < kp; ++q) {
                const uint32_t x = a[i * lda + q], w = bj[q * ldb];
                s += lo(x) * lo(w) + hi(x) * hi(w);
            }
            c[i * ldc + j] = s;
        }
#endif
}

void round_to_bf16(const float* x, int64_t n, uint16_t* y) {
    int64_t i = 0;
#if G4_GEMM_BF16_NATIVE && defined(__AVX512BW__)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i*)(y + i), to_bf16x16(_mm512_loadu_ps(x + i)));
#endif
    for (; i < n; ++i)
        y[i] = f32_to_bf16(x[i]);
}

void matmul_gemm_bf16(const Context& c, const MatmulArgs& a) {
#if G4_GEMM_BF16_NATIVE && !defined(G4_CPU_BF16_TABLE)
    matmul_gemm_bf16_dpbf16(c, a);
#else
    matmul_gemm_bf16_portable(c, a);
#endif
}

} // namespace g4::cpu::G4_CPU_NS
