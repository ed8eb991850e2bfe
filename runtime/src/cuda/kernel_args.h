// Host images of argument structs passed by value to CUDA kernels (kernels/cuda/kernels.cu): same
// members in the same order, checked by size. Shared by the backend and the kernel tests.
#pragma once
#include "runtime/src/cuda/driver.h"

namespace g4::cuda_rt {

struct GemvMatH {
    cu::CUdeviceptr w, absmax, absmax2, offset, code2, bias, y;
    int n, pad;
};
struct GemvArgsH {
    GemvMatH m[3];
    cu::CUdeviceptr x, out, aux;
    int nmat, k, epi;
    float cap;
};
static_assert(sizeof(GemvMatH) == 64 && sizeof(GemvArgsH) == 232, "GemvArgs layout");

// Name of the GEMV kernel for a weight dtype, lanes per row (8/16/32) and gate/up pairing.
inline const char* gemv_kernel_name(bool nf4, int lanes, bool pairs) {
    static const char* names[2][3][2] = {
        {{"g4_gemv_bf16_l8_m1", "g4_gemv_bf16_l8_m2"}, {"g4_gemv_bf16_l16_m1", "g4_gemv_bf16_l16_m2"}, {"g4_gemv_bf16_l32_m1", "g4_gemv_bf16_l32_m2"}},
        {{"g4_gemv_nf4_l8_m1", "g4_gemv_nf4_l8_m2"}, {"g4_gemv_nf4_l16_m1", "g4_gemv_nf4_l16_m2"}, {"g4_gemv_nf4_l32_m1", "g4_gemv_nf4_l32_m2"}}};
    return names[nf4][lanes == 8 ? 0 : lanes == 16 ? 1 : 2][pairs];
}
// Threads (128 per block) a GEMV launch needs for n_out outputs.
inline long gemv_threads(int n_out, int lanes, bool pairs) { return (long)((n_out + (pairs ? 2 : 4) - 1) / (pairs ? 2 : 4)) * lanes; }

} // namespace g4::cuda_rt
