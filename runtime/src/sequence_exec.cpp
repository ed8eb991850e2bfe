// CPU dispatch of the ops over frame sequences (see sequence_exec.h); parameters as
// models/gemma4/audio_graph.cpp emits them and runtime/plan/plan_validate.cpp checks them.
#include "runtime/src/sequence_exec.h"

namespace g4::rt {

bool run_sequence_op(const BoundOp& b, const cpu::Context& ctx, int32_t n, const int32_t* counts) {
    const plan::PlanOp& op = *b.op;
    const float* x         = (const float*)b.in[0];
    float* y               = (float*)b.out[0];
    switch ((OpCode)op.code) {
    case OpCode::Conv2dNormRelu:
        cpu::conv2d_norm_relu(ctx, {x, counts[op.ip[4]], op.ip[0], op.ip[1], b.in[1], b.in_dt[1], b.in[2],
                                    b.in_dt[2], op.fp[0], y, n, op.ip[2], op.ip[3]});
        return true;
    case OpCode::Silu:
        cpu::silu(ctx, {x, b.in_ld[0], y, b.out_ld[0], n, op.ip[0]});
        return true;
    case OpCode::SigmoidMul:
        cpu::sigmoid_mul(ctx,
                         {x, b.in_ld[0], (const float*)b.in[1], b.in_ld[1], y, b.out_ld[0], n, op.ip[0]});
        return true;
    case OpCode::CausalConv1d:
        cpu::causal_conv1d(ctx, {x, b.in_ld[0], b.in[1], b.in_dt[1], y, b.out_ld[0], n, op.ip[0], op.ip[1]});
        return true;
    case OpCode::LocalAttention:
        cpu::local_attention(ctx, {x, b.in_ld[0], (const float*)b.in[1], b.in_ld[1], (const float*)b.in[2],
                                   b.in_ld[2], (const float*)b.in[3], b.in_ld[3], y, b.out_ld[0], n, op.ip[0],
                                   op.ip[1], op.ip[2], op.ip[3], op.fp[0]});
        return true;
    case OpCode::SoftplusScale:
        cpu::softplus_scale(
            ctx, {x, b.in_ld[0], y, b.out_ld[0], n, op.ip[0], op.ip[1], b.in[1], b.in_dt[1], op.fp[0]});
        return true;
    case OpCode::AddScaled:
        cpu::add_scaled(
            ctx, {x, b.in_ld[0], (const float*)b.in[1], b.in_ld[1], y, b.out_ld[0], n, op.ip[0], op.fp[0]});
        return true;
    default:
        return false;
    }
}

} // namespace g4::rt
