// Step-to-step synchronisation cost on this GPU: what a dependent step costs as (a) a kernel in a
// CUDA graph chained with programmatic dependent launch (the decode graph today), (b) the same without
// programmatic launch, (c) a grid-wide barrier inside one persistent kernel (a persistent decode
// kernel's step boundary). Every step reads the previous step's 1536-float vector and writes the next
// one, so each boundary is a true dependency. Prints µs per step, median of 15 replays.
// Build with the CUDA toolkit from the repo root (an sm_90 GPU runs it): nvcc -O3 -std=c++17 -arch=sm_90 -I.
// -o build/sync_bench bench/labs/sync_bench.cu
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <vector>

#include "bench/labs/bench_cuda.h"

constexpr int H = 1536, STEPS = 400, THREADS = 128;

__device__ __forceinline__ void pdl_begin() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// One step: every block reads all of x (a reduction, as a norm or a GEMV input would) and block b
// writes its slice of y.
__device__ __forceinline__ void step_body(const float* x, float* y, int blk, int nblk) {
    __shared__ float red[THREADS / 32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < H; i += THREADS)
        s += x[i];
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    const float t = (red[0] + red[1] + red[2] + red[3]) * (1.0f / H);
    for (int i = blk * THREADS + threadIdx.x; i < H; i += nblk * THREADS)
        y[i] = x[i] * 0.5f + t * 1e-3f;
    __syncthreads();
}

__global__ void __launch_bounds__(THREADS) k_step(const float* x, float* y) {
    pdl_begin();
    step_body(x, y, blockIdx.x, gridDim.x);
}

// Grid barrier: a monotonically increasing arrival counter; phase p ends when it reaches (p+1)*grid.
__device__ __forceinline__ void grid_barrier(unsigned* count, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
        } while (v < target);
    }
    __syncthreads();
}

__global__ void __launch_bounds__(THREADS) k_persistent(float* buf, unsigned* count, int steps) {
    for (int p = 0; p < steps; ++p) {
        const float* x = buf + (p & 1) * H;
        float* y       = buf + ((p + 1) & 1) * H;
        step_body(x, y, blockIdx.x, gridDim.x);
        grid_barrier(count, (unsigned)(p + 1) * gridDim.x);
    }
}

int main() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    float* buf;
    unsigned* count;
    CK(cudaMalloc(&buf, 2 * H * sizeof(float)));
    CK(cudaMemset(buf, 0, 2 * H * sizeof(float)));
    CK(cudaMalloc(&count, sizeof(unsigned)));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int sms = prop.multiProcessorCount;
    for (int grid : {1, sms, 3 * sms}) {
        for (int pdl = 0; pdl < 2; ++pdl) {
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            for (int p = 0; p < STEPS; ++p) {
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = grid, cfg.blockDim = THREADS, cfg.stream = s;
                cudaLaunchAttribute at[1];
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.attrs = at, cfg.numAttrs = pdl;
                CK(cudaLaunchKernelEx(&cfg, k_step, (const float*)(buf + (p & 1) * H),
                                      buf + ((p + 1) & 1) * H));
            }
            CK(cudaStreamEndCapture(s, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            std::vector<float> t;
            for (int r = 0; r < 16; ++r) {
                CK(cudaEventRecord(e0, s));
                CK(cudaGraphLaunch(ge, s));
                CK(cudaEventRecord(e1, s));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (r) t.push_back(ms * 1000.0f / STEPS);
            }
            std::printf("graph of kernels, grid %4d, %-22s %6.2f us a step\n", grid,
                        pdl ? "programmatic launch:" : "plain:", median(t));
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
        }
        int per_sm = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_persistent, THREADS, 0));
        if (grid > per_sm * sms) continue;
        std::vector<float> t;
        for (int r = 0; r < 16; ++r) {
            CK(cudaMemsetAsync(count, 0, sizeof(unsigned), s));
            CK(cudaEventRecord(e0, s));
            k_persistent<<<grid, THREADS, 0, s>>>(buf, count, STEPS);
            CK(cudaGetLastError());
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r) t.push_back(ms * 1000.0f / STEPS);
        }
        std::printf("persistent kernel, grid %4d, grid barrier:   %6.2f us a step\n", grid, median(t));
    }
    return 0;
}
