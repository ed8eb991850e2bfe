// Register-blocked fp32 GEMM for many-row matmuls (the vision and audio towers; see cpu.h): weights are
// widened and transposed into kGemmKc x kGemmNr panels in per-thread scratch, then an AVX-512 micro-kernel
// accumulates kGemmMr x kGemmNr blocks of y in registers. Each output element is one fp32 sum over k in
// increasing order whatever the thread count. Without AVX-512 matmul_gemm is matmul_tiled and gemm_block
// plain Eigen.
#include "kernels/cpu/level.h"
#include "kernels/cpu/simd.h"

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

namespace g4::cpu::G4_CPU_NS {

size_t gemm_scratch_floats() {
    return (size_t)kGemmKc * kGemmNr;
}

bool gemm_has_avx512() {
#if defined(__AVX512F__)
    return true;
#else
    return false;
#endif
}

#if defined(__AVX512F__)

namespace {

constexpr int kNv = kGemmNr / 16; // 512-bit vectors per row of the block

inline __mmask16 lane_mask(int cols, int v) {
    const int n = std::clamp(cols - 16 * v, 0, 16);
    return (__mmask16)((1u << n) - 1u);
}

// c[MR, cols] (+)= a[MR, k] . b[k, cols], cols <= kGemmNr; a[i * lda + p], b[p * ldb + j], c[i * ldc + j].
template <int MR>
void micro(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
           int cols, bool accumulate) {
    __mmask16 m[kNv];
    const bool full = cols >= kGemmNr;
    for (int v = 0; v < kNv; ++v)
        m[v] = lane_mask(cols, v);
    __m512 acc[MR][kNv];
    for (int i = 0; i < MR; ++i)
        for (int v = 0; v < kNv; ++v)
            acc[i][v] = accumulate ? _mm512_maskz_loadu_ps(m[v], c + i * ldc + 16 * v) : _mm512_setzero_ps();
    auto step = [&](int64_t p, const __m512* bv) {
        for (int i = 0; i < MR; ++i) {
            const __m512 av = _mm512_set1_ps(a[i * lda + p]);
            for (int v = 0; v < kNv; ++v)
                acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
        }
    };
    if (full) {
        for (int64_t p = 0; p < k; ++p) {
            __m512 bv[kNv];
            for (int v = 0; v < kNv; ++v)
                bv[v] = _mm512_loadu_ps(b + p * ldb + 16 * v);
            step(p, bv);
        }
    } else {
        for (int64_t p = 0; p < k; ++p) {
            __m512 bv[kNv];
            for (int v = 0; v < kNv; ++v)
                bv[v] = _mm512_maskz_loadu_ps(m[v], b + p * ldb + 16 * v);
            step(p, bv);
        }
    }
    for (int i = 0; i < MR; ++i)
        for (int v = 0; v < kNv; ++v)
            _mm512_mask_storeu_ps(c + i * ldc + 16 * v, m[v], acc[i][v]);
}

using MicroFn = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, int, bool);
template <int... I> constexpr auto micro_table(std::integer_sequence<int, I...>) {
    return std::array<MicroFn, sizeof...(I)>{&micro<I + 1>...};
}
constexpr auto kMicro = micro_table(std::make_integer_sequence<int, kGemmMr>{});

// Rows [0, rows) of c[rows, cols] (+)= a . b, kGemmMr rows at a time.
inline void rows_block(int rows, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                       float* c, int64_t ldc, int cols, bool accumulate) {
    int r = 0;
    for (; r + kGemmMr <= rows; r += kGemmMr)
        micro<kGemmMr>(k, a + r * lda, lda, b, ldb, c + r * ldc, ldc, cols, accumulate);
    if (r < rows) kMicro[rows - r - 1](k, a + r * lda, lda, b, ldb, c + r * ldc, ldc, cols, accumulate);
}

// Columns [n0, n0 + nt) of W^T (nt <= kGemmNr), rows [k0, k0 + kc), as p[kc][kGemmNr] fp32 (columns past nt
// zero).
void pack_w(const MatmulArgs& a, int64_t n0, int nt, int64_t k0, int kc, float* p) {
    if (nt < kGemmNr) std::memset(p, 0, sizeof(float) * (size_t)kc * kGemmNr);
    for (int j = 0; j < nt; ++j) {
        const int64_t off = (n0 + j) * a.k + k0;
        float* d          = p + j;
        if (a.dt == DType::BF16) {
            const uint16_t* s = (const uint16_t*)a.w + off;
            uint32_t* du      = (uint32_t*)d;
            for (int q = 0; q < kc; ++q)
                du[(size_t)q * kGemmNr] = (uint32_t)s[q] << 16;
        } else {
            const float* s = (const float*)a.w + off;
            for (int q = 0; q < kc; ++q)
                d[(size_t)q * kGemmNr] = s[q];
        }
    }
}

} // namespace

void gemm_block(int rows, int cols, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                float* c, int64_t ldc, bool accumulate) {
    for (int j = 0; j < cols; j += kGemmNr)
        rows_block(rows, k, a, lda, b + j, ldb, c + j, ldc, std::min(kGemmNr, cols - j), accumulate);
}

void matmul_gemm(const Context& c, const MatmulArgs& a) {
    if ((a.dt != DType::BF16 && a.dt != DType::F32) || c.scratch_stride < gemm_scratch_floats() ||
        a.rows < 1) {
        matmul(c, a);
        return;
    }
    const int64_t strips = (a.n + kGemmNr - 1) / kGemmNr;
    // Enough tasks to balance the pool: rows split into chunks (each packs its own weight panels).
    const int64_t want = 4LL * c.pool->size();
    const int chunks =
        (int)std::clamp<int64_t>((want + strips - 1) / strips, 1, std::max(1, a.rows / (8 * kGemmMr)));
    const int chunk_rows = ((a.rows + chunks - 1) / chunks + kGemmMr - 1) / kGemmMr * kGemmMr;
    c.pool->parallel_for(strips * chunks, [&](int64_t task, int th) {
        const int64_t s = task % strips;
        const int r0 = (int)(task / strips) * chunk_rows, r1 = std::min(a.rows, r0 + chunk_rows);
        if (r0 >= r1) return;
        const int64_t n0 = s * kGemmNr;
        const int nt     = (int)std::min<int64_t>(kGemmNr, a.n - n0);
        float* p         = c.thread_scratch(th); // [kc][kGemmNr]
        for (int64_t k0 = 0; k0 < a.k; k0 += kGemmKc) {
            const int kc = (int)std::min<int64_t>(kGemmKc, a.k - k0);
            pack_w(a, n0, nt, k0, kc, p);
            rows_block(r1 - r0, kc, a.x + (int64_t)r0 * a.ldx + k0, a.ldx, p, kGemmNr,
                       a.y + (int64_t)r0 * a.ldy + n0, a.ldy, nt, k0 > 0);
        }
    });
}

#else // no AVX-512: the portable versions below

void gemm_block(int rows, int cols, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                float* c, int64_t ldc, bool accumulate) {
    gemm_block_portable(rows, cols, k, a, lda, b, ldb, c, ldc, accumulate);
}

void matmul_gemm(const Context& c, const MatmulArgs& a) {
    matmul(c, a);
}

#endif

// Compiled on every machine, so tests check the path a build without AVX-512 takes.
void gemm_block_portable(int rows, int cols, int64_t k, const float* a, int64_t lda, const float* b,
                         int64_t ldb, float* c, int64_t ldc, bool accumulate) {
    using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::Map<const RowMat, 0, Eigen::OuterStride<>> A(a, rows, k, Eigen::OuterStride<>(lda));
    Eigen::Map<const RowMat, 0, Eigen::OuterStride<>> B(b, k, cols, Eigen::OuterStride<>(ldb));
    Eigen::Map<RowMat, 0, Eigen::OuterStride<>> C(c, rows, cols, Eigen::OuterStride<>(ldc));
    if (accumulate)
        C.noalias() += A * B;
    else
        C.noalias() = A * B;
}

} // namespace g4::cpu::G4_CPU_NS
