// Shared set-up of the decode-MLP labs (bench/labs/mlp_lab.cu, bench/labs/mlp_tma_lab.cu,
// bench/labs/mlp_mma_lab.cu): the real MLP shapes, device uploads and the double-quant code book. Include
// after bench_cuda.h.
#pragma once
#include <cuda_runtime.h>
#include <vector>

struct MlpShape {
    const char* name;
    int H, I;
};
static const MlpShape kMlpShapes[] = {
    {"e2b mlp", 1536, 6144}, {"e2b mlp (wide)", 1536, 12288}, {"e4b mlp", 2560, 10240}};

// n bytes of h in a new device allocation (never freed: the labs exit after their runs).
static void* up(const void* h, size_t n) {
    void* d;
    CK(cudaMalloc(&d, n));
    CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}
// The double quant's offset and code book (code2[i] = (i - 128) / 128) the labs' random matrices use.
static float g_off = 0.01f;
struct DqTables {
    const float *code2, *offset; // device
};
static DqTables dq_tables() {
    std::vector<float> code2(256);
    for (int i = 0; i < 256; ++i)
        code2[i] = (i - 128) / 128.0f;
    return {(const float*)up(code2.data(), 1024), (const float*)up(&g_off, 4)};
}
