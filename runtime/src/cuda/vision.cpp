// The vision tower on the plan's GPU (plans compiled with the vision tower there): the CPU tower's
// operations in the CPU tower's order (runtime/src/towers/vision.cpp), with bf16 tensor-core matmuls and
// fp32 accumulation (the prefill GEMM), the tensor-core flash kernel in its bidirectional mode, and fp32
// norms, RoPE, residual stream and pooling. Weights are the plan's, uploaded once at engine open.
#include "runtime/src/cuda/backend.h"
#include "runtime/src/cuda/kernel_args.h"
#include "runtime/src/cuda/state.h"
#include "runtime/src/engine.h"

#include <cmath>
#include <initializer_list>

namespace g4::cuda_rt {

namespace {
unsigned cdiv(int64_t a, int64_t b) {
    return (unsigned)((a + b - 1) / b);
}
} // namespace

g4_status vision_forward(g4_session* s, const towers::VisionTower& vt, const float* patches,
                         const int32_t* pos, int n_patches, int32_t* host_scratch, float* out, int* n_soft,
                         std::string* err) {
    SessionState* st    = session_of(s);
    const Driver* d     = st->e->d;
    Lane& ln            = st->lanes[0];
    const Kernels& K    = ln.g->k;
    const plan::Plan& p = s->engine->plan;
    *n_soft             = 0;

    int32_t* seen = host_scratch;                    // [max_patches]
    int32_t* idx  = host_scratch + vt.max_patches(); // [cells, k^2]
    towers::VisionTower::Grid grid;
    if (std::string e = vt.check_grid(pos, n_patches, seen, &grid); !e.empty()) {
        *err = e;
        return G4_ERR_INVALID_ARGUMENT;
    }
    vt.pool_index(grid, seen, idx);
    const towers::VisionHParams& hp = vt.hparams();
    // Mutable: kernel arguments are passed by address.
    int k = hp.pooling_kernel_size, n = grid.n, cells = (grid.gw / k) * (grid.gh / k);
    int H = hp.hidden_size, D = hp.head_dim, I = hp.intermediate_size, heads = hp.num_attention_heads;
    int kvh = hp.num_key_value_heads, qw = heads * D, kvw = kvh * D, pin = 3 * hp.patch_size * hp.patch_size;
    int TH          = hp.text_hidden_size;
    const float eps = hp.rms_norm_eps;

    const towers::VisionTower::GpuLayout& L = vt.gpu_layout();
    const CUdeviceptr B                     = st->vision_buf;
    CUdeviceptr step_n = B + L.steps, step_c = B + L.steps + 16, dpos = B + L.pos, didx = B + L.idx;
    CUdeviceptr x = B + L.x, z = B + L.z, a = B + L.a, t = B + L.t, c = B + L.c, q = B + L.q, kk = B + L.k,
                v = B + L.v;
    CUdeviceptr o = B + L.o, g = B + L.g, u = B + L.u, dout = B + L.out;
    const uint8_t* wbase = p.weights_base() + p.info().vision_begin;
    auto W               = [&](const towers::Tensor* w) -> CUdeviceptr {
        return st->e->vision_w + (CUdeviceptr)((const uint8_t*)w->data - wbase);
    };

    TowerRun run{st, K};
    CUresult& r       = run.r;
    const CUstream sm = ln.stream;
    run.start(step_n, {n, 0, n, 0, cells, 0, cells, 0});
    if (r == 0) r = d->cuMemcpyHtoDAsync(dpos, pos, sizeof(int32_t) * 2 * n, sm);
    if (r == 0) r = d->cuMemcpyHtoDAsync(didx, idx, sizeof(int32_t) * cells * k * k, sm);
    if (r == 0) r = d->cuMemcpyHtoDAsync(x, patches, sizeof(float) * (size_t)n * pin, sm);
    run.what          = "uploading the image";
    auto go           = [&](const char* name, CUfunction f, unsigned gx, unsigned gy, unsigned bx,
                  std::initializer_list<void*> args,
                  unsigned smem = 0) { run.go(name, f, gx, gy, bx, args, smem); };
    int& mode         = run.mode;
    CUdeviceptr& none = run.none;
    // y [rows, N] (ld ldy) = x [rows, Kd] . W^T (TowerRun::gemm).
    auto gemm = [&](const char* name, CUdeviceptr& step, int rows, CUdeviceptr xin, long ldx,
                    const towers::Tensor* w, CUdeviceptr y, long ldy) {
        run.gemm(name, step, rows, xin, ldx, W(w), (int)w->dims[0], (int)w->dims[1], y, ldy);
    };
    // Gemma4ClippableLinear: y = clamp(clamp(x, in) . W^T, out), the clamped input in c.
    auto linear = [&](const char* name, const towers::VisionTower::Linear& l, CUdeviceptr xin, long ldx,
                      CUdeviceptr y, long ldy) {
        const int in = (int)l.w->dims[1], outw = (int)l.w->dims[0];
        long ldc = in;
        if (std::isfinite(l.in_min) || std::isfinite(l.in_max)) {
            float lo = l.in_min, hi = l.in_max;
            int cols = in;
            go(name, K.vt_clamp, (unsigned)n, cdiv(in, 256), 256, {&xin, &ldx, &c, &ldc, &cols, &lo, &hi});
            xin = c, ldx = ldc;
        }
        gemm(name, step_n, n, xin, ldx, l.w, y, ldy);
        if (std::isfinite(l.out_min) || std::isfinite(l.out_max)) {
            float lo = l.out_min, hi = l.out_max;
            int cols = outw;
            go(name, K.vt_clamp, (unsigned)n, cdiv(outw, 256), 256, {&y, &ldy, &y, &ldy, &cols, &lo, &hi});
        }
    };
    auto rms = [&](const char* name, CUdeviceptr& step, int rows, CUdeviceptr xin, long ldx,
                   const towers::Tensor* w, CUdeviceptr y, long ldy, int cols, int dim) {
        CUdeviceptr wd = w ? W(w) : 0;
        int wdt        = w && w->dtype == DType::BF16 ? 1 : 0;
        float e_       = eps;
        go(name, K.rms, (unsigned)rows, (unsigned)(cols / dim), 256,
           {&step, &mode, &xin, &ldx, &wd, &wdt, &y, &ldy, &dim, &e_});
    };
    // y = a + b (kind 0) or gelu_tanh(a) * b (kind 1) over [n, cols].
    auto elem = [&](const char* name, int kind, CUdeviceptr ea, long lda, CUdeviceptr eb, long ldb,
                    CUdeviceptr y, long ldy, int cols) {
        float f = 1.0f;
        int sdt = 0;
        go(name, K.elem, (unsigned)n, cdiv(cols, 256), 256,
           {&step_n, &mode, &kind, &ea, &lda, &eb, &ldb, &y, &ldy, &cols, &f, &none, &sdt});
    };

    // Patch embedder: input_proj(2 * (p - 0.5)) + (pos_x_emb + pos_y_emb).
    long nx = (long)n * pin, ldH = H, ldq = qw, ldkv = kvw, ldI = I;
    go("vision pixels", K.vt_pixels, cdiv(nx, 256), 1, 256, {&x, &nx});
    gemm("vision patch_embedder.input_proj", step_n, n, x, pin, vt.patch_proj(), z, ldH);
    {
        CUdeviceptr tab = W(vt.pos_table());
        int tdt = vt.pos_table()->dtype == DType::BF16 ? 1 : 0, P = hp.position_embedding_size;
        go("vision position embeddings", K.vt_posemb, (unsigned)n, cdiv(H, 256), 256,
           {&z, &dpos, &tab, &tdt, &H, &P});
    }
    int di = 0;
    while (di < 6 && kFlashDims[di] != D)
        ++di;
    if (di == 6) {
        *err = "vision tower on the GPU: no flash attention kernel for head_dim " + std::to_string(D) +
               " (recompile with --place vision=cpu)";
        return G4_ERR_UNSUPPORTED;
    }
    const FlashLaunch fl = flash_launch(n, heads, kvh, D);
    for (const towers::VisionTower::Layer& l : vt.layers()) {
        // Attention block.
        rms("vision input_layernorm", step_n, n, z, ldH, l.ln_in, a, ldH, H, H);
        linear("vision q_proj", l.q, a, ldH, q, ldq);
        linear("vision k_proj", l.k, a, ldH, kk, ldkv);
        linear("vision v_proj", l.v, a, ldH, v, ldkv);
        rms("vision q_norm", step_n, n, q, ldq, l.q_norm, q, ldq, qw, D);
        rms("vision k_norm", step_n, n, kk, ldkv, l.k_norm, kk, ldkv, kvw, D);
        rms("vision v_norm", step_n, n, v, ldkv, nullptr, v, ldkv, kvw, D);
        float theta = hp.rope_theta;
        go("vision rope (q)", K.vt_rope2d, (unsigned)n, (unsigned)heads, (unsigned)std::max(32, D / 2),
           {&q, &ldq, &dpos, &D, &theta});
        go("vision rope (k)", K.vt_rope2d, (unsigned)n, (unsigned)kvh, (unsigned)std::max(32, D / 2),
           {&kk, &ldkv, &dpos, &D, &theta});
        {
            int hh = heads, kh = kvh, slots = n, window = -1, kvdt = 0;
            float scale = 1.0f;
            go("vision attention", K.flash[di], fl.gx, fl.gy, fl.block,
               {&step_n, &q, &ldq, &kk, &v, &hh, &kh, &slots, &window, &scale, &o, &ldq, &kvdt}, fl.smem);
        }
        linear("vision o_proj", l.o, o, ldq, t, ldH);
        rms("vision post_attention_layernorm", step_n, n, t, ldH, l.ln_post_attn, t, ldH, H, H);
        elem("vision attention residual", 0, z, ldH, t, ldH, z, ldH, H);
        // MLP block: down(gelu_tanh(gate(f)) * up(f)).
        rms("vision pre_feedforward_layernorm", step_n, n, z, ldH, l.ln_pre_ff, a, ldH, H, H);
        linear("vision gate_proj", l.gate, a, ldH, g, ldI);
        linear("vision up_proj", l.up, a, ldH, u, ldI);
        elem("vision gelu_tanh(gate) * up", 1, g, ldI, u, ldI, g, ldI, I);
        linear("vision down_proj", l.down, g, ldI, t, ldH);
        rms("vision post_feedforward_layernorm", step_n, n, t, ldH, l.ln_post_ff, t, ldH, H, H);
        elem("vision MLP residual", 0, z, ldH, t, ldH, z, ldH, H);
    }
    // Pooler (k x k cells, * sqrt(hidden)), then embed_vision: RMS without scale and the projection.
    {
        int kk2 = k * k;
        float w = 1.0f / (float)kk2, root = (float)std::sqrt((double)H);
        go("vision pooling", K.vt_pool, (unsigned)cells, cdiv(H, 256), 256,
           {&z, &didx, &kk2, &H, &w, &root, &a});
    }
    rms("embed_vision norm", step_c, cells, a, ldH, nullptr, t, ldH, H, H);
    long ldo = TH;
    gemm("embed_vision projection", step_c, cells, t, ldH, vt.embed_proj(), dout, ldo);
    if (g4_status g = run.finish(out, dout, sizeof(float) * (size_t)cells * TH, "vision tower", err);
        g != G4_OK)
        return g;
    *n_soft = cells;
    return G4_OK;
}

} // namespace g4::cuda_rt
