// G4_CPU_PROFILE=1's tables (cpu_profile.h).
#include "runtime/src/cpu_profile.h"
#include "kernels/ops.h"
#include "runtime/plan/op_params.h"

#include <algorithm>
#include <cstdio>

namespace g4::rt {

namespace {
// Keys each of `rows` query rows at positions pos0.. attends to (causal, within `window` when non-zero).
double attended_keys(int32_t rows, int32_t pos0, int32_t window) {
    double keys = 0;
    for (int32_t i = 0; i < rows; ++i) {
        const int64_t k = (int64_t)pos0 + i + 1;
        keys += (double)(window > 0 ? std::min<int64_t>(k, window) : k);
    }
    return keys;
}
} // namespace

void CpuProfile::add(const plan::PlanOp& op, const plan::Plan& p, int32_t rows, int32_t pos0, double ms) {
    using plan::params;
    Row& r    = ops_[op.code % 64];
    double fl = 0;
    switch ((OpCode)op.code) {
    case OpCode::Matmul: {
        const plan::PlanTensor& w = p.tensor(op.in[1]);
        fl                        = 2.0 * rows * (double)w.dims[0] * (double)w.dims[1];
        for (Row& m : matmuls_)
            if (m.calls == 0 || (m.n == w.dims[0] && m.k == w.dims[1])) {
                m.n = w.dims[0], m.k = w.dims[1], m.calls++, m.rows += rows, m.ms += ms, m.flop += fl;
                break;
            }
        break;
    }
    case OpCode::Attention: {
        const auto& a = params<plan::AttentionParams>(op);
        fl            = 4.0 * attended_keys(rows, pos0, a.window) * a.dim * a.heads;
        break;
    }
    case OpCode::SelfAttention: {
        const auto& a = params<plan::SelfAttentionParams>(op);
        fl            = 4.0 * rows * (double)rows * a.dim * a.heads;
        break;
    }
    case OpCode::LocalAttention: {
        const auto& a = params<plan::LocalAttentionParams>(op);
        fl            = 4.0 * rows * (double)a.window * a.dim * a.heads;
        break;
    }
    default:
        break;
    }
    r.calls++, r.rows += rows, r.ms += ms, r.flop += fl;
}

double CpuProfile::total_ms() const {
    double total = 0;
    for (const Row& r : ops_)
        total += r.ms;
    return total;
}

void CpuProfile::print(const char* title) const {
    const double total = total_ms();
    if (steps_ > 0)
        std::fprintf(stderr, "g4 profile: %s, %lld steps, %lld rows, %.1f ms in ops (%.1f rows/s)\n", title,
                     (long long)steps_, (long long)rows_, total, total > 0 ? 1e3 * rows_ / total : 0.0);
    else
        std::fprintf(stderr, "g4 profile: %s, %.1f ms in ops\n", title, total);
    for (int c = 0; c < 64; ++c) {
        const Row& r = ops_[c];
        if (!r.calls) continue;
        std::fprintf(stderr, "  %-18s %6lld calls %9.1f ms %5.1f%% %8.1f us/call", op_name((OpCode)c),
                     (long long)r.calls, r.ms, total > 0 ? 100 * r.ms / total : 0.0, 1e3 * r.ms / r.calls);
        if (r.flop > 0 && r.ms > 0) std::fprintf(stderr, " %7.1f GFLOP/s", r.flop / r.ms / 1e6);
        std::fprintf(stderr, "\n");
    }
    for (const Row& m : matmuls_)
        if (m.calls && m.ms > 0)
            std::fprintf(stderr, "    matmul k %5lld n %6lld %6lld calls %9.1f ms %5.1f%% %7.1f GFLOP/s\n",
                         (long long)m.k, (long long)m.n, (long long)m.calls, m.ms, 100 * m.ms / total,
                         m.flop / m.ms / 1e6);
}

void TextProfile::print() const {
    if (!prefill.empty()) prefill.print("text program, prefill steps");
    if (!decode.empty()) decode.print("text program, decode steps");
}

} // namespace g4::rt
