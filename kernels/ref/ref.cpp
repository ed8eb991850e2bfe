// Scalar reference implementations of every op (see ref.h).
#include "kernels/ref/ref.h"
#include "kernels/nf4.h"
#include "kernels/q16.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace g4::ref {

static float half_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF, u;
    if (exp == 0) {
        if (man == 0)
            u = sign;
        else {
            float f = std::ldexp((float)man, -24);
            std::memcpy(&u, &f, 4);
            u |= sign;
        }
    } else if (exp == 31)
        u = sign | 0x7F800000u | (man << 13);
    else
        u = sign | ((exp + 112) << 23) | (man << 13);
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

float load_weight(const void* w, DType dt, int64_t i) {
    switch (dt) {
    case DType::F32:
        return ((const float*)w)[i];
    case DType::BF16:
        return bf16_to_f32(((const uint16_t*)w)[i]);
    case DType::F16:
        return half_to_f32(((const uint16_t*)w)[i]);
    default:
        return NAN;
    }
}

float gelu_tanh(float x) {
    const double c = 0.7978845608028654; // sqrt(2/pi)
    double xd      = x;
    return (float)(0.5 * xd * (1.0 + std::tanh(c * (xd + 0.044715 * xd * xd * xd))));
}

void embed(const EmbedArgs& a) {
    for (int t = 0; t < a.rows; ++t)
        for (int64_t j = 0; j < a.n; ++j)
            a.y[t * a.ldy + j] = load_weight(a.table, a.dt, (int64_t)a.ids[t] * a.n + j) * a.scale;
}

// The integer path (kernels/q16.h): per row of x and NF4 block, the exact integer dot product of the codes'
// int16 values with the quantized x, scaled by absmax * amax / (8191 * 4096); the blocks' terms summed in
// double.
static void matmul_nf4_int16(const MatmulArgs& a) {
    const nf4::Layout l = nf4::layout(a.n * a.k, a.nf4_double_quant);
    const uint8_t* blob = (const uint8_t*)a.w;
    const int64_t nb    = a.k / q16::kBlock;
    std::vector<int16_t> q((size_t)a.rows * a.k), wq(a.k);
    std::vector<float> sx((size_t)a.rows * nb), sw(nb);
    for (int t = 0; t < a.rows; ++t)
        for (int64_t b = 0; b < nb; ++b)
            sx[t * nb + b] =
                q16::quantize_block(a.x + t * a.ldx + b * q16::kBlock, &q[t * a.k + b * q16::kBlock]);
    for (int64_t n = 0; n < a.n; ++n) {
        for (int64_t i = 0; i < a.k; ++i) {
            const int64_t e    = n * a.k + i;
            const uint8_t byte = blob[l.codes_off + (e >> 1)];
            wq[i]              = q16::kNf4Int16.v[(e & 1) ? (byte & 15) : (byte >> 4)];
        }
        for (int64_t b = 0; b < nb; ++b)
            sw[b] = nf4::block_absmax(blob, l, n * nb + b);
        for (int t = 0; t < a.rows; ++t) {
            double acc = 0;
            for (int64_t b = 0; b < nb; ++b) {
                int64_t dot = 0;
                for (int i = 0; i < q16::kBlock; ++i)
                    dot += (int32_t)wq[b * q16::kBlock + i] * q[t * a.k + b * q16::kBlock + i];
                acc += (double)dot * ((double)sw[b] * sx[t * nb + b]);
            }
            a.y[t * a.ldy + n] = (float)acc;
        }
    }
}

void matmul(const MatmulArgs& a) {
    if (q16::applies(a.int16_x, a.dt == DType::NF4, a.k, a.rows) ||
        q16::applies_gemm(a.int16_x, a.dt == DType::NF4, a.k, a.rows)) {
        matmul_nf4_int16(a);
        return;
    }
    if (a.dt == DType::NF4) { // element by element from the blob (load_weight has no NF4 layout)
        const nf4::Layout l = nf4::layout(a.n * a.k, a.nf4_double_quant);
        std::vector<float> row(a.k);
        for (int64_t n = 0; n < a.n; ++n) {
            for (int64_t k = 0; k < a.k; ++k)
                row[k] = nf4::element((const uint8_t*)a.w, l, n * a.k + k);
            for (int t = 0; t < a.rows; ++t) {
                double acc = 0;
                for (int64_t k = 0; k < a.k; ++k)
                    acc += (double)a.x[t * a.ldx + k] * row[k];
                a.y[t * a.ldy + n] = (float)acc;
            }
        }
        return;
    }
    for (int t = 0; t < a.rows; ++t)
        for (int64_t n = 0; n < a.n; ++n) {
            double acc = 0;
            for (int64_t k = 0; k < a.k; ++k)
                acc += (double)a.x[t * a.ldx + k] * load_weight(a.w, a.dt, n * a.k + k);
            a.y[t * a.ldy + n] = (float)acc;
        }
}

void rms_norm(const RmsNormArgs& a) {
    for (int t = 0; t < a.rows; ++t)
        for (int g = 0; g < a.cols / a.dim; ++g) {
            const float* x = a.x + t * a.ldx + (int64_t)g * a.dim;
            float* y       = a.y + t * a.ldy + (int64_t)g * a.dim;
            double ss      = 0;
            for (int i = 0; i < a.dim; ++i)
                ss += (double)x[i] * x[i];
            double r = std::pow(ss / a.dim + a.eps, -0.5);
            for (int i = 0; i < a.dim; ++i)
                y[i] = (float)(x[i] * r * (a.w ? load_weight(a.w, a.wdt, i) : 1.0f));
        }
}

void add(const BinaryArgs& a) {
    for (int t = 0; t < a.rows; ++t)
        for (int i = 0; i < a.cols; ++i)
            a.y[t * a.ldy + i] = a.a[t * a.lda + i] + a.b[t * a.ldb + i];
}

void gelu_mul(const BinaryArgs& a) {
    for (int t = 0; t < a.rows; ++t)
        for (int i = 0; i < a.cols; ++i)
            a.y[t * a.ldy + i] = gelu_tanh(a.a[t * a.lda + i]) * a.b[t * a.ldb + i];
}

void scale(const ScaleArgs& a) {
    float s = a.s * (a.s_tensor ? load_weight(a.s_tensor, a.s_dt, 0) : 1.0f);
    for (int t = 0; t < a.rows; ++t)
        for (int i = 0; i < a.cols; ++i)
            a.y[t * a.ldy + i] = a.x[t * a.ldx + i] * s;
}

void softcap(const ScaleArgs& a) {
    for (int t = 0; t < a.rows; ++t)
        for (int i = 0; i < a.cols; ++i)
            a.y[t * a.ldy + i] = (float)(a.cap * std::tanh((double)a.x[t * a.ldx + i] / a.cap));
}

void rope(const RopeArgs& a) {
    int half = a.dim / 2;
    for (int t = 0; t < a.rows; ++t) {
        float pos = (float)(a.pos0 + t);
        for (int h = 0; h < a.heads; ++h) {
            float* x = a.x + t * a.ldx + (int64_t)h * a.dim;
            for (int k = 0; k < half; ++k) {
                float ang = pos * a.inv_freq[k]; // fp32 product, as torch computes it
                double c = std::cos((double)ang), s = std::sin((double)ang);
                double x0 = x[k], x1 = x[k + half];
                x[k]        = (float)(x0 * c - x1 * s);
                x[k + half] = (float)(x1 * c + x0 * s);
            }
        }
    }
}

void kv_store(const KvStoreArgs& a) {
    for (int t = 0; t < a.rows; ++t) {
        int64_t slot   = (a.pos0 + t) % a.slots;
        const float* k = a.k + t * a.ldk;
        const float* v = a.v + t * a.ldv;
        if (a.cache_dt == DType::BF16) {
            uint16_t* kc = (uint16_t*)a.k_cache + slot * a.width;
            uint16_t* vc = (uint16_t*)a.v_cache + slot * a.width;
            for (int i = 0; i < a.width; ++i)
                kc[i] = f32_to_bf16(k[i]), vc[i] = f32_to_bf16(v[i]);
        } else {
            std::memcpy((float*)a.k_cache + slot * a.width, k, sizeof(float) * a.width);
            std::memcpy((float*)a.v_cache + slot * a.width, v, sizeof(float) * a.width);
        }
    }
}

void attention(const AttentionArgs& a) {
    int group = a.heads / a.kv_heads;
    int width = a.kv_heads * a.dim;
    std::vector<double> p;
    for (int t = 0; t < a.rows; ++t) {
        int pos = a.pos0 + t;
        int lo  = a.window > 0 ? std::max(0, pos - a.window + 1) : 0;
        for (int h = 0; h < a.heads; ++h) {
            const float* q = a.q + t * a.ldq + (int64_t)h * a.dim;
            int kvh        = h / group;
            p.assign(pos - lo + 1, 0.0);
            double mx = -INFINITY;
            for (int j = lo; j <= pos; ++j) {
                const int64_t k0 = (int64_t)(j % a.slots) * width + (int64_t)kvh * a.dim;
                double s         = 0;
                for (int d = 0; d < a.dim; ++d)
                    s += (double)q[d] * load_weight(a.k_cache, a.cache_dt, k0 + d);
                p[j - lo] = s * a.scale;
                mx        = std::max(mx, p[j - lo]);
            }
            double sum = 0;
            for (double& v : p)
                sum += (v = std::exp(v - mx));
            float* y = a.y + t * a.ldy + (int64_t)h * a.dim;
            for (int d = 0; d < a.dim; ++d) {
                double acc = 0;
                for (int j = lo; j <= pos; ++j)
                    acc += p[j - lo] * load_weight(a.v_cache, a.cache_dt,
                                                   (int64_t)(j % a.slots) * width + (int64_t)kvh * a.dim + d);
                y[d] = (float)(acc / sum);
            }
        }
    }
}

} // namespace g4::ref
