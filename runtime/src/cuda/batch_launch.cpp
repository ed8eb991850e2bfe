// The CUDA backend's batched decode step (runtime/src/batch.h): the op-by-op path of prefill chunks over the
// n sessions' rows in the first session's activation arena, on its stream, but for the per-sequence ops
// (rope, KV store, attention), launched once per session on its row, with its KV cache and its own step
// record (one row at its position). Matmuls of 2..8 rows read each weight once in its stored layout
// (g4_mm_rows_*). A group that steps twice in a row with the same sessions is captured as a CUDA graph and
// replayed while it stays the same: its step records and token ids are copied from pinned host slots the
// graph reads at each replay. Plans whose layers span devices have no batched step.
#include "runtime/plan/op_params.h"
#include "runtime/src/batch.h"
#include "runtime/src/cuda/backend.h"
#include "runtime/src/cuda/driver.h"
#include "runtime/src/cuda/launch.h"
#include "runtime/src/cuda/state.h"
#include "runtime/src/engine.h"
#include "runtime/src/env.h"

#include <algorithm>
#include <atomic>
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

} // namespace

bool batched_steps(const g4_engine* e) {
    return !e->plan.hybrid() && rt::env::cuda_batch();
}

namespace {

// Enqueues the step of sessions ss[0..n) on st0's stream: the step records and token ids from the pinned
// host slots (written before), every op, the logits rows back to st0's pinned logits. The plan's step buffer
// of st0 points at the group's records while the ops are enqueued (ops shared by the rows read record 0).
g4_status enqueue_group(g4_session* const* ss, int32_t n, std::string* err) {
    g4_session* s0               = ss[0];
    SessionState* st0            = session_of(s0);
    const plan::Plan& p          = s0->engine->plan;
    const auto& info             = p.info();
    const Driver* d              = st0->e->d;
    Lane& l0                     = st0->lanes[0];
    SessionState::BatchGroup& bg = st0->batch;
    constexpr uint64_t kStep     = sizeof(SessionState::Step);
    CU_TRY(d->cuMemcpyHtoDAsync(bg.steps, bg.host_steps, (size_t)(n + 1) * kStep, l0.stream),
           "copying the step records");
    CU_TRY(d->cuMemcpyHtoDAsync(l0.act + p.tensor(info.ids_tensor).offset, st0->host_ids, (size_t)n * 4,
                                l0.stream),
           "copying token ids");
    st0->after_node         = true; // no programmatic edge from a copy
    const CUdeviceptr saved = l0.step;
    l0.step                 = bg.steps;
    g4_status g             = G4_OK;
    for (size_t i = 0; i < p.n_ops() && g == G4_OK; ++i) {
        if (!rt::op_per_sequence(p.op(i).code)) {
            g = launch_op(s0, i, n, n, err);
            continue;
        }
        for (int32_t j = 0; j < n && g == G4_OK; ++j)
            g = launch_for_session(st0, session_of(ss[j]), p, i, j, bg.steps + (uint64_t)(1 + j) * kStep,
                                   err);
    }
    l0.step = saved;
    if (g != G4_OK) return g;
    CU_TRY(d->cuMemcpyDtoHAsync(st0->host_logits, l0.act + p.tensor(info.logits_tensor).offset,
                                (size_t)n * info.vocab_size * 4, l0.stream),
           "copying logits");
    return G4_OK;
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
    for (int attempt = 0; attempt < 2; ++attempt) {
        const bool pdl = attempt == 0 && st0->pdl_ok;
        if (attempt == 1 && !st0->pdl_ok) break;
        st0->pdl_now = pdl;
        if (d->cuStreamBeginCapture(l0.stream, 2 /* relaxed */) != 0) break;
        g4_status g  = enqueue_group(ss, n, err);
        CUresult re  = d->cuStreamEndCapture(l0.stream, &bg.graph);
        st0->pdl_now = false;
        st0->cur     = &l0;
        if (g != G4_OK) {
            err->clear();
            break;
        }
        if (re == 0) re = d->cuGraphInstantiateWithFlags(&bg.exec, bg.graph, 0);
        if (re == 0) return true;
        drop_graph(d, bg);
    }
    drop_graph(d, bg);
    bg.no_graph = true;
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
    if (!bg.steps) {
        CU_TRY(d->cuMemAlloc(&bg.steps, 9 * sizeof(SessionState::Step)), "allocating the step records");
        CU_TRY(d->cuMemAllocHost((void**)&bg.host_steps, 9 * sizeof(SessionState::Step)),
               "allocating pinned memory");
    }
    std::vector<uint64_t> key((size_t)n);
    for (int32_t j = 0; j < n; ++j) {
        SessionState* sj = session_of(ss[j]);
        if (sj->batch.serial == 0) sj->batch.serial = ++serials;
        key[(size_t)j]       = sj->batch.serial;
        bg.host_steps[1 + j] = {1, ss[j]->position, 1, 0};
    }
    bg.host_steps[0] = {n, 0, n, 0};
    std::memcpy(st0->host_ids, tokens, sizeof(int32_t) * n);
    if (bg.exec && bg.captured != key) drop_graph(d, bg);
    if (!bg.exec && !bg.no_graph && bg.last == key && capture_group(ss, n, err)) bg.captured = key;
    bg.last = key;
    if (bg.exec)
        CU_TRY(d->cuGraphLaunch(bg.exec, l0.stream), "replaying a batched decode step");
    else if (g4_status g = enqueue_group(ss, n, err); g != G4_OK)
        return g;
    CU_TRY(d->cuStreamSynchronize(l0.stream), "running a batched decode step");
    const int32_t V = s0->engine->plan.info().vocab_size;
    for (int32_t j = 0; j < n; ++j)
        std::memcpy(ss[j]->last_logits.data(), st0->host_logits + (size_t)j * V, sizeof(float) * V);
    return G4_OK;
}

} // namespace

g4_status run_batch(g4_session* const* ss, const int32_t* tokens, int32_t n, std::string* err) {
    // Groups of at most 8 rows: the float32 matmul kernels of few rows; more rows take the prefill's bf16
    // tensor-core or cuBLAS tier, whose bf16 operands moved the tiny fixture's logits 4e-3..1.5e-2 from a
    // lone decode step's and flipped a near-tied greedy token (measured on an H200).
    for (int32_t j0 = 0; j0 < n; j0 += 8)
        if (g4_status g = run_group(ss + j0, tokens + j0, std::min<int32_t>(8, n - j0), err); g != G4_OK)
            return g;
    return G4_OK;
}

void batch_destroy(SessionState* st) {
    const Driver* d = st->e->d;
    drop_graph(d, st->batch);
    if (st->batch.steps) d->cuMemFree(st->batch.steps);
    if (st->batch.host_steps) d->cuMemFreeHost(st->batch.host_steps);
}

} // namespace g4::cuda_rt
