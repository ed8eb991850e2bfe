// Validation of a plan's program (see plan_reader.h check_program): every op's operands, column views,
// shapes, dtypes and parameters against the tensor table, as the CPU executor and the CUDA backend read
// them; and the tensors' placement in the arenas (inputs overlap nothing, KV caches overlap each other
// nowhere). Run once by Plan::load, before any session exists.
#include "runtime/plan/check_sequence_ops.h"
#include "runtime/plan/op_params.h"
#include "runtime/plan/plan_reader.h"

#include <algorithm>
#include <string>
#include <vector>

namespace g4::plan {

namespace {

int64_t numel(const PlanTensor& t) {
    int64_t n = 1;
    for (int i = 0; i < t.ndim; ++i)
        n *= t.dims[i];
    return n;
}

const char* kind_name(uint8_t k) {
    switch ((TensorKind)k) {
    case TensorKind::Weight:
        return "a weight";
    case TensorKind::Activation:
        return "an activation";
    case TensorKind::KvCache:
        return "a KV cache";
    case TensorKind::Input:
        return "an input";
    }
    return "an unknown kind";
}

struct Checker {
    const Plan& p;
    const PlanOp& op;
    std::string err;

    bool fail(const std::string& m) {
        if (err.empty()) err = m;
        return false;
    }
    std::string tname(int32_t idx) const { return "'" + std::string(p.str(p.tensor(idx).name)) + "'"; }
    bool need(int32_t idx, TensorKind k, const char* what) {
        if (idx < 0) return fail(std::string("missing ") + what);
        if (p.tensor(idx).kind != (uint8_t)k)
            return fail(std::string(what) + " " + tname(idx) + " is " + kind_name(p.tensor(idx).kind) +
                        ", not " + kind_name((uint8_t)k));
        return true;
    }
    // A view of `cols` columns from column `col` of a 2-D tensor's rows: within the row.
    bool cols_ok(int32_t idx, int64_t col, int64_t cols, const char* what) {
        const PlanTensor& x = p.tensor(idx);
        const int64_t row   = x.ndim == 2 ? x.dims[1] : 0;
        if (col < 0 || cols < 0 || col + cols > row)
            return fail(std::string(what) + " column " + std::to_string(col) + "+" + std::to_string(cols) +
                        " exceeds the row of " + std::to_string(row));
        return true;
    }
    // Activation view of `cols` columns starting at col, with enough rows for the op's row mode.
    bool act_view(int32_t idx, int32_t col, int64_t cols, int64_t rows, const char* what) {
        if (!need(idx, TensorKind::Activation, what)) return false;
        if (!cols_ok(idx, col, cols, what)) return false;
        if (p.tensor(idx).dims[0] < rows)
            return fail(std::string(what) + " " + tname(idx) + " has " +
                        std::to_string(p.tensor(idx).dims[0]) + " rows, the op needs " +
                        std::to_string(rows));
        return true;
    }
    // An op's input view: an activation, or an encoder program's f32 input or 2-D f32 weight (a table the
    // compiler computed: read, never written).
    bool src_view(int32_t idx, int32_t col, int64_t cols, int64_t rows, const char* what) {
        const bool fixed = idx >= 0 && (p.tensor(idx).kind == (uint8_t)TensorKind::Input ||
                                        p.tensor(idx).kind == (uint8_t)TensorKind::Weight);
        if (fixed) {
            if (p.tensor(idx).dtype != (uint8_t)DType::F32 || p.tensor(idx).ndim != 2)
                return fail(std::string(what) + " " + tname(idx) + " is not a 2-D f32 input or weight");
            if (!cols_ok(idx, col, cols, what)) return false;
            if (p.tensor(idx).dims[0] < rows)
                return fail(std::string(what) + " " + tname(idx) + " has too few rows");
            return true;
        }
        return act_view(idx, col, cols, rows, what);
    }
    // A KV cache of `slots` rows read or written `width` columns from column col.
    bool cache_view(int32_t idx, int32_t col, int64_t width, int64_t slots, const char* what) {
        if (!need(idx, TensorKind::KvCache, what)) return false;
        if (!cols_ok(idx, col, width, what)) return false;
        if (p.tensor(idx).dims[0] != slots)
            return fail(std::string(what) + " " + tname(idx) + " has " +
                        std::to_string(p.tensor(idx).dims[0]) + " slots, the op " + std::to_string(slots));
        return true;
    }
    // An input an encoder program's caller fills: 2-D `dt` with >= rows rows of `cols` columns.
    bool input_view(int32_t idx, DType dt, int64_t cols, int64_t rows, const char* what) {
        if (!need(idx, TensorKind::Input, what)) return false;
        const PlanTensor& x = p.tensor(idx);
        if (x.ndim != 2 || x.dtype != (uint8_t)dt || x.dims[1] != cols || x.dims[0] < rows)
            return fail(std::string(what) + " " + tname(idx) + " must be " + dtype_str(dt) +
                        " [>= " + std::to_string(rows) + ", " + std::to_string(cols) + "]");
        return true;
    }
    bool weight(int32_t idx, const char* what) {
        if (!need(idx, TensorKind::Weight, what)) return false;
        return true;
    }
    bool matmul_weight(int32_t idx, const char* what) {
        if (!weight(idx, what)) return false;
        if (p.tensor(idx).dtype == (uint8_t)DType::NF4) return true;
        return dense_weight(idx, what);
    }
    bool dense_weight(int32_t idx, const char* what) {
        if (!weight(idx, what)) return false;
        uint8_t d = p.tensor(idx).dtype;
        if (d != (uint8_t)DType::F32 && d != (uint8_t)DType::BF16 && d != (uint8_t)DType::F16)
            return fail(std::string(what) + " " + tname(idx) + " has an unsupported dtype");
        return true;
    }
};

// One op of program g (text: the text program) against its program: an encoder program's op runs over one
// of its row counts and names only its program's tensors; the encoder ops appear only in encoder programs
// and the text-only ops only in the text program. Defects into c.
void check_op_program(Checker& c, const PlanProgram& g, bool text, int64_t* rin, int64_t* rout) {
    const Plan& p       = c.p;
    const PlanOp& op    = c.op;
    const int32_t count = op.row_mode - kRowCountBase;
    if (!text) {
        if (count < 0 || count >= kMaxRowCounts || g.max_rows[count] <= 0)
            c.fail("bad row count " + std::to_string(op.row_mode));
        else
            *rin = *rout = g.max_rows[count];
        for (int32_t t : {op.in[0], op.in[1], op.in[2], op.in[3], op.out[0], op.out[1]})
            if (t >= 0 && ((uint32_t)t < g.tensor_begin || (uint32_t)t >= g.tensor_end))
                c.fail("tensor " + std::to_string(t) + " belongs to another program");
    }
    const bool encoder_op = (op.code >= (uint16_t)OpCode::Clamp && op.code <= (uint16_t)OpCode::PoolRows) ||
                            is_sequence_op(op.code);
    const bool text_op = op.code == (uint16_t)OpCode::Embed || op.code == (uint16_t)OpCode::KvStore ||
                         op.code == (uint16_t)OpCode::Attention || op.code == (uint16_t)OpCode::Copy ||
                         op.code == (uint16_t)OpCode::Rope || op.code == (uint16_t)OpCode::Softcap;
    if (text ? encoder_op : text_op)
        c.fail(std::string("op of ") + (text ? "an encoder program" : "the text program") + " in program '" +
               p.str(g.name) + "'");
}

// The encoder-program ops (12-16) and their operands; defects into c.
void check_encoder_op(Checker& c, const PlanProgram& g, int64_t rin, int64_t rout) {
    const Plan& p    = c.p;
    const PlanOp& op = c.op;
    switch ((OpCode)op.code) {
    case OpCode::Clamp: {
        const auto cp = params<ClampParams>(op);
        if (cp.cols <= 0 || !(cp.lo <= cp.hi))
            c.fail("bad cols or bounds");
        else if (c.act_view(op.in[0], op.in_col[0], cp.cols, rin, "input"))
            c.act_view(op.out[0], op.out_col[0], cp.cols, rout, "output");
        break;
    }
    case OpCode::AddPosition2D: {
        const int64_t cols = params<AddPosition2DParams>(op).cols;
        if (cols <= 0)
            c.fail("bad cols");
        else if (c.dense_weight(op.in[1], "table") &&
                 (p.tensor(op.in[1]).ndim != 3 || p.tensor(op.in[1]).dims[0] != 2 ||
                  p.tensor(op.in[1]).dims[2] != cols))
            c.fail("table must be [2, positions, cols]");
        else if (c.err.empty() && c.act_view(op.in[0], op.in_col[0], cols, rin, "input") &&
                 c.input_view(op.in[2], DType::I32, 2, rin, "positions"))
            c.act_view(op.out[0], op.out_col[0], cols, rout, "output");
        break;
    }
    case OpCode::Rope2D: {
        const auto rp = params<Rope2DParams>(op);
        if (rp.heads <= 0 || rp.dim <= 0 || rp.dim % 4)
            c.fail("bad heads/dim");
        else if (op.in[0] != op.out[0] || op.in_col[0] != op.out_col[0])
            c.fail("rope must be in place");
        else if (c.need(op.in[1], TensorKind::Weight, "inv_freq") &&
                 (p.tensor(op.in[1]).dtype != (uint8_t)DType::F32 || numel(p.tensor(op.in[1])) != rp.dim / 4))
            c.fail("inv_freq must be f32 [dim/4]");
        else if (c.err.empty() && c.input_view(op.in[2], DType::I32, 2, rin, "positions"))
            c.act_view(op.in[0], op.in_col[0], (int64_t)rp.heads * rp.dim, rin, "input");
        break;
    }
    case OpCode::SelfAttention: {
        const auto ap       = params<SelfAttentionParams>(op);
        const int64_t heads = ap.heads, kvh = ap.kv_heads, dim = ap.dim;
        if (heads <= 0 || kvh <= 0 || dim <= 0 || heads % kvh)
            c.fail("bad heads/kv heads/dim");
        else if (c.act_view(op.in[0], op.in_col[0], heads * dim, rin, "q") &&
                 c.act_view(op.in[1], op.in_col[1], kvh * dim, rin, "k") &&
                 c.act_view(op.in[2], op.in_col[2], kvh * dim, rin, "v") &&
                 c.act_view(op.out[0], op.out_col[0], heads * dim, rout, "output") &&
                 c.need(op.out[1], TensorKind::Activation, "work") &&
                 numel(p.tensor(op.out[1])) < self_attention_work_floats(rin, kvh, dim))
            c.fail("work tensor " + c.tname(op.out[1]) + " too small");
        break;
    }
    case OpCode::PoolRows: {
        const auto pp = params<PoolRowsParams>(op);
        if (pp.cols <= 0 || pp.taps <= 0 || pp.src_count < 0 || pp.src_count >= kMaxRowCounts ||
            g.max_rows[pp.src_count] <= 0)
            c.fail("bad cols, taps or source row count");
        else if (c.act_view(op.in[0], op.in_col[0], pp.cols, g.max_rows[pp.src_count], "input") &&
                 c.input_view(op.in[1], DType::I32, pp.taps, rout, "index"))
            c.act_view(op.out[0], op.out_col[0], pp.cols, rout, "output");
        break;
    }
    default:
        c.fail("unknown op");
        break;
    }
}

// One op's operands, views and parameters in its program g; defects into c.
void check_op(Checker& c, const ProgramInfo& in, const PlanProgram& g, bool text) {
    const Plan& p    = c.p;
    const PlanOp& op = c.op;
    RowMode rm       = (RowMode)op.row_mode;
    int64_t rin      = rm == RowMode::OutRows ? in.logits_rows : in.max_rows; // the rows inputs need
    int64_t rout     = rm == RowMode::All ? in.max_rows : in.logits_rows;     // and outputs
    check_op_program(c, g, text, &rin, &rout);
    if (!c.err.empty()) return;
    if (is_sequence_op(op.code)) {
        c.fail(check_sequence_op(p, op, rout, g.max_rows, g.thread_floats));
        return;
    }
    if (op.code >= (uint16_t)OpCode::Clamp) return check_encoder_op(c, g, rin, rout);
    switch ((OpCode)op.code) {
    case OpCode::Embed:
        if (op.in[0] != in.ids_tensor)
            c.fail("reads a tensor other than the plan's ids input");
        else if (c.need(op.in[0], TensorKind::Input, "ids") && c.dense_weight(op.in[1], "table")) {
            const PlanTensor& tab = p.tensor(op.in[1]);
            if (p.tensor(op.in[0]).dims[0] < rout)
                c.fail("ids has fewer rows than a step");
            else if (tab.ndim != 2 || tab.dims[0] < in.embed_vocab_limit)
                c.fail("table has too few rows for the vocabulary");
            else
                c.act_view(op.out[0], op.out_col[0], tab.dims[1], rout, "output");
        }
        break;
    case OpCode::Matmul:
        if (c.matmul_weight(op.in[1], "weight")) {
            const PlanTensor& w = p.tensor(op.in[1]);
            const auto mp       = params<MatmulParams>(op);
            if (w.ndim != 2 || (text && w.dims[1] > in.max_k)) // (encoders: their thread_floats)
                c.fail("weight must be 2-D with K <= max_k");
            else if (mp.decode_variant < 0 || mp.decode_variant > 1 || mp.prefill_variant < 0 ||
                     mp.prefill_variant > (int32_t)MatmulVariant::Cublas || mp.prefill_variant == 1)
                c.fail("bad kernel variant");
            else if ((mp.decode_variant == (int32_t)MatmulVariant::Gemv4 &&
                      !((w.dtype == (uint8_t)DType::NF4 && w.dims[1] % 512 == 0) ||
                        (w.dtype == (uint8_t)DType::BF16 && w.dims[1] % 256 == 0))) ||
                     ((mp.prefill_variant == (int32_t)MatmulVariant::Tiled64 ||
                       mp.prefill_variant == (int32_t)MatmulVariant::TensorCore) &&
                      !(w.dims[1] % 32 == 0 &&
                        (w.dtype == (uint8_t)DType::NF4 || w.dtype == (uint8_t)DType::BF16))))
                c.fail("kernel variant does not fit the weight's shape or dtype");
            else if (op.in[2] >= 0 && (!c.need(op.in[2], TensorKind::Weight, "bias") ||
                                       p.tensor(op.in[2]).dtype != (uint8_t)DType::F32 ||
                                       numel(p.tensor(op.in[2])) != w.dims[0]))
                c.fail("bias must be f32 [N]");
            else if (text ? c.act_view(op.in[0], op.in_col[0], w.dims[1], rin, "input")
                          : c.src_view(op.in[0], op.in_col[0], w.dims[1], rin, "input"))
                c.act_view(op.out[0], op.out_col[0], w.dims[0], rout, "output");
        }
        break;
    case OpCode::RmsNorm: {
        const auto np      = params<RmsNormParams>(op);
        const int64_t cols = np.cols;
        if (np.dim <= 0 || cols <= 0 || cols % np.dim)
            c.fail("bad cols/dim");
        else if (op.in[1] >= 0 &&
                 (!c.dense_weight(op.in[1], "weight") || numel(p.tensor(op.in[1])) != np.dim))
            c.fail("weight size != dim");
        else if (c.act_view(op.in[0], op.in_col[0], cols, rin, "input"))
            c.act_view(op.out[0], op.out_col[0], cols, rout, "output");
        break;
    }
    case OpCode::Add:
    case OpCode::GeluMul: {
        const int64_t cols =
            (OpCode)op.code == OpCode::Add ? params<AddParams>(op).cols : params<GeluMulParams>(op).cols;
        if (cols <= 0)
            c.fail("bad cols");
        else if (c.act_view(op.in[0], op.in_col[0], cols, rin, "a") &&
                 c.act_view(op.in[1], op.in_col[1], cols, rin, "b"))
            c.act_view(op.out[0], op.out_col[0], cols, rout, "output");
        break;
    }
    case OpCode::Scale:
    case OpCode::Softcap: {
        const bool softcap = (OpCode)op.code == OpCode::Softcap;
        const int64_t cols = softcap ? params<SoftcapParams>(op).cols : params<ScaleParams>(op).cols;
        if (cols <= 0)
            c.fail("bad cols");
        else if (softcap && !(params<SoftcapParams>(op).cap > 0))
            c.fail("softcap must be positive");
        else if (op.in[1] >= 0 && (!c.dense_weight(op.in[1], "scalar") || numel(p.tensor(op.in[1])) < 1))
            c.fail("bad scalar");
        else if (c.act_view(op.in[0], op.in_col[0], cols, rin, "input"))
            c.act_view(op.out[0], op.out_col[0], cols, rout, "output");
        break;
    }
    case OpCode::Rope: {
        const auto rp = params<RopeParams>(op);
        if (rp.heads <= 0 || rp.dim <= 0 || rp.dim % 2)
            c.fail("bad heads/dim");
        else if (op.in[0] != op.out[0] || op.in_col[0] != op.out_col[0])
            c.fail("rope must be in place");
        else if (c.need(op.in[1], TensorKind::Weight, "inv_freq") &&
                 (p.tensor(op.in[1]).dtype != (uint8_t)DType::F32 || numel(p.tensor(op.in[1])) != rp.dim / 2))
            c.fail("inv_freq must be f32 [dim/2]");
        else
            c.act_view(op.in[0], op.in_col[0], (int64_t)rp.heads * rp.dim, rin, "input");
        break;
    }
    case OpCode::KvStore: {
        const auto kp       = params<KvStoreParams>(op);
        const int64_t width = kp.width, slots = kp.slots;
        if (width <= 0 || slots <= 0)
            c.fail("bad width/slots");
        else if (c.act_view(op.in[0], op.in_col[0], width, rin, "k") &&
                 c.act_view(op.in[1], op.in_col[1], width, rin, "v") &&
                 c.cache_view(op.out[0], op.out_col[0], width, slots, "k cache") &&
                 c.cache_view(op.out[1], op.out_col[1], width, slots, "v cache")) {
            if (op.out[0] == op.out[1])
                c.fail("k and v caches are the same tensor");
            else if (p.tensor(op.out[0]).dtype != p.tensor(op.out[1]).dtype)
                c.fail("k and v caches differ in dtype");
            else if (slots < in.max_context && slots < in.max_rows)
                c.fail("cache ring smaller than a chunk");
        }
        break;
    }
    case OpCode::Attention: {
        const auto ap       = params<AttentionParams>(op);
        const int64_t heads = ap.heads, kvh = ap.kv_heads, dim = ap.dim, slots = ap.slots, window = ap.window;
        if (heads <= 0 || kvh <= 0 || dim <= 0 || heads % kvh || window < 0 || window > in.max_slots ||
            slots > in.max_slots || ap.prefill_splits < 0 || ap.prefill_splits > 128 ||
            ap.decode_splits < 0 || ap.decode_splits > 1024)
            c.fail("bad attention parameters (heads " + std::to_string(heads) + ", kv heads " +
                   std::to_string(kvh) + ", dim " + std::to_string(dim) + ", window " +
                   std::to_string(window) + " of at most " + std::to_string(in.max_slots) + ")");
        else if (c.act_view(op.in[0], op.in_col[0], heads * dim, rin, "q") &&
                 c.cache_view(op.in[1], op.in_col[1], kvh * dim, slots, "k cache") &&
                 c.cache_view(op.in[2], op.in_col[2], kvh * dim, slots, "v cache")) {
            if (p.tensor(op.in[1]).dtype != p.tensor(op.in[2]).dtype)
                c.fail("k and v caches differ in dtype");
            // Every key a query can see must still be in the cache.
            else if (window == 0 ? slots < in.max_context
                                 : (slots < in.max_context && slots < window + in.max_rows - 1))
                c.fail("cache too small for the attention span");
            else
                c.act_view(op.out[0], op.out_col[0], heads * dim, rout, "output");
        }
        break;
    }
    case OpCode::Copy: {
        auto device_ok = [&](int32_t d) { return d == -1 || (d >= 0 && p.gpu_slot(d) >= 0); };
        const auto cp  = params<CopyParams>(op);
        if (!p.hybrid())
            c.fail("copy steps belong to CUDA plans whose layers span devices");
        else if (op.in[0] != op.out[0] || op.in_col[0] != op.out_col[0] || !device_ok(cp.dst_device) ||
                 !device_ok(cp.src_device) || cp.dst_device == cp.src_device ||
                 op.row_mode != (int32_t)RowMode::All || cp.cols <= 0)
            c.fail("bad copy step");
        else
            c.act_view(op.in[0], op.in_col[0], cp.cols, in.max_rows, "tensor");
        break;
    }
    default:
        c.fail("unknown op");
        break;
    }
}

} // namespace

std::string check_program(const Plan& p) {
    const auto& in = p.info();
    size_t prog    = 0;
    for (size_t i = 0; i < p.n_ops_all(); ++i) {
        const PlanOp& op = p.op(i);
        Checker c{p, op, ""};
        while (i >= p.program(prog).op_end)
            ++prog;
        const PlanProgram& g = p.program(prog);
        const bool text      = prog == 0;
        // Weights and KV caches are read from their first column (the runtime adds no offset to weights).
        for (int k = 0; k < 4 && c.err.empty(); ++k)
            if (op.in[k] >= 0 && p.tensor(op.in[k]).kind == (uint8_t)TensorKind::Weight && op.in_col[k] != 0)
                c.fail("weight " + c.tname(op.in[k]) + " viewed from column " + std::to_string(op.in_col[k]));
        check_op(c, in, g, text);
        // Cross-device plans: an op's caches lie in its device's part of the KV arena (the host part
        // for CPU-placed layers), and a GPU op's weights in the ranges its GPU uploads.
        if (c.err.empty() && text && p.hybrid() && (OpCode)op.code != OpCode::Copy) {
            const int dev = p.op_device(i);
            const auto* g = dev >= 0 ? &in.gpus[p.gpu_slot(dev)] : nullptr;
            for (int32_t t : {op.in[0], op.in[1], op.in[2], op.in[3], op.out[0], op.out[1]}) {
                if (t < 0) continue;
                const PlanTensor& x = p.tensor(t);
                if (x.kind == (uint8_t)TensorKind::KvCache &&
                    (g ? x.offset < g->kv_begin || x.offset + x.nbytes > g->kv_end
                       : x.offset < in.kv_host_begin))
                    c.fail(std::string("KV cache '") + p.str(x.name) + "' is not in the " +
                           (g ? "cuda:" + std::to_string(dev) : std::string("host")) +
                           " part of the KV arena");
                if (x.kind == (uint8_t)TensorKind::Weight && g) {
                    bool in_range = false;
                    for (const auto& [b, e] : g->weights)
                        in_range = in_range || (x.offset >= b && x.offset + x.nbytes <= e);
                    if (!in_range)
                        c.fail(std::string("weight '") + p.str(x.name) + "' of an op on cuda:" +
                               std::to_string(dev) + " is not in the weights uploaded to that GPU");
                }
            }
        }
        if (!c.err.empty())
            return "op " + std::to_string(i) + " '" + p.str(op.name) + "' (" + op_name((OpCode)op.code) +
                   "): " + c.err;
    }

    // Placement in the arenas. Inputs (the ids) are written before a step and read through it, and every
    // KV cache holds its layer's keys for the whole session: none of them may share bytes with another
    // tensor of its arena (activations reuse each other's bytes by design: the compiler's live ranges).
    struct Range {
        uint64_t b, e;
        size_t t;
    };
    auto same_program = [&](size_t a, size_t b) { return p.tensor_program(a) == p.tensor_program(b); };
    std::vector<Range> inputs, acts, caches;
    for (size_t t = 0; t < p.n_tensors(); ++t) {
        const PlanTensor& x = p.tensor(t);
        const Range r{x.offset, x.offset + x.nbytes, t};
        if (x.kind == (uint8_t)TensorKind::Input)
            inputs.push_back(r);
        else if (x.kind == (uint8_t)TensorKind::Activation)
            acts.push_back(r);
        else if (x.kind == (uint8_t)TensorKind::KvCache)
            caches.push_back(r);
    }
    auto overlap = [](const Range& a, const Range& b) { return a.b < b.e && b.b < a.e; };
    auto name    = [&](size_t t) { return "'" + std::string(p.str(p.tensor(t).name)) + "'"; };
    for (const Range& a : inputs) {
        for (const Range& b : inputs)
            if (b.t != a.t && same_program(a.t, b.t) && overlap(a, b))
                return "input " + name(a.t) + " overlaps input " + name(b.t) + " in the activation arena";
        for (const Range& b : acts)
            if (same_program(a.t, b.t) && overlap(a, b))
                return "input " + name(a.t) + " (bytes " + std::to_string(a.b) + ".." + std::to_string(a.e) +
                       ") overlaps activation " + name(b.t) + " (bytes " + std::to_string(b.b) + ".." +
                       std::to_string(b.e) + ") in the activation arena";
    }
    std::sort(caches.begin(), caches.end(), [](const Range& a, const Range& b) { return a.b < b.b; });
    for (size_t k = 1; k < caches.size(); ++k)
        if (caches[k].b < caches[k - 1].e)
            return "KV cache " + name(caches[k].t) + " overlaps KV cache " + name(caches[k - 1].t) +
                   " in the KV arena";
    // Each encoder program's inputs and outputs: its own tensors of the kinds a caller fills / reads.
    for (size_t k = 1; k < p.n_programs(); ++k) {
        const PlanProgram& g = p.program(k);
        auto mine            = [&](int32_t t, TensorKind kind) {
            return t >= (int32_t)g.tensor_begin && t < (int32_t)g.tensor_end &&
                   p.tensor(t).kind == (uint8_t)kind;
        };
        for (int32_t t : g.inputs)
            if (t != -1 && !mine(t, TensorKind::Input))
                return std::string("program '") + p.str(g.name) + "': input " + std::to_string(t) +
                       " is not one of its input tensors";
        for (int32_t t : g.outputs)
            if (t != -1 && !mine(t, TensorKind::Activation))
                return std::string("program '") + p.str(g.name) + "': output " + std::to_string(t) +
                       " is not one of its activations";
    }
    return "";
}

int Plan::find_program(std::string_view name) const {
    for (size_t i = 0; i < programs_.size(); ++i)
        if (name == str(programs_[i].name)) return (int)i;
    return -1;
}

size_t Plan::tensor_program(size_t t) const {
    for (size_t i = 1; i < programs_.size(); ++i)
        if (t >= programs_[i].tensor_begin && t < programs_[i].tensor_end) return i;
    return 0;
}

// The PROGRAMS section (absent: one program "text" of every op and tensor): contiguous, disjoint op and
// tensor ranges in order from 0, "text" first with the META activation arena, devices the plan's, row
// counts bounded. The programs' ops and tensors are checked by validate_records and check_program.
g4_status Plan::validate_programs(const PlanSection* sec, std::string* err) {
    const g4_status CORRUPT = G4_ERR_PLAN_CORRUPT;
    const int text_device   = device_ == "cuda" ? cuda_device_ : -1;
    programs_.clear();
    if (!sec) {
        PlanProgram text{};
        text.device      = text_device;
        text.op_end      = (uint32_t)n_ops_;
        text.tensor_end  = (uint32_t)n_tensors_;
        text.arena_bytes = info_.act_arena_bytes;
        for (int32_t& t : text.inputs)
            t = -1;
        for (int32_t& t : text.outputs)
            t = -1;
        programs_.push_back(text);
        return G4_OK;
    }
    if (sec->size % sizeof(PlanProgram) || sec->offset % 8 || sec->size == 0 ||
        sec->size / sizeof(PlanProgram) > 64)
        return fail(CORRUPT, "malformed program table", err);
    const auto* recs = (const PlanProgram*)((const uint8_t*)map_ + sec->offset);
    programs_.assign(recs, recs + sec->size / sizeof(PlanProgram));
    uint32_t op = 0, tensor = 0;
    for (size_t i = 0; i < programs_.size(); ++i) {
        const PlanProgram& g   = programs_[i];
        const std::string what = "program " + std::to_string(i);
        if (g.name >= strings_size_) return fail(CORRUPT, what + ": name out of bounds", err);
        if (i == 0 && std::string_view(str(g.name)) != "text")
            return fail(CORRUPT, "the first program is not \"text\"", err);
        if (find_program(str(g.name)) != (int)i) return fail(CORRUPT, what + ": duplicate name", err);
        if (g.op_begin != op || g.op_end < g.op_begin || g.op_end > n_ops_ || g.tensor_begin != tensor ||
            g.tensor_end < g.tensor_begin || g.tensor_end > n_tensors_)
            return fail(CORRUPT, what + " '" + str(g.name) + "': op or tensor range out of order", err);
        op = g.op_end, tensor = g.tensor_end;
        if (g.device != -1 && g.device != text_device)
            return fail(CORRUPT, what + ": device " + std::to_string(g.device) + " is not the plan's", err);
        if (i == 0 ? g.arena_bytes != info_.act_arena_bytes : g.arena_bytes > (1ull << 40))
            return fail(CORRUPT, what + ": bad activation arena size", err);
        if (g.thread_floats > (1ull << 32)) return fail(CORRUPT, what + ": bad per-thread scratch", err);
        for (int32_t r : g.max_rows)
            if (r < 0 || r > (1 << 24)) return fail(CORRUPT, what + ": bad row count bound", err);
        for (int32_t t : g.inputs)
            if (t < -1 || t >= (int32_t)n_tensors_) return fail(CORRUPT, what + ": bad input tensor", err);
        for (int32_t t : g.outputs)
            if (t < -1 || t >= (int32_t)n_tensors_) return fail(CORRUPT, what + ": bad output tensor", err);
    }
    if (op != n_ops_ || tensor != n_tensors_)
        return fail(CORRUPT, "the programs do not cover every op and tensor", err);
    return G4_OK;
}

} // namespace g4::plan
