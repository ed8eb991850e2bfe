// Helpers of the CUDA benchmarks (bench/*.cu). CK(call): on failure prints the file, the call and the
// error, and exits 1. median(samples): the middle sample (the upper one of an even count).
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <vector>

#define CK(x)                                                                                        \
    do {                                                                                             \
        cudaError_t e_ = (x);                                                                        \
        if (e_ != cudaSuccess) {                                                                     \
            std::fprintf(stderr, "%s: %s: %s\n", __FILE__, #x, cudaGetErrorString(e_));              \
            std::exit(1);                                                                            \
        }                                                                                            \
    } while (0)

static inline float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}
