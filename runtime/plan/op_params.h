// Typed parameters of every op: one struct per op code and a table that maps its fields onto the PlanOp's
// integer (ip) and float (fp) slots. params<P>(op) reads them, set_params(op, p) writes them (and the op
// code); nothing else touches PlanOp::ip / fp. The same tables feed the schema hash (schema.cpp), so moving a
// parameter to another slot changes the hash.
#pragma once
#include "kernels/cpu/cpu.h"
#include "runtime/plan/plan_format.h"

#include <array>
#include <cstdint>
#include <string>
#include <tuple>

namespace g4::plan {

// One parameter: its name, the member it is in the struct, its slot in PlanOp::ip (int) or fp (float), and
// the values a plan may hold: an int in [lo, hi], a float any value or (positive) only > 0. Plan::load
// refuses an op with a parameter outside them before the op's own check runs.
template <class P> struct ParamField {
    const char* name;
    int32_t P::*i = nullptr;
    float P::*f   = nullptr;
    uint8_t slot  = 0;
    int32_t lo = 0, hi = 0;
    bool positive = false;
};
template <class P>
constexpr ParamField<P> int_param(const char* n, int32_t P::*m, uint8_t s, int32_t lo, int32_t hi) {
    return {n, m, nullptr, s, lo, hi, false};
}
template <class P> constexpr ParamField<P> float_param(const char* n, float P::*m, uint8_t s) {
    return {n, nullptr, m, s, 0, 0, false};
}
template <class P> constexpr ParamField<P> positive_param(const char* n, float P::*m, uint8_t s) {
    return {n, nullptr, m, s, 0, 0, true};
}

// Bounds shared by many parameters: a row's columns, a head count or head dim, a row-count index.
inline constexpr int32_t kMaxCols  = 1 << 24;
inline constexpr int32_t kMaxHeads = 4096;
inline constexpr int32_t kMaxDim   = 4096;
inline constexpr int32_t kMaxSlots = 1 << 30;

// The programs an op may appear in: the text program, encoder programs, or both.
enum class OpUse : uint8_t { Text = 1, Encoder = 2, Any = 3 };

// Specialised for each parameter struct, the op's definition:
//   code, inout   its op code and operands (documentation and schema), use: the programs it may be in;
//   fields        its parameters' slots and ranges;
//   check(c, a)   its operands and the relations between its parameters, through the plan checker `c`
//                 (runtime/plan/plan_validate.cpp OpChecker; a defect goes to c.fail);
//   args(b, a)    where the CPU executor replays it generically: the kernels/ops.h argument struct from the
//                 bound operands `b` (runtime/src/op_exec.h OpIo), run by cpu::OpKernel<code>
//                 (kernels/cpu/cpu.h);
//   per_sequence  (only where true) the op reads the step's first position or a session's KV cache, so a
//                 step batching several sessions (runtime/src/batch.cpp) runs it once per session, on that
//                 session's row, position and cache; every other op runs once over all the rows.
template <class P> struct OpTable;

struct EmbedParams {
    float scale = 1.0f; // y = table[id] * scale
};
template <> struct OpTable<EmbedParams> {
    static constexpr OpCode code       = OpCode::Embed;
    static constexpr const char* inout = "in:ids,table";
    static constexpr OpUse use         = OpUse::Text;
    static constexpr std::array fields = {float_param("scale", &EmbedParams::scale, 0)};
    template <class C> static void check(C& c, const EmbedParams&) {
        const PlanOp& op = c.op;
        if (op.in[0] != c.info.ids_tensor)
            return (void)c.fail("reads a tensor other than the plan's ids input");
        if (!c.need(op.in[0], TensorKind::Input, "ids") || !c.dense_weight(op.in[1], "table")) return;
        const PlanTensor& tab = c.p.tensor(op.in[1]);
        if (c.p.tensor(op.in[0]).dims[0] < c.rout)
            c.fail("ids has fewer rows than a step");
        else if (tab.ndim != 2 || tab.dims[0] < c.info.embed_vocab_limit)
            c.fail("table has too few rows for the vocabulary");
        else
            c.out_act(0, tab.dims[1], "output");
    }
};

struct MatmulParams {
    int32_t decode_variant  = 0; // MatmulVariant for steps of one row (CUDA plans)
    int32_t prefill_variant = 0; // MatmulVariant for prefill chunks (CUDA plans)
    int32_t cpu_kernel      = 0; // encoder programs: 1 the fp32 GEMM, 2 the bf16 GEMM (text program: 0)
};
template <> struct OpTable<MatmulParams> {
    static constexpr OpCode code       = OpCode::Matmul;
    static constexpr const char* inout = "in:x,w,bias?";
    static constexpr OpUse use         = OpUse::Any;
    static constexpr std::array fields = {
        int_param("decode_variant", &MatmulParams::decode_variant, 5, 0, (int32_t)MatmulVariant::Gemv4),
        int_param("prefill_variant", &MatmulParams::prefill_variant, 6, 0, (int32_t)MatmulVariant::Cublas),
        int_param("cpu_kernel", &MatmulParams::cpu_kernel, 4, 0, 2)};
    template <class C> static void check(C& c, const MatmulParams& mp) {
        const PlanOp& op = c.op;
        if (!c.matmul_weight(op.in[1], "weight")) return;
        const PlanTensor& w = c.p.tensor(op.in[1]);
        const bool nf4 = w.dtype == (uint8_t)DType::NF4, bf16 = w.dtype == (uint8_t)DType::BF16;
        if (w.ndim != 2 || (c.text && w.dims[1] > c.info.max_k)) // (encoders: their thread_floats)
            c.fail("weight must be 2-D with K <= max_k");
        else if (mp.prefill_variant == (int32_t)MatmulVariant::Gemv4)
            c.fail("bad kernel variant");
        else if ((mp.decode_variant == (int32_t)MatmulVariant::Gemv4 &&
                  !((nf4 && w.dims[1] % 512 == 0) || (bf16 && w.dims[1] % 256 == 0))) ||
                 ((mp.prefill_variant == (int32_t)MatmulVariant::Tiled64 ||
                   mp.prefill_variant == (int32_t)MatmulVariant::TensorCore) &&
                  !(w.dims[1] % 32 == 0 && (nf4 || bf16))))
            c.fail("kernel variant does not fit the weight's shape or dtype");
        else if (op.in[2] >= 0 &&
                 (!c.need(op.in[2], TensorKind::Weight, "bias") ||
                  c.p.tensor(op.in[2]).dtype != (uint8_t)DType::F32 || c.numel(op.in[2]) != w.dims[0]))
            c.fail("bias must be f32 [N]");
        else if (c.text ? c.in_act(0, w.dims[1], "input")
                        : c.src_view(op.in[0], op.in_col[0], w.dims[1], c.rin, "input"))
            c.out_act(0, w.dims[0], "output");
    }
};

struct RmsNormParams {
    int32_t cols = 0; // row width
    int32_t dim  = 0; // normalised group width (cols a multiple of it)
    float eps    = 0;
};
template <> struct OpTable<RmsNormParams> {
    static constexpr OpCode code       = OpCode::RmsNorm;
    static constexpr const char* inout = "in:x,w?";
    static constexpr OpUse use         = OpUse::Any;
    static constexpr std::array fields = {int_param("cols", &RmsNormParams::cols, 0, 1, kMaxCols),
                                          int_param("dim", &RmsNormParams::dim, 1, 1, kMaxCols),
                                          float_param("eps", &RmsNormParams::eps, 0)};
    template <class C> static void check(C& c, const RmsNormParams& np) {
        if (np.cols % np.dim)
            c.fail("bad cols/dim");
        else if (c.op.in[1] >= 0 && (!c.dense_weight(c.op.in[1], "weight") || c.numel(c.op.in[1]) != np.dim))
            c.fail("weight size != dim");
        else if (c.in_act(0, np.cols, "input"))
            c.out_act(0, np.cols, "output");
    }
    template <class B> static RmsNormArgs args(const B& b, const RmsNormParams& a) {
        return {b.x(0), b.in_ld[0], b.in[1], b.in_dt[1], b.y(0), b.out_ld[0], b.rows, a.cols, a.dim, a.eps};
    }
};

// The checks of the element-wise ops over `cols` columns: inputs a (and b), output.
template <class C> void check_elementwise(C& c, int32_t cols, int inputs) {
    if (c.in_act(0, cols, inputs == 1 ? "input" : "a") && (inputs == 1 || c.in_act(1, cols, "b")))
        c.out_act(0, cols, "output");
}

// Scale and Softcap: an optional scalar weight in[1], input, output.
template <class C> void check_scaled(C& c, int32_t cols) {
    if (c.op.in[1] >= 0 && (!c.dense_weight(c.op.in[1], "scalar") || c.numel(c.op.in[1]) < 1))
        c.fail("bad scalar");
    else
        check_elementwise(c, cols, 1);
}

struct AddParams {
    int32_t cols = 0;
};
template <> struct OpTable<AddParams> {
    static constexpr OpCode code       = OpCode::Add;
    static constexpr const char* inout = "in:a,b";
    static constexpr OpUse use         = OpUse::Any;
    static constexpr std::array fields = {int_param("cols", &AddParams::cols, 0, 1, kMaxCols)};
    template <class C> static void check(C& c, const AddParams& a) { check_elementwise(c, a.cols, 2); }
    template <class B> static BinaryArgs args(const B& b, const AddParams& a) {
        return {b.x(0), b.in_ld[0], b.x(1), b.in_ld[1], b.y(0), b.out_ld[0], b.rows, a.cols};
    }
};

struct ScaleParams {
    int32_t cols = 0;
    float scale  = 1.0f; // times the scalar tensor in[1] when present
};
template <> struct OpTable<ScaleParams> {
    static constexpr OpCode code       = OpCode::Scale;
    static constexpr const char* inout = "in:x,s?";
    static constexpr OpUse use         = OpUse::Any;
    static constexpr std::array fields = {int_param("cols", &ScaleParams::cols, 0, 1, kMaxCols),
                                          float_param("scale", &ScaleParams::scale, 0)};
    template <class C> static void check(C& c, const ScaleParams& a) { check_scaled(c, a.cols); }
    template <class B> static ScaleArgs args(const B& b, const ScaleParams& a) {
        return {b.x(0), b.in_ld[0], b.y(0), b.out_ld[0], b.rows, a.cols, a.scale, b.in[1], b.in_dt[1], 0.0f};
    }
};

struct RopeParams {
    int32_t heads = 0;
    int32_t dim   = 0; // head dim (rotated pairs k, k + dim / 2)
};
template <> struct OpTable<RopeParams> {
    static constexpr bool per_sequence = true;
    static constexpr OpCode code       = OpCode::Rope;
    static constexpr const char* inout = "in:x,inv_freq";
    static constexpr OpUse use         = OpUse::Text;
    static constexpr std::array fields = {int_param("heads", &RopeParams::heads, 0, 1, kMaxHeads),
                                          int_param("dim", &RopeParams::dim, 1, 2, kMaxDim)};
    template <class C> static void check(C& c, const RopeParams& rp) {
        const PlanOp& op = c.op;
        if (rp.dim % 2)
            c.fail("bad heads/dim");
        else if (op.in[0] != op.out[0] || op.in_col[0] != op.out_col[0])
            c.fail("rope must be in place");
        else if (c.need(op.in[1], TensorKind::Weight, "inv_freq") &&
                 (c.p.tensor(op.in[1]).dtype != (uint8_t)DType::F32 || c.numel(op.in[1]) != rp.dim / 2))
            c.fail("inv_freq must be f32 [dim/2]");
        else
            c.in_act(0, (int64_t)rp.heads * rp.dim, "input");
    }
    template <class B> static RopeArgs args(const B& b, const RopeParams& a) {
        return {b.xm(0), b.in_ld[0], b.x(1), b.rows, a.heads, a.dim, b.pos0};
    }
};

struct KvStoreParams {
    int32_t width = 0; // kv heads x head dim
    int32_t slots = 0; // cache rows (the ring size of a sliding layer)
};
template <> struct OpTable<KvStoreParams> {
    static constexpr bool per_sequence = true;
    static constexpr OpCode code       = OpCode::KvStore;
    static constexpr const char* inout = "in:k,v;out:kc,vc";
    static constexpr OpUse use         = OpUse::Text;
    static constexpr std::array fields = {int_param("width", &KvStoreParams::width, 0, 1, kMaxCols),
                                          int_param("slots", &KvStoreParams::slots, 1, 1, kMaxSlots)};
    template <class C> static void check(C& c, const KvStoreParams& kp) {
        const PlanOp& op = c.op;
        if (!(c.in_act(0, kp.width, "k") && c.in_act(1, kp.width, "v") &&
              c.cache_view(op.out[0], op.out_col[0], kp.width, kp.slots, "k cache") &&
              c.cache_view(op.out[1], op.out_col[1], kp.width, kp.slots, "v cache")))
            return;
        if (op.out[0] == op.out[1])
            c.fail("k and v caches are the same tensor");
        else if (c.p.tensor(op.out[0]).dtype != c.p.tensor(op.out[1]).dtype)
            c.fail("k and v caches differ in dtype");
        else if (kp.slots < c.info.max_context && kp.slots < c.info.max_rows)
            c.fail("cache ring smaller than a chunk");
    }
    template <class B> static KvStoreArgs args(const B& b, const KvStoreParams& a) {
        return {b.x(0), b.in_ld[0], b.x(1),  b.in_ld[1], b.out[0],   b.out[1],
                b.rows, a.width,    a.slots, b.pos0,     b.out_dt[0]};
    }
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
    static constexpr bool per_sequence = true;
    static constexpr OpCode code       = OpCode::Attention;
    static constexpr const char* inout = "in:q,kc,vc";
    static constexpr OpUse use         = OpUse::Text;
    static constexpr std::array fields = {
        int_param("heads", &AttentionParams::heads, 0, 1, kMaxHeads),
        int_param("kv_heads", &AttentionParams::kv_heads, 1, 1, kMaxHeads),
        int_param("dim", &AttentionParams::dim, 2, 1, kMaxDim),
        int_param("slots", &AttentionParams::slots, 3, 1, kMaxSlots),
        int_param("window", &AttentionParams::window, 4, 0, kMaxSlots),
        int_param("prefill_splits", &AttentionParams::prefill_splits, 5, 0, 128),
        int_param("decode_splits", &AttentionParams::decode_splits, 6, 0, 1024),
        float_param("scale", &AttentionParams::scale, 0)};
    template <class C> static void check(C& c, const AttentionParams& ap) {
        const PlanOp& op    = c.op;
        const int64_t width = (int64_t)ap.heads * ap.dim, kv_width = (int64_t)ap.kv_heads * ap.dim;
        if (ap.heads % ap.kv_heads || ap.window > c.info.max_slots || ap.slots > c.info.max_slots)
            c.fail("bad attention parameters (heads " + std::to_string(ap.heads) + ", kv heads " +
                   std::to_string(ap.kv_heads) + ", dim " + std::to_string(ap.dim) + ", window " +
                   std::to_string(ap.window) + " of at most " + std::to_string(c.info.max_slots) + ")");
        else if (c.in_act(0, width, "q") &&
                 c.cache_view(op.in[1], op.in_col[1], kv_width, ap.slots, "k cache") &&
                 c.cache_view(op.in[2], op.in_col[2], kv_width, ap.slots, "v cache")) {
            if (c.p.tensor(op.in[1]).dtype != c.p.tensor(op.in[2]).dtype)
                c.fail("k and v caches differ in dtype");
            // Every key a query can see must still be in the cache.
            else if (ap.window == 0
                         ? ap.slots < c.info.max_context
                         : (ap.slots < c.info.max_context && ap.slots < ap.window + c.info.max_rows - 1))
                c.fail("cache too small for the attention span");
            else
                c.out_act(0, width, "output");
        }
    }
    template <class B> static AttentionArgs args(const B& b, const AttentionParams& a) {
        return {b.x(0),     b.in_ld[0], b.in[1], b.in[2],  b.y(0), b.out_ld[0], b.rows,  a.heads,
                a.kv_heads, a.dim,      a.slots, a.window, b.pos0, a.scale,     nullptr, b.in_dt[1]};
    }
};

struct GeluMulParams {
    int32_t cols = 0;
};
template <> struct OpTable<GeluMulParams> {
    static constexpr OpCode code       = OpCode::GeluMul;
    static constexpr const char* inout = "in:a,b";
    static constexpr OpUse use         = OpUse::Any;
    static constexpr std::array fields = {int_param("cols", &GeluMulParams::cols, 0, 1, kMaxCols)};
    template <class C> static void check(C& c, const GeluMulParams& a) { check_elementwise(c, a.cols, 2); }
    template <class B> static BinaryArgs args(const B& b, const GeluMulParams& a) {
        return {b.x(0), b.in_ld[0], b.x(1), b.in_ld[1], b.y(0), b.out_ld[0], b.rows, a.cols};
    }
};

struct SoftcapParams {
    int32_t cols = 0;
    float cap    = 0;
};
template <> struct OpTable<SoftcapParams> {
    static constexpr OpCode code       = OpCode::Softcap;
    static constexpr const char* inout = "in:x";
    static constexpr OpUse use         = OpUse::Text;
    static constexpr std::array fields = {int_param("cols", &SoftcapParams::cols, 0, 1, kMaxCols),
                                          positive_param("cap", &SoftcapParams::cap, 0)};
    template <class C> static void check(C& c, const SoftcapParams& a) { check_scaled(c, a.cols); }
    template <class B> static ScaleArgs args(const B& b, const SoftcapParams& a) {
        return {b.x(0), b.in_ld[0], b.y(0), b.out_ld[0], b.rows, a.cols, 1.0f, nullptr, DType::F32, a.cap};
    }
};

struct CopyParams {
    int32_t cols       = 0;
    int32_t dst_device = 0;  // CUDA index, -1 = host
    int32_t src_device = -1; // CUDA index, -1 = host
};
template <> struct OpTable<CopyParams> {
    static constexpr OpCode code       = OpCode::Copy;
    static constexpr const char* inout = "in:x;out:x";
    static constexpr OpUse use         = OpUse::Text;
    static constexpr std::array fields = {int_param("cols", &CopyParams::cols, 0, 1, kMaxCols),
                                          int_param("dst_device", &CopyParams::dst_device, 1, -1, 1023),
                                          int_param("src_device", &CopyParams::src_device, 2, -1, 1023)};
    template <class C> static void check(C& c, const CopyParams& cp) {
        const PlanOp& op = c.op;
        auto device_ok   = [&](int32_t d) { return d == -1 || c.p.gpu_slot(d) >= 0; };
        if (!c.p.hybrid())
            c.fail("copy steps belong to CUDA plans whose layers span devices");
        else if (op.in[0] != op.out[0] || op.in_col[0] != op.out_col[0] || !device_ok(cp.dst_device) ||
                 !device_ok(cp.src_device) || cp.dst_device == cp.src_device ||
                 op.row_mode != (int32_t)RowMode::All)
            c.fail("bad copy step");
        else
            c.act_view(op.in[0], op.in_col[0], cp.cols, c.info.max_rows, "tensor");
    }
};

// Encoder-program ops (12-16): their rows are a row count of the program's run (row_mode kRowCountBase + k).
struct ClampParams {
    int32_t cols = 0;
    float lo = 0, hi = 0; // y = min(max(x, lo), hi)
};
template <> struct OpTable<ClampParams> {
    static constexpr OpCode code       = OpCode::Clamp;
    static constexpr const char* inout = "in:x";
    static constexpr OpUse use         = OpUse::Encoder;
    static constexpr std::array fields = {int_param("cols", &ClampParams::cols, 0, 1, kMaxCols),
                                          float_param("lo", &ClampParams::lo, 0),
                                          float_param("hi", &ClampParams::hi, 1)};
    template <class C> static void check(C& c, const ClampParams& cp) {
        if (!(cp.lo <= cp.hi))
            c.fail("bad cols or bounds");
        else
            check_elementwise(c, cp.cols, 1);
    }
    template <class B> static ClampArgs args(const B& b, const ClampParams& a) {
        return {b.x(0), b.in_ld[0], b.y(0), b.out_ld[0], b.rows, a.cols, a.lo, a.hi};
    }
};

struct AddPosition2DParams {
    int32_t cols = 0;
};
template <> struct OpTable<AddPosition2DParams> {
    static constexpr OpCode code       = OpCode::AddPosition2D;
    static constexpr const char* inout = "in:x,table,pos";
    static constexpr OpUse use         = OpUse::Encoder;
    static constexpr std::array fields = {int_param("cols", &AddPosition2DParams::cols, 0, 1, kMaxCols)};
    template <class C> static void check(C& c, const AddPosition2DParams& a) {
        const PlanOp& op = c.op;
        if (!c.dense_weight(op.in[1], "table")) return;
        const PlanTensor& tab = c.p.tensor(op.in[1]);
        if (tab.ndim != 3 || tab.dims[0] != 2 || tab.dims[2] != a.cols)
            c.fail("table must be [2, positions, cols]");
        else if (c.in_act(0, a.cols, "input") && c.input_view(op.in[2], DType::I32, 2, c.rin, "positions"))
            c.out_act(0, a.cols, "output");
    }
    template <class B> static AddPosition2DArgs args(const B& b, const AddPosition2DParams& a) {
        return {b.x(0), b.in_ld[0],  b.in[1], b.in_dt[1], b.in_t[1]->dims[1], (const int32_t*)b.in[2],
                b.y(0), b.out_ld[0], b.rows,  a.cols};
    }
};

struct Rope2DParams {
    int32_t heads = 0, dim = 0;
};
template <> struct OpTable<Rope2DParams> {
    static constexpr OpCode code       = OpCode::Rope2D;
    static constexpr const char* inout = "in:x,inv_freq,pos";
    static constexpr OpUse use         = OpUse::Encoder;
    static constexpr std::array fields = {int_param("heads", &Rope2DParams::heads, 0, 1, kMaxHeads),
                                          int_param("dim", &Rope2DParams::dim, 1, 4, kMaxDim)};
    template <class C> static void check(C& c, const Rope2DParams& rp) {
        const PlanOp& op = c.op;
        if (rp.dim % 4)
            c.fail("bad heads/dim");
        else if (op.in[0] != op.out[0] || op.in_col[0] != op.out_col[0])
            c.fail("rope must be in place");
        else if (c.need(op.in[1], TensorKind::Weight, "inv_freq") &&
                 (c.p.tensor(op.in[1]).dtype != (uint8_t)DType::F32 || c.numel(op.in[1]) != rp.dim / 4))
            c.fail("inv_freq must be f32 [dim/4]");
        else if (c.err.empty() && c.input_view(op.in[2], DType::I32, 2, c.rin, "positions"))
            c.in_act(0, (int64_t)rp.heads * rp.dim, "input");
    }
    template <class B> static Rope2DArgs args(const B& b, const Rope2DParams& a) {
        return {b.xm(0), b.in_ld[0], b.x(1), (const int32_t*)b.in[2], b.rows, a.heads, a.dim};
    }
};

struct SelfAttentionParams {
    int32_t heads = 0, kv_heads = 0, dim = 0;
    int32_t bf16 = 0; // CPU: 1 runs both products with bf16 operands and fp32 sums (--tower-precision bf16)
    float scale  = 1.0f;
};
template <> struct OpTable<SelfAttentionParams> {
    static constexpr OpCode code       = OpCode::SelfAttention;
    static constexpr const char* inout = "in:q,k,v;out:y,work";
    static constexpr OpUse use         = OpUse::Encoder;
    static constexpr std::array fields = {
        int_param("heads", &SelfAttentionParams::heads, 0, 1, kMaxHeads),
        int_param("kv_heads", &SelfAttentionParams::kv_heads, 1, 1, kMaxHeads),
        int_param("dim", &SelfAttentionParams::dim, 2, 1, kMaxDim),
        int_param("bf16", &SelfAttentionParams::bf16, 3, 0, 1),
        float_param("scale", &SelfAttentionParams::scale, 0)};
    template <class C> static void check(C& c, const SelfAttentionParams& ap) {
        const int64_t heads = ap.heads, kvh = ap.kv_heads, dim = ap.dim;
        if (heads % kvh)
            c.fail("bad heads/kv heads/dim");
        else if (ap.bf16 && (dim % 2 || dim > kSelfAttentionBf16MaxDim))
            c.fail("bf16 attention needs an even head size of at most " +
                   std::to_string(kSelfAttentionBf16MaxDim));
        else if (c.in_act(0, heads * dim, "q") && c.in_act(1, kvh * dim, "k") &&
                 c.in_act(2, kvh * dim, "v") && c.out_act(0, heads * dim, "output") &&
                 c.need(c.op.out[1], TensorKind::Activation, "work") &&
                 c.numel(c.op.out[1]) < self_attention_work_floats(c.rin, kvh, dim))
            c.fail("work tensor " + c.tname(c.op.out[1]) + " too small");
    }
    template <class B> static SelfAttentionArgs args(const B& b, const SelfAttentionParams& a) {
        return {b.x(0), b.in_ld[0], b.x(1),     b.in_ld[1], b.x(2),  b.in_ld[2], b.y(0),     b.out_ld[0],
                b.rows, a.heads,    a.kv_heads, a.dim,      a.scale, b.y(1),     a.bf16 != 0};
    }
};

struct PoolRowsParams {
    int32_t cols = 0, taps = 0;
    int32_t src_count = 0;    // the row count x's rows are of
    float weight      = 1.0f; // y[c] = weight * sum of the taps
};
template <> struct OpTable<PoolRowsParams> {
    static constexpr OpCode code       = OpCode::PoolRows;
    static constexpr const char* inout = "in:x,index";
    static constexpr OpUse use         = OpUse::Encoder;
    static constexpr std::array fields = {
        int_param("cols", &PoolRowsParams::cols, 0, 1, kMaxCols),
        int_param("taps", &PoolRowsParams::taps, 1, 1, kMaxCols),
        int_param("src_count", &PoolRowsParams::src_count, 2, 0, kMaxRowCounts - 1),
        float_param("weight", &PoolRowsParams::weight, 0)};
    template <class C> static void check(C& c, const PoolRowsParams& pp) {
        if (c.g.max_rows[pp.src_count] <= 0)
            c.fail("bad cols, taps or source row count");
        else if (c.act_view(c.op.in[0], c.op.in_col[0], pp.cols, c.g.max_rows[pp.src_count], "input") &&
                 c.input_view(c.op.in[1], DType::I32, pp.taps, c.rout, "index"))
            c.out_act(0, pp.cols, "output");
    }
    template <class B> static PoolRowsArgs args(const B& b, const PoolRowsParams& a) {
        return {b.x(0), b.in_ld[0], (const int32_t*)b.in[1], b.y(0), b.out_ld[0], b.rows, a.cols,
                a.taps, a.weight};
    }
};

// Ops over frame sequences (20-26), in encoder programs as the encoder ops: rows are a row count of the run.
// Their views may also be the program's f32 inputs (c.frame), and the per-thread scratch their CPU kernels
// take must fit the program's (c.scratch).
struct Conv2dNormReluParams {
    int32_t f_in = 0, c_in = 0;   // input frequency rows and channels: [rows, f_in * c_in]
    int32_t f_out = 0, c_out = 0; // output: [rows, f_out * c_out], f_out = ceil(f_in / 2)
    int32_t src_count = 0;        // the row count the input's rows are of
    float eps         = 0;        // the LayerNorm's over channels
};
template <> struct OpTable<Conv2dNormReluParams> {
    static constexpr OpCode code       = OpCode::Conv2dNormRelu;
    static constexpr const char* inout = "in:x,w,norm";
    static constexpr OpUse use         = OpUse::Encoder;
    static constexpr std::array fields = {
        int_param("f_in", &Conv2dNormReluParams::f_in, 0, 1, 1 << 16),
        int_param("c_in", &Conv2dNormReluParams::c_in, 1, 1, 1 << 16),
        int_param("f_out", &Conv2dNormReluParams::f_out, 2, 1, 1 << 16),
        int_param("c_out", &Conv2dNormReluParams::c_out, 3, 1, 1 << 16),
        int_param("src_count", &Conv2dNormReluParams::src_count, 4, 0, kMaxRowCounts - 1),
        float_param("eps", &Conv2dNormReluParams::eps, 0)};
    template <class C> static void check(C& c, const Conv2dNormReluParams& a) {
        const int64_t in_rows = c.g.max_rows[a.src_count];
        if (a.f_out != (a.f_in + 1) / 2) c.fail("output frequency rows are not half the input's");
        // The output covers at least half the input's rows (stride 2), rounding up.
        else if (c.rout < (in_rows + 1) / 2)
            c.fail("fewer output rows than the stride gives");
        else
            c.frame(0, false, (int64_t)a.f_in * a.c_in, in_rows, "input") &&
                c.sized_weight(1, (int64_t)a.c_out * a.c_in * 9, "conv weight") &&
                c.sized_weight(2, a.c_out, "norm weight") &&
                c.frame(0, true, (int64_t)a.f_out * a.c_out, c.rout, "output") &&
                c.scratch(cpu::conv2d_scratch_floats(a.f_out, a.c_in, a.c_out));
    }
    template <class B> static Conv2dArgs args(const B& b, const Conv2dNormReluParams& a) {
        return {b.x(0),  b.counts[a.src_count],
                a.f_in,  a.c_in,
                b.in[1], b.in_dt[1],
                b.in[2], b.in_dt[2],
                a.eps,   b.y(0),
                b.rows,  a.f_out,
                a.c_out};
    }
};

// The checks of the element-wise ops over frame sequences: inputs a (and b), output.
template <class C> void check_frames(C& c, int32_t cols, int inputs) {
    c.frame(0, false, cols, c.rout, inputs == 1 ? "input" : "a") &&
        (inputs == 1 || c.frame(1, false, cols, c.rout, "b")) && c.frame(0, true, cols, c.rout, "output");
}

struct SiluParams {
    int32_t cols = 0;
};
template <> struct OpTable<SiluParams> {
    static constexpr OpCode code       = OpCode::Silu;
    static constexpr const char* inout = "in:x";
    static constexpr OpUse use         = OpUse::Encoder;
    static constexpr std::array fields = {int_param("cols", &SiluParams::cols, 0, 1, kMaxCols)};
    template <class C> static void check(C& c, const SiluParams& a) { check_frames(c, a.cols, 1); }
    template <class B> static UnaryArgs args(const B& b, const SiluParams& a) {
        return {b.x(0), b.in_ld[0], b.y(0), b.out_ld[0], b.rows, a.cols};
    }
};

struct SigmoidMulParams {
    int32_t cols = 0;
};
template <> struct OpTable<SigmoidMulParams> {
    static constexpr OpCode code       = OpCode::SigmoidMul;
    static constexpr const char* inout = "in:a,b";
    static constexpr OpUse use         = OpUse::Encoder;
    static constexpr std::array fields = {int_param("cols", &SigmoidMulParams::cols, 0, 1, kMaxCols)};
    template <class C> static void check(C& c, const SigmoidMulParams& a) { check_frames(c, a.cols, 2); }
    template <class B> static BinaryArgs args(const B& b, const SigmoidMulParams& a) {
        return {b.x(0), b.in_ld[0], b.x(1), b.in_ld[1], b.y(0), b.out_ld[0], b.rows, a.cols};
    }
};

struct CausalConv1dParams {
    int32_t cols = 0, k = 0; // channels, kernel taps
};
template <> struct OpTable<CausalConv1dParams> {
    static constexpr OpCode code       = OpCode::CausalConv1d;
    static constexpr const char* inout = "in:x,w";
    static constexpr OpUse use         = OpUse::Encoder;
    static constexpr std::array fields = {int_param("cols", &CausalConv1dParams::cols, 0, 1, kMaxCols),
                                          int_param("k", &CausalConv1dParams::k, 1, 1, 4096)};
    template <class C> static void check(C& c, const CausalConv1dParams& a) {
        if (c.op.out[0] >= 0 && c.op.out[0] == c.op.in[0])
            c.fail("output aliases its input");
        else
            c.frame(0, false, a.cols, c.rout, "input") &&
                c.sized_weight(1, (int64_t)a.cols * a.k, "conv weight") &&
                c.frame(0, true, a.cols, c.rout, "output") &&
                c.scratch(cpu::causal_conv1d_scratch_floats(a.cols, a.k));
    }
    template <class B> static CausalConv1dArgs args(const B& b, const CausalConv1dParams& a) {
        return {b.x(0), b.in_ld[0], b.in[1], b.in_dt[1], b.y(0), b.out_ld[0], b.rows, a.cols, a.k};
    }
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
    static constexpr OpUse use         = OpUse::Encoder;
    static constexpr std::array fields = {int_param("heads", &LocalAttentionParams::heads, 0, 1, kMaxHeads),
                                          int_param("dim", &LocalAttentionParams::dim, 1, 1, kMaxDim),
                                          int_param("window", &LocalAttentionParams::window, 2, 1, 4096),
                                          int_param("n_rel", &LocalAttentionParams::n_rel, 3, 1, kMaxCols),
                                          positive_param("cap", &LocalAttentionParams::cap, 0)};
    template <class C> static void check(C& c, const LocalAttentionParams& a) {
        const int64_t width = (int64_t)a.heads * a.dim;
        c.frame(0, false, width, c.rout, "q") && c.frame(1, false, width, c.rout, "k") &&
            c.frame(2, false, width, c.rout, "v") && c.frame(3, false, width, a.n_rel, "relative keys") &&
            c.frame(0, true, width, c.rout, "output") &&
            c.scratch(cpu::local_attention_scratch_floats(a.window));
    }
    template <class B> static LocalAttentionArgs args(const B& b, const LocalAttentionParams& a) {
        return {b.x(0), b.in_ld[0],  b.x(1), b.in_ld[1], b.x(2), b.in_ld[2], b.x(3),  b.in_ld[3],
                b.y(0), b.out_ld[0], b.rows, a.heads,    a.dim,  a.window,   a.n_rel, a.cap};
    }
};

struct SoftplusScaleParams {
    int32_t cols = 0, dim = 0; // the scale's length (cols a multiple of it)
    float scale = 1.0f;
};
template <> struct OpTable<SoftplusScaleParams> {
    static constexpr OpCode code       = OpCode::SoftplusScale;
    static constexpr const char* inout = "in:x,w";
    static constexpr OpUse use         = OpUse::Encoder;
    static constexpr std::array fields = {int_param("cols", &SoftplusScaleParams::cols, 0, 1, kMaxCols),
                                          int_param("dim", &SoftplusScaleParams::dim, 1, 1, kMaxCols),
                                          float_param("scale", &SoftplusScaleParams::scale, 0)};
    template <class C> static void check(C& c, const SoftplusScaleParams& a) {
        if (a.cols % a.dim != 0)
            c.fail("columns are not a multiple of the scale's length");
        else
            c.frame(0, false, a.cols, c.rout, "input") && c.sized_weight(1, a.dim, "scale") &&
                c.frame(0, true, a.cols, c.rout, "output") &&
                c.scratch(cpu::softplus_scale_scratch_floats(a.dim));
    }
    template <class B> static DimScaleArgs args(const B& b, const SoftplusScaleParams& a) {
        return {b.x(0), b.in_ld[0], b.y(0), b.out_ld[0], b.rows, a.cols, a.dim, b.in[1], b.in_dt[1], a.scale};
    }
};

struct AddScaledParams {
    int32_t cols = 0;
    float scale  = 1.0f; // y = a + scale * b
};
template <> struct OpTable<AddScaledParams> {
    static constexpr OpCode code       = OpCode::AddScaled;
    static constexpr const char* inout = "in:a,b";
    static constexpr OpUse use         = OpUse::Encoder;
    static constexpr std::array fields = {int_param("cols", &AddScaledParams::cols, 0, 1, kMaxCols),
                                          float_param("scale", &AddScaledParams::scale, 0)};
    template <class C> static void check(C& c, const AddScaledParams& a) { check_frames(c, a.cols, 2); }
    template <class B> static AddScaledArgs args(const B& b, const AddScaledParams& a) {
        return {b.x(0), b.in_ld[0], b.x(1), b.in_ld[1], b.y(0), b.out_ld[0], b.rows, a.cols, a.scale};
    }
};

// Every op's parameter struct, in op-code order (the schema hash and docs walk it).
using AllOpParams =
    std::tuple<EmbedParams, MatmulParams, RmsNormParams, AddParams, ScaleParams, RopeParams, KvStoreParams,
               AttentionParams, GeluMulParams, SoftcapParams, CopyParams, ClampParams, AddPosition2DParams,
               Rope2DParams, SelfAttentionParams, PoolRowsParams, Conv2dNormReluParams, SiluParams,
               SigmoidMulParams, CausalConv1dParams, LocalAttentionParams, SoftplusScaleParams,
               AddScaledParams>;

// The row of docs/plan-format.md's op table for P:
// "| `attention` (8) | in:q,kc,vc | `heads` ip0 [1, 4096], ..., `scale` fp0 |" (a positive float: "> 0").
std::string op_doc_row(const char* op_name_text, int code, const char* inout, const std::string& fields);
std::string param_range_text(int32_t lo, int32_t hi); // " [1, 2^24]"
template <class P> std::string op_doc_row(const char* op_name_text) {
    std::string f;
    for (const auto& d : OpTable<P>::fields)
        f += std::string(f.empty() ? "" : ", ") + "`" + d.name + "` " + (d.i ? "ip" : "fp") +
             std::to_string(d.slot) +
             (d.i          ? param_range_text(d.lo, d.hi)
              : d.positive ? " > 0"
                           : "");
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

// "" or which of op's parameters (op.code == OpTable<P>::code) lies outside its declared values.
template <class P> std::string param_range_error(const PlanOp& op) {
    for (const auto& f : OpTable<P>::fields) {
        if (f.i && (op.ip[f.slot] < f.lo || op.ip[f.slot] > f.hi))
            return std::string("parameter ") + f.name + " = " + std::to_string(op.ip[f.slot]) +
                   " is outside [" + std::to_string(f.lo) + ", " + std::to_string(f.hi) + "]";
        if (f.f && f.positive && !(op.fp[f.slot] > 0))
            return std::string("parameter ") + f.name + " = " + std::to_string(op.fp[f.slot]) +
                   " must be > 0";
    }
    return "";
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
