// The Kernels table of one instruction-set copy of the CPU kernels (see level.h), read by dispatch.cpp.
#include "kernels/cpu/level.h"

namespace g4::cpu::G4_CPU_NS {
namespace {

#define G4_CPU_KERNEL_ADDR(ret, name, params, args) &name,
constexpr Kernels kTable = {G4_CPU_KERNELS(G4_CPU_KERNEL_ADDR)};
#undef G4_CPU_KERNEL_ADDR

#if defined(G4_CPU_BF16_TABLE)
constexpr Kernels with_dpbf16() {
    Kernels k              = kTable;
    k.matmul_gemm_bf16     = &matmul_gemm_bf16_dpbf16;
    k.gemm_block_bf16      = &gemm_block_bf16_dpbf16;
    k.self_attention       = &self_attention_dpbf16;
    k.gemm_has_avx512_bf16 = [] { return true; };
#if defined(G4_CPU_VNNI_VARIANT)
    k.matmul_nf4_int16 = &matmul_nf4_int16_vnni;
    k.matmul           = &matmul_vnni;
    k.lm_screen        = &lm_screen_vnni;
#endif
    return k;
}
constexpr Kernels kTableBf16 = with_dpbf16();
#endif

#if defined(G4_CPU_AMX_TABLE)
constexpr Kernels with_amx() {
    Kernels k          = kTableBf16;
    k.matmul_gemm_bf16 = &matmul_gemm_bf16_amx;
    k.gemm_bf16_clamps = &gemm_bf16_clamps_amx;
    k.gemm_block_bf16  = &gemm_block_bf16_amx;
    k.self_attention   = &self_attention_amx;
    k.matmul           = &matmul_amx;
    return k;
}
constexpr Kernels kTableAmx = with_amx();
#endif

} // namespace
} // namespace g4::cpu::G4_CPU_NS

extern "C" const g4::cpu::Kernels* G4_CPU_ENTRY() {
    return &g4::cpu::G4_CPU_NS::kTable;
}

#if defined(G4_CPU_BF16_TABLE)
extern "C" const g4::cpu::Kernels* G4_CPU_CAT(G4_CPU_ENTRY, _bf16)() {
    return &g4::cpu::G4_CPU_NS::kTableBf16;
}
#endif

#if defined(G4_CPU_AMX_TABLE)
extern "C" const g4::cpu::Kernels* G4_CPU_CAT(G4_CPU_ENTRY, _amx)() {
    return &g4::cpu::G4_CPU_NS::kTableAmx;
}
#endif
