// Scalar reference kernels of the encoder-program ops (ops.h: Clamp .. PoolRows): plain loops, double
// accumulation where a sum is taken.
#include "kernels/ref/ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace g4::ref {

void clamp(const ClampArgs& a) {
    for (int t = 0; t < a.rows; ++t)
        for (int i = 0; i < a.cols; ++i)
            a.y[t * a.ldy + i] = std::min(std::max(a.x[t * a.ldx + i], a.lo), a.hi);
}

void add_position_2d(const AddPosition2DArgs& a) {
    for (int t = 0; t < a.rows; ++t) {
        const int64_t px = a.pos[2 * t], py = a.pos[2 * t + 1];
        for (int i = 0; i < a.cols; ++i) {
            const double e = (double)load_weight(a.table, a.dt, px * a.cols + i) +
                             (double)load_weight(a.table, a.dt, (a.positions + py) * a.cols + i);
            a.y[t * a.ldy + i] = (float)(a.x[t * a.ldx + i] + e);
        }
    }
}

void rope_2d(const Rope2DArgs& a) {
    const int half = a.dim / 2, quarter = a.dim / 4;
    for (int t = 0; t < a.rows; ++t)
        for (int axis = 0; axis < 2; ++axis) {
            const float pos = (float)a.pos[2 * t + axis];
            for (int h = 0; h < a.heads; ++h) {
                float* x = a.x + t * a.ldx + (int64_t)h * a.dim + axis * half;
                for (int m = 0; m < quarter; ++m) {
                    const float ang = pos * a.inv_freq[m]; // fp32 product, as torch computes it
                    const double c = std::cos((double)ang), s = std::sin((double)ang);
                    const double x0 = x[m], x1 = x[m + quarter];
                    x[m]           = (float)(x0 * c - x1 * s);
                    x[m + quarter] = (float)(x1 * c + x0 * s);
                }
            }
        }
}

void self_attention(const SelfAttentionArgs& a) {
    const int group = a.heads / a.kv_heads;
    std::vector<double> p(a.rows);
    for (int t = 0; t < a.rows; ++t)
        for (int h = 0; h < a.heads; ++h) {
            const float* q   = a.q + t * a.ldq + (int64_t)h * a.dim;
            const int64_t kc = (int64_t)(h / group) * a.dim;
            double mx        = -INFINITY;
            for (int j = 0; j < a.rows; ++j) {
                double s = 0;
                for (int d = 0; d < a.dim; ++d)
                    s += (double)q[d] * a.k[j * a.ldk + kc + d];
                p[j] = s * a.scale;
                mx   = std::max(mx, p[j]);
            }
            double sum = 0;
            for (int j = 0; j < a.rows; ++j)
                sum += (p[j] = std::exp(p[j] - mx));
            for (int d = 0; d < a.dim; ++d) {
                double o = 0;
                for (int j = 0; j < a.rows; ++j)
                    o += p[j] * a.v[j * a.ldv + kc + d];
                a.y[t * a.ldy + (int64_t)h * a.dim + d] = (float)(o / sum);
            }
        }
}

void pool_rows(const PoolRowsArgs& a) {
    for (int t = 0; t < a.rows; ++t)
        for (int i = 0; i < a.cols; ++i) {
            double s = 0;
            for (int j = 0; j < a.taps; ++j)
                s += (double)a.x[a.index[t * a.taps + j] * a.ldx + i];
            a.y[t * a.ldy + i] = (float)(s * a.w);
        }
}

} // namespace g4::ref
