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
                a.y[r * a.ldy + i] = std::min(std::max(a.x[r * a.ldx + i], a.lo), a.hi);
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

// self_attention with a.bf16. work per kv head (head_floats apart, as the fp32 layout): K as bf16 k-pairs in
// panels [np / kGemmNr][D / 2][kGemmNr] (zero keys past rows), then V as key pairs [np / 2][D] (zero past
// rows). Each task: q rounded to bf16 pairs, scores [rb, np] fp32, softmax in fp32, the unnormalised
// probabilities rounded to bf16 pairs in place over the scores (zero past rows), then P . V.
using BlockBf16 = void (*)(int, int, int64_t, const uint32_t*, int64_t, const uint32_t*, int64_t, int64_t,
                           float*, int64_t, bool);
void self_attention_bf16(const Context& c, const SelfAttentionArgs& a, BlockBf16 block) {
    const int n = a.rows, D = a.dim, group = a.heads / a.kv_heads, dp = D / 2;
    constexpr int P  = kGemmNr;
    const int64_t np = pad_keys(n), head_floats = np * D + (int64_t)n * D, panels = np / P;
    float* kv = a.work;
    c.pool->parallel_for((int64_t)a.kv_heads * panels, [&](int64_t task, int) {
        const int h = (int)(task / panels), j0 = (int)(task % panels) * P;
        uint16_t* kp = (uint16_t*)(kv + h * head_floats) + (int64_t)j0 * D; // [dp][P] pairs
        uint16_t* vp = (uint16_t*)(kv + h * head_floats + np * D / 2);      // [np / 2][D] pairs
        uint16_t row[2 * kSelfAttentionBf16MaxDim];
        for (int j = j0; j < j0 + P; ++j) {
            if (j < n) {
                round_to_bf16(a.k + (int64_t)j * a.ldk + (int64_t)h * D, D, row);
                round_to_bf16(a.v + (int64_t)j * a.ldv + (int64_t)h * D, D, row + D);
            } else {
                std::memset(row, 0, sizeof(uint16_t) * 2 * D);
            }
            for (int d = 0; d < D; ++d) {
                kp[((int64_t)(d >> 1) * P + (j - j0)) * 2 + (d & 1)] = row[d];
                vp[((int64_t)(j >> 1) * D + d) * 2 + (j & 1)]        = row[D + d];
            }
        }
    });
    const int blocks = (n + kSelfAttentionRows - 1) / kSelfAttentionRows;
    c.pool->parallel_for((int64_t)blocks * a.heads, [&](int64_t task, int th) {
        const int h = (int)(task % a.heads), r0 = (int)(task / a.heads) * kSelfAttentionRows;
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
        for (int r = 0; r < rb; ++r) {
            float* sr = s + (size_t)r * np;
            Eigen::Map<Eigen::ArrayXf> row(sr, n);
            if (a.scale != 1.0f) row *= a.scale;
            row          = (row - row.maxCoeff()).exp();
            inv_sum[r]   = 1.0f / row.sum();
            uint16_t* pr = (uint16_t*)sr; // in place: element j moves from byte 4j to 2j
            for (int j0 = 0; j0 < n; j0 += 64) {
                float tmp[64];
                const int m = std::min(64, n - j0);
                std::memcpy(tmp, sr + j0, sizeof(float) * m);
                round_to_bf16(tmp, m, pr + j0);
            }
            std::memset(pr + n, 0, sizeof(uint16_t) * (np - n));
        }
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
