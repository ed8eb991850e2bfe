// Random NF4 MLP weight sets for the fused-MLP labs (bench/labs/mlp_tma_lab.cu, bench/labs/mlp_mma_lab.cu):
// gate and up in the standard layout, down also tiled (kQuantTiled32, as g4_mlp_nf4 reads it), block scales
// double quant or (G4_LAB_F32=1, g4 compile's default) f32; and a one-block ResNorm stand-in to launch
// between MLPs. Include after kernels/cuda/all_kernels.cuh, bench_cuda.h and mlp_lab.h.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
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
// G4_LAB_BASE_ONLY: kernels.cu's own MLP kernels only; G4_LAB_PROFILE=<shape index>: each variant launched
// once at that shape, no timing (for Nsight Compute). Read here only (docs/environment.md).
static const bool g_base_only      = std::getenv("G4_LAB_BASE_ONLY") != nullptr;
static const char* const g_profile = std::getenv("G4_LAB_PROFILE");
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

// The stand-in after an MLP that writes y (H floats): reads y, writes xo, zeroes y.
static void launch_stand_in(cudaStream_t st, float* y, float* xo, int H) {
    void* pr[] = {&y, &xo, &H};
    launch_pdl((const void*)fake_resnorm, 1, 512, 0, st, pr);
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

// One shape's lab state: enough weight sets to pass 384 MB (each MLP of a graph reads its weights from DRAM),
// x (random in [-0.5, 0.5)), the output y and the stand-in's output xo.
struct MlpLab {
    int H, I, copies;
    size_t mlp_bytes; // an MLP's codes and f32 scales
    std::vector<MlpSet> sets;
    float *x, *y, *xo;
    MlpLab(int H_, int I_, std::mt19937& rng, const float* code2_dev, const float* off_dev) : H(H_), I(I_) {
        mlp_bytes = (size_t)3 * H * I / 2 + (size_t)3 * H * I / 64;
        copies    = (int)std::max<size_t>(2, (size_t)(384u << 20) / mlp_bytes + 1);
        sets.resize(copies);
        for (auto& s : sets)
            s = make_mlp_set(H, I, rng, code2_dev, off_dev);
        CK(cudaMalloc(&x, H * 4));
        CK(cudaMalloc(&y, H * 4));
        CK(cudaMalloc(&xo, H * 4));
        std::vector<float> hx(H);
        for (auto& v : hx)
            v = (float)(rng() % 1000) / 1000.0f - 0.5f;
        CK(cudaMemcpy(x, hx.data(), H * 4, cudaMemcpyHostToDevice));
    }
    // The fused MLP's arguments for set s.
    MlpArgs args(const MlpSet& s) const {
        MlpArgs a{};
        a.gu.m[0] = s.gate.dev, a.gu.m[1] = s.up.dev;
        a.gu.x = x, a.gu.nmat = 2, a.gu.k = H, a.gu.epi = 1;
        a.dn   = Nf4Tiled{s.tcodes, s.tabs, s.down.dev.absmax2, s.down.dev.offset, s.down.dev.code2};
        a.bias = nullptr, a.y = y, a.H = H, a.I = I;
        return a;
    }
};
// kernels.cu's fused MLP for the sets' scale format (G4_LAB_F32: f32, else double quant), 128 or 256 threads.
static const void* mlp_kernel(int threads) {
    if (g_f32) return threads == 128 ? (const void*)g4_mlp_nf4 : (const void*)g4_mlp_nf4_b256;
    return threads == 128 ? (const void*)g4_mlp_nf4_dq : (const void*)g4_mlp_nf4_b256_dq;
}

// The labs' three graph modes: each variant's graph of 2 x copies MLPs (enqueue(vi, set, stand_in)) timed
// reps times after two warm-ups, back to back; with the one-block ResNorm stand-in after each MLP (the decode
// graph's order); back to back on one weight set (L2-resident). Prints us an MLP (a pair with the stand-in),
// the change against variant 0, TB/s of mlp_bytes, and err[vi].
template <class Enqueue>
static void mlp_time_modes(const BenchGpu& gpu, int reps, int copies, size_t mlp_bytes,
                           const std::vector<std::string>& names, const std::vector<double>& err,
                           const std::vector<MlpSet>& sets, Enqueue enqueue) {
    const size_t nv = names.size();
    for (int rn = 0; rn < 3; ++rn) { // 2: back to back, one weight set (L2-resident)
        const int nsets = rn == 2 ? 1 : copies;
        std::vector<std::vector<float>> t(nv);
        std::vector<cudaGraphExec_t> ex(nv);
        for (size_t vi = 0; vi < nv; ++vi) {
            cudaGraph_t gr;
            CK(cudaStreamBeginCapture(gpu.st, cudaStreamCaptureModeGlobal));
            for (int rep = 0; rep < 2; ++rep)
                for (int si = 0; si < copies; ++si)
                    enqueue(vi, sets[si % nsets], rn == 1);
            CK(cudaStreamEndCapture(gpu.st, &gr));
            CK(cudaGraphInstantiate(&ex[vi], gr, 0));
            CK(cudaGraphDestroy(gr));
        }
        for (int r = 0; r < reps + 2; ++r)
            for (size_t vi = 0; vi < nv; ++vi) {
                CK(cudaEventRecord(gpu.e0, gpu.st));
                CK(cudaGraphLaunch(ex[vi], gpu.st));
                CK(cudaEventRecord(gpu.e1, gpu.st));
                CK(cudaEventSynchronize(gpu.e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, gpu.e0, gpu.e1));
                if (r >= 2) t[vi].push_back(ms * 1e3f / (2 * copies));
            }
        std::printf("  %s\n", rn == 1   ? "MLP + one-block ResNorm stand-in, us a pair"
                              : rn == 2 ? "MLPs back to back, one weight set (L2), us an MLP"
                                        : "MLPs back to back, us an MLP");
        const float base = median(t[0]);
        for (size_t vi = 0; vi < nv; ++vi) {
            const float us = median(t[vi]);
            std::printf("    %-28s %8.2f us  %+6.1f%%  %6.2f TB/s  err %.1e\n", names[vi].c_str(), us,
                        100.0f * (base / us - 1.0f), mlp_bytes / (us * 1e-6) / 1e12, err[vi]);
        }
        for (auto e : ex)
            cudaGraphExecDestroy(e);
    }
}

// What one MLP leaves in y (H floats, zeroed first): run(), launched on st, then a sync.
template <class Run> static std::vector<float> mlp_result(cudaStream_t st, float* y, int H, Run run) {
    CK(cudaMemset(y, 0, H * 4));
    run();
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    std::vector<float> h(H);
    CK(cudaMemcpy(h.data(), y, H * 4, cudaMemcpyDeviceToHost));
    return h;
}
// The largest difference over the largest reference value.
static double mlp_rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
    double dmax = 0, rmax = 0;
    for (size_t i = 0; i < ref.size(); ++i)
        dmax = std::max(dmax, (double)std::fabs(got[i] - ref[i])),
        rmax = std::max(rmax, (double)std::fabs(ref[i]));
    return dmax / rmax;
}
// Each variant's output (result(v)) against variant 0's: the err column of mlp_time_modes.
template <class V, class Result>
static std::vector<double> mlp_errors(const std::vector<V>& vs, Result result) {
    const std::vector<float> ref = result(vs[0]);
    std::vector<double> err;
    for (const V& v : vs)
        err.push_back(mlp_rel_err(result(v), ref));
    return err;
}
