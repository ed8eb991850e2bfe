// Eigen CPU kernels, multi-threaded over the session's ThreadPool. Same argument structs as the
// reference kernels (kernels/ref/ref.h). Nothing here allocates: per-thread scratch comes from
// Context, sized once at session creation with scratch_floats_per_thread(). The build compiles the kernels
// once per instruction-set level and these functions call the copy picked at start-up (dispatch.h).
#pragma once
#include "kernels/cpu/thread_pool.h"
#include "kernels/ops.h"

#include <cstddef>

namespace g4::cpu {

struct Context {
    ThreadPool* pool      = nullptr;
    float* scratch        = nullptr; // pool->size() * scratch_stride floats
    size_t scratch_stride = 0;       // floats per thread
    float* thread_scratch(int thread) const { return scratch + (size_t)thread * scratch_stride; }
};

// The int8 copy of a bf16 LM head [n, k] (lm_screen.cpp): per row r, q[r * k ..] = round(w / scale[r]) with
// scale[r] = max|w_r| / 127, bound[r] >= ||w_r - scale[r] q_r||_2, qnorm[r] >= ||q_r||_2, qsum[r] = sum(q_r).
struct LmScreenCopy {
    int8_t* q;
    float *scale, *bound, *qnorm;
    int32_t* qsum;
};
// One screening pass over the copy for the head input x [k] (+ bias [n], the LoRA bias added after the
// product; may be null): hi[r] >= the logit the head computes for row r (before any softcap), and
// LmScreenResult::max_lo <= the largest of them.
struct LmScreenArgs {
    const float* x;
    const int8_t* q;
    const float *scale, *bound, *qnorm;
    const int32_t* qsum;
    const float* bias;
    int64_t n, k;
    float* hi;           // [n], written
    float* lo = nullptr; // [n], written when set: lo[r] <= the logit of row r (max_lo is their largest)
};
struct LmScreenResult {
    bool screened = false; // false: x is zero or not finite; nothing was written
    float max_lo  = 0;
};

constexpr int kMatmulTileRows    = 32;  // weight rows dequantized per task
constexpr int kNf4GemvMaxRows    = 8;   // NF4 matmuls with at most this many rows skip the fp32 tile
constexpr int kGemmMr            = 12;  // rows of y per register block
constexpr int kGemmNr            = 32;  // columns of y per register block (= weight rows per panel)
constexpr int kGemmKc            = 512; // k per packed panel
constexpr int kGemmBf16Group     = 4;   // kGemmNr-column weight panels packed per task (AVX-512 BF16 path)
constexpr int kGemmBf16AmxGroup  = 16;  // ... on AMX tiles, at most (gemm_bf16_amx.cpp)
constexpr int kSelfAttentionRows = 2 * kGemmMr; // query rows per self_attention task

// Level sources (kernels/cpu/level.h) declare their own copy of the functions below instead.
#ifndef G4_CPU_NS

// Per-thread scratch needed for matmuls with inner dimension <= max_k and attention over <= max_slots.
size_t scratch_floats_per_thread(int64_t max_k, int64_t max_slots);

void embed(const Context& c, const EmbedArgs& a);
void matmul(const Context& c,
            const MatmulArgs& a); // matmul_nf4_int16, _gemm_int16, _bf16_gemv, _nf4_gemv or _tiled
// Any dtype and row count: kMatmulTileRows weight rows widened to fp32 scratch, then an Eigen GEMM.
void matmul_tiled(const Context& c, const MatmulArgs& a);
// NF4, 1 <= rows <= kNf4GemvMaxRows: each output element is one dot product over the packed codes (no
// fp32 weight tile), computed by one thread in an order that depends on neither the thread count nor
// a.rows. With K a multiple of 64 the rows of x are first reordered into thread 0's scratch (rows * K).
void matmul_nf4_gemv(const Context& c, const MatmulArgs& a);
// NF4 with a.int16_x, K a multiple of 64, 1 <= rows <= q16::kMaxRows (kernels/q16.h): x quantized to int16
// per block into thread 0's scratch (rows * K * 2 + rows * K / 16 bytes), integer dot products per block
// (AVX-512 BW or AVX2 pmaddwd, or a plain loop), each output one thread's fp32 sum in a fixed block order.
void matmul_nf4_int16(const Context& c, const MatmulArgs& a);
// NF4 with a.int16_x, K a multiple of 64, more than q16::kMaxRows rows (prefill chunks): the same integer
// arithmetic as matmul_nf4_int16, register-blocked over tiles of rows (kernels/cpu/gemm_nf4.cpp). x's tiles
// take the pool's whole scratch (rows * K * 2.06 bytes; more rows run as further passes); each output is one
// task's fp32 sum over the blocks in k order, independent of the thread count and of a.rows.
void matmul_nf4_gemm_int16(const Context& c, const MatmulArgs& a);
// BF16 with a.int16_x (the fast CPU precision), 1 <= rows <= kNf4GemvMaxRows, any K
// (kernels/cpu/gemv_bf16.cpp): the weights widened in registers, x reordered into thread 0's scratch (rows *
// K), each output one thread's float32 sum in a fixed order; matmul_tiled's Eigen GEMM sums in another order,
// so results differ in the last bits.
void matmul_bf16_gemv(const Context& c, const MatmulArgs& a);
// matmul_bf16_gemv for one row of x (a.rows == 1) over the rows n with a.y[n] >= threshold only (the head's
// rows a screen kept): those get the bits matmul_bf16_gemv writes, every other a.y[n] becomes -infinity.
// Returns the count of rows computed.
int64_t matmul_bf16_gemv_where(const Context& c, const MatmulArgs& a, float threshold);
// LM-head screening (kernels/cpu/lm_screen.cpp): rows [r0, r1) of the int8 copy of the bf16 head w [n, k]
// (one thread; callers split the rows), and one screening pass (needs 2 * k bytes of thread 0's scratch).
void lm_screen_build(const uint16_t* w, int64_t k, int64_t r0, int64_t r1, const LmScreenCopy& out);
LmScreenResult lm_screen(const Context& c, const LmScreenArgs& a);

// Many-row matmuls (the vision and audio towers): y = x . W^T for F32/BF16 weights through packed
// kGemmKc x kGemmNr weight panels (gemm_scratch_floats() per thread) and an AVX-512 register-blocked kernel;
// other dtypes, or a Context with less scratch, go to matmul. Each output is one fp32 sum in k order,
// independent of the thread count. Without AVX-512 it is matmul.
size_t gemm_scratch_floats();
void matmul_gemm(const Context& c, const MatmulArgs& a);
// Single-threaded strided block on the calling thread: c[rows, cols] (+)= a[rows, k] . b[k, cols] with
// a[i * lda + p], b[p * ldb + j], c[i * ldc + j] (accumulate: add to c instead of overwriting it).
void gemm_block(int rows, int cols, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                float* c, int64_t ldc, bool accumulate);
// What gemm_block is in a build without AVX-512 (Eigen), compiled everywhere so tests cover it.
void gemm_block_portable(int rows, int cols, int64_t k, const float* a, int64_t lda, const float* b,
                         int64_t ldb, float* c, int64_t ldc, bool accumulate);
// True when matmul_gemm / gemm_block use the AVX-512 kernel (else they are matmul / gemm_block_portable).
bool gemm_has_avx512();
// bf16 GEMM (the towers' opt-in bf16 precision): y = bf16(x) . bf16(W)^T, bf16() rounding to nearest even as
// f32_to_bf16 (BF16 weights as stored, F32 weights rounded), each product exact in fp32, summed in fp32.
// F32/BF16 weights and a Context with gemm_bf16_scratch_floats() per thread (else it is matmul, fp32).
// With AVX-512 BF16 (_mm512_dpbf16_ps, which flushes bf16 denormals to zero) the sum order is pairs of k
// in increasing order; with AMX (the amx level: tdpbf16ps, which flushes them too) the tiles' order, within
// ~1e-6 of it; otherwise it is matmul_gemm_bf16_portable. Independent of the thread count. These and
// matmul_gemm_bf16_portable apply MatmulArgs' clamps (x while rounding it, y on each block as it is written)
// except where they fall back to matmul (weights of another dtype, no rows, too little scratch), which
// ignores them. gemm_bf16_clamps(c, a) says whether matmul_gemm_bf16 applies them, by the very test its
// kernels fall back on: each needs less than gemm_bf16_scratch_floats() (which covers them all), the AMX
// tiles less than the AVX-512 BF16 kernel they fall back to, so with that scratch it holds for F32/BF16
// weights and at least one row at every level.
size_t gemm_bf16_scratch_floats();
void matmul_gemm_bf16(const Context& c, const MatmulArgs& a);
bool gemm_bf16_clamps(const Context& c, const MatmulArgs& a);
// Same definition on any machine: bf16-valued fp32 operands through gemm_block (the AVX-512 fp32 kernel, or
// Eigen without AVX-512). Falls back to matmul where the AVX-512 BF16 kernel does (where gemm_bf16_clamps
// is false at every level but amx).
void matmul_gemm_bf16_portable(const Context& c, const MatmulArgs& a);
bool gemm_has_avx512_bf16(); // true when matmul_gemm_bf16 uses _mm512_dpbf16_ps or AMX tiles
// Single-threaded bf16 block on k-pairs: c[rows, cols] (+)= sum over q < kp of a[i * lda + q] . b(q, j), each
// uint32 a bf16 pair (low half the even k), b(q, j) = b[(j / kGemmNr) * panel + q * ldb + j % kGemmNr];
// products exact in fp32, fp32 sums (_mm512_dpbf16_ps with AVX-512 BF16, else a plain loop).
void gemm_block_bf16(int rows, int cols, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b,
                     int64_t ldb, int64_t panel, float* c, int64_t ldc, bool accumulate);
void rms_norm(const Context& c, const RmsNormArgs& a);
void add(const Context& c, const BinaryArgs& a);
void gelu_mul(const Context& c, const BinaryArgs& a);
void scale(const Context& c, const ScaleArgs& a);
void softcap(const Context& c, const ScaleArgs& a);
void rope(const Context& c, const RopeArgs& a);
void kv_store(const Context& c, const KvStoreArgs& a);
void attention(const Context& c, const AttentionArgs& a); // ignores a.scratch; uses Context scratch
// The same attention for many query rows (`--cpu-precision fast` prefill; kernels/cpu/attention_prefill.cpp):
// the query heads of a few rows sharing a kv head take each block of keys together (Eigen products, online
// softmax). Needs attention_prefill_floats(a) of Context scratch per thread, else it is attention(). Each
// output is one task's result, independent of the thread count.
size_t attention_prefill_floats(const AttentionArgs& a);
void attention_prefill(const Context& c, const AttentionArgs& a);

// Encoder-program ops (kernels/cpu/encoder_ops.cpp).
void clamp(const Context& c, const ClampArgs& a);
void add_position_2d(const Context& c, const AddPosition2DArgs& a);
void rope_2d(const Context& c, const Rope2DArgs& a);
// K^T of each kv head packed into a.work in panels of kGemmNr keys, then query blocks of
// kSelfAttentionRows rows of one head per task: scores [rows, keys rounded up to kGemmNr] in the thread's
// scratch (self_attention_thread_floats), both products through gemm_block; with a.bf16 K and V are packed
// as bf16 k-pairs, q and the unnormalised probabilities rounded to bf16 and both products run through
// gemm_block_bf16 (fp32 softmax and sums; a.dim even, at most kSelfAttentionBf16MaxDim). Only where
// gemm_has_avx512_bf16(): elsewhere a.bf16 runs the fp32 kernel (faster there, and closer to fp32).
size_t self_attention_thread_floats(int64_t max_rows);
void self_attention(const Context& c, const SelfAttentionArgs& a);
void pool_rows(const Context& c, const PoolRowsArgs& a);
// y = gelu_tanh(a) * b with Eigen's vectorised tanh (the encoder MLPs; GeluMul ops of encoder programs).
void gelu_mul_vec(const Context& c, const BinaryArgs& a);
// Ops over frame sequences (kernels/cpu/sequence_ops.cpp). Each output is computed by one thread in an
// order independent of the thread count. The *_scratch_floats functions give the per-thread scratch each
// needs from the Context.
size_t conv2d_scratch_floats(int32_t f_out, int32_t c_in, int32_t c_out);
void conv2d_norm_relu(const Context& c, const Conv2dArgs& a);
void silu(const Context& c, const UnaryArgs& a);
void sigmoid_mul(const Context& c, const BinaryArgs& a);
size_t causal_conv1d_scratch_floats(int32_t cols, int32_t k);
void causal_conv1d(const Context& c, const CausalConv1dArgs& a);
size_t local_attention_scratch_floats(int32_t window);
void local_attention(const Context& c, const LocalAttentionArgs& a);
size_t softplus_scale_scratch_floats(int32_t dim);
void softplus_scale(const Context& c, const DimScaleArgs& a);
void add_scaled(const Context& c, const AddScaledArgs& a);

// The kernel the executor replays each op code with (runtime/src/op_exec.cpp), on the argument struct the
// op's definition builds (runtime/plan/op_params.h OpTable<P>::args). Embed and Matmul are replayed by hand
// (media rows, LoRA bias, kernel choice).
template <OpCode C> struct OpKernel;
#define G4_OP_KERNEL(op, fn)                                                                                 \
    template <> struct OpKernel<OpCode::op> { static constexpr auto run = &fn; }
G4_OP_KERNEL(RmsNorm, rms_norm);
G4_OP_KERNEL(Add, add);
G4_OP_KERNEL(Scale, scale);
G4_OP_KERNEL(Rope, rope);
G4_OP_KERNEL(KvStore, kv_store);
G4_OP_KERNEL(Attention, attention);
G4_OP_KERNEL(GeluMul, gelu_mul);
G4_OP_KERNEL(Softcap, softcap);
G4_OP_KERNEL(Clamp, clamp);
G4_OP_KERNEL(AddPosition2D, add_position_2d);
G4_OP_KERNEL(Rope2D, rope_2d);
G4_OP_KERNEL(SelfAttention, self_attention);
G4_OP_KERNEL(PoolRows, pool_rows);
G4_OP_KERNEL(Conv2dNormRelu, conv2d_norm_relu);
G4_OP_KERNEL(Silu, silu);
G4_OP_KERNEL(SigmoidMul, sigmoid_mul);
G4_OP_KERNEL(CausalConv1d, causal_conv1d);
G4_OP_KERNEL(LocalAttention, local_attention);
G4_OP_KERNEL(SoftplusScale, softplus_scale);
G4_OP_KERNEL(AddScaled, add_scaled);
#undef G4_OP_KERNEL

#endif // G4_CPU_NS

} // namespace g4::cpu
