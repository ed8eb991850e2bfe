// CPU dispatch of the ops over frame sequences (see sequence_exec.h); parameters as op_params.h's tables say
// and runtime/plan/check_sequence_ops.cpp checks them.
#include "runtime/src/sequence_exec.h"

#include "runtime/plan/op_params.h"

namespace g4::rt {

bool run_sequence_op(const BoundOp& b, const cpu::Context& ctx, int32_t n, const int32_t* counts) {
    const plan::PlanOp& op = *b.op;
    const float* x         = (const float*)b.in[0];
    float* y               = (float*)b.out[0];
    switch ((OpCode)op.code) {
    case OpCode::Conv2dNormRelu: {
        const auto c = plan::params<plan::Conv2dNormReluParams>(op);
        cpu::conv2d_norm_relu(ctx, {x, counts[c.src_count], c.f_in, c.c_in, b.in[1], b.in_dt[1], b.in[2],
                                    b.in_dt[2], c.eps, y, n, c.f_out, c.c_out});
        return true;
    }
    case OpCode::Silu:
        cpu::silu(ctx, {x, b.in_ld[0], y, b.out_ld[0], n, plan::params<plan::SiluParams>(op).cols});
        return true;
    case OpCode::SigmoidMul:
        cpu::sigmoid_mul(ctx, {x, b.in_ld[0], (const float*)b.in[1], b.in_ld[1], y, b.out_ld[0], n,
                               plan::params<plan::SigmoidMulParams>(op).cols});
        return true;
    case OpCode::CausalConv1d: {
        const auto c = plan::params<plan::CausalConv1dParams>(op);
        cpu::causal_conv1d(ctx, {x, b.in_ld[0], b.in[1], b.in_dt[1], y, b.out_ld[0], n, c.cols, c.k});
        return true;
    }
    case OpCode::LocalAttention: {
        const auto a = plan::params<plan::LocalAttentionParams>(op);
        cpu::local_attention(ctx, {x, b.in_ld[0], (const float*)b.in[1], b.in_ld[1], (const float*)b.in[2],
                                   b.in_ld[2], (const float*)b.in[3], b.in_ld[3], y, b.out_ld[0], n, a.heads,
                                   a.dim, a.window, a.n_rel, a.cap});
        return true;
    }
    case OpCode::SoftplusScale: {
        const auto s = plan::params<plan::SoftplusScaleParams>(op);
        cpu::softplus_scale(ctx,
                            {x, b.in_ld[0], y, b.out_ld[0], n, s.cols, s.dim, b.in[1], b.in_dt[1], s.scale});
        return true;
    }
    case OpCode::AddScaled: {
        const auto a = plan::params<plan::AddScaledParams>(op);
        cpu::add_scaled(
            ctx, {x, b.in_ld[0], (const float*)b.in[1], b.in_ld[1], y, b.out_ld[0], n, a.cols, a.scale});
        return true;
    }
    default:
        return false;
    }
}

} // namespace g4::rt
