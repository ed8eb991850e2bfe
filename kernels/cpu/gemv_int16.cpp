// The NF4 x int16 GEMV of cpu.h (matmul_nf4_int16; body in gemv_int16_body.h) and, in the avx512 copy, its
// AVX-512 VNNI variant for the avx512_bf16 table (level_table.cpp; dispatch.cpp requires VNNI for that level:
// every CPU with AVX-512 BF16 has it), compiled under a function-level target (GCC's target pragma, which
// also covers the body's lambdas). The integer sums and so the outputs are the same bits; measured in
// docs/performance.md (CPU).
#include "kernels/cpu/level.h"
#include "kernels/cpu/nf4_blob.h"
#include "kernels/cpu/simd.h"
#include "kernels/nf4.h"
#include "kernels/q16.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace g4::cpu::G4_CPU_NS {

namespace int16_plain {
using namespace gemv;
#if defined(__AVX512VNNI__)
#define G4_INT16_VNNI 1
#else
#define G4_INT16_VNNI 0
#endif
#include "kernels/cpu/gemv_int16_body.h"
#undef G4_INT16_VNNI
} // namespace int16_plain

void matmul_nf4_int16(const Context& c, const MatmulArgs& a) {
    int16_plain::run(c, a);
}

#if defined(G4_CPU_VNNI_VARIANT)
#pragma GCC push_options
#pragma GCC target("avx512vnni")
namespace int16_vnni {
using namespace gemv;
#define G4_INT16_VNNI 1
#include "kernels/cpu/gemv_int16_body.h"
#undef G4_INT16_VNNI
} // namespace int16_vnni
#pragma GCC pop_options

void matmul_nf4_int16_vnni(const Context& c, const MatmulArgs& a) {
    int16_vnni::run(c, a);
}
#endif

} // namespace g4::cpu::G4_CPU_NS
