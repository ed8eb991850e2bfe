// bf16 matrix-vector products of 1-8 rows (decode steps' LM head and per-layer projection): the bf16 weights
// are read once, straight from the plan, and widened in registers (a bf16 value is the top half of its
// float32), where matmul_tiled widens a tile into scratch and runs an Eigen GEMM on it. AVX-512 and AVX2
// take one vector of 32-bit lanes, each holding an even and an odd element, as two float vectors: the even
// elements (lane << 16) and the odd ones (lane & 0xFFFF0000); x is reordered once to match (per chunk of
// 2 * lanes elements: the even ones, then the odd ones). float32 arithmetic; each output is one thread's sum
// in a fixed order (independent of the thread count and of a.rows). Advanced SIMD (aarch64):
// gemv_bf16_neon.h.
#include "kernels/cpu/level.h"
#include "kernels/cpu/simd.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>

namespace g4::cpu::G4_CPU_NS {
namespace {

#if defined(__AVX512F__)
constexpr int kChunk = 32; // elements per vector of bf16 pairs
#elif defined(__AVX2__)
constexpr int kChunk = 16;
#elif defined(__ARM_NEON)
constexpr int kChunk = 16; // gemv_bf16_neon.h: four vectors of 4 lanes (x kept in its own order)
#else
constexpr int kChunk = 8; // the plain loop's lanes (x kept in its own order)
#endif
constexpr int kTileRows    = 64;     // weight rows per task, at most
constexpr int kMinTileRows = 8;      // ... and at least, where fewer would leave pool threads idle
constexpr int kGroupRows   = 4;      // rows of x per pass over a weight row
constexpr int64_t kInline = 1 << 16; // smaller matmuls run on the calling thread (the PLE's 256 x 1536: pool)

// x's rows into xp (stride k): each whole chunk as its even elements then its odd ones (the plain loop: as
// they are); the tail as is.
void reorder_x(const MatmulArgs& a, float* xp) {
#if defined(__AVX512F__) || defined(__AVX2__)
    const int64_t whole = a.k / kChunk * kChunk;
#else
    const int64_t whole = 0;
#endif
    for (int t = 0; t < a.rows; ++t) {
        const float* x = a.x + t * a.ldx;
        float* o       = xp + t * a.k;
        for (int64_t j = 0; j < whole; j += kChunk)
            for (int i = 0; i < kChunk / 2; ++i)
                o[j + i] = x[j + 2 * i], o[j + kChunk / 2 + i] = x[j + 2 * i + 1];
        std::memcpy(o + whole, x + whole, sizeof(float) * (a.k - whole));
    }
}

inline float bf16_value(uint16_t v) {
    const uint32_t u = (uint32_t)v << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// out[t] = w . row t of xp (stride k) for R rows.
#if defined(__ARM_NEON)
#include "kernels/cpu/gemv_bf16_neon.h"
#else
template <int R> void dot_rows(const uint16_t* w, const float* xp, int64_t k, float* out) {
    const int64_t whole = k / kChunk * kChunk;
    float tail[R]       = {};
#if defined(__AVX512F__)
    const __m512i hi    = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 acc0[R], acc1[R];
    for (int t = 0; t < R; ++t)
        acc0[t] = acc1[t] = _mm512_setzero_ps();
    for (int64_t j = 0; j < whole; j += kChunk) {
        const __m512i v = _mm512_loadu_si512(w + j);
        const __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        const __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
        for (int t = 0; t < R; ++t) {
            acc0[t] = _mm512_fmadd_ps(_mm512_loadu_ps(xp + t * k + j), we, acc0[t]);
            acc1[t] = _mm512_fmadd_ps(_mm512_loadu_ps(xp + t * k + j + 16), wo, acc1[t]);
        }
    }
#elif defined(__AVX2__)
    const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
    __m256 acc0[R], acc1[R];
    for (int t = 0; t < R; ++t)
        acc0[t] = acc1[t] = _mm256_setzero_ps();
    for (int64_t j = 0; j < whole; j += kChunk) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(w + j));
        const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
        for (int t = 0; t < R; ++t) {
            acc0[t] = _mm256_fmadd_ps(_mm256_loadu_ps(xp + t * k + j), we, acc0[t]);
            acc1[t] = _mm256_fmadd_ps(_mm256_loadu_ps(xp + t * k + j + 8), wo, acc1[t]);
        }
    }
#else
    float acc[R][kChunk] = {};
    for (int64_t j = 0; j < whole; j += kChunk)
        for (int i = 0; i < kChunk; ++i) {
            const float wv = bf16_value(w[j + i]);
            for (int t = 0; t < R; ++t)
                acc[t][i] += xp[t * k + j + i] * wv;
        }
#endif
    for (int64_t j = whole; j < k; ++j) {
        const float wv = bf16_value(w[j]);
        for (int t = 0; t < R; ++t)
            tail[t] += xp[t * k + j] * wv;
    }
    for (int t = 0; t < R; ++t) {
#if defined(__AVX512F__)
        out[t] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[t], acc1[t])) + tail[t];
#elif defined(__AVX2__)
        const __m256 v = _mm256_add_ps(acc0[t], acc1[t]);
        __m128 h       = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        h              = _mm_add_ps(h, _mm_movehl_ps(h, h));
        out[t]         = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h))) + tail[t];
#else
        const float* v = acc[t];
        out[t]         = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])) + tail[t];
#endif
    }
}
#endif

void columns(const MatmulArgs& a, const float* xp, int64_t n0, int64_t n1) {
    float out[kNf4GemvMaxRows];
    const uint16_t* w = (const uint16_t*)a.w;
    for (int64_t n = n0; n < n1; ++n) {
        const uint16_t* wn = w + n * a.k;
        for (int r0 = 0; r0 < a.rows; r0 += kGroupRows) {
            const float* x = xp + r0 * a.k;
            switch (std::min(kGroupRows, a.rows - r0)) {
            case 1:
                dot_rows<1>(wn, x, a.k, out + r0);
                break;
            case 2:
                dot_rows<2>(wn, x, a.k, out + r0);
                break;
            case 3:
                dot_rows<3>(wn, x, a.k, out + r0);
                break;
            default:
                dot_rows<4>(wn, x, a.k, out + r0);
                break;
            }
        }
        for (int t = 0; t < a.rows; ++t)
            a.y[t * a.ldy + n] = out[t];
    }
}

// Weight rows per task: kTileRows, or fewer where that gives the pool's threads a task each (the PLE's
// 256-row gate on 16 threads: 16 tasks of 16 rows instead of 4 of 64). Each output stays one thread's sum in
// a fixed order, so the results do not depend on the split.
int64_t tile_rows(const Context& c, int64_t n) {
    const int64_t per_thread = (n + c.pool->size() - 1) / c.pool->size();
    return std::clamp<int64_t>(per_thread, kMinTileRows, kTileRows);
}

} // namespace

void matmul_bf16_gemv(const Context& c, const MatmulArgs& a) {
    float* xp = c.thread_scratch(0);
    reorder_x(a, xp);
    const int64_t tr    = tile_rows(c, a.n);
    const int64_t tiles = (a.n + tr - 1) / tr;
    auto tile           = [&](int64_t t) { columns(a, xp, t * tr, std::min<int64_t>(a.n, (t + 1) * tr)); };
    if (a.n * a.k < kInline)
        for (int64_t t = 0; t < tiles; ++t)
            tile(t);
    else
        c.pool->parallel_for(tiles, [&](int64_t t, int) { tile(t); });
}

int64_t matmul_bf16_gemv_where(const Context& c, const MatmulArgs& a, float threshold) {
    float* xp = c.thread_scratch(0);
    reorder_x(a, xp);
    std::atomic<int64_t> count{0};
    const int64_t tiles = (a.n + kTileRows - 1) / kTileRows;
    auto tile           = [&](int64_t t) {
        int64_t kept = 0;
        for (int64_t n = t * kTileRows, n1 = std::min<int64_t>(a.n, n + kTileRows); n < n1; ++n)
            if (!(a.y[n] < threshold)) // a NaN bound keeps its row
                columns(a, xp, n, n + 1), ++kept;
            else
                a.y[n] = -std::numeric_limits<float>::infinity();
        if (kept) count.fetch_add(kept, std::memory_order_relaxed);
    };
    c.pool->parallel_for(tiles, [&](int64_t t, int) { tile(t); });
    return count.load();
}

} // namespace g4::cpu::G4_CPU_NS
