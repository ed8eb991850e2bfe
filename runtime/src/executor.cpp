// Op validation, binding and replay on the CPU (Eigen kernels). A step runs the whole program over
// `rows` tokens starting at position pos0; ops in RowMode::TailIn/OutRows touch only the rows whose
// logits are wanted. Ops are replayed through their definitions (op_exec.h) but for Embed and Matmul (and
// encoder programs' GeluMul, fused clamps and norms, and SelfAttention's bf16 choice), whose replay is not
// one kernel on the op's operands.
#include "runtime/src/executor.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/q16.h"
#include "runtime/plan/op_params.h"
#include "runtime/src/bind_op.h"
#include "runtime/src/cpu_profile.h"
#include "runtime/src/env.h"
#include "runtime/src/op_exec.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>

namespace g4::rt {

using plan::PlanOp;
using plan::PlanTensor;
using plan::RowMode;
using plan::TensorKind;

std::string check_ops(const plan::Plan& p) {
    return plan::check_program(p);
}

namespace {
constexpr int kAllDevices = -2;

// `--cpu-precision fast` (META policy): GeluMul through Eigen's vectorised tanh (std::tanh in `f32`), and the
// attention of prefill chunks through key blocks shared by the query heads of a kv head. False: not such an
// op.
bool run_fast_op(const PlanOp& op, const cpu::Context& ctx, const OpIo& io) {
    if ((OpCode)op.code == OpCode::GeluMul) {
        cpu::gelu_mul_vec(
            ctx, plan::OpTable<plan::GeluMulParams>::args(io, plan::params<plan::GeluMulParams>(op)));
        return true;
    }
    if ((OpCode)op.code == OpCode::Attention && io.rows > q16::kMaxRows) {
        cpu::attention_prefill(
            ctx, plan::OpTable<plan::AttentionParams>::args(io, plan::params<plan::AttentionParams>(op)));
        return true;
    }
    return false;
}

// Binds ops [first, end) of device `dev` (kAllDevices: every op) against act / kv (KV offsets from kv0).
void bind_with(g4_session* s, uint8_t* act, uint8_t* kv, uint64_t kv0, int dev, size_t first, size_t end) {
    const plan::Plan& p = s->engine->plan;
    s->ops.resize(p.n_ops_all(), BoundOp{});
    auto base = [&](const PlanTensor& t) -> void* {
        switch ((TensorKind)t.kind) {
        case TensorKind::Weight:
            return (void*)p.weight_data(t);
        case TensorKind::KvCache:
            // A cache below kv0 lives on another device: not addressable from this binding.
            return t.offset < kv0 ? nullptr : kv + (t.offset - kv0);
        default:
            return act + t.offset;
        }
    };
    for (size_t i = first; i < end; ++i)
        if (dev == kAllDevices || p.op_device(i) == dev) s->ops[i] = bind_op(p, p.op(i), base);
}
} // namespace

void bind_ops(g4_session* s) {
    bind_with(s, s->act, s->kv, s->kv_offset0, s->engine->plan.hybrid() ? -1 : kAllDevices, 0,
              s->engine->plan.n_ops());
}

void bind_program(g4_session* s, size_t prog, uint8_t* arena) {
    const plan::PlanProgram& g = s->engine->plan.program(prog);
    bind_with(s, arena, nullptr, 0, kAllDevices, g.op_begin, g.op_end);
}

g4_status run_step(g4_session* s, int32_t rows, int32_t pos0, int32_t out_rows, std::string* err) {
    return run_ops(s, 0, s->engine->plan.n_ops(), rows, pos0, out_rows, err);
}

void bind_gpu_ops(g4_session* s, int gpu, uint8_t* gpu_act, uint8_t* gpu_kv) {
    const auto& g = s->engine->plan.info().gpus[s->engine->plan.gpu_slot(gpu)];
    bind_with(s, gpu_act, gpu_kv, g.kv_begin, gpu, 0, s->engine->plan.n_ops());
}

g4_status run_step_split(g4_session* s, const std::map<int, uint8_t*>& gpu_act, int32_t rows, int32_t pos0,
                         int32_t out_rows, std::string* err) {
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
        const auto c       = plan::params<plan::CopyParams>(op);
        uint8_t* dst       = c.dst_device < 0 ? s->act : gpu_act.at(c.dst_device);
        const uint8_t* src = c.src_device < 0 ? s->act : gpu_act.at(c.src_device);
        for (int32_t r = 0; r < rows; ++r)
            std::memcpy(dst + off + r * pitch, src + off + r * pitch, (size_t)c.cols * 4);
    }
    return G4_OK;
}

namespace {
// Op i of a text step over n of its rows (the op's row mode applied), input rows from in_row0.
g4_status run_text_op(g4_session* s, size_t i, int32_t n, int64_t in_row0, int32_t pos0, std::string* err) {
    const plan::Plan& p     = s->engine->plan;
    const cpu::Context& ctx = s->ctx;
    const BoundOp& b        = s->ops[i];
    const PlanOp& op        = *b.op;
    {
        auto I = [&](int k) { return (float*)b.in[k] + in_row0 * b.in_ld[k]; };
        auto O = [&](int k) { return (float*)b.out[k]; };
        switch ((OpCode)op.code) {
        case OpCode::Embed: {
            const PlanTensor& tab = p.tensor(op.in[1]);
            cpu::embed(ctx, {s->ids, b.in[1], b.in_dt[1], tab.dims[0], tab.dims[1],
                             plan::params<plan::EmbedParams>(op).scale, O(0), b.out_ld[0], n});
            if ((int32_t)i == s->embed_op && s->media) // image/audio placeholders: the tower's rows, unscaled
                for (int32_t k = 0; k < s->media->step_n; ++k)
                    std::memcpy(O(0) + (int64_t)s->media->step_row[k] * b.out_ld[0], s->media->step_src[k],
                                sizeof(float) * tab.dims[1]);
            break;
        }
        case OpCode::Matmul: {
            const PlanTensor& w = p.tensor(op.in[1]);
            if (w.quant_flags &
                plan::kQuantTiled32) { // the GPU's fused decode kernels' layout: CPU kernels read row-major
                *err = "op '" + std::string(p.str(op.name)) +
                       "': its NF4 weight is stored tiled for the GPU's fused MLP / attention-o kernels "
                       "(sm_90 plans); "
                       "the CPU kernels cannot read it (compile with --deterministic for a plan whose layers "
                       "may run on the CPU)";
                return G4_ERR_INTERNAL;
            }
            MatmulArgs ma{I(0), b.in_ld[0], b.in[1], b.in_dt[1], w.dims[0], w.dims[1], O(0), b.out_ld[0], n};
            ma.nf4_double_quant = (w.quant_flags & plan::kQuantDoubleQuant) != 0;
            ma.int16_x          = s->engine->cpu_int16;
            ma.bf16_rows        = s->engine->cpu_bf16_rows;
            cpu::matmul(ctx, ma);
            if (b.in[2]) // LoRA bias, broadcast over rows
                cpu::add(ctx, {O(0), b.out_ld[0], (const float*)b.in[2], 0, O(0), b.out_ld[0], n,
                               (int32_t)w.dims[0]});
            break;
        }
        default:
            if (s->engine->cpu_int16 && run_fast_op(op, ctx, op_io(p, b, n, in_row0, pos0, nullptr))) break;
            if (run_op(op, ctx, op_io(p, b, n, in_row0, pos0, nullptr))) break;
            *err = "internal: unknown op";
            return G4_ERR_INTERNAL;
        }
    }
    return G4_OK;
}
} // namespace

g4_status run_ops(g4_session* s, size_t first, size_t end, int32_t rows, int32_t pos0, int32_t out_rows,
                  std::string* err) {
    CpuProfile* prof = s->profile ? &s->profile->of(rows) : nullptr;
    if (prof && first == 0) prof->step(rows);
    for (size_t i = first; i < end; ++i) {
        if (s->cancel.load(std::memory_order_relaxed)) {
            *err = "cancelled";
            return G4_ERR_CANCELLED;
        }
        const PlanOp& op = *s->ops[i].op;
        const RowMode rm = (RowMode)op.row_mode;
        const int32_t n  = rm == RowMode::All ? rows : out_rows;
        if (n <= 0) continue;
        const int64_t in_row0 = rm == RowMode::TailIn ? rows - out_rows : 0;
        const auto t0 = prof ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
        const g4_status st = run_text_op(s, i, n, in_row0, pos0, err);
        if (st != G4_OK) return st;
        if (prof)
            prof->add(
                op, s->engine->plan, n, pos0,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return G4_OK;
}

namespace {
// The CPU kernel an encoder program's Matmul op names (ip4, compiler/vision graph): the library's matmul,
// the many-row fp32 GEMM, or the bf16 GEMM. Where the bf16 GEMM is not the faster one
// (cpu::gemm_bf16_preferred: no AMX tiles, and AVX-512 BF16 no faster than fp32 FMAs or absent) the fp32
// GEMM runs on the same bf16 weights instead: closer to float32 too.
void encoder_matmul(const cpu::Context& ctx, const MatmulArgs& m, int32_t kernel) {
    if (kernel == 2 && cpu::gemm_bf16_preferred())
        cpu::matmul_gemm_bf16(ctx, m);
    else if (kernel >= 1)
        cpu::matmul_gemm(ctx, m);
    else
        cpu::matmul(ctx, m);
}

} // namespace

std::vector<uint8_t> find_clamp_fusion(const plan::Plan& p) {
    std::vector<uint8_t> f(p.n_ops_all(), 0);
    auto bf16_matmul = [&](const PlanOp& op) {
        return (OpCode)op.code == OpCode::Matmul && plan::params<plan::MatmulParams>(op).cpu_kernel == 2;
    };
    for (size_t g = 1; g < p.n_programs(); ++g) {
        const plan::PlanProgram& pr = p.program(g);
        for (size_t i = pr.op_begin; i < pr.op_end; ++i) {
            const PlanOp& c = p.op(i);
            if ((OpCode)c.code != OpCode::Clamp) continue;
            const int32_t cols = plan::params<plan::ClampParams>(c).cols;
            // No op after the next one reads the clamp's output, nor does the program's caller.
            auto unread_later = [&] {
                bool unread = pr.outputs[0] != c.out[0] && pr.outputs[1] != c.out[0];
                for (size_t j = i + 2; unread && j < pr.op_end; ++j)
                    for (int k = 0; k < 4; ++k)
                        unread = unread && p.op(j).in[k] != c.out[0];
                return unread;
            };
            if (i + 1 < pr.op_end && bf16_matmul(p.op(i + 1))) { // clamp(x) -> xc, then xc . W^T
                const PlanOp& m = p.op(i + 1);
                if (m.row_mode == c.row_mode && m.in[0] == c.out[0] && m.in_col[0] == c.out_col[0] &&
                    p.tensor(m.in[1]).dims[1] == cols && m.in[2] != c.out[0] && unread_later())
                    f[i] = kClampIntoNext;
            }
            if (i + 1 < pr.op_end &&
                (OpCode)p.op(i + 1).code == OpCode::RmsNorm) { // clamp(x) -> xc, norm(xc)
                const PlanOp& m = p.op(i + 1);
                const bool in   = m.row_mode == c.row_mode && m.in[0] == c.out[0] &&
                                m.in_col[0] == c.out_col[0] && m.in[1] != c.out[0] &&
                                plan::params<plan::RmsNormParams>(m).cols == cols;
                // The norm's output replaces the clamp's whole (in place), or nothing after reads it.
                if (in && ((m.out[0] == c.out[0] && m.out_col[0] == c.out_col[0]) || unread_later()))
                    f[i] = kClampIntoNorm;
            }
            if (i > pr.op_begin && bf16_matmul(p.op(i - 1))) { // y = x . W^T, then clamp(y) in place
                const PlanOp& m = p.op(i - 1);
                if (m.row_mode == c.row_mode && m.in[2] < 0 && c.in[0] == m.out[0] && c.out[0] == m.out[0] &&
                    c.in_col[0] == m.out_col[0] && c.out_col[0] == m.out_col[0] &&
                    p.tensor(m.in[1]).dims[0] == cols)
                    f[i] = kClampIntoPrev;
            }
        }
    }
    return f;
}

g4_status run_program(g4_session* s, size_t prog, const cpu::Context& ctx, const int32_t* counts,
                      std::string* err) {
    const plan::Plan& p        = s->engine->plan;
    const plan::PlanProgram& g = p.program(prog);
    for (int k = 0; k < plan::kMaxRowCounts; ++k)
        if (counts[k] < 0 || counts[k] > g.max_rows[k]) {
            *err = std::string("program '") + p.str(g.name) + "': row count " + std::to_string(k) + " is " +
                   std::to_string(counts[k]) + ", at most " + std::to_string(g.max_rows[k]);
            return G4_ERR_INVALID_ARGUMENT;
        }
    std::unique_ptr<CpuProfile> prof(env::cpu_profile() ? new CpuProfile() : nullptr);
    const std::vector<uint8_t>& fz = s->engine->clamp_fusion;
    auto fusion                    = [&](size_t i) { return i < fz.size() ? fz[i] : (uint8_t)0; };
    // Whether Matmul op m over n rows runs a bf16 GEMM that applies clamps (as encoder_matmul picks it).
    auto fused = [&](size_t m, int32_t n) {
        MatmulArgs probe{};
        probe.dt = s->ops[m].in_dt[1], probe.rows = n;
        return plan::params<plan::MatmulParams>(*s->ops[m].op).cpu_kernel == 2 &&
               cpu::gemm_bf16_preferred() && cpu::gemm_bf16_clamps(ctx, probe);
    };
    for (size_t i = g.op_begin; i < g.op_end; ++i) {
        const BoundOp& b = s->ops[i];
        const auto t0    = std::chrono::steady_clock::now();
        if (s->cancel.load(std::memory_order_relaxed)) {
            *err = "cancelled";
            return G4_ERR_CANCELLED;
        }
        const PlanOp& op = *b.op;
        const int32_t n  = counts[op.row_mode - plan::kRowCountBase];
        if (n <= 0) continue;
        auto I = [&](int k) { return (float*)b.in[k]; };
        auto O = [&](int k) { return (float*)b.out[k]; };
        switch ((OpCode)op.code) {
        case OpCode::Clamp:
            if (((fusion(i) & kClampIntoNext) && fused(i + 1, n)) ||
                ((fusion(i) & kClampIntoPrev) && fused(i - 1, n)) || (fusion(i) & kClampIntoNorm))
                continue; // the matmul or the norm applies it
            if (!run_op(op, ctx, op_io(p, b, n, 0, 0, counts))) {
                *err = "internal: clamp";
                return G4_ERR_INTERNAL;
            }
            break;
        case OpCode::Matmul: {
            const PlanTensor& w = p.tensor(op.in[1]);
            MatmulArgs ma{I(0), b.in_ld[0], b.in[1], b.in_dt[1], w.dims[0], w.dims[1], O(0), b.out_ld[0], n};
            ma.nf4_double_quant = (w.quant_flags & plan::kQuantDoubleQuant) != 0;
            if (i > g.op_begin && (fusion(i - 1) & kClampIntoNext) &&
                fused(i, n)) { // read x before the clamp
                const auto cp = plan::params<plan::ClampParams>(*s->ops[i - 1].op);
                ma.x = (const float*)s->ops[i - 1].in[0], ma.ldx = s->ops[i - 1].in_ld[0];
                ma.x_lo = cp.lo, ma.x_hi = cp.hi;
            }
            if (i + 1 < g.op_end && (fusion(i + 1) & kClampIntoPrev) && fused(i, n)) {
                const auto cp = plan::params<plan::ClampParams>(*s->ops[i + 1].op);
                ma.y_lo = cp.lo, ma.y_hi = cp.hi;
            }
            encoder_matmul(ctx, ma, plan::params<plan::MatmulParams>(op).cpu_kernel);
            if (b.in[2])
                cpu::add(ctx, {O(0), b.out_ld[0], (const float*)b.in[2], 0, O(0), b.out_ld[0], n,
                               (int32_t)w.dims[0]});
            break;
        }
        case OpCode::RmsNorm:
            if (i > g.op_begin && (fusion(i - 1) & kClampIntoNorm)) { // read x before the clamp
                const auto np    = plan::params<plan::RmsNormParams>(op);
                const BoundOp& c = s->ops[i - 1];
                const auto cp    = plan::params<plan::ClampParams>(*c.op);
                cpu::rms_norm(ctx, {(const float*)c.in[0], c.in_ld[0], b.in[1], b.in_dt[1], O(0), b.out_ld[0],
                                    n, np.cols, np.dim, np.eps, cp.lo, cp.hi});
            } else if (!run_op(op, ctx, op_io(p, b, n, 0, 0, counts))) {
                *err = "internal: rms_norm";
                return G4_ERR_INTERNAL;
            }
            break;
        case OpCode::SelfAttention: {
            // The bf16 products only where the bf16 kernels are the faster ones, as for the matmuls.
            PlanOp sa = op;
            if (!cpu::gemm_bf16_preferred()) {
                auto ap = plan::params<plan::SelfAttentionParams>(op);
                ap.bf16 = 0;
                plan::set_params(sa, ap);
            }
            if (!run_op(sa, ctx, op_io(p, b, n, 0, 0, counts))) {
                *err = "internal: self_attention";
                return G4_ERR_INTERNAL;
            }
            break;
        }
        case OpCode::GeluMul:
            cpu::gelu_mul_vec(ctx, {I(0), b.in_ld[0], I(1), b.in_ld[1], O(0), b.out_ld[0], n,
                                    plan::params<plan::GeluMulParams>(op).cols});
            break;
        default:
            if (run_op(op, ctx, op_io(p, b, n, 0, 0, counts))) break;
            *err = "internal: op not supported in an encoder program";
            return G4_ERR_INTERNAL;
        }
        if (prof)
            prof->add(
                op, p, n, 0,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    if (prof) prof->print((std::string("program '") + p.str(g.name) + "'").c_str());
    return G4_OK;
}

} // namespace g4::rt
