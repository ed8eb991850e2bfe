// Random NF4 MLP weight sets for the fused-MLP labs (bench/mlp_tma_lab.cu, bench/mlp_mma_lab.cu): gate and
// up in the standard layout, down also tiled (kQuantTiled32, as g4_mlp_nf4 reads it), block scales double
// quant or (G4_LAB_F32=1, g4 compile's default) f32; and a one-block ResNorm stand-in to launch between
// MLPs. Include after kernels/cuda/kernels.cu, bench_cuda.h and mlp_lab.h.
#pragma once
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

// A one-block stand-in for the ResNorm between MLPs: reads y, reduces it, writes xo, zeroes y.
__global__ void __launch_bounds__(512) fake_resnorm(float* y, float* xo, int H) {
    __shared__ float red[32];
    pdl_begin();
    float ss = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        ss += y[i] * y[i];
    const float r = rsqrtf(block_sum(ss, red) / H + 1e-6f);
    __syncthreads();
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        xo[i] = y[i] * r, y[i] = 0.0f;
}

struct Nf4 {
    std::vector<u8> codes, aq;
    std::vector<float>
        af; // G4_LAB_F32: the block scales dequantized (f32 absmax, as g4 compile makes by default)
    GemvMat dev{};
};
static const bool g_f32 = std::getenv("G4_LAB_F32") != nullptr;
static Nf4 make_nf4(int n, int k, std::mt19937& rng, const float* code2_dev, const float* off_dev) {
    Nf4 m;
    size_t elems = (size_t)n * k, blocks = elems / 64;
    m.codes.resize(elems / 2), m.aq.resize(blocks);
    std::vector<float> a2((blocks + 255) / 256);
    for (auto& b : m.codes)
        b = (u8)rng();
    for (auto& b : m.aq)
        b = (u8)rng();
    for (auto& v : a2)
        v = 0.01f + (float)(rng() % 1000) * 2e-5f;
    m.dev.w = up(m.codes.data(), m.codes.size()), m.dev.absmax = up(m.aq.data(), m.aq.size());
    m.dev.absmax2 = (const float*)up(a2.data(), a2.size() * 4), m.dev.offset = off_dev,
    m.dev.code2 = code2_dev, m.dev.n = n;
    if (g_f32) {
        m.af.resize(blocks);
        for (size_t b = 0; b < blocks; ++b)
            m.af[b] = (m.aq[b] - 128) / 128.0f * a2[b / 256] + g_off;
        m.dev.absmax = up(m.af.data(), blocks * 4), m.dev.absmax2 = nullptr, m.dev.offset = nullptr,
        m.dev.code2 = nullptr;
    }
    return m;
}

// One MLP's weights; tcodes / tabs: the down matrix tiled ([I / 32][H][16 bytes], scales [I / 64][H]).
struct MlpSet {
    Nf4 gate, up, down;
    const u8 *tcodes, *tabs;
};
static MlpSet make_mlp_set(int H, int I, std::mt19937& rng, const float* code2_dev, const float* off_dev) {
    MlpSet s;
    s.gate = make_nf4(I, H, rng, code2_dev, off_dev);
    s.up   = make_nf4(I, H, rng, code2_dev, off_dev);
    s.down = make_nf4(H, I, rng, code2_dev, off_dev);
    std::vector<u8> t((size_t)H * I / 2);
    for (int jj = 0; jj < I / 32; ++jj)
        for (int r = 0; r < H; ++r)
            std::memcpy(&t[((size_t)jj * H + r) * 16], &s.down.codes[((size_t)r * I + (size_t)jj * 32) / 2],
                        16);
    s.tcodes = (const u8*)up(t.data(), t.size());
    std::vector<u8> ta((size_t)H * I / 64);
    std::vector<float> tf(g_f32 ? (size_t)H * I / 64 : 0);
    for (int cc = 0; cc < I / 64; ++cc)
        for (int r = 0; r < H; ++r) {
            ta[(size_t)cc * H + r] = s.down.aq[(size_t)r * (I / 64) + cc];
            if (g_f32) tf[(size_t)cc * H + r] = s.down.af[(size_t)r * (I / 64) + cc];
        }
    s.tabs = g_f32 ? (const u8*)up(tf.data(), tf.size() * 4) : (const u8*)up(ta.data(), ta.size());
    return s;
}
// kernels.cu's fused MLP for the sets' scale format (G4_LAB_F32: f32, else double quant), 128 or 256 threads.
static const void* mlp_kernel(int threads) {
    if (g_f32) return threads == 128 ? (const void*)g4_mlp_nf4 : (const void*)g4_mlp_nf4_b256;
    return threads == 128 ? (const void*)g4_mlp_nf4_dq : (const void*)g4_mlp_nf4_b256_dq;
}
