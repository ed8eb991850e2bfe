// LM-head screening on the CPU (cpu.h lm_screen_*): an int8 copy of a bf16 head bounds every logit of a
// greedy decode step from one byte a weight, so that only the rows that can hold the argmax are computed
// exactly (matmul_bf16_gemv_where). The bound, for row r with w = the bf16 row, q its int8 copy, s its
// scale, x the step's input and xq = round(x / sx) (sx = max|x| / 127):
//   w.x = (w - s q).x + s q.(x - sx xq) + s sx (q.xq), so
//   |w.x - s sx (q.xq)| <= d ||x||_2 + s ||q||_2 ||x - sx xq||_2      (Cauchy-Schwarz twice),
// d >= ||w - s q||_2 and ||q||_2 stored per row (rounded up), ||x - sx xq||_2 computed in double and rounded
// up. q.xq is an exact integer sum (|q|, |xq| <= 127). The exact logit is the head GEMV's float32 sum, within
// gamma_K sum |w_i x_i| <= gamma_K 128 s ||x||_1 of w.x, plus the LoRA bias added after it (one rounding),
// and lo / hi take those roundings and the screen's own (4e-7 (|a| + |b|)) with a 1.0001 factor on top.
// The integer dot: vpdpbusd (AVX-512 VNNI, on (xq + 128) as bytes and q, less 128 sum(q)), else maddubs on
// |xq| and q carrying xq's sign (AVX-512 BW, AVX2; each pair sum <= 2 * 127 * 127 fits int16), sdot on
// aarch64 with the dot product instructions (dotprod), smull + smlal2 pairs (each <= 2 * 127 * 127) added
// into int32 lanes (sadalp) with Advanced SIMD (neon), else a plain loop: the same integers at every level.
#include "kernels/cpu/level.h"
#include "kernels/cpu/simd.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

namespace g4::cpu::G4_CPU_NS {
namespace {

constexpr int64_t kScreenTile = 256; // rows per task

inline float bf16_float(uint16_t v) {
    const uint32_t u = (uint32_t)v << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

inline uint32_t order_key(float f) { // unsigned order = float order (NaN aside)
    uint32_t b;
    std::memcpy(&b, &f, sizeof b);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}
inline float from_key(uint32_t k) {
    const uint32_t b = (k & 0x80000000u) ? k & 0x7fffffffu : ~k;
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
}

// Rounds a non-negative double up to a float that bounds it.
inline float up(double v) {
    return (float)(v * (1.0 + 1e-6)) * (1.0f + 1e-6f);
}

// q.xq for one row: xs = xq as int8; xu = xq + 128 as bytes and qsum = sum(q) (for the VNNI dot).
using DotFn = int32_t (*)(const int8_t* q, const int8_t* xs, const uint8_t* xu, int64_t k, int32_t qsum);

[[maybe_unused]] int32_t dot_q(const int8_t* q, const int8_t* xs, const uint8_t*, int64_t k, int32_t) {
    int64_t j   = 0;
    int32_t acc = 0;
#if defined(__AVX512BW__)
    const __m512i ones = _mm512_set1_epi16(1), zero = _mm512_setzero_si512();
    __m512i s0 = _mm512_setzero_si512();
    for (; j + 64 <= k; j += 64) {
        const __m512i xv   = _mm512_loadu_si512(xs + j);
        const __m512i qv   = _mm512_loadu_si512(q + j);
        const __mmask64 ng = _mm512_movepi8_mask(xv);
        const __m512i qs   = _mm512_mask_sub_epi8(qv, ng, zero, qv);
        const __m512i p    = _mm512_maddubs_epi16(_mm512_abs_epi8(xv), qs);
        s0                 = _mm512_add_epi32(s0, _mm512_madd_epi16(p, ones));
    }
    acc = _mm512_reduce_add_epi32(s0);
#elif defined(__AVX2__)
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s0         = _mm256_setzero_si256();
    for (; j + 32 <= k; j += 32) {
        const __m256i xv = _mm256_loadu_si256((const __m256i*)(xs + j));
        const __m256i qv = _mm256_loadu_si256((const __m256i*)(q + j));
        const __m256i p  = _mm256_maddubs_epi16(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(qv, xv));
        s0               = _mm256_add_epi32(s0, _mm256_madd_epi16(p, ones));
    }
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s0), _mm256_extracti128_si256(s0, 1));
    h         = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    h         = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
    acc       = _mm_cvtsi128_si32(h);
#elif defined(__ARM_FEATURE_DOTPROD)
    int32x4_t s0 = vdupq_n_s32(0), s1 = vdupq_n_s32(0);
    for (; j + 32 <= k; j += 32) {
        s0 = vdotq_s32(s0, vld1q_s8(q + j), vld1q_s8(xs + j));
        s1 = vdotq_s32(s1, vld1q_s8(q + j + 16), vld1q_s8(xs + j + 16));
    }
    acc = vaddvq_s32(vaddq_s32(s0, s1));
#elif defined(__ARM_NEON)
    int32x4_t s0 = vdupq_n_s32(0);
    for (; j + 16 <= k; j += 16) {
        const int8x16_t qv = vld1q_s8(q + j), xv = vld1q_s8(xs + j);
        const int16x8_t p = vmlal_high_s8(vmull_s8(vget_low_s8(qv), vget_low_s8(xv)), qv, xv);
        s0                = vpadalq_s16(s0, p);
    }
    acc = vaddvq_s32(s0);
#endif
    for (; j < k; ++j)
        acc += (int32_t)q[j] * (int32_t)xs[j];
    return acc;
}

#if defined(G4_CPU_VNNI_VARIANT) || defined(__AVX512VNNI__)
#if defined(G4_CPU_VNNI_VARIANT)
#pragma GCC push_options
#pragma GCC target("avx512vnni")
#endif
int32_t dot_q_vnni(const int8_t* q, const int8_t* xs, const uint8_t* xu, int64_t k, int32_t qsum) {
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    int64_t j = 0;
    for (; j + 128 <= k; j += 128) {
        s0 = _mm512_dpbusd_epi32(s0, _mm512_loadu_si512(xu + j), _mm512_loadu_si512(q + j));
        s1 = _mm512_dpbusd_epi32(s1, _mm512_loadu_si512(xu + j + 64), _mm512_loadu_si512(q + j + 64));
    }
    for (; j + 64 <= k; j += 64)
        s0 = _mm512_dpbusd_epi32(s0, _mm512_loadu_si512(xu + j), _mm512_loadu_si512(q + j));
    int32_t acc = _mm512_reduce_add_epi32(_mm512_add_epi32(s0, s1)) - 128 * qsum;
    for (; j < k; ++j) // the tail adds q.xq itself: its part of the offset comes back
        acc += (int32_t)q[j] * ((int32_t)xs[j] + 128);
    return acc;
}
#if defined(G4_CPU_VNNI_VARIANT)
#pragma GCC pop_options
#endif
#endif

template <DotFn Dot> LmScreenResult screen(const Context& c, const LmScreenArgs& a) {
    LmScreenResult res{};
    const int64_t k = a.k;
    double l1 = 0, l2 = 0, mx = 0;
    for (int64_t i = 0; i < k; ++i) {
        const double v = a.x[i];
        l1 += std::fabs(v), l2 += v * v, mx = std::max(mx, std::fabs(v));
    }
    if (!std::isfinite(l1) || !std::isfinite(l2) || mx == 0) return res; // not screened
    const float sx = (float)mx / 127.0f;
    int8_t* xs     = (int8_t*)c.thread_scratch(0);
    uint8_t* xu    = (uint8_t*)xs + ((k + 63) / 64 * 64);
    double e2      = 0;
    for (int64_t i = 0; i < k; ++i) {
        const int qi = std::clamp((int)std::nearbyint(a.x[i] / sx), -127, 127);
        xs[i] = (int8_t)qi, xu[i] = (uint8_t)(qi + 128);
        const double d = (double)a.x[i] - (double)sx * qi;
        e2 += d * d;
    }
    const float gam = (float)(k + 8) * 6.0e-8f, xl1 = up(l1), xl2 = up(std::sqrt(l2)), ex = up(std::sqrt(e2));
    std::atomic<uint32_t> best{order_key(-std::numeric_limits<float>::infinity())};
    const int64_t tiles = (a.n + kScreenTile - 1) / kScreenTile;
    auto tile           = [&](int64_t t) {
        const int64_t r0 = t * kScreenTile, r1 = std::min(a.n, r0 + kScreenTile);
        float mlo = -std::numeric_limits<float>::infinity();
        for (int64_t r = r0; r < r1; ++r) {
            const int32_t d = Dot(a.q + r * k, xs, xu, k, a.qsum[r]);
            const float sr = a.scale[r], b = a.bias ? a.bias[r] : 0.0f;
            const float v = (float)((double)sr * (double)sx * (double)d) + b;
            const float B = (a.bound[r] * xl2 + sr * a.qnorm[r] * ex + 2.0f * gam * 128.0f * sr * xl1 +
                             4.0e-7f * (std::fabs(v) + std::fabs(b))) *
                                1.0001f +
                            1e-30f;
            a.hi[r] = v + B;
            if (a.lo) a.lo[r] = v - B;
            mlo = std::max(mlo, v - B);
        }
        uint32_t cur       = best.load(std::memory_order_relaxed);
        const uint32_t key = order_key(mlo);
        while (key > cur && !best.compare_exchange_weak(cur, key, std::memory_order_relaxed)) {
        }
    };
    if (a.n * k < (1 << 19))
        for (int64_t t = 0; t < tiles; ++t)
            tile(t);
    else
        c.pool->parallel_for(tiles, [&](int64_t t, int) { tile(t); });
    res.max_lo   = from_key(best.load());
    res.screened = std::isfinite(res.max_lo);
    return res;
}

} // namespace

// Written so that the compiler vectorises it (integer max and sums, 16 independent float lanes): ~0.3 ns a
// weight instead of ~5 with double sums. The residuals d_i = fl(v_i - fl(s q_i)) are within u (127 s + |d_i|)
// of the exact ones (u = 2^-24) and their float sum of squares within gamma_K of its value, so
// bound = sqrt(sum) (1 + (k + 16) 1.2e-7) + 128 s 1.2e-7 sqrt(k) >= ||w - s q||_2.
void lm_screen_build(const uint16_t* w, int64_t k, int64_t r0, int64_t r1, const LmScreenCopy& out) {
    constexpr int L = 16;
    for (int64_t r = r0; r < r1; ++r) {
        const uint16_t* row = w + r * k;
        uint16_t mb         = 0; // max |w| as bits: bf16 magnitudes order as their bits (NaN aside)
        for (int64_t i = 0; i < k; ++i)
            mb = std::max<uint16_t>(mb, row[i] & 0x7FFF);
        const float s = bf16_float(mb) / 127.0f, inv = s > 0.0f ? 1.0f / s : 0.0f;
        int8_t* q   = out.q + r * k;
        float e2[L] = {};
        int32_t q2 = 0, qs = 0;
        auto one = [&](int64_t i, float& acc) {
            const float v  = bf16_float(row[i]);
            const float t  = std::min(127.0f, std::max(-127.0f, v * inv));
            const float qf = (t + 12582912.0f) - 12582912.0f; // to nearest, ties to even (|t| <= 127)
            const int qi   = (int)qf;
            q[i]           = (int8_t)qi;
            const float d  = v - s * qf;
            acc += d * d, q2 += qi * qi, qs += qi;
        };
        int64_t i = 0;
        for (; i + L <= k; i += L)
            for (int l = 0; l < L; ++l)
                one(i + l, e2[l]);
        for (; i < k; ++i)
            one(i, e2[0]);
        double sum = 0;
        for (float e : e2)
            sum += e;
        out.scale[r] = s;
        out.bound[r] = up(std::sqrt(sum) * (1.0 + (double)(k + 16) * 1.2e-7) +
                          128.0 * s * 1.2e-7 * std::sqrt((double)k));
        out.qnorm[r] = up(std::sqrt((double)q2));
        out.qsum[r]  = qs;
    }
}

LmScreenResult lm_screen(const Context& c, const LmScreenArgs& a) {
#if defined(__AVX512VNNI__)
    return screen<dot_q_vnni>(c, a);
#else
    return screen<dot_q>(c, a);
#endif
}

#if defined(G4_CPU_VNNI_VARIANT)
LmScreenResult lm_screen_vnni(const Context& c, const LmScreenArgs& a) {
    return screen<dot_q_vnni>(c, a);
}
#endif

} // namespace g4::cpu::G4_CPU_NS
