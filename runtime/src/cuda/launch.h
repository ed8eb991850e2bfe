// The CUDA backend's kernel binding and launch code, one file per kernel family beside backend.cpp:
// op_launch.cpp (an op of a prefill chunk: embedding, norms, elementwise, RoPE, KV store, and the dispatch),
// matmul_launch.cpp (matmul tiers), attention_launch.cpp (prefill and decode attention), decode_launch.cpp
// (the fused decode schedule's records), sampling_launch.cpp (argmax, top-k, LM-head screening). Each
// family binds its kernels when the plan's module loads (bind_*) and launches them. Internal to the runtime.
#pragma once
#include "runtime/plan/plan_reader.h"
#include "runtime/src/cuda/backend.h"
#include "runtime/src/cuda/kernel_args.h"
#include "runtime/src/cuda/state.h"

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

struct g4_session;

namespace g4::cuda_rt {

#define CU_TRY(expr, what)                                                                                   \
    do {                                                                                                     \
        CUresult r_ = (expr);                                                                                \
        if (r_ != 0) {                                                                                       \
            *err = std::string(what) + ": " + error_name(r_);                                                \
            return G4_ERR_INTERNAL;                                                                          \
        }                                                                                                    \
    } while (0)

inline int ceil_div(int64_t a, int64_t b) {
    return (int)((a + b - 1) / b);
}

// A kernel handle to fill and the module's name for it.
struct KernelName {
    CUfunction* f;
    const char* name;
};

// The plan's kernel module on one GPU, as the bind_* functions look kernels up in it.
struct ModuleKernels {
    const Driver* d;
    CUmodule mod;
    const std::string& ptx; // the plan's PTX: which optional kernels the module defines
    int sm;                 // the GPU's architecture (sm_90: 90)
    // Whether the module defines kernel `name` (optional kernels are looked up only then, so that opening
    // a plan raises no CUDA API error: a failed cuModuleGetFunction is one, and drowns real ones under
    // compute-sanitizer).
    bool has(const std::string& name) const;
    // A kernel every plan's module has; an error naming it if not.
    g4_status get(CUfunction* f, const std::string& name, std::string* err) const;
    // get() for each of `fns`, in order; the first error.
    g4_status get_all(std::span<const KernelName> fns, std::string* err) const;
    g4_status get_all(std::initializer_list<KernelName> fns, std::string* err) const {
        return get_all(std::span<const KernelName>(fns.begin(), fns.size()), err);
    }
    // An optional kernel: *f null where the module lacks it.
    bool get_optional(CUfunction* f, const std::string& name) const;
    // Raises kernel f's dynamic shared memory limit to `bytes`.
    g4_status smem(CUfunction f, int bytes, const std::string& name, std::string* err) const;
};

g4_status bind_op_kernels(const ModuleKernels& m, Kernels& k, std::string* err);     // op_launch.cpp
g4_status bind_matmul_kernels(const ModuleKernels& m, Kernels& k, std::string* err); // matmul_launch.cpp
g4_status bind_attention_kernels(const ModuleKernels& m, Kernels& k,
                                 std::string* err);                                    // attention_launch.cpp
g4_status bind_decode_kernels(const ModuleKernels& m, Kernels& k, std::string* err);   // decode_launch.cpp
g4_status bind_sampling_kernels(const ModuleKernels& m, Kernels& k, std::string* err); // sampling_launch.cpp
g4_status bind_encoder_kernels(const ModuleKernels& m, Kernels& k, std::string* err);  // encoder_launch.cpp
g4_status bind_batch_kernels(const ModuleKernels& m, Kernels& k, std::string* err);    // batch_launch.cpp

// Encoder programs on the plan's GPU (encoder_launch.cpp): device bytes of their weights (engine) and of a
// session's arenas and launch records; the upload at engine open and the session's buffers, freed with them.
uint64_t encoder_weight_bytes(const plan::Plan& p);
uint64_t encoder_session_bytes(const plan::Plan& p);
g4_status encoder_upload_weights(const plan::Plan& p, EngineState* st, std::string* err);
void encoder_free_weights(EngineState* st);
g4_status encoder_session_create(g4_session* s, SessionState* st, std::string* err);
void encoder_session_destroy(SessionState* st);

// Address on the current lane's GPU of tensor `idx` with a column offset (activations in elements of
// 4 bytes, KV caches of their dtype). check_ops has verified that each op's weights and caches lie
// in its GPU's parts.
CUdeviceptr addr(const SessionState* st, const plan::Plan& p, int32_t idx, int32_t col);

// Device addresses of the parts of an NF4 weight blob (kernels/nf4.h) that starts at `base`.
struct Nf4Ptrs {
    CUdeviceptr codes, absmax, absmax2, offset, code2; // the last three 0 without double quant
};
Nf4Ptrs nf4_ptrs(CUdeviceptr base, const plan::PlanTensor& w);

inline int64_t ld_of(const plan::Plan& p, int32_t idx) {
    return idx >= 0 && p.tensor(idx).ndim == 2 ? p.tensor(idx).dims[1] : 0;
}
// Kernel dtype argument (G4_DT_F32 / G4_DT_BF16) of a weight or KV cache.
inline int dt_code(const plan::Plan& p, int32_t t) {
    return t >= 0 && p.tensor(t).dtype == (uint8_t)DType::BF16 ? 1 : 0;
}

// The operands of op i of a step as its kernels take them (op_launch.cpp), for the family launchers.
struct OpArgs {
    SessionState* st;
    const plan::Plan& p;
    Lane& ln;
    const Kernels& K;
    size_t i;
    const plan::PlanOp& op;
    int n, mode; // rows of this step the op runs, its row mode
    CUdeviceptr step, in0, in1, in2, out0, out1;
    long ld0, ld1, ldo;
    CUresult go(CUfunction f, unsigned gx, unsigned gy, unsigned bx,
                std::initializer_list<void*> args) const {
        return launch(st, f, gx, gy, bx, const_cast<void**>(args.begin()));
    }
};
// A Matmul op (matmul_launch.cpp). *r: the CUDA result of its launches; an error besides a launch's in *err.
g4_status launch_matmul(const OpArgs& a, CUresult* r, std::string* err);
// An Attention op (attention_launch.cpp), as launch_matmul.
g4_status launch_attention(const OpArgs& a, CUresult* r, std::string* err);

// Whether a decode row of attention op `op` (cache dtype kvdt) runs g4_attn_decode: one block per (kv
// head, split) for all heads of the group; with kernels specialised for a group size (the plan's
// cuda.attn_hpg), only layers of that size.
bool decode_attention_fits(const plan::Plan& p, const plan::PlanOp& op, int kvdt);
// A decode row of attention op `at` (decode_attention_fits): g4_attn_decode[_bf16], one block per (kv
// head, split) for all heads of the group, then the merge into at's output. post: QkvAttn, q is the raw
// projection and g4_attn_decode_post[_bf16] does the post-projection first.
CUresult launch_decode_attention(SessionState* st, const plan::Plan& p, const plan::PlanOp& at,
                                 CUdeviceptr step, CUdeviceptr q, const AttnPostH* post);
// The same with its caches and output given (kc, vc: the k and v cache views; y: the output row), as a
// batched step's per-session launch binds them (batch_launch.cpp).
CUresult launch_decode_attention_at(SessionState* st, const plan::Plan& p, const plan::PlanOp& at,
                                    CUdeviceptr step, CUdeviceptr q, CUdeviceptr kc, CUdeviceptr vc,
                                    CUdeviceptr y, const AttnPostH* post);

// Launches op i for a step of `rows` rows (`out_rows` logits rows); nothing when the op has no rows in
// this step (op_launch.cpp).
g4_status launch_op(g4_session* s, size_t i, int rows, int out_rows, std::string* err);
// The arguments of Gemv launch record `l` on the current lane; returns the threads it launches
// (decode_launch.cpp).
long gemv_args(const SessionState* st, const plan::Plan& p, const plan::CudaLaunch& l, GemvArgsH* out,
               bool* is_nf4);
// Launches record `l` of the decode schedule (one row; decode_launch.cpp).
g4_status launch_fused(g4_session* s, const plan::CudaLaunch& l, std::string* err);

// Device bytes a session allocates on the plan's GPU `g` (index into in.gpus): the activation arena, its
// part of the KV arena and, on the plan's GPU, the towers' buffers where they run there (backend.cpp).
uint64_t session_device_bytes(const plan::ProgramInfo& in, size_t g);
// LM-head screening set up at engine open (sampling_launch.cpp).
g4_status lm_screen_setup(const plan::Plan& p, EngineState* st, std::string* err);
// The caller reads the last step's logits: a device logits row that is a step run ahead is replaced by the
// session's own last step (backend.cpp).
g4_status logits_back(g4_session* s, std::string* err);

} // namespace g4::cuda_rt
