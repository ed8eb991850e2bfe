// CUDA backend (see backend.h). Prefill chunks launch one kernel (or cuBLAS call) per op; decode steps
// (1 row) run the compiler's fused schedule (plan section CUDA_SCHEDULE), captured once into a CUDA
// graph and replayed, the position read by the kernels from a device Step struct.
#include "runtime/src/cuda/backend.h"
#include "kernels/nf4.h"
#include "runtime/src/cuda/cublas.h"
#include "runtime/src/cuda/driver.h"
#include "runtime/src/cuda/kernel_args.h"
#include "runtime/src/cuda/state.h"
#include "runtime/src/cuda/workspace.h"
#include "runtime/src/engine.h"
#include "runtime/src/env.h"
#include "runtime/src/executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <vector>

namespace g4::cuda_rt {

using namespace g4::cu;
using plan::CudaLaunch;
using plan::LaunchKind;
using plan::PlanOp;
using plan::PlanTensor;
using plan::RowMode;
using plan::TensorKind;

namespace {

#define CU_TRY(expr, what)                                                                                   \
    do {                                                                                                     \
        CUresult r_ = (expr);                                                                                \
        if (r_ != 0) {                                                                                       \
            *err = std::string(what) + ": " + error_name(r_);                                                \
            return G4_ERR_INTERNAL;                                                                          \
        }                                                                                                    \
    } while (0)

int ceil_div(int64_t a, int64_t b) {
    return (int)((a + b - 1) / b);
}

using cuda_ws::attention_splits;
using cuda_ws::kArgmaxBlocks;
using cuda_ws::kArgmaxBytes;

} // namespace

// One kernel launch on the session's stream; with programmatic dependent launch (decode graph,
// sm_90+) the kernel may start while its predecessor drains: every kernel calls griddepcontrol.wait
// before touching activations, so only weight prefetches overlap.
CUresult launch(const SessionState* st, CUfunction f, unsigned gx, unsigned gy, unsigned bx, void** args,
                unsigned gz, unsigned smem) {
    const Driver* d  = st->e->d;
    const bool plain = !st->pdl_now || st->after_node;
    st->after_node   = false;
    if (plain) return d->cuLaunchKernel(f, gx, gy, gz, bx, 1, 1, smem, st->cur->stream, args, nullptr);
    LaunchAttr at;
    std::memset(&at, 0, sizeof at);
    at.id      = kLaunchAttrProgrammaticStreamSerialization;
    at.v.value = 1;
    LaunchConfig c{{gx, gy, gz}, {bx, 1, 1}, smem, st->cur->stream, &at, 1};
    return d->cuLaunchKernelEx(&c, f, args, nullptr);
}

void TowerRun::start(CUdeviceptr step_dev, const int (&steps)[8]) {
    const Driver* d = st->e->d;
    Lane& ln        = st->lanes[0];
    r               = d->cuCtxSetCurrent(ln.g->ctx);
    st->cur         = &ln;
    st->ahead_pos   = -1; // the sync below waits for a step run ahead; the tower may reuse its buffers
    if (r == 0) r = d->cuStreamSynchronize(ln.stream);
    if (r == 0) r = d->cuMemcpyHtoDAsync(step_dev, steps, sizeof steps, ln.stream);
}

g4_status TowerRun::finish(void* host, CUdeviceptr dev, size_t bytes, const char* tower, std::string* err) {
    const Driver* d = st->e->d;
    const Lane& ln  = st->lanes[0];
    if (r == 0) {
        what = "copying the soft tokens to the host";
        r    = d->cuMemcpyDtoHAsync(host, dev, bytes, ln.stream);
    }
    if (r == 0) r = d->cuStreamSynchronize(ln.stream);
    if (r == 0) return G4_OK;
    *err = "CUDA error " + error_name(r) + " in the " + tower + " on GPU " + std::to_string(ln.g->index) +
           " (" + what + ")";
    return G4_ERR_INTERNAL;
}

namespace {

// Opens GPU `g` of the plan: checks it, loads the kernels and uploads its weights (segments of the
// plan's ranges; the PLE table stays on the host with ple=host). need_extra: the session bytes it
// will hold (activation arena and KV part), for the free-memory check.
g4_status open_gpu(const plan::Plan& p, EngineState* st, Gpu& g, const plan::ProgramInfo::GpuPart& part,
                   uint64_t need_extra, std::string* err) {
    const Driver* d = st->d;
    CU_TRY(d->cuDeviceGet(&g.dev, g.index), "cuDeviceGet");
    int major = 0, minor = 0;
    d->cuDeviceGetAttribute(&major, kAttrComputeMajor, g.dev);
    d->cuDeviceGetAttribute(&minor, kAttrComputeMinor, g.dev);
    char name[256] = {};
    d->cuDeviceGetName(name, sizeof name - 1, g.dev);
    g.name     = name;
    g.sm       = major * 10 + minor;
    int target = std::atoi(p.cuda_target().c_str() + 3);
    if (g.sm < target) {
        *err = "the plan was compiled for " + p.cuda_target() + " but GPU " + std::to_string(g.index) + " (" +
               g.name + ") is sm_" + std::to_string(g.sm) + "; recompile with --target sm_" +
               std::to_string(g.sm);
        return G4_ERR_UNSUPPORTED;
    }
    CU_TRY(d->cuDevicePrimaryCtxRetain(&g.ctx, g.dev), "cuDevicePrimaryCtxRetain");
    CU_TRY(d->cuCtxSetCurrent(g.ctx), "cuCtxSetCurrent");
    // Segments: the plan's ranges, less the PLE table where it stays on the host.
    uint64_t ple_b = 0, ple_e = 0;
    if (st->ple_tensor >= 0 && g.index == p.cuda_device()) {
        const PlanTensor& t = p.tensor(st->ple_tensor);
        ple_b               = t.offset,
        ple_e = (t.offset + t.nbytes + plan::kTensorAlign - 1) / plan::kTensorAlign * plan::kTensorAlign;
    }
    // Each segment at an offset congruent to its plan offset modulo plan::kWeightAlign (weight_segments.h).
    g.weights_bytes = place_weight_segments(part.weights, ple_b, ple_e, &g.segs);
    size_t free_b = 0, total_b = 0;
    CU_TRY(d->cuMemGetInfo(&free_b, &total_b), "cuMemGetInfo");
    const uint64_t need = g.weights_bytes + need_extra;
    if (need > free_b) {
        *err = "GPU " + std::to_string(g.index) + " (" + g.name + ") has " + std::to_string(free_b >> 20) +
               " MiB free but the plan needs " + std::to_string(need >> 20) +
               " MiB there (weights + one session); recompile with a smaller --max-context or free the GPU";
        return G4_ERR_OUT_OF_MEMORY;
    }
    // Exact architecture: the cubin; a newer GPU: the PTX, compiled by the driver at load.
    std::string ptx(p.ptx());
    // Optional kernels are looked up only where the plan's PTX defines them, so that opening a plan raises
    // no CUDA API error (a failed cuModuleGetFunction is one, and drowns real ones under compute-sanitizer).
    auto has_kernel = [&ptx](const std::string& name) {
        for (size_t at = ptx.find(".entry " + name); at != std::string::npos;
             at        = ptx.find(".entry " + name, at + 1)) {
            const char c = at + 7 + name.size() < ptx.size() ? ptx[at + 7 + name.size()] : '\0';
            if (c == '(' || c == ' ' || c == '\n' || c == '\r' || c == '\t') return true;
        }
        return false;
    };
    const void* image = g.sm == target ? (const void*)p.cubin().data() : (const void*)ptx.c_str();
    CU_TRY(d->cuModuleLoadData(&g.mod, image),
           "loading the plan's CUDA kernels on GPU " + std::to_string(g.index));
    Kernels& k = g.k;
    struct {
        CUfunction* f;
        const char* n;
    } fns[] = {{&k.embed, "g4_embed"},
               {&k.mm_bf16, "g4_matmul_bf16"},
               {&k.mm_f32, "g4_matmul_f32"},
               {&k.mm_nf4, "g4_matmul_nf4"},
               {&k.gemm_bf16, "g4_gemm_bf16"},
               {&k.gemm_nf4, "g4_gemm_nf4"},
               {&k.gemv_bf16, "g4_gemv_bf16"},
               {&k.gemv_nf4, "g4_gemv_nf4"},
               {&k.tc_bf16, "g4_tc_gemm_bf16"},
               {&k.tc_nf4, "g4_tc_gemm_nf4"},
               {&k.rms, "g4_rms_norm"},
               {&k.elem, "g4_elementwise"},
               {&k.rope, "g4_rope"},
               {&k.kv, "g4_kv_store"},
               {&k.attn_part, "g4_attention_partial"},
               {&k.attn_merge, "g4_attention_merge"},
               {&k.argmax, "g4_argmax"},
               {&k.resnorm, "g4_resnorm"},
               {&k.qkv_post, "g4_qkv_post"},
               {&k.attn_decode, "g4_attn_decode"},
               {&k.attn_decode_bf16, "g4_attn_decode_bf16"},
               {&k.attn_decode_post, "g4_attn_decode_post"},
               {&k.attn_decode_post_bf16, "g4_attn_decode_post_bf16"},
               {&k.nf4_to_bf16, "g4_nf4_to_bf16"},
               {&k.nf4_untile32, "g4_nf4_untile32"},
               {&k.f32_to_bf16, "g4_f32_to_bf16"},
               {&k.add_bias, "g4_add_bias"},
               {&k.copy_f32, "g4_copy_f32"},
               {&k.penalize, "g4_penalize"},
               {&k.mlp[0], "g4_mlp_nf4"},
               {&k.mlp[1], "g4_mlp_nf4_b256"},
               {&k.mlp[2], "g4_mlp_nf4_dq"},
               {&k.mlp[3], "g4_mlp_nf4_b256_dq"},
               {&k.mlp[4], "g4_mlp_nf4_rep"},
               {&k.mlp[5], "g4_mlp_nf4_b256_rep"},
               {&k.mlp_z[0], "g4_mlp_nf4_b256_z"},
               {&k.mlp_z[1], "g4_mlp_nf4_b256_dq_z"},
               {&k.mlp_z[2], "g4_mlp_nf4_b256_h2_z"},
               {&k.mlp[6], "g4_mlp_nf4_dq_rep"},
               {&k.mlp[7], "g4_mlp_nf4_b256_dq_rep"},
               {&k.resnorm_rep, "g4_resnorm_rep"},
               {&k.resnorm_z2, "g4_resnorm_z2"},
               {&k.mlp_r[0], "g4_mlp_nf4_h2_r"},
               {&k.mlp_r[1], "g4_mlp_nf4_b256_h2_r"},
               {&k.mlp_r[2], "g4_mlp_nf4_h2_rep_r"},
               {&k.mlp_r[3], "g4_mlp_nf4_b256_h2_rep_r"},
               {&k.mlp_r[4], "g4_mlp_nf4_b256_h2_z_r"},
               {&k.mlp[8], "g4_mlp_nf4_h2"},
               {&k.mlp[9], "g4_mlp_nf4_b256_h2"},
               {&k.mlp[10], "g4_mlp_nf4_h2_rep"},
               {&k.mlp[11], "g4_mlp_nf4_b256_h2_rep"},
               {&k.ple_in, "g4_ple_in"},
               {&k.attn_o[0], "g4_attn_o_nf4_g1"},
               {&k.attn_o[1], "g4_attn_o_nf4_g2"},
               {&k.attn_o[2], "g4_attn_o_nf4_g3"},
               {&k.attn_o[3], "g4_attn_o_nf4_g4"},
               {&k.ple[0], "g4_ple_bf16_g1"},
               {&k.ple[1], "g4_ple_bf16_g2"},
               {&k.ple[2], "g4_ple_bf16_g3"},
               {&k.ple[3], "g4_ple_bf16_g4"},
               {&k.ple_res[0], "g4_ple_res_bf16_g1"},
               {&k.ple_res[1], "g4_ple_res_bf16_g2"},
               {&k.ple_res[2], "g4_ple_res_bf16_g3"},
               {&k.ple_res[3], "g4_ple_res_bf16_g4"},
               {&k.topk_round, "g4_topk_round"},
               {&k.softmax_partial, "g4_softmax_partial"}};
    for (auto& f : fns)
        CU_TRY(d->cuModuleGetFunction(f.f, g.mod, f.n), std::string("kernel ") + f.n);
    for (int di = 0; di < 2; ++di) {
        const std::string sfx = di ? "_d512" : "_d256";
        const char* base[4]   = {"g4_attn_decode", "g4_attn_decode_bf16", "g4_attn_decode_post",
                                 "g4_attn_decode_post_bf16"};
        for (int v = 0; v < 4; ++v)
            if (!has_kernel(base[v] + sfx) ||
                d->cuModuleGetFunction(&k.attn_dim[di][v], g.mod, (base[v] + sfx).c_str()) != 0)
                k.attn_dim[di][v] = nullptr;
    }
    // LM-head screening: a module without its kernels (a plan from an older g4) decodes without screening.
    if (!has_kernel("g4_lm_screen_build") || !has_kernel("g4_lm_screen") ||
        d->cuModuleGetFunction(&k.lm_build, g.mod, "g4_lm_screen_build") != 0 ||
        d->cuModuleGetFunction(&k.lm_screen, g.mod, "g4_lm_screen") != 0)
        k.lm_build = k.lm_screen = nullptr;
    for (int l = 0; l < 5 && k.lm_screen; ++l)
        if (const std::string n = "g4_lm_exact_l" + std::to_string(kGemvLanes[l]);
            !has_kernel(n) || d->cuModuleGetFunction(&k.lm_exact[l], g.mod, n.c_str()) != 0)
            k.lm_build = k.lm_screen = nullptr;
    if (p.info().vision_gpu && g.index == p.cuda_device()) {
        struct {
            CUfunction* f;
            const char* n;
        } vt[] = {{&k.vt_pixels, "g4_vt_pixels"},
                  {&k.vt_posemb, "g4_vt_posemb"},
                  {&k.vt_clamp, "g4_vt_clamp"},
                  {&k.vt_rope2d, "g4_vt_rope2d"},
                  {&k.vt_pool, "g4_vt_pool"}};
        for (auto& f : vt)
            CU_TRY(d->cuModuleGetFunction(f.f, g.mod, f.n), std::string("kernel ") + f.n);
    }
    if (p.info().audio_gpu && g.index == p.cuda_device()) {
        struct {
            CUfunction* f;
            const char* n;
        } at[] = {{&k.at_conv, "g4_at_conv"},         {&k.at_rms, "g4_at_rms"},
                  {&k.vt_clamp, "g4_vt_clamp"},       {&k.at_silu, "g4_at_silu"},
                  {&k.at_residual, "g4_at_residual"}, {&k.at_bias, "g4_at_bias"},
                  {&k.at_qk_scale, "g4_at_qk_scale"}, {&k.at_attention, "g4_at_attention"},
                  {&k.at_glu, "g4_at_glu"},           {&k.at_dwconv, "g4_at_dwconv"}};
        for (auto& f : at)
            CU_TRY(d->cuModuleGetFunction(f.f, g.mod, f.n), std::string("kernel ") + f.n);
    }
    for (int i = 0; i < 6; ++i) {
        const int dim = kFlashDims[i];
        std::string n = flash_kernel_name(dim);
        CU_TRY(d->cuModuleGetFunction(&k.flash[i], g.mod, n.c_str()), "kernel " + n);
        CU_TRY(
            d->cuFuncSetAttribute(k.flash[i], kFuncAttrMaxDynamicSmem, (int)flash_launch(64, 1, 1, dim).smem),
            "kernel " + n + ": shared memory size");
    }
    for (int q = 0; q < 2; ++q)
        for (int l = 0; l < 5; ++l)
            for (int m = 0; m < 2; ++m) {
                std::string n = gemv_kernel_name(q, kGemvLanes[l], m);
                CU_TRY(d->cuModuleGetFunction(&k.gemv[q][l][m], g.mod, n.c_str()), "kernel " + n);
                if (gemv_smem(q, g.sm, 0))
                    CU_TRY(d->cuFuncSetAttribute(k.gemv[q][l][m], kFuncAttrMaxDynamicSmem, (int)kGemvSmemMax),
                           "kernel " + n + ": shared memory size");
            }
    if (gemv_smem(true, g.sm, 0)) {
        // Every fused-MLP kernel (g4_mlp_nf4*: k.mlp, mlp_z, mlp_r) stages its tables in this dynamic shared
        // memory: one rule by name, so no family of them (_z, _r, ...) can be left out.
        for (auto& f : fns)
            if (std::strncmp(f.n, "g4_mlp_nf4", 10) == 0)
                CU_TRY(d->cuFuncSetAttribute(*f.f, kFuncAttrMaxDynamicSmem, (int)kGemvSmemMax),
                       std::string("kernel ") + f.n + ": shared memory size");
        for (CUfunction f : k.attn_o)
            CU_TRY(d->cuFuncSetAttribute(f, kFuncAttrMaxDynamicSmem, (int)kGemvWideSmem),
                   "kernel g4_attn_o_nf4: shared memory size");
    }
    CU_TRY(d->cuMemAlloc(&g.weights, std::max<uint64_t>(64, g.weights_bytes)),
           "allocating " + std::to_string(g.weights_bytes >> 20) + " MiB of weights on GPU " +
               std::to_string(g.index));
    for (const Gpu::Seg& sg : g.segs)
        CU_TRY(d->cuMemcpyHtoD(g.weights + sg.at, p.weights_base() + sg.begin, sg.end - sg.begin),
               "uploading weights to GPU " + std::to_string(g.index));
    return G4_OK;
}

// Device bytes a session allocates on the plan's GPU `g` (index into in.gpus): the activation arena, its
// part of the KV arena and, on the plan's GPU, the towers' buffers where they run there.
uint64_t session_device_bytes(const plan::ProgramInfo& in, size_t g) {
    return in.act_arena_bytes + in.gpus[g].kv_end - in.gpus[g].kv_begin +
           (g == 0 && in.vision_gpu ? in.vision_gpu_bytes : 0) +
           (g == 0 && in.audio_gpu ? in.audio_gpu_bytes : 0);
}

// LM-head screening (kernels.cu g4_lm_screen): where the plan runs on one GPU without CPU layers and its
// decode schedule ends in a bf16 head GEMV the kernels take, builds the int8 copy and its row bounds on the
// GPU. Skipped (decode steps compute every logit, as before) when G4_LM_SCREEN=0 or when the GPU lacks the
// memory for it beside the weights and a session with ~256 MiB to spare.
g4_status lm_screen_setup(const plan::Plan& p, EngineState* st, std::string* err) {
    const Driver* d = st->d;
    const auto& in  = p.info();
    Gpu& g          = st->gpus[0];
    if (rt::env::lm_screen_off() || in.gpus.size() != 1 || p.has_cpu_layers() || !p.n_launches() ||
        !g.k.lm_screen)
        return G4_OK;
    int li = -1;
    for (size_t i = 0; i < p.n_launches(); ++i) {
        const CudaLaunch& l = p.launch(i);
        if (l.kind == (uint16_t)LaunchKind::Gemv && (int)p.op(l.ip[0]).out[0] == in.logits_tensor)
            li = (int)i;
    }
    if (li < 0) return G4_OK;
    const CudaLaunch& l = p.launch(li);
    const PlanOp& op    = p.op(l.ip[0]);
    const PlanTensor& w = p.tensor(op.in[1]);
    const int lanes_i = gemv_lanes_index(l.ip[5]), V = (int)w.dims[0], K = (int)w.dims[1];
    if (l.ip[3] != 1 || (l.ip[4] != 0 && l.ip[4] != 3) || w.dtype != (uint8_t)DType::BF16 || lanes_i < 0 ||
        K % 16 || K > 4096 || (long)ceil_div(V, 128 / l.ip[5] * 4) > (long)kArgmaxBlocks * 1024)
        return G4_OK;
    CUdeviceptr wd = 0;
    for (const Gpu::Seg& sg : g.segs)
        if (w.offset >= sg.begin && w.offset < sg.end) wd = g.weights + sg.at + (w.offset - sg.begin);
    if (!wd) return G4_OK;
    const uint64_t scale_at = ((uint64_t)V * K + 255) / 256 * 256, bytes = scale_at + (uint64_t)V * 8;
    CU_TRY(d->cuCtxSetCurrent(g.ctx), "cuCtxSetCurrent");
    size_t free_b = 0, total_b = 0;
    CU_TRY(d->cuMemGetInfo(&free_b, &total_b), "cuMemGetInfo");
    if (free_b < bytes + session_device_bytes(in, 0) + (256ull << 20))
        return G4_OK; // the towers' weights are already up
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

// A fused launch kind's name in the decode event profile.
const char* launch_kind_name(uint16_t kind) {
    static const char* kNames[] = {"op",  "resnorm", "gemv", "qkv_post", "qkv_attn",
                                   "mlp", "attn_o",  "ple",  "ple_in"};
    return kind < sizeof kNames / sizeof kNames[0] ? kNames[kind] : "?";
}

} // namespace

g4_status engine_open(g4_engine* e, std::string* err) {
    const plan::Plan& p = e->plan;
    std::string why;
    const Driver* d = driver(&why);
    if (!d) {
        *err = e->plan.cuda_target() + " plan: " + why +
               "; this plan needs an NVIDIA GPU (recompile with --device cpu to run on the CPU)";
        return G4_ERR_UNSUPPORTED;
    }
    auto st        = std::unique_ptr<EngineState, EngineDeleter>(new EngineState());
    st->d          = d;
    const auto& in = p.info();
    int count      = 0;
    CU_TRY(d->cuDeviceGetCount(&count), "cuDeviceGetCount");
    for (const auto& g : in.gpus)
        if (g.index >= count) {
            *err = "the plan is for CUDA device " + std::to_string(g.index) + " but this machine has " +
                   std::to_string(count) + " CUDA device(s)";
            return G4_ERR_UNSUPPORTED;
        }
    if (p.has_cpu_layers() && !d->cuLaunchHostFunc) {
        *err = "this plan runs layers on the CPU, which needs cuLaunchHostFunc and cuMemcpy2DAsync; the "
               "NVIDIA driver is too old";
        return G4_ERR_UNSUPPORTED;
    }
    if (in.gpus.size() > 1 && (!d->cuStreamWaitEvent || !d->cuEventCreate || !d->cuMemcpy2DAsync)) {
        *err = "this plan runs on " + std::to_string(in.gpus.size()) +
               " GPUs, which needs cuStreamWaitEvent and cuMemcpy2DAsync; the NVIDIA driver is too old";
        return G4_ERR_UNSUPPORTED;
    }
    if (p.ple_on_host())
        for (size_t t = 0; t < p.n_tensors(); ++t)
            if (p.tensor(t).kind == (uint8_t)TensorKind::Weight &&
                p.tensor(t).flags == (uint8_t)plan::WeightRole::PleTable)
                st->ple_tensor = (int32_t)t;
    st->gpus.resize(in.gpus.size());
    for (size_t g = 0; g < in.gpus.size(); ++g) {
        st->gpus[g].index = in.gpus[g].index;
        // The plan's GPU also holds the towers' weights, if placed there.
        const uint64_t towers = g == 0 ? (in.vision_gpu ? in.vision_end - in.vision_begin : 0) +
                                             (in.audio_gpu ? in.audio_end - in.audio_begin : 0)
                                       : 0;
        g4_status r =
            open_gpu(p, st.get(), st->gpus[g], in.gpus[g], session_device_bytes(in, g) + towers, err);
        if (r != G4_OK) return r;
    }
    if (in.vision_gpu) {
        const uint64_t bytes = in.vision_end - in.vision_begin;
        CU_TRY(d->cuCtxSetCurrent(st->gpus[0].ctx), "cuCtxSetCurrent");
        CU_TRY(d->cuMemAlloc(&st->vision_w, bytes), "allocating " + std::to_string(bytes >> 20) +
                                                        " MiB for the vision tower's weights on GPU " +
                                                        std::to_string(st->gpus[0].index));
        CU_TRY(d->cuMemcpyHtoD(st->vision_w, p.weights_base() + in.vision_begin, bytes),
               "uploading the vision tower's weights");
        st->vision_bytes = bytes;
    }
    if (in.audio_gpu) {
        const uint64_t bytes = in.audio_end - in.audio_begin;
        CU_TRY(d->cuCtxSetCurrent(st->gpus[0].ctx), "cuCtxSetCurrent");
        CU_TRY(d->cuMemAlloc(&st->audio_w, bytes), "allocating " + std::to_string(bytes >> 20) +
                                                       " MiB for the audio tower's weights on GPU " +
                                                       std::to_string(st->gpus[0].index));
        CU_TRY(d->cuMemcpyHtoD(st->audio_w, p.weights_base() + in.audio_begin, bytes),
               "uploading the audio tower's weights");
        st->audio_bytes = bytes;
    }
    // Direct copies between the GPUs where they allow them (else the driver stages them).
    for (Gpu& a : st->gpus)
        for (Gpu& b : st->gpus) {
            int can = 0;
            if (&a == &b || d->cuDeviceCanAccessPeer(&can, a.dev, b.dev) != 0 || !can) continue;
            d->cuCtxSetCurrent(a.ctx);
            d->cuCtxEnablePeerAccess(b.ctx, 0); // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED is fine
        }
    if (g4_status r = lm_screen_setup(p, st.get(), err); r != G4_OK) return r;
    if (st->ple_tensor >= 0) {
        const PlanTensor& t = p.tensor(st->ple_tensor);
        CU_TRY(d->cuCtxSetCurrent(st->gpus[0].ctx), "cuCtxSetCurrent");
        CU_TRY(d->cuMemHostAlloc(&st->ple_host, t.nbytes, kHostAllocPortable | kHostAllocDeviceMap),
               "allocating pinned host memory for the PLE table (" + std::to_string(t.nbytes >> 20) +
                   " MiB, --place ple=host)");
        std::memcpy(st->ple_host, p.weights_base() + t.offset, t.nbytes);
        CU_TRY(d->cuMemHostGetDevicePointer(&st->ple_dev, st->ple_host, 0), "mapping the PLE table");
    }
    e->cuda.reset(st.release());
    return G4_OK;
}

// The timeline lab (bench/scripts/trace_lab.sh): a plan compiled with --kernel-trace keeps per-launch records
// in its module (kernels.cu G4_TRACE); with G4_TRACE_OUT=file they are written there when the engine
// closes: u32 count, then count records of 64 bytes (u64 key, t0, t1, t2; u32 tag, blocks, smid, cycles,
// mark[4]).
static void dump_trace(const Driver* d, const Gpu& g) {
    const char* out = rt::env::trace_out();
    if (!out) return;
    CUdeviceptr n_ptr = 0, buf = 0;
    size_t n_size = 0, buf_size = 0;
    if (!d->cuModuleGetGlobal || d->cuModuleGetGlobal(&n_ptr, &n_size, g.mod, "g4_trace_n") != 0 ||
        d->cuModuleGetGlobal(&buf, &buf_size, g.mod, "g4_trace_buf") != 0) {
        std::fprintf(stderr, "g4: G4_TRACE_OUT is set but this plan's kernels keep no trace (compile it with "
                             "g4 compile --kernel-trace launches)\n");
        return;
    }
    uint32_t n = 0;
    if (d->cuMemcpyDtoH(&n, n_ptr, 4) != 0) return;
    const uint32_t keep = (uint32_t)std::min<uint64_t>(n, buf_size / 64);
    std::vector<char> recs((size_t)keep * 64);
    if (keep && d->cuMemcpyDtoH(recs.data(), buf, recs.size()) != 0) return;
    const std::string path = std::string(out) + (g.index ? "." + std::to_string(g.index) : ""),
                      tmp  = path + ".part";
    FILE* f                = std::fopen(tmp.c_str(), "wb");
    bool ok =
        f && std::fwrite(&keep, 4, 1, f) == 1 && std::fwrite(recs.data(), 1, recs.size(), f) == recs.size();
    ok = f && std::fclose(f) == 0 && ok && std::rename(tmp.c_str(), path.c_str()) == 0;
    if (ok) {
        std::fprintf(stderr, "g4: %u kernel trace records (%u made) written to %s\n", keep, n, path.c_str());
    } else {
        std::fprintf(stderr, "g4: cannot write the kernel trace to %s\n", path.c_str());
        std::remove(tmp.c_str());
    }
}

void engine_close(EngineState* st) {
    if (!st) return;
    if (st->d) {
        for (Gpu& g : st->gpus) {
            if (!g.ctx) continue;
            st->d->cuCtxSetCurrent(g.ctx);
            if (g.mod) dump_trace(st->d, g);
            if (g.weights) st->d->cuMemFree(g.weights);
            if (&g == &st->gpus[0] && st->vision_w) st->d->cuMemFree(st->vision_w);
            if (&g == &st->gpus[0] && st->audio_w) st->d->cuMemFree(st->audio_w);
            if (&g == &st->gpus[0] && st->lm_q) st->d->cuMemFree(st->lm_q);
            if (g.mod) st->d->cuModuleUnload(g.mod);
        }
        if (st->ple_host) st->d->cuMemFreeHost(st->ple_host);
        for (Gpu& g : st->gpus)
            if (g.ctx) st->d->cuDevicePrimaryCtxRelease(g.dev);
    }
    delete st;
}

uint64_t engine_device_bytes(const EngineState* st) {
    uint64_t b = 0;
    if (st)
        for (const Gpu& g : st->gpus)
            b += g.weights_bytes;
    return b + (st ? st->vision_bytes + st->audio_bytes + st->lm_bytes : 0);
}

g4_status session_create(g4_session* s, std::string* err) {
    EngineState* e      = s->engine->cuda.get();
    const plan::Plan& p = s->engine->plan;
    const auto& in      = p.info();
    const Driver* d     = e->d;
    auto st             = std::unique_ptr<SessionState, SessionDeleter>(new SessionState());
    st->e               = e;
    st->lane_of.assign(p.n_ops(), -1);
    for (size_t i = 0; i < p.n_ops(); ++i)
        if (p.op(i).code != (uint16_t)OpCode::Copy && !p.op_on_cpu(i))
            st->lane_of[i] = p.gpu_slot(p.op_device(i));
    st->splits.assign(p.n_ops(), 1);
    // q/k/v and gate/up read one input: the cuBLAS tier converts it to bf16 once. Op i reuses the
    // scratch when the previous cuBLAS-tier matmul ran on the same GPU, read the same view with the
    // same row mode and no op in between wrote that tensor (the plan runs every op of a step in
    // order, with one row count).
    st->reuse_x.assign(p.n_ops(), 0);
    {
        int last     = -1;
        bool written = false;
        for (size_t i = 0; i < p.n_ops(); ++i) {
            const PlanOp& op = p.op(i);
            const bool tier  = op.code == (uint16_t)OpCode::Matmul &&
                              op.ip[6] == (int32_t)plan::MatmulVariant::Cublas && st->lane_of[i] >= 0;
            if (tier && last >= 0 && !written) {
                const PlanOp& pr = p.op(last);
                st->reuse_x[i]   = pr.in[0] == op.in[0] && pr.in_col[0] == op.in_col[0] &&
                                 pr.row_mode == op.row_mode &&
                                 p.tensor(pr.in[1]).dims[1] == p.tensor(op.in[1]).dims[1] &&
                                 st->lane_of[last] == st->lane_of[i];
            }
            if (tier)
                last = (int)i, written = false;
            else if (last >= 0)
                for (int32_t o : op.out)
                    written |= o >= 0 && o == p.op(last).in[0];
        }
    }
    for (size_t i = 0; i < p.n_ops(); ++i)
        if (p.op(i).code == (uint16_t)OpCode::Attention)
            st->splits[i] = attention_splits(p.op(i)); // 0: the flash kernel
    // Per GPU: workspaces as the compiler's memory plan counts them (runtime/src/cuda/workspace.h,
    // over the ops that GPU runs), a whole activation arena, its part of the KV arena, a step buffer.
    st->lanes.resize(e->gpus.size());
    cuda_ws::Workspace ws0;
    for (size_t g = 0; g < e->gpus.size(); ++g) {
        Lane& ln             = st->lanes[g];
        ln.g                 = &e->gpus[g];
        const auto& part     = in.gpus[g];
        const std::string on = e->gpus.size() > 1 ? " on GPU " + std::to_string(ln.g->index) : "";
        CU_TRY(d->cuCtxSetCurrent(ln.g->ctx), "cuCtxSetCurrent");
        CU_TRY(d->cuStreamCreate(&ln.stream, 1 /* non-blocking */), "cuStreamCreate");
        if (e->gpus.size() > 1) CU_TRY(d->cuEventCreate(&ln.done, kEventDisableTiming), "cuEventCreate");
        const cuda_ws::Workspace ws = cuda_ws::workspace(
            &p.op(0), p.n_ops(), &p.tensor(0), in.max_rows, in.max_context, in.vocab_size, g == 0,
            st->lane_of.data(), (int)g, p.n_launches() ? &p.launch(0) : nullptr, p.n_launches());
        if (g == 0) ws0 = ws;
        if (ws.xscratch) {
            std::string why;
            if (!st->blas) st->blas = cublas::lib(&why); // absent: the tensor-core kernel takes these matmuls
            if (st->blas ||
                ws.tiled) // without cuBLAS, the tiled down projections' prefill still untiles into it
                CU_TRY(d->cuMemAlloc(&ln.wscratch, std::max<size_t>(256, ws.wscratch)),
                       "allocating the NF4 weight scratch" + on);
            if (st->blas) {
                CU_TRY(d->cuMemAlloc(&ln.xscratch, ws.xscratch),
                       "allocating the cuBLAS activation scratch" + on);
                CU_TRY(d->cuMemAlloc(&ln.cublas_ws, ws.cublas), "allocating the cuBLAS workspace" + on);
                if (st->blas->create(&ln.blas_h) != 0 || st->blas->set_stream(ln.blas_h, ln.stream) != 0 ||
                    st->blas->set_workspace(ln.blas_h, (void*)ln.cublas_ws, plan::kCublasWorkspaceBytes) !=
                        0) {
                    *err = "cuBLAS (" + st->blas->path + ") failed to initialise" + on;
                    return G4_ERR_INTERNAL;
                }
            }
        }
        const uint64_t kv_bytes = part.kv_end - part.kv_begin;
        ln.kv_begin             = part.kv_begin;
        CU_TRY(d->cuMemAlloc(&ln.act, std::max<uint64_t>(64, in.act_arena_bytes)),
               "allocating the activation arena" + on);
        CU_TRY(d->cuMemAlloc(&ln.kv, std::max<uint64_t>(64, kv_bytes)), "allocating the KV cache" + on);
        CU_TRY(d->cuMemsetD8(ln.kv, 0, std::max<uint64_t>(64, kv_bytes)), "clearing the KV cache" + on);
        CU_TRY(d->cuMemAlloc(&ln.step, 64), "allocating the step buffer" + on);
        CU_TRY(d->cuMemAlloc(&ln.part, ws.part * 4), "allocating the attention workspace" + on);
        CU_TRY(d->cuMemAlloc(&ln.scores, ws.scores * 4), "allocating the attention workspace" + on);
        if (ws.mlp_rep) { // zero between steps: each MLP's ResNorm re-zeroes what it sums
            CU_TRY(d->cuMemAlloc(&ln.mlp_rep, ws.mlp_rep * 4), "allocating the MLPs' output replicas" + on);
            CU_TRY(d->cuMemsetD8(ln.mlp_rep, 0, ws.mlp_rep * 4), "clearing the MLPs' output replicas" + on);
        }
    }
    st->cur  = &st->lanes[0];
    Lane& l0 = st->lanes[0];
    CU_TRY(d->cuCtxSetCurrent(l0.g->ctx), "cuCtxSetCurrent");
    if (p.has_cpu_layers()) {
        const uint64_t host_kv = in.kv_arena_bytes - in.kv_host_begin;
        CU_TRY(
            d->cuMemHostAlloc(&st->host_act, std::max<uint64_t>(64, in.act_arena_bytes), kHostAllocPortable),
            "allocating the pinned host activation arena (" + std::to_string(in.act_arena_bytes >> 20) +
                " MiB) of the CPU-placed layers");
        const int threads   = cpu::default_thread_count();
        const size_t stride = cpu::scratch_floats_per_thread(in.max_k, in.max_slots);
        st->host_kv         = std::calloc(1, std::max<uint64_t>(64, host_kv));
        st->host_scratch    = (float*)std::calloc(stride * threads, sizeof(float));
        if (!st->host_kv || !st->host_scratch) {
            *err = "cannot allocate " + std::to_string(host_kv >> 20) +
                   " MiB of host memory for the CPU-placed layers' KV cache";
            return G4_ERR_OUT_OF_MEMORY;
        }
        s->pool       = std::make_unique<cpu::ThreadPool>(threads);
        s->ctx        = {s->pool.get(), st->host_scratch, stride};
        s->act        = (uint8_t*)st->host_act;
        s->kv         = (uint8_t*)st->host_kv;
        s->kv_offset0 = in.kv_host_begin;
        rt::bind_ops(s);
        st->run_of.assign(p.n_ops(), -1);
        for (size_t i = 0; i < p.n_ops();) {
            if (!p.op_on_cpu(i)) {
                ++i;
                continue;
            }
            size_t j = i;
            while (j < p.n_ops() && p.op_on_cpu(j))
                ++j;
            st->run_of[i] = (int)st->runs.size();
            st->runs.push_back({s, i, j});
            i = j;
        }
    }
    if (in.vision_gpu) {
        CU_TRY(d->cuCtxSetCurrent(st->lanes[0].g->ctx), "cuCtxSetCurrent");
        CU_TRY(d->cuMemAlloc(&st->vision_buf, std::max<uint64_t>(256, in.vision_gpu_bytes)),
               "allocating the vision tower's buffers (" + std::to_string(in.vision_gpu_bytes >> 20) +
                   " MiB)");
    }
    if (in.audio_gpu) {
        CU_TRY(d->cuCtxSetCurrent(st->lanes[0].g->ctx), "cuCtxSetCurrent");
        CU_TRY(d->cuMemAlloc(&st->audio_buf, std::max<uint64_t>(256, in.audio_gpu_bytes)),
               "allocating the audio tower's buffers (" + std::to_string(in.audio_gpu_bytes >> 20) + " MiB)");
    }
    st->n_cand = ws0.candidates;
    for (CUdeviceptr& c : st->cand)
        CU_TRY(d->cuMemAlloc(&c, ws0.candidates * 8), "allocating the sampler's candidates");
    CU_TRY(d->cuMemAlloc(&st->samp_logits, ws0.vocab * 4), "allocating the sampler's logits");
    CU_TRY(d->cuMemAlloc(&st->samp_hist, std::max<uint64_t>(4, ws0.history * 4)),
           "allocating the sampler's history");
    CU_TRY(d->cuMemAllocHost((void**)&st->host_hist, std::max<uint64_t>(4, ws0.history * 4)),
           "allocating pinned memory");
    CU_TRY(d->cuMemAllocHost((void**)&st->host_cand, cuda_ws::kTopkMax * 8), "allocating pinned memory");
    CU_TRY(d->cuMemAlloc(&st->soft, cuda_ws::kSoftmaxBlocks * 16),
           "allocating the sampler's softmax partials");
    CU_TRY(d->cuMemAllocHost((void**)&st->host_soft, cuda_ws::kSoftmaxBlocks * 16),
           "allocating pinned memory");
    CU_TRY(d->cuMemAllocHost((void**)&st->host_step, 64), "allocating pinned memory");
    CU_TRY(d->cuMemHostAlloc((void**)&st->host_tok, 64, kHostAllocPortable | kHostAllocDeviceMap),
           "allocating pinned memory");
    CU_TRY(d->cuMemHostGetDevicePointer(&st->host_tok_dev, st->host_tok, 0),
           "mapping the greedy token's host slots");
    std::memset(st->host_tok, 0, 64);
    if (e->lm_launch >= 0) {
        CU_TRY(d->cuMemAlloc(&st->lm_lohi, (size_t)(in.vocab_size + 1) * 8),
               "allocating the LM head's screening bounds");
        CU_TRY(d->cuMemAlloc(&st->lm_tmax, 4), "allocating the LM head's screening bounds");
        CU_TRY(d->cuMemsetD8(st->lm_tmax, 0, 4), "clearing the LM head's screening bounds");
    }
    CU_TRY(d->cuMemAlloc(&st->tok, kArgmaxBytes), "allocating the argmax buffer");
    CU_TRY(d->cuMemsetD8(st->tok, 0, kArgmaxBytes), "clearing the argmax buffer");
    CU_TRY(d->cuMemAllocHost((void**)&st->host_ids, (size_t)in.max_rows * 4), "allocating pinned memory");
    CU_TRY(d->cuMemAllocHost((void**)&st->host_logits, (size_t)in.logits_rows * in.vocab_size * 4),
           "allocating pinned memory");
    s->ids      = st->host_ids;
    s->logits   = st->host_logits;
    st->profile = rt::env::cuda_profile();
    st->pdl_ok =
        std::all_of(st->lanes.begin(), st->lanes.end(), [](const Lane& ln) { return ln.g->sm >= 90; }) &&
        d->cuLaunchKernelEx && !rt::env::pdl_off();
    // Decode-graph event profiling times one stream; plans on several GPUs get the per-op timing only.
    if (st->profile && d->cuEventCreate && p.n_launches() && st->lanes.size() == 1) {
        st->pdl_ok = false; // events between launches would cut the programmatic edges
        st->ev.resize(p.n_launches() + 2);
        for (CUevent& ev : st->ev)
            CU_TRY(d->cuEventCreate(&ev, 0), "cuEventCreate");
        for (size_t li = 0; li < p.n_launches(); ++li) {
            const CudaLaunch& l      = p.launch(li);
            const PlanOp& op         = p.op(l.op);
            std::string name         = p.str(op.name); // "q_norm-9": the layer goes, so rows sum over layers
            const std::string suffix = "-" + std::to_string(op.layer);
            if (op.layer != 0xFFFF && name.size() > suffix.size() &&
                name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
                name.resize(name.size() - suffix.size());
            st->ev_label.push_back(std::string(l.kind == (uint16_t)LaunchKind::Op
                                                   ? op_name((OpCode)op.code)
                                                   : launch_kind_name(l.kind)) +
                                   " " + name);
        }
        st->ev_label.push_back("argmax");
    }
    // Decoding ahead: the captured graph on one GPU, all of it on the GPU, with events to wait on.
    st->ahead_ok = st->lanes.size() == 1 && !p.has_cpu_layers() && p.n_launches() && d->cuEventCreate &&
                   d->cuEventRecord && d->cuEventSynchronize && st->ev.empty() && !st->profile &&
                   !rt::env::decode_ahead_off();
    if (st->ahead_ok)
        for (CUevent& ev : st->tok_ev)
            CU_TRY(d->cuEventCreate(&ev, kEventDisableTiming), "cuEventCreate");
    s->cuda.reset(st.release());
    return G4_OK;
}

void session_destroy(SessionState* st) {
    if (!st) return;
    if (st->profile) {
        std::fprintf(stderr,
                     "g4 cuda profile (ms total / calls; per-op sync timing includes ~launch latency):\n");
        for (int c = 0; c < SessionState::kProfCats; ++c)
            for (int m = 0; m < 2; ++m)
                if (st->prof_n[c][m]) {
                    const std::string name = c >= 16 ? std::string(launch_kind_name((uint16_t)(c - 16))) + "*"
                                                     : op_name((OpCode)c);
                    std::fprintf(stderr, "  %-10s %-8s %10.3f ms %8ld calls %8.1f us/call\n", name.c_str(),
                                 m ? "prefill" : "decode", st->prof_ms[c][m], st->prof_n[c][m],
                                 1000 * st->prof_ms[c][m] / st->prof_n[c][m]);
                }
    }
    const Driver* d = st->e->d;
    if (!st->lanes.empty()) d->cuCtxSetCurrent(st->lanes[0].g->ctx);
    if (st->ev_steps) {
        std::fprintf(stderr,
                     "g4 cuda decode profile (GPU time between events around each launch of the decode "
                     "graph, %ld steps, "
                     "%.1f us/token; programmatic launch off while profiling):\n",
                     st->ev_steps, 1000 * st->ev_total_ms / st->ev_steps);
        auto rows = st->ev_ms;
        std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
        long per_step = (long)st->ev_label.size();
        for (const auto& r : rows) {
            long n = std::count(st->ev_label.begin(), st->ev_label.end(), r.first);
            std::fprintf(stderr, "  %-28s %8.1f us/token %5.1f%% %4ld launches/token %7.2f us/launch\n",
                         r.first.c_str(), 1000 * r.second / st->ev_steps, 100 * r.second / st->ev_total_ms, n,
                         1000 * r.second / st->ev_steps / n);
        }
        std::fprintf(stderr, "  %ld launches per decode step\n", per_step);
    }
    if (st->ahead_pos >= 0)
        d->cuStreamSynchronize(st->lanes[0].stream); // a step run ahead still uses the buffers
    for (CUevent ev : st->ev)
        if (ev) d->cuEventDestroy(ev);
    for (CUevent ev : st->tok_ev)
        if (ev) d->cuEventDestroy(ev);
    if (st->exec) d->cuGraphExecDestroy(st->exec);
    if (st->graph) d->cuGraphDestroy(st->graph);
    if (st->exec_screen) d->cuGraphExecDestroy(st->exec_screen);
    if (st->graph_screen) d->cuGraphDestroy(st->graph_screen);
    for (CUdeviceptr ptr : {st->tok, st->cand[0], st->cand[1], st->samp_logits, st->samp_hist, st->soft,
                            st->vision_buf, st->audio_buf, st->lm_lohi, st->lm_tmax})
        if (ptr) d->cuMemFree(ptr);
    for (Lane& ln : st->lanes) {
        d->cuCtxSetCurrent(ln.g->ctx);
        if (ln.blas_h) st->blas->destroy(ln.blas_h);
        if (ln.done) d->cuEventDestroy(ln.done);
        if (ln.stream) d->cuStreamDestroy(ln.stream);
        for (CUdeviceptr ptr :
             {ln.act, ln.kv, ln.step, ln.part, ln.scores, ln.wscratch, ln.xscratch, ln.cublas_ws, ln.mlp_rep})
            if (ptr) d->cuMemFree(ptr);
    }
    if (!st->lanes.empty()) d->cuCtxSetCurrent(st->lanes[0].g->ctx);
    for (void* h : {(void*)st->host_step, (void*)st->host_ids, (void*)st->host_logits, (void*)st->host_tok,
                    (void*)st->host_hist, (void*)st->host_cand, (void*)st->host_soft, st->host_act})
        if (h) d->cuMemFreeHost(h);
    std::free(st->host_kv);
    std::free(st->host_scratch);
    delete st;
}

namespace {

// Address on the current lane's GPU of tensor `idx` with a column offset (activations in elements of
// 4 bytes, KV caches of their dtype). check_ops has verified that each op's weights and caches lie
// in its GPU's parts.
CUdeviceptr addr(const SessionState* st, const plan::Plan& p, int32_t idx, int32_t col) {
    if (idx < 0) return 0;
    const PlanTensor& t = p.tensor(idx);
    const Lane& ln      = *st->cur;
    switch ((TensorKind)t.kind) {
    case TensorKind::Weight: {
        if (idx == st->e->ple_tensor) return st->e->ple_dev;
        for (const Gpu::Seg& sg : ln.g->segs)
            if (t.offset >= sg.begin && t.offset < sg.end)
                return ln.g->weights + sg.at + (t.offset - sg.begin);
        return 0;
    }
    case TensorKind::KvCache:
        return ln.kv + (t.offset - ln.kv_begin) + dtype_bytes((DType)t.dtype, col);
    default:
        return ln.act + t.offset + (uint64_t)col * 4;
    }
}

// Makes lane `slot` current: work enqueued from here on goes to its stream, after everything
// enqueued so far on the previous one (an event joins the streams; captured into the decode graph
// like the rest). The next kernel launch is plain (no programmatic edge across streams).
g4_status use_lane(SessionState* st, int slot, std::string* err) {
    Lane* next = &st->lanes[slot];
    if (next == st->cur) return G4_OK;
    const Driver* d = st->e->d;
    CU_TRY(d->cuEventRecord(st->cur->done, st->cur->stream), "recording a cross-GPU event");
    CU_TRY(d->cuCtxSetCurrent(next->g->ctx), "cuCtxSetCurrent");
    CU_TRY(d->cuStreamWaitEvent(next->stream, st->cur->done, 0), "waiting for another GPU's work");
    st->cur        = next;
    st->after_node = true;
    return G4_OK;
}

// Device addresses of the parts of an NF4 weight blob (kernels/nf4.h) that starts at `base`.
struct Nf4Ptrs {
    CUdeviceptr codes, absmax, absmax2, offset, code2; // the last three 0 without double quant
};
Nf4Ptrs nf4_ptrs(CUdeviceptr base, const PlanTensor& w) {
    nf4::Layout l = nf4::layout(w.dims[0] * w.dims[1], w.quant_flags & plan::kQuantDoubleQuant);
    if (!l.double_quant) return {base + l.codes_off, base + l.absmax_off, 0, 0, 0};
    return {base + l.codes_off, base + l.absmax_off, base + l.absmax2_off, base + l.offset_off,
            base + l.code2_off};
}

int64_t ld_of(const plan::Plan& p, int32_t idx) {
    return idx >= 0 && p.tensor(idx).ndim == 2 ? p.tensor(idx).dims[1] : 0;
}
// Kernel dtype argument (G4_DT_F32 / G4_DT_BF16) of a weight or KV cache.
int dt_code(const plan::Plan& p, int32_t t) {
    return t >= 0 && p.tensor(t).dtype == (uint8_t)DType::BF16 ? 1 : 0;
}

// Whether a decode row of attention op `op` (cache dtype kvdt) runs g4_attn_decode: one block per (kv
// head, split) for all heads of the group; with kernels specialised for a group size (the plan's
// cuda.attn_hpg), only layers of that size.
bool decode_attention_fits(const plan::Plan& p, const PlanOp& op, int kvdt) {
    return cuda_rt::decode_attention_fits(op.ip[0], op.ip[1], op.ip[2], op.ip[6], kvdt != 0,
                                          p.cuda_attn_hpg());
}

// A decode row of attention op `at` (decode_attention_fits): g4_attn_decode[_bf16], one block per (kv
// head, split) for all heads of the group, then the merge into at's output. post: QkvAttn, q is the raw
// projection and g4_attn_decode_post[_bf16] does the post-projection first.
CUresult launch_decode_attention(SessionState* st, const plan::Plan& p, const PlanOp& at, CUdeviceptr step,
                                 CUdeviceptr q, const AttnPostH* post) {
    const Kernels& K = st->cur->g->k;
    CUdeviceptr kc = addr(st, p, at.in[1], at.in_col[1]), vc = addr(st, p, at.in[2], at.in_col[2]);
    CUdeviceptr y = addr(st, p, at.out[0], at.out_col[0]), part = st->cur->part;
    int heads = at.ip[0], kvh = at.ip[1], dim = at.ip[2], slots = at.ip[3], window = at.ip[4], dsp = at.ip[6],
        kvdt     = dt_code(p, at.in[1]);
    float scale  = at.fp[0];
    long ldy     = ld_of(p, at.out[0]);
    AttnPostH pa = post ? *post : AttnPostH{};
    void* args[] = {&step,  &q,      &kc,    &vc,  &heads, &kvh,  &dim,
                    &slots, &window, &scale, &dsp, &part,  &kvdt, &pa}; // pa: post only
    CUfunction f = post ? (kvdt ? K.attn_decode_post_bf16 : K.attn_decode_post)
                        : (kvdt ? K.attn_decode_bf16 : K.attn_decode);
    if (dim == 256 || dim == 512) // the same kernel with the head dim compiled in, where the module has it
        if (CUfunction fd = K.attn_dim[dim == 512][(post ? 2 : 0) + (kvdt ? 1 : 0)]) f = fd;
    CUresult r = launch(st, f, (unsigned)kvh, (unsigned)dsp, 256, args);
    if (r != 0 || st->merge_in_next) return r; // merge_in_next: the AttnO launch merges
    void* margs[] = {&step, &part, &heads, &dim, &dsp, &y, &ldy, &window};
    return launch(st, K.attn_merge, (unsigned)heads, (unsigned)(dim + 63) / 64, merge_threads(true), margs);
}

// Launches op i for a step of `rows` rows (`out_rows` logits rows); sets *launched = false when the
// op has no rows in this step.
g4_status launch_op(g4_session* s, size_t i, int rows, int out_rows, std::string* err) {
    SessionState* st    = s->cuda.get();
    const plan::Plan& p = s->engine->plan;
    Lane& ln            = *st->cur;
    const Kernels& K    = ln.g->k;
    const auto& info    = p.info();
    CUdeviceptr step    = ln.step;
    CUdeviceptr ids     = ln.act + p.tensor(info.ids_tensor).offset;
    const PlanOp& op    = p.op(i);
    RowMode rm          = (RowMode)op.row_mode;
    int n               = rm == RowMode::All ? rows : out_rows;
    if (n <= 0) return G4_OK;
    int mode        = op.row_mode;
    CUdeviceptr in0 = addr(st, p, op.in[0], op.in_col[0]), in1 = addr(st, p, op.in[1], op.in_col[1]);
    CUdeviceptr in2  = addr(st, p, op.in[2], op.in_col[2]);
    CUdeviceptr out0 = addr(st, p, op.out[0], op.out_col[0]), out1 = addr(st, p, op.out[1], op.out_col[1]);
    long ld0 = ld_of(p, op.in[0]), ld1 = ld_of(p, op.in[1]), ldo = ld_of(p, op.out[0]);
    CUresult r = 0;
    auto go    = [&](CUfunction f, unsigned gx, unsigned gy, unsigned bx, std::initializer_list<void*> args) {
        return launch(st, f, gx, gy, bx, const_cast<void**>(args.begin()));
    };
    switch ((OpCode)op.code) {
    case OpCode::Embed: {
        const PlanTensor& tab = p.tensor(op.in[1]);
        int dt                = tab.dtype == (uint8_t)DType::BF16 ? 1 : 0;
        long cols             = tab.dims[1];
        float sc              = op.fp[0];
        r                     = go(K.embed, n, (unsigned)((cols + 2047) / 2048), 256,
                                   {&step, &ids, &in1, &dt, &cols, &sc, &out0, &ldo});
        break;
    }
    case OpCode::Matmul: {
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
        int tiled_rows     = 0;
        if (tiled_w && n > 8 && op.ip[6] == (int32_t)plan::MatmulVariant::Cublas && ln.blas_h)
            tiled_rows = N;
        else if (tiled_w) {
            const nf4::Layout lo = nf4::layout((int64_t)N * Kd, q.absmax2 != 0);
            CUdeviceptr codes    = ln.wscratch + cuda_ws::align256((uint64_t)N * Kd * 2),
                        am       = codes + lo.absmax_off;
            int dq               = q.absmax2 != 0;
            r                    = go(K.nf4_untile32, (unsigned)ceil_div((long)N * Kd / 32, 256), 1, 256,
                                      {&q.codes, &q.absmax, &dq, &N, &Kd, &codes, &am});
            if (r != 0) break;
            q.codes = codes, q.absmax = am;
        }
        if (n > 8 && op.ip[6] == (int32_t)plan::MatmulVariant::Cublas && ln.blas_h) {
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
                int bs = st->blas->gemm_ex(ln.blas_h, cublas::kOpT, cublas::kOpN, N, n, Kd, &one,
                                           (const void*)wb, cublas::kR16BF, Kd, (const void*)ln.xscratch,
                                           cublas::kR16BF, Kd, &zero, (void*)out0, cublas::kR32F, (int)ldo,
                                           cublas::kCompute32F, cublas::kGemmDefault);
                if (bs != 0) {
                    *err = "cuBLAS error " + std::to_string(bs) + " in op '" + p.str(op.name) + "'";
                    return G4_ERR_INTERNAL;
                }
            }
            if (r == 0 && in2)
                r = go(K.add_bias, n, (unsigned)ceil_div(N, 256), 256, {&step, &out0, &ldo, &in2, &N});
            break;
        }
        const bool gemv = n == 1 && op.ip[5] == (int32_t)plan::MatmulVariant::Gemv4;
        const bool tc   = !gemv && n > 8 &&
                        (op.ip[6] == (int32_t)plan::MatmulVariant::TensorCore ||
                         op.ip[6] == (int32_t)plan::MatmulVariant::Cublas);
        const bool tiled = !gemv && n > 8 && (tc || op.ip[6] == (int32_t)plan::MatmulVariant::Tiled64);
        unsigned gx      = gemv    ? (unsigned)ceil_div(N, 32)
                           : tiled ? (unsigned)ceil_div(N, 64)
                                   : (unsigned)ceil_div(N, 8);
        unsigned gy      = tiled ? (unsigned)ceil_div(n, 64) : 1;
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
        break;
    }
    case OpCode::RmsNorm: {
        int dim   = op.ip[1];
        int wdt   = op.in[1] >= 0 && p.tensor(op.in[1]).dtype == (uint8_t)DType::BF16 ? 1 : 0;
        float eps = op.fp[0];
        r         = go(K.rms, n, (unsigned)(op.ip[0] / dim), 256,
                       {&step, &mode, &in0, &ld0, &in1, &wdt, &out0, &ldo, &dim, &eps});
        break;
    }
    case OpCode::Add:
    case OpCode::GeluMul:
    case OpCode::Scale:
    case OpCode::Softcap: {
        int kind      = op.code == (uint16_t)OpCode::Add       ? 0
                        : op.code == (uint16_t)OpCode::GeluMul ? 1
                        : op.code == (uint16_t)OpCode::Scale   ? 2
                                                               : 3;
        int cols      = op.ip[0];
        float f       = op.fp[0];
        CUdeviceptr b = kind <= 1 ? in1 : 0, sc = kind == 2 ? in1 : 0;
        int sdt = kind == 2 && op.in[1] >= 0 && p.tensor(op.in[1]).dtype == (uint8_t)DType::BF16 ? 1 : 0;
        r       = go(K.elem, n, (unsigned)ceil_div(cols, 256), 256,
                     {&step, &mode, &kind, &in0, &ld0, &b, &ld1, &out0, &ldo, &cols, &f, &sc, &sdt});
        break;
    }
    case OpCode::Rope: {
        int dim = op.ip[1];
        r       = go(K.rope, n, (unsigned)op.ip[0], (unsigned)std::max(32, dim / 2),
                     {&step, &in0, &ld0, &in1, &dim});
        break;
    }
    case OpCode::KvStore: {
        int width = op.ip[0], slots = op.ip[1], kvdt = dt_code(p, op.out[0]);
        r = go(K.kv, n, 1, 256, {&step, &in0, &ld0, &in1, &ld1, &out0, &out1, &width, &slots, &kvdt});
        break;
    }
    case OpCode::Attention: {
        int heads = op.ip[0], kvh = op.ip[1], dim = op.ip[2], slots = op.ip[3], window = op.ip[4],
            kvdt         = dt_code(p, op.in[1]);
        float scale      = op.fp[0];
        int sp           = st->splits[i];
        int max_span     = window > 0 ? std::min(window, info.max_context) : info.max_context;
        CUdeviceptr part = ln.part, scores = ln.scores;
        if (n == 1 && decode_attention_fits(p, op, kvdt)) {
            r = launch_decode_attention(st, p, op, step, in0, nullptr);
            break;
        }
        if (st->merge_in_next) { // the compiler fuses the merge only where the decode kernel runs
            *err = "op " + std::string(p.str(op.name)) +
                   ": the plan merges this attention in the o projection's kernel, but its decode row "
                   "does not fit g4_attn_decode (recompile the plan with this g4)";
            return G4_ERR_UNSUPPORTED;
        }
        if (sp ==
            0) { // the compiler chose the tensor-core flash kernel (bf16 plans, dim a power of two 16..512)
            int di = 0;
            while (di < 6 && kFlashDims[di] != dim)
                ++di;
            if (di == 6) {
                *err = "op " + std::string(p.str(op.name)) + ": no flash attention kernel for head dim " +
                       std::to_string(dim);
                return G4_ERR_INTERNAL;
            }
            FlashLaunch fl = flash_launch(n, heads, kvh, dim);
            void* args[]   = {&step,  &in0,    &ld0,   &in1,  &in2, &heads, &kvh,
                              &slots, &window, &scale, &out0, &ldo, &kvdt};
            r              = launch(st, K.flash[di], fl.gx, fl.gy, fl.block, args, 1, fl.smem);
            break;
        }
        r       = go(K.attn_part, (unsigned)(n * heads), (unsigned)sp, 256,
                     {&step, &in0, &ld0, &in1, &in2, &heads, &kvh, &dim, &slots, &window, &scale, &sp, &part,
                      &scores, &max_span, &kvdt});
        int all = -1; // prefill partials: every split is read
        if (r == 0)
            r = go(K.attn_merge, (unsigned)(n * heads), (unsigned)(dim + 63) / 64, merge_threads(false),
                   {&step, &part, &heads, &dim, &sp, &out0, &ldo, &all});
        break;
    }
    default:
        *err = "internal: unknown op";
        return G4_ERR_INTERNAL;
    }
    if (r != 0) {
        *err = "CUDA error " + error_name(r) + " launching op '" + p.str(op.name) + "' (" +
               op_name((OpCode)op.code) + ")";
        return G4_ERR_INTERNAL;
    }
    return G4_OK;
}

// The arguments of Gemv launch record `l` on the current lane; returns the threads it launches.
long gemv_args(const SessionState* st, const plan::Plan& p, const CudaLaunch& l, GemvArgsH* out,
               bool* is_nf4) {
    GemvArgsH& a = *out;
    std::memset(&a, 0, sizeof a);
    const int nmat = l.ip[3], epi = l.ip[4], pairs = epi == 1 ? 1 : 0;
    bool nf4  = false;
    int n_out = 0, K_ = 0;
    for (int m = 0; m < nmat; ++m) {
        const PlanOp& op    = p.op(l.ip[m]);
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
    a.nmat = nmat, a.k = K_, a.epi = epi, a.cap = l.fp[0];
    a.out   = addr(st, p, l.t[1], 0);
    a.aux   = addr(st, p, l.t[0], l.ip[6]);
    *is_nf4 = nf4;
    return gemv_threads(n_out, l.ip[5], pairs);
}

// Launches record `li` of the decode schedule (one row).
g4_status launch_fused(g4_session* s, const CudaLaunch& l, std::string* err) {
    SessionState* st    = s->cuda.get();
    const plan::Plan& p = s->engine->plan;
    const Kernels& K    = st->cur->g->k;
    CUdeviceptr step    = st->cur->step;
    auto T              = [&](int j) { return addr(st, p, l.t[j], 0); };
    auto T2             = [&](const CudaLaunch* o, int j) { return addr(st, p, o->t[j], 0); };
    CUresult r          = 0;
    auto go             = [&](CUfunction f, unsigned gx, unsigned bx, std::initializer_list<void*> args,
                  unsigned smem = 0) {
        return launch(st, f, gx, 1, bx, const_cast<void**>(args.begin()), 1, smem);
    };
    switch ((LaunchKind)l.kind) {
    case LaunchKind::ResNorm: {
        // Folded: ip1 1, the Ple launch after runs it (g4_ple_res), the MLP before zeroes its t7; ip1 2, the
        // Mlp launch after runs it (its _r kernel), an earlier ResNorm zeroes its t7 (that one's ip2).
        if (l.ip[1] == 1 || l.ip[1] == 2) break;
        CUdeviceptr x = T(0), dd = T(1), pw = T(2), sc = T(3), xo = T(4), prew = T(5), xn = T(6), zero = T(7);
        int pwdt = dt_code(p, l.t[2]), sdt = dt_code(p, l.t[3]), prewdt = dt_code(p, l.t[5]), H = l.ip[0];
        float f = l.fp[1], eps = l.fp[0];
        CUdeviceptr dr    = st->cur->mlp_rep;
        int nrep          = st->rep_in;
        const unsigned nt = H <= 2048 ? 512 : 1024;
        CUdeviceptr zero2 =
            l.ip[2] > 0 ? addr(st, p, l.ip[2] - 1, 0) : 0; // the reader checked: not after replicas
        r = nrep ? go(K.resnorm_rep, 1, nt,
                      {&x, &dd, &pw, &pwdt, &sc, &sdt, &f, &xo, &prew, &prewdt, &xn, &H, &eps, &zero, &dr,
                       &nrep})
            : zero2
                ? go(K.resnorm_z2, 1, nt,
                     {&x, &dd, &pw, &pwdt, &sc, &sdt, &f, &xo, &prew, &prewdt, &xn, &H, &eps, &zero, &zero2})
                : go(K.resnorm, 1, nt,
                     {&x, &dd, &pw, &pwdt, &sc, &sdt, &f, &xo, &prew, &prewdt, &xn, &H, &eps, &zero});
        break;
    }
    case LaunchKind::PleIn: {
        CUdeviceptr ctx = T(0), w = T(1), tok = T(2), out = T(3);
        int wdt = dt_code(p, l.t[1]), P = l.ip[1];
        float s1 = p.op(l.op).fp[0], eps = p.op(l.op + 1).fp[0], s2 = p.op(l.op + 3).fp[0];
        r = go(K.ple_in, (unsigned)(l.ip[0] / P), (unsigned)((P + 31) / 32 * 32),
               {&ctx, &w, &wdt, &tok, &out, &P, &s1, &eps, &s2});
        break;
    }
    case LaunchKind::QkvPost:
    case LaunchKind::QkvAttn: {
        const bool attn = l.kind == (uint16_t)LaunchKind::QkvAttn;
        const int post  = attn ? l.ip[4] : l.count; // QkvPost ops: 2 (q) or 6 (q, k, v and the store)
        CUdeviceptr q = T(0), qw = T(1), invf = T(2), k = T(3), kw = T(4), v = T(5), kc = T(6), vc = T(7);
        int wdt = dt_code(p, l.t[1]), heads = l.ip[0], kvh = post == 6 ? l.ip[1] : 1, dim = l.ip[2],
            slots       = std::max(1, l.ip[3]);
        int kvdt        = dt_code(p, l.t[6]);
        float eps       = l.fp[0];
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
        bool nf4        = false;
        long threads    = gemv_args(st, p, l, &a, &nf4);
        const int pairs = l.ip[4] == 1 ? 1 : 0;
        r = go(K.gemv[nf4][gemv_lanes_index(l.ip[5])][pairs], (unsigned)ceil_div(threads, 128), 128, {&a},
               gemv_smem(nf4, st->cur->g->sm, a.k));
        break;
    }
    case LaunchKind::Mlp: {
        MlpArgsH a;
        std::memset(&a, 0, sizeof a);
        CudaLaunch gu = l; // the gate/up pair as a Gemv record: its weights and input
        gu.ip[3] = 2, gu.ip[4] = 1, gu.ip[5] = 8, gu.t[0] = gu.t[1] = -1;
        bool nf4 = false;
        gemv_args(st, p, gu, &a.gu, &nf4);
        const PlanOp& dn    = p.op(l.ip[3]);
        const PlanTensor& w = p.tensor(dn.in[1]);
        const Nf4Ptrs q     = nf4_ptrs(addr(st, p, dn.in[1], 0), w);
        a.codes = q.codes, a.absmax = q.absmax, a.absmax2 = q.absmax2, a.offset = q.offset, a.code2 = q.code2;
        a.bias = addr(st, p, dn.in[2], dn.in_col[2]);
        a.y    = addr(st, p, dn.out[0], dn.out_col[0]);
        a.H = (int)w.dims[0], a.I = (int)w.dims[1];
        if (st->rep_out) a.yr = st->cur->mlp_rep, a.nrep = st->rep_out;
        // The compiler fuses only gate, up and down of one scale format (cuda_schedule.cpp mlp): the down's
        // picks the kernel. ip7 1: the packed-f16 kernels (f32 scales only: the reader checks).
        const int kf = l.ip[7] ? 8 + (l.ip[5] == 256 ? 1 : 0) + (st->rep_out ? 2 : 0)
                               : (l.ip[5] == 256 ? 1 : 0) + (q.absmax2 ? 2 : 0) + (st->rep_out ? 4 : 0);
        // Before a folded ResNorm (the reader checked: 256 threads, one output): the _z kernel zeroes the
        // Ple's output.
        if (st->fold_next) a.zero = addr(st, p, st->fold_next->t[7], 0);
        CUfunction f = st->fold_next ? K.mlp_z[l.ip[7] ? 2 : q.absmax2 ? 1 : 0] : K.mlp[kf];
        // After a ResNorm folded in (the reader checked: packed f16, mlp_res_fits, no scale): the _r kernel
        // runs it.
        if (const CudaLaunch* rn = st->mlp_res) {
            a.rx = T2(rn, 0), a.rd = T2(rn, 1), a.rpw = T2(rn, 2), a.xo = T2(rn, 4), a.rprew = T2(rn, 5);
            a.rpwdt = dt_code(p, rn->t[2]), a.rprewdt = dt_code(p, rn->t[5]), a.eps = rn->fp[0];
            f = K.mlp_r[st->fold_next ? 4 : (l.ip[5] == 256 ? 1 : 0) + (st->rep_out ? 2 : 0)];
        }
        r = go(f, (unsigned)(a.I / 32), (unsigned)l.ip[5], {&a}, gemv_smem(true, st->cur->g->sm, a.H));
        break;
    }
    case LaunchKind::AttnO: {
        AttnOArgsH a;
        std::memset(&a, 0, sizeof a);
        const PlanOp &o = p.op(l.op), &at = p.op(l.ip[1]);
        const PlanTensor& w = p.tensor(o.in[1]);
        const Nf4Ptrs q     = nf4_ptrs(addr(st, p, o.in[1], 0), w);
        a.step = step, a.part = st->cur->part;
        a.codes = q.codes, a.absmax = q.absmax, a.absmax2 = q.absmax2, a.offset = q.offset, a.code2 = q.code2;
        a.bias = addr(st, p, o.in[2], o.in_col[2]);
        a.y    = addr(st, p, o.out[0], o.out_col[0]);
        a.H = (int)w.dims[0], a.K = (int)w.dims[1], a.dim = at.ip[2], a.splits = at.ip[6],
        a.window = at.ip[4];
        r = go(K.attn_o[slice_row_groups(a.H) - 1], (unsigned)(a.K / 32), kSliceThreads, {&a}, kGemvWideSmem);
        break;
    }
    case LaunchKind::Ple: {
        PleArgsH a;
        std::memset(&a, 0, sizeof a);
        const PlanOp &g = p.op(l.op), &gm = p.op(l.op + 1), &pr = p.op(l.op + 2);
        a.x = addr(st, p, g.in[0], g.in_col[0]), a.wg = addr(st, p, g.in[1], 0),
        a.bg  = addr(st, p, g.in[2], g.in_col[2]);
        a.aux = addr(st, p, gm.in[1], gm.in_col[1]);
        a.wp = addr(st, p, pr.in[1], 0), a.bp = addr(st, p, pr.in[2], pr.in_col[2]),
        a.y = addr(st, p, pr.out[0], pr.out_col[0]);
        a.H = (int)p.tensor(pr.in[1]).dims[0], a.P = (int)p.tensor(pr.in[1]).dims[1];
        if (const CudaLaunch* rn =
                st->fold_prev) { // the ResNorm before, folded in (the reader checked its fields)
            a.rx = T2(rn, 0), a.rd = T2(rn, 1), a.rpw = T2(rn, 2), a.xo = T2(rn, 4);
            a.rpwdt = dt_code(p, rn->t[2]), a.eps = rn->fp[0];
        }
        r = go((st->fold_prev ? K.ple_res : K.ple)[slice_row_groups(a.H) - 1], (unsigned)(a.P / 8),
               kSliceThreads, {&a});
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

g4_status profile_point(g4_session* s, int cat, bool decode, const char* what, std::string* err) {
    SessionState* st = s->cuda.get();
    CUresult sr      = st->e->d->cuStreamSynchronize(st->cur->stream);
    if (sr != 0) {
        *err = "CUDA error " + error_name(sr) + " in '" + what + "'";
        return G4_ERR_INTERNAL;
    }
    auto now = std::chrono::steady_clock::now();
    st->prof_ms[cat][decode ? 0 : 1] += std::chrono::duration<double, std::milli>(now - st->prof_t).count();
    st->prof_n[cat][decode ? 0 : 1]++;
    st->prof_t = now;
    return G4_OK;
}

// Host function (stream order): runs one run of CPU-placed ops for the step in host_step.
void host_run(void* u) {
    auto* r          = (SessionState::HostRun*)u;
    SessionState* st = r->s->cuda.get();
    if (st->host_failed.load()) return;
    const SessionState::Step step = *st->host_step;
    std::string err;
    if (rt::run_ops(r->s, r->first, r->end, step.rows, step.pos0, step.out_rows, &err) != G4_OK) {
        st->host_error =
            "layer " + std::to_string(r->s->engine->plan.op(r->first).layer) + " on the CPU: " + err;
        st->host_failed.store(true);
    }
}

// Op i of a cross-device plan, if it is not a GPU kernel: a copy step (a 2-D copy of the step's
// rows between two GPUs' arenas or a GPU's and the pinned host arena, on the stream of the GPU that
// wrote them, or of the GPU that reads them when they come from the host) or the first op of a run of
// CPU ops (one host function for the run, on the current stream). A GPU op makes its GPU's lane
// current. *handled = false for GPU ops.
g4_status cross_device_op(g4_session* s, size_t i, int rows, bool* handled, std::string* err) {
    SessionState* st    = s->cuda.get();
    const plan::Plan& p = s->engine->plan;
    const PlanOp& op    = p.op(i);
    *handled            = false;
    if (!p.hybrid()) return G4_OK;
    const Driver* d = st->e->d;
    if (op.code == (uint16_t)OpCode::Copy) {
        const int dst = op.ip[1], src = op.ip[2];
        g4_status g = use_lane(st, p.gpu_slot(src >= 0 ? src : dst), err);
        if (g != G4_OK) return g;
        const PlanTensor& t = p.tensor(op.in[0]);
        const uint64_t off  = t.offset + (uint64_t)op.in_col[0] * 4;
        Memcpy2D c;
        std::memset(&c, 0, sizeof c);
        const bool peer = dst >= 0 && src >= 0;
        c.src_type      = src < 0 ? kMemHost : peer ? kMemUnified : kMemDevice;
        c.dst_type      = dst < 0 ? kMemHost : peer ? kMemUnified : kMemDevice;
        c.src_host      = (const uint8_t*)st->host_act + off;
        c.dst_host      = (uint8_t*)st->host_act + off;
        if (src >= 0) c.src_device = st->lanes[p.gpu_slot(src)].act + off;
        if (dst >= 0) c.dst_device = st->lanes[p.gpu_slot(dst)].act + off;
        c.src_pitch = c.dst_pitch = (size_t)t.dims[1] * 4;
        c.width_bytes             = (size_t)op.ip[0] * 4;
        c.height                  = (size_t)rows;
        CU_TRY(d->cuMemcpy2DAsync(&c, st->cur->stream), "copy step '" + std::string(p.str(op.name)) + "'");
        st->after_node = true;
        *handled       = true;
    } else if (p.op_on_cpu(i)) {
        if (st->run_of[i] >= 0)
            CU_TRY(d->cuLaunchHostFunc(st->cur->stream, host_run, &st->runs[st->run_of[i]]),
                   "enqueueing the CPU layers at '" + std::string(p.str(op.name)) + "'");
        st->after_node = true;
        *handled       = true;
    } else {
        return use_lane(st, st->lane_of[i], err);
    }
    return G4_OK;
}

// Launches a whole step: the fused schedule for decode steps of plans that have one, else op by op.
g4_status launch_step(g4_session* s, int rows, int out_rows, std::string* err) {
    SessionState* st    = s->cuda.get();
    const plan::Plan& p = s->engine->plan;
    const bool media    = s->media && s->media->step_n > 0; // image/audio rows: op by op, never the graph
    const bool decode   = rows == 1 && out_rows == 1 && !media;
    const bool events   = decode && !st->ev.empty(); // profiling the captured decode graph
    st->merge_in_next =
        false; // set per launch below; cleared here for the op-by-op path and after a failed step
    st->rep_out = st->rep_in = 0;
    st->fold_prev = st->fold_next = st->mlp_res = nullptr;
    if (decode && p.n_launches()) {
        if (events) st->e->d->cuEventRecordWithFlags(st->ev[0], st->cur->stream, 1);
        for (size_t li = 0; li < p.n_launches(); ++li) {
            const CudaLaunch& l = p.launch(li);
            if (st->screen_now && (int)li == st->e->lm_launch) { // the int8 pass; g4_lm_exact below
                GemvArgsH a;
                bool nf4 = false;
                gemv_args(st, p, l, &a, &nf4);
                CUdeviceptr q = st->e->lm_q, sc = q + st->e->lm_scale_at, bd = sc + (uint64_t)a.m[0].n * 4;
                CUresult r =
                    launch(st, st->cur->g->k.lm_screen, st->e->lm_blocks, 1, 256,
                           const_cast<void**>(std::initializer_list<void*>{
                               &a.x, &q, &sc, &bd, &a.m[0].bias, &a.m[0].n, &a.k, &st->lm_lohi, &st->lm_tmax}
                                                  .begin()));
                if (r != 0) {
                    *err = "CUDA error " + error_name(r) + " launching the LM head's screening pass";
                    return G4_ERR_INTERNAL;
                }
                continue;
            }
            st->merge_in_next =
                li + 1 < p.n_launches() && p.launch(li + 1).kind == (uint16_t)LaunchKind::AttnO;
            // Output replicas (the plan's ip6 > 1, the reader checked the ResNorm after): the MLP adds into
            // them and that ResNorm sums them and zeroes them again, so they are zero outside the pair. A
            // folded ResNorm launches nothing: with ip1 = 1 the Ple launch after it runs it and the MLP
            // before it zeroes the Ple's output; with ip1 = 2 the Mlp launch after it runs it.
            auto folded = [&](size_t k, int into) -> const CudaLaunch* {
                const bool f = k < p.n_launches() && p.launch(k).kind == (uint16_t)LaunchKind::ResNorm &&
                               p.launch(k).ip[1] == into;
                return f ? &p.launch(k) : nullptr;
            };
            const bool mlp = l.kind == (uint16_t)LaunchKind::Mlp;
            st->fold_prev  = li > 0 && l.kind == (uint16_t)LaunchKind::Ple ? folded(li - 1, 1) : nullptr;
            st->fold_next  = mlp ? folded(li + 1, 1) : nullptr;
            st->mlp_res    = li > 0 && mlp ? folded(li - 1, 2) : nullptr;
            const int reps = cuda_ws::mlp_replicas(l);
            st->rep_in     = st->rep_out;
            st->rep_out    = reps > 1 ? reps - 1 : 0;
            bool handled   = false;
            g4_status cg   = l.kind == (uint16_t)LaunchKind::Op
                                 ? cross_device_op(s, (size_t)l.op, rows, &handled, err)
                             : p.hybrid() ? use_lane(st, st->lane_of[l.op], err)
                                          : G4_OK;
            if (cg != G4_OK) return cg;
            g4_status g = handled ? G4_OK
                          : l.kind == (uint16_t)LaunchKind::Op
                              ? launch_op(s, (size_t)l.op, rows, out_rows, err)
                              : launch_fused(s, l, err);
            if (g != G4_OK) return g;
            if (events) {
                st->e->d->cuEventRecordWithFlags(st->ev[li + 1], st->cur->stream, 1);
            } else if (st->profile) {
                int cat = l.kind == (uint16_t)LaunchKind::Op ? p.op(l.op).code : 16 + l.kind;
                g       = profile_point(s, cat, true, p.str(p.op(l.op).name), err);
                if (g != G4_OK) return g;
            }
        }
        // Greedy token on the device: the host copies 4 bytes instead of the logits row.
        g4_status g = use_lane(st, 0, err);
        if (g != G4_OK) return g;
        const Lane& l0     = st->lanes[0];
        CUdeviceptr logits = l0.act + p.tensor(p.info().logits_tensor).offset;
        CUdeviceptr ids    = l0.act + p.tensor(p.info().ids_tensor).offset;
        int vocab          = p.info().vocab_size;
        int limit          = p.info().embed_vocab_limit;
        CUresult r         = 0;
        if (st->screen_now) { // the rows that can hold the greedy token, exactly, and their argmax
            const CudaLaunch& lh = p.launch(st->e->lm_launch);
            GemvArgsH a;
            bool nf4 = false;
            gemv_args(st, p, lh, &a, &nf4);
            r = launch(st, l0.g->k.lm_exact[gemv_lanes_index(lh.ip[5])], kArgmaxBlocks, 1, 128,
                       const_cast<void**>(std::initializer_list<void*>{
                           &a, &st->lm_lohi, &st->lm_tmax, &st->tok, const_cast<CUdeviceptr*>(&l0.step), &ids,
                           &st->host_tok_dev, &limit}
                                              .begin()));
        } else {
            r = launch(st, l0.g->k.argmax, kArgmaxBlocks, 1, 1024,
                       const_cast<void**>(std::initializer_list<void*>{&logits, &vocab, &st->tok,
                                                                       const_cast<CUdeviceptr*>(&l0.step),
                                                                       &ids, &st->host_tok_dev, &limit}
                                              .begin()));
        }
        if (r != 0) {
            *err = "CUDA error " + error_name(r) + " launching the device argmax";
            return G4_ERR_INTERNAL;
        }
        if (events) st->e->d->cuEventRecordWithFlags(st->ev[p.n_launches() + 1], st->cur->stream, 1);
        return G4_OK;
    }
    for (size_t i = 0; i < p.n_ops(); ++i) {
        bool handled = false;
        g4_status g  = cross_device_op(s, i, rows, &handled, err);
        if (g == G4_OK && !handled) g = launch_op(s, i, rows, out_rows, err);
        if (g != G4_OK) return g;
        if (media && (int32_t)i == s->embed_op) { // placeholders' embeddings: the tower's rows, unscaled
            const PlanOp& op      = p.op(i);
            const PlanTensor& out = p.tensor(op.out[0]);
            const Driver* d       = st->e->d;
            const int64_t H       = p.tensor(op.in[1]).dims[1];
            const bool dense      = op.out_col[0] == 0 && out.dims[1] == H; // rows of inp_embd are contiguous
            const int32_t* row    = s->media->step_row;
            const float* const* src = s->media->step_src;
            for (int32_t k = 0, e; k < s->media->step_n; k = e) { // one copy per run of consecutive rows
                for (e = k + 1;
                     dense && e < s->media->step_n && row[e] == row[e - 1] + 1 && src[e] == src[e - 1] + H;)
                    ++e;
                CUdeviceptr dst =
                    st->cur->act + out.offset + ((uint64_t)row[k] * out.dims[1] + op.out_col[0]) * 4;
                CU_TRY(d->cuMemcpyHtoDAsync(dst, src[k], (size_t)(e - k) * H * 4, st->cur->stream),
                       "copying image/audio embeddings");
            }
        }
        if (st->profile) {
            g = profile_point(s, p.op(i).code, rows == 1, p.str(p.op(i).name), err);
            if (g != G4_OK) return g;
        }
    }
    return use_lane(st, 0, err); // the plan's GPU's stream follows all of the step's work
}

// Profiling: GPU time between the events around each launch of one replay of the decode graph.
void collect_events(SessionState* st) {
    const Driver* d = st->e->d;
    if (d->cuEventSynchronize(st->ev.back()) != 0) return;
    for (size_t i = 0; i + 1 < st->ev.size(); ++i) {
        float ms = 0;
        if (d->cuEventElapsedTime(&ms, st->ev[i], st->ev[i + 1]) != 0) return;
        auto it = std::find_if(st->ev_ms.begin(), st->ev_ms.end(),
                               [&](const auto& x) { return x.first == st->ev_label[i]; });
        if (it == st->ev_ms.end())
            st->ev_ms.emplace_back(st->ev_label[i], ms);
        else
            it->second += ms;
        st->ev_total_ms += ms;
    }
    st->ev_steps++;
}

} // namespace

namespace {

// Waits for a step run ahead that will not be claimed; its logits stay in the device row
// (logits_ahead). The other entry points call this before they use the stream or the step buffers.
g4_status ahead_end(SessionState* st, std::string* err) {
    if (st->ahead_pos < 0) return G4_OK;
    st->ahead_pos   = -1;
    const Driver* d = st->e->d;
    CU_TRY(d->cuCtxSetCurrent(st->lanes[0].g->ctx), "cuCtxSetCurrent");
    CUresult r = d->cuStreamSynchronize(st->lanes[0].stream);
    if (r != 0) {
        *err = "CUDA error " + error_name(r) + " while running a decode step";
        return G4_ERR_INTERNAL;
    }
    return G4_OK;
}

// The caller reads the last step's logits (the host is not feeding greedy tokens). If the device
// logits row is a step run ahead: run the session's last step (a decode step, its token in the
// history) again so the row is its own, and stop running ahead in this session.
g4_status logits_back(g4_session* s, std::string* err) {
    SessionState* st = s->cuda.get();
    st->ahead_greedy = false;
    g4_status g      = ahead_end(st, err);
    const int32_t p0 = s->position - 1;
    // The row holds a later step's logits, or this step's screened ones (only the rows that could be its
    // greedy token): run this step again, whole.
    if (g != G4_OK || !(st->logits_ahead || (st->screened_pos >= 0 && st->screened_pos == p0))) return g;
    st->ahead_off  = true;
    s->ids[0]      = s->history[p0];
    bool on_device = false;
    return run_step(s, 1, p0, 1, false, &on_device, err);
}

} // namespace

g4_status fetch_logits(g4_session* s, std::string* err) {
    SessionState* st    = s->cuda.get();
    const plan::Plan& p = s->engine->plan;
    const Driver* d     = st->e->d;
    const Lane& l0      = st->lanes[0];
    if (g4_status g = logits_back(s, err); g != G4_OK) return g;
    CU_TRY(d->cuCtxSetCurrent(l0.g->ctx), "cuCtxSetCurrent");
    CU_TRY(d->cuMemcpyDtoHAsync(st->host_logits, l0.act + p.tensor(p.info().logits_tensor).offset,
                                (size_t)p.info().vocab_size * 4, l0.stream),
           "copying logits");
    CU_TRY(d->cuStreamSynchronize(l0.stream), "copying logits");
    return G4_OK;
}

int32_t device_argmax(const g4_session* s) {
    s->cuda->ahead_greedy = true;
    return s->cuda->host_tok[(s->position - 1) & 1];
}

g4_status device_topk(g4_session* s, int32_t k, float temperature, float penalty, const int32_t* tokens,
                      int32_t n_tokens, const float** values, const int32_t** indices, RowNorm* norm,
                      std::string* err) {
    SessionState* st    = s->cuda.get();
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

g4_status run_step(g4_session* s, int32_t rows, int32_t pos0, int32_t out_rows, bool ahead,
                   bool* logits_on_device, std::string* err) {
    SessionState* st    = s->cuda.get();
    const plan::Plan& p = s->engine->plan;
    const Driver* d     = st->e->d;
    const auto& info    = p.info();
    Lane& l0            = st->lanes[0];
    const bool media    = s->media && s->media->step_n > 0;
    bool decode         = rows == 1 && out_rows == 1 && !media;
    // A step run ahead at this position, fed the token the host now feeds, is this step.
    bool claimed = false;
    if (st->ahead_pos >= 0) {
        claimed = decode && st->exec && pos0 == st->ahead_pos && s->ids[0] == st->host_tok[(pos0 - 1) & 1];
        if (claimed)
            st->ahead_pos = -1, s->stats.decode_ahead++, s->stats.lm_screened += st->screened_pos == pos0;
        else if (g4_status g = ahead_end(st, err); g != G4_OK)
            return g;
    }
    if (!claimed) {
        *st->host_step = {rows, pos0, out_rows, 0};
        // The other GPUs' step buffers first; the plan's GPU's stream waits for them, so the step (and a
        // decode graph launched on that stream) starts after every GPU has its copy.
        for (size_t g = 1; g < st->lanes.size(); ++g) {
            Lane& ln = st->lanes[g];
            CU_TRY(d->cuCtxSetCurrent(ln.g->ctx), "cuCtxSetCurrent");
            CU_TRY(d->cuMemcpyHtoDAsync(ln.step, st->host_step, sizeof(SessionState::Step), ln.stream),
                   "copying the step");
            CU_TRY(d->cuEventRecord(ln.done, ln.stream), "recording a cross-GPU event");
            CU_TRY(d->cuStreamWaitEvent(l0.stream, ln.done, 0), "waiting for another GPU's step copy");
        }
    }
    st->cur = &l0;
    CU_TRY(d->cuCtxSetCurrent(l0.g->ctx), "cuCtxSetCurrent");
    if (!claimed) {
        CU_TRY(d->cuMemcpyHtoDAsync(l0.step, st->host_step, sizeof(SessionState::Step), l0.stream),
               "copying the step");
        CU_TRY(d->cuMemcpyHtoDAsync(l0.act + p.tensor(info.ids_tensor).offset, st->host_ids, (size_t)rows * 4,
                                    l0.stream),
               "copying token ids");
    }
    if (st->profile && !(decode && !st->ev.empty())) {
        CU_TRY(d->cuStreamSynchronize(l0.stream), "sync");
        st->prof_t = std::chrono::steady_clock::now();
        decode     = false;
    }
    for (int attempt = 0; attempt < 2 && decode && !st->exec && st->graph_error.empty(); ++attempt) {
        // Capture the decode program once; later tokens replay it. Programmatic dependent launch
        // where the GPU has it; a driver that cannot instantiate such a graph gets a plain one.
        st->pdl_now = st->pdl_ok;
        CUresult r  = d->cuStreamBeginCapture(l0.stream, 2 /* relaxed */);
        if (r == 0) {
            g4_status ls = launch_step(s, 1, 1, err);
            st->cur      = &l0;
            CU_TRY(d->cuCtxSetCurrent(l0.g->ctx), "cuCtxSetCurrent");
            CUresult re = d->cuStreamEndCapture(l0.stream, &st->graph);
            st->pdl_now = false;
            if (ls != G4_OK) { // not capturable (an eager step reports a real launch error again)
                if (st->graph) d->cuGraphDestroy(st->graph);
                st->graph       = nullptr;
                st->graph_error = *err;
                err->clear();
                break;
            }
            if (re == 0) re = d->cuGraphInstantiateWithFlags(&st->exec, st->graph, 0);
            if (re != 0 && st->pdl_ok) {
                if (st->graph) d->cuGraphDestroy(st->graph);
                st->graph  = nullptr;
                st->pdl_ok = false;
                continue;
            }
            if (re != 0) st->graph_error = error_name(re);
        } else {
            st->pdl_now     = false;
            st->graph_error = error_name(r);
        }
    }
    // The screened decode graph (steps run ahead of greedy tokens), captured the same way once the plain one
    // exists; if it cannot be, steps run ahead replay the plain graph.
    if (decode && st->exec && !st->screen_tried && st->ahead_ok && st->e->lm_launch >= 0) {
        st->screen_tried = true;
        st->pdl_now = st->pdl_ok, st->screen_now = true;
        CUresult r   = d->cuStreamBeginCapture(l0.stream, 2 /* relaxed */);
        g4_status ls = G4_OK;
        if (r == 0) {
            ls          = launch_step(s, 1, 1, err);
            st->cur     = &l0;
            r           = d->cuCtxSetCurrent(l0.g->ctx);
            CUresult re = d->cuStreamEndCapture(l0.stream, &st->graph_screen);
            if (r == 0) r = re;
        }
        st->pdl_now = false, st->screen_now = false;
        if (ls != G4_OK) err->clear();
        if (r == 0 && ls == G4_OK && st->graph_screen &&
            d->cuGraphInstantiateWithFlags(&st->exec_screen, st->graph_screen, 0) != 0)
            st->exec_screen = nullptr;
    }
    if (decode && !st->exec && !st->graph_error.empty() && !st->graph_noted) {
        std::fprintf(
            stderr,
            "g4: note: decode steps run without a CUDA graph (capturing one failed: %s); tokens are slower\n",
            st->graph_error.c_str());
        st->graph_noted = true;
    }
    const bool replay = decode && st->exec;
    const bool waits  = replay && st->ahead_ok; // waits on tok_ev, not the whole stream
    if (!claimed) st->screened_pos = -1;        // this step writes the whole logits row
    if (replay && !claimed) {
        CU_TRY(d->cuGraphLaunch(st->exec, l0.stream), "replaying the decode graph");
        if (waits)
            CU_TRY(d->cuEventRecord(st->tok_ev[pos0 & 1], l0.stream), "recording the decode step's event");
    } else if (!replay) {
        g4_status ls = launch_step(s, rows, out_rows, err);
        if (ls != G4_OK) return ls;
    }
    // Run the next step ahead when the host feeds greedy tokens: the graph's argmax has fed it its
    // token and position, and the host reads this step's token while it runs.
    const bool next = ahead && waits && st->ahead_greedy && !st->ahead_off && pos0 + 1 < info.max_context;
    if (next) {
        CU_TRY(d->cuGraphLaunch(st->exec_screen ? st->exec_screen : st->exec, l0.stream),
               "replaying the decode graph ahead");
        CU_TRY(d->cuEventRecord(st->tok_ev[(pos0 + 1) & 1], l0.stream), "recording the decode step's event");
        st->ahead_pos    = pos0 + 1;
        st->screened_pos = st->exec_screen ? pos0 + 1 : -1;
    }
    st->logits_ahead     = next;
    const bool on_device = rows == 1 && out_rows == 1 && p.n_launches() && !media;
    *logits_on_device    = on_device;
    if (!on_device && out_rows > 0)
        CU_TRY(d->cuMemcpyDtoHAsync(st->host_logits, l0.act + p.tensor(info.logits_tensor).offset,
                                    (size_t)out_rows * info.vocab_size * 4, l0.stream),
               "copying logits");
    CUresult r = waits ? d->cuEventSynchronize(st->tok_ev[pos0 & 1]) : d->cuStreamSynchronize(l0.stream);
    if (r != 0) {
        *err =
            "CUDA error " + error_name(r) + " while running a " + (decode ? "decode" : "prefill") + " step";
        return G4_ERR_INTERNAL;
    }
    if (st->host_failed.load()) {
        *err = st->host_error;
        st->host_failed.store(false);
        return st->host_error.find("cancelled") != std::string::npos ? G4_ERR_CANCELLED : G4_ERR_INTERNAL;
    }
    if (decode && st->exec && !st->ev.empty()) collect_events(st);
    return G4_OK;
}

void session_reset(g4_session* s) {
    SessionState* st = s->cuda.get();
    st->ahead_greedy = false;
    st->ahead_off    = false;
}

namespace {

// Waits for all of the session's streams (nothing enqueued may still read or write the KV cache).
g4_status sync_lanes(SessionState* st, std::string* err) {
    if (g4_status g = ahead_end(st, err); g != G4_OK) return g;
    const Driver* d = st->e->d;
    for (Lane& ln : st->lanes) {
        CU_TRY(d->cuCtxSetCurrent(ln.g->ctx), "cuCtxSetCurrent");
        CU_TRY(d->cuStreamSynchronize(ln.stream), "waiting for the session's GPU work");
    }
    return G4_OK;
}

// The lane holding KV bytes [offset, offset + bytes), or -1 (the host part, or none).
int kv_lane(const g4_session* s, uint64_t offset, size_t bytes) {
    const auto& gpus = s->engine->plan.info().gpus;
    for (size_t i = 0; i < gpus.size() && i < s->cuda->lanes.size(); ++i)
        if (offset >= gpus[i].kv_begin && offset + bytes <= gpus[i].kv_end) return (int)i;
    return -1;
}

} // namespace

g4_status kv_transfer(g4_session* s, uint64_t offset, void* host, size_t bytes, bool to_host,
                      std::string* err) {
    SessionState* st = s->cuda.get();
    const auto& in   = s->engine->plan.info();
    if (g4_status g = sync_lanes(st, err); g != G4_OK) return g;
    const int li = kv_lane(s, offset, bytes);
    if (li < 0) {
        if (!st->host_kv || offset < in.kv_host_begin || offset + bytes > in.kv_arena_bytes) {
            *err = "internal: KV bytes at " + std::to_string(offset) + " are in no part of the session";
            return G4_ERR_INTERNAL;
        }
        uint8_t* h = (uint8_t*)st->host_kv + (offset - in.kv_host_begin);
        to_host ? std::memcpy(host, h, bytes) : std::memcpy(h, host, bytes);
        return G4_OK;
    }
    const Driver* d       = st->e->d;
    const Lane& ln        = st->lanes[li];
    const CUdeviceptr dev = ln.kv + (offset - ln.kv_begin);
    CU_TRY(d->cuCtxSetCurrent(ln.g->ctx), "cuCtxSetCurrent");
    CU_TRY(to_host ? d->cuMemcpyDtoHAsync(host, dev, bytes, ln.stream)
                   : d->cuMemcpyHtoDAsync(dev, host, bytes, ln.stream),
           "copying the KV cache");
    CU_TRY(d->cuStreamSynchronize(ln.stream), "copying the KV cache");
    return G4_OK;
}

g4_status kv_copy(g4_session* src, g4_session* dst, uint64_t offset, size_t bytes, std::string* err) {
    SessionState *a = src->cuda.get(), *b = dst->cuda.get();
    const auto& in = src->engine->plan.info();
    if (g4_status g = sync_lanes(a, err); g != G4_OK) return g;
    if (g4_status g = sync_lanes(b, err); g != G4_OK) return g;
    const int li = kv_lane(src, offset, bytes);
    if (li < 0) {
        if (!a->host_kv || !b->host_kv || offset < in.kv_host_begin || offset + bytes > in.kv_arena_bytes) {
            *err = "internal: KV bytes at " + std::to_string(offset) + " are in no part of the session";
            return G4_ERR_INTERNAL;
        }
        std::memcpy((uint8_t*)b->host_kv + (offset - in.kv_host_begin),
                    (const uint8_t*)a->host_kv + (offset - in.kv_host_begin), bytes);
        return G4_OK;
    }
    const Driver* d = a->e->d;
    if (!d->cuMemcpyDtoDAsync) {
        *err = "forking a CUDA session needs cuMemcpyDtoDAsync; the NVIDIA driver is too old";
        return G4_ERR_UNSUPPORTED;
    }
    const Lane &la = a->lanes[li], &lb = b->lanes[li];
    CU_TRY(d->cuCtxSetCurrent(lb.g->ctx), "cuCtxSetCurrent");
    CU_TRY(d->cuMemcpyDtoDAsync(lb.kv + (offset - lb.kv_begin), la.kv + (offset - la.kv_begin), bytes,
                                lb.stream),
           "copying the KV cache");
    CU_TRY(d->cuStreamSynchronize(lb.stream), "copying the KV cache");
    return G4_OK;
}

g4_status state_changed(g4_session* s, std::string* err) {
    SessionState* st = s->cuda.get();
    if (g4_status g = sync_lanes(st, err); g != G4_OK) return g;
    st->ahead_greedy = false;
    st->logits_ahead = false;
    st->screened_pos = -1;
    return G4_OK;
}

} // namespace g4::cuda_rt
