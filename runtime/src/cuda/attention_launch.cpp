// Binding and launch of the attention kernels: split partials and their merge, the tensor-core flash
// kernel for prefill, the decode kernels over the KV ring (with the q/k/v post-projection).
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

g4_status bind_attention_kernels(const ModuleKernels& m, Kernels& k, std::string* err) {
    const KernelName fns[] = {{&k.attn_part, "g4_attention_partial"},
                              {&k.attn_merge, "g4_attention_merge"},
                              {&k.qkv_post, "g4_qkv_post"},
                              {&k.attn_decode, "g4_attn_decode"},
                              {&k.attn_decode_bf16, "g4_attn_decode_bf16"},
                              {&k.attn_decode_post, "g4_attn_decode_post"},
                              {&k.attn_decode_post_bf16, "g4_attn_decode_post_bf16"}};
    if (g4_status g = m.get_all(fns, err); g != G4_OK) return g;
    for (int di = 0; di < 2; ++di) {
        const std::string sfx = di ? "_d512" : "_d256";
        const char* base[4]   = {"g4_attn_decode", "g4_attn_decode_bf16", "g4_attn_decode_post",
                                 "g4_attn_decode_post_bf16"};
        for (int v = 0; v < 4; ++v)
            m.get_optional(&k.attn_dim[di][v], base[v] + sfx);
    }
    for (int i = 0; i < 6; ++i) {
        const int dim       = kFlashDims[i];
        const std::string n = flash_kernel_name(dim);
        if (g4_status g = m.get(&k.flash[i], n, err); g != G4_OK) return g;
        if (g4_status g = m.smem(k.flash[i], (int)flash_launch(64, 1, 1, dim).smem, n, err); g != G4_OK)
            return g;
    }
    return G4_OK;
}

bool decode_attention_fits(const plan::Plan& p, const PlanOp& op, int kvdt) {
    const auto ap = plan::params<plan::AttentionParams>(op);
    return cuda_rt::decode_attention_fits(ap.heads, ap.kv_heads, ap.dim, ap.decode_splits, kvdt != 0,
                                          p.cuda_attn_hpg());
}

CUresult launch_decode_attention(SessionState* st, const plan::Plan& p, const PlanOp& at, CUdeviceptr step,
                                 CUdeviceptr q, const AttnPostH* post) {
    return launch_decode_attention_at(st, p, at, step, q, addr(st, p, at.in[1], at.in_col[1]),
                                      addr(st, p, at.in[2], at.in_col[2]),
                                      addr(st, p, at.out[0], at.out_col[0]), post);
}

CUresult launch_decode_attention_at(SessionState* st, const plan::Plan& p, const PlanOp& at, CUdeviceptr step,
                                    CUdeviceptr q, CUdeviceptr kc, CUdeviceptr vc, CUdeviceptr y,
                                    const AttnPostH* post) {
    const Kernels& K = st->cur->g->k;
    CUdeviceptr part = st->cur->part;
    const auto ap    = plan::params<plan::AttentionParams>(at);
    int heads = ap.heads, kvh = ap.kv_heads, dim = ap.dim, slots = ap.slots, window = ap.window,
        dsp = ap.decode_splits, kvdt = dt_code(p, at.in[1]);
    float scale  = ap.scale;
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

g4_status launch_attention(const OpArgs& a, CUresult* rp, std::string* err) {
    SessionState* st    = a.st;
    const plan::Plan& p = a.p;
    const Lane& ln      = a.ln;
    const Kernels& K    = a.K;
    const PlanOp& op    = a.op;
    const auto& info    = p.info();
    const size_t i      = a.i;
    const int n         = a.n;
    CUdeviceptr step = a.step, in0 = a.in0, in1 = a.in1, in2 = a.in2, out0 = a.out0;
    long ld0 = a.ld0, ldo = a.ldo;
    CUresult& r = *rp;
    auto go = [&a](CUfunction f, unsigned gx, unsigned gy, unsigned bx, std::initializer_list<void*> args) {
        return a.go(f, gx, gy, bx, args);
    };
    const auto ap = plan::params<plan::AttentionParams>(op);
    int heads = ap.heads, kvh = ap.kv_heads, dim = ap.dim, slots = ap.slots, window = ap.window,
        kvdt         = dt_code(p, op.in[1]);
    float scale      = ap.scale;
    int sp           = st->splits[i];
    int max_span     = window > 0 ? std::min(window, info.max_context) : info.max_context;
    CUdeviceptr part = ln.part, scores = ln.scores;
    if (n == 1 && decode_attention_fits(p, op, kvdt)) {
        r = launch_decode_attention_at(st, p, op, step, in0, in1, in2, out0, nullptr);
        return G4_OK;
    }
    if (st->merge_in_next) { // the compiler fuses the merge only where the decode kernel runs
        *err = "op " + std::string(p.str(op.name)) +
               ": the plan merges this attention in the o projection's kernel, but its decode row "
               "does not fit g4_attn_decode (recompile the plan with this g4)";
        return G4_ERR_UNSUPPORTED;
    }
    if (sp == 0) { // the compiler chose the tensor-core flash kernel (bf16 plans, dim a power of two 16..512)
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
        return G4_OK;
    }
    r       = go(K.attn_part, (unsigned)(n * heads), (unsigned)sp, 256,
                 {&step, &in0, &ld0, &in1, &in2, &heads, &kvh, &dim, &slots, &window, &scale, &sp, &part, &scores,
                  &max_span, &kvdt});
    int all = -1; // prefill partials: every split is read
    if (r == 0)
        r = go(K.attn_merge, (unsigned)(n * heads), (unsigned)(dim + 63) / 64, merge_threads(false),
               {&step, &part, &heads, &dim, &sp, &out0, &ldo, &all});
    return G4_OK;
}

} // namespace g4::cuda_rt
