// The CUDA backend's batched decode step (runtime/src/batch.h): the op-by-op path of prefill chunks over the
// n sessions' rows in the first session's activation arena, on its stream. The per-sequence ops (rope, KV
// store, attention) run once over all rows (kernels/cuda/batch_rows.cu), each row at its session's position
// and in its session's KV cache, or, where the plan's module lacks those kernels, once per session on its
// row. Its buffers are carved with the session's at its creation (batch_reserve). Matmuls of 2..16 rows read
// each weight once in its stored layout (g4_mm_rows_*, g4_mm_rows_tcs_*). A group that steps twice in a row
// with the same sessions is captured as a CUDA graph and replayed while it stays the same: its step records
// and token ids are copied from pinned host slots the graph reads at each replay. Plans whose layers span
// devices have no batched step.
#include "runtime/plan/op_params.h"
#include "runtime/src/batch.h"
#include "runtime/src/cuda/backend.h"
#include "runtime/src/cuda/batch_fused.h"
#include "runtime/src/cuda/driver.h"
#include "runtime/src/cuda/launch.h"
#include "runtime/src/cuda/state.h"
#include "runtime/src/cuda/workspace.h"
#include "runtime/src/engine.h"
#include "runtime/src/env.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <vector>

namespace g4::cuda_rt {

using plan::PlanOp;
using plan::TensorKind;

namespace {

// Op i of the step for session sj, row j of the step: activations of the step's arena (st0's lane 0) at
// row j, caches of sj's lane 0, step record `step` (one row at sj's position), launched on st0's stream.
g4_status launch_for_session(SessionState* st0, SessionState* sj, const plan::Plan& p, size_t i, int32_t j,
                             CUdeviceptr step, std::string* err) {
    const PlanOp& op = p.op(i);
    Lane& l0         = st0->lanes[0];
    sj->cur          = &sj->lanes[0];
    auto operand     = [&](int32_t idx, int32_t col) -> CUdeviceptr {
        if (idx < 0) return 0;
        switch ((TensorKind)p.tensor(idx).kind) {
        case TensorKind::KvCache:
            return addr(sj, p, idx, col);
        case TensorKind::Weight:
            return addr(st0, p, idx, col);
        default:
            return addr(st0, p, idx, col) + (uint64_t)j * ld_of(p, idx) * 4;
        }
    };
    CUdeviceptr in0 = operand(op.in[0], op.in_col[0]), in1 = operand(op.in[1], op.in_col[1]),
                in2 = operand(op.in[2], op.in_col[2]), out0 = operand(op.out[0], op.out_col[0]),
                out1 = operand(op.out[1], op.out_col[1]);
    long ld0 = ld_of(p, op.in[0]), ld1 = ld_of(p, op.in[1]), ldo = ld_of(p, op.out[0]);
    const OpArgs a{st0, p,   l0,  l0.g->k, i,    op,  1,   op.row_mode, step,
                   in0, in1, in2, out0,    out1, ld0, ld1, ldo};
    CUresult r = 0;
    switch ((OpCode)op.code) {
    case OpCode::Rope: {
        const auto rp = plan::params<plan::RopeParams>(op);
        int dim       = rp.dim;
        r             = a.go(a.K.rope, 1, (unsigned)rp.heads, (unsigned)std::max(32, dim / 2),
                             {&step, &in0, &ld0, &in1, &dim});
        break;
    }
    case OpCode::KvStore: {
        const auto kp = plan::params<plan::KvStoreParams>(op);
        int width = kp.width, slots = kp.slots, kvdt = dt_code(p, op.out[0]);
        r = a.go(a.K.kv, 1, 1, 256, {&step, &in0, &ld0, &in1, &ld1, &out0, &out1, &width, &slots, &kvdt});
        break;
    }
    case OpCode::Attention:
        if (g4_status g = launch_attention(a, &r, err); g != G4_OK) return g;
        break;
    default:
        *err = "internal: op '" + std::string(p.str(op.name)) + "' has no per-session launch";
        return G4_ERR_INTERNAL;
    }
    if (r != 0) {
        *err = "CUDA error " + error_name(r) + " launching op '" + p.str(op.name) + "' of a batched step";
        return G4_ERR_INTERNAL;
    }
    return G4_OK;
}

// Per-sequence op i over all n rows in one launch (kernels/cuda/batch_rows.cu): the step's records and the
// sessions' KV arena offsets from the group's device array. *done false: the op has no such launch (an
// attention whose decode row does not fit g4_attn_decode); the caller launches it once per session.
g4_status launch_rows(SessionState* st0, const plan::Plan& p, size_t i, int32_t n, bool* done,
                      std::string* err) {
    const PlanOp& op             = p.op(i);
    Lane& l0                     = st0->lanes[0];
    const Kernels& K             = l0.g->k;
    SessionState::BatchGroup& bg = st0->batch;
    st0->cur                     = &l0;
    *done                        = true;
    CUdeviceptr rec = bg.steps, dl = bg.steps + SessionState::BatchGroup::kDeltaAt, part = l0.part;
    CUdeviceptr in0 = addr(st0, p, op.in[0], op.in_col[0]), in1 = addr(st0, p, op.in[1], op.in_col[1]),
                in2 = addr(st0, p, op.in[2], op.in_col[2]), out0 = addr(st0, p, op.out[0], op.out_col[0]),
                out1 = addr(st0, p, op.out[1], op.out_col[1]);
    long ld0 = ld_of(p, op.in[0]), ld1 = ld_of(p, op.in[1]), ldo = ld_of(p, op.out[0]);
    auto go    = [&](CUfunction f, unsigned gx, unsigned gy, unsigned bx, std::initializer_list<void*> args,
                  unsigned gz) { return launch(st0, f, gx, gy, bx, const_cast<void**>(args.begin()), gz); };
    CUresult r = 0;
    switch ((OpCode)op.code) {
    case OpCode::Rope: {
        const auto rp = plan::params<plan::RopeParams>(op);
        int dim       = rp.dim;
        r             = go(K.rope_rows, (unsigned)n, (unsigned)rp.heads, (unsigned)std::max(32, dim / 2),
                           {&rec, &in0, &ld0, &in1, &dim}, 1);
        break;
    }
    case OpCode::KvStore: {
        const auto kp = plan::params<plan::KvStoreParams>(op);
        int width = kp.width, slots = kp.slots, kvdt = dt_code(p, op.out[0]);
        r = go(K.kv_rows, (unsigned)n, 1, 256,
               {&rec, &dl, &in0, &ld0, &in1, &ld1, &out0, &out1, &width, &slots, &kvdt}, 1);
        break;
    }
    case OpCode::Attention: {
        const int kvdt = dt_code(p, op.in[1]);
        const auto ap  = plan::params<plan::AttentionParams>(op);
        // The partials of the n rows go to the first session's attention workspace, sized for a lone decode
        // step's heads x splits x (dim + 2) at least: each row splits its keys n times fewer ways (the grid
        // keeps its blocks; the merge sums the same keys).
        int dsp        = std::max(1, std::max(1, ap.decode_splits) / n);
        long part_rows = (long)ap.heads * dsp * (ap.dim + 2);
        if (!decode_attention_fits(p, op, kvdt) || (uint64_t)part_rows * n > l0.part_floats) {
            *done = false;
            return G4_OK;
        }
        int heads = ap.heads, kvh = ap.kv_heads, dim = ap.dim, slots = ap.slots, window = ap.window;
        float scale = ap.scale;
        r           = go(K.attn_rows[kvdt], (unsigned)kvh, (unsigned)dsp, 256,
                         {&rec, &dl, &in0, &ld0, &in1, &in2, &heads, &kvh, &dim, &slots, &window, &scale, &dsp, &part,
                          &part_rows},
                         (unsigned)n);
        // The merge at 256 threads a block (the prefill merge's), not the lone decode step's 1024: the n
        // rows' blocks then fit one wave (E2B on an H200, 16 sessions: 3748 -> 3883 tok/s,
        // docs/performance.md).
        if (r == 0)
            r = go(K.merge_rows, (unsigned)heads, (unsigned)(dim + 63) / 64, merge_threads(false),
                   {&rec, &part, &part_rows, &heads, &dim, &dsp, &out0, &ldo, &window}, (unsigned)n);
        break;
    }
    default:
        *done = false;
        return G4_OK;
    }
    if (r != 0) {
        *err = "CUDA error " + error_name(r) + " launching op '" + p.str(op.name) + "' of a batched step";
        return G4_ERR_INTERNAL;
    }
    return G4_OK;
}

} // namespace

g4_status bind_batch_kernels(const ModuleKernels& m, Kernels& k, std::string* err) {
    m.get_optional(&k.rope_rows, "g4_rope_rows");
    m.get_optional(&k.kv_rows, "g4_kv_store_rows");
    m.get_optional(&k.attn_rows[0], "g4_attn_decode_rows");
    m.get_optional(&k.attn_rows[1], "g4_attn_decode_rows_bf16");
    m.get_optional(&k.merge_rows, "g4_attention_merge_rows");
    return bind_batch_fused_kernels(m, k, err);
}

bool batched_steps(const g4_engine* e) {
    return !e->plan.hybrid() && rt::env::cuda_batch() != rt::env::CudaBatch::Off;
}

BatchRows batch_rows(const EngineState* es) {
    // Groups of at most 16 rows, the tensor-core row matmuls' (products split in two bf16 each, close to
    // float32); 8 with the float32 ones of older plans' modules. More rows would take the prefill's bf16
    // tensor-core or cuBLAS tier, whose bf16 operands moved the tiny fixture's logits 4e-3..1.5e-2 from a
    // lone decode step's and flipped a near-tied greedy token (measured on an H200).
    const Kernels& K    = es->gpus[0].k;
    const bool tc       = K.mm_rows_tc_nf4 && K.mm_rows_tc_bf16;
    const int32_t group = tc ? SessionState::BatchGroup::kMaxRows : 8;
    if (rt::env::cuda_batch() == rt::env::CudaBatch::All) return {group, 2};
    // Groups of 2..8 rows run the float32 row kernels: 0.55x-0.86x the sessions' own decode graphs on an
    // H200; 9 rows on the tensor-core ones 1.46x (docs/runtime.md). Without those kernels every group is of
    // at most 8 rows, so none is batched.
    return {group, tc ? 9 : INT32_MAX};
}

namespace {

// Whether the decode schedule's records cover the program's ops in order, each op once (then a batched step
// can walk them).
bool schedule_covers(const plan::Plan& p) {
    size_t next = 0;
    for (size_t li = 0; li < p.n_launches(); ++li) {
        const plan::CudaLaunch& l = p.launch(li);
        if (l.op < 0 || (size_t)l.op != next || l.count == 0) return false;
        next += l.count;
    }
    return p.n_launches() > 0 && next == p.n_ops();
}

// An op's label in the batched step's profile: the op, and a matmul's weight dtype and shape.
std::string op_label(const plan::Plan& p, size_t i, bool rows) {
    const PlanOp& op = p.op(i);
    std::string s    = op_name((OpCode)op.code);
    if (op.code == (uint16_t)OpCode::Matmul && op.in[1] >= 0) {
        const plan::PlanTensor& w = p.tensor(op.in[1]);
        s += std::string(w.dtype == (uint8_t)DType::NF4    ? " nf4 "
                         : w.dtype == (uint8_t)DType::BF16 ? " bf16 "
                                                           : " ") +
             std::to_string(w.dims[0]) + "x" + std::to_string(w.dims[1]);
    }
    if (rows && rt::op_per_sequence(op.code)) s += " rows";
    return s;
}

// Enqueues the step of sessions ss[0..n) on st0's stream: the step records and token ids from the pinned
// host slots (written before), every op, the logits rows back to st0's pinned logits. The plan's step buffer
// of st0 points at the group's records while the ops are enqueued (ops shared by the rows read record 0).
// Where the module has the row kernels and the decode schedule covers the program, the step walks the
// schedule: Gemv, GatedProj and ResNorm records and the gate/up pair of Mlp records run fused kernels over
// all rows (batch_fused.h), every other record its ops one by one. profile: an event after each launch (the
// capture of a profiled step).
g4_status enqueue_group(g4_session* const* ss, int32_t n, bool profile, std::string* err) {
    g4_session* s0               = ss[0];
    SessionState* st0            = session_of(s0);
    const plan::Plan& p          = s0->engine->plan;
    const auto& info             = p.info();
    const Driver* d              = st0->e->d;
    Lane& l0                     = st0->lanes[0];
    SessionState::BatchGroup& bg = st0->batch;
    constexpr uint64_t kStep     = sizeof(SessionState::Step);
    CU_TRY(d->cuMemcpyHtoDAsync(bg.steps, bg.host_steps, SessionState::BatchGroup::kBytes, l0.stream),
           "copying the step records");
    CU_TRY(d->cuMemcpyHtoDAsync(l0.act + p.tensor(info.ids_tensor).offset, st0->host_ids, (size_t)n * 4,
                                l0.stream),
           "copying token ids");
    st0->after_node  = true; // no programmatic edge from a copy
    const Kernels& K = l0.g->k;
    const bool rows  = K.rope_rows && K.kv_rows && K.attn_rows[0] && K.attn_rows[1] && K.merge_rows;
    size_t n_ev      = 0;
    auto mark        = [&](const std::string& label) -> g4_status {
        if (!profile) return G4_OK;
        while (bg.ev.size() < n_ev + 2) {
            CUevent ev = nullptr;
            CU_TRY(d->cuEventCreate(&ev, 0), "cuEventCreate");
            bg.ev.push_back(ev);
        }
        if (n_ev == 0) CU_TRY(d->cuEventRecordWithFlags(bg.ev[0], l0.stream, 1), "recording an event");
        CU_TRY(d->cuEventRecordWithFlags(bg.ev[++n_ev], l0.stream, 1), "recording an event");
        bg.ev_label.resize(n_ev);
        bg.ev_label[n_ev - 1] = label;
        return G4_OK;
    };
    if (profile) {
        bg.ev_label.clear();
        if (g4_status g = mark("token ids"); g != G4_OK) return g;
    }
    // Walking the schedule: op_by_op marks the ops of records run one by one; a matmul's K splits' sum may
    // run later ops (sum_epilogue), which ran marks; next_rn is the ResNorm record after the record walked,
    // which its last op's sum may run (rn_ran).
    const bool walk = rows && schedule_covers(p);
    std::vector<uint8_t> op_by_op(walk ? p.n_ops() : 0), ran(walk ? p.n_ops() : 0);
    const plan::CudaLaunch* next_rn = nullptr;
    size_t rec_last                 = SIZE_MAX; // the last op of the record walked
    bool rn_ran                     = false;
    auto run_op                     = [&](size_t i) -> g4_status {
        if (walk && ran[i]) return G4_OK;
        size_t r0 = SIZE_MAX, r1 = SIZE_MAX;
        const bool epi =
            walk && sum_epilogue(st0, p, i, i == rec_last ? next_rn : nullptr, op_by_op, &r0, &r1);
        const auto kind = st0->sum_epi.kind;
        g4_status g     = G4_OK;
        bool done       = false;
        if (!rt::op_per_sequence(p.op(i).code)) {
            g    = launch_op(s0, i, n, n, err);
            done = true;
        } else if (rows) {
            g = launch_rows(st0, p, i, n, &done, err);
        }
        const bool one_launch = done;
        for (int32_t j = 0; j < n && g == G4_OK && !done; ++j)
            g = launch_for_session(st0, session_of(ss[j]), p, i, j, bg.steps + (uint64_t)(1 + j) * kStep,
                                                       err);
        std::string label = op_label(p, i, one_launch && rt::op_per_sequence(p.op(i).code));
        if (st0->mlp_pair.done) label += " +up +gelu";
        if (epi && st0->sum_epi.kind == SessionState::SumEpilogue::None) { // applied
            if (kind == SessionState::SumEpilogue::ResNorm) rn_ran = true, label += " +resnorm";
            if (r0 != SIZE_MAX) ran[r0] = 1, label += " +norm";
            if (r1 != SIZE_MAX) ran[r1] = 1, label += " +rope";
        }
        st0->sum_epi = {};
        return g == G4_OK ? mark(label) : g;
    };
    const CUdeviceptr saved = l0.step;
    l0.step                 = bg.steps;
    g4_status g             = G4_OK;
    // Groups of more than 8 rows run the matmuls of Gemv, GatedProj and Mlp records op by op, on the
    // tensor-core row matmuls (the fused row GEMVs take at most 8 rows).
    const bool fused_mm = n <= 8;
    if (walk) {
        for (size_t li = 0; li < p.n_launches(); ++li) {
            const plan::CudaLaunch& l = p.launch(li);
            const bool own =
                l.kind != (uint16_t)plan::LaunchKind::ResNorm && l.kind != (uint16_t)plan::LaunchKind::Mlp &&
                l.kind != (uint16_t)plan::LaunchKind::GatedProj && l.kind != (uint16_t)plan::LaunchKind::Gemv;
            for (size_t i = (size_t)l.op; i < (size_t)l.op + l.count; ++i)
                op_by_op[i] = own ? 1 : 0;
        }
        for (size_t li = 0; li < p.n_launches() && g == G4_OK; ++li) {
            const plan::CudaLaunch& l = p.launch(li);
            bool done                 = false;
            size_t first              = (size_t)l.op;
            std::string label;
            if (l.kind == (uint16_t)plan::LaunchKind::ResNorm && rn_ran) { // run by the matmul before it
                rn_ran = false;
                continue;
            }
            rn_ran   = false;
            next_rn  = li + 1 < p.n_launches() && p.launch(li + 1).kind == (uint16_t)plan::LaunchKind::ResNorm
                           ? &p.launch(li + 1)
                           : nullptr;
            rec_last = (size_t)l.op + l.count - 1;
            if (fused_mm && l.kind == (uint16_t)plan::LaunchKind::Gemv) {
                g = launch_gemv_rows(st0, p, l, n, &done, &label, err);
            } else if (fused_mm && l.kind == (uint16_t)plan::LaunchKind::GatedProj) {
                g = launch_gated_proj_rows(st0, p, l, n, &done, &label, err);
            } else if (l.kind == (uint16_t)plan::LaunchKind::ResNorm) {
                g     = launch_resnorm_rows(st0, p, l, n, &done, err);
                label = "resnorm_rows";
            } else if (fused_mm && l.kind == (uint16_t)plan::LaunchKind::Mlp) {
                g = launch_mlp_gate_up_rows(st0, p, l, n, &done, &label, err);
                if (g == G4_OK && done) { // its other ops one by one
                    g     = mark(label);
                    done  = false;
                    first = (size_t)l.op + 3;
                }
            } else if (K.mm_rows_tc_sum_gelu &&
                       (l.kind == (uint16_t)plan::LaunchKind::Mlp         ? mlp_gate_up(p, l)
                        : l.kind == (uint16_t)plan::LaunchKind::GatedProj ? gated_proj_gate(p, l)
                                                                          : false)) {
                // Mlp: the gate, then the up projection whose K splits' sum applies the GeluMul; GatedProj:
                // the gate with it. launch_matmul clears gelu_sum where it applies it; where it cannot, the
                // GeluMul runs on its own.
                const bool mlp  = l.kind == (uint16_t)plan::LaunchKind::Mlp;
                const size_t i0 = (size_t)l.op, mm = mlp ? i0 + 1 : i0, gi = mm + 1;
                const PlanOp& gm = p.op(gi);
                const int32_t ai = mlp ? 0 : 1; // the GeluMul's operand that is not the matmul's output
                bool paired      = false;
                if (mlp) { // the gate, with the up projection and the GeluMul where they pair
                    const PlanOp& u = p.op(mm);
                    st0->mlp_pair   = {(int32_t)mm,
                                       addr(st0, p, u.in[1], 0),
                                       addr(st0, p, u.in[2], 0),
                                       addr(st0, p, gm.out[0], 0),
                                       ld_of(p, gm.out[0]),
                                       false};
                    g               = run_op(i0);
                    paired          = st0->mlp_pair.done;
                    st0->mlp_pair   = {};
                }
                if (g == G4_OK && !paired) {
                    st0->gelu_sum    = {addr(st0, p, gm.in[ai], gm.in_col[ai]), addr(st0, p, gm.out[0], 0),
                                        ld_of(p, gm.in[ai]), ld_of(p, gm.out[0]), mlp ? 0 : 1};
                    g                = run_op(mm);
                    const bool fused = st0->gelu_sum.y == 0;
                    st0->gelu_sum    = {};
                    if (g == G4_OK && !fused) g = run_op(gi);
                }
                first = gi + 1;
            }
            if (g == G4_OK && done) g = mark(label);
            for (size_t i = first; i < (size_t)l.op + l.count && g == G4_OK && !done; ++i)
                g = run_op(i);
        }
    } else {
        for (size_t i = 0; i < p.n_ops() && g == G4_OK; ++i)
            g = run_op(i);
    }
    l0.step = saved;
    if (g != G4_OK) return g;
    // Each row's logits to its session's own logits row (where its own decode step leaves them), and its
    // greedy token by g4_argmax into the session's host slot, as after its own decode step: sampling reads 4
    // bytes, the logits cross to the host only if asked for (fetch_logits).
    const uint64_t lo = p.tensor(info.logits_tensor).offset, row = (uint64_t)info.vocab_size * 4;
    int vocab = info.vocab_size, limit = info.embed_vocab_limit;
    if (K.argmax_rows) { // one launch over the rows (their table: run_group)
        CUdeviceptr src = l0.act + lo, table = bg.steps + SessionState::BatchGroup::kArgmaxAt;
        CUresult r =
            launch(st0, K.argmax_rows, cuda_ws::kArgmaxBlocks, (unsigned)n, 1024,
                   const_cast<void**>(std::initializer_list<void*>{&src, &vocab, &table, &limit}.begin()));
        if (r != 0) {
            *err = "CUDA error " + error_name(r) + " launching the device argmax of a batched step";
            return G4_ERR_INTERNAL;
        }
        return mark("logits rows, argmax");
    }
    for (int32_t j = 0; j < n; ++j) {
        SessionState* sj = session_of(ss[j]);
        CUdeviceptr src = l0.act + lo + (uint64_t)j * row, dst = sj->lanes[0].act + lo,
                    step = bg.steps + (uint64_t)(1 + j) * kStep,
                    ids  = sj->lanes[0].act + p.tensor(info.ids_tensor).offset;
        if (j > 0) {
            CU_TRY(d->cuMemcpyDtoDAsync(dst, src, row, l0.stream), "copying a session's logits row");
            st0->after_node = true;
        }
        CUresult r = launch(st0, K.argmax, cuda_ws::kArgmaxBlocks, 1, 1024,
                            const_cast<void**>(std::initializer_list<void*>{&src, &vocab, &sj->tok, &step,
                                                                            &ids, &sj->host_tok_dev, &limit}
                                                   .begin()));
        if (r != 0) {
            *err = "CUDA error " + error_name(r) + " launching the device argmax of a batched step";
            return G4_ERR_INTERNAL;
        }
    }
    return mark("logits rows, argmax");
}

// Profiling: GPU time between the events of one replay of the group's captured step, by label.
void collect_events(const Driver* d, SessionState::BatchGroup& bg, int32_t n) {
    const size_t k = bg.ev_label.size();
    if (k == 0 || bg.ev.size() < k + 1 || d->cuEventSynchronize(bg.ev[k]) != 0) return;
    for (size_t i = 0; i < k; ++i) {
        float ms = 0;
        if (d->cuEventElapsedTime(&ms, bg.ev[i], bg.ev[i + 1]) != 0) return;
        auto it = std::find_if(bg.ev_ms.begin(), bg.ev_ms.end(),
                               [&](const auto& x) { return x.first == bg.ev_label[i]; });
        if (it == bg.ev_ms.end())
            bg.ev_ms.emplace_back(bg.ev_label[i], ms);
        else
            it->second += ms;
        bg.ev_total_ms += ms;
    }
    bg.ev_steps++;
    bg.ev_rows += n;
}

void drop_graph(const Driver* d, SessionState::BatchGroup& bg) {
    if (bg.exec) d->cuGraphExecDestroy(bg.exec);
    if (bg.graph) d->cuGraphDestroy(bg.graph);
    bg.exec  = nullptr;
    bg.graph = nullptr;
    bg.captured.clear();
}

// Captures the group's step into bg.exec (programmatic dependent launch where the session has it, else
// plain); false when it cannot be (then the group runs op by op and no later group of st0 tries again).
bool capture_group(g4_session* const* ss, int32_t n, std::string* err) {
    SessionState* st0            = session_of(ss[0]);
    const Driver* d              = st0->e->d;
    Lane& l0                     = st0->lanes[0];
    SessionState::BatchGroup& bg = st0->batch;
    std::string why;
    for (int attempt = 0; attempt < 2; ++attempt) {
        const bool pdl = attempt == 0 && st0->pdl_ok;
        if (attempt == 1 && !st0->pdl_ok) break;
        st0->pdl_now = pdl;
        CUresult re  = d->cuStreamBeginCapture(l0.stream, 2 /* relaxed */);
        if (re != 0) {
            why = error_name(re);
            break;
        }
        g4_status g  = enqueue_group(ss, n, st0->profile && !pdl, err);
        re           = d->cuStreamEndCapture(l0.stream, &bg.graph);
        st0->pdl_now = false;
        st0->cur     = &l0;
        if (g != G4_OK) {
            why = *err;
            err->clear();
            break;
        }
        if (re == 0) re = d->cuGraphInstantiateWithFlags(&bg.exec, bg.graph, 0);
        if (re == 0) return true;
        why = error_name(re);
        drop_graph(d, bg);
    }
    st0->pdl_now = false;
    drop_graph(d, bg);
    bg.no_graph = true;
    std::fprintf(stderr,
                 "g4: note: batched decode steps run without a CUDA graph (capturing one failed: %s); they "
                 "are slower\n",
                 why.c_str());
    return false;
}

g4_status run_group(g4_session* const* ss, const int32_t* tokens, int32_t n, std::string* err) {
    static std::atomic<uint64_t> serials{0};
    g4_session* s0               = ss[0];
    SessionState* st0            = session_of(s0);
    const Driver* d              = st0->e->d;
    Lane& l0                     = st0->lanes[0];
    SessionState::BatchGroup& bg = st0->batch;
    // Steps run ahead are waited for and dropped; each session's decode graph stays valid (it reads its
    // own arenas), its device logits row does not (the logits of this step go to the host).
    for (int32_t j = 0; j < n; ++j)
        if (g4_status g = state_changed(ss[j], err); g != G4_OK) return g;
    st0->cur           = &l0;
    st0->merge_in_next = false;
    st0->rep_out = st0->rep_in = 0;
    st0->fold_prev = st0->fold_next = st0->mlp_res = nullptr;
    CU_TRY(d->cuCtxSetCurrent(l0.g->ctx), "cuCtxSetCurrent");
    if (!bg.steps || !bg.host_steps) {
        *err = "internal: the session has no batched-step buffers";
        return G4_ERR_INTERNAL;
    }
    long long* delta = (long long*)((char*)bg.host_steps + SessionState::BatchGroup::kDeltaAt);
    std::vector<uint64_t> key((size_t)n);
    for (int32_t j = 0; j < n; ++j) {
        SessionState* sj = session_of(ss[j]);
        if (sj->batch.serial == 0) sj->batch.serial = ++serials;
        key[(size_t)j]       = sj->batch.serial;
        bg.host_steps[1 + j] = {1, ss[j]->position, 1, 0};
        delta[j]             = (long long)(sj->lanes[0].kv - l0.kv);
    }
    bg.host_steps[0] = {n, 0, n, 0};
    {
        const plan::Plan& p = s0->engine->plan;
        const uint64_t lo   = p.tensor(p.info().logits_tensor).offset,
                       ids  = p.tensor(p.info().ids_tensor).offset;
        auto* rows          = (SessionState::BatchGroup::ArgmaxRow*)((char*)bg.host_steps +
                                                            SessionState::BatchGroup::kArgmaxAt);
        for (int32_t j = 0; j < n; ++j) {
            SessionState* sj = session_of(ss[j]);
            rows[j]          = {j > 0 ? sj->lanes[0].act + lo : 0, sj->tok,
                       bg.steps + (uint64_t)(1 + j) * sizeof(SessionState::Step), sj->lanes[0].act + ids,
                       sj->host_tok_dev};
        }
    }
    std::memcpy(st0->host_ids, tokens, sizeof(int32_t) * n);
    if (bg.exec && bg.captured != key) drop_graph(d, bg);
    if (!bg.exec && !bg.no_graph && bg.last == key && capture_group(ss, n, err)) bg.captured = key;
    bg.last = key;
    if (bg.exec)
        CU_TRY(d->cuGraphLaunch(bg.exec, l0.stream), "replaying a batched decode step");
    else if (g4_status g = enqueue_group(ss, n, false, err); g != G4_OK)
        return g;
    CU_TRY(d->cuStreamSynchronize(l0.stream), "running a batched decode step");
    if (bg.exec && st0->profile) collect_events(d, bg, n);
    for (int32_t j = 0; j < n; ++j) {
        SessionState* sj        = session_of(ss[j]);
        sj->logits_ahead        = false;
        sj->screened_pos        = -1;
        ss[j]->logits_on_device = true;
    }
    return G4_OK;
}

} // namespace

void batch_reserve(const g4_engine* e, SessionState* st, DeviceCarve& cv) {
    if (!batched_steps(e)) return;
    SessionState::BatchGroup& bg = st->batch;
    cv.add(&bg.steps, SessionState::BatchGroup::kBytes);
}

g4_status batch_create(SessionState* st, std::string* err) {
    SessionState::BatchGroup& bg = st->batch;
    if (!bg.steps) return G4_OK;
    CU_TRY(st->e->d->cuMemAllocHost((void**)&bg.host_steps, SessionState::BatchGroup::kBytes),
           "allocating pinned memory");
    return G4_OK;
}

g4_status run_batch(g4_session* const* ss, const int32_t* tokens, int32_t n, std::string* err) {
    return run_group(ss, tokens, n, err); // n <= batch_rows().group: g4_sessions_decode groups the sessions
}

void batch_destroy(SessionState* st) {
    const Driver* d              = st->e->d;
    SessionState::BatchGroup& bg = st->batch;
    if (bg.ev_steps) {
        std::fprintf(
            stderr,
            "g4 cuda batched-step profile (GPU time between events around each launch of the batched "
            "step's graph, %ld steps of %.1f rows on average, %.1f us/step; programmatic launch off "
            "while profiling):\n",
            bg.ev_steps, (double)bg.ev_rows / bg.ev_steps, 1000 * bg.ev_total_ms / bg.ev_steps);
        auto by_time = bg.ev_ms;
        std::sort(by_time.begin(), by_time.end(),
                  [](const auto& a, const auto& b) { return a.second > b.second; });
        for (const auto& r : by_time) {
            const long k = std::count(bg.ev_label.begin(), bg.ev_label.end(), r.first);
            std::fprintf(stderr, "  %-34s %8.1f us/step %5.1f%% %4ld launches/step\n", r.first.c_str(),
                         1000 * r.second / bg.ev_steps, 100 * r.second / bg.ev_total_ms, k);
        }
    }
    for (CUevent ev : bg.ev)
        if (ev) d->cuEventDestroy(ev);
    drop_graph(d, st->batch);
    if (st->batch.host_steps) d->cuMemFreeHost(st->batch.host_steps);
}

} // namespace g4::cuda_rt
