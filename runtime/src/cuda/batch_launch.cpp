// The CUDA backend's batched decode step (runtime/src/batch.h): the op-by-op path of prefill chunks over the
// n sessions' rows in the first session's activation arena, on its stream, but for the per-sequence ops
// (rope, KV store, attention), launched once per session on its row, with its KV cache and its step record
// (one row at its position). Plans whose layers span devices have no batched step. Opt-in (G4_CUDA_BATCH=1):
// on an H200 (docs/runtime.md) 2-8 sessions decode at 0.2-0.24x the tokens/s of the same sessions
// replaying their own decode graphs one after another (batch_decode_bench), the per-op launches and the
// untiling of the fused kernels' NF4 weights costing more than the weight reads they share.
#include "runtime/plan/op_params.h"
#include "runtime/src/batch.h"
#include "runtime/src/cuda/backend.h"
#include "runtime/src/cuda/driver.h"
#include "runtime/src/cuda/launch.h"
#include "runtime/src/cuda/state.h"
#include "runtime/src/engine.h"
#include "runtime/src/env.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace g4::cuda_rt {

using plan::PlanOp;
using plan::TensorKind;

namespace {

// Op i of the step for session sj, row j of the step: activations of the step's arena (st0's lane 0) at
// row j, caches of sj's lane 0, sj's step record (one row at its position), launched on st0's stream.
g4_status launch_for_session(SessionState* st0, SessionState* sj, const plan::Plan& p, size_t i, int32_t j,
                             std::string* err) {
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
    CUdeviceptr step = sj->lanes[0].step;
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

g4_status run_group(g4_session* const* ss, const int32_t* tokens, int32_t n, std::string* err) {
    g4_session* s0      = ss[0];
    SessionState* st0   = session_of(s0);
    const plan::Plan& p = s0->engine->plan;
    const auto& info    = p.info();
    const Driver* d     = st0->e->d;
    Lane& l0            = st0->lanes[0];
    // Steps run ahead are waited for and dropped; each session's decode graph stays valid (it reads its
    // own arenas), its device logits row does not (the logits of this step go to the host).
    for (int32_t j = 0; j < n; ++j)
        if (g4_status g = state_changed(ss[j], err); g != G4_OK) return g;
    st0->cur           = &l0;
    st0->merge_in_next = false;
    st0->rep_out = st0->rep_in = 0;
    st0->fold_prev = st0->fold_next = st0->mlp_res = nullptr;
    CU_TRY(d->cuCtxSetCurrent(l0.g->ctx), "cuCtxSetCurrent");
    *st0->host_step = {n, 0, n, 0};
    CU_TRY(d->cuMemcpyHtoDAsync(l0.step, st0->host_step, sizeof(SessionState::Step), l0.stream),
           "copying the step");
    for (int32_t j = 1; j < n; ++j) {
        SessionState* sj = session_of(ss[j]);
        *sj->host_step   = {1, ss[j]->position, 1, 0};
        CU_TRY(d->cuMemcpyHtoDAsync(sj->lanes[0].step, sj->host_step, sizeof(SessionState::Step), l0.stream),
               "copying a session's step");
    }
    std::memcpy(st0->host_ids, tokens, sizeof(int32_t) * n);
    CU_TRY(d->cuMemcpyHtoDAsync(l0.act + p.tensor(info.ids_tensor).offset, st0->host_ids, (size_t)n * 4,
                                l0.stream),
           "copying token ids");
    // The first session's step record says n rows for the shared ops; its per-sequence ops take a second
    // record (one row at its position) in its pinned staging's slot after the first (the plan's step buffer
    // holds one Step; the first session's per-sequence ops read a copy made before each of them).
    for (size_t i = 0; i < p.n_ops(); ++i) {
        if (!rt::op_per_sequence(p.op(i).code)) {
            if (g4_status g = launch_op(s0, i, n, n, err); g != G4_OK) return g;
            continue;
        }
        for (int32_t j = 0; j < n; ++j) {
            if (j == 0) {
                st0->host_step[1] = {1, s0->position, 1, 0};
                CU_TRY(
                    d->cuMemcpyHtoDAsync(l0.step, &st0->host_step[1], sizeof(SessionState::Step), l0.stream),
                    "copying the step");
            }
            if (g4_status g = launch_for_session(st0, session_of(ss[j]), p, i, j, err); g != G4_OK) return g;
            if (j == 0)
                CU_TRY(d->cuMemcpyHtoDAsync(l0.step, st0->host_step, sizeof(SessionState::Step), l0.stream),
                       "copying the step");
        }
    }
    CU_TRY(d->cuMemcpyDtoHAsync(st0->host_logits, l0.act + p.tensor(info.logits_tensor).offset,
                                (size_t)n * info.vocab_size * 4, l0.stream),
           "copying logits");
    CU_TRY(d->cuStreamSynchronize(l0.stream), "running a batched decode step");
    for (int32_t j = 0; j < n; ++j)
        std::memcpy(ss[j]->last_logits.data(), st0->host_logits + (size_t)j * info.vocab_size,
                    sizeof(float) * info.vocab_size);
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

} // namespace g4::cuda_rt
