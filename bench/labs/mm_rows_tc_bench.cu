// Tensor-core row matmul microbenchmark (kernels/cuda/matmul_rows_tc.cu, the matmuls of batched decode steps
// of 9..16 sessions): every grid (column groups a block wn, K splits S) of the plan's kernels and of other
// tile / depth choices of the same template, at Gemma 4 E2B's projection shapes and its bf16 LM head, T rows.
// Reports the time a launch (the splits' sum included), the weight bytes read a second, each result's largest
// difference from g4_matmul_*'s relative to its largest output, and the grid rows_tc_grid picks. Weights are
// random (NF4 codes, f32 block scales); copies rotate so every launch reads DRAM; kernels are launched with
// programmatic dependent launch, as in the batched step's graph. Build from the repo root:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o build/mm_rows_tc_bench bench/labs/mm_rows_tc_bench.cu
// Usage: mm_rows_tc_bench [rows] [reps] [csv]; LAB_SHAPE=substring, LAB_WN=n, LAB_S=n keep only the
// matching shapes and grids (to profile one launch).
#include "kernels/cuda/all_kernels.cuh"

#include "bench/labs/bench_cuda.h"
#include "runtime/src/cuda/rows_tc_grid.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

// Other instantiations of the kernels' template: tiles a warp, K blocks in flight, blocks a multiprocessor.
#define LAB_NF4(name, TI, D, MB)                                                                             \
    extern "C" __global__ void __launch_bounds__(256, MB)                                                    \
        name(const Step* s, int mode, const float* x, long ldx, const u8* codes, const void* absmax,         \
             const float* absmax2, const float* offset, const float* code2, int N, int K, float* y,          \
             long ldy, const float* bias, int tiled, int WN, float* part) {                                  \
        __shared__ TcsShared<TI> sh;                                                                         \
        const TcsWeight W{codes, absmax, absmax2, offset, code2, nullptr};                                   \
        if (tiled)                                                                                           \
            tcs_nf4<true, TI, D>(sh, s, mode, x, ldx, W, N, K, y, ldy, bias, WN, part, blockIdx.x, N);       \
        else                                                                                                 \
            tcs_nf4<false, TI, D>(sh, s, mode, x, ldx, W, N, K, y, ldy, bias, WN, part, blockIdx.x, N);      \
    }
#define LAB_BF16(name, TI, D, MB)                                                                            \
    extern "C" __global__ void __launch_bounds__(256, MB)                                                    \
        name(const Step* s, int mode, const float* x, long ldx, const u16* w, int N, int K, float* y,        \
             long ldy, const float* bias, int WN, float* part) {                                             \
        __shared__ TcsShared<TI> sh;                                                                         \
        const TcsWeight W{nullptr, nullptr, nullptr, nullptr, nullptr, w};                                   \
        tcs_run<false, false, NF4_SCALES_F32, TI, D>(sh, s, mode, x, ldx, W, N, K, y, ldy, bias, WN, part,   \
                                                     blockIdx.x, N);                                         \
    }
LAB_NF4(lab_nf4_t2d3, 2, 3, 2)
LAB_NF4(lab_nf4_t4d3, 4, 3, 1)
LAB_NF4(lab_nf4_t1d2, 1, 2, 3)
LAB_NF4(lab_nf4_t1d4, 1, 4, 3)
LAB_NF4(lab_nf4_t2d4, 2, 4, 2)
LAB_BF16(lab_bf16_t4d2, 4, 2, 1)

namespace {

struct Shape {
    const char* name;
    int N, K;
    bool nf4, tiled;
};
struct Variant {
    const char* name;
    const void* fn;
    int tiles;
    bool nf4;
};

void launch2(const void* fn, dim3 grid, cudaStream_t st, void** args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid, cfg.blockDim = dim3(256), cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id                                         = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at, cfg.numAttrs = 1;
    CK(cudaLaunchKernelExC(&cfg, fn, args));
}

} // namespace

int main(int argc, char** argv) {
    const int T              = argc > 1 ? std::atoi(argv[1]) : 16;
    const int reps           = argc > 2 ? std::atoi(argv[2]) : 7;
    FILE* csv                = argc > 3 ? std::fopen(argv[3], "w") : nullptr;
    BenchGpu g               = bench_gpu();
    const Shape shapes[]     = {{"gate/up 12288x1536", 12288, 1536, true, false},
                                {"down 1536x12288 tiled", 1536, 12288, true, true},
                                {"gate/up 6144x1536", 6144, 1536, true, false},
                                {"down 1536x6144 tiled", 1536, 6144, true, true},
                                {"q 2048x1536", 2048, 1536, true, false},
                                {"o 1536x2048 tiled", 1536, 2048, true, true},
                                {"q 4096x1536", 4096, 1536, true, false},
                                {"o 1536x4096 tiled", 1536, 4096, true, true},
                                {"kv 512x1536", 512, 1536, true, false},
                                {"kv 256x1536", 256, 1536, true, false},
                                {"ple gate bf16 256x1536", 256, 1536, false, false},
                                {"ple proj bf16 1536x256", 1536, 256, false, false},
                                {"bf16 8960x1536", 8960, 1536, false, false},
                                {"lm head bf16 262144x1536", 262144, 1536, false, false}};
    const Variant variants[] = {{"plan nf4 t2 d2", (const void*)g4_mm_rows_tcs_nf4, 2, true},
                                {"nf4 t2 d3", (const void*)lab_nf4_t2d3, 2, true},
                                {"nf4 t4 d3 1blk", (const void*)lab_nf4_t4d3, 4, true},
                                {"nf4 t1 d2 3blk", (const void*)lab_nf4_t1d2, 1, true},
                                {"nf4 t1 d4 3blk", (const void*)lab_nf4_t1d4, 1, true},
                                {"nf4 t2 d4", (const void*)lab_nf4_t2d4, 2, true},
                                {"plan bf16 t2 d2", (const void*)g4_mm_rows_tcs_bf16, 2, false},
                                {"bf16 t4 d2 1blk", (const void*)lab_bf16_t4d2, 4, false}};
    const size_t pool        = (size_t)1 << 30; // copies of a matrix rotate through it
    unsigned char* w         = nullptr;         // NF4 codes
    u16* wbf                 = nullptr;         // bf16 weights
    float *x = nullptr, *y = nullptr, *absmax = nullptr, *part = nullptr;
    unsigned char *ucodes = nullptr, *uam = nullptr;
    Step* step = nullptr;
    CK(cudaMalloc(&w, pool));
    CK(cudaMalloc(&wbf, pool));
    CK(cudaMalloc(&x, 16 * 12288 * 4));
    CK(cudaMalloc(&y, 16 * 262144 * 4));
    CK(cudaMalloc(&part, 64 * 16 * 12288 * 4));
    CK(cudaMalloc(&absmax, pool / 32 * 4));
    CK(cudaMalloc(&ucodes, 64 << 20));
    CK(cudaMalloc(&uam, 8 << 20));
    CK(cudaMalloc(&step, sizeof(Step)));
    random_matmul_operands(w, pool, wbf, pool / 2, x, 16 * 12288, absmax, pool / 32);
    Step hs{T, 0, T, 0};
    CK(cudaMemcpy(step, &hs, sizeof hs, cudaMemcpyHostToDevice));
    std::printf("device copy: %.0f GB/s (read + written); rows %d\n", copy_rate_gbs(g, w, pool), T);
    if (csv) std::fprintf(csv, "shape,variant,wn,splits,us,gbs,rel\n");
    std::printf("| shape | kernel | wn | S | us | weight GB/s | rel diff | note "
                "|\n|---|---|---|---|---|---|---|---|\n");
    const float* nul       = nullptr;
    int mode               = 0;
    const char* only_shape = std::getenv("LAB_SHAPE");
    const int only_wn      = std::getenv("LAB_WN") ? std::atoi(std::getenv("LAB_WN")) : 0;
    const int only_s       = std::getenv("LAB_S") ? std::atoi(std::getenv("LAB_S")) : 0;
    for (const Shape& sh : shapes) {
        if (only_shape && !std::strstr(sh.name, only_shape)) continue;
        const size_t wbytes = sh.nf4 ? (size_t)sh.N * sh.K / 2 : (size_t)sh.N * sh.K * 2;
        const int copies    = (int)std::max<size_t>(1, std::min<size_t>(32, pool / 2 / wbytes));
        int N = sh.N, K = sh.K, tl = sh.tiled;
        long ldx = sh.K, ldy = sh.N;
        // The reference: g4_matmul_* on copy 0 (a tiled weight untiled first).
        std::vector<float> ref((size_t)T * N), out((size_t)T * N);
        {
            if (!sh.nf4) {
                g4_matmul_bf16<<<(N + 7) / 8, 256, 0, g.st>>>(step, mode, x, ldx, wbf, N, K, y, ldy, nul);
            } else {
                const unsigned char* cw = w;
                const void* aw          = absmax;
                if (sh.tiled) {
                    g4_nf4_untile32<<<(unsigned)(((long)N * K / 32 + 255) / 256), 256, 0, g.st>>>(
                        w, absmax, 0, N, K, ucodes, uam);
                    cw = ucodes, aw = uam;
                }
                g4_matmul_nf4<<<(N + 7) / 8, 256, 0, g.st>>>(step, mode, x, ldx, cw, aw, nul, nul, nul, N, K,
                                                             y, ldy, nul);
            }
            CK(cudaStreamSynchronize(g.st));
            CK(cudaMemcpy(ref.data(), y, ref.size() * 4, cudaMemcpyDeviceToHost));
        }
        const g4::cuda_ws::RowsTcGrid pick = g4::cuda_ws::rows_tc_grid(N, K);
        for (const Variant& v : variants) {
            if (v.nf4 != sh.nf4) continue;
            std::vector<std::pair<float, std::string>> rows;
            for (int wn : {1, 2, 4, 8})
                for (int S : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48}) {
                    if (S > K / 64 || (sh.N > 100000 && S > 1)) continue;
                    if ((only_wn && wn != only_wn) || (only_s && S != only_s)) continue;
                    const unsigned gx = (unsigned)((N + 8 * v.tiles * wn - 1) / (8 * v.tiles * wn));
                    auto run          = [&](int c) {
                        const unsigned char* wc = w + (size_t)c * wbytes;
                        const float* am         = absmax + (size_t)c * (wbytes / 32);
                        const u16* wb           = wbf + (size_t)c * (wbytes / 2);
                        float* yy               = y;
                        if (v.nf4) {
                            void* args[] = {&step, &mode, &x,  &ldx, &wc,  &am, &nul, &nul, &nul,
                                            &N,    &K,    &yy, &ldy, &nul, &tl, &wn,  &part};
                            launch2(v.fn, dim3(gx, S), g.st, args);
                        } else {
                            void* args[] = {&step, &mode, &x, &ldx, &wb, &N, &K, &yy, &ldy, &nul, &wn, &part};
                            launch2(v.fn, dim3(gx, S), g.st, args);
                        }
                        if (S > 1) {
                            void* args[] = {&step, &mode, &part, &S, &N, &yy, &ldy, &nul};
                            launch2((const void*)g4_mm_rows_tcs_sum, dim3((T * N + 255) / 256), g.st, args);
                        }
                    };
                    run(0);
                    CK(cudaStreamSynchronize(g.st));
                    CK(cudaGetLastError());
                    CK(cudaMemcpy(out.data(), y, out.size() * 4, cudaMemcpyDeviceToHost));
                    const float rel = max_rel(ref, out);
                    const float t   = median_ms_per_call(g, reps, copies, run) * 1000;
                    if (csv)
                        std::fprintf(csv, "%s,%s,%d,%d,%.2f,%.0f,%.2e\n", sh.name, v.name, wn, S, t,
                                     (double)wbytes / t / 1e3, rel);
                    char line[256];
                    const bool picked = v.fn == (v.nf4 ? (const void*)g4_mm_rows_tcs_nf4
                                                       : (const void*)g4_mm_rows_tcs_bf16) &&
                                        wn == pick.wn && S == pick.splits;
                    std::snprintf(line, sizeof line, "| %s | %s | %d | %d | %.1f | %.0f | %.2e | %s |",
                                  sh.name, v.name, wn, S, t, (double)wbytes / t / 1e3, rel,
                                  picked ? "rows_tc_grid" : "");
                    rows.emplace_back(picked ? -1.0f : t, line);
                    if (rel > 1e-4) std::printf("%s  <-- rel diff\n", line);
                }
            std::sort(rows.begin(), rows.end());
            for (size_t i = 0; i < rows.size() && i < 4; ++i)
                std::printf("%s\n", rows[i].second.c_str());
        }
    }
    if (csv) std::fclose(csv);
    return 0;
}
