// Scalar reference of the ops over frame sequences: the strided 2-D convolution with its channel norm,
// the causal depthwise 1-D convolution, local attention with relative-position logits, and the gates and
// scalings around them (kernels/ops.h). Double accumulation, no threads.
#include "kernels/ref/ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace g4::ref {

double softplus(double x) {
    return x > 20.0 ? x : std::log1p(std::exp(x));
}

static double sigmoid(double x) {
    return 1.0 / (1.0 + std::exp(-x));
}

void conv2d_norm_relu(const Conv2dArgs& a) {
    std::vector<double> acc(a.c_out);
    for (int32_t t = 0; t < a.out_rows; ++t)
        for (int32_t f = 0; f < a.f_out; ++f) {
            for (int32_t co = 0; co < a.c_out; ++co) {
                double s = 0;
                for (int32_t ci = 0; ci < a.c_in; ++ci)
                    for (int kh = 0; kh < 3; ++kh)
                        for (int kw = 0; kw < 3; ++kw) {
                            const int64_t ti = 2 * (int64_t)t - 1 + kh, fi = 2 * (int64_t)f - 1 + kw;
                            if (ti < 0 || ti >= a.in_rows || fi < 0 || fi >= a.f_in) continue;
                            s += (double)load_weight(a.w, a.wdt,
                                                     ((int64_t)co * a.c_in + ci) * 9 + kh * 3 + kw) *
                                 a.x[(ti * a.f_in + fi) * a.c_in + ci];
                        }
                acc[co] = s;
            }
            double mean = 0, var = 0;
            for (double v : acc)
                mean += v;
            mean /= a.c_out;
            for (double v : acc)
                var += (v - mean) * (v - mean);
            var /= a.c_out;
            const double r = 1.0 / std::sqrt(var + a.eps);
            float* y       = a.y + ((int64_t)t * a.f_out + f) * a.c_out;
            for (int32_t co = 0; co < a.c_out; ++co)
                y[co] = (float)std::max(0.0, (acc[co] - mean) * r * load_weight(a.norm, a.ndt, co));
        }
}

void silu(const UnaryArgs& a) {
    for (int32_t t = 0; t < a.rows; ++t)
        for (int32_t i = 0; i < a.cols; ++i) {
            const double v     = a.x[t * a.ldx + i];
            a.y[t * a.ldy + i] = (float)(v * sigmoid(v));
        }
}

void sigmoid_mul(const BinaryArgs& a) {
    for (int32_t t = 0; t < a.rows; ++t)
        for (int32_t i = 0; i < a.cols; ++i)
            a.y[t * a.ldy + i] = (float)(a.a[t * a.lda + i] * sigmoid(a.b[t * a.ldb + i]));
}

void causal_conv1d(const CausalConv1dArgs& a) {
    for (int32_t t = 0; t < a.rows; ++t)
        for (int32_t i = 0; i < a.cols; ++i) {
            double s = 0;
            for (int32_t j = 0; j < a.k; ++j) {
                const int64_t src = (int64_t)t - (a.k - 1) + j;
                if (src >= 0)
                    s += (double)load_weight(a.w, a.wdt, (int64_t)i * a.k + j) * a.x[src * a.ldx + i];
            }
            a.y[t * a.ldy + i] = (float)s;
        }
}

void local_attention(const LocalAttentionArgs& a) {
    std::vector<double> logit(a.window);
    for (int32_t t = 0; t < a.rows; ++t)
        for (int32_t h = 0; h < a.heads; ++h) {
            const int32_t j0 = std::max(0, t - a.window + 1);
            const float* q   = a.q + t * a.ldq + (int64_t)h * a.dim;
            double mx        = -INFINITY;
            for (int32_t j = j0; j <= t; ++j) {
                const float* k  = a.k + j * a.ldk + (int64_t)h * a.dim;
                const int32_t p = a.window - (t - j);
                double s        = 0;
                for (int32_t d = 0; d < a.dim; ++d)
                    s += (double)q[d] * k[d];
                if (p < a.n_rel) {
                    const float* r = a.rel + p * a.ldr + (int64_t)h * a.dim;
                    for (int32_t d = 0; d < a.dim; ++d)
                        s += (double)q[d] * r[d];
                }
                logit[j - j0] = std::tanh(s / a.cap) * a.cap;
                mx            = std::max(mx, logit[j - j0]);
            }
            double sum = 0;
            for (int32_t j = j0; j <= t; ++j)
                sum += (logit[j - j0] = std::exp(logit[j - j0] - mx));
            float* y = a.y + t * a.ldy + (int64_t)h * a.dim;
            for (int32_t d = 0; d < a.dim; ++d) {
                double o = 0;
                for (int32_t j = j0; j <= t; ++j)
                    o += logit[j - j0] / sum * a.v[j * a.ldv + (int64_t)h * a.dim + d];
                y[d] = (float)o;
            }
        }
}

void softplus_scale(const DimScaleArgs& a) {
    for (int32_t t = 0; t < a.rows; ++t)
        for (int32_t i = 0; i < a.cols; ++i)
            a.y[t * a.ldy + i] =
                (float)(a.x[t * a.ldx + i] * (double)a.s * softplus(load_weight(a.w, a.wdt, i % a.dim)));
}

void add_scaled(const AddScaledArgs& a) {
    for (int32_t t = 0; t < a.rows; ++t)
        for (int32_t i = 0; i < a.cols; ++i)
            a.y[t * a.ldy + i] = (float)(a.a[t * a.lda + i] + (double)a.s * a.b[t * a.ldb + i]);
}

} // namespace g4::ref
