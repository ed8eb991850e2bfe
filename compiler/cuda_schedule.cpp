// CUDA kernel variants and the fused decode schedule (see cuda_schedule.h).
#include "compiler/cuda_schedule.h"

#include "runtime/plan/launch_params.h"
#include "runtime/plan/op_params.h"
#include "runtime/src/cuda/kernel_args.h"

#include <algorithm>
#include <cstring>

namespace g4::cuda {

using namespace plan;

void choose_variants(std::vector<PlanOp>& ops, const std::vector<PlanTensor>& tensors, int64_t max_context,
                     const std::string& prefill_precision) {
    for (PlanOp& op : ops) {
        if (op.code == (uint16_t)OpCode::Matmul) {
            const PlanTensor& w = tensors[op.in[1]];
            const int64_t K     = w.dims[1];
            const bool nf4 = w.dtype == (uint8_t)DType::NF4, bf16 = w.dtype == (uint8_t)DType::BF16;
            const bool gemv   = (nf4 && K % 512 == 0) || (bf16 && K % 256 == 0);
            const bool tiled  = K % 32 == 0 && (nf4 || bf16);
            MatmulParams mp   = params<MatmulParams>(op);
            mp.decode_variant = (int32_t)(gemv ? MatmulVariant::Gemv4 : MatmulVariant::PerRow);
            // Prefill: whole chunks of rows go to cuBLAS (bf16 operands, NF4 dequantized per call);
            // the logits rows (a handful) to the in-house tensor-core kernel.
            MatmulVariant pre = MatmulVariant::PerRow;
            if (tiled && prefill_precision == "fp32")
                pre = MatmulVariant::Tiled64;
            else if (tiled) {
                const bool aligned =
                    op.in_col[0] % 4 == 0 && tensors[op.in[0]].dims[1] % 4 == 0 && op.out_col[0] == 0;
                pre = op.row_mode == (int32_t)plan::RowMode::All && aligned ? MatmulVariant::Cublas
                                                                            : MatmulVariant::TensorCore;
            }
            mp.prefill_variant = (int32_t)pre;
            set_params(op, mp);
        } else if (op.code == (uint16_t)OpCode::Attention) {
            AttentionParams ap = params<AttentionParams>(op);
            int64_t span       = ap.window > 0 ? std::min<int64_t>(ap.window, max_context) : max_context;
            // Prefill: bf16 plans take the tensor-core flash kernel (ip5 = 0) where it has an instance for
            // the head dim; fp32 plans (and other dims) one block per row and head, >= 64 keys a block, <= 32
            // partials to merge.
            const int64_t dim = ap.dim;
            const bool flash =
                prefill_precision == "bf16" && dim >= 16 && dim <= 512 && (dim & (dim - 1)) == 0;
            ap.prefill_splits =
                flash ? 0 : (int32_t)std::max<int64_t>(1, std::min<int64_t>(32, (span + 63) / 64));
            ap.decode_splits = decode_attention_splits(span);
            set_params(op, ap);
        }
    }
}

int decode_attention_splits(int64_t span) {
    return (int)std::max<int64_t>(1, std::min<int64_t>(1024, (span + 7) / 8));
}

namespace {

struct Matcher {
    const std::vector<PlanOp>& ops;
    const std::vector<PlanTensor>& tensors;
    const std::vector<int>& device; // per op (empty: one GPU); CPU ops (-1) are never fused
    std::vector<int64_t> last_read; // per tensor: the last op index that reads it

    Matcher(const std::vector<PlanOp>& o, const std::vector<PlanTensor>& t, const std::vector<int>& d)
        : ops(o), tensors(t), device(d), last_read(t.size(), -1) {
        for (size_t i = 0; i < ops.size(); ++i)
            for (int32_t x : ops[i].in)
                if (x >= 0) last_read[x] = std::max<int64_t>(last_read[x], (int64_t)i);
    }
    bool is(size_t i, OpCode c) const {
        return i < ops.size() && ops[i].code == (uint16_t)c && !(i < device.size() && device[i] < 0);
    }
    bool unread_after(int32_t t, size_t i) const { return t < 0 || last_read[t] <= (int64_t)i; }
    int64_t cols(int32_t t) const { return tensors[t].dims[1]; }
    template <class P> P prm(size_t i) const { return params<P>(ops[i]); }
    // The row width of op i, an op whose parameters start with `cols` (RmsNorm, Add, Scale, GeluMul,
    // Softcap).
    int32_t cols_param(size_t i) const {
        switch ((OpCode)ops[i].code) {
        case OpCode::RmsNorm:
            return prm<RmsNormParams>(i).cols;
        case OpCode::Add:
            return prm<AddParams>(i).cols;
        case OpCode::Scale:
            return prm<ScaleParams>(i).cols;
        case OpCode::GeluMul:
            return prm<GeluMulParams>(i).cols;
        case OpCode::Softcap:
            return prm<SoftcapParams>(i).cols;
        default:
            return -1;
        }
    }
    // An in-place full-row RmsNorm of `t` (or of anything, t = -1) with weight.
    bool full_norm(size_t i) const {
        if (!is(i, OpCode::RmsNorm)) return false;
        const PlanOp& o        = ops[i];
        const RmsNormParams np = prm<RmsNormParams>(i);
        return o.in_col[0] == 0 && o.out_col[0] == 0 && np.cols == np.dim && np.cols <= 4096;
    }

    static CudaLaunch record(LaunchKind k, size_t op, size_t count) {
        CudaLaunch l;
        std::memset(&l, 0, sizeof l);
        l.kind  = (uint16_t)k;
        l.op    = (int32_t)op;
        l.count = (uint16_t)count;
        for (int32_t& t : l.t)
            t = -1;
        return l;
    }

    bool resnorm(size_t i, CudaLaunch* out) const {
        if (!full_norm(i) || ops[i].in[0] != ops[i].out[0] || ops[i].in[1] < 0) return false;
        const PlanOp& norm     = ops[i];
        const RmsNormParams np = prm<RmsNormParams>(i);
        const int32_t d = norm.in[0], H = np.cols;
        if (!is(i + 1, OpCode::Add)) return false;
        const PlanOp& add = ops[i + 1];
        if (prm<AddParams>(i + 1).cols != H || add.in_col[0] || add.in_col[1] || add.out_col[0] ||
            add.out[0] == d)
            return false;
        int32_t x = add.in[0] == d ? add.in[1] : add.in[1] == d ? add.in[0] : -1;
        if (x < 0 || x == add.out[0]) return false;
        const int32_t y = add.out[0];
        size_t j        = i + 2;
        CudaLaunch l    = record(LaunchKind::ResNorm, i, 0);
        ResNormLaunch r;
        r.eps  = np.eps;
        r.cols = H;
        if (is(j, OpCode::Scale) && ops[j].in[0] == y && ops[j].out[0] == y && !ops[j].in_col[0] &&
            prm<ScaleParams>(j).cols == H) {
            r.scalar = ops[j].in[1];
            r.scale  = prm<ScaleParams>(j).scale;
            ++j;
        }
        if (full_norm(j) && ops[j].in[0] == y && ops[j].out[0] != y && prm<RmsNormParams>(j).cols == H &&
            prm<RmsNormParams>(j).eps == np.eps) {
            r.pre_w = ops[j].in[1];
            r.xn    = ops[j].out[0];
            ++j;
        }
        if (!unread_after(d, j - 1)) return false;
        r.x = x, r.d = d, r.post_w = norm.in[1], r.x_out = y;
        set_launch_params(l, r);
        l.count = (uint16_t)(j - i);
        *out    = l;
        return true;
    }

    // A lone full-row RmsNorm with a weight, x -> y (the first layer's input norm, which no residual add
    // precedes) -> ResNorm without the residual branch: xn = rms(x) * pre_w. The ResNorm kernel issues its
    // loads before the wait and reduces with shuffles: on an H200, 1.0-1.5 us against the generic
    // g4_rms_norm's 4.7 us at E2B; and with a ResNorm before its q/k/v, the first layer's o projection
    // takes the AttnO fusion too.
    bool norm(size_t i, CudaLaunch* out) const {
        if (!full_norm(i) || ops[i].in[1] < 0 || ops[i].in[0] == ops[i].out[0]) return false;
        const PlanOp& n = ops[i];
        CudaLaunch l    = record(LaunchKind::ResNorm, i, 1);
        ResNormLaunch r;
        r.eps  = prm<RmsNormParams>(i).eps;
        r.cols = prm<RmsNormParams>(i).cols;
        r.x = n.in[0], r.pre_w = n.in[1], r.xn = n.out[0];
        set_launch_params(l, r);
        *out = l;
        return true;
    }

    // A grouped scale-norm-add: Scale(ctx) + RmsNorm(ctx, groups of P, weight) + Add(ctx, tok) ->
    // out + Scale(out), all in place but the add, no scalar tensors -> GroupNormAdd (g4_group_norm_add). ctx
    // is read by nothing after the add; out is ctx itself or shares no bytes with ctx or tok (a block reads
    // its group of both before it writes the same group of out). Three launches fewer a decode step.
    bool group_norm_add(size_t i, CudaLaunch* out) const {
        if (!is(i, OpCode::Scale) || !is(i + 1, OpCode::RmsNorm) || !is(i + 2, OpCode::Add) ||
            !is(i + 3, OpCode::Scale))
            return false;
        const PlanOp &s1 = ops[i], &n = ops[i + 1], &a = ops[i + 2], &s2 = ops[i + 3];
        const int32_t c = s1.in[0], N = prm<ScaleParams>(i).cols, P = prm<RmsNormParams>(i + 1).dim;
        const int32_t tok = a.in[0] == c ? a.in[1] : a.in[1] == c ? a.in[0] : -1, o = a.out[0];
        auto whole    = [&](const PlanOp& op) { return !op.in_col[0] && !op.in_col[1] && !op.out_col[0]; };
        const bool ok = tok >= 0 && tok != c && s1.out[0] == c && s1.in[1] < 0 && whole(s1) && n.in[0] == c &&
                        n.out[0] == c && n.in[1] >= 0 && whole(n) && prm<RmsNormParams>(i + 1).cols == N &&
                        P > 0 && P <= 1024 && N % P == 0 && prm<AddParams>(i + 2).cols == N && whole(a) &&
                        s2.in[0] == o && s2.out[0] == o && s2.in[1] < 0 && whole(s2) &&
                        prm<ScaleParams>(i + 3).cols == N && o != tok && (o == c || disjoint(o, c)) &&
                        disjoint(o, tok) && unread_after(c, i + 2);
        if (!ok) return false;
        CudaLaunch l = record(LaunchKind::GroupNormAdd, i, 4);
        GroupNormAddLaunch g;
        g.ctx = c, g.w = n.in[1], g.tok = tok, g.out = o, g.cols = N, g.group = P;
        set_launch_params(l, g);
        *out = l;
        return true;
    }

    bool qkv_post(size_t i, CudaLaunch* out) const {
        if (!is(i, OpCode::RmsNorm) || !is(i + 1, OpCode::Rope)) return false;
        const PlanOp &qn = ops[i], &qr = ops[i + 1];
        const RmsNormParams qnp = prm<RmsNormParams>(i);
        const RopeParams qrp    = prm<RopeParams>(i + 1);
        const int32_t q = qn.in[0], dim = qnp.dim;
        if (qn.out[0] != q || qn.in[1] < 0 || qn.in_col[0] || qn.out_col[0] || qr.in[0] != q ||
            qr.out[0] != q || qr.in_col[0] || qrp.dim != dim || (int64_t)qrp.heads * dim != qnp.cols ||
            dim % 2 || dim > 2048)
            return false;
        CudaLaunch l = record(LaunchKind::QkvPost, i, 2);
        QkvLaunch r;
        r.q = q, r.q_norm_w = qn.in[1], r.inv_freq = qr.in[1];
        r.heads = qrp.heads, r.dim = dim;
        r.eps = qnp.eps;
        // k: norm + rope, v: norm, store; all into the cache directly.
        if (is(i + 2, OpCode::RmsNorm) && is(i + 3, OpCode::Rope) && is(i + 4, OpCode::RmsNorm) &&
            is(i + 5, OpCode::KvStore)) {
            const PlanOp &kn = ops[i + 2], &kr = ops[i + 3], &vn = ops[i + 4], &st = ops[i + 5];
            const RmsNormParams knp = prm<RmsNormParams>(i + 2), vnp = prm<RmsNormParams>(i + 4);
            const RopeParams krp    = prm<RopeParams>(i + 3);
            const KvStoreParams stp = prm<KvStoreParams>(i + 5);
            const int32_t k = kn.in[0], v = vn.in[0], kvh = krp.heads;
            bool ok = kn.out[0] == k && kn.in[1] >= 0 && kr.in[0] == k && kr.out[0] == k &&
                      kr.in[1] == qr.in[1] && krp.dim == dim && knp.dim == dim &&
                      (int64_t)kvh * dim == knp.cols && vn.out[0] == v && vn.in[1] < 0 && vnp.dim == dim &&
                      vnp.cols == knp.cols && st.in[0] == k && st.in[1] == v && stp.width == knp.cols &&
                      knp.eps == qnp.eps && vnp.eps == qnp.eps &&
                      tensors[kn.in[1]].dtype == tensors[qn.in[1]].dtype && !kn.in_col[0] && !vn.in_col[0] &&
                      !st.in_col[0] && !st.in_col[1] && !st.out_col[0] && !st.out_col[1] &&
                      unread_after(k, i + 5) && unread_after(v, i + 5) && qrp.heads % kvh == 0;
            if (ok) {
                l.count = 6;
                r.k = k, r.k_norm_w = kn.in[1], r.v = v, r.k_cache = st.out[0], r.v_cache = st.out[1];
                r.kv_heads = kvh, r.slots = stp.slots;
            }
        }
        // The decode attention of a sliding-window layer with one kv head, reading q (and the caches just
        // stored), runs the post-projection itself. Where measured (H200, `g4 bench`):
        //   E2B (1 kv head), sliding layers: +1.0% decode at depth 16, even at 4096 and 32000;
        //   E2B with the full-attention layers too: +1.5% at 16 but -2.9% at 32000 (their hundreds of
        //     splits run in waves, and each block's set-up of norm weights and cos/sin is then exposed);
        //   E4B (2 kv heads), sliding layers: -1.1% at depth 16 (even after the attention kernel's head sums
        //     left local memory: -0.5% / +0.3% at 4096), so GQA layers kept QkvPost until the kernel was
        //     specialised for the group size; with that kernel, +1.0% at depth 16 and +1.7% at 4096. Up to
        //     2 kv heads fuse.
        const size_t a = i + l.count;
        if (is(a, OpCode::Attention)) {
            const PlanOp& at         = ops[a];
            const AttentionParams ap = prm<AttentionParams>(a);
            bool ok = ap.window > 0 && ap.kv_heads <= 2 && at.in[0] == q && !at.in_col[0] && !at.out_col[0] &&
                      ap.heads == qrp.heads && ap.dim == dim && unread_after(q, a) && disjoint(at.out[0], q);
            if (l.count == 6)
                ok = ok && at.in[1] == r.k_cache && at.in[2] == r.v_cache && ap.kv_heads == r.kv_heads &&
                     ap.slots == r.slots && unread_after(r.k, a) && unread_after(r.v, a);
            if (ok) {
                l.kind     = (uint16_t)LaunchKind::QkvAttn;
                r.post_ops = l.count;
                l.count    = (uint16_t)(l.count + 1);
            }
        }
        set_launch_params(l, r);
        *out = l;
        return true;
    }

    // Activation tensors a and b share no arena bytes (a fused kernel writing one while reading the other).
    bool disjoint(int32_t a, int32_t b) const {
        if (a < 0 || b < 0) return true;
        const PlanTensor &x = tensors[a], &y = tensors[b];
        if (x.kind != y.kind) return true;
        return x.offset + x.nbytes <= y.offset || y.offset + y.nbytes <= x.offset;
    }
    bool gemv_ok(size_t i) const {
        if (!is(i, OpCode::Matmul)) return false;
        const PlanOp& m     = ops[i];
        const PlanTensor& w = tensors[m.in[1]];
        const int64_t K     = w.dims[1];
        if (w.dtype == (uint8_t)DType::NF4) return K % 32 == 0 && m.in_col[0] % 4 == 0 && m.out_col[0] == 0;
        if (w.dtype == (uint8_t)DType::BF16) return K % 8 == 0 && m.in_col[0] % 4 == 0 && m.out_col[0] == 0;
        return false;
    }
    bool same_input(size_t a, size_t b) const {
        const PlanTensor &wa = tensors[ops[a].in[1]], &wb = tensors[ops[b].in[1]];
        return ops[a].in[0] == ops[b].in[0] && ops[a].in_col[0] == ops[b].in_col[0] &&
               ops[a].row_mode == ops[b].row_mode && wa.dtype == wb.dtype && wa.dims[1] == wb.dims[1] &&
               wa.quant_flags == wb.quant_flags;
    }

    // gate + up + GeluMul + down (NF4, the gate/up pair's input xn made by the ResNorm launch `prev`) -> Mlp.
    // The down's prefill variant must be Cublas: the runtime untiles its weight for prefill into the
    // scratch that tier sizes (cuda_ws::workspace, runtime/src/cuda/backend.cpp).
    bool mlp(size_t i, const CudaLaunch* prev, CudaLaunch* out) const {
        if (!prev || prev->kind != (uint16_t)LaunchKind::ResNorm) return false;
        const ResNormLaunch pr = launch_params<ResNormLaunch>(*prev);
        if (pr.zeroed >= 0) return false;
        for (size_t k = i; k < i + 4; ++k)
            if (k >= ops.size() || (!device.empty() && device[k] != device[prev->op])) return false;
        if (!gemv_ok(i) || !gemv_ok(i + 1) || !same_input(i, i + 1) || !is(i + 2, OpCode::GeluMul) ||
            !gemv_ok(i + 3))
            return false;
        const PlanOp &ga = ops[i], &up = ops[i + 1], &g = ops[i + 2], &dn = ops[i + 3];
        const PlanTensor &wg = tensors[ga.in[1]], &wu = tensors[up.in[1]], &wd = tensors[dn.in[1]];
        const int64_t H = wg.dims[1], I = wg.dims[0];
        const int32_t xn = ga.in[0], y = dn.out[0];
        const bool nf4 = wg.dtype == (uint8_t)DType::NF4 && wd.dtype == (uint8_t)DType::NF4 &&
                         wd.quant_flags == wg.quant_flags;
        const bool ok = nf4 && pr.xn == xn && !ga.in_col[0] && wu.dims[0] == I && wd.dims[0] == H &&
                        wd.dims[1] == I && H % 4 == 0 && I % 64 == 0 && g.in[0] == ga.out[0] &&
                        g.in[1] == up.out[0] && !g.in_col[0] && !g.in_col[1] && !g.out_col[0] &&
                        prm<GeluMulParams>(i + 2).cols == I && dn.in[0] == g.out[0] && !dn.in_col[0] &&
                        dn.row_mode == ga.row_mode &&
                        prm<MatmulParams>(i + 3).prefill_variant == (int32_t)MatmulVariant::Cublas &&
                        unread_after(ga.out[0], i + 2) && unread_after(up.out[0], i + 2) &&
                        unread_after(g.out[0], i + 3) && disjoint(y, xn) && disjoint(y, pr.x_out);
        if (!ok) return false;
        CudaLaunch l = record(LaunchKind::Mlp, i, 4);
        MlpLaunch r;
        r.gate = (int32_t)i, r.up = (int32_t)(i + 1), r.down = (int32_t)(i + 3), r.threads = mlp_threads(I);
        r.y = y;
        set_launch_params(l, r);
        *out = l;
        return true;
    }

    // The o projection (NF4) of the decode attention op that ends the last launch in `out` -> AttnO: the
    // merge of the attention's split partials and the o GEMV in one kernel, adding into y, which the
    // ResNorm launch that makes the layer's q/k/v input zeroes (*zeroer: its index in out). The attention
    // must take g4_attn_decode (its partials' layout): decode_attention_fits as the runtime decides it. y
    // shares no bytes with anything the launches in between touch (compile.cpp keeps it live from that
    // ResNorm on). The o's prefill variant must be Cublas (the runtime untiles its weight into that tier's
    // scratch).
    bool attn_o(size_t i, const std::vector<CudaLaunch>& out, int attn_hpg, CudaLaunch* res,
                size_t* zeroer) const {
        if (out.empty() || !gemv_ok(i)) return false;
        const CudaLaunch& prev = out.back();
        const size_t a         = (size_t)prev.op + prev.count - 1;
        if (a + 1 != i || !is(a, OpCode::Attention) || (!device.empty() && device[a] != device[i]))
            return false;
        const PlanOp &at = ops[a], &o = ops[i];
        const PlanTensor& w      = tensors[o.in[1]];
        const AttentionParams ap = prm<AttentionParams>(a);
        const int heads = ap.heads, kvh = ap.kv_heads, dim = ap.dim;
        const int64_t H = w.dims[0], K = w.dims[1];
        const int32_t y   = o.out[0];
        const bool kvbf16 = tensors[at.in[1]].dtype == (uint8_t)DType::BF16;
        if (w.dtype != (uint8_t)DType::NF4 || o.in[0] != at.out[0] || o.in_col[0] || at.out_col[0] ||
            o.out_col[0] || K != (int64_t)heads * dim || K % 64 || H % 4 || H > 4096 || dim % 32 ||
            prm<MatmulParams>(i).prefill_variant != (int32_t)MatmulVariant::Cublas ||
            !unread_after(at.out[0], i) || tensors[y].dims[1] != H ||
            !cuda_rt::decode_attention_fits(heads, kvh, dim, ap.decode_splits, kvbf16, attn_hpg))
            return false;
        size_t k = out.size();
        while (k > 0 && out.size() - k < 4 && out[k - 1].kind != (uint16_t)LaunchKind::ResNorm)
            --k;
        if (k == 0 || out[k - 1].kind != (uint16_t)LaunchKind::ResNorm) return false;
        const CudaLaunch& rn   = out[k - 1];
        const ResNormLaunch rp = launch_params<ResNormLaunch>(rn);
        if (rp.zeroed >= 0 || rp.xn < 0 || rp.cols != H || (!device.empty() && device[rn.op] != device[i]) ||
            !disjoint(y, rp.x_out) || !disjoint(y, rp.xn))
            return false;
        for (size_t j = (size_t)rn.op + rn.count; j < i; ++j) {
            for (int32_t t : ops[j].in)
                if (t >= 0 && !disjoint(y, t)) return false;
            for (int32_t t : ops[j].out)
                if (t >= 0 && !disjoint(y, t)) return false;
        }
        CudaLaunch l = record(LaunchKind::AttnO, i, 1);
        set_launch_params(l, AttnOLaunch{(int32_t)i, (int32_t)a, y});
        *res    = l;
        *zeroer = k - 1;
        return true;
    }

    // A gated projection: gate (bf16 [P, H]) + GeluMul(aux) + projection (bf16 [H, P]) after the ResNorm
    // `prev` that makes the gate's input -> GatedProj (g4_gated_proj_bf16_g*, adding into the projection's
    // output y, which prev zeroes). Nothing runs between them, so y only has to be apart from what the kernel
    // reads.
    bool gated_proj(size_t i, const CudaLaunch* prev, CudaLaunch* out) const {
        if (!prev || prev->kind != (uint16_t)LaunchKind::ResNorm) return false;
        const ResNormLaunch rp = launch_params<ResNormLaunch>(*prev);
        if (rp.zeroed >= 0) return false;
        for (size_t k = i; k < i + 3; ++k)
            if (k >= ops.size() || (!device.empty() && device[k] != device[prev->op])) return false;
        if (!is(i, OpCode::Matmul) || !is(i + 1, OpCode::GeluMul) || !is(i + 2, OpCode::Matmul)) return false;
        const PlanOp &g = ops[i], &gm = ops[i + 1], &pr = ops[i + 2];
        const PlanTensor &wg = tensors[g.in[1]], &wp = tensors[pr.in[1]];
        const int64_t P = wg.dims[0], H = wg.dims[1];
        const int32_t y = pr.out[0], x = g.in[0];
        const bool ok = wg.dtype == (uint8_t)DType::BF16 && wp.dtype == (uint8_t)DType::BF16 &&
                        wp.dims[0] == H && wp.dims[1] == P && H % 8 == 0 && H <= 4096 && P % 8 == 0 &&
                        (x == rp.x_out || x == rp.xn) && !g.in_col[0] && !g.out_col[0] &&
                        gm.in[0] == g.out[0] && !gm.in_col[0] && gm.in[1] >= 0 && gm.in[1] != g.out[0] &&
                        gm.in_col[1] % 4 == 0 && !gm.out_col[0] && prm<GeluMulParams>(i + 1).cols == P &&
                        pr.in[0] == gm.out[0] && !pr.in_col[0] && !pr.out_col[0] && tensors[y].dims[1] == H &&
                        rp.cols == H && unread_after(g.out[0], i + 1) && unread_after(gm.out[0], i + 2) &&
                        disjoint(y, x) && disjoint(y, gm.in[1]) && disjoint(y, rp.x_out) &&
                        (rp.xn < 0 || disjoint(y, rp.xn));
        if (!ok) return false;
        CudaLaunch l = record(LaunchKind::GatedProj, i, 3);
        set_launch_params(l, GatedProjLaunch{y});
        *out = l;
        return true;
    }

    // The ResNorm rn (x + rms(d) * w -> xo, no scale, no second norm) between the Mlp launch making d and the
    // GatedProj launch `ple` reading xo can be folded into that launch (g4_resnorm_gated_proj: every block
    // recomputes it; block 0 writes xo; the ResNorm record gets ip1 = 1 and the MLP zeroes its output y
    // at its end). y must be apart from what the MLP reads and what the GatedProj kernel reads or writes
    // besides it (compile.cpp keeps y live from the MLP's input on), and xo apart from the residual, d and
    // the per-layer input (block 0 writes xo while other blocks read them). One launch fewer a layer.
    bool gated_proj_fold(const CudaLaunch& mlp, const CudaLaunch& rn, const CudaLaunch& ple) const {
        if (mlp.kind != (uint16_t)LaunchKind::Mlp || rn.kind != (uint16_t)LaunchKind::ResNorm ||
            ple.kind != (uint16_t)LaunchKind::GatedProj)
            return false;
        if (!device.empty() && (device[mlp.op] != device[rn.op] || device[rn.op] != device[ple.op]))
            return false;
        const ResNormLaunch r = launch_params<ResNormLaunch>(rn);
        const MlpLaunch m     = launch_params<MlpLaunch>(mlp);
        const int32_t y = launch_params<GatedProjLaunch>(ple).y, xo = r.x_out, xn = ops[m.gate].in[0],
                      aux = ops[ple.op + 1].in[1];
        return r.d >= 0 && r.d == m.y && r.x >= 0 && r.post_w >= 0 && xo >= 0 && r.scalar < 0 &&
               r.scale == 1.0f && r.pre_w < 0 && r.xn < 0 && ops[ple.op].in[0] == xo && r.cols % 4 == 0 &&
               r.cols <= 4096 && disjoint(y, r.x) && disjoint(y, r.d) && disjoint(y, xo) && disjoint(y, xn) &&
               disjoint(xo, r.x) && disjoint(xo, r.d) && disjoint(xo, aux);
    }

    // The ResNorm rn (x + rms(d) * w -> x1, then rms(x1) * w2 -> xn; no scale) at out[r] before the
    // packed-f16 Mlp launch reading xn can run in every block of that launch (the _r kernels; block 0 writes
    // x1), where an earlier ResNorm launch out[z] (not folded, not after output replicas, no second zero yet)
    // zeroes the MLP's output y instead (its ip2). y shares no bytes with what z reads or writes nor with
    // what the launches between z and the MLP touch (compile.cpp keeps y live from z's residual add on); x1
    // and y share none with x and d, which every block reads while block 0 writes x1 (compile.cpp keeps x and
    // d live to the MLP's end); nor the output the MLP zeroes (a folded PLE's). One launch fewer a layer.
    bool mlp_fold(const std::vector<CudaLaunch>& out, size_t r, size_t* zeroer) const {
        const CudaLaunch &rn = out[r], &mlp = out[r + 1];
        if (rn.kind != (uint16_t)LaunchKind::ResNorm || mlp.kind != (uint16_t)LaunchKind::Mlp) return false;
        const ResNormLaunch rp = launch_params<ResNormLaunch>(rn);
        const MlpLaunch mp     = launch_params<MlpLaunch>(mlp);
        if (mp.f16 != 1 || rp.folded != 0) return false;
        const int32_t x = rp.x, d = rp.d, x1 = rp.x_out, xn = rp.xn, y = mp.y;
        if (x < 0 || d < 0 || rp.post_w < 0 || rp.scalar >= 0 || rp.scale != 1.0f || x1 < 0 || rp.pre_w < 0 ||
            xn < 0 || rp.zeroed != y || ops[mp.gate].in[0] != xn ||
            !plan::mlp_res_fits(rp.cols, mp.threads) || rp.zero2 != 0)
            return false;
        if (!device.empty() && device[rn.op] != device[mlp.op]) return false;
        if (!disjoint(x1, x) || !disjoint(x1, d) || !disjoint(y, x) || !disjoint(y, d) || !disjoint(y, x1))
            return false;
        if (r + 3 < out.size() && out[r + 2].kind == (uint16_t)LaunchKind::ResNorm &&
            launch_params<ResNormLaunch>(out[r + 2]).folded == 1) {
            const int32_t p = launch_params<GatedProjLaunch>(out[r + 3]).y; // zeroed by the MLP at its end
            if (!disjoint(p, x) || !disjoint(p, d) || !disjoint(p, x1)) return false;
        }
        size_t z = r;
        while (z > 0 && r - z < 8 && out[z - 1].kind != (uint16_t)LaunchKind::ResNorm)
            --z;
        if (z == 0 || out[z - 1].kind != (uint16_t)LaunchKind::ResNorm) return false;
        --z;
        const CudaLaunch& zr   = out[z];
        const ResNormLaunch zp = launch_params<ResNormLaunch>(zr);
        if (zp.folded != 0 || zp.zero2 != 0 || zp.zeroed == y ||
            (z > 0 && out[z - 1].kind == (uint16_t)LaunchKind::Mlp &&
             launch_params<MlpLaunch>(out[z - 1]).replicas > 1) ||
            (!device.empty() && device[zr.op] != device[mlp.op]))
            return false;
        for (int32_t t : {zp.x, zp.d, zp.scalar, zp.x_out, zp.xn, zp.zeroed})
            if (!disjoint(y, t)) return false;
        for (size_t j = (size_t)zr.op + zr.count; j < (size_t)rn.op + rn.count; ++j) {
            for (int32_t t : ops[j].in)
                if (t >= 0 && !disjoint(y, t)) return false;
            for (int32_t t : ops[j].out)
                if (t >= 0 && !disjoint(y, t)) return false;
        }
        *zeroer = z;
        return true;
    }

    bool gemv(size_t i, CudaLaunch* out) const {
        if (!gemv_ok(i)) return false;
        const PlanTensor& w = tensors[ops[i].in[1]];
        CudaLaunch l        = record(LaunchKind::Gemv, i, 1);
        GemvLaunch r;
        r.mat0 = (int32_t)i, r.nmat = 1;
        const int32_t y0 = ops[i].out[0];
        const int64_t N0 = w.dims[0];
        // gate + up + GeluMul -> pairs
        if (gemv_ok(i + 1) && same_input(i, i + 1) && is(i + 2, OpCode::GeluMul)) {
            const PlanOp& g  = ops[i + 2];
            const int32_t y1 = ops[i + 1].out[0];
            if (g.in[0] == y0 && g.in[1] == y1 && !g.in_col[0] && !g.in_col[1] && !g.out_col[0] &&
                prm<GeluMulParams>(i + 2).cols == N0 && disjoint(g.out[0], ops[i].in[0]) &&
                tensors[ops[i + 1].in[1]].dims[0] == N0 && unread_after(y0, i + 2) &&
                unread_after(y1, i + 2)) {
                r.mat1 = (int32_t)(i + 1), r.nmat = 2, r.epilogue = 1, r.out = g.out[0], l.count = 3;
                set_launch_params(l, r);
                *out = l;
                return true;
            }
        }
        // Matmul + GeluMul(y, aux)
        if (is(i + 1, OpCode::GeluMul)) {
            const PlanOp& g = ops[i + 1];
            if (g.in[0] == y0 && !g.in_col[0] && !g.out_col[0] && prm<GeluMulParams>(i + 1).cols == N0 &&
                g.in[1] != y0 && disjoint(g.out[0], ops[i].in[0]) && disjoint(g.out[0], g.in[1]) &&
                unread_after(y0, i + 1)) {
                r.epilogue = 2, r.aux = g.in[1], r.aux_col = g.in_col[1], r.out = g.out[0], l.count = 2;
                set_launch_params(l, r);
                *out = l;
                return true;
            }
        }
        // Matmul + Softcap in place
        if (is(i + 1, OpCode::Softcap)) {
            const PlanOp& s        = ops[i + 1];
            const SoftcapParams sp = prm<SoftcapParams>(i + 1);
            if (s.in[0] == y0 && s.out[0] == y0 && !s.in_col[0] && !s.out_col[0] && sp.cols == N0) {
                r.epilogue = 3, r.cap = sp.cap, l.count = 2;
                set_launch_params(l, r);
                *out = l;
                return true;
            }
        }
        // Up to 3 consecutive matmuls sharing x (q, k, v)
        size_t j = i + 1;
        while (j < ops.size() && j < i + 3 && gemv_ok(j) && same_input(i, j))
            ++j;
        if (j > i + 1) r.mat1 = (int32_t)(i + 1);
        if (j > i + 2) r.mat2 = (int32_t)(i + 2);
        r.nmat  = (int32_t)(j - i);
        l.count = (uint16_t)(j - i);
        set_launch_params(l, r);
        *out = l;
        return true;
    }
};

// Rewrites one field group of a ResNorm record.
template <class F> void edit_resnorm(CudaLaunch& l, F f) {
    ResNormLaunch r = launch_params<ResNormLaunch>(l);
    f(r);
    set_launch_params(l, r);
}
void set_zeroed(CudaLaunch& resnorm, int32_t t) {
    edit_resnorm(resnorm, [&](ResNormLaunch& r) { r.zeroed = t; });
}

} // namespace

std::vector<CudaLaunch> decode_schedule(const std::vector<PlanOp>& ops,
                                        const std::vector<PlanTensor>& tensors,
                                        const std::vector<int>& device, bool fuse_mlp, bool fuse_attn_o,
                                        int attn_hpg, int mlp_replicas_all, bool mlp_f16_on, bool fold_ple,
                                        int fold_mlp) {
    Matcher m(ops, tensors, device);
    std::vector<CudaLaunch> out;
    for (size_t i = 0; i < ops.size();) {
        CudaLaunch l;
        size_t zeroer = 0;
        if (fuse_attn_o && m.attn_o(i, out, attn_hpg, &l, &zeroer)) {
            set_zeroed(out[zeroer], launch_params<AttnOLaunch>(l).y); // the ResNorm before the layer's q/k/v
            out.push_back(l);
            i += l.count;
            continue;
        }
        if (fuse_mlp && !out.empty() && (m.mlp(i, &out.back(), &l) || m.gated_proj(i, &out.back(), &l))) {
            // the ResNorm before zeroes the MLP's / PLE's output (y: the first tensor slot of both)
            set_zeroed(out.back(), l.kind == (uint16_t)LaunchKind::Mlp ? launch_params<MlpLaunch>(l).y
                                                                       : launch_params<GatedProjLaunch>(l).y);
            out.push_back(l);
            i += l.count;
            continue;
        }
        if (!m.resnorm(i, &l) && !m.norm(i, &l) && !m.group_norm_add(i, &l) && !m.qkv_post(i, &l) &&
            !m.gemv(i, &l))
            l = Matcher::record(LaunchKind::Op, i, 1);
        for (size_t j = i + 1; j < i + l.count && !device.empty(); ++j)
            if (device[j] != device[i])
                l = Matcher::record(LaunchKind::Op, i, 1); // a fusion never spans devices
        out.push_back(l);
        i += l.count;
    }
    // Lanes per weight row, from K and the number of 4-row groups (2 outputs of a gate/up pair).
    for (CudaLaunch& l : out) {
        if (l.kind != (uint16_t)LaunchKind::Gemv) continue;
        GemvLaunch g        = launch_params<GemvLaunch>(l);
        const PlanTensor& w = tensors[ops[g.mat0].in[1]];
        int64_t n_out       = 0;
        for (int k = 0; k < g.nmat; ++k)
            n_out += tensors[ops[g.mat(k)].in[1]].dims[0];
        const int64_t groups = g.epilogue == 1 ? (w.dims[0] + 1) / 2 : (n_out + 3) / 4;
        g.lanes              = gemv_lanes(w.dims[1], w.dtype == (uint8_t)DType::NF4, groups);
        set_launch_params(l, g);
    }
    // The MLPs' output replicas: only where the next launch is the ResNorm summing them (its d). Then, with
    // their threads, replicas and arithmetic final, the ResNorm after each MLP that ple_fold_after takes is
    // folded into the GatedProj launch, and the one before it into the MLP.
    for (size_t li = 0; li < out.size(); ++li) {
        CudaLaunch& l = out[li];
        if (l.kind != (uint16_t)LaunchKind::Mlp) continue;
        MlpLaunch mp        = launch_params<MlpLaunch>(l);
        const CudaLaunch* n = li + 1 < out.size() ? &out[li + 1] : nullptr;
        const bool ok       = n && n->kind == (uint16_t)LaunchKind::ResNorm &&
                        launch_params<ResNormLaunch>(*n).d == mp.y &&
                        (device.empty() || device[n->op] == device[l.op]);
        const PlanTensor& wg = tensors[ops[mp.gate].in[1]]; // the gate [I, H]
        const int64_t I      = wg.dims[0];
        mp.replicas          = !ok                    ? 1
                               : mlp_replicas_all > 0 ? std::min(mlp_replicas_all, plan::kMlpReplicasMax)
                                                      : mlp_replicas(I);
        mp.f16 = mlp_f16(mlp_f16_on, wg.dims[1], (wg.quant_flags & plan::kQuantDoubleQuant) != 0) ? 1 : 0;
        if (mp.f16) mp.threads = mlp_threads_f16(I);
        set_launch_params(l, mp);
        if (fold_ple && ok && li + 2 < out.size() && ple_fold_after(I, mp.threads, mp.replicas) &&
            m.gated_proj_fold(l, out[li + 1], out[li + 2]))
            edit_resnorm(out[li + 1], [](ResNormLaunch& r) { r.folded = 1; }); // run by the GatedProj launch
        // The ResNorm before a packed-f16 MLP that mlp_fold takes (and, by default, mlp_fold_one_wave): the
        // MLP runs it, an earlier ResNorm zeroes the MLP's output.
        size_t z = 0;
        if (fold_mlp && li > 0 && (fold_mlp == 2 || mlp_fold_one_wave(I, mp.threads)) &&
            m.mlp_fold(out, li - 1, &z)) {
            edit_resnorm(out[li - 1], [](ResNormLaunch& r) { r.folded = 2; });
            edit_resnorm(out[z], [&](ResNormLaunch& r) { r.zero2 = mp.y + 1; });
        }
    }
    return out;
}

} // namespace g4::cuda
