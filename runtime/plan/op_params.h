// Typed parameters of every op: one struct per op code and a table that maps its fields onto the PlanOp's
// integer (ip) and float (fp) slots. params<P>(op) reads them, set_params(op, p) writes them (and the op
// code); nothing else touches PlanOp::ip / fp. The same tables feed the schema hash (schema.cpp), so moving a
// parameter to another slot changes the hash.
#pragma once
#include "runtime/plan/plan_format.h"

#include <array>
#include <cstdint>
#include <string>
#include <tuple>

namespace g4::plan {

// One parameter: its name, the member it is in the struct, and its slot in PlanOp::ip (int) or fp (float).
template <class P> struct ParamField {
    const char* name;
    int32_t P::*i = nullptr;
    float P::*f   = nullptr;
    uint8_t slot  = 0;
};
template <class P> constexpr ParamField<P> int_param(const char* n, int32_t P::*m, uint8_t s) {
    return {n, m, nullptr, s};
}
template <class P> constexpr ParamField<P> float_param(const char* n, float P::*m, uint8_t s) {
    return {n, nullptr, m, s};
}

// Specialised for each parameter struct: code, operands (documentation and schema), fields.
template <class P> struct OpTable;

struct EmbedParams {
    float scale = 1.0f; // y = table[id] * scale
};
template <> struct OpTable<EmbedParams> {
    static constexpr OpCode code       = OpCode::Embed;
    static constexpr const char* inout = "in:ids,table";
    static constexpr std::array fields = {float_param("scale", &EmbedParams::scale, 0)};
};

struct MatmulParams {
    int32_t decode_variant  = 0; // MatmulVariant for steps of one row (CUDA plans)
    int32_t prefill_variant = 0; // MatmulVariant for prefill chunks (CUDA plans)
    int32_t cpu_kernel      = 0; // encoder programs: 1 the fp32 GEMM, 2 the bf16 GEMM (text program: 0)
};
template <> struct OpTable<MatmulParams> {
    static constexpr OpCode code       = OpCode::Matmul;
    static constexpr const char* inout = "in:x,w,bias?";
    static constexpr std::array fields = {int_param("decode_variant", &MatmulParams::decode_variant, 5),
                                          int_param("prefill_variant", &MatmulParams::prefill_variant, 6),
                                          int_param("cpu_kernel", &MatmulParams::cpu_kernel, 4)};
};

struct RmsNormParams {
    int32_t cols = 0; // row width
    int32_t dim  = 0; // normalised group width (cols a multiple of it)
    float eps    = 0;
};
template <> struct OpTable<RmsNormParams> {
    static constexpr OpCode code       = OpCode::RmsNorm;
    static constexpr const char* inout = "in:x,w?";
    static constexpr std::array fields = {int_param("cols", &RmsNormParams::cols, 0),
                                          int_param("dim", &RmsNormParams::dim, 1),
                                          float_param("eps", &RmsNormParams::eps, 0)};
};

struct AddParams {
    int32_t cols = 0;
};
template <> struct OpTable<AddParams> {
    static constexpr OpCode code       = OpCode::Add;
    static constexpr const char* inout = "in:a,b";
    static constexpr std::array fields = {int_param("cols", &AddParams::cols, 0)};
};

struct ScaleParams {
    int32_t cols = 0;
    float scale  = 1.0f; // times the scalar tensor in[1] when present
};
template <> struct OpTable<ScaleParams> {
    static constexpr OpCode code       = OpCode::Scale;
    static constexpr const char* inout = "in:x,s?";
    static constexpr std::array fields = {int_param("cols", &ScaleParams::cols, 0),
                                          float_param("scale", &ScaleParams::scale, 0)};
};

struct RopeParams {
    int32_t heads = 0;
    int32_t dim   = 0; // head dim (rotated pairs k, k + dim / 2)
};
template <> struct OpTable<RopeParams> {
    static constexpr OpCode code       = OpCode::Rope;
    static constexpr const char* inout = "in:x,inv_freq";
    static constexpr std::array fields = {int_param("heads", &RopeParams::heads, 0),
                                          int_param("dim", &RopeParams::dim, 1)};
};

struct KvStoreParams {
    int32_t width = 0; // kv heads x head dim
    int32_t slots = 0; // cache rows (the ring size of a sliding layer)
};
template <> struct OpTable<KvStoreParams> {
    static constexpr OpCode code       = OpCode::KvStore;
    static constexpr const char* inout = "in:k,v;out:kc,vc";
    static constexpr std::array fields = {int_param("width", &KvStoreParams::width, 0),
                                          int_param("slots", &KvStoreParams::slots, 1)};
};

struct AttentionParams {
    int32_t heads = 0, kv_heads = 0, dim = 0;
    int32_t slots          = 0; // cache rows
    int32_t window         = 0; // sliding window, 0 = none
    int32_t prefill_splits = 0; // CUDA prefill: key splits, 0 = the flash kernel
    int32_t decode_splits  = 0; // CUDA decode: key splits
    float scale            = 1.0f;
};
template <> struct OpTable<AttentionParams> {
    static constexpr OpCode code       = OpCode::Attention;
    static constexpr const char* inout = "in:q,kc,vc";
    static constexpr std::array fields = {int_param("heads", &AttentionParams::heads, 0),
                                          int_param("kv_heads", &AttentionParams::kv_heads, 1),
                                          int_param("dim", &AttentionParams::dim, 2),
                                          int_param("slots", &AttentionParams::slots, 3),
                                          int_param("window", &AttentionParams::window, 4),
                                          int_param("prefill_splits", &AttentionParams::prefill_splits, 5),
                                          int_param("decode_splits", &AttentionParams::decode_splits, 6),
                                          float_param("scale", &AttentionParams::scale, 0)};
};

struct GeluMulParams {
    int32_t cols = 0;
};
template <> struct OpTable<GeluMulParams> {
    static constexpr OpCode code       = OpCode::GeluMul;
    static constexpr const char* inout = "in:a,b";
    static constexpr std::array fields = {int_param("cols", &GeluMulParams::cols, 0)};
};

struct SoftcapParams {
    int32_t cols = 0;
    float cap    = 0;
};
template <> struct OpTable<SoftcapParams> {
    static constexpr OpCode code       = OpCode::Softcap;
    static constexpr const char* inout = "in:x";
    static constexpr std::array fields = {int_param("cols", &SoftcapParams::cols, 0),
                                          float_param("cap", &SoftcapParams::cap, 0)};
};

struct CopyParams {
    int32_t cols       = 0;
    int32_t dst_device = 0;  // CUDA index, -1 = host
    int32_t src_device = -1; // CUDA index, -1 = host
};
template <> struct OpTable<CopyParams> {
    static constexpr OpCode code       = OpCode::Copy;
    static constexpr const char* inout = "in:x;out:x";
    static constexpr std::array fields = {int_param("cols", &CopyParams::cols, 0),
                                          int_param("dst_device", &CopyParams::dst_device, 1),
                                          int_param("src_device", &CopyParams::src_device, 2)};
};

// Encoder-program ops (12-16): their rows are a row count of the program's run (row_mode kRowCountBase + k).
struct ClampParams {
    int32_t cols = 0;
    float lo = 0, hi = 0; // y = min(max(x, lo), hi)
};
template <> struct OpTable<ClampParams> {
    static constexpr OpCode code       = OpCode::Clamp;
    static constexpr const char* inout = "in:x";
    static constexpr std::array fields = {int_param("cols", &ClampParams::cols, 0),
                                          float_param("lo", &ClampParams::lo, 0),
                                          float_param("hi", &ClampParams::hi, 1)};
};

struct AddPosition2DParams {
    int32_t cols = 0;
};
template <> struct OpTable<AddPosition2DParams> {
    static constexpr OpCode code       = OpCode::AddPosition2D;
    static constexpr const char* inout = "in:x,table,pos";
    static constexpr std::array fields = {int_param("cols", &AddPosition2DParams::cols, 0)};
};

struct Rope2DParams {
    int32_t heads = 0, dim = 0;
};
template <> struct OpTable<Rope2DParams> {
    static constexpr OpCode code       = OpCode::Rope2D;
    static constexpr const char* inout = "in:x,inv_freq,pos";
    static constexpr std::array fields = {int_param("heads", &Rope2DParams::heads, 0),
                                          int_param("dim", &Rope2DParams::dim, 1)};
};

struct SelfAttentionParams {
    int32_t heads = 0, kv_heads = 0, dim = 0;
    float scale = 1.0f;
};
template <> struct OpTable<SelfAttentionParams> {
    static constexpr OpCode code       = OpCode::SelfAttention;
    static constexpr const char* inout = "in:q,k,v;out:y,work";
    static constexpr std::array fields = {int_param("heads", &SelfAttentionParams::heads, 0),
                                          int_param("kv_heads", &SelfAttentionParams::kv_heads, 1),
                                          int_param("dim", &SelfAttentionParams::dim, 2),
                                          float_param("scale", &SelfAttentionParams::scale, 0)};
};

struct PoolRowsParams {
    int32_t cols = 0, taps = 0;
    int32_t src_count = 0;    // the row count x's rows are of
    float weight      = 1.0f; // y[c] = weight * sum of the taps
};
template <> struct OpTable<PoolRowsParams> {
    static constexpr OpCode code       = OpCode::PoolRows;
    static constexpr const char* inout = "in:x,index";
    static constexpr std::array fields = {int_param("cols", &PoolRowsParams::cols, 0),
                                          int_param("taps", &PoolRowsParams::taps, 1),
                                          int_param("src_count", &PoolRowsParams::src_count, 2),
                                          float_param("weight", &PoolRowsParams::weight, 0)};
};

// Ops over frame sequences (20-26), in encoder programs as the encoder ops: rows are a row count of the run.
struct Conv2dNormReluParams {
    int32_t f_in = 0, c_in = 0;   // input frequency rows and channels: [rows, f_in * c_in]
    int32_t f_out = 0, c_out = 0; // output: [rows, f_out * c_out], f_out = ceil(f_in / 2)
    int32_t src_count = 0;        // the row count the input's rows are of
    float eps         = 0;        // the LayerNorm's over channels
};
template <> struct OpTable<Conv2dNormReluParams> {
    static constexpr OpCode code       = OpCode::Conv2dNormRelu;
    static constexpr const char* inout = "in:x,w,norm";
    static constexpr std::array fields = {int_param("f_in", &Conv2dNormReluParams::f_in, 0),
                                          int_param("c_in", &Conv2dNormReluParams::c_in, 1),
                                          int_param("f_out", &Conv2dNormReluParams::f_out, 2),
                                          int_param("c_out", &Conv2dNormReluParams::c_out, 3),
                                          int_param("src_count", &Conv2dNormReluParams::src_count, 4),
                                          float_param("eps", &Conv2dNormReluParams::eps, 0)};
};

struct SiluParams {
    int32_t cols = 0;
};
template <> struct OpTable<SiluParams> {
    static constexpr OpCode code       = OpCode::Silu;
    static constexpr const char* inout = "in:x";
    static constexpr std::array fields = {int_param("cols", &SiluParams::cols, 0)};
};

struct SigmoidMulParams {
    int32_t cols = 0;
};
template <> struct OpTable<SigmoidMulParams> {
    static constexpr OpCode code       = OpCode::SigmoidMul;
    static constexpr const char* inout = "in:a,b";
    static constexpr std::array fields = {int_param("cols", &SigmoidMulParams::cols, 0)};
};

struct CausalConv1dParams {
    int32_t cols = 0, k = 0; // channels, kernel taps
};
template <> struct OpTable<CausalConv1dParams> {
    static constexpr OpCode code       = OpCode::CausalConv1d;
    static constexpr const char* inout = "in:x,w";
    static constexpr std::array fields = {int_param("cols", &CausalConv1dParams::cols, 0),
                                          int_param("k", &CausalConv1dParams::k, 1)};
};

struct LocalAttentionParams {
    int32_t heads = 0, dim = 0;
    int32_t window = 0; // keys a query sees (itself and the window - 1 before it)
    int32_t n_rel  = 0; // rows of the relative-position keys
    float cap      = 0; // logit soft cap
};
template <> struct OpTable<LocalAttentionParams> {
    static constexpr OpCode code       = OpCode::LocalAttention;
    static constexpr const char* inout = "in:q,k,v,rel";
    static constexpr std::array fields = {int_param("heads", &LocalAttentionParams::heads, 0),
                                          int_param("dim", &LocalAttentionParams::dim, 1),
                                          int_param("window", &LocalAttentionParams::window, 2),
                                          int_param("n_rel", &LocalAttentionParams::n_rel, 3),
                                          float_param("cap", &LocalAttentionParams::cap, 0)};
};

struct SoftplusScaleParams {
    int32_t cols = 0, dim = 0; // the scale's length (cols a multiple of it)
    float scale = 1.0f;
};
template <> struct OpTable<SoftplusScaleParams> {
    static constexpr OpCode code       = OpCode::SoftplusScale;
    static constexpr const char* inout = "in:x,w";
    static constexpr std::array fields = {int_param("cols", &SoftplusScaleParams::cols, 0),
                                          int_param("dim", &SoftplusScaleParams::dim, 1),
                                          float_param("scale", &SoftplusScaleParams::scale, 0)};
};

struct AddScaledParams {
    int32_t cols = 0;
    float scale  = 1.0f; // y = a + scale * b
};
template <> struct OpTable<AddScaledParams> {
    static constexpr OpCode code       = OpCode::AddScaled;
    static constexpr const char* inout = "in:a,b";
    static constexpr std::array fields = {int_param("cols", &AddScaledParams::cols, 0),
                                          float_param("scale", &AddScaledParams::scale, 0)};
};

// Every op's parameter struct, in op-code order (the schema hash and docs walk it).
using AllOpParams =
    std::tuple<EmbedParams, MatmulParams, RmsNormParams, AddParams, ScaleParams, RopeParams, KvStoreParams,
               AttentionParams, GeluMulParams, SoftcapParams, CopyParams, ClampParams, AddPosition2DParams,
               Rope2DParams, SelfAttentionParams, PoolRowsParams, Conv2dNormReluParams, SiluParams,
               SigmoidMulParams, CausalConv1dParams, LocalAttentionParams, SoftplusScaleParams,
               AddScaledParams>;

// The row of docs/plan-format.md's op table for P: "| `attention` (8) | in:q,kc,vc | `heads` ip0, ... |".
std::string op_doc_row(const char* op_name_text, int code, const char* inout, const std::string& fields);
template <class P> std::string op_doc_row(const char* op_name_text) {
    std::string f;
    for (const auto& d : OpTable<P>::fields)
        f += std::string(f.empty() ? "" : ", ") + "`" + d.name + "` " + (d.i ? "ip" : "fp") +
             std::to_string(d.slot);
    return op_doc_row(op_name_text, (int)OpTable<P>::code, OpTable<P>::inout, f);
}

// op's parameters as P (the caller has checked op.code == OpTable<P>::code).
template <class P> P params(const PlanOp& op) {
    P p;
    for (const auto& f : OpTable<P>::fields) {
        if (f.i) p.*f.i = op.ip[f.slot];
        if (f.f) p.*f.f = op.fp[f.slot];
    }
    return p;
}

// Writes p's fields into op's slots and sets op.code.
template <class P> void set_params(PlanOp& op, const P& p) {
    op.code = (uint16_t)OpTable<P>::code;
    for (const auto& f : OpTable<P>::fields) {
        if (f.i) op.ip[f.slot] = p.*f.i;
        if (f.f) op.fp[f.slot] = p.*f.f;
    }
}

} // namespace g4::plan
