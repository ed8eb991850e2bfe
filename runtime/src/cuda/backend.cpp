// CUDA backend (see backend.h). Prefill chunks launch one kernel (or cuBLAS call) per op; decode steps
// (1 row) run the compiler's fused schedule (plan section CUDA_SCHEDULE), captured once into a CUDA
// graph and replayed, the position read by the kernels from a device Step struct.
#include "runtime/src/cuda/backend.h"
#include "kernels/nf4.h"
#include "runtime/plan/op_params.h"
#include "runtime/src/cuda/cublas.h"
#include "runtime/src/cuda/driver.h"
#include "runtime/src/cuda/kernel_args.h"
#include "runtime/src/cuda/launch.h"
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

bool ModuleKernels::has(const std::string& name) const {
    for (size_t at = ptx.find(".entry " + name); at != std::string::npos;
         at        = ptx.find(".entry " + name, at + 1)) {
        const char c = at + 7 + name.size() < ptx.size() ? ptx[at + 7 + name.size()] : '\0';
        if (c == '(' || c == ' ' || c == '\n' || c == '\r' || c == '\t') return true;
    }
    return false;
}

g4_status ModuleKernels::get(CUfunction* f, const std::string& name, std::string* err) const {
    CU_TRY(d->cuModuleGetFunction(f, mod, name.c_str()), "kernel " + name);
    return G4_OK;
}

g4_status ModuleKernels::get_all(std::span<const KernelName> fns, std::string* err) const {
    for (const KernelName& f : fns)
        if (g4_status g = get(f.f, f.name, err); g != G4_OK) return g;
    return G4_OK;
}

bool ModuleKernels::get_optional(CUfunction* f, const std::string& name) const {
    if (!has(name) || d->cuModuleGetFunction(f, mod, name.c_str()) != 0) *f = nullptr;
    return *f != nullptr;
}

g4_status ModuleKernels::smem(CUfunction f, int bytes, const std::string& name, std::string* err) const {
    CU_TRY(d->cuFuncSetAttribute(f, kFuncAttrMaxDynamicSmem, bytes),
           "kernel " + name + ": shared memory size");
    return G4_OK;
}

namespace {

// Opens GPU `g` of the plan: checks it, loads the kernels and uploads its weights (segments of the
// plan's ranges; a weight the plan keeps on the host stays there). need_extra: the session bytes it
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
    // Segments: the plan's ranges, less the weight the plan keeps on the host.
    uint64_t hole_b = 0, hole_e = 0;
    if (st->host_weight >= 0 && g.index == p.cuda_device()) {
        const PlanTensor& t = p.tensor(st->host_weight);
        hole_b              = t.offset,
        hole_e = (t.offset + t.nbytes + plan::kTensorAlign - 1) / plan::kTensorAlign * plan::kTensorAlign;
    }
    // Each segment at an offset congruent to its plan offset modulo plan::kWeightAlign (weight_segments.h).
    g.weights_bytes = place_weight_segments(part.weights, hole_b, hole_e, &g.segs);
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
    const void* image = g.sm == target ? (const void*)p.cubin().data() : (const void*)ptx.c_str();
    CU_TRY(d->cuModuleLoadData(&g.mod, image),
           "loading the plan's CUDA kernels on GPU " + std::to_string(g.index));
    const ModuleKernels m{d, g.mod, ptx, g.sm};
    for (auto bind : {bind_op_kernels, bind_matmul_kernels, bind_attention_kernels, bind_decode_kernels,
                      bind_sampling_kernels, bind_encoder_kernels, bind_batch_kernels})
        if (g4_status r = bind(m, g.k, err); r != G4_OK) return r;
    if (g.index == p.cuda_device())
        CU_TRY(d->cuMemAlloc(&g.weights, std::max<uint64_t>(64, g.weights_bytes)),
               "allocating " + std::to_string(g.weights_bytes >> 20) + " MiB of weights on GPU " +
                   std::to_string(g.index));
    for (const Gpu::Seg& sg : g.segs)
        CU_TRY(d->cuMemcpyHtoD(g.weights + sg.at, p.weights_base() + sg.begin, sg.end - sg.begin),
               "uploading weights to GPU " + std::to_string(g.index));
    return G4_OK;
}

} // namespace

// Device bytes a session allocates on the plan's GPU `g` (index into in.gpus): the activation arena, its
// part of the KV arena and, on the plan's GPU, the towers' buffers where they run there.
uint64_t session_device_bytes(const plan::ProgramInfo& in, size_t g) {
    return in.act_arena_bytes + in.gpus[g].kv_end - in.gpus[g].kv_begin +
           (g == 0 && in.vision_gpu ? in.vision_gpu_bytes : 0) +
           (g == 0 && in.audio_gpu ? in.audio_gpu_bytes : 0);
}

namespace {

// A fused launch kind's name in the decode event profile.
const char* launch_kind_name(uint16_t kind) {
    static const char* kNames[] = {"op",  "resnorm", "gemv",       "qkv_post",      "qkv_attn",
                                   "mlp", "attn_o",  "gated_proj", "group_norm_add"};
    return kind < sizeof kNames / sizeof kNames[0] ? kNames[kind] : "?";
}

// q/k/v and gate/up read one input: the cuBLAS tier converts it to bf16 once. Op i reuses the
// scratch when the previous cuBLAS-tier matmul ran on the same GPU, read the same view with the
// same row mode and no op in between wrote that tensor (the plan runs every op of a step in
// order, with one row count).
void mark_reused_inputs(const plan::Plan& p, SessionState* st) {
    st->reuse_x.assign(p.n_ops(), 0);
    int last     = -1;
    bool written = false;
    for (size_t i = 0; i < p.n_ops(); ++i) {
        const PlanOp& op = p.op(i);
        const bool tier =
            op.code == (uint16_t)OpCode::Matmul &&
            plan::params<plan::MatmulParams>(op).prefill_variant == (int32_t)plan::MatmulVariant::Cublas &&
            st->lane_of[i] >= 0;
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

} // namespace

g4_status engine_open(g4_engine* e, EnginePtr* out, std::string* err) {
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
                st->host_weight = (int32_t)t;
    st->gpus.resize(in.gpus.size());
    for (size_t g = 0; g < in.gpus.size(); ++g) {
        st->gpus[g].index = in.gpus[g].index;
        // The plan's GPU also holds the towers' weights, if placed there.
        const uint64_t towers = g == 0 ? encoder_weight_bytes(p) : 0;
        g4_status r =
            open_gpu(p, st.get(), st->gpus[g], in.gpus[g], session_device_bytes(in, g) + towers, err);
        if (r != G4_OK) return r;
    }
    if (g4_status r = encoder_upload_weights(p, st.get(), err); r != G4_OK) return r;
    // Direct copies between the GPUs where they allow them (else the driver stages them).
    for (Gpu& a : st->gpus)
        for (Gpu& b : st->gpus) {
            int can = 0;
            if (&a == &b || d->cuDeviceCanAccessPeer(&can, a.dev, b.dev) != 0 || !can) continue;
            d->cuCtxSetCurrent(a.ctx);
            d->cuCtxEnablePeerAccess(b.ctx, 0); // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED is fine
        }
    if (g4_status r = lm_screen_setup(p, st.get(), err); r != G4_OK) return r;
    if (st->host_weight >= 0) {
        const PlanTensor& t = p.tensor(st->host_weight);
        CU_TRY(d->cuCtxSetCurrent(st->gpus[0].ctx), "cuCtxSetCurrent");
        CU_TRY(d->cuMemHostAlloc(&st->host_weight_mem, t.nbytes, kHostAllocPortable | kHostAllocDeviceMap),
               "allocating pinned host memory for the weight kept on the host (" +
                   std::to_string(t.nbytes >> 20) + " MiB, --place ple=host)");
        std::memcpy(st->host_weight_mem, p.weights_base() + t.offset, t.nbytes);
        CU_TRY(d->cuMemHostGetDevicePointer(&st->host_weight_dev, st->host_weight_mem, 0),
               "mapping the weight kept on the host");
    }
    *out = std::move(st);
    return G4_OK;
}

// The timeline lab (bench/scripts/trace_lab.sh): a plan compiled with --kernel-trace keeps per-launch records
// in its module (kernels/cuda/common.cu G4_TRACE); with G4_TRACE_OUT=file they are written there when the
// engine closes: u32 count, then count records of 64 bytes (u64 key, t0, t1, t2; u32 tag, blocks, smid,
// cycles, mark[4]).
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
            if (g.blas_h) {
                if (const cublas::Lib* blas = cublas::lib(nullptr)) blas->destroy(g.blas_h);
            }
            if (g.weights) st->d->cuMemFree(g.weights);
            if (&g == &st->gpus[0]) encoder_free_weights(st);
            if (&g == &st->gpus[0] && st->lm_q) st->d->cuMemFree(st->lm_q);
            if (g.mod) st->d->cuModuleUnload(g.mod);
        }
        if (st->host_weight_mem) st->d->cuMemFreeHost(st->host_weight_mem);
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
    if (st)
        for (const ProgramWeights& w : st->programs)
            b += w.end - w.begin;
    return b + (st ? st->lm_bytes : 0);
}

g4_status session_create(g4_session* s, SessionPtr* out, std::string* err) {
    EngineState* e      = engine_of(s->engine);
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
    mark_reused_inputs(p, st.get());
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
        DeviceCarve cv;
        if (ws.xscratch) {
            std::string why;
            if (!st->blas) st->blas = cublas::lib(&why); // absent: the tensor-core kernel takes these matmuls
            if (st->blas ||
                ws.tiled) // without cuBLAS, the tiled down projections' prefill still untiles into it
                cv.add(&ln.wscratch, std::max<size_t>(256, ws.wscratch));
            if (st->blas) {
                cv.add(&ln.xscratch, ws.xscratch);
                cv.add(&ln.cublas_ws, ws.cublas);
                std::lock_guard<std::mutex> lock(*ln.g->blas_mu);
                if (!ln.g->blas_h && st->blas->create(&ln.g->blas_h) != 0) {
                    ln.g->blas_h = nullptr;
                    *err         = "cuBLAS (" + st->blas->path + ") failed to initialise" + on;
                    return G4_ERR_INTERNAL;
                }
            }
        }
        const uint64_t kv_bytes = std::max<uint64_t>(64, part.kv_end - part.kv_begin);
        ln.kv_begin             = part.kv_begin;
        cv.add(&ln.act, std::max<uint64_t>(64, in.act_arena_bytes));
        cv.add(&ln.kv, kv_bytes);
        cv.add(&ln.step, 64);
        cv.add(&ln.part, ws.part * 4);
        ln.part_floats = ws.part;
        cv.add(&ln.scores, ws.scores * 4);
        if (ws.mlp_rep) cv.add(&ln.mlp_rep, ws.mlp_rep * 4);
        if (g == 0) { // the plan's GPU: the argmax and sampler buffers, the LM head's screening bounds
            st->n_cand = ws.candidates;
            for (CUdeviceptr& c : st->cand)
                cv.add(&c, ws.candidates * 8);
            cv.add(&st->samp_logits, ws.vocab * 4);
            cv.add(&st->samp_hist, std::max<uint64_t>(4, ws.history * 4));
            cv.add(&st->soft, cuda_ws::kSoftmaxBlocks * 16);
            if (e->lm_launch >= 0) {
                cv.add(&st->lm_lohi, (size_t)(in.vocab_size + 1) * 8);
                cv.add(&st->lm_tmax, 4);
            }
            cv.add(&st->tok, kArgmaxBytes);
            batch_reserve(s->engine, st.get(), cv);
        }
        CU_TRY(d->cuMemAlloc(&ln.slab, cv.bytes),
               "allocating a session's " + std::to_string(cv.bytes >> 20) + " MiB of device memory" + on);
        cv.place(ln.slab);
        // Zero between steps: the KV cache, each MLP's output replicas (its ResNorm re-zeroes what it sums).
        CU_TRY(d->cuMemsetD8(ln.kv, 0, kv_bytes), "clearing the KV cache" + on);
        if (ln.mlp_rep)
            CU_TRY(d->cuMemsetD8(ln.mlp_rep, 0, ws.mlp_rep * 4), "clearing the MLPs' output replicas" + on);
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
    if (g4_status r = encoder_session_create(s, st.get(), err); r != G4_OK) return r;
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
    if (st->lm_tmax) CU_TRY(d->cuMemsetD8(st->lm_tmax, 0, 4), "clearing the LM head's screening bounds");
    CU_TRY(d->cuMemsetD8(st->tok, 0, kArgmaxBytes), "clearing the argmax buffer");
    if (g4_status r = batch_create(st.get(), err); r != G4_OK) return r;
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
    *out = std::move(st);
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
    batch_destroy(st);
    encoder_session_destroy(st);
    for (Lane& ln : st->lanes) {
        d->cuCtxSetCurrent(ln.g->ctx);
        if (ln.done) d->cuEventDestroy(ln.done);
        if (ln.stream) d->cuStreamDestroy(ln.stream);
        if (ln.slab) d->cuMemFree(ln.slab);
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

g4_status profile_point(g4_session* s, int cat, bool decode, const char* what, std::string* err) {
    SessionState* st = session_of(s);
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
    SessionState* st = session_of(r->s);
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
    SessionState* st    = session_of(s);
    const plan::Plan& p = s->engine->plan;
    const PlanOp& op    = p.op(i);
    *handled            = false;
    if (!p.hybrid()) return G4_OK;
    const Driver* d = st->e->d;
    if (op.code == (uint16_t)OpCode::Copy) {
        const auto cp = plan::params<plan::CopyParams>(op);
        const int dst = cp.dst_device, src = cp.src_device;
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
        c.width_bytes             = (size_t)cp.cols * 4;
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
    SessionState* st    = session_of(s);
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
            // Output replicas (MlpLaunch replicas > 1, the reader checked the ResNorm after): the MLP adds
            // into them and that ResNorm sums them and zeroes them again, so they are zero outside the pair.
            // A folded ResNorm launches nothing: folded 1, the GatedProj launch after it runs it and the MLP
            // before it zeroes the GatedProj launch's output; folded 2, the Mlp launch after it runs it.
            auto folded = [&](size_t k, int into) -> const CudaLaunch* {
                const bool f = k < p.n_launches() && p.launch(k).kind == (uint16_t)LaunchKind::ResNorm &&
                               plan::launch_params<plan::ResNormLaunch>(p.launch(k)).folded == into;
                return f ? &p.launch(k) : nullptr;
            };
            const bool mlp = l.kind == (uint16_t)LaunchKind::Mlp;
            st->fold_prev = li > 0 && l.kind == (uint16_t)LaunchKind::GatedProj ? folded(li - 1, 1) : nullptr;
            st->fold_next = mlp ? folded(li + 1, 1) : nullptr;
            st->mlp_res   = li > 0 && mlp ? folded(li - 1, 2) : nullptr;
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
            r = launch(st,
                       l0.g->k.lm_exact[gemv_lanes_index(plan::launch_params<plan::GemvLaunch>(lh).lanes)],
                       kArgmaxBlocks, 1, 128,
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

} // namespace

// The caller reads the last step's logits (the host is not feeding greedy tokens). If the device
// logits row is a step run ahead: run the session's last step (a decode step, its token in the
// history) again so the row is its own, and stop running ahead in this session.
g4_status logits_back(g4_session* s, std::string* err) {
    SessionState* st = session_of(s);
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

g4_status fetch_logits(g4_session* s, std::string* err) {
    SessionState* st    = session_of(s);
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

g4_status run_step(g4_session* s, int32_t rows, int32_t pos0, int32_t out_rows, bool ahead,
                   bool* logits_on_device, std::string* err) {
    SessionState* st    = session_of(s);
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
    SessionState* st = session_of(s);
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
    for (size_t i = 0; i < gpus.size() && i < session_of(s)->lanes.size(); ++i)
        if (offset >= gpus[i].kv_begin && offset + bytes <= gpus[i].kv_end) return (int)i;
    return -1;
}

} // namespace

g4_status kv_transfer(g4_session* s, uint64_t offset, void* host, size_t bytes, bool to_host,
                      std::string* err) {
    SessionState* st = session_of(s);
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
    SessionState *a = session_of(src), *b = session_of(dst);
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
    SessionState* st = session_of(s);
    if (g4_status g = sync_lanes(st, err); g != G4_OK) return g;
    st->ahead_greedy = false;
    st->logits_ahead = false;
    st->screened_pos = -1;
    return G4_OK;
}

} // namespace g4::cuda_rt
