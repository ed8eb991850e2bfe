// Eigen CPU kernels of the ops over frame sequences (see cpu.h): the strided 2-D convolution as an
// im2col GEMM per output row, the causal depthwise 1-D convolution, local attention with relative-position
// logits (one task per query row, its dot products in a fixed vectorised order), and vectorised gates.
// Float32 arithmetic; weights widened into per-thread scratch once per block of rows.
#include "kernels/cpu/level.h"
#include "kernels/cpu/row_tasks.h"
#include "kernels/cpu/simd.h"
#include "kernels/ref/ref.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace g4::cpu::G4_CPU_NS {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapRM  = Eigen::Map<RowMat>;
using MapRMc = Eigen::Map<const RowMat>;
using ArrMap = Eigen::Map<Eigen::ArrayXf>;
using ArrC   = Eigen::Map<const Eigen::ArrayXf>;

size_t align16(size_t n) {
    return (n + 15) / 16 * 16;
}

// Rows split into blocks (four per thread): f(first, end, thread), so per-block setup (widened weights)
// is paid once per block.
template <class F> void for_blocks(const Context& c, int rows, F&& f) {
    const int64_t n = std::min<int64_t>(rows, (int64_t)c.pool->size() * 4);
    if (n <= 1) {
        if (rows > 0) f(0, rows, 0);
        return;
    }
    c.pool->parallel_for(n,
                         [&](int64_t b, int th) { f((int)(rows * b / n), (int)(rows * (b + 1) / n), th); });
}

void widen(const void* src, DType dt, int64_t n, float* dst) {
    if (dt == DType::F32) {
        std::memcpy(dst, src, sizeof(float) * n);
        return;
    }
    for (int64_t i = 0; i < n; ++i)
        dst[i] = ref::load_weight(src, dt, i);
}

} // namespace

size_t conv2d_scratch_floats(int32_t f_out, int32_t c_in, int32_t c_out) {
    return align16((size_t)f_out * 9 * c_in) + align16((size_t)c_out * 9 * c_in);
}

// Per output row: the 3x3 patches of its f_out positions gathered in the weight's (c_in, kh, kw) order,
// one GEMM against the weight, then LayerNorm (mean and biased variance in double) and ReLU per position.
void conv2d_norm_relu(const Context& c, const Conv2dArgs& a) {
    const int kc = 9 * a.c_in;
    for_blocks(c, a.out_rows, [&](int r0, int r1, int th) {
        float* patch   = c.thread_scratch(th); // [f_out, kc]
        float* wf      = patch + align16((size_t)a.f_out * kc);
        const float* w = (const float*)a.w;
        if (a.wdt != DType::F32) {
            widen(a.w, a.wdt, (int64_t)a.c_out * kc, wf);
            w = wf;
        }
        for (int t = r0; t < r1; ++t) {
            for (int f = 0; f < a.f_out; ++f)
                for (int r = 0; r < 9; ++r) {
                    const int64_t ti = 2 * (int64_t)t - 1 + r / 3, fi = 2 * (int64_t)f - 1 + r % 3;
                    float* dst = patch + (size_t)f * kc + r;
                    if (ti >= 0 && ti < a.in_rows && fi >= 0 && fi < a.f_in) {
                        const float* src = a.x + (ti * a.f_in + fi) * a.c_in;
                        for (int ci = 0; ci < a.c_in; ++ci)
                            dst[ci * 9] = src[ci];
                    } else {
                        for (int ci = 0; ci < a.c_in; ++ci)
                            dst[ci * 9] = 0.0f;
                    }
                }
            float* yt = a.y + (size_t)t * a.f_out * a.c_out;
            MapRM(yt, a.f_out, a.c_out).noalias() =
                MapRMc(patch, a.f_out, kc) * MapRMc(w, a.c_out, kc).transpose();
            for (int f = 0; f < a.f_out; ++f) {
                float* y    = yt + (size_t)f * a.c_out;
                double mean = 0, var = 0;
                for (int co = 0; co < a.c_out; ++co)
                    mean += y[co];
                mean /= a.c_out;
                for (int co = 0; co < a.c_out; ++co)
                    var += (y[co] - mean) * (y[co] - mean);
                var /= a.c_out;
                const float r = (float)(1.0 / std::sqrt(var + a.eps)), m = (float)mean;
                for (int co = 0; co < a.c_out; ++co)
                    y[co] = std::max(0.0f, ((y[co] - m) * r) * ref::load_weight(a.norm, a.ndt, co));
            }
        }
    });
}

void silu(const Context& c, const UnaryArgs& a) {
    for_rows(c, a.rows, a.cols, [&](int t) {
        ArrC x(a.x + t * a.ldx, a.cols);
        ArrMap(a.y + t * a.ldy, a.cols) = x / (1.0f + (-x).exp());
    });
}

void sigmoid_mul(const Context& c, const BinaryArgs& a) {
    for_rows(c, a.rows, a.cols, [&](int t) {
        ArrC x(a.a + t * a.lda, a.cols), g(a.b + t * a.ldb, a.cols);
        ArrMap(a.y + t * a.ldy, a.cols) = x / (1.0f + (-g).exp());
    });
}

size_t causal_conv1d_scratch_floats(int32_t cols, int32_t k) {
    return align16((size_t)cols * k);
}

// y[t] = sum over j ascending of w[:, j] * x[t - k + 1 + j] (rows before 0 skipped), with w transposed to
// [k, cols] in float32 once per block of rows.
void causal_conv1d(const Context& c, const CausalConv1dArgs& a) {
    for_blocks(c, a.rows, [&](int r0, int r1, int th) {
        float* wt = c.thread_scratch(th); // [k, cols]
        for (int i = 0; i < a.cols; ++i)
            for (int j = 0; j < a.k; ++j)
                wt[(size_t)j * a.cols + i] = ref::load_weight(a.w, a.wdt, (int64_t)i * a.k + j);
        for (int t = r0; t < r1; ++t) {
            ArrMap y(a.y + t * a.ldy, a.cols);
            y.setZero();
            for (int j = 0; j < a.k; ++j) {
                const int64_t s = (int64_t)t - (a.k - 1) + j;
                if (s >= 0) y += ArrC(wt + (size_t)j * a.cols, a.cols) * ArrC(a.x + s * a.ldx, a.cols);
            }
        }
    });
}

size_t local_attention_scratch_floats(int32_t window) {
    return align16((size_t)window);
}

// Dot product in a fixed order (16 interleaved partial sums, then halved pairwise): it vectorises without
// reassociation, and its result depends on neither the operands' alignment nor the thread.
static float dot16(const float* x, const float* y, int n) {
    float s[16] = {};
    int i       = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; ++l)
            s[l] += x[i + l] * y[i + l];
    for (; i < n; ++i)
        s[i & 15] += x[i] * y[i];
    for (int w = 8; w; w >>= 1)
        for (int l = 0; l < w; ++l)
            s[l] += s[l + w];
    return s[0];
}

void local_attention(const Context& c, const LocalAttentionArgs& a) {
    const int W = a.window, D = a.dim, NH = a.heads;
    auto head = [&](int t, int h, float* logit) {
        const int j0    = std::max(0, t - W + 1);
        const int nk    = t - j0 + 1;
        const float* qh = a.q + t * a.ldq + (int64_t)h * D;
        float mx        = -std::numeric_limits<float>::infinity();
        for (int j = j0; j <= t; ++j) {
            const float ac = dot16(qh, a.k + j * a.ldk + (int64_t)h * D, D);
            const int p    = W - (t - j);
            const float bd = p < a.n_rel ? dot16(qh, a.rel + p * a.ldr + (int64_t)h * D, D) : 0.0f;
            const float s  = std::tanh((ac + bd) / a.cap) * a.cap;
            logit[j - j0]  = s;
            mx             = std::max(mx, s);
        }
        float sum = 0;
        for (int i = 0; i < nk; ++i)
            sum += (logit[i] = std::exp(logit[i] - mx));
        float* oh = a.y + t * a.ldy + (int64_t)h * D;
        for (int d = 0; d < D; ++d)
            oh[d] = 0;
        for (int j = j0; j <= t; ++j) {
            const float w   = logit[j - j0] / sum;
            const float* vh = a.v + j * a.ldv + (int64_t)h * D;
            for (int d = 0; d < D; ++d)
                oh[d] += w * vh[d];
        }
    };
    c.pool->parallel_for(a.rows, [&](int64_t t, int th) {
        for (int h = 0; h < NH; ++h)
            head((int)t, h, c.thread_scratch(th));
    });
}

size_t softplus_scale_scratch_floats(int32_t dim) {
    return align16((size_t)dim);
}

void softplus_scale(const Context& c, const DimScaleArgs& a) {
    for_blocks(c, a.rows, [&](int r0, int r1, int th) {
        float* sp = c.thread_scratch(th); // [dim] s * softplus(w), rounded as x * s then * softplus
        for (int d = 0; d < a.dim; ++d)
            sp[d] = (float)ref::softplus(ref::load_weight(a.w, a.wdt, d));
        for (int t = r0; t < r1; ++t) {
            const float* x = a.x + t * a.ldx;
            float* y       = a.y + t * a.ldy;
            for (int g = 0; g < a.cols; g += a.dim)
                for (int d = 0; d < a.dim; ++d)
                    y[g + d] = x[g + d] * a.s * sp[d];
        }
    });
}

void add_scaled(const Context& c, const AddScaledArgs& a) {
    for_rows(c, a.rows, a.cols, [&](int t) {
        ArrMap(a.y + t * a.ldy, a.cols) = ArrC(a.b + t * a.ldb, a.cols) * a.s + ArrC(a.a + t * a.lda, a.cols);
    });
}

} // namespace g4::cpu::G4_CPU_NS
