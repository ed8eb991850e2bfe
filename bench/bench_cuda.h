// CK(call): the CUDA runtime benchmarks' error check (bench/*.cu): on failure prints the program, the call
// and the error, and exits 1.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CK(x)                                                                                        \
    do {                                                                                             \
        cudaError_t e_ = (x);                                                                        \
        if (e_ != cudaSuccess) {                                                                     \
            std::fprintf(stderr, "%s: %s: %s\n", __FILE__, #x, cudaGetErrorString(e_));              \
            std::exit(1);                                                                            \
        }                                                                                            \
    } while (0)
