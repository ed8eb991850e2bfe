// Eigen CPU kernels (see cpu.h). Weights stay in their stored dtype (mmapped from the plan) and are
// widened to float32 one tile at a time into per-thread scratch; all arithmetic is float32.
#include "kernels/cpu/cpu.h"
#include "kernels/nf4.h"
#include "kernels/ref/ref.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>

namespace g4::cpu {

using RowMat   = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapRM    = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;
using MapRMc   = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;
using VecMap   = Eigen::Map<Eigen::VectorXf>;
using VecMapC  = Eigen::Map<const Eigen::VectorXf>;

size_t scratch_floats_per_thread(int64_t max_k, int64_t max_slots) {
    size_t a = (size_t)kMatmulTileRows * (size_t)max_k;
    size_t b = (size_t)max_slots + 64;
    return ((std::max(a, b) + 15) / 16) * 16;   // keep each thread's slice 64-byte aligned
}

static void widen(const void* src, DType dt, int64_t n, float* dst) {
    if (dt == DType::BF16) {
        const uint16_t* s = (const uint16_t*)src;
        uint32_t* d       = (uint32_t*)dst;
        for (int64_t i = 0; i < n; ++i) d[i] = (uint32_t)s[i] << 16;
    } else if (dt == DType::F32) {
        std::memcpy(dst, src, sizeof(float) * n);
    } else {
        for (int64_t i = 0; i < n; ++i) dst[i] = ref::load_weight(src, dt, i);
    }
}

// Elementwise ops run inline below this many elements; thread hand-off costs more than the work.
static constexpr int64_t kInlineElems = 1 << 14;

template <class F> static void for_rows(const Context& c, int rows, int64_t cols, F&& f) {
    if ((int64_t)rows * cols < kInlineElems || c.pool->size() == 1 || rows == 1) {
        for (int t = 0; t < rows; ++t) f(t);
        return;
    }
    c.pool->parallel_for(rows, [&](int64_t t, int) { f((int)t); });
}

void embed(const Context& c, const EmbedArgs& a) {
    for_rows(c, a.rows, a.n, [&](int t) {
        float* y = a.y + t * a.ldy;
        widen((const uint8_t*)a.table + dtype_bytes(a.dt, (int64_t)a.ids[t] * a.n), a.dt, a.n, y);
        VecMap(y, a.n) *= a.scale;
    });
}

void matmul(const Context& c, const MatmulArgs& a) {
    const int64_t tiles = (a.n + kMatmulTileRows - 1) / kMatmulTileRows;
    constexpr int kRowBlock = 64;
    const nf4::Layout nf4l = a.dt == DType::NF4 ? nf4::layout(a.n * a.k, a.nf4_double_quant) : nf4::Layout{};
    c.pool->parallel_for(tiles, [&](int64_t tile, int th) {
        int64_t n0 = tile * kMatmulTileRows, nt = std::min<int64_t>(kMatmulTileRows, a.n - n0);
        const float* wt;
        if (a.dt == DType::F32) {
            wt = (const float*)a.w + n0 * a.k;
        } else {
            float* buf = c.thread_scratch(th);
            if (a.dt == DType::NF4)   // elements [n0*K, (n0+nt)*K) of the blob; blocks may straddle rows
                nf4::dequantize((const uint8_t*)a.w, nf4l, n0 * a.k, nt * a.k, buf);
            else
                widen((const uint8_t*)a.w + dtype_bytes(a.dt, n0 * a.k), a.dt, nt * a.k, buf);
            wt = buf;
        }
        Eigen::Map<const RowMat> W(wt, nt, a.k);
        for (int r0 = 0; r0 < a.rows; r0 += kRowBlock) {
            int rb = std::min(kRowBlock, a.rows - r0);
            MapRMc X(a.x + (int64_t)r0 * a.ldx, rb, a.k, Eigen::OuterStride<>(a.ldx));
            MapRM Y(a.y + (int64_t)r0 * a.ldy + n0, rb, nt, Eigen::OuterStride<>(a.ldy));
            Y.noalias() = X * W.transpose();
        }
    });
}

void rms_norm(const Context& c, const RmsNormArgs& a) {
    for_rows(c, a.rows, a.cols, [&](int t) {
        for (int g = 0; g < a.cols / a.dim; ++g) {
            VecMapC x(a.x + t * a.ldx + (int64_t)g * a.dim, a.dim);
            VecMap y(a.y + t * a.ldy + (int64_t)g * a.dim, a.dim);
            float r = std::pow(x.squaredNorm() / (float)a.dim + a.eps, -0.5f);
            if (!a.w) {
                y = x * r;
            } else if (a.wdt == DType::F32) {
                y = (x * r).cwiseProduct(VecMapC((const float*)a.w, a.dim));
            } else {
                for (int i = 0; i < a.dim; ++i) y[i] = x[i] * r * ref::load_weight(a.w, a.wdt, i);
            }
        }
    });
}

void add(const Context& c, const BinaryArgs& a) {
    for_rows(c, a.rows, a.cols, [&](int t) {
        VecMap(a.y + t * a.ldy, a.cols) = VecMapC(a.a + t * a.lda, a.cols) + VecMapC(a.b + t * a.ldb, a.cols);
    });
}

void gelu_mul(const Context& c, const BinaryArgs& a) {
    for_rows(c, a.rows, a.cols, [&](int t) {
        const float* x = a.a + t * a.lda;
        const float* b = a.b + t * a.ldb;
        float* y       = a.y + t * a.ldy;
        const float k0 = 0.7978845608028654f, k1 = 0.044715f;
        for (int i = 0; i < a.cols; ++i) {
            float v = x[i];
            y[i]    = 0.5f * v * (1.0f + std::tanh(k0 * (v + k1 * v * v * v))) * b[i];
        }
    });
}

void scale(const Context& c, const ScaleArgs& a) {
    float s = a.s * (a.s_tensor ? ref::load_weight(a.s_tensor, a.s_dt, 0) : 1.0f);
    for_rows(c, a.rows, a.cols, [&](int t) { VecMap(a.y + t * a.ldy, a.cols) = VecMapC(a.x + t * a.ldx, a.cols) * s; });
}

void softcap(const Context& c, const ScaleArgs& a) {
    float inv = 1.0f / a.cap;
    for_rows(c, a.rows, a.cols, [&](int t) {
        const float* x = a.x + t * a.ldx;
        float* y       = a.y + t * a.ldy;
        for (int i = 0; i < a.cols; ++i) y[i] = a.cap * std::tanh(x[i] * inv);
    });
}

void rope(const Context& c, const RopeArgs& a) {
    const int half = a.dim / 2;
    for_rows(c, a.rows, (int64_t)a.heads * a.dim * 8, [&](int t) {
        float pos = (float)(a.pos0 + t);
        for (int k = 0; k < half; ++k) {
            float ang = pos * a.inv_freq[k];
            float cs = std::cos(ang), sn = std::sin(ang);
            for (int h = 0; h < a.heads; ++h) {
                float* x  = a.x + t * a.ldx + (int64_t)h * a.dim;
                float x0 = x[k], x1 = x[k + half];
                x[k]        = x0 * cs - x1 * sn;
                x[k + half] = x1 * cs + x0 * sn;
            }
        }
    });
}

void kv_store(const Context& c, const KvStoreArgs& a) { ref::kv_store(a); }

// Attention over a cache read through row(cache, offset, n, buf): n float32 values from element offset,
// the cache's own memory (f32) or buf after widening (bf16). Rows are taken in pieces of kAttnPiece
// columns (Gemma's head dims are one piece), so both dtypes share the arithmetic.
constexpr int kAttnPiece = 512;
template <class Row> static void attention_rows(const Context& c, const AttentionArgs& a, Row row) {
    const int group     = a.heads / a.kv_heads;
    const int64_t width = (int64_t)a.kv_heads * a.dim;
    c.pool->parallel_for((int64_t)a.rows * a.heads, [&](int64_t task, int th) {
        int t = (int)(task / a.heads), h = (int)(task % a.heads);
        int pos = a.pos0 + t;
        int lo  = a.window > 0 ? std::max(0, pos - a.window + 1) : 0;
        int n   = pos - lo + 1;
        int kvh = h / group;
        float* p = c.thread_scratch(th);
        alignas(64) float buf[kAttnPiece];
        VecMapC q(a.q + t * a.ldq + (int64_t)h * a.dim, a.dim);
        auto off = [&](int j) { return (int64_t)((lo + j) % a.slots) * width + (int64_t)kvh * a.dim; };
        float mx = -INFINITY;
        for (int j = 0; j < n; ++j) {
            float s = 0;
            for (int d0 = 0; d0 < a.dim; d0 += kAttnPiece) {
                const int nb = std::min(kAttnPiece, a.dim - d0);
                s += q.segment(d0, nb).dot(VecMapC(row(a.k_cache, off(j) + d0, nb, buf), nb));
            }
            p[j] = s * a.scale;
            mx   = std::max(mx, p[j]);
        }
        float sum = 0;
        for (int j = 0; j < n; ++j) sum += (p[j] = std::exp(p[j] - mx));
        VecMap y(a.y + t * a.ldy + (int64_t)h * a.dim, a.dim);
        y.setZero();
        for (int j = 0; j < n; ++j)
            for (int d0 = 0; d0 < a.dim; d0 += kAttnPiece) {
                const int nb = std::min(kAttnPiece, a.dim - d0);
                y.segment(d0, nb) += p[j] * VecMapC(row(a.v_cache, off(j) + d0, nb, buf), nb);
            }
        y *= 1.0f / sum;
    });
}

void attention(const Context& c, const AttentionArgs& a) {
    if (a.cache_dt == DType::BF16)
        attention_rows(c, a, [](const void* cache, int64_t o, int n, float* buf) {
            widen((const uint16_t*)cache + o, DType::BF16, n, buf);
            return (const float*)buf;
        });
    else
        attention_rows(c, a, [](const void* cache, int64_t o, int, float*) { return (const float*)cache + o; });
}

} // namespace g4::cpu
