// Matmul of 2..8 rows microbenchmark: g4_mm_rows_nf4 / _bf16 (kernels/cuda/matmul_rows.cu, batched decode
// steps) against the one-warp-a-row g4_matmul_nf4 / _bf16 they replace (for a tiled32 weight, after
// g4_nf4_untile32), at Gemma 4 E2B's projection shapes and its bf16 LM head, T = 1..8 rows. Reports the time
// a launch, the weight bytes read a second, this GPU's device-to-device copy rate (read + written bytes a
// second) and each kernel's largest output difference from g4_matmul_*, relative to its largest output.
// Weights are random (valid NF4 codes, f32 block scales); several copies rotate so every launch reads DRAM.
// Build from the repo root (an sm_90 GPU runs it):
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o build/mm_rows_bench bench/labs/mm_rows_bench.cu
// Usage: mm_rows_bench [reps]
#include "kernels/cuda/all_kernels.cuh"

#include "bench/labs/bench_cuda.h"

#include <cmath>

namespace {

struct Shape {
    const char* name;
    int N, K;
    bool nf4, tiled;
};

} // namespace

int main(int argc, char** argv) {
    const int reps       = argc > 1 ? std::atoi(argv[1]) : 20;
    BenchGpu g           = bench_gpu();
    const Shape shapes[] = {{"gate/up 6144x1536", 6144, 1536, true, false},
                            {"down 1536x6144 tiled", 1536, 6144, true, true},
                            {"q 2048x1536", 2048, 1536, true, false},
                            {"o 1536x2048 tiled", 1536, 2048, true, true},
                            {"lm head bf16 262144x1536", 262144, 1536, false, false}};
    const size_t pool    = (size_t)1 << 30; // 1 GiB of weights: copies of a matrix rotate through it
    unsigned char* w     = nullptr;         // NF4 codes
    u16* wbf             = nullptr;         // the bf16 LM head
    const size_t lm_n    = (size_t)262144 * 1536;
    float *x = nullptr, *y = nullptr, *absmax = nullptr;
    unsigned char *ucodes = nullptr, *uam = nullptr;
    Step* step = nullptr;
    CK(cudaMalloc(&w, pool));
    CK(cudaMalloc(&wbf, lm_n * 2));
    CK(cudaMalloc(&x, 8 * 12288 * 4));
    CK(cudaMalloc(&y, 8 * 262144 * 4));
    CK(cudaMalloc(&absmax, pool / 32 * 4 / 1)); // scales of the largest NF4 pool use (codes / 32 of a block)
    CK(cudaMalloc(&ucodes, 64 << 20));
    CK(cudaMalloc(&uam, 8 << 20));
    CK(cudaMalloc(&step, sizeof(Step)));
    random_matmul_operands(w, pool, wbf, lm_n, x, 8 * 12288, absmax, pool / 32);
    std::printf("device copy: %.0f GB/s (read + written)\n", copy_rate_gbs(g, w, pool));
    std::printf("| shape | T | kernel | us | weight GB/s | rel diff |\n|---|---|---|---|---|---|\n");
    const float* nul = nullptr;
    for (const Shape& sh : shapes) {
        const size_t wbytes = sh.nf4 ? (size_t)sh.N * sh.K / 2 : (size_t)sh.N * sh.K * 2;
        const int copies    = (int)std::max<size_t>(1, std::min<size_t>(64, pool / 2 / wbytes));
        for (int T : {1, 2, 4, 8}) {
            Step hs{T, 0, T, 0};
            CK(cudaMemcpy(step, &hs, sizeof hs, cudaMemcpyHostToDevice));
            std::vector<float> ref, out((size_t)T * sh.N);
            for (int kind = 0; kind < 2; ++kind) { // 0: g4_matmul_* (+ untile), 1: g4_mm_rows_*
                int mode = 0, N = sh.N, K = sh.K, tl = sh.tiled, ks = 1;
                long ldx = sh.K, ldy = sh.N;
                const long groups = (N + 3) / 4;
                while (ks < 4 && groups * ks < 4096 && K / (sh.nf4 ? 16 : 8) >= ks * 2 * 32)
                    ks *= 2;
                auto run = [&](int c) {
                    const unsigned char* wc = w + (size_t)c * wbytes;
                    const float* am         = absmax + (size_t)c * (wbytes / 32);
                    if (!sh.nf4) {
                        const u16* wb = wbf;
                        if (kind == 0)
                            g4_matmul_bf16<<<(N + 7) / 8, 256, 0, g.st>>>(step, mode, x, ldx, wb, N, K, y,
                                                                          ldy, nul);
                        else
                            g4_mm_rows_bf16<<<(unsigned)((groups + 4 / ks - 1) / (4 / ks)), 128, 0, g.st>>>(
                                step, mode, x, ldx, wb, N, K, y, ldy, nul, ks);
                        return;
                    }
                    if (kind == 1) {
                        g4_mm_rows_nf4<<<(unsigned)((groups + 4 / ks - 1) / (4 / ks)), 128, 0, g.st>>>(
                            step, mode, x, ldx, wc, am, nul, nul, nul, N, K, y, ldy, nul, tl, ks);
                        return;
                    }
                    const unsigned char* cw = wc;
                    const void* aw          = am;
                    if (sh.tiled) {
                        g4_nf4_untile32<<<(unsigned)(((long)N * K / 32 + 255) / 256), 256, 0, g.st>>>(
                            wc, am, 0, N, K, ucodes, uam);
                        cw = ucodes, aw = uam;
                    }
                    g4_matmul_nf4<<<(N + 7) / 8, 256, 0, g.st>>>(step, mode, x, ldx, cw, aw, nul, nul, nul, N,
                                                                 K, y, ldy, nul);
                };
                run(0);
                CK(cudaStreamSynchronize(g.st));
                CK(cudaGetLastError());
                CK(cudaMemcpy(out.data(), y, out.size() * 4, cudaMemcpyDeviceToHost));
                if (kind == 0) ref = out;
                const float t = median_ms_per_call(g, reps, copies, run);
                std::printf("| %s | %d | %s | %.1f | %.0f | %.2e |\n", sh.name, T,
                            kind == 0 ? (sh.tiled ? "untile + g4_matmul" : "g4_matmul") : "g4_mm_rows",
                            1000 * t, (double)wbytes / t / 1e6, kind == 0 ? 0.0f : max_rel(ref, out));
            }
        }
    }
    return 0;
}
