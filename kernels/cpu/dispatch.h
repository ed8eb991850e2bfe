// Which instruction-set copy of the CPU kernels runs (kernels/cpu/level.h). A portable x86-64 build holds a
// baseline x86-64 copy, an x86-64-v3 copy (AVX2, FMA, F16C) and an x86-64-v4 copy (AVX-512 F/BW/DQ/VL/CD),
// the last also with the AVX-512 BF16 GEMM as a fourth level and with the AMX bf16 GEMM as a fifth; an
// aarch64 build holds neon (ARMv8-A, Advanced SIMD) and dotprod (ARMv8.2-A with the dot product
// instructions); a G4_NATIVE build holds one copy, native, tuned for the building machine; other
// architectures hold baseline. The first kernel call picks the best level the CPU and the OS support (x86:
// cpuid, and xgetbv for the AVX, AVX-512 and AMX register state, and for AMX the Linux kernel's grant of the
// tile data state to the process; aarch64: the kernel's HWCAP_ASIMDDP), or the lower one the environment
// variable G4_CPU_LEVEL names (x86: baseline, avx2, avx512, avx512_bf16, amx; aarch64: neon, dotprod).
#pragma once

namespace g4::cpu {

struct Kernels; // kernel_list.h

// Best last within an architecture (the pick takes the last supported one).
enum class Level { Baseline, Avx2, Avx512, Avx512Bf16, Amx, Neon, Dotprod, Native };
constexpr int kLevelCount = 8;

const char* level_name(Level l);
// Built into this binary, and the CPU and the OS can run it.
bool level_supported(Level l);
// That level's kernel table (kernel_list.h), or null where level_supported is false: tests compare levels
// in one process.
const Kernels* level_kernels(Level l);
// The level in use (picked on the first call of this or of any kernel).
Level active_level();
// The supported levels' names, best first, separated by spaces (for --version and reports).
const char* supported_levels();
// Whether the towers' bf16 products run bf16 kernels: encoder programs' Matmul ops naming the bf16 GEMM run
// matmul_gemm_bf16 rather than matmul_gemm, the fp32 GEMM, on the same bf16 weights, and SelfAttention ops
// with bf16 set keep it (else they run the fp32 attention; rt::run_program). By default: on AMX tiles
// (the amx level), and with AVX-512 BF16 on AMD CPUs, whose bf16 dot products do twice the multiply-adds of
// an fp32 FMA a cycle. On Intel CPUs without AMX, vdpbf16ps does as many a cycle as the two FMA ports and the
// bf16 GEMM (which also rounds x and packs k-pairs) ran slower than the fp32 one (docs/performance.md), so
// there, as on CPUs without AVX-512 BF16, the fp32 GEMM runs: faster, and closer to float32.
// G4_CPU_BF16_GEMM=1 asks for the bf16 GEMM wherever matmul_gemm_bf16 has bf16 instructions
// (gemm_has_avx512_bf16()), 0 for the fp32 GEMM everywhere; read once, like G4_CPU_LEVEL.
bool gemm_bf16_preferred();

} // namespace g4::cpu
