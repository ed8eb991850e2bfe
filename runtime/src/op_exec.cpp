// Generic CPU replay of plan ops (see op_exec.h): one table, built from the op definitions, from op code to
// "parameters, argument struct, kernel".
#include "runtime/src/op_exec.h"

#include "runtime/plan/op_params.h"

#include <array>
#include <tuple>

namespace g4::rt {

namespace {

using Runner = void (*)(const plan::PlanOp&, const cpu::Context&, const OpIo&);

template <class P>
concept Replayable = requires(const OpIo& io, const P& a) {
    cpu::OpKernel<plan::OpTable<P>::code>::run;
    plan::OpTable<P>::args(io, a);
};

template <Replayable P> void run_with_table(const plan::PlanOp& op, const cpu::Context& ctx, const OpIo& io) {
    using T = plan::OpTable<P>;
    cpu::OpKernel<T::code>::run(ctx, T::args(io, plan::params<P>(op)));
}

template <class P> constexpr void add_runner(std::array<Runner, 256>& r) {
    if constexpr (Replayable<P>) r[(size_t)plan::OpTable<P>::code] = &run_with_table<P>;
}
template <class... P> constexpr std::array<Runner, 256> make_runners(std::tuple<P...>*) {
    std::array<Runner, 256> r{};
    (add_runner<P>(r), ...);
    return r;
}
constexpr std::array<Runner, 256> kRunners = make_runners((plan::AllOpParams*)nullptr);

} // namespace

OpIo op_io(const plan::Plan& p, const BoundOp& b, int32_t n, int64_t row0, int32_t pos0,
           const int32_t* counts) {
    const plan::PlanOp& op = *b.op;
    OpIo io;
    for (int k = 0; k < 4; ++k) {
        io.in[k]    = b.in[k];
        io.in_ld[k] = b.in_ld[k];
        io.in_dt[k] = b.in_dt[k];
        if (op.in[k] < 0) continue;
        const plan::PlanTensor& t = p.tensor(op.in[k]);
        io.in_t[k]                = &t;
        const bool rows_of_step =
            t.kind == (uint8_t)plan::TensorKind::Activation || t.kind == (uint8_t)plan::TensorKind::Input;
        if (row0 && rows_of_step && b.in[k])
            io.in[k] = (uint8_t*)b.in[k] + dtype_bytes((DType)t.dtype, row0 * b.in_ld[k]);
    }
    for (int k = 0; k < 2; ++k) {
        io.out[k]    = b.out[k];
        io.out_ld[k] = b.out_ld[k];
        if (op.out[k] >= 0) io.out_dt[k] = (DType)p.tensor(op.out[k]).dtype;
    }
    io.rows   = n;
    io.pos0   = pos0;
    io.counts = counts;
    return io;
}

bool run_op(const plan::PlanOp& op, const cpu::Context& ctx, const OpIo& io) {
    const Runner r = op.code < kRunners.size() ? kRunners[op.code] : nullptr;
    if (!r) return false;
    r(op, ctx, io);
    return true;
}

} // namespace g4::rt
