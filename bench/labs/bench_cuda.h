// Helpers of the CUDA benchmarks (bench/labs/*.cu). CK(call): on failure prints the file, the call and the
// error, and exits 1. median(samples): the middle sample (the upper one of an even count).
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
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
