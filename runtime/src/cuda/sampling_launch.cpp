// Binding and launch of the sampling kernels: the greedy argmax (launched by the decode step), top-k
// candidates with penalties and the softmax normaliser, and the LM-head screening set up at engine open.
#include "runtime/src/cuda/kernel_args.h"
#include "runtime/src/cuda/launch.h"
#include "runtime/src/cuda/workspace.h"
#include "runtime/src/engine.h"
#include "runtime/src/env.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include <cmath>

namespace g4::cuda_rt {

using namespace g4::cu;
using plan::CudaLaunch;
using plan::LaunchKind;
using plan::PlanOp;
using plan::PlanTensor;
using plan::RowMode;
using plan::TensorKind;

using cuda_ws::kArgmaxBlocks;

g4_status bind_sampling_kernels(const ModuleKernels& m, Kernels& k, std::string* err) {
    const KernelName fns[] = {{&k.argmax, "g4_argmax"},
                              {&k.copy_f32, "g4_copy_f32"},
                              {&k.penalize, "g4_penalize"},
                              {&k.topk_round, "g4_topk_round"},
                              {&k.softmax_partial, "g4_softmax_partial"}};
    if (g4_status g = m.get_all(fns, err); g != G4_OK) return g;
    m.get_optional(&k.argmax_rows, "g4_argmax_rows");
    // LM-head screening: a module without its kernels decodes without screening.
    bool screen =
        m.get_optional(&k.lm_build, "g4_lm_screen_build") && m.get_optional(&k.lm_screen, "g4_lm_screen");
    for (int l = 0; l < 5 && screen; ++l)
        screen = m.get_optional(&k.lm_exact[l], "g4_lm_exact_l" + std::to_string(kGemvLanes[l]));
    if (!screen) k.lm_build = k.lm_screen = nullptr;
    return G4_OK;
}

// LM-head screening (kernels/cuda/lm_screen.cu): where the plan says so (META placement.lm_head_screen,
// decided by the compiler from the schedule and the --gpu-mem budget, its bytes counted in the plan's GPU
// memory), builds the int8 copy and its row bounds on the GPU. Skipped (decode steps compute every logit)
// when G4_LM_SCREEN=0 or the plan has no screening. Plans written before the compiler decided it screen
// where the GPU has the memory beside the weights and a session with ~256 MiB to spare.
g4_status lm_screen_setup(const plan::Plan& p, EngineState* st, std::string* err) {
    const Driver* d = st->d;
    const auto& in  = p.info();
    Gpu& g          = st->gpus[0];
    const std::optional<bool> planned =
        p.meta().placement ? p.meta().placement->lm_head_screen : std::optional<bool>();
    if (rt::env::lm_screen_off() || (planned && !*planned) || in.gpus.size() != 1 || p.has_cpu_layers() ||
        !p.n_launches() || !g.k.lm_screen)
        return G4_OK;
    const int li =
        cuda_ws::lm_screen_launch(&p.launch(0), p.n_launches(), &p.op(0), &p.tensor(0), in.logits_tensor);
    if (li < 0) {
        if (!planned) return G4_OK;
        *err = "the plan asks for LM-head screening but its decode schedule has no head the screening "
               "kernels take: the plan is damaged; re-run g4 compile";
        return G4_ERR_PLAN_CORRUPT;
    }
    const plan::GemvLaunch l = plan::launch_params<plan::GemvLaunch>(p.launch(li));
    const PlanTensor& w      = p.tensor(p.op(l.mat0).in[1]);
    const int V = (int)w.dims[0], K = (int)w.dims[1];
    CUdeviceptr wd = 0;
    for (const Gpu::Seg& sg : g.segs)
        if (w.offset >= sg.begin && w.offset < sg.end) wd = g.weights + sg.at + (w.offset - sg.begin);
    if (!wd) return G4_OK;
    const uint64_t scale_at = cuda_ws::lm_screen_scale_at(w), bytes = cuda_ws::lm_screen_bytes(w);
    CU_TRY(d->cuCtxSetCurrent(g.ctx), "cuCtxSetCurrent");
    if (!planned) {
        size_t free_b = 0, total_b = 0;
        CU_TRY(d->cuMemGetInfo(&free_b, &total_b), "cuMemGetInfo");
        if (free_b < bytes + session_device_bytes(in, 0) + (256ull << 20))
            return G4_OK; // the towers' weights are already up
    }
    CU_TRY(d->cuMemAlloc(&st->lm_q, bytes), "allocating the LM head's screening copy");
    st->lm_bytes = bytes, st->lm_scale_at = scale_at;
    CUdeviceptr q = st->lm_q, sc = st->lm_q + scale_at, bd = sc + (uint64_t)V * 4;
    void* args[] = {&wd, (void*)&V, (void*)&K, &q, &sc, &bd};
    CUresult r =
        d->cuLaunchKernel(g.k.lm_build, (unsigned)ceil_div(V, 8), 1, 1, 256, 1, 1, 0, nullptr, args, nullptr);
    if (r == 0) r = d->cuStreamSynchronize(nullptr);
    if (r != 0) {
        *err = "CUDA error " + error_name(r) + " building the LM head's screening copy on GPU " +
               std::to_string(g.index);
        return G4_ERR_INTERNAL;
    }
    int sms = 0;
    d->cuDeviceGetAttribute(&sms, kAttrSmCount, g.dev);
    st->lm_blocks = (unsigned)std::max(1, sms) * 4;
    st->lm_launch = li;
    return G4_OK;
}

int32_t device_argmax(const g4_session* s) {
    session_of(s)->ahead_greedy = true;
    return session_of(s)->host_tok[(s->position - 1) & 1];
}

g4_status device_topk(g4_session* s, int32_t k, float temperature, float penalty, const int32_t* tokens,
                      int32_t n_tokens, const float** values, const int32_t** indices, RowNorm* norm,
                      std::string* err) {
    SessionState* st    = session_of(s);
    const plan::Plan& p = s->engine->plan;
    const Driver* d     = st->e->d;
    const long vocab    = p.info().vocab_size;
    const int max_hist  = (int)p.info().max_context;
    if (k < 1 || k > cuda_ws::kTopkMax || k > vocab || n_tokens < 0 || n_tokens > max_hist) {
        *err = "internal: device top-k with k " + std::to_string(k) + " over " + std::to_string(n_tokens) +
               " history tokens";
        return G4_ERR_INTERNAL;
    }
    if (g4_status g = logits_back(s, err); g != G4_OK) return g;
    st->cur          = &st->lanes[0];
    const Lane& l0   = st->lanes[0];
    const Kernels& K = l0.g->k;
    CU_TRY(d->cuCtxSetCurrent(l0.g->ctx), "cuCtxSetCurrent");
    CUdeviceptr src = l0.act + p.tensor(p.info().logits_tensor).offset;
    auto go         = [&](CUfunction f, unsigned gx, unsigned bx, std::initializer_list<void*> args) {
        return launch(st, f, gx, 1, bx, const_cast<void**>(args.begin()));
    };
    CUresult r = 0;
    if (penalty != 1.0f && n_tokens > 0) {
        std::memcpy(st->host_hist, tokens, (size_t)n_tokens * 4);
        r      = d->cuMemcpyHtoDAsync(st->samp_hist, st->host_hist, (size_t)n_tokens * 4, l0.stream);
        long n = vocab;
        int vi = (int)vocab;
        if (r == 0) r = go(K.copy_f32, (unsigned)ceil_div(vocab, 256), 256, {&src, &st->samp_logits, &n});
        if (r == 0)
            r = go(K.penalize, (unsigned)ceil_div(n_tokens, 256), 256,
                   {&src, &st->samp_logits, &st->samp_hist, &n_tokens, &vi, &penalty});
        src = st->samp_logits;
    }
    // Rounds: each block of kTopkBlock keeps its best k until one block remains; the first round also
    // divides by the temperature. Candidates ping-pong between the two round buffers.
    long n           = vocab;
    CUdeviceptr vals = src, idx = 0;
    float temp = temperature;
    for (int round = 0; r == 0; ++round) {
        const unsigned blocks = (unsigned)ceil_div(n, cuda_ws::kTopkBlock);
        CUdeviceptr ov = st->cand[round & 1], oi = ov + st->n_cand * 4;
        r    = go(K.topk_round, blocks, 1024, {&vals, &idx, &n, &temp, &k, &ov, &oi});
        vals = ov, idx = oi, n = (long)blocks * k, temp = 0.0f;
        if (blocks == 1) break;
    }
    if (r == 0 && norm &&
        temperature > 0.0f) { // src: the penalised row (the candidates' rounds read it, not write it)
        long nv = vocab;
        r       = go(K.softmax_partial, cuda_ws::kSoftmaxBlocks, 256, {&src, &nv, &temperature, &st->soft});
        if (r == 0)
            r = d->cuMemcpyDtoHAsync(st->host_soft, st->soft, cuda_ws::kSoftmaxBlocks * 16, l0.stream);
    }
    if (r == 0) r = d->cuMemcpyDtoHAsync(st->host_cand, vals, (size_t)k * 4, l0.stream);
    if (r == 0) r = d->cuMemcpyDtoHAsync(st->host_cand + cuda_ws::kTopkMax, idx, (size_t)k * 4, l0.stream);
    if (r == 0) r = d->cuStreamSynchronize(l0.stream);
    if (r != 0) {
        *err = "CUDA error " + error_name(r) + " while sampling on the GPU (top-" + std::to_string(k) + ")";
        return G4_ERR_INTERNAL;
    }
    *values  = st->host_cand;
    *indices = (const int32_t*)(st->host_cand + cuda_ws::kTopkMax);
    if (norm && temperature > 0.0f) { // merge the blocks: the row's maximum, then the sum relative to it
        double mx = -INFINITY, sum = 0.0;
        for (int b = 0; b < cuda_ws::kSoftmaxBlocks; ++b)
            if (st->host_soft[2 * b + 1] > 0.0) mx = std::max(mx, st->host_soft[2 * b]);
        for (int b = 0; b < cuda_ws::kSoftmaxBlocks; ++b)
            if (st->host_soft[2 * b + 1] > 0.0)
                sum += st->host_soft[2 * b + 1] * std::exp(st->host_soft[2 * b] - mx);
        *norm = {(float)mx, sum};
    }
    return G4_OK;
}

} // namespace g4::cuda_rt
