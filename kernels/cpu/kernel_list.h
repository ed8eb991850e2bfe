// The CPU kernels of cpu.h as one X-macro list: G4_CPU_KERNELS(X) calls X(return type, name, (parameters),
// (arguments)) once per kernel. The build compiles kernels/cpu once per instruction-set level (level.h); the
// list declares each copy's functions, fills each copy's Kernels table (level_table.cpp) and defines cpu.h's
// functions as calls through the table of the level in use (dispatch.cpp). A kernel added to cpu.h is added
// here too.
#pragma once
#include "kernels/cpu/cpu.h"

#define G4_CPU_KERNELS(X)                                                                                    \
    X(size_t, scratch_floats_per_thread, (int64_t max_k, int64_t max_slots), (max_k, max_slots))             \
    X(void, embed, (const Context& c, const EmbedArgs& a), (c, a))                                           \
    X(void, matmul, (const Context& c, const MatmulArgs& a), (c, a))                                         \
    X(void, matmul_tiled, (const Context& c, const MatmulArgs& a), (c, a))                                   \
    X(void, matmul_nf4_gemv, (const Context& c, const MatmulArgs& a), (c, a))                                \
    X(void, matmul_nf4_int16, (const Context& c, const MatmulArgs& a), (c, a))                               \
    X(void, matmul_nf4_gemm_int16, (const Context& c, const MatmulArgs& a), (c, a))                          \
    X(void, matmul_bf16_gemv, (const Context& c, const MatmulArgs& a), (c, a))                               \
    X(int64_t, matmul_bf16_gemv_where, (const Context& c, const MatmulArgs& a, float threshold),             \
      (c, a, threshold))                                                                                     \
    X(void, lm_screen_build,                                                                                 \
      (const uint16_t* w, int64_t k, int64_t r0, int64_t r1, const LmScreenCopy& out), (w, k, r0, r1, out))  \
    X(LmScreenResult, lm_screen, (const Context& c, const LmScreenArgs& a), (c, a))                          \
    X(size_t, gemm_scratch_floats, (), ())                                                                   \
    X(void, matmul_gemm, (const Context& c, const MatmulArgs& a), (c, a))                                    \
    X(void, gemm_block,                                                                                      \
      (int rows, int cols, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,    \
       int64_t ldc, bool accumulate),                                                                        \
      (rows, cols, k, a, lda, b, ldb, c, ldc, accumulate))                                                   \
    X(void, gemm_block_portable,                                                                             \
      (int rows, int cols, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,    \
       int64_t ldc, bool accumulate),                                                                        \
      (rows, cols, k, a, lda, b, ldb, c, ldc, accumulate))                                                   \
    X(bool, gemm_has_avx512, (), ())                                                                         \
    X(size_t, gemm_bf16_scratch_floats, (), ())                                                              \
    X(void, matmul_gemm_bf16, (const Context& c, const MatmulArgs& a), (c, a))                               \
    X(bool, gemm_bf16_clamps, (const Context& c, const MatmulArgs& a), (c, a))                               \
    X(void, matmul_gemm_bf16_portable, (const Context& c, const MatmulArgs& a), (c, a))                      \
    X(bool, gemm_has_avx512_bf16, (), ())                                                                    \
    X(void, gemm_block_bf16,                                                                                 \
      (int rows, int cols, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,       \
       int64_t panel, float* c, int64_t ldc, bool accumulate),                                               \
      (rows, cols, kp, a, lda, b, ldb, panel, c, ldc, accumulate))                                           \
    X(void, rms_norm, (const Context& c, const RmsNormArgs& a), (c, a))                                      \
    X(void, add, (const Context& c, const BinaryArgs& a), (c, a))                                            \
    X(void, gelu_mul, (const Context& c, const BinaryArgs& a), (c, a))                                       \
    X(void, scale, (const Context& c, const ScaleArgs& a), (c, a))                                           \
    X(void, softcap, (const Context& c, const ScaleArgs& a), (c, a))                                         \
    X(void, rope, (const Context& c, const RopeArgs& a), (c, a))                                             \
    X(void, kv_store, (const Context& c, const KvStoreArgs& a), (c, a))                                      \
    X(void, attention, (const Context& c, const AttentionArgs& a), (c, a))                                   \
    X(size_t, attention_prefill_floats, (const AttentionArgs& a), (a))                                       \
    X(void, attention_prefill, (const Context& c, const AttentionArgs& a), (c, a))                           \
    X(void, clamp, (const Context& c, const ClampArgs& a), (c, a))                                           \
    X(void, add_position_2d, (const Context& c, const AddPosition2DArgs& a), (c, a))                         \
    X(void, rope_2d, (const Context& c, const Rope2DArgs& a), (c, a))                                        \
    X(size_t, self_attention_thread_floats, (int64_t max_rows), (max_rows))                                  \
    X(void, self_attention, (const Context& c, const SelfAttentionArgs& a), (c, a))                          \
    X(void, pool_rows, (const Context& c, const PoolRowsArgs& a), (c, a))                                    \
    X(void, gelu_mul_vec, (const Context& c, const BinaryArgs& a), (c, a))                                   \
    X(size_t, conv2d_scratch_floats, (int32_t f_out, int32_t c_in, int32_t c_out), (f_out, c_in, c_out))     \
    X(void, conv2d_norm_relu, (const Context& c, const Conv2dArgs& a), (c, a))                               \
    X(void, silu, (const Context& c, const UnaryArgs& a), (c, a))                                            \
    X(void, sigmoid_mul, (const Context& c, const BinaryArgs& a), (c, a))                                    \
    X(size_t, causal_conv1d_scratch_floats, (int32_t cols, int32_t k), (cols, k))                            \
    X(void, causal_conv1d, (const Context& c, const CausalConv1dArgs& a), (c, a))                            \
    X(size_t, local_attention_scratch_floats, (int32_t window), (window))                                    \
    X(void, local_attention, (const Context& c, const LocalAttentionArgs& a), (c, a))                        \
    X(size_t, softplus_scale_scratch_floats, (int32_t dim), (dim))                                           \
    X(void, softplus_scale, (const Context& c, const DimScaleArgs& a), (c, a))                               \
    X(void, add_scaled, (const Context& c, const AddScaledArgs& a), (c, a))

namespace g4::cpu {

// One level's entry points.
struct Kernels {
#define G4_CPU_KERNEL_FIELD(ret, name, params, args) ret(*name) params;
    G4_CPU_KERNELS(G4_CPU_KERNEL_FIELD)
#undef G4_CPU_KERNEL_FIELD
};

} // namespace g4::cpu
