// The batched decode step's launches of decode-schedule records over several rows (batch_fused.h): the
// GEMV family of several rows and the row-wise residual norm (kernels/cuda/decode_rows.cu), each row's
// float32 arithmetic that of the one-row kernel of the record.
#include "runtime/src/cuda/batch_fused.h"

#include "kernels/ops.h"
#include "runtime/plan/launch_params.h"
#include "runtime/plan/op_params.h"
#include "runtime/src/cuda/kernel_args.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace g4::cuda_rt {

using plan::CudaLaunch;
using plan::PlanOp;

namespace {

// A row of floats at a that the kernels' 16-byte loads can read, every ld floats.
bool vec_rows(CUdeviceptr a, int64_t ld) {
    return a % 16 == 0 && ld % 4 == 0;
}

bool tiled(const plan::Plan& p, int32_t w) {
    return (p.tensor(w).quant_flags & plan::kQuantTiled32) != 0;
}

// Gemv record l (its lanes `lanes`) over n rows.
g4_status gemv_rows(SessionState* st, const plan::Plan& p, const CudaLaunch& l, int lanes, int32_t n,
                    bool* done, std::string* label, std::string* err) {
    *done                     = false;
    const Kernels& K          = st->cur->g->k;
    const plan::GemvLaunch gl = plan::launch_params<plan::GemvLaunch>(l);
    const int li = gemv_lanes_index(lanes), pairs = gl.epilogue == 1 ? 1 : 0;
    if (li < 0 || n < 1 || n > 8) return G4_OK;
    GemvArgsH a;
    bool nf4 = false;
    gemv_args(st, p, l, &a, &nf4);
    const CUfunction f = K.gemv_rows[nf4][li][pairs][n <= 4 ? 0 : 1];
    if (!f) return G4_OK;
    GemvRowsLdH ld{};
    ld.x      = ld_of(p, p.op(gl.mat0).in[0]);
    ld.out    = gl.out >= 0 ? ld_of(p, gl.out) : 0;
    ld.aux    = gl.aux >= 0 ? ld_of(p, gl.aux) : 0;
    ld.rows   = n;
    int n_out = 0;
    for (int m = 0; m < gl.nmat; ++m) {
        const PlanOp& op = p.op(gl.mat(m));
        if (tiled(p, op.in[1])) return G4_OK;
        ld.y[m] = ld_of(p, op.out[0]);
        n_out += a.m[m].n;
    }
    if (!vec_rows(a.x, ld.x)) return G4_OK;
    if (pairs) n_out = a.m[0].n;
    const long threads   = gemv_threads(n_out, lanes, pairs);
    const unsigned block = gemv_rows_block(n), smem = gemv_rows_smem(nf4, st->cur->g->sm, a.k, n, &ld.xs);
    CUresult r = launch(st, f, (unsigned)ceil_div(threads, block), 1, block,
                        const_cast<void**>(std::initializer_list<void*>{&a, &ld}.begin()), 1, smem);
    if (r != 0) {
        *err = "CUDA error " + error_name(r) + " launching the GEMV of op '" + p.str(p.op(l.op).name) +
               "' for a batched step";
        return G4_ERR_INTERNAL;
    }
    *label = std::string("gemv_rows ") + (nf4 ? "nf4 " : "bf16 ") + std::to_string(n_out) + "x" +
             std::to_string(a.k) + (pairs ? " pair" : "") + (gl.nmat == 3 ? " qkv" : "");
    *done = true;
    return G4_OK;
}

} // namespace

g4_status bind_batch_fused_kernels(const ModuleKernels& m, Kernels& k, std::string* err) {
    for (int q = 0; q < 2; ++q)
        for (int l = 0; l < 5; ++l)
            for (int pr = 0; pr < 2; ++pr)
                for (int t = 0; t < 2; ++t) {
                    const std::string name = std::string("g4_gemv_rows_") + (q ? "nf4" : "bf16") + "_l" +
                                             std::to_string(kGemvLanes[l]) + (pr ? "_m2" : "_m1") +
                                             (t ? "_t8" : "_t4");
                    CUfunction& f = k.gemv_rows[q][l][pr][t];
                    if (m.get_optional(&f, name) && m.sm >= 90)
                        if (g4_status g = m.smem(f, (int)kGemvRowsSmemMax, name, err); g != G4_OK) return g;
                }
    m.get_optional(&k.resnorm_rows, "g4_resnorm_rows");
    return G4_OK;
}

g4_status launch_gemv_rows(SessionState* st, const plan::Plan& p, const CudaLaunch& l, int32_t n, bool* done,
                           std::string* label, std::string* err) {
    return gemv_rows(st, p, l, plan::launch_params<plan::GemvLaunch>(l).lanes, n, done, label, err);
}

bool mlp_gate_up(const plan::Plan& p, const CudaLaunch& l) {
    const plan::MlpLaunch ml = plan::launch_params<plan::MlpLaunch>(l);
    const int32_t i0         = l.op;
    if (ml.gate != i0 || ml.up != i0 + 1 || l.count < 3 || (size_t)i0 + 2 >= p.n_ops()) return false;
    const PlanOp &g = p.op(i0), &u = p.op(i0 + 1), &gm = p.op(i0 + 2);
    if (g.code != (uint16_t)OpCode::Matmul || u.code != (uint16_t)OpCode::Matmul ||
        gm.code != (uint16_t)OpCode::GeluMul || gm.in[0] != g.out[0] || gm.in[1] != u.out[0] ||
        g.in[0] != u.in[0] || g.in_col[0] != u.in_col[0] || gm.in_col[0] || gm.in_col[1] || gm.out_col[0] ||
        g.out_col[0] || u.out_col[0])
        return false;
    for (int32_t j = i0 + 3; j < i0 + l.count; ++j) // the gate's and up's outputs are not read after
        for (int32_t t : p.op(j).in)
            if (t >= 0 && (t == g.out[0] || t == u.out[0])) return false;
    return true;
}

bool gated_proj_gate(const plan::Plan& p, const CudaLaunch& l) {
    const int32_t i0 = l.op;
    if (l.count != 3 || (size_t)i0 + 2 >= p.n_ops()) return false;
    const PlanOp &g = p.op(i0), &gm = p.op(i0 + 1), &pr = p.op(i0 + 2);
    return g.code == (uint16_t)OpCode::Matmul && gm.code == (uint16_t)OpCode::GeluMul &&
           pr.code == (uint16_t)OpCode::Matmul && gm.in[0] == g.out[0] && gm.in[1] != g.out[0] &&
           !gm.in_col[0] && !gm.out_col[0] && !g.out_col[0] && pr.in[0] == gm.out[0] && !pr.in_col[0] &&
           pr.in[1] != g.out[0] && pr.in[2] != g.out[0];
}

g4_status launch_mlp_gate_up_rows(SessionState* st, const plan::Plan& p, const CudaLaunch& l, int32_t n,
                                  bool* done, std::string* label, std::string* err) {
    *done            = false;
    const int32_t i0 = l.op;
    if (!mlp_gate_up(p, l)) return G4_OK;
    const PlanOp &g = p.op(i0), &gm = p.op(i0 + 2);
    // Lanes a weight row: the fewest (from 8) that leave a lane at most 4 of the row's 16-byte chunks.
    const int64_t K = p.tensor(g.in[1]).dims[1];
    const int64_t C = K / (p.tensor(g.in[1]).dtype == (uint8_t)DType::NF4 ? 32 : 8);
    int lanes       = 8;
    while (lanes < 128 && C > 4 * lanes)
        lanes *= 2;
    CudaLaunch gu = l;
    gu.kind       = (uint16_t)plan::LaunchKind::Gemv;
    gu.count      = 3;
    plan::GemvLaunch gp;
    gp.mat0 = i0, gp.mat1 = i0 + 1, gp.nmat = 2, gp.epilogue = 1, gp.lanes = lanes, gp.out = gm.out[0];
    plan::set_launch_params(gu, gp);
    return gemv_rows(st, p, gu, lanes, n, done, label, err);
}

g4_status launch_gated_proj_rows(SessionState* st, const plan::Plan& p, const CudaLaunch& l, int32_t n,
                                 bool* done, std::string* label, std::string* err) {
    *done            = false;
    const int32_t i0 = l.op;
    // Up to 4 rows: at 8 rows the two GEMVs took 1264 us a step of 35 layers against 1063 us for the record's
    // ops one by one (2..8-row matmuls and the GeluMul) on an H200.
    if (n > 4 || !gated_proj_gate(p, l)) return G4_OK;
    const PlanOp &g = p.op(i0), &gm = p.op(i0 + 1), &pr = p.op(i0 + 2);
    auto lanes_for = [&](int32_t w) {
        const int64_t C = p.tensor(w).dims[1] / (p.tensor(w).dtype == (uint8_t)DType::NF4 ? 32 : 8);
        int lanes       = 8;
        while (lanes < 128 && C > 4 * lanes)
            lanes *= 2;
        return lanes;
    };
    CudaLaunch gl = l;
    gl.kind       = (uint16_t)plan::LaunchKind::Gemv;
    gl.count      = 2;
    plan::GemvLaunch gp;
    gp.mat0 = i0, gp.nmat = 1, gp.epilogue = 2, gp.aux = gm.in[1], gp.aux_col = gm.in_col[1];
    gp.out = gm.out[0], gp.lanes = lanes_for(g.in[1]);
    plan::set_launch_params(gl, gp);
    bool first = false;
    if (g4_status r = gemv_rows(st, p, gl, gp.lanes, n, &first, label, err); r != G4_OK || !first) return r;
    CudaLaunch pl = l;
    pl.kind       = (uint16_t)plan::LaunchKind::Gemv;
    pl.op = i0 + 2, pl.count = 1;
    plan::GemvLaunch pp;
    pp.mat0 = i0 + 2, pp.nmat = 1, pp.lanes = lanes_for(pr.in[1]);
    plan::set_launch_params(pl, pp);
    std::string second;
    if (g4_status r = gemv_rows(st, p, pl, pp.lanes, n, done, &second, err); r != G4_OK) return r;
    if (!*done) { // the gate ran: the projection one by one
        *err = "internal: the projection of gated op '" + std::string(p.str(g.name)) + "' has no rows launch";
        return G4_ERR_INTERNAL;
    }
    *label = "gated_proj rows";
    return G4_OK;
}

namespace {

// ResNorm record l's tensors as g4_resnorm_rows takes them, in *e (its d at *d, *ldd); false where the rows
// kernel does not take them (its float4 path, which the one-row kernel takes for these rows, cannot read
// them: the same sums), or the module lacks it.
bool resnorm_args(SessionState* st, const plan::Plan& p, const CudaLaunch& l, SessionState::SumEpilogue* e,
                  CUdeviceptr* d, long* ldd) {
    const plan::ResNormLaunch rn = plan::launch_params<plan::ResNormLaunch>(l);
    if (!st->cur->g->k.resnorm_rows || rn.x < 0 || rn.cols % 4 != 0) return false;
    auto T  = [&](int32_t t) { return t >= 0 ? addr(st, p, t, 0) : (CUdeviceptr)0; };
    e->kind = SessionState::SumEpilogue::ResNorm;
    e->x = T(rn.x), e->pw = T(rn.post_w), e->sc = T(rn.scalar), e->xout = T(rn.x_out), e->prew = T(rn.pre_w);
    e->xn = T(rn.xn), *d = T(rn.d);
    e->ldx = ld_of(p, rn.x), *ldd = ld_of(p, rn.d), e->ldxo = ld_of(p, rn.x_out), e->ldxn = ld_of(p, rn.xn);
    e->pwdt = dt_code(p, rn.post_w), e->sdt = dt_code(p, rn.scalar), e->prewdt = dt_code(p, rn.pre_w);
    e->f = rn.scale, e->eps = rn.eps;
    return vec_rows(e->x, e->ldx) && (!*d || vec_rows(*d, *ldd)) &&
           (!e->xout || vec_rows(e->xout, e->ldxo)) && (!e->xn || vec_rows(e->xn, e->ldxn));
}

// Whether op a references tensor t.
bool uses(const PlanOp& a, int32_t t) {
    return a.in[0] == t || a.in[1] == t || a.in[2] == t || a.out[0] == t || a.out[1] == t;
}

// The first op after op i (within 16) that references tensor t, or SIZE_MAX.
size_t next_use(const plan::Plan& p, size_t i, int32_t t) {
    for (size_t j = i + 1; j < p.n_ops() && j <= i + 16; ++j)
        if (uses(p.op(j), t)) return j;
    return SIZE_MAX;
}

} // namespace

g4_status launch_resnorm_rows(SessionState* st, const plan::Plan& p, const CudaLaunch& l, int32_t n,
                              bool* done, std::string* err) {
    *done = false;
    SessionState::SumEpilogue e;
    CUdeviceptr dd = 0;
    long ldd       = 0;
    if (!resnorm_args(st, p, l, &e, &dd, &ldd)) return G4_OK;
    int H             = plan::launch_params<plan::ResNormLaunch>(l).cols;
    const unsigned nt = H <= 2048 ? 512 : 1024; // as the one-row launch (the block sums' order)
    CUresult r        = launch(st, st->cur->g->k.resnorm_rows, (unsigned)n, 1, nt,
                               const_cast<void**>(std::initializer_list<void*>{
                                   &e.x, &e.ldx, &dd, &ldd, &e.pw, &e.pwdt, &e.sc, &e.sdt, &e.f, &e.xout, &e.ldxo,
                                   &e.prew, &e.prewdt, &e.xn, &e.ldxn, &H, &e.eps}
                                               .begin()));
    if (r != 0) {
        *err = "CUDA error " + error_name(r) + " launching the residual norm of op '" +
               p.str(p.op(l.op).name) + "' for a batched step";
        return G4_ERR_INTERNAL;
    }
    *done = true;
    return G4_OK;
}

bool sum_epilogue(SessionState* st, const plan::Plan& p, size_t i, const CudaLaunch* next,
                  const std::vector<uint8_t>& op_by_op, size_t* ran0, size_t* ran1) {
    const Kernels& K = st->cur->g->k;
    const PlanOp& mm = p.op(i);
    *ran0 = *ran1 = SIZE_MAX;
    st->sum_epi   = {};
    if (mm.code != (uint16_t)OpCode::Matmul || mm.in[1] < 0 || mm.out[0] < 0 || mm.out_col[0] != 0)
        return false;
    const int32_t t = mm.out[0];
    const int64_t N = p.tensor(mm.in[1]).dims[0];
    if (next && K.mm_rows_tc_sum_resnorm) { // the ResNorm record after the matmul's
        const plan::ResNormLaunch rn = plan::launch_params<plan::ResNormLaunch>(*next);
        CUdeviceptr d                = 0;
        long ldd                     = 0;
        SessionState::SumEpilogue e;
        if (rn.d == t && rn.cols == N && resnorm_args(st, p, *next, &e, &d, &ldd)) { // d: t, float4 rows
            st->sum_epi = e;
            return true;
        }
    }
    if (!K.mm_rows_tc_sum_norm_rope) return false;
    // The per-head RmsNorm in place on the output, the first op to read it; then its Rope, the next one.
    const size_t j = next_use(p, i, t);
    if (j == SIZE_MAX || !op_by_op[j]) return false;
    const PlanOp& nm = p.op(j);
    if (nm.code != (uint16_t)OpCode::RmsNorm || nm.in[0] != t || nm.out[0] != t || nm.in_col[0] != 0 ||
        nm.out_col[0] != 0)
        return false;
    const auto np = plan::params<plan::RmsNormParams>(nm);
    if (np.cols != N || np.dim <= 0 || np.dim > 1024 || np.dim % 64 != 0 || N % np.dim != 0) return false;
    SessionState::SumEpilogue e;
    e.kind = SessionState::SumEpilogue::HeadNorm;
    e.w = nm.in[1] >= 0 ? addr(st, p, nm.in[1], 0) : 0, e.wdt = dt_code(p, nm.in[1]), e.dim = np.dim;
    e.eps          = np.eps;
    *ran0          = j;
    const size_t k = next_use(p, j, t);
    if (k != SIZE_MAX && op_by_op[k] && p.op(k).code == (uint16_t)OpCode::Rope && p.op(k).in[0] == t &&
        p.op(k).in_col[0] == 0 && p.op(k).in[1] >= 0) {
        const auto rp = plan::params<plan::RopeParams>(p.op(k));
        if (rp.dim == np.dim && (int64_t)rp.heads * rp.dim == N) {
            e.inv_freq = addr(st, p, p.op(k).in[1], 0);
            *ran1      = k;
        }
    }
    st->sum_epi = e;
    return true;
}

} // namespace g4::cuda_rt
