// The CUDA backend's engine and session state (runtime/src/cuda/backend.cpp, encoder_launch.cpp):
// the kernels of the plan's module, each GPU's weights, each session's streams and device buffers. Internal
// to the runtime; every buffer here is allocated at engine open or session creation and freed with them.
#pragma once
#include "g4/g4.h"
#include "runtime/src/cuda/cublas.h"
#include "runtime/src/cuda/driver.h"
#include "runtime/src/cuda/sequence_ops.h"
#include "runtime/src/cuda/weight_segments.h"
#include "runtime/src/cuda/workspace.h"
#include "runtime/src/encoder_program.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

struct g4_session;

namespace g4::cuda_rt {

using namespace g4::cu;

struct Kernels {
    CUfunction embed, mm_bf16, mm_f32, mm_nf4, gemm_bf16, gemm_nf4, gemv_bf16, gemv_nf4, tc_bf16, tc_nf4, rms,
        elem, rope, kv, attn_part, attn_merge, argmax;
    CUfunction argmax_rows;   // g4_argmax_rows (a batched step's greedy tokens); null in older plans' modules
    CUfunction gemv[2][5][2]; // [nf4][lanes per row 8..128][pairs]
    CUfunction resnorm, resnorm_rep, resnorm_z2, group_norm_add, qkv_post, attn_decode, attn_decode_bf16,
        attn_decode_post, attn_decode_post_bf16, nf4_to_bf16, f32_to_bf16, add_bias;
    // The four decode attention kernels above compiled for head dim 256 / 512 ([0] / [1]; order attn_decode,
    // _bf16, _post, _post_bf16): only in modules specialised for a group size (cuda.attn_hpg) of 8 or more,
    // when the plan's module has them; null otherwise.
    CUfunction attn_dim[2][4];
    CUfunction attn_o[4]; // g4_attn_o_nf4_g1..4 (sm_90 plans only): the decode merge + o projection
    CUfunction
        gated_proj[4]; // g4_gated_proj_bf16_g1..4 (sm_90 plans only): gelu(W_g x + b_g) * aux, then W_p
    CUfunction resnorm_gated_proj[4]; // g4_resnorm_gated_proj_bf16_g1..4: the same, the ResNorm before in its
                                      // prologue
    // The fused decode MLP (sm_90 plans only), indexed [+1 _b256: 256 threads, else 128] [+2 _dq:
    // double-quant block scales, else f32] [+4 _rep: adds into output replicas]; 8.. the packed-f16 kernels
    // (plan ip7 = 1, f32 scales only) [+1 _b256] [+2 _rep]; nf4_untile32: the MLP's down weight for prefill
    CUfunction mlp[12], nf4_untile32;
    // g4_mm_rows_nf4 / _bf16 (kernels/cuda/matmul_rows.cu): matmuls of 2..8 rows in float32;
    // g4_mm_rows_tcs_nf4 / _bf16 and their K splits' sum g4_mm_rows_tcs_sum (matmul_rows_tc.cu): of 2..16
    // rows on tensor cores; g4_mm_rows_tcs_sum_gelu: the sum with the GeluMul after the matmul (an Mlp's up
    // projection, a GatedProj's gate); g4_mm_rows_tcs_sum_norm_rope / _resnorm: the sum with the per-head
    // RmsNorm and Rope after the matmul (q, k, v) / the ResNorm record after it; null in older plans' modules
    CUfunction mm_rows_nf4, mm_rows_bf16, mm_rows_tc_nf4, mm_rows_tc_bf16, mm_rows_tc_sum,
        mm_rows_tc_sum_gelu, mm_rows_tc_sum_norm_rope, mm_rows_tc_sum_resnorm;
    // g4_mm_rows_tcs_nf4_pair / g4_mm_rows_tcs_sum_gelu_pair: an Mlp's gate and up projections as one
    // launch and their GeluMul in the splits' sum; null in older plans' modules
    CUfunction mm_rows_tc_pair, mm_rows_tc_sum_gelu_pair;
    // The batched step's per-sequence ops over all its rows (kernels/cuda/batch_rows.cu): g4_rope_rows,
    // g4_kv_store_rows, g4_attn_decode_rows[_bf16], g4_attention_merge_rows; null in older plans' modules
    CUfunction rope_rows, kv_rows, attn_rows[2], merge_rows;
    // The batched step's fused decode kernels of several rows (kernels/cuda/decode_rows.cu):
    // g4_gemv_rows_* [nf4][lanes per row 8..128][pairs][up to 4 rows, 8 rows], g4_resnorm_rows; null in older
    // plans' modules
    CUfunction gemv_rows[2][5][2][2], resnorm_rows;
    CUfunction mlp_r[5]; // g4_mlp_nf4_h2_r, _b256_h2_r, _h2_rep_r, _b256_h2_rep_r, _b256_h2_z_r: after a
                         // ResNorm with ip1 = 2
    CUfunction mlp_z[3]; // g4_mlp_nf4_b256_z, _b256_dq_z, _b256_h2_z: before a folded ResNorm (zero the
                         // GatedProj launch's output)
    CUfunction copy_f32, penalize, topk_round, softmax_partial; // GPU sampling
    // LM-head screening (plans whose module has them; null otherwise): g4_lm_screen_build, g4_lm_screen,
    // g4_lm_exact_l{8..128}.
    CUfunction lm_build, lm_screen, lm_exact[5];
    CUfunction flash[6]; // g4_attn_flash_d<kFlashDims[i]>
    // The encoder-program ops 12 / 13 / 14 / 16 (kernels/cuda/encoder_ops.cu) and 20-26 (sequence_ops.cu),
    // launched by runtime/src/cuda/encoder_launch.cpp.
    CUfunction clamp, add_position_2d, rope_2d, pool_rows;
    SequenceKernels seq;
};

// One GPU of the plan (plan info().gpus; a plan whose layers span GPUs has several, the plan's GPU
// first): its context, kernels and the weights it uploads.
struct Gpu {
    int index     = 0; // CUDA device index
    CUdevice dev  = 0;
    CUcontext ctx = nullptr;
    CUmodule mod  = nullptr;
    Kernels k{};
    CUdeviceptr weights    = 0;
    uint64_t weights_bytes = 0; // on the device
    // Plan weight bytes [begin, end) live at weights + at: the plan's ranges for this GPU, less the
    // weight kept on the host.
    using Seg = WeightSeg;
    std::vector<Seg> segs;
    std::string name;
    int sm = 0;
    // cuBLAS tier: one handle for all sessions on this GPU, made by the first session that needs it and
    // destroyed with the engine (a handle holds tens of MiB of its own; one a session was memory the plan did
    // not count). blas_mu serialises its use: a session sets its stream and its own planned workspace, then
    // enqueues its GEMM, under the lock.
    cublas::Handle blas_h               = nullptr;
    std::unique_ptr<std::mutex> blas_mu = std::make_unique<std::mutex>();
};

// An encoder program on the plan's GPU: plan weight bytes [begin, end) (its weight tensors' span) live at
// dev.
struct ProgramWeights {
    int program    = 0;
    uint64_t begin = 0, end = 0;
    CUdeviceptr dev = 0;
};

// A session's buffers of an encoder program on the plan's GPU: its activation arena with the launch records
// after it (steps), pinned staging for its inputs (at in_at) and outputs (at out_at), its ops bound to
// device addresses.
struct EncoderDevice {
    int program       = 0;
    CUdeviceptr arena = 0, steps = 0;
    uint8_t* host     = nullptr;
    uint64_t in_at[4] = {}, out_at[2] = {};
    std::vector<rt::BoundOp> ops;
};

struct EngineState {
    const Driver* d = nullptr;
    std::vector<Gpu> gpus;
    // A weight kept on the host (the plan places it there: placement "host"): it lives in pinned,
    // device-mapped host memory, read by the plan's GPU.
    int32_t host_weight         = -1;
    void* host_weight_mem       = nullptr;
    CUdeviceptr host_weight_dev = 0;
    // The encoder programs placed on the plan's GPU, their weights uploaded (encoder_launch.cpp).
    std::vector<ProgramWeights> programs;
    // LM-head screening for greedy decode steps (kernels/cuda/lm_screen.cu): on the plan's GPU, at lm_q the
    // int8 head (bytes q + 128) [V, K], then per-row scales [V] at lm_q + lm_scale_at and error bounds [V]
    // after them; lm_launch: the head's GEMV in the decode schedule (-1: no screening: G4_LM_SCREEN=0, a plan
    // on several GPUs or with CPU layers, a head the kernels do not take, or too little free memory).
    CUdeviceptr lm_q  = 0;
    uint64_t lm_bytes = 0, lm_scale_at = 0;
    int32_t lm_launch  = -1;
    unsigned lm_blocks = 0; // g4_lm_screen's grid
};

// A session's device buffers on one GPU carved from one allocation, each at a 256-byte boundary as the memory
// plan counts them (cuda_ws::Workspace::device_bytes): one cuMemAlloc a GPU, whose rounding is at most one
// allocation granule, instead of one a buffer. add() records where a buffer's address goes; place() sets
// them all once the allocation exists.
struct DeviceCarve {
    std::vector<std::pair<CUdeviceptr*, uint64_t>> parts;
    uint64_t bytes = 0;
    void add(CUdeviceptr* at, uint64_t n) {
        parts.emplace_back(at, bytes);
        bytes += cuda_ws::align256(std::max<uint64_t>(n, 1));
    }
    void place(CUdeviceptr base) const {
        for (const auto& [at, off] : parts)
            *at = base + off;
    }
};

// One GPU's part of a session: its stream and device memory (a whole activation arena, its part of
// the KV arena, step buffer, attention and cuBLAS workspaces).
struct Lane {
    Gpu* g          = nullptr;
    CUstream stream = nullptr;
    CUdeviceptr act = 0, kv = 0, step = 0, part = 0, scores = 0;
    uint64_t part_floats = 0; // part's size (Workspace::part)
    CUdeviceptr wscratch = 0, xscratch = 0,
                cublas_ws = 0;       // cuBLAS tier: bf16 weights / activations, workspace
    uint64_t kv_begin     = 0;       // plan KV offset of kv
    CUevent done          = nullptr; // recorded where the step moves on to another GPU
    CUdeviceptr mlp_rep   = 0; // the fused MLPs' output replicas [Workspace::mlp_rep], zero between steps
    CUdeviceptr slab      = 0; // the one allocation the buffers above (and on lane 0 the session's) are in
};

struct SessionState {
    EngineState* e = nullptr;
    std::vector<Lane> lanes; // engine gpus order: lanes[0] is the plan's GPU (embeddings, LM head, sampling)
    std::vector<EncoderDevice> encoders; // the encoder programs on the plan's GPU (encoder_launch.cpp)
    Lane* cur               = nullptr;   // the lane work is being enqueued on
    const cublas::Lib* blas = nullptr;
    struct Step {
        int rows, pos0, out_rows, pad;
    };
    Step* host_step   = nullptr; // pinned
    int32_t* host_tok = nullptr; // pinned, mapped [2]: the argmax of the decode step at position p in [p & 1]
    CUdeviceptr host_tok_dev = 0; // host_tok as the plan's GPU addresses it (g4_argmax writes it)
    CUdeviceptr tok          = 0; // device: the decode step's argmax (+ its block partials and counter)
    // Decoding ahead (run_step): after a greedy token the graph's argmax feeds its token and position to
    // the next step, which is enqueued before the host has read the token. ahead_pos: the position of
    // such a step not yet claimed by run_step (-1: none); logits_ahead: the device logits row is a step
    // run ahead, not the session's last step (fetch_logits / device_topk run that step again);
    // tok_ev[p & 1]: recorded after the decode step at position p.
    int32_t ahead_pos = -1;
    bool logits_ahead = false;
    bool ahead_ok     = false; // one GPU, no CPU layers, events, no profiling; G4_DECODE_AHEAD=0 turns it off
    bool ahead_greedy = false; // the last g4_session_sample took the device argmax
    bool ahead_off    = false; // the session needed a run-ahead step's logits once: no more until reset
    CUevent tok_ev[2] = {nullptr, nullptr};
    // Steps run ahead replay exec_screen where the engine screens the LM head: only the rows that can hold
    // the greedy token get their logits. screened_pos: the position of the last step launched that way
    // while the logits row is still its (-1: the row is whole); reading logits there runs the step again.
    CUgraph graph_screen    = nullptr;
    CUgraphExec exec_screen = nullptr;
    bool screen_now         = false; // capturing exec_screen
    bool screen_tried       = false; // exec_screen captured, or it could not be
    int32_t screened_pos    = -1;
    CUdeviceptr lm_lohi     = 0,
                lm_tmax = 0; // g4_lm_screen's bounds [V + 1] (float2) and the largest lower bound (u32 key)
    int32_t* host_ids   = nullptr; // pinned [max_rows]
    float* host_logits  = nullptr; // pinned [logits_rows, vocab]
    // GPU sampling (device_topk): penalised logits [vocab], two round buffers of candidates (values
    // [C] then indices [C] each, C = cuda_ws::topk_candidates), penalised tokens [max_context]; pinned
    // history [max_context] and result (values [kTopkMax], indices [kTopkMax]).
    CUdeviceptr samp_logits = 0, samp_hist = 0, cand[2] = {0, 0};
    CUdeviceptr soft   = 0; // g4_softmax_partial's (max, sum) per block; pinned host copy host_soft
    double* host_soft  = nullptr;
    uint64_t n_cand    = 0;
    int32_t* host_hist = nullptr;
    float* host_cand   = nullptr;
    std::vector<int> splits;   // per op (attention)
    std::vector<char> reuse_x; // per op: a cuBLAS-tier matmul whose bf16 input is already in xscratch
    std::vector<int> lane_of;  // per op: its lane (-1: a CPU op or a copy step)
    CUgraph graph    = nullptr;
    CUgraphExec exec = nullptr;
    std::string graph_error;  // why the decode graph could not be captured (then steps run eagerly)
    bool graph_noted = false; // graph_error reported on stderr once
    bool pdl_ok      = false; // sm_90+ and the driver has cuLaunchKernelEx (G4_PDL=0 turns it off)
    bool pdl_now     = false; // launches go out with programmatic stream serialization (decode capture)
    mutable bool after_node = false; // the last thing enqueued was a copy or host function: next launch plain
    // Plans with CPU-placed layers: each maximal run of CPU ops is one host function in the stream
    // (runs[run_of[first op]]); the CPU ops work on a pinned host copy of the activation arena and a
    // host KV arena (the plan's KV offsets from kv_host_begin on).
    struct HostRun {
        g4_session* s;
        size_t first, end;
    };
    std::vector<HostRun> runs;
    std::vector<int> run_of;       // per op: index into runs, -1 if not the first op of a run
    void* host_act      = nullptr; // pinned [act_arena_bytes]
    void* host_kv       = nullptr; // [kv_arena_bytes - kv_host_begin]
    float* host_scratch = nullptr;
    std::atomic<bool> host_failed{false};
    std::string host_error; // written by the host function that failed, read after the stream syncs
    bool profile = false;
    // launch_step: the replicas (Lane::mlp_rep) this Mlp launch adds into / this ResNorm sums (the MLP's ip6
    // - 1; 0: none)
    int rep_out = 0, rep_in = 0;
    // A ResNorm record with ip1 = 1 is folded into the GatedProj launch after it (g4_resnorm_gated_proj).
    // fold_prev: the folded ResNorm before this launch (a GatedProj), fold_next: after it (an Mlp, which
    // zeroes the ResNorm's t7: _z kernels).
    const plan::CudaLaunch* fold_prev = nullptr;
    const plan::CudaLaunch* fold_next = nullptr;
    // A ResNorm record with ip1 = 2 is folded into the Mlp launch after it (the _r kernels): mlp_res, that
    // ResNorm while the launch is its Mlp.
    const plan::CudaLaunch* mlp_res = nullptr;
    // A batched step's matmul on the tensor-core row matmuls whose GeluMul its K splits' sum applies, writing
    // the GeluMul's output y: gelu_tanh(a) * its sums (gate_of_sum false: the up projection of a gate/up
    // pair, a the gate's output), or gelu_tanh(its sums) * a (a GatedProj's gate, a the multiplier). Set for
    // that one matmul launch (y 0: none); the launch clears it where it applies it.
    struct GeluSum {
        CUdeviceptr a = 0, y = 0;
        long lda = 0, ldy = 0;
        int gate_of_sum = 0;
    } gelu_sum;
    // A batched step's Mlp gate projection on the tensor-core row matmuls that may run with its up projection
    // (op up, weight uw, bias ub or 0) as one launch, g4_mm_rows_tcs_nf4_pair, and their GeluMul (output y)
    // in the K splits' sum. Set for the gate's launch (up -1: none); the launch sets done where it applies
    // it.
    struct MlpPair {
        int32_t up     = -1;
        CUdeviceptr uw = 0, ub = 0, y = 0;
        long ldy  = 0;
        bool done = false;
    } mlp_pair;
    // A batched step's matmul on the tensor-core row matmuls whose K splits' sum runs ops after it, in place
    // on its output: HeadNorm, a per-head RmsNorm (weight w or none, groups of dim) and the Rope after it
    // (inv_freq, or 0: none); ResNorm, the ResNorm record after it (d the matmul's output; its tensors' rows
    // as launch_resnorm_rows passes them). Set for that one matmul launch (kind None: none); the launch
    // clears it where it applies it, else the caller runs those ops.
    struct SumEpilogue {
        enum Kind { None, HeadNorm, ResNorm } kind = None;
        CUdeviceptr w = 0, inv_freq = 0; // HeadNorm
        int wdt = 0, dim = 0;
        CUdeviceptr x = 0, pw = 0, sc = 0, xout = 0, prew = 0, xn = 0; // ResNorm
        long ldx = 0, ldxo = 0, ldxn = 0;
        int pwdt = 0, sdt = 0, prewdt = 0;
        float f = 1.0f, eps = 0.0f;
    } sum_epi;
    bool merge_in_next =
        false; // launch_step: the next decode launch is AttnO, which merges the attention's partials
    // G4_CUDA_PROFILE totals [decode, prefill]: per op code (0..15), then 16 + each fused launch kind
    static constexpr int kProfCats = 16 + (int)plan::LaunchKind::GroupNormAdd + 1;
    double prof_ms[kProfCats][2]   = {};
    long prof_n[kProfCats][2]      = {};
    std::chrono::steady_clock::time_point prof_t;
    // G4_CUDA_PROFILE=1, decode: an event after every launch of the captured graph; GPU time per
    // launch label (kind and op name without the layer), summed over replays.
    std::vector<CUevent> ev;
    std::vector<std::string> ev_label;
    std::vector<std::pair<std::string, double>> ev_ms;
    long ev_steps      = 0;
    double ev_total_ms = 0;
    // Batched decode steps this session leads (the first of the group; batch_launch.cpp): serial, a number no
    // other session of the process has (0: none yet); the group's step records (device, [0] the shared ops'
    // n rows, [1 + j] session j's one row) and their pinned host copy; the group last stepped (the sessions'
    // serials) and, once it stepped twice in a row, its step captured as a CUDA graph. After the records
    // (kDeltaAt bytes in): each session's KV arena address minus the first's [kMaxRows]; after those
    // (kArgmaxAt): g4_argmax_rows' row table [kMaxRows]. Decode attention's partials of the step's rows go to
    // the first session's Lane::part.
    struct BatchGroup {
        // A row of g4_argmax_rows (kernels/cuda/sampling.cu's ArgmaxRow): device addresses of the session's
        // logits row (0 for the first: the step's own), argmax buffer, step record, next id and host slot.
        struct ArgmaxRow {
            CUdeviceptr dst, ws, step, ids, host_tok;
        };
        static constexpr int kMaxRows       = 16; // rows of a group (8 without the tensor-core row matmuls)
        static constexpr uint64_t kDeltaAt  = (1 + kMaxRows) * sizeof(Step);
        static constexpr uint64_t kArgmaxAt = kDeltaAt + kMaxRows * 8;
        static constexpr uint64_t kBytes = kArgmaxAt + kMaxRows * sizeof(ArgmaxRow); // records, deltas, rows
        uint64_t serial                  = 0;
        CUdeviceptr steps                = 0;
        Step* host_steps                 = nullptr;
        std::vector<uint64_t> last, captured;
        CUgraph graph    = nullptr;
        CUgraphExec exec = nullptr;
        bool no_graph    = false; // capturing failed once: op by op from then on
        // G4_CUDA_PROFILE=1: an event after each launch of the captured step (ev[0] before the first);
        // GPU time per label summed over replays, printed when the session is destroyed.
        std::vector<CUevent> ev;
        std::vector<std::string> ev_label; // ev_label[i]: the launch between ev[i] and ev[i + 1]
        std::vector<std::pair<std::string, double>> ev_ms;
        long ev_steps = 0, ev_rows = 0;
        double ev_total_ms = 0;
    } batch;
};

// One kernel launch on the session's current lane; with programmatic dependent launch (decode graph,
// sm_90+) the kernel may start while its predecessor drains.
CUresult launch(const SessionState* st, CUfunction f, unsigned gx, unsigned gy, unsigned bx, void** args,
                unsigned gz = 1, unsigned smem = 0);

} // namespace g4::cuda_rt
