// Decode MLP lab, packed-f16 products (sm_90): kernels.cu's fused MLP with f32 products (g4_mlp_nf4[_b256]: a
// code byte is one 64-bit lookup of an f32 pair and two FFMAs) against the packed-f16 kernels
// (g4_mlp_nf4[_b256]_h2: one 32-bit lookup of an f16 pair and one HFMA2; the plans' default), at 128 and 256
// threads, f32 block scales (G4_LAB_F32=1). This form times kernels.cu's kernels; it compiles but has not yet
// been run on a GPU (a prototype with its own copy of the f16 kernel measured the results in
// docs/performance.md). Graph modes as bench/labs/mlp_tma_lab.cu. Build with the CUDA toolkit from the repo
// root (an sm_90 GPU runs it):
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o build/mlp_h2_lab bench/labs/mlp_h2_lab.cu &&
//   G4_LAB_F32=1 build/mlp_h2_lab [reps]
#include "kernels/cuda/all_kernels.cuh"
#include "runtime/src/cuda/kernel_args.h"

#include <cuda_runtime.h>

#include "bench/labs/bench_cuda.h"
#include "bench/labs/mlp_lab.h"
#include "bench/labs/mlp_sets.h"

int main(int argc, char** argv) {
    const int reps     = argc > 1 ? std::atoi(argv[1]) : 15;
    const BenchGpu gpu = bench_gpu();
    const DqTables dq  = dq_tables();
    std::mt19937 rng(7);
    if (!g_f32) {
        std::fprintf(stderr,
                     "mlp_h2_lab: run with G4_LAB_F32=1 (the f16 kernels take f32 block scales only)\n");
        return 2;
    }
    const std::vector<std::pair<std::string, const void*>> vs = {
        {"g4_mlp_nf4 (128 thr)", (const void*)g4_mlp_nf4},
        {"g4_mlp_nf4_b256", (const void*)g4_mlp_nf4_b256},
        {"g4_mlp_nf4_h2 (128 thr)", (const void*)g4_mlp_nf4_h2},
        {"g4_mlp_nf4_b256_h2", (const void*)g4_mlp_nf4_b256_h2},
    };
    std::vector<std::string> names;
    for (const auto& v : vs) {
        names.push_back(v.first);
        CK(cudaFuncSetAttribute(v.second, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                g4::cuda_rt::kGemvSmemMax));
    }
    for (const MlpShape& sh : kMlpShapes) {
        const MlpLab L(sh.H, sh.I, rng, dq.code2, dq.offset);
        auto enqueue = [&](size_t vi, const MlpSet& s, bool stand_in) {
            MlpArgs a  = L.args(s);
            void* pa[] = {&a};
            launch_pdl(vs[vi].second, sh.I / MLP_S, names[vi].find("b256") != std::string::npos ? 256 : 128,
                       g4::cuda_rt::gemv_smem(true, 90, sh.H), gpu.st, pa);
            if (stand_in) launch_stand_in(gpu.st, L.y, L.xo, sh.H);
        };
        std::vector<size_t> idx(vs.size());
        for (size_t i = 0; i < idx.size(); ++i)
            idx[i] = i;
        const std::vector<double> err = mlp_errors(idx, [&](size_t vi) {
            return mlp_result(gpu.st, L.y, sh.H, [&] { enqueue(vi, L.sets[0], false); });
        });
        std::printf("%s: H %d I %d, %.1f MB a set, %d sets\n", sh.name, sh.H, sh.I, L.mlp_bytes / 1e6,
                    L.copies);
        mlp_time_modes(gpu, reps, L.copies, L.mlp_bytes, names, err, L.sets, enqueue);
    }
    return 0;
}
