// Included by the sources compiled once per instruction-set level (kernels/CMakeLists.txt): the build sets
// G4_CPU_NS to the level's name (baseline, avx2, avx512; neon, dotprod; native with G4_NATIVE) and its
// compiler flags, and the sources define their kernels in namespace g4::cpu::G4_CPU_NS. level_table.cpp
// exports the copy's Kernels table as the C symbol g4cpu_kernels_<level> (not g4_*, the names libg4.so
// exports), the one symbol the build leaves global in the copy's object (every other one, Eigen's and the
// standard library's instantiations included, is made local, so code compiled for one level never runs in
// place of another's).
#pragma once
#include "kernels/cpu/kernel_list.h"

#ifndef G4_CPU_NS
#error "kernels/cpu level sources are compiled through kernels/CMakeLists.txt, which sets G4_CPU_NS"
#endif

#define G4_CPU_CAT2(a, b) a##b
#define G4_CPU_CAT(a, b) G4_CPU_CAT2(a, b)
#define G4_CPU_ENTRY G4_CPU_CAT(g4cpu_kernels_, G4_CPU_NS)

// The avx512 copy also holds the AVX-512 BF16 GEMM (a function-level target: the copy runs on AVX-512 CPUs
// without BF16) and exports a second table that uses it, g4cpu_kernels_<level>_bf16.
#if defined(G4_CPU_BF16_VARIANT) && defined(__AVX512BW__) && !defined(__AVX512BF16__)
#define G4_CPU_BF16_TABLE 1
#endif
// That table also takes the NF4 x int16 GEMV with AVX-512 VNNI (vpdpwssd; gemv_int16.cpp), under GCC's
// target pragma.
#if defined(G4_CPU_BF16_TABLE) && defined(__GNUC__) && !defined(__clang__) && !defined(__AVX512VNNI__)
#define G4_CPU_VNNI_VARIANT 1
#endif

// And, where the compiler has AMX (G4_CPU_AMX_VARIANT, kernels/CMakeLists.txt), the AMX bf16 GEMM
// (gemm_bf16_amx.cpp, a function-level target) in a third table, g4cpu_kernels_<level>_amx: the BF16 table
// with matmul_gemm_bf16 and the NF4 prefill matmuls (gemm_nf4_amx.cpp) on AMX tiles.
#if defined(G4_CPU_BF16_TABLE) && defined(G4_CPU_AMX_VARIANT)
#define G4_CPU_AMX_TABLE 1
#endif

namespace g4::cpu::G4_CPU_NS {
// Scratch floats one AMX GEMM task uses: kGemmBf16AmxGroup panels of kGemmKc/2 x kGemmNr pairs, 32 rows of
// x as kGemmKc/2 + 16 pairs, a 32 x kGemmNr block of y, 64-byte alignment (a smaller scratch, as plans
// compiled before the group grew have, packs fewer panels a task).
constexpr size_t kGemmBf16AmxFixedFloats = 32 * (kGemmKc / 2 + 16) + 32 * kGemmNr + 16;
constexpr size_t kGemmBf16AmxScratchFloats =
    (size_t)kGemmBf16AmxGroup * (kGemmKc / 2) * kGemmNr + kGemmBf16AmxFixedFloats;
// Panels an AMX GEMM task packs with `stride` scratch floats a thread: kGemmBf16AmxGroup, fewer in a smaller
// scratch, 0 where not even one fits.
constexpr int gemm_bf16_amx_group(size_t stride) {
    if (stride < kGemmBf16AmxFixedFloats) return 0;
    const size_t panels = (stride - kGemmBf16AmxFixedFloats) / ((size_t)(kGemmKc / 2) * kGemmNr);
    return (int)(panels < (size_t)kGemmBf16AmxGroup ? panels : (size_t)kGemmBf16AmxGroup);
}
#define G4_CPU_KERNEL_DECL(ret, name, params, args) ret name params;
G4_CPU_KERNELS(G4_CPU_KERNEL_DECL)
#undef G4_CPU_KERNEL_DECL
#if defined(G4_CPU_BF16_TABLE)
void matmul_gemm_bf16_dpbf16(const Context& c, const MatmulArgs& a);
void gemm_block_bf16_dpbf16(int rows, int cols, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b,
                            int64_t ldb, int64_t panel, float* c, int64_t ldc, bool accumulate);
void self_attention_dpbf16(const Context& c, const SelfAttentionArgs& a);
#endif
#if defined(G4_CPU_AMX_TABLE)
// Whether matmul_gemm_bf16_amx runs a call on AMX tiles (else it is matmul_gemm_bf16_dpbf16), and the AMX
// table's gemm_bf16_clamps: the tiles or that fallback apply the clamps (both in gemm_bf16.cpp).
bool gemm_bf16_amx_tiles(const Context& c, const MatmulArgs& a);
bool gemm_bf16_clamps_amx(const Context& c, const MatmulArgs& a);
void matmul_gemm_bf16_amx(const Context& c, const MatmulArgs& a);
void gemm_block_bf16_amx(int rows, int cols, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b,
                         int64_t ldb, int64_t panel, float* c, int64_t ldc, bool accumulate);
void self_attention_amx(const Context& c, const SelfAttentionArgs& a);
// NF4 prefill chunks on AMX tiles (gemm_nf4_amx.cpp), and the table's matmul that sends them there.
void matmul_nf4_gemm_amx(const Context& c, const MatmulArgs& a);
void matmul_amx(const Context& c, const MatmulArgs& a);
#endif
#if defined(G4_CPU_VNNI_VARIANT)
void matmul_nf4_int16_vnni(const Context& c, const MatmulArgs& a);
void matmul_vnni(const Context& c, const MatmulArgs& a);                // matmul with matmul_nf4_int16_vnni
LmScreenResult lm_screen_vnni(const Context& c, const LmScreenArgs& a); // vpdpbusd
#endif
// y[i] = f32_to_bf16(x[i]) for i < n (gemm_bf16.cpp; vectorised with AVX-512 BW).
void round_to_bf16(const float* x, int64_t n, uint16_t* y);
} // namespace g4::cpu::G4_CPU_NS
