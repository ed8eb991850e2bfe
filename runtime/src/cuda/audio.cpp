// The audio tower on the plan's GPU (plans compiled with the audio tower there): the log-mel features on the
// CPU (AudioTower::features), then the CPU tower's operations in the CPU tower's order
// (runtime/src/towers/audio.cpp) with bf16 tensor-core matmuls and fp32 accumulation (the prefill GEMM), and
// fp32 SSCP convs, norms, clamps, attention, light conv and residual stream (kernels g4_at_* in
// kernels/cuda/towers_legacy.cu). Weights are the plan's, uploaded once at engine open.
#include "runtime/src/cuda/backend.h"
#include "runtime/src/cuda/state.h"
#include "runtime/src/engine.h"

#include <cmath>
#include <initializer_list>

namespace g4::cuda_rt {

namespace {
unsigned cdiv(int64_t a, int64_t b) {
    return (unsigned)((a + b - 1) / b);
}
int ceil_half(int n) {
    return (n + 1) / 2;
}
int dt_of(const towers::Tensor* t) {
    return t->dtype == DType::BF16 ? 1 : 0;
}
} // namespace

g4_status audio_forward(g4_session* s, const towers::AudioTower& at, const cpu::Context& ctx,
                        const float* pcm, int64_t n_samples, float* host_features, float* out, int* n_soft,
                        std::string* err) {
    SessionState* st    = session_of(s);
    const Driver* d     = st->e->d;
    Lane& ln            = st->lanes[0];
    const Kernels& K    = ln.g->k;
    const plan::Plan& p = s->engine->plan;
    *n_soft             = 0;

    int V0 = 0; // valid log-mel frames
    if (std::string e = at.features(ctx, pcm, n_samples, host_features, &V0); !e.empty()) {
        *err = e;
        return G4_ERR_INVALID_ARGUMENT;
    }
    const towers::AudioHParams& hp = at.hparams();
    // Mutable: kernel arguments are passed by address.
    int M = hp.mel_bins, V1 = ceil_half(V0), T = ceil_half(V1), F1 = at.freq_bins(0), F2 = at.freq_bins(1);
    int C0 = hp.subsampling_conv_channels[0], C1 = hp.subsampling_conv_channels[1];
    int H = hp.hidden_size, P = hp.output_proj_dims, TH = hp.text_hidden_size, NH = hp.num_attention_heads;
    int D = at.head_dim(), NR = at.n_rel(), W = hp.attention_context_left - 1;
    const float gc = hp.gradient_clipping, def_eps = towers::AudioTower::kDefaultNormEps;

    const towers::AudioTower::GpuLayout& L = at.gpu_layout();

    const CUdeviceptr B = st->audio_buf;
    CUdeviceptr step_t = B + L.steps, step_r = B + L.steps + 16, pe = B + L.pe, x = B + L.x;
    CUdeviceptr feat = B + L.feat, l0 = B + L.l0, l1 = B + L.l1, n = B + L.n, big = B + L.big;
    CUdeviceptr q = B + L.q, kk = B + L.k, v = B + L.v, o = B + L.o, rel = B + L.rel, dout = B + L.out;
    const uint8_t* wbase = p.weights_base() + p.info().audio_begin;

    auto wdev = [&](const towers::Tensor* w) -> CUdeviceptr {
        return st->e->audio_w + (CUdeviceptr)((const uint8_t*)w->data - wbase);
    };

    TowerRun run{st, K};
    CUresult& r       = run.r;
    const CUstream sm = ln.stream;
    run.start(step_t, {T, 0, T, 0, NR, 0, NR, 0});
    if (r == 0) r = d->cuMemcpyHtoDAsync(pe, at.rel_pos_table(), sizeof(float) * (size_t)NR * H, sm);
    if (r == 0) r = d->cuMemcpyHtoDAsync(feat, host_features, sizeof(float) * (size_t)V0 * M, sm);
    run.what = "uploading the clip's features";

    // A matmul weight that is not bf16 (a plan the compiler does not write): nothing more is launched.
    const char* bad = nullptr;

    auto go = [&](const char* name, CUfunction f, unsigned gx, unsigned gy, unsigned bx,
                  std::initializer_list<void*> args, unsigned smem = 0) {
        if (!bad) run.go(name, f, gx, gy, bx, args, smem);
    };
    // y [rows, N] (ld ldy) = x [rows, Kd] . W^T (TowerRun::gemm).
    auto gemm = [&](const char* name, CUdeviceptr& step, int rows, CUdeviceptr xin, long ldx,
                    const towers::Tensor* w, CUdeviceptr y, long ldy) {
        if (w->dtype != DType::BF16 && !bad) bad = name;
        if (!bad) run.gemm(name, step, rows, xin, ldx, wdev(w), (int)w->dims[0], (int)w->dims[1], y, ldy);
    };
    auto clamp = [&](const char* name, CUdeviceptr xin, long ldx, CUdeviceptr y, long ldy, int cols, float lo,
                     float hi) {
        go(name, K.clamp, (unsigned)T, cdiv(cols, 256), 256, {&xin, &ldx, &y, &ldy, &cols, &lo, &hi});
    };
    // ClippableLinear (AudioTower::run_clip): y = clamp(clamp(x, in) . W^T, out), the clamped x in xc.
    auto linear = [&](const char* name, const towers::AudioTower::Clip& c, CUdeviceptr xin, long ldx,
                      CUdeviceptr xc, CUdeviceptr y, long ldy) {
        const int in = (int)c.w->dims[1], outw = (int)c.w->dims[0];
        if (c.clipped) {
            clamp(name, xin, ldx, xc, in, in, c.in_min, c.in_max);
            xin = xc, ldx = in;
        }
        gemm(name, step_t, T, xin, ldx, c.w, y, ldy);
        if (c.clipped) clamp(name, y, ldy, y, ldy, outw, c.out_min, c.out_max);
    };
    // y [rows, dim] = RMS(clip(x)) (* w), as audio.cpp rms().
    auto rms = [&](const char* name, int rows, CUdeviceptr xin, long ldx, const towers::Tensor* w,
                   CUdeviceptr y, long ldy, int dim, float eps, float clip) {
        CUdeviceptr wd = w ? wdev(w) : 0;
        int wdt        = w ? dt_of(w) : 0;
        go(name, K.at_rms, (unsigned)rows, 1, 256, {&xin, &ldx, &wd, &wdt, &y, &ldy, &dim, &eps, &clip});
    };
    auto silu = [&](const char* name, CUdeviceptr y, long ldy, int cols) {
        go(name, K.at_silu, (unsigned)T, cdiv(cols, 256), 256, {&y, &ldy, &cols});
    };
    auto residual = [&](const char* name, CUdeviceptr nn, float f) {
        go(name, K.at_residual, (unsigned)T, cdiv(H, 256), 256, {&x, &nn, &H, &f});
    };
    long ldH = H, ld4H = 4 * H, ld2H = 2 * H, ldP = P;

    // SSCP: two 3x3 stride-2 convs with LayerNorm and ReLU, then input_proj_linear.
    auto conv = [&](const char* name, unsigned t_out, CUdeviceptr in, int t_valid, int f_in, int c_in,
                    const towers::Tensor* w, const towers::Tensor* norm, CUdeviceptr y, int f_out,
                    int c_out) {
        CUdeviceptr wd = wdev(w), nd = wdev(norm);
        int wdt = dt_of(w), ndt = dt_of(norm);
        float eps = hp.rms_norm_eps;
        go(name, K.at_conv, t_out, (unsigned)f_out, 256,
           {&in, &t_valid, &f_in, &c_in, &wd, &wdt, &nd, &ndt, &eps, &y, &f_out, &c_out},
           (unsigned)(sizeof(float) * (9 * c_in + c_out)));
    };
    // l0 [V1, F1, C0], l1 [T, F2, C1], x [T, H]
    conv("audio subsample conv 0", (unsigned)V1, feat, V0, M, 1, at.conv0(), at.norm0(), l0, F1, C0);
    conv("audio subsample conv 1", (unsigned)T, l0, V1, F1, C0, at.conv1(), at.norm1(), l1, F2, C1);
    gemm("audio input_proj_linear", step_t, T, l1, (long)F2 * C1, at.input_proj(), x, ldH);

    // x += residual_weight * RMS(clip(W2 silu(W1 RMS(clip(x); pre))); post)
    auto feed_forward = [&](const char* name, const towers::AudioTower::FeedForward& f) {
        rms(name, T, x, ldH, f.pre, n, ldH, H, def_eps, gc);
        linear(name, f.w1, n, ldH, n, big, ld4H);
        silu(name, big, ld4H, 4 * H);
        linear(name, f.w2, big, ld4H, big, n, ldH);
        rms(name, T, n, ldH, f.post, n, ldH, H, def_eps, gc);
        residual(name, n, hp.residual_weight);
    };
    const float q_scale = (float)(std::pow((double)D, -0.5) / std::log(2.0));
    const float k_scale = (float)(std::log1p(std::exp(1.0)) / std::log(2.0));
    for (const towers::AudioTower::Layer& l : at.layers()) {
        feed_forward("audio feed_forward1", l.ff1);
        // x = x + RMS(clip(post(ChunkedLocalAttention(RMS(clip(x); norm_pre_attn)))); norm_post_attn)
        rms("audio norm_pre_attn", T, x, ldH, l.norm_pre_attn, n, ldH, H, def_eps, gc);
        linear("audio q_proj", l.q, n, ldH, o, q, ldH);
        linear("audio k_proj", l.k, n, ldH, o, kk, ldH);
        linear("audio v_proj", l.v, n, ldH, o, v, ldH);
        gemm("audio relative_k_proj", step_r, NR, pe, ldH, l.rel_k, rel, ldH); // [n_rel, H]
        {
            CUdeviceptr pd = wdev(l.per_dim_scale);
            int pdt        = dt_of(l.per_dim_scale);
            float qs = q_scale, ks = k_scale;
            go("audio q/k scaling", K.at_qk_scale, (unsigned)T, cdiv(H, 256), 256,
               {&q, &kk, &H, &D, &pd, &pdt, &qs, &ks});
            float cap = hp.attention_logit_cap;
            go("audio attention", K.at_attention, (unsigned)T, (unsigned)NH, 32,
               {&q, &kk, &v, &rel, &H, &D, &W, &NR, &cap, &o}, (unsigned)(sizeof(float) * W));
        }
        linear("audio attention post", l.post, o, ldH, o, n, ldH);
        rms("audio norm_post_attn", T, n, ldH, l.norm_post_attn, n, ldH, H, def_eps, gc);
        residual("audio attention residual", n, 1.0f);
        // x += linear_end(silu(RMS(clip(causal_depthwise_conv(GLU(linear_start(RMS(x; pre))))); conv_norm)))
        rms("audio lconv1d pre_layer_norm", T, x, ldH, l.lpre, n, ldH, H, hp.rms_norm_eps, 0.0f);
        linear("audio lconv1d linear_start", l.lstart, n, ldH, n, big, ld2H); // [T, 2H]
        go("audio lconv1d GLU", K.at_glu, (unsigned)T, cdiv(H, 256), 256, {&big, &H, &q});
        {
            CUdeviceptr wd = wdev(l.dwconv);
            int wdt = dt_of(l.dwconv), ks = hp.conv_kernel_size;
            go("audio lconv1d depthwise conv", K.at_dwconv, (unsigned)T, cdiv(H, 256), 256,
               {&q, &wd, &wdt, &H, &ks, &kk});
        }
        rms("audio lconv1d conv_norm", T, kk, ldH, l.conv_norm, kk, ldH, H, hp.rms_norm_eps, gc);
        silu("audio lconv1d silu", kk, ldH, H);
        linear("audio lconv1d linear_end", l.lend, kk, ldH, kk, n, ldH);
        residual("audio lconv1d residual", n, 1.0f);
        feed_forward("audio feed_forward2", l.ff2);
        rms("audio norm_out", T, x, ldH, l.norm_out, x, ldH, H, def_eps, gc);
    }
    // output_proj (+ bias), then embed_audio: RMS without scale and the projection.
    gemm("audio output_proj", step_t, T, x, ldH, at.output_proj(), big, ldP); // [T, P]
    {
        CUdeviceptr bd = wdev(at.output_bias());
        int bdt        = dt_of(at.output_bias());
        go("audio output_proj bias", K.at_bias, (unsigned)T, cdiv(P, 256), 256, {&big, &ldP, &bd, &bdt, &P});
    }
    rms("embed_audio norm", T, big, ldP, nullptr, big, ldP, P, hp.rms_norm_eps, 0.0f);
    long ldo = TH;
    gemm("embed_audio projection", step_t, T, big, ldP, at.embed_proj(), dout, ldo); // [T, text_hidden]
    if (bad) {
        d->cuStreamSynchronize(sm); // what was launched before the bad weight
        *err =
            std::string("audio tower on the GPU: the weight of ") + bad + " is not bf16 (recompile the plan)";
        return G4_ERR_PLAN_CORRUPT;
    }
    if (g4_status g = run.finish(out, dout, sizeof(float) * (size_t)T * TH, "audio tower", err); g != G4_OK)
        return g;
    *n_soft = T;
    return G4_OK;
}

} // namespace g4::cuda_rt
