// Helpers of the CUDA benchmarks (bench/labs/*.cu). CK(call): on failure prints the file, the call and the
// error, and exits 1. median(samples): the middle sample (the upper one of an even count).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <random>
#include <vector>

#define CK(x)                                                                                                \
    do {                                                                                                     \
        cudaError_t e_ = (x);                                                                                \
        if (e_ != cudaSuccess) {                                                                             \
            std::fprintf(stderr, "%s: %s: %s\n", __FILE__, #x, cudaGetErrorString(e_));                      \
            std::exit(1);                                                                                    \
        }                                                                                                    \
    } while (0)

static inline float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Launches fn (args as cudaLaunchKernelExC takes them) on st with programmatic dependent launch, as the
// decode graph's kernels are launched.
static inline void launch_pdl(const void* fn, unsigned grid, unsigned block, unsigned smem, cudaStream_t st,
                              void** args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(grid), cfg.blockDim = dim3(block), cfg.dynamicSmemBytes = smem, cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id                                         = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at, cfg.numAttrs = 1;
    CK(cudaLaunchKernelExC(&cfg, fn, args));
}

// GPU 0's properties (its name and SM count printed), a stream and two timing events: the CUDA
// benchmarks' common start.
struct BenchGpu {
    cudaDeviceProp prop;
    cudaStream_t st;
    cudaEvent_t e0, e1;
};
static inline BenchGpu bench_gpu() {
    BenchGpu g;
    CK(cudaGetDeviceProperties(&g.prop, 0));
    std::printf("%s, %d SMs\n", g.prop.name, g.prop.multiProcessorCount);
    CK(cudaStreamCreate(&g.st));
    CK(cudaEventCreate(&g.e0));
    CK(cudaEventCreate(&g.e1));
    return g;
}

// This GPU's device-to-device copy rate: half of buf (bytes long) copied onto the other half, median of 5,
// in GB/s of bytes read + written.
static inline double copy_rate_gbs(const BenchGpu& g, unsigned char* buf, size_t bytes) {
    std::vector<float> ms;
    for (int r = 0; r < 5; ++r) {
        CK(cudaEventRecord(g.e0, g.st));
        CK(cudaMemcpyAsync(buf + bytes / 2, buf, bytes / 2, cudaMemcpyDeviceToDevice, g.st));
        CK(cudaEventRecord(g.e1, g.st));
        CK(cudaEventSynchronize(g.e1));
        float t = 0;
        CK(cudaEventElapsedTime(&t, g.e0, g.e1));
        ms.push_back(t);
    }
    return (double)bytes / median(ms) / 1e6;
}

// The largest |a[i] - b[i]| relative to the largest |a[i]| (a: the reference).
static inline float max_rel(const std::vector<float>& a, const std::vector<float>& b) {
    float m = 0.0f, d = 0.0f;
    for (size_t i = 0; i < a.size(); ++i)
        m = std::max(m, std::fabs(a[i])), d = std::max(d, std::fabs(a[i] - b[i]));
    return m > 0 ? d / m : d;
}

// The median over reps of the time a call of run(c) takes, c = 0 .. copies - 1 back to back between two
// events (ms).
template <class Run> float median_ms_per_call(const BenchGpu& g, int reps, int copies, Run&& run) {
    std::vector<float> ms;
    for (int r = 0; r < reps; ++r) {
        CK(cudaEventRecord(g.e0, g.st));
        for (int c = 0; c < copies; ++c)
            run(c);
        CK(cudaEventRecord(g.e1, g.st));
        CK(cudaEventSynchronize(g.e1));
        float t = 0;
        CK(cudaEventElapsedTime(&t, g.e0, g.e1));
        ms.push_back(t / copies);
    }
    return median(ms);
}

// The random operands of the matmul labs, uploaded: codes (NF4, code_bytes random bytes), wbf (bf16_n bf16
// values of magnitude 2^-7 .. 2^-3, either sign), x (x_n floats in [-1, 1)), absmax (absmax_n f32 block
// scales in [0.01, 0.1)); the same values for the same sizes on every run.
static inline void random_matmul_operands(unsigned char* codes, size_t code_bytes, unsigned short* wbf,
                                          size_t bf16_n, float* x, size_t x_n, float* absmax,
                                          size_t absmax_n) {
    std::mt19937 rng(1);
    std::vector<unsigned char> hb(code_bytes);
    for (auto& b : hb)
        b = (unsigned char)rng();
    CK(cudaMemcpy(codes, hb.data(), code_bytes, cudaMemcpyHostToDevice));
    std::vector<unsigned short> hw(bf16_n);
    for (auto& v : hw)
        v = (unsigned short)((rng() & 0x807f) | (0x3c00 + ((rng() & 3) << 7)));
    CK(cudaMemcpy(wbf, hw.data(), bf16_n * 2, cudaMemcpyHostToDevice));
    std::vector<float> hx(x_n), ha(absmax_n);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f), sc(0.01f, 0.1f);
    for (auto& v : hx)
        v = u(rng);
    for (auto& v : ha)
        v = sc(rng);
    CK(cudaMemcpy(x, hx.data(), x_n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(absmax, ha.data(), absmax_n * 4, cudaMemcpyHostToDevice));
}
