// Op validation, binding and replay on the CPU (Eigen kernels). A step runs the whole program over
// `rows` tokens starting at position pos0; ops in RowMode::TailIn/OutRows touch only the rows whose
// logits are wanted.
#include "runtime/src/executor.h"

#include <cstring>

namespace g4::rt {

using plan::PlanOp;
using plan::PlanTensor;
using plan::RowMode;
using plan::TensorKind;

namespace {

struct Checker {
    const plan::Plan& p;
    const PlanOp& op;
    std::string err;

    const PlanTensor* t(int32_t idx) const { return idx >= 0 ? &p.tensor(idx) : nullptr; }
    bool fail(const std::string& m) {
        if (err.empty()) err = m;
        return false;
    }
    bool need(int32_t idx, TensorKind k, const char* what) {
        if (idx < 0) return fail(std::string("missing ") + what);
        if (p.tensor(idx).kind != (uint8_t)k) return fail(std::string(what) + " has the wrong kind");
        return true;
    }
    // Activation view of `cols` columns starting at col, with enough rows for the op's row mode.
    bool act_view(int32_t idx, int32_t col, int64_t cols, int64_t rows, const char* what) {
        if (!need(idx, TensorKind::Activation, what)) return false;
        const PlanTensor& x = p.tensor(idx);
        if (col < 0 || cols < 0 || col + cols > x.dims[1]) return fail(std::string(what) + " view exceeds its tensor's columns");
        if (x.dims[0] < rows) return fail(std::string(what) + " has too few rows");
        return true;
    }
    bool matmul_weight(int32_t idx, const char* what) {
        if (!need(idx, TensorKind::Weight, what)) return false;
        if (p.tensor(idx).dtype == (uint8_t)DType::NF4) return true;
        return dense_weight(idx, what);
    }
    bool dense_weight(int32_t idx, const char* what) {
        if (!need(idx, TensorKind::Weight, what)) return false;
        uint8_t d = p.tensor(idx).dtype;
        if (d != (uint8_t)DType::F32 && d != (uint8_t)DType::BF16 && d != (uint8_t)DType::F16)
            return fail(std::string(what) + " has an unsupported dtype");
        return true;
    }
};

int64_t numel(const PlanTensor& t) {
    int64_t n = 1;
    for (int i = 0; i < t.ndim; ++i) n *= t.dims[i];
    return n;
}

} // namespace

std::string check_ops(const plan::Plan& p) {
    const auto& in = p.info();
    for (size_t i = 0; i < p.n_ops(); ++i) {
        const PlanOp& op = p.op(i);
        Checker c{p, op, ""};
        RowMode rm      = (RowMode)op.row_mode;
        int64_t rin     = rm == RowMode::OutRows ? in.logits_rows : in.max_rows;
        int64_t rout    = rm == RowMode::All ? in.max_rows : in.logits_rows;
        int64_t cols    = op.ip[0];
        switch ((OpCode)op.code) {
        case OpCode::Embed:
            if (c.need(op.in[0], TensorKind::Input, "ids") && c.dense_weight(op.in[1], "table")) {
                const PlanTensor& tab = p.tensor(op.in[1]);
                if (tab.ndim != 2 || tab.dims[0] < in.embed_vocab_limit) c.fail("table has too few rows for the vocabulary");
                else c.act_view(op.out[0], op.out_col[0], tab.dims[1], rout, "output");
            }
            break;
        case OpCode::Matmul:
            if (c.matmul_weight(op.in[1], "weight")) {
                const PlanTensor& w = p.tensor(op.in[1]);
                if (w.ndim != 2 || w.dims[1] > in.max_k) c.fail("weight must be 2-D with K <= max_k");
                else if (op.ip[5] < 0 || op.ip[5] > 1 || op.ip[6] < 0 || op.ip[6] > (int32_t)plan::MatmulVariant::Cublas || op.ip[6] == 1) c.fail("bad kernel variant");
                else if ((op.ip[5] == (int32_t)plan::MatmulVariant::Gemv4 &&
                          !((w.dtype == (uint8_t)DType::NF4 && w.dims[1] % 512 == 0) || (w.dtype == (uint8_t)DType::BF16 && w.dims[1] % 256 == 0))) ||
                         ((op.ip[6] == (int32_t)plan::MatmulVariant::Tiled64 || op.ip[6] == (int32_t)plan::MatmulVariant::TensorCore) &&
                          !(w.dims[1] % 32 == 0 && (w.dtype == (uint8_t)DType::NF4 || w.dtype == (uint8_t)DType::BF16))))
                    c.fail("kernel variant does not fit the weight's shape or dtype");
                else if (op.in[2] >= 0 && (!c.need(op.in[2], TensorKind::Weight, "bias") || p.tensor(op.in[2]).dtype != (uint8_t)DType::F32 ||
                                           numel(p.tensor(op.in[2])) != w.dims[0]))
                    c.fail("bias must be f32 [N]");
                else if (c.act_view(op.in[0], op.in_col[0], w.dims[1], rin, "input"))
                    c.act_view(op.out[0], op.out_col[0], w.dims[0], rout, "output");
            }
            break;
        case OpCode::RmsNorm:
            if (op.ip[1] <= 0 || cols <= 0 || cols % op.ip[1]) c.fail("bad cols/dim");
            else if (op.in[1] >= 0 && (!c.dense_weight(op.in[1], "weight") || numel(p.tensor(op.in[1])) != op.ip[1])) c.fail("weight size != dim");
            else if (c.act_view(op.in[0], op.in_col[0], cols, rin, "input")) c.act_view(op.out[0], op.out_col[0], cols, rout, "output");
            break;
        case OpCode::Add:
        case OpCode::GeluMul:
            if (cols <= 0) c.fail("bad cols");
            else if (c.act_view(op.in[0], op.in_col[0], cols, rin, "a") && c.act_view(op.in[1], op.in_col[1], cols, rin, "b"))
                c.act_view(op.out[0], op.out_col[0], cols, rout, "output");
            break;
        case OpCode::Scale:
        case OpCode::Softcap:
            if (cols <= 0) c.fail("bad cols");
            else if ((OpCode)op.code == OpCode::Softcap && !(op.fp[0] > 0)) c.fail("softcap must be positive");
            else if (op.in[1] >= 0 && (!c.dense_weight(op.in[1], "scalar") || numel(p.tensor(op.in[1])) < 1)) c.fail("bad scalar");
            else if (c.act_view(op.in[0], op.in_col[0], cols, rin, "input")) c.act_view(op.out[0], op.out_col[0], cols, rout, "output");
            break;
        case OpCode::Rope:
            if (op.ip[0] <= 0 || op.ip[1] <= 0 || op.ip[1] % 2) c.fail("bad heads/dim");
            else if (op.in[0] != op.out[0] || op.in_col[0] != op.out_col[0]) c.fail("rope must be in place");
            else if (c.need(op.in[1], TensorKind::Weight, "inv_freq") &&
                     (p.tensor(op.in[1]).dtype != (uint8_t)DType::F32 || numel(p.tensor(op.in[1])) != op.ip[1] / 2)) c.fail("inv_freq must be f32 [dim/2]");
            else c.act_view(op.in[0], op.in_col[0], (int64_t)op.ip[0] * op.ip[1], rin, "input");
            break;
        case OpCode::KvStore: {
            int64_t width = op.ip[0], slots = op.ip[1];
            if (width <= 0 || slots <= 0) c.fail("bad width/slots");
            else if (c.act_view(op.in[0], op.in_col[0], width, rin, "k") && c.act_view(op.in[1], op.in_col[1], width, rin, "v") &&
                     c.need(op.out[0], TensorKind::KvCache, "k cache") && c.need(op.out[1], TensorKind::KvCache, "v cache")) {
                for (int o = 0; o < 2; ++o) {
                    const PlanTensor& kv = p.tensor(op.out[o]);
                    if (kv.dims[0] != slots || kv.dims[1] != width) c.fail("cache shape disagrees with the op");
                }
                if (p.tensor(op.out[0]).dtype != p.tensor(op.out[1]).dtype) c.fail("k and v caches differ in dtype");
                if (slots < in.max_context && slots < in.max_rows) c.fail("cache ring smaller than a chunk");
            }
            break;
        }
        case OpCode::Attention: {
            int64_t heads = op.ip[0], kvh = op.ip[1], dim = op.ip[2], slots = op.ip[3], window = op.ip[4];
            if (heads <= 0 || kvh <= 0 || dim <= 0 || heads % kvh || window < 0 || window > in.max_slots || op.ip[5] < 0 || op.ip[5] > 128 || op.ip[6] < 0 || op.ip[6] > 1024)
                c.fail("bad attention parameters");
            else if (c.act_view(op.in[0], op.in_col[0], heads * dim, rin, "q") && c.need(op.in[1], TensorKind::KvCache, "k cache") &&
                     c.need(op.in[2], TensorKind::KvCache, "v cache")) {
                for (int o = 1; o < 3; ++o) {
                    const PlanTensor& kv = p.tensor(op.in[o]);
                    if (kv.dims[0] != slots || kv.dims[1] != kvh * dim) c.fail("cache shape disagrees with the op");
                }
                if (p.tensor(op.in[1]).dtype != p.tensor(op.in[2]).dtype) c.fail("k and v caches differ in dtype");
                // Every key a query can see must still be in the cache.
                if (window == 0 ? slots < in.max_context : (slots < in.max_context && slots < window + in.max_rows - 1))
                    c.fail("cache too small for the attention span");
                c.act_view(op.out[0], op.out_col[0], heads * dim, rout, "output");
            }
            break;
        }
        case OpCode::Copy: {
            auto device_ok = [&](int32_t d) { return d == -1 || (d >= 0 && p.gpu_slot(d) >= 0); };
            if (!p.hybrid()) c.fail("copy steps belong to CUDA plans whose layers span devices");
            else if (op.in[0] != op.out[0] || op.in_col[0] != op.out_col[0] || !device_ok(op.ip[1]) || !device_ok(op.ip[2]) ||
                     op.ip[1] == op.ip[2] || op.row_mode != (int32_t)RowMode::All || cols <= 0)
                c.fail("bad copy step");
            else c.act_view(op.in[0], op.in_col[0], cols, in.max_rows, "tensor");
            break;
        }
        default: c.fail("unknown op"); break;
        }
        // Cross-device plans: an op's caches lie in its device's part of the KV arena (the host part
        // for CPU-placed layers), and a GPU op's weights in the ranges its GPU uploads.
        if (c.err.empty() && p.hybrid() && (OpCode)op.code != OpCode::Copy) {
            const int dev = p.op_device(i);
            const auto* g = dev >= 0 ? &in.gpus[p.gpu_slot(dev)] : nullptr;
            for (int32_t t : {op.in[0], op.in[1], op.in[2], op.in[3], op.out[0], op.out[1]}) {
                if (t < 0) continue;
                const PlanTensor& x = p.tensor(t);
                if (x.kind == (uint8_t)TensorKind::KvCache &&
                    (g ? x.offset < g->kv_begin || x.offset + x.nbytes > g->kv_end : x.offset < in.kv_host_begin))
                    c.fail(std::string("KV cache '") + p.str(x.name) + "' is not in the " + (g ? "cuda:" + std::to_string(dev) : std::string("host")) +
                           " part of the KV arena");
                if (x.kind == (uint8_t)TensorKind::Weight && g) {
                    bool in_range = false;
                    for (const auto& [b, e] : g->weights) in_range = in_range || (x.offset >= b && x.offset + x.nbytes <= e);
                    if (!in_range)
                        c.fail(std::string("weight '") + p.str(x.name) + "' of an op on cuda:" + std::to_string(dev) +
                               " is not in the weights uploaded to that GPU");
                }
            }
        }
        if (!c.err.empty()) return "op " + std::to_string(i) + " (" + op_name((OpCode)op.code) + " '" + p.str(op.name) + "'): " + c.err;
    }
    return "";
}

namespace {
constexpr int kAllDevices = -2;
// Binds the ops of device `dev` (kAllDevices: every op) against act / kv (KV offsets from kv0).
void bind_with(g4_session* s, uint8_t* act, uint8_t* kv, uint64_t kv0, int dev) {
    const plan::Plan& p = s->engine->plan;
    s->ops.resize(p.n_ops(), BoundOp{});
    auto addr = [&](int32_t idx, int32_t col, int64_t* ld) -> void* {
        if (idx < 0) return nullptr;
        const PlanTensor& t = p.tensor(idx);
        *ld                 = t.ndim == 2 ? t.dims[1] : 0;
        uint8_t* base;
        switch ((TensorKind)t.kind) {
        case TensorKind::Weight: return (void*)p.weight_data(t);
        case TensorKind::KvCache: return kv + (t.offset - kv0) + dtype_bytes((DType)t.dtype, col);
        default: base = act; break;
        }
        return base + t.offset + dtype_bytes((DType)t.dtype, col);
    };
    for (size_t i = 0; i < p.n_ops(); ++i) {
        if (dev != kAllDevices && p.op_device(i) != dev) continue;
        BoundOp& b = s->ops[i];
        std::memset(&b, 0, sizeof b);
        b.op = &p.op(i);
        for (int k = 0; k < 4; ++k) {
            b.in[k] = addr(b.op->in[k], b.op->in_col[k], &b.in_ld[k]);
            if (b.op->in[k] >= 0) b.in_dt[k] = (DType)p.tensor(b.op->in[k]).dtype;
        }
        for (int k = 0; k < 2; ++k) b.out[k] = addr(b.op->out[k], b.op->out_col[k], &b.out_ld[k]);
    }
}
} // namespace

void bind_ops(g4_session* s) { bind_with(s, s->act, s->kv, s->kv_offset0, s->engine->plan.hybrid() ? -1 : kAllDevices); }

g4_status run_step(g4_session* s, int32_t rows, int32_t pos0, int32_t out_rows, std::string* err) {
    return run_ops(s, 0, s->ops.size(), rows, pos0, out_rows, err);
}

void bind_gpu_ops(g4_session* s, int gpu, uint8_t* gpu_act, uint8_t* gpu_kv) {
    const auto& g = s->engine->plan.info().gpus[s->engine->plan.gpu_slot(gpu)];
    bind_with(s, gpu_act, gpu_kv, g.kv_begin, gpu);
}

g4_status run_step_split(g4_session* s, const std::map<int, uint8_t*>& gpu_act, int32_t rows, int32_t pos0, int32_t out_rows,
                         std::string* err) {
    const plan::Plan& p = s->engine->plan;
    for (size_t i = 0; i < p.n_ops(); ++i) {
        const PlanOp& op = p.op(i);
        if (op.code != (uint16_t)OpCode::Copy) {
            g4_status st = run_ops(s, i, i + 1, rows, pos0, out_rows, err);
            if (st != G4_OK) return st;
            continue;
        }
        const PlanTensor& t = p.tensor(op.in[0]);
        const uint64_t off = t.offset + (uint64_t)op.in_col[0] * 4, pitch = (uint64_t)t.dims[1] * 4;
        uint8_t* dst       = op.ip[1] < 0 ? s->act : gpu_act.at(op.ip[1]);
        const uint8_t* src = op.ip[2] < 0 ? s->act : gpu_act.at(op.ip[2]);
        for (int32_t r = 0; r < rows; ++r) std::memcpy(dst + off + r * pitch, src + off + r * pitch, (size_t)op.ip[0] * 4);
    }
    return G4_OK;
}

g4_status run_ops(g4_session* s, size_t first, size_t end, int32_t rows, int32_t pos0, int32_t out_rows, std::string* err) {
    const plan::Plan& p      = s->engine->plan;
    const cpu::Context& ctx  = s->ctx;
    for (size_t i = first; i < end; ++i) {
        const BoundOp& b = s->ops[i];
        if (s->cancel.load(std::memory_order_relaxed)) {
            *err = "cancelled";
            return G4_ERR_CANCELLED;
        }
        const PlanOp& op = *b.op;
        RowMode rm       = (RowMode)op.row_mode;
        int32_t n        = rm == RowMode::All ? rows : out_rows;
        if (n <= 0) continue;
        int64_t in_row0  = rm == RowMode::TailIn ? rows - out_rows : 0;
        auto I           = [&](int k) { return (float*)b.in[k] + in_row0 * b.in_ld[k]; };
        auto O           = [&](int k) { return (float*)b.out[k]; };
        switch ((OpCode)op.code) {
        case OpCode::Embed: {
            const PlanTensor& tab = p.tensor(op.in[1]);
            cpu::embed(ctx, {s->ids, b.in[1], b.in_dt[1], tab.dims[0], tab.dims[1], op.fp[0], O(0), b.out_ld[0], n});
            if ((int32_t)i == s->embed_op && s->media)   // image/audio placeholders: the tower's rows, unscaled
                for (int32_t k = 0; k < s->media->step_n; ++k)
                    std::memcpy(O(0) + (int64_t)s->media->step_row[k] * b.out_ld[0], s->media->step_src[k], sizeof(float) * tab.dims[1]);
            break;
        }
        case OpCode::Matmul: {
            const PlanTensor& w = p.tensor(op.in[1]);
            if (w.quant_flags & plan::kQuantTiled32) {   // the GPU's fused decode kernels' layout: CPU kernels read row-major
                *err = "op '" + std::string(p.str(op.name)) + "': its NF4 weight is stored tiled for the GPU's fused MLP / attention-o kernels (sm_90 plans); "
                       "the CPU kernels cannot read it (compile with --deterministic for a plan whose layers may run on the CPU)";
                return G4_ERR_INTERNAL;
            }
            MatmulArgs ma{I(0), b.in_ld[0], b.in[1], b.in_dt[1], w.dims[0], w.dims[1], O(0), b.out_ld[0], n};
            ma.nf4_double_quant = (w.quant_flags & plan::kQuantDoubleQuant) != 0;
            cpu::matmul(ctx, ma);
            if (b.in[2])   // LoRA bias, broadcast over rows
                cpu::add(ctx, {O(0), b.out_ld[0], (const float*)b.in[2], 0, O(0), b.out_ld[0], n, (int32_t)w.dims[0]});
            break;
        }
        case OpCode::RmsNorm:
            cpu::rms_norm(ctx, {I(0), b.in_ld[0], b.in[1], b.in_dt[1], O(0), b.out_ld[0], n, op.ip[0], op.ip[1], op.fp[0]});
            break;
        case OpCode::Add: cpu::add(ctx, {I(0), b.in_ld[0], I(1), b.in_ld[1], O(0), b.out_ld[0], n, op.ip[0]}); break;
        case OpCode::GeluMul: cpu::gelu_mul(ctx, {I(0), b.in_ld[0], I(1), b.in_ld[1], O(0), b.out_ld[0], n, op.ip[0]}); break;
        case OpCode::Scale:
            cpu::scale(ctx, {I(0), b.in_ld[0], O(0), b.out_ld[0], n, op.ip[0], op.fp[0], b.in[1], b.in_dt[1], 0.0f});
            break;
        case OpCode::Softcap:
            cpu::softcap(ctx, {I(0), b.in_ld[0], O(0), b.out_ld[0], n, op.ip[0], 1.0f, nullptr, DType::F32, op.fp[0]});
            break;
        case OpCode::Rope:
            cpu::rope(ctx, {I(0), b.in_ld[0], (const float*)b.in[1], n, op.ip[0], op.ip[1], pos0});
            break;
        case OpCode::KvStore:
            cpu::kv_store(ctx, {I(0), b.in_ld[0], I(1), b.in_ld[1], b.out[0], b.out[1], n, op.ip[0], op.ip[1], pos0,
                                (DType)p.tensor(op.out[0]).dtype});
            break;
        case OpCode::Attention:
            cpu::attention(ctx, {I(0), b.in_ld[0], b.in[1], b.in[2], O(0), b.out_ld[0], n, op.ip[0], op.ip[1], op.ip[2], op.ip[3],
                                 op.ip[4], pos0, op.fp[0], nullptr, b.in_dt[1]});
            break;
        default: *err = "internal: unknown op"; return G4_ERR_INTERNAL;
        }
    }
    return G4_OK;
}

} // namespace g4::rt
