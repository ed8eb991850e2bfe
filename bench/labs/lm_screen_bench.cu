// LM-head screening microbenchmark: the tied bf16 head GEMV + g4_argmax (what a decode step ends with)
// against g4_lm_screen + g4_lm_exact (the screened step) at E2B/E4B shapes, and the screen alone (the
// exact pass needs the screen's bound before it), back to back (no event between launches), medians. Random
// head (N(0, 0.05^2) bf16), random x. Build with the CUDA toolkit from the repo root (an sm_90 GPU runs it):
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o build/lm_screen_bench bench/labs/lm_screen_bench.cu
// Usage: lm_screen_bench [reps] [screen grid blocks per SM, comma list]
#include "compiler/cuda_schedule.h"
#include "kernels/cuda/all_kernels.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <random>
#include <string>
#include <vector>

#include "bench/labs/bench_cuda.h"

typedef void (*GemvFn)(const GemvArgs);
typedef void (*ExactFn)(const GemvArgs, const float2*, u32*, int*, Step*, int*, volatile int*, int);
static const GemvFn kHead[5]   = {g4_gemv_bf16_l8_m1, g4_gemv_bf16_l16_m1, g4_gemv_bf16_l32_m1,
                                  g4_gemv_bf16_l64_m1, g4_gemv_bf16_l128_m1};
static const ExactFn kExact[5] = {g4_lm_exact_l8, g4_lm_exact_l16, g4_lm_exact_l32, g4_lm_exact_l64,
                                  g4_lm_exact_l128};

int main(int argc, char** argv) {
    const int reps          = argc > 1 ? std::atoi(argv[1]) : 20;
    std::vector<int> per_sm = {4};
    if (argc > 2) {
        per_sm.clear();
        for (std::string s = argv[2]; !s.empty();) {
            size_t c = s.find(',');
            per_sm.push_back(std::atoi(s.substr(0, c).c_str()));
            s = c == std::string::npos ? "" : s.substr(c + 1);
        }
    }
    const BenchGpu gpu         = bench_gpu();
    const cudaDeviceProp& prop = gpu.prop;
    cudaStream_t st            = gpu.st;
    cudaEvent_t e0 = gpu.e0, e1 = gpu.e1;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 0.05f);
    for (int K : {1536, 2560}) {
        const int V = 262144;
        std::vector<unsigned short> w((size_t)V * K);
        for (auto& v : w) {
            float f = nd(rng);
            unsigned u;
            std::memcpy(&u, &f, 4);
            v = (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
        }
        std::vector<float> x(K);
        for (auto& v : x)
            v = nd(rng) * 20.0f;
        unsigned short* dw;
        float *dx, *logits, *sc, *bd;
        u32* tmax;
        unsigned char* q;
        float2* lohi;
        int *ws, *ids, *slots;
        Step* step;
        CK(cudaMalloc(&dw, w.size() * 2));
        CK(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&dx, K * 4));
        CK(cudaMemcpy(dx, x.data(), K * 4, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&logits, (size_t)V * 4));
        CK(cudaMalloc(&q, (size_t)V * K));
        CK(cudaMalloc(&sc, (size_t)V * 4));
        CK(cudaMalloc(&bd, (size_t)V * 4));
        CK(cudaMalloc(&lohi, (size_t)(V + 1) * 8));
        CK(cudaMalloc(&tmax, 4));
        CK(cudaMemset(tmax, 0, 4));
        CK(cudaMalloc(&ws, (2 + 2 * 128) * 4));
        CK(cudaMemset(ws, 0, (2 + 2 * 128) * 4));
        CK(cudaMalloc(&ids, 8));
        CK(cudaMalloc(&slots, 8));
        CK(cudaMalloc(&step, sizeof(Step) * 2));
        CK(cudaMemset(step, 0, sizeof(Step) * 2));
        g4_lm_screen_build<<<(V + 7) / 8, 256, 0, st>>>(dw, V, K, q, sc, bd);
        CK(cudaStreamSynchronize(st));
        const int lanes = g4::cuda::gemv_lanes(K, false, (V + 3) / 4), li = lanes == 8    ? 0
                                                                            : lanes == 16 ? 1
                                                                            : lanes == 32 ? 2
                                                                            : lanes == 64 ? 3
                                                                                          : 4;
        GemvArgs a{};
        a.m[0].w = dw, a.m[0].n = V, a.m[0].y = logits, a.x = dx, a.nmat = 1, a.k = K, a.epi = 3,
        a.cap                    = 30.0f;
        const unsigned head_grid = (unsigned)(((long)(V + 3) / 4 * lanes + 127) / 128);
        auto time                = [&](const char* what, auto&& body) {
            std::vector<float> t;
            for (int r = 0; r < reps + 2; ++r) {
                CK(cudaEventRecord(e0, st));
                for (int i = 0; i < 8; ++i)
                    body();
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                CK(cudaGetLastError());
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (r >= 2) t.push_back(ms * 1e3f / 8);
            }
            const float us = median(t);
            std::printf("K=%d %-40s %9.2f us\n", K, what, us);
            return us;
        };
        const float head = time("head GEMV (bf16)", [&] { kHead[li]<<<head_grid, 128, 0, st>>>(a); });
        time("g4_argmax",
             [&] { g4_argmax<<<128, 1024, 0, st>>>(logits, V, ws, nullptr, nullptr, nullptr, V); });
        const float full = time("head GEMV + g4_argmax", [&] {
            kHead[li]<<<head_grid, 128, 0, st>>>(a);
            g4_argmax<<<128, 1024, 0, st>>>(logits, V, ws, nullptr, nullptr, nullptr, V);
        });
        for (int ps : per_sm) {
            const int nb1 = prop.multiProcessorCount * ps;
            char name[64];
            std::snprintf(name, sizeof name, "g4_lm_screen (%d blocks)", nb1);
            const float scr = time(
                name, [&] { g4_lm_screen<<<nb1, 256, 0, st>>>(dx, q, sc, bd, nullptr, V, K, lohi, tmax); });
            std::printf("K=%d   screen reads %.0f MB: %.0f GB/s (the head GEMV %.0f GB/s)\n", K,
                        (double)V * K / 1e6, (double)V * K / scr / 1e3, (double)V * K * 2 / head / 1e3);
            { // rows the exact pass computes (into a row of NaNs), and the pass alone (the bound restored
              // first)
                float* part;
                CK(cudaMalloc(&part, (size_t)V * 4));
                CK(cudaMemset(part, 0xff, (size_t)V * 4));
                GemvArgs b = a;
                b.m[0].y   = part;
                g4_lm_screen<<<nb1, 256, 0, st>>>(dx, q, sc, bd, nullptr, V, K, lohi, tmax);
                u32 key = 0;
                CK(cudaMemcpyAsync(&key, tmax, 4, cudaMemcpyDeviceToHost, st));
                kExact[li]<<<128, 128, 0, st>>>(b, lohi, tmax, ws, nullptr, ids, slots, V);
                std::vector<float> h(V);
                CK(cudaMemcpyAsync(h.data(), part, (size_t)V * 4, cudaMemcpyDeviceToHost, st));
                CK(cudaStreamSynchronize(st));
                long n = 0;
                for (float v : h)
                    n += v == v;
                std::printf("K=%d   the exact pass computes %ld rows\n", K, n);
                u32* keyd;
                CK(cudaMalloc(&keyd, 4));
                CK(cudaMemcpy(keyd, &key, 4, cudaMemcpyHostToDevice));
                const float cp = time("bound restored (a 4-byte copy)", [&] {
                    CK(cudaMemcpyAsync(tmax, keyd, 4, cudaMemcpyDeviceToDevice, st));
                });
                const float ex = time("bound restored + g4_lm_exact", [&] {
                    CK(cudaMemcpyAsync(tmax, keyd, 4, cudaMemcpyDeviceToDevice, st));
                    kExact[li]<<<128, 128, 0, st>>>(b, lohi, tmax, ws, nullptr, ids, slots, V);
                });
                std::printf("K=%d   g4_lm_exact alone ~%.2f us\n", K, ex - cp);
                float big = 100.0f; // a bound above every row: nothing to compute, the pass's fixed cost
                u32 kb;
                std::memcpy(&kb, &big, 4);
                kb |= 0x80000000u;
                CK(cudaMemcpy(keyd, &kb, 4, cudaMemcpyHostToDevice));
                const float ex0 = time("bound above every row + g4_lm_exact", [&] {
                    CK(cudaMemcpyAsync(tmax, keyd, 4, cudaMemcpyDeviceToDevice, st));
                    kExact[li]<<<128, 128, 0, st>>>(b, lohi, tmax, ws, nullptr, ids, slots, V);
                });
                std::printf("K=%d   g4_lm_exact with no rows ~%.2f us\n", K, ex0 - cp);
                cudaFree(part), cudaFree(keyd);
            }
            const float both = time("g4_lm_screen + g4_lm_exact", [&] {
                g4_lm_screen<<<nb1, 256, 0, st>>>(dx, q, sc, bd, nullptr, V, K, lohi, tmax);
                kExact[li]<<<128, 128, 0, st>>>(a, lohi, tmax, ws, nullptr, ids, slots, V);
            });
            std::printf("K=%d   screened / full: %.2f us / %.2f us (saves %.1f us a token)\n", K, both, full,
                        full - both);
        }
        cudaFree(dw), cudaFree(dx), cudaFree(logits), cudaFree(q), cudaFree(sc), cudaFree(bd), cudaFree(lohi),
            cudaFree(tmax), cudaFree(ws);
        cudaFree(ids), cudaFree(slots), cudaFree(step);
    }
    return 0;
}
