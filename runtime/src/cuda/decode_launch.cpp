// Binding and launch of the fused decode kernels, one CUDA_SCHEDULE record each: the GEMV family, the
// residual norms, the grouped scale-norm-add, the q/k/v post-projection, the MLP, the attention merge with
// the output projection, the gated projection.
#include "kernels/ref/ref.h"
#include "runtime/plan/launch_params.h"
#include "runtime/plan/op_params.h"
#include "runtime/src/cuda/kernel_args.h"
#include "runtime/src/cuda/launch.h"
#include "runtime/src/cuda/workspace.h"
#include "runtime/src/engine.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace g4::cuda_rt {

using namespace g4::cu;
using plan::CudaLaunch;
using plan::LaunchKind;
using plan::PlanOp;
using plan::PlanTensor;
using plan::RowMode;
using plan::TensorKind;

g4_status bind_decode_kernels(const ModuleKernels& m, Kernels& k, std::string* err) {
    const KernelName fns[] = {{&k.resnorm, "g4_resnorm"},
                              {&k.resnorm_rep, "g4_resnorm_rep"},
                              {&k.resnorm_z2, "g4_resnorm_z2"},
                              {&k.group_norm_add, "g4_group_norm_add"},
                              {&k.mlp[0], "g4_mlp_nf4"},
                              {&k.mlp[1], "g4_mlp_nf4_b256"},
                              {&k.mlp[2], "g4_mlp_nf4_dq"},
                              {&k.mlp[3], "g4_mlp_nf4_b256_dq"},
                              {&k.mlp[4], "g4_mlp_nf4_rep"},
                              {&k.mlp[5], "g4_mlp_nf4_b256_rep"},
                              {&k.mlp[6], "g4_mlp_nf4_dq_rep"},
                              {&k.mlp[7], "g4_mlp_nf4_b256_dq_rep"},
                              {&k.mlp[8], "g4_mlp_nf4_h2"},
                              {&k.mlp[9], "g4_mlp_nf4_b256_h2"},
                              {&k.mlp[10], "g4_mlp_nf4_h2_rep"},
                              {&k.mlp[11], "g4_mlp_nf4_b256_h2_rep"},
                              {&k.mlp_z[0], "g4_mlp_nf4_b256_z"},
                              {&k.mlp_z[1], "g4_mlp_nf4_b256_dq_z"},
                              {&k.mlp_z[2], "g4_mlp_nf4_b256_h2_z"},
                              {&k.mlp_r[0], "g4_mlp_nf4_h2_r"},
                              {&k.mlp_r[1], "g4_mlp_nf4_b256_h2_r"},
                              {&k.mlp_r[2], "g4_mlp_nf4_h2_rep_r"},
                              {&k.mlp_r[3], "g4_mlp_nf4_b256_h2_rep_r"},
                              {&k.mlp_r[4], "g4_mlp_nf4_b256_h2_z_r"},
                              {&k.attn_o[0], "g4_attn_o_nf4_g1"},
                              {&k.attn_o[1], "g4_attn_o_nf4_g2"},
                              {&k.attn_o[2], "g4_attn_o_nf4_g3"},
                              {&k.attn_o[3], "g4_attn_o_nf4_g4"},
                              {&k.gated_proj[0], "g4_gated_proj_bf16_g1"},
                              {&k.gated_proj[1], "g4_gated_proj_bf16_g2"},
                              {&k.gated_proj[2], "g4_gated_proj_bf16_g3"},
                              {&k.gated_proj[3], "g4_gated_proj_bf16_g4"},
                              {&k.resnorm_gated_proj[0], "g4_resnorm_gated_proj_bf16_g1"},
                              {&k.resnorm_gated_proj[1], "g4_resnorm_gated_proj_bf16_g2"},
                              {&k.resnorm_gated_proj[2], "g4_resnorm_gated_proj_bf16_g3"},
                              {&k.resnorm_gated_proj[3], "g4_resnorm_gated_proj_bf16_g4"}};
    if (g4_status g = m.get_all(fns, err); g != G4_OK) return g;
    for (int q = 0; q < 2; ++q)
        for (int l = 0; l < 5; ++l)
            for (int p = 0; p < 2; ++p) {
                const std::string n = gemv_kernel_name(q, kGemvLanes[l], p);
                if (g4_status g = m.get(&k.gemv[q][l][p], n, err); g != G4_OK) return g;
                if (gemv_smem(q, m.sm, 0))
                    if (g4_status g = m.smem(k.gemv[q][l][p], (int)kGemvSmemMax, n, err); g != G4_OK)
                        return g;
            }
    if (gemv_smem(true, m.sm, 0)) {
        // Every fused-MLP kernel (g4_mlp_nf4*: k.mlp, mlp_z, mlp_r) stages its tables in this dynamic shared
        // memory: one rule by name, so no family of them (_z, _r, ...) can be left out.
        for (auto& f : fns)
            if (std::strncmp(f.name, "g4_mlp_nf4", 10) == 0)
                if (g4_status g = m.smem(*f.f, (int)kGemvSmemMax, f.name, err); g != G4_OK) return g;
        for (CUfunction f : k.attn_o)
            if (g4_status g = m.smem(f, (int)kGemvWideSmem, "g4_attn_o_nf4", err); g != G4_OK) return g;
    }
    return G4_OK;
}

// The arguments of Gemv launch record `l` on the current lane; returns the threads it launches.
long gemv_args(const SessionState* st, const plan::Plan& p, const CudaLaunch& l, GemvArgsH* out,
               bool* is_nf4) {
    GemvArgsH& a = *out;
    std::memset(&a, 0, sizeof a);
    const plan::GemvLaunch gl = plan::launch_params<plan::GemvLaunch>(l);
    const int nmat = gl.nmat, epi = gl.epilogue, pairs = epi == 1 ? 1 : 0;
    bool nf4  = false;
    int n_out = 0, K_ = 0;
    for (int m = 0; m < nmat; ++m) {
        const PlanOp& op    = p.op(gl.mat(m));
        const PlanTensor& w = p.tensor(op.in[1]);
        CUdeviceptr base    = addr(st, p, op.in[1], 0);
        GemvMatH& g         = a.m[m];
        nf4                 = w.dtype == (uint8_t)DType::NF4;
        K_                  = (int)w.dims[1];
        g.n                 = (int)w.dims[0];
        g.bias              = addr(st, p, op.in[2], op.in_col[2]);
        g.y                 = addr(st, p, op.out[0], op.out_col[0]);
        if (nf4) {
            Nf4Ptrs q = nf4_ptrs(base, w);
            g.w = q.codes, g.absmax = q.absmax, g.absmax2 = q.absmax2, g.offset = q.offset, g.code2 = q.code2;
        } else {
            g.w = base;
        }
        if (m == 0) a.x = addr(st, p, op.in[0], op.in_col[0]);
        n_out += g.n;
    }
    if (pairs) n_out = a.m[0].n;
    a.nmat = nmat, a.k = K_, a.epi = epi, a.cap = gl.cap;
    a.out   = addr(st, p, gl.out, 0);
    a.aux   = addr(st, p, gl.aux, gl.aux_col);
    *is_nf4 = nf4;
    return gemv_threads(n_out, gl.lanes, pairs);
}

g4_status launch_fused(g4_session* s, const CudaLaunch& l, std::string* err) {
    SessionState* st    = session_of(s);
    const plan::Plan& p = s->engine->plan;
    const Kernels& K    = st->cur->g->k;
    CUdeviceptr step    = st->cur->step;
    auto T              = [&](int32_t t) { return addr(st, p, t, 0); };
    CUresult r          = 0;
    auto go             = [&](CUfunction f, unsigned gx, unsigned bx, std::initializer_list<void*> args,
                  unsigned smem = 0) {
        return launch(st, f, gx, 1, bx, const_cast<void**>(args.begin()), 1, smem);
    };
    switch ((LaunchKind)l.kind) {
    case LaunchKind::ResNorm: {
        // Folded 1: the GatedProj launch after runs it (g4_resnorm_gated_proj), the MLP before zeroes its
        // `zeroed`; folded 2: the Mlp launch after runs it (its _r kernel), an earlier ResNorm zeroes its
        // `zeroed` (that one's zero2).
        const plan::ResNormLaunch rn = plan::launch_params<plan::ResNormLaunch>(l);
        if (rn.folded == 1 || rn.folded == 2) break;
        CUdeviceptr x = T(rn.x), dd = T(rn.d), pw = T(rn.post_w), sc = T(rn.scalar), xo = T(rn.x_out),
                    prew = T(rn.pre_w), xn = T(rn.xn), zero = T(rn.zeroed);
        int pwdt = dt_code(p, rn.post_w), sdt = dt_code(p, rn.scalar), prewdt = dt_code(p, rn.pre_w),
            H   = rn.cols;
        float f = rn.scale, eps = rn.eps;
        CUdeviceptr dr    = st->cur->mlp_rep;
        int nrep          = st->rep_in;
        const unsigned nt = H <= 2048 ? 512 : 1024;
        CUdeviceptr zero2 = rn.zero2 > 0 ? T(rn.zero2 - 1) : 0; // the reader checked: not after replicas
        r                 = nrep ? go(K.resnorm_rep, 1, nt,
                                      {&x, &dd, &pw, &pwdt, &sc, &sdt, &f, &xo, &prew, &prewdt, &xn, &H, &eps, &zero, &dr,
                                       &nrep})
                            : zero2
                                ? go(K.resnorm_z2, 1, nt,
                                     {&x, &dd, &pw, &pwdt, &sc, &sdt, &f, &xo, &prew, &prewdt, &xn, &H, &eps, &zero, &zero2})
                                : go(K.resnorm, 1, nt,
                                     {&x, &dd, &pw, &pwdt, &sc, &sdt, &f, &xo, &prew, &prewdt, &xn, &H, &eps, &zero});
        break;
    }
    case LaunchKind::GroupNormAdd: {
        const plan::GroupNormAddLaunch g = plan::launch_params<plan::GroupNormAddLaunch>(l);
        CUdeviceptr ctx = T(g.ctx), w = T(g.w), tok = T(g.tok), out = T(g.out);
        int wdt = dt_code(p, g.w), P = g.group;
        float s1  = plan::params<plan::ScaleParams>(p.op(l.op)).scale,
              eps = plan::params<plan::RmsNormParams>(p.op(l.op + 1)).eps,
              s2  = plan::params<plan::ScaleParams>(p.op(l.op + 3)).scale;
        r         = go(K.group_norm_add, (unsigned)(g.cols / P), (unsigned)((P + 31) / 32 * 32),
                       {&ctx, &w, &wdt, &tok, &out, &P, &s1, &eps, &s2});
        break;
    }
    case LaunchKind::QkvPost:
    case LaunchKind::QkvAttn: {
        const bool attn          = l.kind == (uint16_t)LaunchKind::QkvAttn;
        const plan::QkvLaunch ql = plan::launch_params<plan::QkvLaunch>(l);
        const int post = attn ? ql.post_ops : l.count; // QkvPost ops: 2 (q) or 6 (q, k, v and the store)
        CUdeviceptr q = T(ql.q), qw = T(ql.q_norm_w), invf = T(ql.inv_freq), k = T(ql.k), kw = T(ql.k_norm_w),
                    v = T(ql.v), kc = T(ql.k_cache), vc = T(ql.v_cache);
        int wdt = dt_code(p, ql.q_norm_w), heads = ql.heads, kvh = post == 6 ? ql.kv_heads : 1, dim = ql.dim,
            slots       = std::max(1, ql.slots);
        int kvdt        = dt_code(p, ql.k_cache);
        float eps       = ql.eps;
        const size_t ai = attn ? (size_t)l.op + l.count - 1 : 0; // the attention op
        if (attn && decode_attention_fits(p, p.op(ai), dt_code(p, p.op(ai).in[1]))) {
            const AttnPostH pa{post == 6 ? k : 0, post == 6 ? v : 0, qw, kw, invf, wdt, eps};
            r = launch_decode_attention(st, p, p.op(ai), step, q, &pa);
            break;
        }
        unsigned grid  = (unsigned)(heads + (post == 6 ? 2 * kvh : 0)),
                 block = (unsigned)std::max(32, (dim / 2 + 31) / 32 * 32);
        r              = go(K.qkv_post, grid, block,
                            {&step, &q, &qw, &k, &kw, &v, &wdt, &invf, &kc, &vc, &heads, &kvh, &dim, &slots, &eps, &kvdt});
        if (r == 0 && attn) return launch_op(s, ai, 1, 1, err); // a shape the decode kernel does not take
        break;
    }
    case LaunchKind::Gemv: {
        GemvArgsH a;
        bool nf4                  = false;
        long threads              = gemv_args(st, p, l, &a, &nf4);
        const plan::GemvLaunch gl = plan::launch_params<plan::GemvLaunch>(l);
        const int pairs           = gl.epilogue == 1 ? 1 : 0;
        r = go(K.gemv[nf4][gemv_lanes_index(gl.lanes)][pairs], (unsigned)ceil_div(threads, 128), 128, {&a},
               gemv_smem(nf4, st->cur->g->sm, a.k));
        break;
    }
    case LaunchKind::Mlp: {
        MlpArgsH a;
        std::memset(&a, 0, sizeof a);
        const plan::MlpLaunch ml = plan::launch_params<plan::MlpLaunch>(l);
        CudaLaunch gu            = l; // the gate/up pair as a Gemv record: its weights and input
        plan::GemvLaunch gp;
        gp.mat0 = ml.gate, gp.mat1 = ml.up, gp.nmat = 2, gp.epilogue = 1, gp.lanes = 8;
        plan::set_launch_params(gu, gp);
        bool nf4 = false;
        gemv_args(st, p, gu, &a.gu, &nf4);
        const PlanOp& dn    = p.op(ml.down);
        const PlanTensor& w = p.tensor(dn.in[1]);
        const Nf4Ptrs q     = nf4_ptrs(addr(st, p, dn.in[1], 0), w);
        a.codes = q.codes, a.absmax = q.absmax, a.absmax2 = q.absmax2, a.offset = q.offset, a.code2 = q.code2;
        a.bias = addr(st, p, dn.in[2], dn.in_col[2]);
        a.y    = addr(st, p, dn.out[0], dn.out_col[0]);
        a.H = (int)w.dims[0], a.I = (int)w.dims[1];
        if (st->rep_out) a.yr = st->cur->mlp_rep, a.nrep = st->rep_out;
        // The compiler fuses only gate, up and down of one scale format (cuda_schedule.cpp mlp): the down's
        // picks the kernel. f16: the packed-f16 kernels (f32 scales only: the reader checks).
        const int b256 = ml.threads == 256 ? 1 : 0;
        const int kf =
            ml.f16 ? 8 + b256 + (st->rep_out ? 2 : 0) : b256 + (q.absmax2 ? 2 : 0) + (st->rep_out ? 4 : 0);
        // Before a folded ResNorm (the reader checked: 256 threads, one output): the _z kernel zeroes the
        // GatedProj launch's output.
        if (st->fold_next) a.zero = T(plan::launch_params<plan::ResNormLaunch>(*st->fold_next).zeroed);
        CUfunction f = st->fold_next ? K.mlp_z[ml.f16 ? 2 : q.absmax2 ? 1 : 0] : K.mlp[kf];
        // After a ResNorm folded in (the reader checked: packed f16, mlp_res_fits, no scale): the _r kernel
        // runs it.
        if (st->mlp_res) {
            const plan::ResNormLaunch rn = plan::launch_params<plan::ResNormLaunch>(*st->mlp_res);
            a.rx = T(rn.x), a.rd = T(rn.d), a.rpw = T(rn.post_w), a.xo = T(rn.x_out), a.rprew = T(rn.pre_w);
            a.rpwdt = dt_code(p, rn.post_w), a.rprewdt = dt_code(p, rn.pre_w), a.eps = rn.eps;
            f = K.mlp_r[st->fold_next ? 4 : b256 + (st->rep_out ? 2 : 0)];
        }
        r = go(f, (unsigned)(a.I / 32), (unsigned)ml.threads, {&a}, gemv_smem(true, st->cur->g->sm, a.H));
        break;
    }
    case LaunchKind::AttnO: {
        AttnOArgsH a;
        std::memset(&a, 0, sizeof a);
        const PlanOp &o = p.op(l.op), &at = p.op(plan::launch_params<plan::AttnOLaunch>(l).attention);
        const PlanTensor& w = p.tensor(o.in[1]);
        const Nf4Ptrs q     = nf4_ptrs(addr(st, p, o.in[1], 0), w);
        a.step = step, a.part = st->cur->part;
        a.codes = q.codes, a.absmax = q.absmax, a.absmax2 = q.absmax2, a.offset = q.offset, a.code2 = q.code2;
        a.bias        = addr(st, p, o.in[2], o.in_col[2]);
        a.y           = addr(st, p, o.out[0], o.out_col[0]);
        const auto ap = plan::params<plan::AttentionParams>(at);
        a.H = (int)w.dims[0], a.K = (int)w.dims[1], a.dim = ap.dim, a.splits = ap.decode_splits,
        a.window = ap.window;
        r = go(K.attn_o[slice_row_groups(a.H) - 1], (unsigned)(a.K / 32), kSliceThreads, {&a}, kGemvWideSmem);
        break;
    }
    case LaunchKind::GatedProj: {
        GatedProjArgsH a;
        std::memset(&a, 0, sizeof a);
        const PlanOp &g = p.op(l.op), &gm = p.op(l.op + 1), &pr = p.op(l.op + 2);
        a.x = addr(st, p, g.in[0], g.in_col[0]), a.wg = addr(st, p, g.in[1], 0),
        a.bg  = addr(st, p, g.in[2], g.in_col[2]);
        a.aux = addr(st, p, gm.in[1], gm.in_col[1]);
        a.wp = addr(st, p, pr.in[1], 0), a.bp = addr(st, p, pr.in[2], pr.in_col[2]),
        a.y = addr(st, p, pr.out[0], pr.out_col[0]);
        a.H = (int)p.tensor(pr.in[1]).dims[0], a.P = (int)p.tensor(pr.in[1]).dims[1];
        if (st->fold_prev) { // the ResNorm before, folded in (the reader checked its fields)
            const plan::ResNormLaunch rn = plan::launch_params<plan::ResNormLaunch>(*st->fold_prev);
            a.rx = T(rn.x), a.rd = T(rn.d), a.rpw = T(rn.post_w), a.xo = T(rn.x_out);
            a.rpwdt = dt_code(p, rn.post_w), a.eps = rn.eps;
        }
        r = go((st->fold_prev ? K.resnorm_gated_proj : K.gated_proj)[slice_row_groups(a.H) - 1],
               (unsigned)(a.P / 8), kSliceThreads, {&a});
        break;
    }
    default:
        *err = "internal: bad launch kind";
        return G4_ERR_INTERNAL;
    }
    if (r != 0) {
        *err = "CUDA error " + error_name(r) + " launching the fused kernel for op '" +
               p.str(p.op(l.op).name) + "'";
        return G4_ERR_INTERNAL;
    }
    return G4_OK;
}

} // namespace g4::cuda_rt
