// The CPU executor's batched decode step (batch.h): the ops between per-sequence ops run over all rows in
// the first session's activation arena; each per-sequence op runs once per session on that session's row,
// with the session's KV cache views and position.
#include "runtime/src/batch.h"

#include "runtime/plan/op_params.h"
#include "runtime/src/executor.h"
#include "runtime/src/op_exec.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <tuple>

namespace g4::rt {

namespace {

template <class P> constexpr bool per_sequence_of() {
    if constexpr (requires { plan::OpTable<P>::per_sequence; })
        return plan::OpTable<P>::per_sequence;
    else
        return false;
}
template <class... P> constexpr std::array<bool, 256> make_per_sequence(std::tuple<P...>*) {
    std::array<bool, 256> m{};
    ((m[(size_t)plan::OpTable<P>::code] = per_sequence_of<P>()), ...);
    return m;
}
constexpr std::array<bool, 256> kPerSequence = make_per_sequence((plan::AllOpParams*)nullptr);

// Op i of a batched step for session j (row j of the step): activation views from the step's arena
// (sessions[0]'s binding, row j), cache views from session j's own binding.
g4_status run_for_session(g4_session* s0, g4_session* sj, size_t i, int32_t row, std::string* err) {
    const plan::Plan& p    = s0->engine->plan;
    const BoundOp& b       = s0->ops[i];
    const BoundOp& bj      = sj->ops[i];
    const plan::PlanOp& op = *b.op;
    OpIo io                = op_io(p, b, 1, row, sj->position, nullptr);
    auto is_cache          = [&](int32_t t) {
        return t >= 0 && p.tensor(t).kind == (uint8_t)plan::TensorKind::KvCache;
    };
    for (int k = 0; k < 4; ++k)
        if (is_cache(op.in[k])) io.in[k] = bj.in[k];
    for (int k = 0; k < 2; ++k) {
        if (op.out[k] < 0 || !b.out[k]) continue;
        io.out[k] = is_cache(op.out[k]) ? bj.out[k]
                                        : (uint8_t*)b.out[k] + dtype_bytes((DType)p.tensor(op.out[k]).dtype,
                                                                           row * b.out_ld[k]);
    }
    if (run_op(op, s0->ctx, io)) return G4_OK;
    *err = "internal: op '" + std::string(p.str(op.name)) + "' has no per-session replay";
    return G4_ERR_INTERNAL;
}

// One step over sessions[0..n) (n <= the plan's rows of logits).
g4_status run_group(g4_session* const* ss, int32_t n, std::string* err) {
    g4_session* s0      = ss[0];
    const plan::Plan& p = s0->engine->plan;
    const size_t n_ops  = p.n_ops();
    size_t first        = 0; // the first op of the run of shared ops not yet run
    for (size_t i = 0; i <= n_ops; ++i) {
        if (i < n_ops && !op_per_sequence(p.op(i).code)) continue;
        if (first < i) {
            g4_status st = run_ops(s0, first, i, n, 0, n, err);
            if (st != G4_OK) return st;
        }
        if (i == n_ops) break;
        for (int32_t j = 0; j < n; ++j) {
            g4_status st = run_for_session(s0, ss[j], i, j, err);
            if (st != G4_OK) return st;
        }
        first = i + 1;
    }
    const int32_t V = p.info().vocab_size;
    for (int32_t j = 0; j < n; ++j)
        std::memcpy(ss[j]->last_logits.data(), s0->logits + (size_t)j * V, sizeof(float) * V);
    return G4_OK;
}

} // namespace

bool op_per_sequence(uint16_t code) {
    return code < kPerSequence.size() && kPerSequence[code];
}

int32_t batch_limit(const g4_engine* e) {
    const auto& in = e->plan.info();
    return e->backend->batched_steps() ? std::min(in.max_rows, in.logits_rows) : 1;
}

g4_status run_batch_cpu(g4_session* const* ss, const int32_t* tokens, int32_t n, std::string* err) {
    // Up to kNf4GemvMaxRows rows an NF4 matmul reads each weight once (the GEMV); more rows would take the
    // dequantizing tile path, so larger batches run as several steps of that many rows.
    for (int32_t j0 = 0; j0 < n; j0 += cpu::kNf4GemvMaxRows) {
        const int32_t m = std::min<int32_t>(cpu::kNf4GemvMaxRows, n - j0);
        std::memcpy(ss[j0]->ids, tokens + j0, sizeof(int32_t) * m);
        g4_status st = run_group(ss + j0, m, err);
        if (st != G4_OK) return st;
    }
    return G4_OK;
}

} // namespace g4::rt
