// Binding and launch of the matmul kernels: warp-per-row, GEMV, tiled and tensor-core GEMM, and the
// cuBLAS tier with its NF4 -> bf16 and fp32 -> bf16 conversions.
#include "kernels/nf4.h"
#include "runtime/plan/op_params.h"
#include "runtime/src/cuda/cublas.h"
#include "runtime/src/cuda/kernel_args.h"
#include "runtime/src/cuda/launch.h"
#include "runtime/src/cuda/workspace.h"
#include "runtime/src/engine.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

namespace g4::cuda_rt {

using namespace g4::cu;
using plan::CudaLaunch;
using plan::LaunchKind;
using plan::PlanOp;
using plan::PlanTensor;
using plan::RowMode;
using plan::TensorKind;

g4_status bind_matmul_kernels(const ModuleKernels& m, Kernels& k, std::string* err) {
    const KernelName fns[] = {{&k.mm_bf16, "g4_matmul_bf16"},       {&k.mm_f32, "g4_matmul_f32"},
                              {&k.mm_nf4, "g4_matmul_nf4"},         {&k.gemm_bf16, "g4_gemm_bf16"},
                              {&k.gemm_nf4, "g4_gemm_nf4"},         {&k.gemv_bf16, "g4_gemv_bf16"},
                              {&k.gemv_nf4, "g4_gemv_nf4"},         {&k.tc_bf16, "g4_tc_gemm_bf16"},
                              {&k.tc_nf4, "g4_tc_gemm_nf4"},        {&k.nf4_to_bf16, "g4_nf4_to_bf16"},
                              {&k.nf4_untile32, "g4_nf4_untile32"}, {&k.f32_to_bf16, "g4_f32_to_bf16"},
                              {&k.add_bias, "g4_add_bias"}};
    if (g4_status g = m.get_all(fns, err); g != G4_OK) return g;
    m.get_optional(&k.mm_rows_nf4, "g4_mm_rows_nf4");
    m.get_optional(&k.mm_rows_bf16, "g4_mm_rows_bf16");
    m.get_optional(&k.mm_rows_tc_nf4, "g4_mm_rows_tcs_nf4");
    m.get_optional(&k.mm_rows_tc_bf16, "g4_mm_rows_tcs_bf16");
    m.get_optional(&k.mm_rows_tc_sum, "g4_mm_rows_tcs_sum");
    m.get_optional(&k.mm_rows_tc_sum_gelu, "g4_mm_rows_tcs_sum_gelu");
    m.get_optional(&k.mm_rows_tc_sum_norm_rope, "g4_mm_rows_tcs_sum_norm_rope");
    m.get_optional(&k.mm_rows_tc_sum_resnorm, "g4_mm_rows_tcs_sum_resnorm");
    if (!m.get_optional(&k.mm_rows_tc_pair, "g4_mm_rows_tcs_nf4_pair") ||
        !m.get_optional(&k.mm_rows_tc_sum_gelu_pair, "g4_mm_rows_tcs_sum_gelu_pair"))
        k.mm_rows_tc_pair = k.mm_rows_tc_sum_gelu_pair = nullptr;
    if (!k.mm_rows_tc_sum) k.mm_rows_tc_nf4 = k.mm_rows_tc_bf16 = nullptr;
    return G4_OK;
}

namespace {

// Warps that share a lane group's rows in g4_mm_rows_* (1, 2 or 4, splitting K): more while the groups
// (4 rows each) fill fewer than 4096 warps and every lane keeps a chunk (16 NF4 / 8 bf16 values) of K.
int mm_rows_split(int N, int K, int per_chunk) {
    const long groups = (N + 3) / 4;
    const int chunks  = K / per_chunk;
    int ks            = 1;
    while (ks < 4 && groups * ks < 4096 && chunks >= ks * 2 * 32)
        ks *= 2;
    return ks;
}

} // namespace

Nf4Ptrs nf4_ptrs(CUdeviceptr base, const PlanTensor& w) {
    nf4::Layout l = nf4::layout(w.dims[0] * w.dims[1], w.quant_flags & plan::kQuantDoubleQuant);
    if (!l.double_quant) return {base + l.codes_off, base + l.absmax_off, 0, 0, 0};
    return {base + l.codes_off, base + l.absmax_off, base + l.absmax2_off, base + l.offset_off,
            base + l.code2_off};
}

g4_status launch_matmul(const OpArgs& a, CUresult* rp, std::string* err) {
    SessionState* st    = a.st;
    const plan::Plan& p = a.p;
    Lane& ln            = a.ln;
    const Kernels& K    = a.K;
    const PlanOp& op    = a.op;
    const size_t i      = a.i;
    const int n         = a.n;
    int mode            = a.mode;
    CUdeviceptr step = a.step, in0 = a.in0, in1 = a.in1, in2 = a.in2, out0 = a.out0;
    long ld0 = a.ld0, ldo = a.ldo;
    CUresult& r = *rp;
    auto go = [&a](CUfunction f, unsigned gx, unsigned gy, unsigned bx, std::initializer_list<void*> args) {
        return a.go(f, gx, gy, bx, args);
    };
    const PlanTensor& w = p.tensor(op.in[1]);
    int N = (int)w.dims[0], Kd = (int)w.dims[1];
    if (w.dtype == (uint8_t)DType::F16) {
        *err = "op " + std::string(p.str(op.name)) + ": f16 weights are not supported on CUDA";
        return G4_ERR_UNSUPPORTED;
    }
    // Kernel variants recorded by the compiler: prefill chunks go to cuBLAS (or the tensor-core /
    // tiled GEMM), decode rows outside the fused schedule to the 4-rows-per-warp GEMV, the rest one
    // warp per row.
    const bool is_nf4 = w.dtype == (uint8_t)DType::NF4;
    // A down or o projection the decode schedule runs in g4_mlp_nf4 / g4_attn_o_nf4 (stored tiled for
    // it): the cuBLAS tier dequantizes it to bf16 in place (g4_nf4_to_bf16's tiled_rows); every other use
    // first puts its codes and absmax back in the row-major layout, after the bf16 scratch matrix
    // (cuda_ws::workspace sizes wscratch for both), then runs as on an untiled plan.
    Nf4Ptrs q{};
    if (is_nf4) q = nf4_ptrs(in1, w);
    const bool tiled_w = is_nf4 && (w.quant_flags & plan::kQuantTiled32);
    if (n >= 2 && n <= 8 && is_nf4 && Kd % 64 == 0 && K.mm_rows_nf4) {
        int ks = mm_rows_split(N, Kd, 16), tl = tiled_w ? 1 : 0;
        r = go(K.mm_rows_nf4, (unsigned)ceil_div(ceil_div(N, 4), 4 / ks), 1, 128,
               {&step, &mode, &in0, &ld0, &q.codes, &q.absmax, &q.absmax2, &q.offset, &q.code2, &N, &Kd,
                &out0, &ldo, &in2, &tl, &ks});
        return G4_OK;
    }
    if (n >= 2 && n <= 8 && w.dtype == (uint8_t)DType::BF16 && Kd % 8 == 0 && K.mm_rows_bf16) {
        int ks = mm_rows_split(N, Kd, 8);
        r      = go(K.mm_rows_bf16, (unsigned)ceil_div(ceil_div(N, 4), 4 / ks), 1, 128,
                    {&step, &mode, &in0, &ld0, &in1, &N, &Kd, &out0, &ldo, &in2, &ks});
        return G4_OK;
    }
    // 9..16 rows (batched decode steps of more sessions, short prefill chunks): g4_mm_rows_tcs_* on tensor
    // cores, products split in two bf16 each, each weight read once in its stored layout (tiled too), K split
    // over blocks by rows_tc_grid (the splits' partials in the lane's part buffer, which workspace.h sizes
    // for them, summed by g4_mm_rows_tcs_sum). 2..8 rows keep the float32 kernels above: with the
    // tensor-core ones a batched decode step of 2 / 4 rows ran 1.68x / 1.40x slower on an H200
    // (docs/performance.md).
    if (n >= 2 && n <= cuda_ws::kRowsTcMaxRows && Kd % 64 == 0 &&
        (is_nf4 ? K.mm_rows_tc_nf4 : K.mm_rows_tc_bf16) && (is_nf4 || w.dtype == (uint8_t)DType::BF16)) {
        cuda_ws::RowsTcGrid gr = cuda_ws::rows_tc_grid(N, Kd);
        if ((uint64_t)gr.splits * cuda_ws::kRowsTcMaxRows * N > ln.part_floats) gr.splits = 1;
        int wn = gr.wn, tl = tiled_w ? 1 : 0, S = gr.splits;
        CUdeviceptr part          = ln.part;
        SessionState::MlpPair& mp = st->mlp_pair;
        if (mp.up >= 0 && is_nf4 && K.mm_rows_tc_pair) { // the gate with its up projection (batch_launch.cpp)
            const PlanTensor& u          = p.tensor(p.op((size_t)mp.up).in[1]);
            const cuda_ws::RowsTcGrid pg = cuda_ws::rows_tc_grid(2 * (int64_t)N, Kd);
            int pwn = pg.wn, pS = pg.splits;
            if (u.dtype == w.dtype && u.dims[0] == w.dims[0] && u.dims[1] == w.dims[1] &&
                u.quant_flags == w.quant_flags && pS > 1 &&
                (uint64_t)pS * cuda_ws::kRowsTcMaxRows * 2 * N <= ln.part_floats) {
                Nf4Ptrs uq          = nf4_ptrs(mp.uw, u);
                const unsigned half = (unsigned)ceil_div(N, cuda_ws::kRowsTcCols * pwn);
                r                   = go(K.mm_rows_tc_pair, 2 * half, (unsigned)pS, 256,
                                         {&step, &mode, &in0, &ld0, &q.codes, &q.absmax, &q.absmax2, &q.offset, &q.code2,
                                          &uq.codes, &uq.absmax, &uq.absmax2, &uq.offset, &uq.code2, &N, &Kd, &tl, &pwn,
                                          &part});
                if (r == 0)
                    r = go(K.mm_rows_tc_sum_gelu_pair, (unsigned)ceil_div((long)n * N, 256), 1, 256,
                           {&step, &mode, &part, &pS, &N, &mp.y, &mp.ldy, &in2, &mp.ub});
                mp.done = true;
                return G4_OK;
            }
        }
        const unsigned grid = (unsigned)ceil_div(N, cuda_ws::kRowsTcCols * wn);
        if (is_nf4)
            r = go(K.mm_rows_tc_nf4, grid, (unsigned)S, 256,
                   {&step, &mode, &in0, &ld0, &q.codes, &q.absmax, &q.absmax2, &q.offset, &q.code2, &N, &Kd,
                    &out0, &ldo, &in2, &tl, &wn, &part});
        else
            r = go(K.mm_rows_tc_bf16, grid, (unsigned)S, 256,
                   {&step, &mode, &in0, &ld0, &in1, &N, &Kd, &out0, &ldo, &in2, &wn, &part});
        SessionState::GeluSum& gs     = st->gelu_sum;
        SessionState::SumEpilogue& se = st->sum_epi;
        using Epi                     = SessionState::SumEpilogue;
        if (gs.y && S > 1) { // consumed here, else the caller runs the GeluMul (batch_launch.cpp)
            if (r == 0)
                r = go(K.mm_rows_tc_sum_gelu, (unsigned)ceil_div((long)n * N, 256), 1, 256,
                       {&step, &mode, &part, &S, &N, &gs.a, &gs.lda, &gs.gate_of_sum, &gs.y, &gs.ldy, &in2});
            gs = {};
        } else if (se.kind == Epi::HeadNorm && S > 1 && K.mm_rows_tc_sum_norm_rope) { // as gelu_sum
            if (r == 0)
                r = go(K.mm_rows_tc_sum_norm_rope, (unsigned)(N / se.dim), (unsigned)n, (unsigned)se.dim,
                       {&step, &mode, &part, &S, &N, &in2, &out0, &ldo, &se.w, &se.wdt, &se.dim, &se.eps,
                        &se.inv_freq});
            se = {};
        } else if (se.kind == Epi::ResNorm && S > 1 && K.mm_rows_tc_sum_resnorm) {
            const unsigned nt = N <= 2048 ? 512 : 1024; // as launch_resnorm_rows
            if (r == 0)
                r = go(K.mm_rows_tc_sum_resnorm, (unsigned)n, 1, nt,
                       {&step,    &mode,    &part,      &S,       &N,       &in2,    &out0, &ldo,
                        &se.x,    &se.ldx,  &se.pw,     &se.pwdt, &se.sc,   &se.sdt, &se.f, &se.xout,
                        &se.ldxo, &se.prew, &se.prewdt, &se.xn,   &se.ldxn, &se.eps});
            se = {};
        } else if (r == 0 && S > 1)
            r = go(K.mm_rows_tc_sum, (unsigned)ceil_div((long)n * N, 256), 1, 256,
                   {&step, &mode, &part, &S, &N, &out0, &ldo, &in2});
        return G4_OK;
    }
    int tiled_rows = 0;
    if (tiled_w && n > 8 &&
        plan::params<plan::MatmulParams>(op).prefill_variant == (int32_t)plan::MatmulVariant::Cublas &&
        ln.g->blas_h)
        tiled_rows = N;
    else if (tiled_w) {
        const nf4::Layout lo = nf4::layout((int64_t)N * Kd, q.absmax2 != 0);
        CUdeviceptr codes = ln.wscratch + cuda_ws::align256((uint64_t)N * Kd * 2), am = codes + lo.absmax_off;
        int dq = q.absmax2 != 0;
        r      = go(K.nf4_untile32, (unsigned)ceil_div((long)N * Kd / 32, 256), 1, 256,
                    {&q.codes, &q.absmax, &dq, &N, &Kd, &codes, &am});
        if (r != 0) return G4_OK;
        q.codes = codes, q.absmax = am;
    }
    if (n > 8 &&
        plan::params<plan::MatmulParams>(op).prefill_variant == (int32_t)plan::MatmulVariant::Cublas &&
        ln.g->blas_h) {
        // cuBLAS tier: x -> bf16 scratch, NF4 -> bf16 scratch, y = x . W^T with fp32 accumulate.
        CUdeviceptr wb = in1;
        if (!st->reuse_x[i])
            r = go(K.f32_to_bf16, n, (unsigned)ceil_div(Kd, 1024), 256,
                   {&step, &in0, &ld0, &ln.xscratch, &Kd});
        if (r == 0 && is_nf4) {
            long numel = (long)N * Kd;
            wb         = ln.wscratch;
            r          = go(K.nf4_to_bf16, (unsigned)ceil_div(numel / 32, 256), 1, 256,
                            {&q.codes, &q.absmax, &q.absmax2, &q.offset, &q.code2, &numel, &wb, &tiled_rows});
        }
        if (r == 0) {
            const float one = 1.0f, zero = 0.0f;
            // The GPU's one handle: this session's stream, then its planned workspace (setting a stream
            // resets the workspace to cuBLAS's own pool), then the GEMM, under the handle's lock.
            std::lock_guard<std::mutex> lock(*ln.g->blas_mu);
            cublas::Handle h = ln.g->blas_h;
            int bs           = st->blas->set_stream(h, ln.stream);
            if (bs == 0) bs = st->blas->set_workspace(h, (void*)ln.cublas_ws, plan::kCublasWorkspaceBytes);
            if (bs == 0)
                bs = st->blas->gemm_ex(h, cublas::kOpT, cublas::kOpN, N, n, Kd, &one, (const void*)wb,
                                       cublas::kR16BF, Kd, (const void*)ln.xscratch, cublas::kR16BF, Kd,
                                       &zero, (void*)out0, cublas::kR32F, (int)ldo, cublas::kCompute32F,
                                       cublas::kGemmDefault);
            if (bs != 0) {
                *err = "cuBLAS error " + std::to_string(bs) + " in op '" + p.str(op.name) + "'";
                return G4_ERR_INTERNAL;
            }
        }
        if (r == 0 && in2)
            r = go(K.add_bias, n, (unsigned)ceil_div(N, 256), 256, {&step, &out0, &ldo, &in2, &N});
        return G4_OK;
    }
    const bool gemv =
        n == 1 && plan::params<plan::MatmulParams>(op).decode_variant == (int32_t)plan::MatmulVariant::Gemv4;
    const bool tc =
        !gemv && n > 8 &&
        (plan::params<plan::MatmulParams>(op).prefill_variant == (int32_t)plan::MatmulVariant::TensorCore ||
         plan::params<plan::MatmulParams>(op).prefill_variant == (int32_t)plan::MatmulVariant::Cublas);
    const bool tiled =
        !gemv && n > 8 &&
        (tc || plan::params<plan::MatmulParams>(op).prefill_variant == (int32_t)plan::MatmulVariant::Tiled64);
    unsigned gx = gemv    ? (unsigned)ceil_div(N, 32)
                  : tiled ? (unsigned)ceil_div(N, 64)
                          : (unsigned)ceil_div(N, 8);
    unsigned gy = tiled ? (unsigned)ceil_div(n, 64) : 1;
    if (is_nf4) {
        CUfunction f = gemv ? K.gemv_nf4 : tc ? K.tc_nf4 : tiled ? K.gemm_nf4 : K.mm_nf4;
        r            = go(f, gx, gy, tc ? 128 : 256,
                          {&step, &mode, &in0, &ld0, &q.codes, &q.absmax, &q.absmax2, &q.offset, &q.code2, &N, &Kd,
                           &out0, &ldo, &in2});
    } else {
        CUfunction f = gemv                              ? K.gemv_bf16
                       : tc                              ? K.tc_bf16
                       : tiled                           ? K.gemm_bf16
                       : w.dtype == (uint8_t)DType::BF16 ? K.mm_bf16
                                                         : K.mm_f32;
        r = go(f, gx, gy, tc ? 128 : 256, {&step, &mode, &in0, &ld0, &in1, &N, &Kd, &out0, &ldo, &in2});
    }
    return G4_OK;
}

} // namespace g4::cuda_rt
