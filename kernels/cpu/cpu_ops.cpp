// Eigen CPU kernels (see cpu.h). Weights stay in their stored dtype (mmapped from the plan) and are
// widened to float32 one tile at a time into per-thread scratch, except NF4 matmuls of a few rows, which
// read the packed codes directly (matmul_nf4_gemv); all arithmetic is float32.
#include "kernels/cpu/level.h"
#include "kernels/cpu/nf4_blob.h"
#include "kernels/cpu/row_tasks.h"
#include "kernels/cpu/simd.h"
#include "kernels/nf4.h"
#include "kernels/q16.h"
#include "kernels/ref/ref.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>

namespace g4::cpu::G4_CPU_NS {

using RowMat  = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapRM   = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;
using MapRMc  = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;
using VecMap  = Eigen::Map<Eigen::VectorXf>;
using VecMapC = Eigen::Map<const Eigen::VectorXf>;

size_t scratch_floats_per_thread(int64_t max_k, int64_t max_slots) {
    size_t a = (size_t)kMatmulTileRows * (size_t)max_k;
    size_t b = (size_t)max_slots + 64;
    return ((std::max(a, b) + 15) / 16) * 16; // keep each thread's slice 64-byte aligned
}

static void widen(const void* src, DType dt, int64_t n, float* dst) {
    if (dt == DType::BF16) {
        const uint16_t* s = (const uint16_t*)src;
        uint32_t* d       = (uint32_t*)dst;
        for (int64_t i = 0; i < n; ++i)
            d[i] = (uint32_t)s[i] << 16;
    } else if (dt == DType::F32) {
        std::memcpy(dst, src, sizeof(float) * n);
    } else {
        for (int64_t i = 0; i < n; ++i)
            dst[i] = ref::load_weight(src, dt, i);
    }
}

// Elementwise ops: f(t, c0, c1) over columns [c0, c1) of row t, in pieces of kElemPiece columns so that the
// few rows of a decode step (the logits' 262144 columns) spread over the pool too. Each element's result is
// the same whichever piece it is in.
static constexpr int64_t kElemPiece = 1 << 14;
template <class F> static void for_elems(const Context& c, int rows, int64_t cols, F&& f) {
    const int64_t pieces = (cols + kElemPiece - 1) / kElemPiece;
    if (pieces == 1) { // rows of one piece: in blocks of rows
        for_rows(c, rows, cols, [&](int t) { f(t, (int64_t)0, cols); });
        return;
    }
    if ((int64_t)rows * cols < kInlineElems || c.pool->size() == 1) {
        for (int t = 0; t < rows; ++t)
            f(t, (int64_t)0, cols);
        return;
    }
    c.pool->parallel_for(rows * pieces, [&](int64_t task, int) {
        const int64_t c0 = task % pieces * kElemPiece;
        f((int)(task / pieces), c0, std::min(cols, c0 + kElemPiece));
    });
}

void embed(const Context& c, const EmbedArgs& a) {
    for_rows(c, a.rows, a.n, [&](int t) {
        float* y = a.y + t * a.ldy;
        widen((const uint8_t*)a.table + dtype_bytes(a.dt, (int64_t)a.ids[t] * a.n), a.dt, a.n, y);
        VecMap(y, a.n) *= a.scale;
    });
}

void matmul_tiled(const Context& c, const MatmulArgs& a) {
    const int64_t tiles     = (a.n + kMatmulTileRows - 1) / kMatmulTileRows;
    constexpr int kRowBlock = 64;
    const nf4::Layout nf4l  = a.dt == DType::NF4 ? nf4::layout(a.n * a.k, a.nf4_double_quant) : nf4::Layout{};
    c.pool->parallel_for(tiles, [&](int64_t tile, int th) {
        int64_t n0 = tile * kMatmulTileRows, nt = std::min<int64_t>(kMatmulTileRows, a.n - n0);
        const float* wt;
        if (a.dt == DType::F32) {
            wt = (const float*)a.w + n0 * a.k;
        } else {
            float* buf = c.thread_scratch(th);
            if (a.dt == DType::NF4) // elements [n0*K, (n0+nt)*K) of the blob; blocks may straddle rows
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

// ---- NF4 GEMV ---------------------------------------------------------------------------------------------
// With K a multiple of 64 every row of W is whole blocks. A block's 32 code bytes, read as 8 little-endian
// u32 words, hold nibble m (bits 4m..4m+3) of word d = element 8d + (m ^ 1). The kernels take nibbles 2q
// and 2q+1 of the 8 words as one 16-lane vector q (q = 0..3) by shifting, without widening bytes, and x is
// reordered once to match (kXOrder). Each block's 16 scaled code values are codebook[c] * scale, the exact
// weights nf4::dequantize produces; the products with x are accumulated in fp32.

namespace {

using namespace gemv;

// Position i of a reordered block of x holds element kXOrder[i] of the block: lane l of vector q = i / 16
// is nibble 2q (l < 8) or 2q + 1 (l >= 8) of word l % 8.
struct XOrder {
    int e[nf4::kBlock];
    constexpr XOrder() : e() {
        for (int i = 0; i < nf4::kBlock; ++i) {
            const int q = i / 16, l = i % 16, m = 2 * q + (l >= 8);
            e[i] = 8 * (l % 8) + (m ^ 1);
        }
    }
};
constexpr XOrder kXOrder;

void reorder_x(const MatmulArgs& a, float* xp) {
    for (int t = 0; t < a.rows; ++t) {
        const float* x = a.x + t * a.ldx;
        float* o       = xp + t * a.k;
        for (int64_t j = 0; j < a.k; j += nf4::kBlock, x += nf4::kBlock, o += nf4::kBlock)
            for (int i = 0; i < nf4::kBlock; ++i)
                o[i] = x[kXOrder.e[i]];
    }
}

// out[t] = row n of W . row t of x for R rows of reordered x (stride k); W row n is blocks [b0, b0 + nb).
template <int R, bool DQ>
void gemv_blocks(const Nf4Blob& w, int64_t b0, int64_t nb, const float* xp, int64_t k, float* out) {
    const uint8_t* codes = w.codes + b0 * (nf4::kBlock / 2);
#if defined(__AVX512F__)
    const __m512 cb = _mm512_loadu_ps(nf4::kCodebook);
    __m512i shift[4];
    for (int q = 0; q < 4; ++q)
        shift[q] = _mm512_inserti64x4(_mm512_set1_epi32(8 * q), _mm256_set1_epi32(8 * q + 4), 1);
    __m512 acc[R][4];
    for (int t = 0; t < R; ++t)
        for (int q = 0; q < 4; ++q)
            acc[t][q] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; ++i, codes += 32) {
        if ((i & 1) == 0) _mm_prefetch((const char*)codes + kPrefetchBytes, _MM_HINT_T0);
        const __m512 lut = _mm512_mul_ps(cb, _mm512_set1_ps(w.scale<DQ>(b0 + i)));
        const __m512i v  = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)codes));
        for (int q = 0; q < 4; ++q) { // permutexvar reads index bits 0..3
            const __m512 wq = _mm512_permutexvar_ps(_mm512_srlv_epi32(v, shift[q]), lut);
            for (int t = 0; t < R; ++t)
                acc[t][q] = _mm512_fmadd_ps(_mm512_loadu_ps(xp + t * k + 64 * i + 16 * q), wq, acc[t][q]);
        }
    }
    for (int t = 0; t < R; ++t) {
        const __m512 s =
            _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]), _mm512_add_ps(acc[t][2], acc[t][3]));
        out[t] = _mm512_reduce_add_ps(s);
    }
#elif defined(__AVX2__)
    const __m256 cb0 = _mm256_loadu_ps(nf4::kCodebook), cb1 = _mm256_loadu_ps(nf4::kCodebook + 8);
    __m256 acc[R][2];
    for (int t = 0; t < R; ++t)
        acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i, codes += 32) {
        if ((i & 1) == 0) _mm_prefetch((const char*)codes + kPrefetchBytes, _MM_HINT_T0);
        const __m256 s    = _mm256_set1_ps(w.scale<DQ>(b0 + i));
        const __m256 lut0 = _mm256_mul_ps(cb0, s), lut1 = _mm256_mul_ps(cb1, s);
        const __m256i v = _mm256_loadu_si256((const __m256i*)codes);
        for (int m = 0; m < 8; ++m) { // nibble m of the 8 words: index bits 0..2, bit 3 moved to the sign
            const __m256i idx = _mm256_srl_epi32(v, _mm_cvtsi32_si128(4 * m));
            const __m256i sel = _mm256_sll_epi32(v, _mm_cvtsi32_si128(28 - 4 * m));
            const __m256 wm   = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lut0, idx),
                                                 _mm256_permutevar8x32_ps(lut1, idx), _mm256_castsi256_ps(sel));
            const int64_t xo  = 64 * i + 16 * (m / 2) + 8 * (m % 2);
            for (int t = 0; t < R; ++t)
                acc[t][m % 2] = _mm256_fmadd_ps(_mm256_loadu_ps(xp + t * k + xo), wm, acc[t][m % 2]);
        }
    }
    for (int t = 0; t < R; ++t) {
        const __m256 v = _mm256_add_ps(acc[t][0], acc[t][1]);
        __m128 h       = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        h              = _mm_add_ps(h, _mm_movehl_ps(h, h));
        out[t]         = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
    }
#else
    float acc[R][16] = {};
    for (int64_t i = 0; i < nb; ++i, codes += 32) {
        const float s = w.scale<DQ>(b0 + i);
        float lut[16];
        for (int c = 0; c < 16; ++c)
            lut[c] = nf4::kCodebook[c] * s;
        for (int j = 0; j < nf4::kBlock; ++j) {
            const int e    = kXOrder.e[j];
            const float wv = lut[(e & 1) ? (codes[e >> 1] & 15) : (codes[e >> 1] >> 4)];
            for (int t = 0; t < R; ++t)
                acc[t][j % 16] += xp[t * k + 64 * i + j] * wv;
        }
    }
    for (int t = 0; t < R; ++t) {
        for (int h = 8; h > 0; h /= 2)
            for (int l = 0; l < h; ++l)
                acc[t][l] += acc[t][l + h];
        out[t] = acc[t][0];
    }
#endif
}

// Any K: row n of W is elements [n*K, n*K + K) of the blob, in pieces of the blocks it crosses; x in its
// own layout. Eight fp32 lanes per row of x (lane j % 8).
template <bool DQ>
void gemv_elements(const Nf4Blob& w, int64_t n, int64_t k, const float* x, int64_t ldx, int rows,
                   float* out) {
    float acc[kNf4GemvMaxRows][8] = {};
    const int64_t e0              = n * k;
    for (int64_t j = 0; j < k;) {
        const int64_t b   = (e0 + j) / nf4::kBlock;
        const int64_t end = std::min<int64_t>(k, (b + 1) * nf4::kBlock - e0);
        const float s     = w.scale<DQ>(b);
        float lut[16];
        for (int c = 0; c < 16; ++c)
            lut[c] = nf4::kCodebook[c] * s;
        for (; j < end; ++j) {
            const int64_t e    = e0 + j;
            const uint8_t byte = w.codes[e >> 1];
            const float wv     = lut[(e & 1) ? (byte & 15) : (byte >> 4)];
            for (int t = 0; t < rows; ++t)
                acc[t][j & 7] += x[t * ldx + j] * wv;
        }
    }
    for (int t = 0; t < rows; ++t) {
        const float* v = acc[t];
        out[t]         = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
    }
}

// Columns [n0, n1) of y; xp: x reordered (K a multiple of 64) or null (x as given, any K).
template <bool DQ>
void gemv_columns(const MatmulArgs& a, const Nf4Blob& w, const float* xp, int64_t n0, int64_t n1) {
    float out[kNf4GemvMaxRows];
    for (int64_t n = n0; n < n1; ++n) {
        if (!xp) {
            gemv_elements<DQ>(w, n, a.k, a.x, a.ldx, a.rows, out);
        } else {
            const int64_t nb = a.k / nf4::kBlock, b0 = n * nb;
            for (int r0 = 0; r0 < a.rows; r0 += kGemvGroupRows) {
                const float* x = xp + r0 * a.k;
                switch (std::min(kGemvGroupRows, a.rows - r0)) {
                case 1:
                    gemv_blocks<1, DQ>(w, b0, nb, x, a.k, out + r0);
                    break;
                case 2:
                    gemv_blocks<2, DQ>(w, b0, nb, x, a.k, out + r0);
                    break;
                case 3:
                    gemv_blocks<3, DQ>(w, b0, nb, x, a.k, out + r0);
                    break;
                default:
                    gemv_blocks<4, DQ>(w, b0, nb, x, a.k, out + r0);
                    break;
                }
            }
        }
        for (int t = 0; t < a.rows; ++t)
            a.y[t * a.ldy + n] = out[t];
    }
}

} // namespace

void matmul_nf4_gemv(const Context& c, const MatmulArgs& a) {
    const nf4::Layout l = nf4::layout(a.n * a.k, a.nf4_double_quant);
    const Nf4Blob w((const uint8_t*)a.w, l);
    float* xp = nullptr;
    if (a.k % nf4::kBlock == 0) {
        xp = c.thread_scratch(0);
        reorder_x(a, xp);
    }
    const int64_t tiles = (a.n + kGemvTileRows - 1) / kGemvTileRows;
    auto tile           = [&](int64_t t, int) {
        const int64_t n0 = t * kGemvTileRows, n1 = std::min<int64_t>(a.n, n0 + kGemvTileRows);
        if (l.double_quant)
            gemv_columns<true>(a, w, xp, n0, n1);
        else
            gemv_columns<false>(a, w, xp, n0, n1);
    };
    if (a.n * a.k < kGemvInlineElems)
        for (int64_t t = 0; t < tiles; ++t)
            tile(t, 0);
    else
        c.pool->parallel_for(tiles, [&](int64_t t, int th) { tile(t, th); });
}

namespace {
template <void (*Int16)(const Context&, const MatmulArgs&)>
void matmul_with(const Context& c, const MatmulArgs& a) {
    if (q16::applies(a.int16_x, a.dt == DType::NF4, a.k, a.rows))
        Int16(c, a);
    else if (q16::applies_gemm(a.int16_x, a.dt == DType::NF4, a.k, a.rows))
        matmul_nf4_gemm_int16(c, a);
    else if (a.int16_x && a.dt == DType::BF16 && a.rows >= 1 && a.rows <= kNf4GemvMaxRows)
        matmul_bf16_gemv(c, a);
    else if (a.dt == DType::NF4 && a.rows >= 1 && a.rows <= kNf4GemvMaxRows)
        matmul_nf4_gemv(c, a);
    else
        matmul_tiled(c, a);
}
} // namespace

void matmul(const Context& c, const MatmulArgs& a) {
    matmul_with<matmul_nf4_int16>(c, a);
}

#if defined(G4_CPU_VNNI_VARIANT)
void matmul_vnni(const Context& c, const MatmulArgs& a) {
    matmul_with<matmul_nf4_int16_vnni>(c, a);
}
#endif

// Tasks of kNormRows rows; a bf16 weight of up to kNormWMax elements is widened once a task (the products are
// those of widening it per group).
void rms_norm(const Context& c, const RmsNormArgs& a) {
    constexpr int kNormRows = 16, kNormWMax = 4096;
    const bool widen_once = a.w && a.wdt == DType::BF16 && a.dim <= kNormWMax;
    const bool clamp      = bounded(a.x_lo, a.x_hi);
    auto rows             = [&](int t0, int t1) {
        alignas(64) float wf[kNormWMax];
        if (widen_once) widen(a.w, a.wdt, a.dim, wf);
        for (int t = t0; t < t1; ++t)
            for (int g = 0; g < a.cols / a.dim; ++g) {
                const float* xg = a.x + t * a.ldx + (int64_t)g * a.dim;
                float* yg       = a.y + t * a.ldy + (int64_t)g * a.dim;
                if (clamp) { // the Clamp op's values into y, then the norm of y in place
                    for (int i = 0; i < a.dim; ++i)
                        yg[i] = clamp_value(xg[i], a.x_lo, a.x_hi);
                    xg = yg;
                }
                VecMapC x(xg, a.dim);
                VecMap y(yg, a.dim);
                float r = std::pow(x.squaredNorm() / (float)a.dim + a.eps, -0.5f);
                if (!a.w) {
                    y = x * r;
                } else if (a.wdt == DType::F32) {
                    y = (x * r).cwiseProduct(VecMapC((const float*)a.w, a.dim));
                } else if (widen_once) {
                    y = (x * r).cwiseProduct(VecMapC(wf, a.dim));
                } else if (a.wdt == DType::BF16) { // widened a block at a time
                    constexpr int kWBlock = 256;
                    alignas(64) float wb[kWBlock];
                    for (int i0 = 0; i0 < a.dim; i0 += kWBlock) {
                        const int m = std::min(kWBlock, a.dim - i0);
                        widen((const uint8_t*)a.w + dtype_bytes(a.wdt, i0), a.wdt, m, wb);
                        y.segment(i0, m) = (x.segment(i0, m) * r).cwiseProduct(VecMapC(wb, m));
                    }
                } else {
                    for (int i = 0; i < a.dim; ++i)
                        y[i] = x[i] * r * ref::load_weight(a.w, a.wdt, i);
                }
            }
    };
    const int blocks = (a.rows + kNormRows - 1) / kNormRows;
    if ((int64_t)a.rows * a.cols < kInlineElems || c.pool->size() == 1 || blocks == 1) {
        rows(0, a.rows);
        return;
    }
    c.pool->parallel_for(blocks, [&](int64_t b, int) {
        rows((int)b * kNormRows, std::min(a.rows, (int)b * kNormRows + kNormRows));
    });
}

void add(const Context& c, const BinaryArgs& a) {
    for_elems(c, a.rows, a.cols, [&](int t, int64_t c0, int64_t c1) {
        VecMap(a.y + t * a.ldy + c0, c1 - c0) =
            VecMapC(a.a + t * a.lda + c0, c1 - c0) + VecMapC(a.b + t * a.ldb + c0, c1 - c0);
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
    for_elems(c, a.rows, a.cols, [&](int t, int64_t c0, int64_t c1) {
        VecMap(a.y + t * a.ldy + c0, c1 - c0) = VecMapC(a.x + t * a.ldx + c0, c1 - c0) * s;
    });
}

void softcap(const Context& c, const ScaleArgs& a) {
    float inv = 1.0f / a.cap;
    for_elems(c, a.rows, a.cols, [&](int t, int64_t c0, int64_t c1) {
        const float* x = a.x + t * a.ldx;
        float* y       = a.y + t * a.ldy;
        for (int64_t i = c0; i < c1; ++i)
            y[i] = a.cap * std::tanh(x[i] * inv);
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
                float* x = a.x + t * a.ldx + (int64_t)h * a.dim;
                float x0 = x[k], x1 = x[k + half];
                x[k]        = x0 * cs - x1 * sn;
                x[k + half] = x1 * cs + x0 * sn;
            }
        }
    });
}

void kv_store(const Context& c, const KvStoreArgs& a) {
    ref::kv_store(a);
}

// Attention over a cache read through row(cache, offset, n, buf): n float32 values from element offset,
// the cache's own memory (f32) or buf after widening (bf16). Rows are taken in pieces of kAttnPiece
// columns (head dims up to 512 are one piece), so both dtypes share the arithmetic.
constexpr int kAttnPiece = 512;
template <class Row> static void attention_rows(const Context& c, const AttentionArgs& a, Row row) {
    const int group     = a.heads / a.kv_heads;
    const int64_t width = (int64_t)a.kv_heads * a.dim;
    c.pool->parallel_for((int64_t)a.rows * a.heads, [&](int64_t task, int th) {
        int t = (int)(task / a.heads), h = (int)(task % a.heads);
        int pos  = a.pos0 + t;
        int lo   = a.window > 0 ? std::max(0, pos - a.window + 1) : 0;
        int n    = pos - lo + 1;
        int kvh  = h / group;
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
        for (int j = 0; j < n; ++j)
            sum += (p[j] = std::exp(p[j] - mx));
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
        attention_rows(c, a,
                       [](const void* cache, int64_t o, int, float*) { return (const float*)cache + o; });
}

} // namespace g4::cpu::G4_CPU_NS
