// Validation of a plan's program (see plan_reader.h check_program): every op's operands, column views,
// shapes, dtypes and parameters against the tensor table, as the CPU executor and the CUDA backend read
// them; and the tensors' placement in the arenas (inputs overlap nothing, KV caches overlap each other
// nowhere). Run once by Plan::load, before any session exists.
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
    // A KV cache of `slots` rows read or written `width` columns from column col.
    bool cache_view(int32_t idx, int32_t col, int64_t width, int64_t slots, const char* what) {
        if (!need(idx, TensorKind::KvCache, what)) return false;
        if (!cols_ok(idx, col, width, what)) return false;
        if (p.tensor(idx).dims[0] != slots)
            return fail(std::string(what) + " " + tname(idx) + " has " +
                        std::to_string(p.tensor(idx).dims[0]) + " slots, the op " + std::to_string(slots));
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

// One op's operands, views and parameters (rin / rout: the rows its inputs / outputs need); defects into c.
void check_op(Checker& c, const ProgramInfo& in, int64_t rin, int64_t rout) {
    const Plan& p    = c.p;
    const PlanOp& op = c.op;
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
            if (w.ndim != 2 || w.dims[1] > in.max_k)
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
            else if (c.act_view(op.in[0], op.in_col[0], w.dims[1], rin, "input"))
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
    for (size_t i = 0; i < p.n_ops(); ++i) {
        const PlanOp& op = p.op(i);
        Checker c{p, op, ""};
        RowMode rm   = (RowMode)op.row_mode;
        int64_t rin  = rm == RowMode::OutRows ? in.logits_rows : in.max_rows;
        int64_t rout = rm == RowMode::All ? in.max_rows : in.logits_rows;
        // Weights and KV caches are read from their first column (the runtime adds no offset to weights).
        for (int k = 0; k < 4 && c.err.empty(); ++k)
            if (op.in[k] >= 0 && p.tensor(op.in[k]).kind == (uint8_t)TensorKind::Weight && op.in_col[k] != 0)
                c.fail("weight " + c.tname(op.in[k]) + " viewed from column " + std::to_string(op.in_col[k]));
        check_op(c, in, rin, rout);
        // Cross-device plans: an op's caches lie in its device's part of the KV arena (the host part
        // for CPU-placed layers), and a GPU op's weights in the ranges its GPU uploads.
        if (c.err.empty() && p.hybrid() && (OpCode)op.code != OpCode::Copy) {
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
            if (b.t != a.t && overlap(a, b))
                return "input " + name(a.t) + " overlaps input " + name(b.t) + " in the activation arena";
        for (const Range& b : acts)
            if (overlap(a, b))
                return "input " + name(a.t) + " (bytes " + std::to_string(a.b) + ".." + std::to_string(a.e) +
                       ") overlaps activation " + name(b.t) + " (bytes " + std::to_string(b.b) + ".." +
                       std::to_string(b.e) + ") in the activation arena";
    }
    std::sort(caches.begin(), caches.end(), [](const Range& a, const Range& b) { return a.b < b.b; });
    for (size_t k = 1; k < caches.size(); ++k)
        if (caches[k].b < caches[k - 1].e)
            return "KV cache " + name(caches[k].t) + " overlaps KV cache " + name(caches[k - 1].t) +
                   " in the KV arena";
    return "";
}

} // namespace g4::plan
