// Encoder programs on the plan's GPU (plan_format.h PlanProgram with device >= 0): their weights uploaded at
// engine open, their activation arena, launch records and pinned input / output staging allocated at session
// creation, and a run that launches the program's ops one by one on lanes[0]'s stream. Matmuls are the
// prefill kernels (bf16 tensor-core GEMM with fp32 accumulation), norms and elementwise ops the generic
// kernels, SelfAttention the flash kernel in its bidirectional mode, ops 12 / 13 / 14 / 16 the kernels of
// kernels/cuda/encoder_ops.cu and ops 20-26 launch_sequence_op.
#include "runtime/plan/op_params.h"
#include "runtime/src/bind_op.h"
#include "runtime/src/cuda/launch.h"
#include "runtime/src/encoder_program.h"
#include "runtime/src/engine.h"

#include <algorithm>
#include <cstring>

namespace g4::cuda_rt {

namespace {

unsigned cdiv(int64_t a, int64_t b) {
    return (unsigned)((a + b - 1) / b);
}

// The byte range of WEIGHTS that program k's weight tensors span (begin == end: none).
std::pair<uint64_t, uint64_t> weight_range(const plan::Plan& p, int k) {
    const plan::PlanProgram& g = p.program(k);
    uint64_t b = UINT64_MAX, e = 0;
    for (uint32_t t = g.tensor_begin; t < g.tensor_end; ++t) {
        const plan::PlanTensor& x = p.tensor(t);
        if (x.kind != (uint8_t)plan::TensorKind::Weight) continue;
        b = std::min(b, x.offset);
        e = std::max(e, x.offset + x.nbytes);
    }
    return e > 0 ? std::make_pair(b, e) : std::make_pair(uint64_t{0}, uint64_t{0});
}

bool on_gpu(const plan::Plan& p, size_t k) {
    return k > 0 && p.program(k).device >= 0;
}

uint64_t tensor_bytes(const plan::PlanTensor& t) {
    return t.nbytes;
}

} // namespace

g4_status bind_encoder_kernels(const ModuleKernels& m, Kernels& k, std::string* err) {
    if (g4_status g = m.get_all({{&k.clamp, "g4_clamp"},
                                 {&k.add_position_2d, "g4_add_position_2d"},
                                 {&k.rope_2d, "g4_rope_2d"},
                                 {&k.pool_rows, "g4_pool_rows"}},
                                err);
        g != G4_OK)
        return g;
    if (std::string missing = load_sequence_kernels(*m.d, m.mod, &k.seq); !missing.empty()) {
        *err = "kernel " + missing + " is missing from the plan's module";
        return G4_ERR_PLAN_CORRUPT;
    }
    return G4_OK;
}

uint64_t encoder_weight_bytes(const plan::Plan& p) {
    uint64_t b = 0;
    for (size_t k = 1; k < p.n_programs(); ++k)
        if (on_gpu(p, k)) {
            const auto [x, y] = weight_range(p, (int)k);
            b += y - x;
        }
    return b;
}

uint64_t encoder_session_bytes(const plan::Plan& p) {
    uint64_t b = 0;
    for (size_t k = 1; k < p.n_programs(); ++k)
        if (on_gpu(p, k)) b += rt::encoder_arena_bytes(p, (int)k) + rt::kEncoderStepBytes;
    return b;
}

g4_status encoder_upload_weights(const plan::Plan& p, EngineState* st, std::string* err) {
    const Driver* d = st->d;
    for (size_t k = 1; k < p.n_programs(); ++k) {
        if (!on_gpu(p, k)) continue;
        ProgramWeights w;
        w.program                = (int)k;
        std::tie(w.begin, w.end) = weight_range(p, (int)k);
        CU_TRY(d->cuCtxSetCurrent(st->gpus[0].ctx), "cuCtxSetCurrent");
        const std::string what = std::string("program '") + p.str(p.program(k).name) + "'";
        if (w.end > w.begin) {
            CU_TRY(d->cuMemAlloc(&w.dev, w.end - w.begin),
                   "allocating " + std::to_string((w.end - w.begin) >> 20) + " MiB for the weights of " +
                       what + " on GPU " + std::to_string(st->gpus[0].index));
            st->programs.push_back(w);
            CU_TRY(d->cuMemcpyHtoD(w.dev, p.weights_base() + w.begin, w.end - w.begin),
                   "uploading the weights of " + what);
        } else {
            st->programs.push_back(w);
        }
    }
    return G4_OK;
}

void encoder_free_weights(EngineState* st) {
    for (ProgramWeights& w : st->programs)
        if (w.dev) st->d->cuMemFree(w.dev);
    st->programs.clear();
}

// Binds program k's ops to the session's device arena and the engine's copy of its weights.
static void bind_device_ops(const plan::Plan& p, const ProgramWeights& w, EncoderDevice& e) {
    const plan::PlanProgram& g = p.program(e.program);
    auto base                  = [&](const plan::PlanTensor& t) -> void* {
        if (t.kind == (uint8_t)plan::TensorKind::Weight)
            return (void*)(uintptr_t)(w.dev + (t.offset - w.begin));
        return (void*)(uintptr_t)(e.arena + t.offset);
    };
    e.ops.clear();
    for (uint32_t i = g.op_begin; i < g.op_end; ++i)
        e.ops.push_back(rt::bind_op(p, p.op(i), base));
}

g4_status encoder_session_create(g4_session* s, SessionState* st, std::string* err) {
    const plan::Plan& p = s->engine->plan;
    const Driver* d     = st->e->d;
    for (const ProgramWeights& w : st->e->programs) {
        st->encoders.emplace_back();
        EncoderDevice& e           = st->encoders.back();
        e.program                  = w.program;
        const plan::PlanProgram& g = p.program(w.program);
        const std::string what     = std::string("program '") + p.str(g.name) + "'";
        const uint64_t bytes       = rt::encoder_arena_bytes(p, w.program);
        CU_TRY(d->cuCtxSetCurrent(st->lanes[0].g->ctx), "cuCtxSetCurrent");
        CU_TRY(d->cuMemAlloc(&e.arena, bytes + rt::kEncoderStepBytes),
               "allocating " + std::to_string(bytes >> 20) + " MiB for the activations of " + what);
        e.steps = e.arena + bytes;
        // Pinned staging: each input, then each output, whole tensors, 64-byte aligned.
        uint64_t at = 0;
        for (int k = 0; k < 4; ++k)
            if (g.inputs[k] >= 0) e.in_at[k] = at, at += (tensor_bytes(p.tensor(g.inputs[k])) + 63) / 64 * 64;
        for (int k = 0; k < 2; ++k)
            if (g.outputs[k] >= 0)
                e.out_at[k] = at, at += (tensor_bytes(p.tensor(g.outputs[k])) + 63) / 64 * 64;
        CU_TRY(d->cuMemAllocHost((void**)&e.host, std::max<uint64_t>(at, 64)),
               "allocating pinned memory for the inputs and outputs of " + what);
        std::memset(e.host, 0, std::max<uint64_t>(at, 64));
        bind_device_ops(p, w, e);
    }
    return G4_OK;
}

void encoder_session_destroy(SessionState* st) {
    for (EncoderDevice& e : st->encoders) {
        if (e.arena) st->e->d->cuMemFree(e.arena);
        if (e.host) st->e->d->cuMemFreeHost(e.host);
    }
    st->encoders.clear();
}

static const EncoderDevice* find_encoder(const SessionState* st, int program) {
    for (const EncoderDevice& e : st->encoders)
        if (e.program == program) return &e;
    return nullptr;
}

void* encoder_staging(const g4_session* s, int program, bool output, int k) {
    const EncoderDevice* e = find_encoder(session_of(s), program);
    if (!e) return nullptr;
    return e->host + (output ? e->out_at[k] : e->in_at[k]);
}

namespace {

// One op of an encoder program over n rows on the current lane (step: its row count's launch record).
g4_status launch_encoder_op(SessionState* st, const plan::Plan& p, const rt::BoundOp& b, int n,
                            CUdeviceptr step, const int32_t* counts, CUresult* r, std::string* err) {
    const Kernels& K       = st->lanes[0].g->k;
    const plan::PlanOp& op = *b.op;
    int mode               = 0;
    CUdeviceptr x = (CUdeviceptr)b.in[0], y = (CUdeviceptr)b.out[0], in1 = (CUdeviceptr)b.in[1],
                in2 = (CUdeviceptr)b.in[2];
    long ldx = (long)b.in_ld[0], ld1 = (long)b.in_ld[1], ldy = (long)b.out_ld[0];
    auto go = [&](CUfunction f, unsigned gx, unsigned gy, unsigned bx, std::initializer_list<void*> args,
                  unsigned smem = 0) {
        *r = launch(st, f, gx, gy, bx, const_cast<void**>(args.begin()), 1, smem);
    };
    switch ((OpCode)op.code) {
    case OpCode::Matmul: {
        const plan::PlanTensor& w = p.tensor(op.in[1]);
        int N = (int)w.dims[0], Kd = (int)w.dims[1];
        if (w.dtype == (uint8_t)DType::BF16 && Kd % 32 == 0)
            go(K.tc_bf16, cdiv(N, 64), cdiv(n, 64), 128,
               {&step, &mode, &x, &ldx, &in1, &N, &Kd, &y, &ldy, &in2});
        else if (w.dtype == (uint8_t)DType::BF16 || w.dtype == (uint8_t)DType::F32)
            go(w.dtype == (uint8_t)DType::BF16 ? K.mm_bf16 : K.mm_f32, cdiv(N, 8), 1, 256,
               {&step, &mode, &x, &ldx, &in1, &N, &Kd, &y, &ldy, &in2});
        else {
            *err = std::string("op ") + p.str(op.name) +
                   ": an encoder program on the GPU takes bf16 or f32 "
                   "matmul weights (recompile the plan)";
            return G4_ERR_UNSUPPORTED;
        }
        return G4_OK;
    }
    case OpCode::RmsNorm: {
        int wdt = b.in_dt[1] == DType::BF16 ? 1 : 0, dim = op.ip[1];
        float eps = op.fp[0];
        go(K.rms, (unsigned)n, (unsigned)(op.ip[0] / dim), 256,
           {&step, &mode, &x, &ldx, &in1, &wdt, &y, &ldy, &dim, &eps});
        return G4_OK;
    }
    case OpCode::Add:
    case OpCode::GeluMul:
    case OpCode::Scale: {
        int kind = op.code == (uint16_t)OpCode::Add ? 0 : op.code == (uint16_t)OpCode::GeluMul ? 1 : 2;
        int cols = op.ip[0], sdt = 0;
        float f        = kind == 2 ? op.fp[0] : 1.0f;
        CUdeviceptr bb = kind == 2 ? 0 : in1, scalar = kind == 2 ? in1 : 0;
        if (kind == 2) sdt = b.in_dt[1] == DType::BF16 ? 1 : 0;
        go(K.elem, (unsigned)n, cdiv(cols, 256), 256,
           {&step, &mode, &kind, &x, &ldx, &bb, &ld1, &y, &ldy, &cols, &f, &scalar, &sdt});
        return G4_OK;
    }
    case OpCode::Clamp: {
        const auto c = plan::params<plan::ClampParams>(op);
        int cols     = c.cols;
        float lo = c.lo, hi = c.hi;
        go(K.clamp, (unsigned)n, cdiv(cols, 256), 256, {&x, &ldx, &y, &ldy, &cols, &lo, &hi});
        return G4_OK;
    }
    case OpCode::AddPosition2D: {
        int tdt = b.in_dt[1] == DType::BF16 ? 1 : 0, cols = plan::params<plan::AddPosition2DParams>(op).cols;
        long P = (long)p.tensor(op.in[1]).dims[1];
        go(K.add_position_2d, (unsigned)n, cdiv(cols, 256), 256,
           {&x, &ldx, &in1, &tdt, &P, &in2, &y, &ldy, &cols});
        return G4_OK;
    }
    case OpCode::Rope2D: {
        const auto rp = plan::params<plan::Rope2DParams>(op);
        int D         = rp.dim;
        go(K.rope_2d, (unsigned)n, (unsigned)rp.heads, (unsigned)std::max(32, D / 2),
           {&x, &ldx, &in1, &in2, &D});
        return G4_OK;
    }
    case OpCode::SelfAttention: {
        const auto ap = plan::params<plan::SelfAttentionParams>(op);
        int heads = ap.heads, kvh = ap.kv_heads, D = ap.dim, slots = n, window = -1, kvdt = 0;
        float scale = ap.scale;
        int di      = 0;
        while (di < 6 && kFlashDims[di] != D)
            ++di;
        // The flash kernel reads k and v as dense [rows, kv_heads * dim] caches.
        if (di == 6 || b.in_ld[1] != (int64_t)kvh * D || b.in_ld[2] != (int64_t)kvh * D) {
            *err = std::string("op ") + p.str(op.name) + ": no GPU attention kernel for head dim " +
                   std::to_string(D) + " with these k / v views (recompile with the encoder on the CPU)";
            return G4_ERR_UNSUPPORTED;
        }
        const FlashLaunch fl = flash_launch(n, heads, kvh, D);
        go(K.flash[di], fl.gx, fl.gy, fl.block,
           {&step, &x, &ldx, &in1, &in2, &heads, &kvh, &slots, &window, &scale, &y, &ldy, &kvdt}, fl.smem);
        return G4_OK;
    }
    case OpCode::PoolRows: {
        const auto pp = plan::params<plan::PoolRowsParams>(op);
        int taps = pp.taps, cols = pp.cols;
        float w = pp.weight;
        go(K.pool_rows, (unsigned)n, cdiv(cols, 256), 256, {&x, &ldx, &in1, &taps, &w, &y, &ldy, &cols});
        return G4_OK;
    }
    default:
        if (launch_sequence_op(*st->e->d, K.seq, st->lanes[0].stream, b, n, counts, r)) return G4_OK;
        *err = std::string("op ") + p.str(op.name) + ": not an encoder-program op";
        return G4_ERR_INTERNAL;
    }
}

} // namespace

g4_status encoder_run(g4_session* s, int program, const int32_t* counts, const int32_t* in_rows,
                      const int32_t* out_rows, std::string* err) {
    SessionState* st           = session_of(s);
    const plan::Plan& p        = s->engine->plan;
    const plan::PlanProgram& g = p.program(program);
    const EncoderDevice* e     = find_encoder(st, program);
    if (!e) {
        *err = std::string("program '") + p.str(g.name) + "' has no device buffers in this session";
        return G4_ERR_INTERNAL;
    }
    const Driver* d  = st->e->d;
    Lane& ln         = st->lanes[0];
    CUresult r       = d->cuCtxSetCurrent(ln.g->ctx);
    st->cur          = &ln;
    st->ahead_pos    = -1; // the sync below waits for a step run ahead
    const char* what = "uploading the inputs";
    if (r == 0) r = d->cuStreamSynchronize(ln.stream);
    SessionState::Step steps[plan::kMaxRowCounts];
    for (int k = 0; k < plan::kMaxRowCounts; ++k)
        steps[k] = {counts[k], 0, counts[k], 0};
    static_assert(sizeof steps <= rt::kEncoderStepBytes);
    if (r == 0) r = d->cuMemcpyHtoDAsync(e->steps, steps, sizeof steps, ln.stream);
    // Row bytes of tensor t: its columns in its dtype.
    auto row_bytes = [&](int32_t t) { return dtype_bytes((DType)p.tensor(t).dtype, p.tensor(t).dims[1]); };
    for (int k = 0; k < 4 && r == 0; ++k) {
        if (g.inputs[k] < 0) continue;
        const plan::PlanTensor& t = p.tensor(g.inputs[k]);
        const uint64_t bytes      = in_rows ? (uint64_t)in_rows[k] * row_bytes(g.inputs[k]) : t.nbytes;
        if (bytes) r = d->cuMemcpyHtoDAsync(e->arena + t.offset, e->host + e->in_at[k], bytes, ln.stream);
    }
    for (size_t i = 0; i < e->ops.size() && r == 0; ++i) {
        const rt::BoundOp& b = e->ops[i];
        const int c          = b.op->row_mode - plan::kRowCountBase;
        const int n          = counts[c];
        if (n <= 0) continue;
        what = p.str(b.op->name);
        if (g4_status gs =
                launch_encoder_op(st, p, b, n, e->steps + sizeof(SessionState::Step) * c, counts, &r, err);
            gs != G4_OK)
            return gs;
    }
    for (int k = 0; k < 2 && r == 0; ++k) {
        if (g.outputs[k] < 0) continue;
        what                      = "copying the outputs to the host";
        const plan::PlanTensor& t = p.tensor(g.outputs[k]);
        const uint64_t bytes      = out_rows ? (uint64_t)out_rows[k] * row_bytes(g.outputs[k]) : t.nbytes;
        if (bytes) r = d->cuMemcpyDtoHAsync(e->host + e->out_at[k], e->arena + t.offset, bytes, ln.stream);
    }
    if (r == 0) r = d->cuStreamSynchronize(ln.stream);
    if (r == 0) return G4_OK;
    *err = "CUDA error " + error_name(r) + " in program '" + p.str(g.name) + "' on GPU " +
           std::to_string(ln.g->index) + " (" + what + ")";
    return G4_ERR_INTERNAL;
}

} // namespace g4::cuda_rt
