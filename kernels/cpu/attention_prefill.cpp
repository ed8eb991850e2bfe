// Causal attention over many query rows (prefill chunks of `--cpu-precision fast` plans; see cpu.h): a task
// takes the query heads of a few consecutive rows that share one kv head (up to kPrefillQueries vectors) and
// walks their keys in blocks of kPrefillKeys cache slots, so that each key and value row is read once for all
// of them. Scores and the weighted sum of values are Eigen matrix products; the softmax is online (running
// maximum and sum per query, flash-attention style), so scratch does not grow with the context.
#include "kernels/cpu/level.h"
#include "kernels/cpu/simd.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace g4::cpu::G4_CPU_NS {

namespace {

constexpr int kPrefillQueries = 16; // query vectors (rows x heads of one kv head) per task
constexpr int kPrefillKeys    = 64; // keys per block

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapRM  = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;
using MapRMc = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;

int rows_per_task(const AttentionArgs& a) {
    return std::max(1, kPrefillQueries / (a.heads / a.kv_heads));
}

// Query vectors of one task: rows_per_task rows x the kv head's group.
int64_t task_queries(const AttentionArgs& a) {
    return (int64_t)rows_per_task(a) * (a.heads / a.kv_heads);
}

} // namespace

size_t attention_prefill_floats(const AttentionArgs& a) {
    const int64_t nq = task_queries(a);
    const int64_t d  = (a.dim + 15) / 16 * 16; // rows of 64-byte multiples
    return (size_t)(2 * nq * d + nq * kPrefillKeys + (2 * nq + 15) / 16 * 16 + 2 * (int64_t)kPrefillKeys * d +
                    16);
}

void attention_prefill(const Context& c, const AttentionArgs& a) {
    if (c.scratch_stride < attention_prefill_floats(a)) {
        attention(c, a);
        return;
    }
    const int group = a.heads / a.kv_heads, rpt = rows_per_task(a);
    const int64_t width = (int64_t)a.kv_heads * a.dim, blocks = (a.rows + rpt - 1) / rpt;
    c.pool->parallel_for(blocks * a.kv_heads, [&](int64_t task, int th) {
        const int g = (int)(task % a.kv_heads), t0 = (int)(task / a.kv_heads) * rpt;
        const int t1 = std::min(a.rows, t0 + rpt), nq = (t1 - t0) * group;
        const int64_t d = (a.dim + 15) / 16 * 16;
        // 64-byte aligned, whatever the scratch's base: Eigen's vectorised loops peel by alignment, and the
        // result must not depend on which thread runs the task
        float* Qp  = (float*)(((uintptr_t)c.thread_scratch(th) + 63) & ~(uintptr_t)63);
        float* Yp  = Qp + nq * d;
        float* Sp  = Yp + nq * d;
        float* mx  = Sp + (int64_t)nq * kPrefillKeys;
        float* sum = mx + nq;
        float* kw  = mx + (2 * nq + 15) / 16 * 16; // widened bf16 key and value rows
        float* vw  = kw + (int64_t)kPrefillKeys * d;
        // query i: row t0 + i / group, head g * group + i % group
        MapRM Q(Qp, nq, a.dim, Eigen::OuterStride<>(d)), Y(Yp, nq, a.dim, Eigen::OuterStride<>(d));
        for (int i = 0; i < nq; ++i) {
            const int t = t0 + i / group, h = g * group + i % group;
            Q.row(i) =
                Eigen::Map<const Eigen::RowVectorXf>(a.q + t * a.ldq + (int64_t)h * a.dim, a.dim) * a.scale;
            mx[i]  = -INFINITY;
            sum[i] = 0.0f;
        }
        Y.setZero();
        const int first = a.pos0 + t0, last = a.pos0 + t1 - 1;
        const int lo = a.window > 0 ? std::max(0, first - a.window + 1) : 0;
        for (int j0 = lo; j0 <= last;) {
            const int s0 = j0 % a.slots;
            const int nb = std::min({kPrefillKeys, last - j0 + 1, a.slots - s0}); // no wrap inside a block
            const float *kb, *vb;
            int64_t ld = width;
            if (a.cache_dt == DType::BF16) {
                for (int r = 0; r < nb; ++r) {
                    const uint16_t* kr = (const uint16_t*)a.k_cache + (s0 + r) * width + (int64_t)g * a.dim;
                    const uint16_t* vr = (const uint16_t*)a.v_cache + (s0 + r) * width + (int64_t)g * a.dim;
                    for (int e = 0; e < a.dim; ++e) {
                        kw[r * d + e] = bf16_to_f32(kr[e]);
                        vw[r * d + e] = bf16_to_f32(vr[e]);
                    }
                }
                kb = kw, vb = vw, ld = d;
            } else {
                kb = (const float*)a.k_cache + s0 * width + (int64_t)g * a.dim;
                vb = (const float*)a.v_cache + s0 * width + (int64_t)g * a.dim;
            }
            MapRMc K(kb, nb, a.dim, Eigen::OuterStride<>(ld)), V(vb, nb, a.dim, Eigen::OuterStride<>(ld));
            MapRM S(Sp, nq, nb, Eigen::OuterStride<>(kPrefillKeys));
            S.noalias() = Q * K.transpose();
            for (int i = 0; i < nq; ++i) {
                const int pos = a.pos0 + t0 + i / group;
                const int klo = a.window > 0 ? std::max(0, pos - a.window + 1) : 0;
                // keys j0 + [b, e) are visible to this query
                const int b = std::clamp(klo - j0, 0, nb), e = std::clamp(pos - j0 + 1, 0, nb);
                auto s = S.row(i);
                if (b >= e) {
                    s.setZero();
                    continue;
                }
                auto v        = s.segment(b, e - b);
                const float m = std::max(mx[i], v.maxCoeff());
                const float r = std::exp(mx[i] - m); // 0 while the query had no key yet
                v             = (v.array() - m).exp().matrix();
                s.head(b).setZero();
                s.tail(nb - e).setZero();
                sum[i] = sum[i] * r + v.sum();
                mx[i]  = m;
                if (r != 1.0f) Y.row(i) *= r;
            }
            Y.noalias() += S * V;
            j0 += nb;
        }
        for (int i = 0; i < nq; ++i) {
            const int t = t0 + i / group, h = g * group + i % group;
            Eigen::Map<Eigen::RowVectorXf>(a.y + t * a.ldy + (int64_t)h * a.dim, a.dim) = Y.row(i) / sum[i];
        }
    });
}

} // namespace g4::cpu::G4_CPU_NS
