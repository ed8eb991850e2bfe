// Binding and launch of the kernels of one op of a prefill chunk (or a decode row outside the fused
// schedule): embedding, RMSNorm, elementwise, RoPE, KV store; the dispatch of every op to its family.
#include "kernels/ref/ref.h"
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

g4_status bind_op_kernels(const ModuleKernels& m, Kernels& k, std::string* err) {
    const KernelName fns[] = {{&k.embed, "g4_embed"},
                              {&k.rms, "g4_rms_norm"},
                              {&k.elem, "g4_elementwise"},
                              {&k.rope, "g4_rope"},
                              {&k.kv, "g4_kv_store"}};
    if (g4_status g = m.get_all(fns, err); g != G4_OK) return g;
    return G4_OK;
}

CUdeviceptr addr(const SessionState* st, const plan::Plan& p, int32_t idx, int32_t col) {
    if (idx < 0) return 0;
    const PlanTensor& t = p.tensor(idx);
    const Lane& ln      = *st->cur;
    switch ((TensorKind)t.kind) {
    case TensorKind::Weight: {
        if (idx == st->e->host_weight) return st->e->host_weight_dev;
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

g4_status launch_op(g4_session* s, size_t i, int rows, int out_rows, std::string* err) {
    SessionState* st    = session_of(s);
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
    const OpArgs a{st, p, ln, K, i, op, n, mode, step, in0, in1, in2, out0, out1, ld0, ld1, ldo};
    switch ((OpCode)op.code) {
    case OpCode::Embed: {
        const PlanTensor& tab = p.tensor(op.in[1]);
        int dt                = tab.dtype == (uint8_t)DType::BF16 ? 1 : 0;
        long cols             = tab.dims[1];
        float sc              = plan::params<plan::EmbedParams>(op).scale;
        r                     = go(K.embed, n, (unsigned)((cols + 2047) / 2048), 256,
                                   {&step, &ids, &in1, &dt, &cols, &sc, &out0, &ldo});
        break;
    }
    case OpCode::Matmul: {
        g4_status g = launch_matmul(a, &r, err);
        if (g != G4_OK) return g;
        break;
    }
    case OpCode::RmsNorm: {
        const auto np = plan::params<plan::RmsNormParams>(op);
        int dim       = np.dim;
        int wdt       = op.in[1] >= 0 && p.tensor(op.in[1]).dtype == (uint8_t)DType::BF16 ? 1 : 0;
        float eps     = np.eps;
        r             = go(K.rms, n, (unsigned)(np.cols / dim), 256,
                           {&step, &mode, &in0, &ld0, &in1, &wdt, &out0, &ldo, &dim, &eps});
        break;
    }
    case OpCode::Add:
    case OpCode::GeluMul:
    case OpCode::Scale:
    case OpCode::Softcap: {
        int kind = op.code == (uint16_t)OpCode::Add       ? 0
                   : op.code == (uint16_t)OpCode::GeluMul ? 1
                   : op.code == (uint16_t)OpCode::Scale   ? 2
                                                          : 3;
        int cols = 0;
        float f  = 0; // Scale's factor, Softcap's cap
        if (kind == 0) {
            cols = plan::params<plan::AddParams>(op).cols;
        } else if (kind == 1) {
            cols = plan::params<plan::GeluMulParams>(op).cols;
        } else if (kind == 2) {
            const auto sp = plan::params<plan::ScaleParams>(op);
            cols = sp.cols, f = sp.scale;
        } else {
            const auto cp = plan::params<plan::SoftcapParams>(op);
            cols = cp.cols, f = cp.cap;
        }
        CUdeviceptr b = kind <= 1 ? in1 : 0, sc = kind == 2 ? in1 : 0;
        int sdt = kind == 2 && op.in[1] >= 0 && p.tensor(op.in[1]).dtype == (uint8_t)DType::BF16 ? 1 : 0;
        r       = go(K.elem, n, (unsigned)ceil_div(cols, 256), 256,
                     {&step, &mode, &kind, &in0, &ld0, &b, &ld1, &out0, &ldo, &cols, &f, &sc, &sdt});
        break;
    }
    case OpCode::Rope: {
        const auto rp = plan::params<plan::RopeParams>(op);
        int dim       = rp.dim;
        r             = go(K.rope, n, (unsigned)rp.heads, (unsigned)std::max(32, dim / 2),
                           {&step, &in0, &ld0, &in1, &dim});
        break;
    }
    case OpCode::KvStore: {
        const auto kp = plan::params<plan::KvStoreParams>(op);
        int width = kp.width, slots = kp.slots, kvdt = dt_code(p, op.out[0]);
        r = go(K.kv, n, 1, 256, {&step, &in0, &ld0, &in1, &ld1, &out0, &out1, &width, &slots, &kvdt});
        break;
    }
    case OpCode::Attention: {
        g4_status g = launch_attention(a, &r, err);
        if (g != G4_OK) return g;
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

} // namespace g4::cuda_rt
