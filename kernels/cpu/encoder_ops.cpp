// Eigen CPU kernels of the encoder-program ops (ops.h: Clamp .. PoolRows), multi-threaded over the
// Context's pool in blocks of rows. The attention packs K^T so that both of its products run through the
// register-blocked gemm_block.
#include "kernels/cpu/level.h"
#include "kernels/cpu/simd.h"
#include "kernels/ref/ref.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace g4::cpu::G4_CPU_NS {

static_assert(kSelfAttentionKeyPad == kGemmNr, "ops.h's key padding is the GEMM panel width");

namespace {

// Rows [0, rows) in parallel blocks (inline when small).
template <class F> void for_row_blocks(const Context& c, int rows, int64_t cols, F&& f) {
    constexpr int kBlock = 64;
    const int blocks     = (rows + kBlock - 1) / kBlock;
    if ((int64_t)rows * cols < (1 << 14) || c.pool->size() == 1 || blocks == 1) {
        f(0, rows);
        return;
    }
    c.pool->parallel_for(blocks, [&](int64_t b, int) {
        const int r0 = (int)b * kBlock;
        f(r0, std::min(rows, r0 + kBlock));
    });
}

int64_t pad_keys(int64_t n) {
    return (n + kGemmNr - 1) / kGemmNr * kGemmNr;
}

} // namespace

void clamp(const Context& c, const ClampArgs& a) {
    for_row_blocks(c, a.rows, a.cols, [&](int r0, int r1) {
        for (int r = r0; r < r1; ++r)
            for (int64_t i = 0; i < a.cols; ++i)
                a.y[r * a.ldy + i] = clamp_value(a.x[r * a.ldx + i], a.lo, a.hi);
    });
}

void add_position_2d(const Context& c, const AddPosition2DArgs& a) {
    for_row_blocks(c, a.rows, a.cols, [&](int r0, int r1) {
        for (int r = r0; r < r1; ++r) {
            const int64_t ox = (int64_t)a.pos[2 * r] * a.cols, oy = (a.positions + a.pos[2 * r + 1]) * a.cols;
            for (int64_t e = 0; e < a.cols; ++e)
                a.y[r * a.ldy + e] = a.x[r * a.ldx + e] + (ref::load_weight(a.table, a.dt, ox + e) +
                                                           ref::load_weight(a.table, a.dt, oy + e));
        }
    });
}

void rope_2d(const Context& c, const Rope2DArgs& a) {
    const int quarter = a.dim / 4;
    for_row_blocks(c, a.rows, (int64_t)a.heads * a.dim * 4, [&](int r0, int r1) {
        for (int r = r0; r < r1; ++r)
            for (int axis = 0; axis < 2; ++axis) {
                const float pos = (float)a.pos[2 * r + axis];
                for (int m = 0; m < quarter; ++m) {
                    const float ang = pos * a.inv_freq[m];
                    const float cs = std::cos(ang), sn = std::sin(ang);
                    for (int h = 0; h < a.heads; ++h) {
                        float* x       = a.x + r * a.ldx + (int64_t)h * a.dim + axis * (a.dim / 2);
                        const float x0 = x[m], x1 = x[m + quarter];
                        x[m]           = x0 * cs - x1 * sn;
                        x[m + quarter] = x1 * cs + x0 * sn;
                    }
                }
            }
    });
}

size_t self_attention_thread_floats(int64_t max_rows) {
    return (size_t)kSelfAttentionRows * (pad_keys(max_rows) + 1);
}

namespace {

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define G4_ATTN_AVX512 1

// exp on 16 floats: x = n ln2 + r, n = round(x log2 e), r with ln2 in two parts, exp(r) = 1 + r + r^2 p(r)
// (Cephes' polynomial, Eigen's order), then times 2^n by scalef (to zero below the float range). Within a few
// ulps of exp; a NaN stays NaN.
inline __m512 exp16(__m512 x) {
    x              = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r       = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r              = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p       = _mm512_fmadd_ps(_mm512_set1_ps(1.9875691500e-4f), r, _mm512_set1_ps(1.3981999507e-3f));
    p              = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p              = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p              = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p              = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p              = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

// The bf16 rounding of the probabilities: with AVX-512 BF16 (this copy's flags, or a function-level target
// where only the level's BF16 and AMX tables run the bf16 attention) vcvtneps2bf16, round to nearest even as
// to_bf16x16 but for fp32 denormals (exps below 2^-126), which it flushes to zero; the products (vdpbf16ps,
// tdpbf16ps) read bf16 denormals as zero, so the attention's result is the same.
#if defined(__AVX512BF16__)
#define G4_ATTN_CVT 1
#define G4_ATTN_TARGET
#elif defined(G4_CPU_BF16_TABLE)
#define G4_ATTN_CVT 1
#define G4_ATTN_TARGET __attribute__((target("avx512bf16")))
#else
#define G4_ATTN_TARGET
#endif
G4_ATTN_TARGET inline __m256i probs_bf16(__m512 e) {
#if G4_ATTN_CVT
    return (__m256i)_mm512_cvtneps_pbh(e);
#else
    return to_bf16x16(e);
#endif
}

// One row of scores s[0, n): x = scale * s (SCALED, else s), p = exp(x - max x) in fp32, written as bf16 over
// the row in place (element j moves from byte 4j to 2j: each 32 floats are read before their 32 bf16 are
// written, at or behind them), bf16 zeros from n to np. Returns the fp32 sum of the p before rounding (two
// vector sums over alternate 16-float chunks, the tail in the first, then added lane by lane and reduced).
template <bool SCALED> G4_ATTN_TARGET float softmax_row(float* s, int n, int64_t np, float scale) {
    const __m512 sc = _mm512_set1_ps(scale);
    auto load       = [&](const float* x) {
        return SCALED ? _mm512_mul_ps(_mm512_loadu_ps(x), sc) : _mm512_loadu_ps(x);
    };
    auto load_tail = [&](__mmask16 m, const float* x) {
        const __m512 v = _mm512_maskz_loadu_ps(m, x);
        return SCALED ? _mm512_mul_ps(v, sc) : v;
    };
    __m512 mx0 = _mm512_set1_ps(-INFINITY), mx1 = mx0;
    int j = 0;
    for (; j + 32 <= n; j += 32) {
        mx0 = _mm512_max_ps(mx0, load(s + j));
        mx1 = _mm512_max_ps(mx1, load(s + j + 16));
    }
    for (; j < n; j += 16) {
        const __mmask16 m = (__mmask16)((1u << std::min(16, n - j)) - 1u);
        mx0               = _mm512_mask_max_ps(mx0, m, mx0, load_tail(m, s + j));
    }
    const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(_mm512_max_ps(mx0, mx1)));
    uint16_t* p     = (uint16_t*)s;
    __m512 sum0 = _mm512_setzero_ps(), sum1 = sum0;
    for (j = 0; j + 32 <= n; j += 32) {
        const __m512 x0 = load(s + j), x1 = load(s + j + 16);
        const __m512 e0 = exp16(_mm512_sub_ps(x0, mv)), e1 = exp16(_mm512_sub_ps(x1, mv));
        sum0 = _mm512_add_ps(sum0, e0);
        sum1 = _mm512_add_ps(sum1, e1);
        _mm256_storeu_si256((__m256i*)(p + j), probs_bf16(e0));
        _mm256_storeu_si256((__m256i*)(p + j + 16), probs_bf16(e1));
    }
    for (; j < n; j += 16) {
        const __mmask16 m = (__mmask16)((1u << std::min(16, n - j)) - 1u);
        const __m512 e    = exp16(_mm512_sub_ps(load_tail(m, s + j), mv));
        sum0              = _mm512_mask_add_ps(sum0, m, sum0, e);
        _mm256_mask_storeu_epi16(p + j, m, probs_bf16(e));
    }
    std::memset(p + n, 0, sizeof(uint16_t) * (np - n));
    return _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
}
float softmax_row_bf16(float* s, int n, int64_t np, float scale) {
    return scale == 1.0f ? softmax_row<false>(s, n, np, scale) : softmax_row<true>(s, n, np, scale);
}
#else
// The same with Eigen's vectorised exp and a scalar rounding pass (levels without AVX-512, whose
// self_attention runs a.bf16 as fp32: only the definition's reference here).
float softmax_row_bf16(float* s, int n, int64_t np, float scale) {
    Eigen::Map<Eigen::ArrayXf> row(s, n);
    if (scale != 1.0f) row *= scale;
    row             = (row - row.maxCoeff()).exp();
    const float sum = row.sum();
    uint16_t* p     = (uint16_t*)s;
    for (int j = 0; j < n; ++j)
        p[j] = f32_to_bf16(s[j]); // reads byte 4j before writing byte 2j
    std::memset(p + n, 0, sizeof(uint16_t) * (np - n));
    return sum;
}
#endif

// Keys [j0, j0 + kGemmNr) of kv head h packed (see self_attention_bf16): K as kp[dp][kGemmNr] pairs, V as
// key pairs vp[(j0 + 2t) / 2][D], zero past rows.
void pack_kv_panel(const SelfAttentionArgs& a, int h, int j0, uint32_t* kp, uint32_t* vp) {
    constexpr int P = kGemmNr;
    const int n = a.rows, D = a.dim, dp = D / 2;
    alignas(64) uint16_t kr[P * kSelfAttentionBf16MaxDim]; // [P][D] bf16 keys
    for (int j = 0; j < P; ++j) {
        if (j0 + j < n)
            round_to_bf16(a.k + (int64_t)(j0 + j) * a.ldk + (int64_t)h * D, D, kr + j * D);
        else
            std::memset(kr + j * D, 0, sizeof(uint16_t) * D);
    }
    const uint32_t* k32 = (const uint32_t*)kr;
#if G4_ATTN_AVX512
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(dp));
    for (int q = 0; q < dp; ++q)
        for (int v = 0; v < P / 16; ++v)
            _mm512_storeu_si512(kp + q * P + 16 * v,
                                _mm512_i32gather_epi32(idx, (const int*)(k32 + 16 * v * dp + q), 4));
    auto v_row = [&](int j) { return j < n ? a.v + (int64_t)j * a.ldv + (int64_t)h * D : nullptr; };
    for (int t = 0; t < P / 2; ++t) {
        const int j     = j0 + 2 * t;
        const float *v0 = v_row(j), *v1 = v_row(j + 1);
        uint32_t* d = vp + (int64_t)(j / 2) * D;
        for (int e = 0; e < D; e += 16) {
            const __mmask16 m = (__mmask16)((1u << std::min(16, D - e)) - 1u);
            const __m512i lo  = v0 ? _mm512_cvtepu16_epi32(to_bf16x16(_mm512_maskz_loadu_ps(m, v0 + e)))
                                   : _mm512_setzero_si512();
            const __m512i hi  = v1 ? _mm512_cvtepu16_epi32(to_bf16x16(_mm512_maskz_loadu_ps(m, v1 + e)))
                                   : _mm512_setzero_si512();
            _mm512_mask_storeu_epi32(d + e, m, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
    }
#else
    for (int q = 0; q < dp; ++q)
        for (int j = 0; j < P; ++j)
            kp[q * P + j] = k32[j * dp + q];
    for (int t = 0; t < P / 2; ++t) {
        const int j = j0 + 2 * t;
        uint32_t* d = vp + (int64_t)(j / 2) * D;
        for (int e = 0; e < D; ++e) {
            const uint32_t lo = j < n ? f32_to_bf16(a.v[(int64_t)j * a.ldv + (int64_t)h * D + e]) : 0;
            const uint32_t hi =
                j + 1 < n ? f32_to_bf16(a.v[(int64_t)(j + 1) * a.ldv + (int64_t)h * D + e]) : 0;
            d[e] = lo | hi << 16;
        }
    }
#endif
}

// self_attention with a.bf16. work per kv head (head_floats apart, as the fp32 layout): K as bf16 k-pairs in
// panels [np / kGemmNr][D / 2][kGemmNr] (zero keys past rows), then V as key pairs [np / 2][D] (zero past
// rows), packed a panel of keys per task. Then tasks of kSelfAttentionRows query rows of one head, a head's
// blocks consecutive (a thread's next task mostly reads the K and V its last one read): q rounded to bf16
// pairs, scores [rb, np] fp32, softmax_row_bf16 over each row, then P . V scaled by 1 / sum.
using BlockBf16 = void (*)(int, int, int64_t, const uint32_t*, int64_t, const uint32_t*, int64_t, int64_t,
                           float*, int64_t, bool);
void self_attention_bf16(const Context& c, const SelfAttentionArgs& a, BlockBf16 block) {
    const int n = a.rows, D = a.dim, group = a.heads / a.kv_heads, dp = D / 2;
    constexpr int P  = kGemmNr;
    const int64_t np = pad_keys(n), head_floats = np * D + (int64_t)n * D, panels = np / P;
    float* kv = a.work;
    c.pool->parallel_for((int64_t)a.kv_heads * panels, [&](int64_t task, int) {
        const int h = (int)(task / panels), j0 = (int)(task % panels) * P;
        uint32_t* kh = (uint32_t*)(kv + h * head_floats);
        pack_kv_panel(a, h, j0, kh + (int64_t)j0 * dp, kh + np * D / 2);
    });
    const int blocks = (n + kSelfAttentionRows - 1) / kSelfAttentionRows;
    c.pool->parallel_for((int64_t)blocks * a.heads, [&](int64_t task, int th) {
        const int h = (int)(task / blocks), r0 = (int)(task % blocks) * kSelfAttentionRows;
        const int rb       = std::min(kSelfAttentionRows, n - r0);
        const float* kh    = kv + (int64_t)(h / group) * head_floats;
        const uint32_t* kb = (const uint32_t*)kh;
        const uint32_t* vb = (const uint32_t*)(kh + np * D / 2);
        uint32_t qp[kSelfAttentionRows * kSelfAttentionBf16MaxDim / 2];
        for (int r = 0; r < rb; ++r)
            round_to_bf16(a.q + (int64_t)(r0 + r) * a.ldq + (int64_t)h * D, D, (uint16_t*)(qp + r * dp));
        float* s = c.thread_scratch(th); // [rb, np]
        block(rb, (int)np, dp, qp, dp, kb, P, (int64_t)dp * P, s, np, false);
        float* inv_sum = s + (size_t)rb * np; // [rb]
        for (int r = 0; r < rb; ++r)
            inv_sum[r] = 1.0f / softmax_row_bf16(s + (size_t)r * np, n, np, a.scale);
        float* out = a.y + (int64_t)r0 * a.ldy + (int64_t)h * D;
        block(rb, D, np / 2, (const uint32_t*)s, np, vb, D, P, out, a.ldy, false);
        for (int r = 0; r < rb; ++r)
            Eigen::Map<Eigen::ArrayXf>(out + (int64_t)r * a.ldy, D) *= inv_sum[r];
    });
}

} // namespace

#if defined(G4_CPU_BF16_TABLE)
void self_attention_dpbf16(const Context& c, const SelfAttentionArgs& a) {
    if (a.bf16)
        self_attention_bf16(c, a, &gemm_block_bf16_dpbf16);
    else
        self_attention(c, a);
}
#endif
#if defined(G4_CPU_AMX_TABLE)
void self_attention_amx(const Context& c, const SelfAttentionArgs& a) {
    if (a.bf16)
        self_attention_bf16(c, a, &gemm_block_bf16_amx);
    else
        self_attention(c, a);
}
#endif

// work: per kv head, K^T as panels [np / kGemmNr][D][kGemmNr] (np = rows rounded up to kGemmNr, zero keys
// past rows) followed by its V [rows, D], so that both GEMMs read their right operand contiguously.
void self_attention(const Context& c, const SelfAttentionArgs& a) {
    if (a.bf16 && gemm_has_avx512_bf16()) {
        self_attention_bf16(c, a, &gemm_block_bf16);
        return;
    }
    const int n = a.rows, D = a.dim, group = a.heads / a.kv_heads;
    constexpr int P  = kGemmNr;
    const int64_t np = pad_keys(n), head_floats = np * D + (int64_t)n * D, panels = np / P;
    float* kv = a.work;
    c.pool->parallel_for((int64_t)a.kv_heads * panels, [&](int64_t task, int) {
        const int h = (int)(task / panels), j0 = (int)(task % panels) * P;
        float* kt = kv + h * head_floats + (int64_t)j0 * D; // [D][P]
        float* vp = kv + h * head_floats + np * D;          // [n][D]
        for (int j = j0; j < j0 + P; ++j) {
            const float* ks = a.k + (int64_t)j * a.ldk + (int64_t)h * D;
            for (int d = 0; d < D; ++d)
                kt[d * P + (j - j0)] = j < n ? ks[d] : 0.0f;
            if (j < n)
                std::memcpy(vp + (int64_t)j * D, a.v + (int64_t)j * a.ldv + (int64_t)h * D,
                            sizeof(float) * D);
        }
    });
    const int blocks = (n + kSelfAttentionRows - 1) / kSelfAttentionRows;
    c.pool->parallel_for((int64_t)blocks * a.heads, [&](int64_t task, int th) {
        const int h = (int)(task % a.heads), r0 = (int)(task / a.heads) * kSelfAttentionRows;
        const int rb    = std::min(kSelfAttentionRows, n - r0);
        const float* kh = kv + (int64_t)(h / group) * head_floats;
        const float* qh = a.q + (int64_t)r0 * a.ldq + (int64_t)h * D;
        float* s        = c.thread_scratch(th); // [rb, np]
        for (int64_t p = 0; p < panels; ++p)
            gemm_block(rb, P, D, qh, a.ldq, kh + p * D * P, P, s + p * P, np, false);
        float* inv_sum = s + (size_t)rb * np; // [rb]
        for (int r = 0; r < rb; ++r) {
            Eigen::Map<Eigen::ArrayXf> row(s + (size_t)r * np, n);
            if (a.scale != 1.0f) row *= a.scale;
            row        = (row - row.maxCoeff()).exp();
            inv_sum[r] = 1.0f / row.sum();
        }
        float* out = a.y + (int64_t)r0 * a.ldy + (int64_t)h * D;
        gemm_block(rb, D, n, s, np, kh + np * D, D, out, a.ldy, false);
        for (int r = 0; r < rb; ++r)
            Eigen::Map<Eigen::ArrayXf>(out + (int64_t)r * a.ldy, D) *= inv_sum[r];
    });
}

// Each output row sums its taps in index order, from zero (w * x each), as one fp32 sum per element.
void pool_rows(const Context& c, const PoolRowsArgs& a) {
    for_row_blocks(c, a.rows, (int64_t)a.cols * a.taps, [&](int r0, int r1) {
        for (int r = r0; r < r1; ++r) {
            float* y = a.y + r * a.ldy;
            std::memset(y, 0, sizeof(float) * a.cols);
            for (int j = 0; j < a.taps; ++j) {
                const float* x = a.x + (int64_t)a.index[r * a.taps + j] * a.ldx;
                for (int64_t e = 0; e < a.cols; ++e)
                    y[e] += a.w * x[e];
            }
        }
    });
}

// Rows in pieces of kGeluPiece columns, so that the few rows of a prefill chunk spread over the pool too.
// Inner piece boundaries lie on 64-byte aligned addresses of y: Eigen's vectorised loop peels to y's
// alignment, so each element goes through the same (packet or scalar) path as in a whole row and the result
// does not depend on the split.
void gelu_mul_vec(const Context& c, const BinaryArgs& a) {
    constexpr int64_t kGeluPiece = 1024;
    const int64_t pieces         = (a.cols + 16 + kGeluPiece - 1) / kGeluPiece; // per row, at most
    auto piece                   = [&](int r, int64_t c0, int64_t c1) {
        Eigen::Map<const Eigen::ArrayXf> x(a.a + r * a.lda + c0, c1 - c0), up(a.b + r * a.ldb + c0, c1 - c0);
        Eigen::Map<Eigen::ArrayXf>(a.y + r * a.ldy + c0, c1 - c0) =
            0.5f * x * (1.0f + (0.7978845608028654f * (x + 0.044715f * x.cube())).tanh()) * up;
    };
    if ((int64_t)a.rows * a.cols * 16 < (1 << 14) || c.pool->size() == 1 || a.rows * pieces == 1) {
        for (int r = 0; r < a.rows; ++r)
            piece(r, 0, a.cols);
        return;
    }
    c.pool->parallel_for(a.rows * pieces, [&](int64_t task, int) {
        const int r = (int)(task / pieces), p = (int)(task % pieces);
        // columns before y's row reaches a 64-byte boundary (whole floats: y is 4-byte aligned)
        const int64_t head = (int64_t)((64 - (uintptr_t)(a.y + r * a.ldy) % 64) % 64) / 4;
        const int64_t c0   = p == 0 ? 0 : std::min<int64_t>(a.cols, head + p * kGeluPiece);
        const int64_t c1   = std::min<int64_t>(a.cols, head + (p + 1) * kGeluPiece);
        if (c0 < c1) piece(r, c0, c1);
    });
}

} // namespace g4::cpu::G4_CPU_NS
