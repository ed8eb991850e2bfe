// Launches of the ops over frame sequences (see sequence_ops.h); grids and shared memory as documented
// beside each kernel in kernels/cuda/sequence_ops.cu.
#include "runtime/src/cuda/sequence_ops.h"

#include "runtime/plan/op_params.h"

#include <initializer_list>

namespace g4::cuda_rt {
namespace {

unsigned cdiv(int64_t a, int64_t b) {
    return (unsigned)((a + b - 1) / b);
}
int dt(DType t) {
    return t == DType::BF16 ? 1 : 0;
}
cu::CUresult go(const cu::Driver& d, cu::CUfunction f, cu::CUstream s, unsigned gx, unsigned gy, unsigned bx,
                unsigned smem, std::initializer_list<void*> args) {
    if (gx == 0 || gy == 0) return 0;
    return d.cuLaunchKernel(f, gx, gy, 1, bx, 1, 1, smem, s, const_cast<void**>(args.begin()), nullptr);
}

} // namespace

std::string load_sequence_kernels(const cu::Driver& d, cu::CUmodule m, SequenceKernels* k) {
    const struct {
        cu::CUfunction* f;
        const char* name;
    } all[] = {{&k->conv2d_norm_relu, "g4_conv2d_norm_relu"},
               {&k->silu, "g4_silu"},
               {&k->sigmoid_mul, "g4_sigmoid_mul"},
               {&k->causal_conv1d, "g4_causal_conv1d"},
               {&k->local_attention, "g4_local_attention"},
               {&k->softplus_scale, "g4_softplus_scale"},
               {&k->add_scaled, "g4_add_scaled"}};
    for (const auto& e : all)
        if (d.cuModuleGetFunction(e.f, m, e.name) != 0) return e.name;
    return "";
}

cu::CUresult launch_conv2d_norm_relu(const cu::Driver& d, const SequenceKernels& k, cu::CUstream s,
                                     const Conv2dArgs& a) {
    const float* x = a.x;
    float* y       = a.y;
    const void *w = a.w, *n = a.norm;
    int in_rows = a.in_rows, f_in = a.f_in, c_in = a.c_in, wdt = dt(a.wdt), ndt = dt(a.ndt), f_out = a.f_out,
        c_out = a.c_out;
    float eps = a.eps;
    return go(d, k.conv2d_norm_relu, s, (unsigned)a.out_rows, (unsigned)a.f_out, 256,
              (unsigned)(sizeof(float) * (9 * (size_t)c_in + c_out)),
              {&x, &in_rows, &f_in, &c_in, &w, &wdt, &n, &ndt, &eps, &y, &f_out, &c_out});
}

cu::CUresult launch_silu(const cu::Driver& d, const SequenceKernels& k, cu::CUstream s, const UnaryArgs& a) {
    const float* x = a.x;
    float* y       = a.y;
    long ldx = (long)a.ldx, ldy = (long)a.ldy;
    int cols = a.cols;
    return go(d, k.silu, s, (unsigned)a.rows, cdiv(cols, 256), 256, 0, {&x, &ldx, &y, &ldy, &cols});
}

cu::CUresult launch_sigmoid_mul(const cu::Driver& d, const SequenceKernels& k, cu::CUstream s,
                                const BinaryArgs& a) {
    const float *x = a.a, *g = a.b;
    float* y = a.y;
    long lda = (long)a.lda, ldb = (long)a.ldb, ldy = (long)a.ldy;
    int cols = a.cols;
    return go(d, k.sigmoid_mul, s, (unsigned)a.rows, cdiv(cols, 256), 256, 0,
              {&x, &lda, &g, &ldb, &y, &ldy, &cols});
}

cu::CUresult launch_causal_conv1d(const cu::Driver& d, const SequenceKernels& k, cu::CUstream s,
                                  const CausalConv1dArgs& a) {
    const float* x = a.x;
    const void* w  = a.w;
    float* y       = a.y;
    long ldx = (long)a.ldx, ldy = (long)a.ldy;
    int wdt = dt(a.wdt), cols = a.cols, kk = a.k;
    return go(d, k.causal_conv1d, s, (unsigned)a.rows, cdiv(cols, 256), 256, 0,
              {&x, &ldx, &w, &wdt, &y, &ldy, &cols, &kk});
}

cu::CUresult launch_local_attention(const cu::Driver& d, const SequenceKernels& k, cu::CUstream s,
                                    const LocalAttentionArgs& a) {
    const float *q = a.q, *kk = a.k, *v = a.v, *rel = a.rel;
    float* y = a.y;
    long ldq = (long)a.ldq, ldk = (long)a.ldk, ldv = (long)a.ldv, ldr = (long)a.ldr, ldy = (long)a.ldy;
    int D = a.dim, W = a.window, nr = a.n_rel;
    float cap = a.cap;
    return go(d, k.local_attention, s, (unsigned)a.rows, (unsigned)a.heads, 32, (unsigned)(sizeof(float) * W),
              {&q, &ldq, &kk, &ldk, &v, &ldv, &rel, &ldr, &y, &ldy, &D, &W, &nr, &cap});
}

cu::CUresult launch_softplus_scale(const cu::Driver& d, const SequenceKernels& k, cu::CUstream s,
                                   const DimScaleArgs& a) {
    const float* x = a.x;
    float* y       = a.y;
    const void* w  = a.w;
    long ldx = (long)a.ldx, ldy = (long)a.ldy;
    int cols = a.cols, dim = a.dim, wdt = dt(a.wdt);
    float sc = a.s;
    return go(d, k.softplus_scale, s, (unsigned)a.rows, cdiv(cols, 256), 256, 0,
              {&x, &ldx, &y, &ldy, &cols, &dim, &w, &wdt, &sc});
}

cu::CUresult launch_add_scaled(const cu::Driver& d, const SequenceKernels& k, cu::CUstream s,
                               const AddScaledArgs& a) {
    const float *x = a.a, *b = a.b;
    float* y = a.y;
    long lda = (long)a.lda, ldb = (long)a.ldb, ldy = (long)a.ldy;
    int cols = a.cols;
    float sc = a.s;
    return go(d, k.add_scaled, s, (unsigned)a.rows, cdiv(cols, 256), 256, 0,
              {&x, &lda, &b, &ldb, &y, &ldy, &cols, &sc});
}

bool launch_sequence_op(const cu::Driver& d, const SequenceKernels& k, cu::CUstream s, const rt::BoundOp& b,
                        int32_t n, const int32_t* counts, cu::CUresult* r) {
    const plan::PlanOp& op = *b.op;
    const float* x         = (const float*)b.in[0];
    float* y               = (float*)b.out[0];
    switch ((OpCode)op.code) {
    case OpCode::Conv2dNormRelu: {
        const auto c = plan::params<plan::Conv2dNormReluParams>(op);
        *r           = launch_conv2d_norm_relu(d, k, s,
                                               {x, counts[c.src_count], c.f_in, c.c_in, b.in[1], b.in_dt[1], b.in[2],
                                                b.in_dt[2], c.eps, y, n, c.f_out, c.c_out});
        return true;
    }
    case OpCode::Silu:
        *r =
            launch_silu(d, k, s, {x, b.in_ld[0], y, b.out_ld[0], n, plan::params<plan::SiluParams>(op).cols});
        return true;
    case OpCode::SigmoidMul:
        *r = launch_sigmoid_mul(d, k, s,
                                {x, b.in_ld[0], (const float*)b.in[1], b.in_ld[1], y, b.out_ld[0], n,
                                 plan::params<plan::SigmoidMulParams>(op).cols});
        return true;
    case OpCode::CausalConv1d: {
        const auto c = plan::params<plan::CausalConv1dParams>(op);
        *r           = launch_causal_conv1d(d, k, s,
                                            {x, b.in_ld[0], b.in[1], b.in_dt[1], y, b.out_ld[0], n, c.cols, c.k});
        return true;
    }
    case OpCode::LocalAttention: {
        const auto a = plan::params<plan::LocalAttentionParams>(op);
        *r           = launch_local_attention(d, k, s,
                                              {x, b.in_ld[0], (const float*)b.in[1], b.in_ld[1], (const float*)b.in[2],
                                               b.in_ld[2], (const float*)b.in[3], b.in_ld[3], y, b.out_ld[0], n,
                                               a.heads, a.dim, a.window, a.n_rel, a.cap});
        return true;
    }
    case OpCode::SoftplusScale: {
        const auto c = plan::params<plan::SoftplusScaleParams>(op);
        *r           = launch_softplus_scale(
                      d, k, s, {x, b.in_ld[0], y, b.out_ld[0], n, c.cols, c.dim, b.in[1], b.in_dt[1], c.scale});
        return true;
    }
    case OpCode::AddScaled: {
        const auto a = plan::params<plan::AddScaledParams>(op);
        *r           = launch_add_scaled(
                      d, k, s, {x, b.in_ld[0], (const float*)b.in[1], b.in_ld[1], y, b.out_ld[0], n, a.cols, a.scale});
        return true;
    }
    default:
        return false;
    }
}

} // namespace g4::cuda_rt
