// Op vocabulary of g4: the op enum, weight dtypes, and one argument struct per op shared by the
// scalar reference (kernels/ref), the Eigen CPU kernels (kernels/cpu) and, later, CUDA kernels.
// Shapes use the legend T = rows (tokens in the step), H = hidden, D = head dim, V = vocab.
// Every activation is row-major float32 with an explicit leading dimension (ld, in elements). KV
// caches are F32 or BF16 (rounded to nearest even when stored, widened to float32 when read).
#pragma once
#include <cstddef>
#include <cstdint>

namespace g4 {

// Storage types of tensors in a plan. Values are part of the plan format: append only.
enum class DType : uint8_t { F32 = 0, BF16 = 1, F16 = 2, I32 = 3, NF4 = 4 };

const char* dtype_str(DType d);
// Bytes for `n` elements (NF4: packed data only, see kernels/nf4.h for its layout).
size_t dtype_bytes(DType d, int64_t n);

// Op codes stored in plans. Values are part of the plan format: append only.
enum class OpCode : uint16_t {
    Embed     = 1,  // y[t,:] = table[ids[t],:] * scale
    Matmul    = 2,  // y[T,N] = x[T,K] . W[N,K]^T
    RmsNorm   = 3,  // per group of D: y = x * (mean(x^2)+eps)^-1/2 * w
    Add       = 4,  // y = a + b
    Scale     = 5,  // y = x * s * (scalar tensor, if any)
    Rope      = 6,  // in place, NeoX rotate-half pairing (k, k + D/2)
    KvStore   = 7,  // write k, v rows into the ring/linear KV cache of one layer
    Attention = 8,  // softmax(q.K^T * scale + mask) . V over the cache, GQA
    GeluMul   = 9,  // y = gelu_tanh(a) * b
    Softcap   = 10, // y = cap * tanh(x / cap)
    Copy      = 11, // cross-device step of a CUDA plan with CPU-placed layers: rows of an activation view
                    // from the GPU to host memory (ip1 = 0) or back (ip1 = 1); ip0 = columns
    // Ops of encoder programs (rows: a program's row counts, plan_format.h PlanProgram).
    Clamp          = 12, // y = min(max(x, lo), hi)
    AddPosition2D  = 13, // y[r] = x[r] + table[0, pos[r].x] + table[1, pos[r].y] (table [2, P, cols])
    Rope2D         = 14, // in place: each head's first half rotated by pos[r].x, second half by pos[r].y
    SelfAttention  = 15, // softmax(q.K^T * scale) . V over the same rows (bidirectional, no cache), GQA
    PoolRows       = 16, // y[c] = w * sum_j x[index[c, j]] (j in order)
    Conv2dNormRelu = 20, // 3x3 stride-2 pad-1 conv over [rows, F, C] (channels last, rows = time), then
                         // LayerNorm over channels (weight, no bias) and ReLU (Conv2dArgs)
    Silu           = 21, // y = x * sigmoid(x)
    SigmoidMul     = 22, // y = a * sigmoid(b) (GLU: a and b two column views of one tensor)
    CausalConv1d   = 23, // depthwise causal conv over rows: y[t,i] = sum_j w[i,j] x[t-K+1+j, i]
    LocalAttention = 24, // softmax over the last W keys of cap*tanh((q.k + q.rel[W-(t-j)]) / cap), . V
    SoftplusScale  = 25, // y[:, i] = x[:, i] * s * softplus(w[i % dim])
    AddScaled      = 26, // y = a + s * b
};
// Each op code's name (g4 inspect --ops, errors, the schema hash), one row per code in code order.
struct OpName {
    OpCode code;
    const char* name;
};
inline constexpr OpName kOpNames[] = {
    {OpCode::Embed, "embed"},
    {OpCode::Matmul, "matmul"},
    {OpCode::RmsNorm, "rms_norm"},
    {OpCode::Add, "add"},
    {OpCode::Scale, "scale"},
    {OpCode::Rope, "rope"},
    {OpCode::KvStore, "kv_store"},
    {OpCode::Attention, "attention"},
    {OpCode::GeluMul, "gelu_mul"},
    {OpCode::Softcap, "softcap"},
    {OpCode::Copy, "copy"},
    {OpCode::Clamp, "clamp"},
    {OpCode::AddPosition2D, "add_position_2d"},
    {OpCode::Rope2D, "rope_2d"},
    {OpCode::SelfAttention, "self_attention"},
    {OpCode::PoolRows, "pool_rows"},
    {OpCode::Conv2dNormRelu, "conv2d_norm_relu"},
    {OpCode::Silu, "silu"},
    {OpCode::SigmoidMul, "sigmoid_mul"},
    {OpCode::CausalConv1d, "causal_conv1d"},
    {OpCode::LocalAttention, "local_attention"},
    {OpCode::SoftplusScale, "softplus_scale"},
    {OpCode::AddScaled, "add_scaled"},
};
// The name of op, "unknown" for a code not in kOpNames.
const char* op_name(OpCode op);

// Per-step values read by every op: rows in this step and the absolute position of row 0.
struct StepState {
    int32_t rows;     // T: tokens in this step (1 for decode)
    int32_t pos0;     // position of row 0
    int32_t out_rows; // rows whose logits are produced (the last out_rows of the step)
};

float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f); // round to nearest even

struct EmbedArgs {
    const int32_t* ids; // [T]
    const void* table;  // [V, N], dtype `dt`
    DType dt;
    int64_t vocab, n;
    float scale;
    float* y; // [T, ldy]
    int64_t ldy;
    int32_t rows;
};

inline constexpr float kNoBound = __builtin_inff(); // an absent clamp bound
// Whether [lo, hi] clamps anything (a bound other than kNoBound).
inline constexpr bool bounded(float lo, float hi) {
    return lo > -kNoBound || hi < kNoBound;
}
// min(max(v, lo), hi), a NaN passing through: the one expression of every CPU clamp (the Clamp op and the
// clamps fused into the GEMMs and the norm), so fused and unfused give the same bits.
inline constexpr float clamp_value(float v, float lo, float hi) {
    const float m = v < lo ? lo : v; // std::max(v, lo)
    return hi < m ? hi : m;          // std::min(m, hi)
}

struct MatmulArgs {
    const float* x; // [T, ldx], first K columns used
    int64_t ldx;
    const void* w; // [N, K] row-major, dtype `dt`
    DType dt;
    int64_t n, k;
    float* y; // [T, ldy], first N columns written
    int64_t ldy;
    int32_t rows;
    bool nf4_double_quant = false; // dt == NF4: w is one kernels/nf4.h blob of N*K elements; true if it
                                   // stores double-quantized absmax (absmax_q/absmax2/offset/code2)
    bool int16_x = false;   // NF4, K a multiple of 64: x quantized to int16 per block of 64 and multiplied by
                            // the codes' int16 values in integers (kernels/q16.h); BF16, 1..8 rows: the CPU's
                            // bf16 GEMV (float32, its own sum order); else ignored
    bool bf16_rows = false; // with int16_x, NF4 and more than q16::kMaxRows rows (prefill chunks): y =
                            // bf16(x) . bf16(W)^T on AMX tiles where the CPU has them (kernels/cpu/
                            // gemm_nf4_amx.cpp), else the int16 GEMM; else ignored
    // Clamps fused into the CPU bf16 GEMMs (cpu::matmul_gemm_bf16 and _portable; every other kernel ignores
    // them): y = min(max(min(max(x, x_lo), x_hi) . W^T, y_lo), y_hi), a NaN passing through, as two Clamp
    // ops around the matmul would give. The defaults clamp nothing.
    float x_lo = -kNoBound, x_hi = kNoBound, y_lo = -kNoBound, y_hi = kNoBound;
};

struct RmsNormArgs {
    const float* x; // [T, ldx] viewed as groups of `dim` columns; `cols` columns per row
    int64_t ldx;
    const void* w; // [dim] weight or nullptr (no scale)
    DType wdt;
    float* y; // [T, ldy] (may alias x)
    int64_t ldy;
    int32_t rows, cols, dim;
    float eps;
    // x clamped to [x_lo, x_hi] first, as a Clamp op before the norm would (a NaN kept): the CPU kernel
    // applies them (the executor fuses such a Clamp into the norm); the reference and CUDA kernels do not.
    float x_lo = -kNoBound, x_hi = kNoBound;
};

struct BinaryArgs { // Add and GeluMul
    const float* a; // [T, lda]
    int64_t lda;
    const float* b; // [T, ldb]
    int64_t ldb;
    float* y; // [T, ldy] (may alias a or b)
    int64_t ldy;
    int32_t rows, cols;
};

struct ScaleArgs {
    const float* x; // [T, ldx]
    int64_t ldx;
    float* y; // [T, ldy] (may alias x)
    int64_t ldy;
    int32_t rows, cols;
    float s;              // multiplier
    const void* s_tensor; // optional scalar weight [1] multiplied in, dtype s_dt
    DType s_dt;
    float cap; // Softcap only
};

struct RopeArgs {
    float* x; // [T, ldx] = heads x D, rotated in place
    int64_t ldx;
    const float* inv_freq; // [D/2]
    int32_t rows, heads, dim;
    int32_t pos0; // position of row 0
};

struct KvStoreArgs {
    const float* k; // [T, ldk] = n_kv x D
    int64_t ldk;
    const float* v; // [T, ldv]
    int64_t ldv;
    void* k_cache;              // [slots, n_kv*D], dtype cache_dt
    void* v_cache;              // [slots, n_kv*D], dtype cache_dt
    int32_t rows, width, slots; // width = n_kv * D
    int32_t pos0;
    DType cache_dt = DType::F32; // F32 or BF16
};

struct AttentionArgs {
    const float* q; // [T, ldq] = heads x D
    int64_t ldq;
    const void* k_cache; // [slots, n_kv*D], dtype cache_dt; position p lives in slot p % slots
    const void* v_cache;
    float* y; // [T, ldy] = heads x D
    int64_t ldy;
    int32_t rows, heads, kv_heads, dim, slots;
    int32_t window; // 0: causal over all positions; else keys p-window+1..p
    int32_t pos0;
    float scale;
    float* scratch;              // >= attention_scratch_floats(...) floats, owned by the caller
    DType cache_dt = DType::F32; // F32 or BF16
};

// ---- encoder program ops ----

struct ClampArgs {
    const float* x; // [T, ldx]
    int64_t ldx;
    float* y; // [T, ldy] (may alias x)
    int64_t ldy;
    int32_t rows, cols;
    float lo, hi;
};

struct AddPosition2DArgs {
    const float* x; // [T, ldx]
    int64_t ldx;
    const void* table; // [2, positions, cols], dtype dt
    DType dt;
    int64_t positions;
    const int32_t* pos; // [T, 2] = (x, y), each in [0, positions)
    float* y;           // [T, ldy] (may alias x)
    int64_t ldy;
    int32_t rows, cols;
};

// Within each head of `dim` channels, channels [0, dim/2) rotate by angle pos[r].x * inv_freq[m] and
// [dim/2, dim) by pos[r].y * inv_freq[m], each half with rotate-half pairing (m, m + dim/4).
struct Rope2DArgs {
    float* x; // [T, ldx] = heads x dim, rotated in place
    int64_t ldx;
    const float* inv_freq; // [dim/4]
    const int32_t* pos;    // [T, 2]
    int32_t rows, heads, dim;
};

// Every row attends to rows 0..T-1 of k, v (no mask). Query head h reads kv head h / (heads / kv_heads).
// Floats of SelfAttentionArgs.work the CPU kernel takes: per kv head, K^T in panels of keys padded to
// kSelfAttentionKeyPad and V.
inline constexpr int64_t kSelfAttentionKeyPad     = 32;
inline constexpr int32_t kSelfAttentionBf16MaxDim = 256; // the bf16 kernel's largest (even) head size
inline int64_t self_attention_work_floats(int64_t rows, int64_t kv_heads, int64_t dim) {
    const int64_t padded = (rows + kSelfAttentionKeyPad - 1) / kSelfAttentionKeyPad * kSelfAttentionKeyPad;
    return kv_heads * (padded + rows) * dim;
}
struct SelfAttentionArgs {
    const float* q; // [T, ldq] = heads x dim
    int64_t ldq;
    const float* k; // [T, ldk] = kv_heads x dim
    int64_t ldk;
    const float* v; // [T, ldv]
    int64_t ldv;
    float* y; // [T, ldy] = heads x dim
    int64_t ldy;
    int32_t rows, heads, kv_heads, dim;
    float scale;
    float* work;       // CPU kernels: self_attention_work_floats(rows, kv_heads, dim) floats; ref: unused
    bool bf16 = false; // CPU kernels: q, k, v and the probabilities rounded to bf16, fp32 sums (ref: fp32)
};

struct PoolRowsArgs {
    const float* x; // [*, ldx]
    int64_t ldx;
    const int32_t* index; // [T, taps] rows of x
    float* y;             // [T, ldy]
    int64_t ldy;
    int32_t rows, cols, taps;
    float w;
};

struct Conv2dArgs { // Conv2dNormRelu
    const float* x; // [in_rows, f_in, c_in]; rows at or past in_rows read as zero
    int32_t in_rows, f_in, c_in;
    const void* w; // [c_out, c_in, 3, 3], dtype wdt (F32/BF16)
    DType wdt;
    const void* norm; // [c_out] LayerNorm weight, dtype ndt
    DType ndt;
    float eps;
    float* y; // [out_rows, f_out, c_out]
    int32_t out_rows, f_out, c_out;
};

struct UnaryArgs {  // Silu
    const float* x; // [T, ldx]
    int64_t ldx;
    float* y; // [T, ldy] (may alias x)
    int64_t ldy;
    int32_t rows, cols;
};

struct AddScaledArgs {
    const float* a; // [T, lda]
    int64_t lda;
    const float* b; // [T, ldb]
    int64_t ldb;
    float* y; // [T, ldy] (may alias a)
    int64_t ldy;
    int32_t rows, cols;
    float s;
};

struct DimScaleArgs { // SoftplusScale
    const float* x;   // [T, ldx]
    int64_t ldx;
    float* y; // [T, ldy] (may alias x)
    int64_t ldy;
    int32_t rows, cols, dim; // cols a multiple of dim
    const void* w;           // [dim], dtype wdt
    DType wdt;
    float s;
};

struct CausalConv1dArgs {
    const float* x; // [T, ldx]; row t reads rows t-k+1 .. t (rows before 0 are zero)
    int64_t ldx;
    const void* w; // [cols, k], dtype wdt
    DType wdt;
    float* y; // [T, ldy] (must not alias x)
    int64_t ldy;
    int32_t rows, cols, k;
};

struct LocalAttentionArgs {
    // Query t sees keys j = max(0, t-window+1) .. t; logit = cap * tanh((q_t.k_j + q_t.rel_p) / cap) with
    // p = window - (t - j) (no rel term when p >= n_rel); softmax over those keys; y_t = sum_j softmax_j v_j.
    const float* q; // [T, ldq] = heads x dim
    int64_t ldq;
    const float* k; // [T, ldk]
    int64_t ldk;
    const float* v; // [T, ldv]
    int64_t ldv;
    const float* rel; // [n_rel, ldr] relative-position keys
    int64_t ldr;
    float* y; // [T, ldy]
    int64_t ldy;
    int32_t rows, heads, dim, window, n_rel;
    float cap;
};

} // namespace g4
