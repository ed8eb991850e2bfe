// CUDA session memory beyond the plan's arenas, sized from the plan's ops and hyper-parameters: the
// one definition behind the compiler's memory plan (compiler/compile.cpp) and the runtime's
// allocations at session create (runtime/src/cuda/backend.cpp). Header-only; no CUDA dependency.
#pragma once
#include "kernels/nf4.h"
#include "runtime/plan/launch_params.h"
#include "runtime/plan/op_params.h"
#include "runtime/plan/plan_format.h"
#include "runtime/src/cuda/rows_tc_grid.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace g4::cuda_ws {

inline uint64_t align256(uint64_t b) {
    return (b + 255) / 256 * 256;
}

// Prefill key splits of an attention op as the runtime launches them (0: the flash kernel).
inline int attention_splits(const plan::PlanOp& op) {
    return std::max(0, std::min(128, plan::params<plan::AttentionParams>(op).prefill_splits));
}

// g4_argmax: 2048 logits a block at a 262,144-token vocabulary; its buffer holds the token, a counter and
// the per-block partials.
inline constexpr unsigned kArgmaxBlocks = 128;
inline constexpr uint64_t kArgmaxBytes  = (2 + 2 * kArgmaxBlocks) * 4;

// GPU sampling (g4_topk_round): each block sorts kTopkBlock (value, index) pairs and keeps its best
// k; rounds repeat until one block remains. top_k up to kTopkMax runs on the GPU.
inline constexpr int kTopkBlock = 2048;
inline constexpr int kTopkMax   = 1024;
// Top-p / min-p without top-k: g4_softmax_partial's blocks, each a (max, sum) pair of doubles.
inline constexpr int kSoftmaxBlocks = 128;
// Candidates of the first round (the largest): ceil(vocab / block) blocks x kTopkMax.
inline uint64_t topk_candidates(int64_t vocab) {
    return (uint64_t)((vocab + kTopkBlock - 1) / kTopkBlock) * kTopkMax;
}

struct Workspace {
    uint64_t part   = 16,
             scores = 16; // floats: attention partials (prefill and decode; also the row matmuls' K
                          // splits), split-over-keys scores
    uint64_t wscratch = 0, xscratch = 0; // bytes: the cuBLAS tier's bf16 weights and activations (0: no tier)
    uint64_t cublas     = 0;             // bytes: cuBLAS workspace (with the tier)
    bool tiled          = false;         // kQuantTiled32 weights: wscratch is needed even without cuBLAS
    uint64_t candidates = 0;             // (value, index) pairs in each of the sampler's two round buffers
    uint64_t vocab      = 0;             // floats: the repetition-penalised copy of the logits
    uint64_t history    = 0;             // ints: the penalised tokens (up to max_context)
    uint64_t mlp_rep    = 0; // floats: the fused decode MLPs' output replicas [R - 1, H], the most any needs
    bool primary        = true; // the plan's GPU: also the argmax and sampler buffers

    // Device bytes of everything a session allocates on one GPU besides the arenas (each allocation
    // rounded to 256 bytes, as cuMemAlloc aligns them): attention, cuBLAS, step and MLP replica buffers,
    // and on the plan's GPU the argmax and sampler buffers.
    uint64_t device_bytes() const {
        uint64_t b =
            align256(part * 4) + align256(scores * 4) + align256(64) + (mlp_rep ? align256(mlp_rep * 4) : 0);
        if (xscratch)
            b += align256(std::max<uint64_t>(256, wscratch)) + align256(xscratch) + align256(cublas);
        if (primary)
            b += align256(kArgmaxBytes) + 2 * align256(candidates * 8) + align256(vocab * 4) +
                 align256(history * 4) + align256(kSoftmaxBlocks * 16);
        return b;
    }
};

// Output replicas of a decode launch: a fused MLP's (1..kMlpReplicasMax), else 1.
inline int mlp_replicas(const plan::CudaLaunch& l) {
    return l.kind == (uint16_t)plan::LaunchKind::Mlp
               ? std::clamp(plan::launch_params<plan::MlpLaunch>(l).replicas, 1, plan::kMlpReplicasMax)
               : 1;
}

// ops/tensors: the plan's records; max_rows: prefill chunk; vocab: the LM head's rows; primary: the
// plan's GPU; launches: the CUDA decode schedule (null: none). Cross-device plans size each GPU by the
// ops it runs: those with op_gpu[i] == gpu (op_gpu null: every op).
inline Workspace workspace(const plan::PlanOp* ops, size_t n_ops, const plan::PlanTensor* tensors,
                           int64_t max_rows, int64_t max_context, int64_t vocab, bool primary = true,
                           const int* op_gpu = nullptr, int gpu = 0,
                           const plan::CudaLaunch* launches = nullptr, size_t n_launches = 0) {
    Workspace w;
    w.primary = primary;
    for (size_t li = 0; li < n_launches; ++li) {
        const plan::CudaLaunch& l = launches[li];
        const int reps            = mlp_replicas(l);
        if (reps < 2 || (op_gpu && op_gpu[l.op] != gpu)) continue;
        const uint64_t H = (uint64_t)tensors[ops[plan::launch_params<plan::MlpLaunch>(l).down].in[1]]
                               .dims[0]; // the down's rows
        w.mlp_rep = std::max<uint64_t>(w.mlp_rep, (uint64_t)(reps - 1) * H);
    }
    for (size_t li = 0; li < n_launches; ++li) { // an Mlp's gate and up as one row matmul: partials of 2N
        const plan::CudaLaunch& l = launches[li];
        if (l.kind != (uint16_t)plan::LaunchKind::Mlp || (op_gpu && op_gpu[l.op] != gpu)) continue;
        const plan::MlpLaunch ml = plan::launch_params<plan::MlpLaunch>(l);
        if (ml.gate < 0 || ml.up < 0 || (size_t)ml.gate >= n_ops || (size_t)ml.up >= n_ops) continue;
        const plan::PlanTensor &g = tensors[ops[ml.gate].in[1]], &u = tensors[ops[ml.up].in[1]];
        if (g.dtype == (uint8_t)DType::NF4 && u.dtype == g.dtype && u.dims[0] == g.dims[0] &&
            u.dims[1] == g.dims[1] && g.dims[1] % 64 == 0)
            w.part = std::max<uint64_t>(w.part, rows_tc_part_floats(2 * g.dims[0], g.dims[1]));
    }
    for (size_t i = 0; i < n_ops; ++i) {
        if (op_gpu && op_gpu[i] != gpu) continue;
        const plan::PlanOp& op = ops[i];
        if (op.code == (uint16_t)OpCode::Matmul &&
            plan::params<plan::MatmulParams>(op).prefill_variant == (int32_t)plan::MatmulVariant::Cublas) {
            const plan::PlanTensor& t = tensors[op.in[1]];
            if (t.dtype == (uint8_t)DType::NF4)
                w.wscratch = std::max<uint64_t>(w.wscratch, (uint64_t)t.dims[0] * t.dims[1] * 2);
            if (t.dtype == (uint8_t)DType::NF4 &&
                (t.quant_flags & plan::kQuantTiled32)) { // + its row-major codes and absmax
                const nf4::Layout l =
                    nf4::layout(t.dims[0] * t.dims[1], t.quant_flags & plan::kQuantDoubleQuant);
                w.wscratch = std::max<uint64_t>(w.wscratch, align256((uint64_t)t.dims[0] * t.dims[1] * 2) +
                                                                (l.double_quant ? l.absmax2_off : l.total));
                w.tiled    = true;
            }
            w.xscratch = std::max<uint64_t>(w.xscratch, (uint64_t)max_rows * t.dims[1] * 2);
        }
        if (op.code == (uint16_t)OpCode::Matmul) { // row matmuls of 9..16 rows: their K splits' partials
            const plan::PlanTensor& t = tensors[op.in[1]];
            if ((t.dtype == (uint8_t)DType::NF4 || t.dtype == (uint8_t)DType::BF16) && t.dims[1] % 64 == 0 &&
                t.kind == (uint8_t)plan::TensorKind::Weight && t.flags != plan::kRoleTower)
                w.part = std::max<uint64_t>(w.part, rows_tc_part_floats(t.dims[0], t.dims[1]));
        }
        if (op.code != (uint16_t)OpCode::Attention) continue;
        const auto ap     = plan::params<plan::AttentionParams>(op);
        const uint64_t sp = (uint64_t)attention_splits(op);
        const uint64_t span =
            (uint64_t)(ap.window > 0 ? std::min<int64_t>(ap.window, max_context) : max_context);
        w.part = std::max<uint64_t>(w.part, (uint64_t)max_rows * ap.heads * sp * (ap.dim + 2));
        w.part =
            std::max<uint64_t>(w.part, (uint64_t)ap.heads * std::max(1, ap.decode_splits) * (ap.dim + 2));
        if (sp)
            w.scores =
                std::max<uint64_t>(w.scores, (uint64_t)max_rows * ap.heads * sp * ((span + sp - 1) / sp + 1));
    }
    if (w.xscratch) w.cublas = plan::kCublasWorkspaceBytes;
    w.candidates = topk_candidates(vocab);
    w.vocab      = (uint64_t)vocab;
    w.history    = (uint64_t)max_context;
    return w;
}

// Pinned host bytes a session allocates: step (64), argmax token (64), ids [max_rows], logits
// [logits_rows, vocab], the sampler's history [max_context], candidates [kTopkMax pairs] and
// softmax partials [kSoftmaxBlocks pairs of doubles].
inline uint64_t pinned_bytes(int64_t max_rows, int64_t logits_rows, int64_t vocab, int64_t max_context) {
    return 64 + 64 + (uint64_t)max_rows * 4 + (uint64_t)logits_rows * vocab * 4 + (uint64_t)max_context * 4 +
           (uint64_t)kTopkMax * 8 + (uint64_t)kSoftmaxBlocks * 16;
}

// LM-head screening (kernels/cuda/lm_screen.cu, runtime/src/cuda/sampling_launch.cpp): an int8 copy of the
// head's bf16 weights (rows padded to 256 bytes in all), a float scale and a pair of bounds per row. The
// screening kernels take a decode schedule whose logits come from one bf16 GEMV record (no second matrix,
// plain or soft-capped epilogue) of K <= 4096 columns (K % 16 == 0) and a vocabulary the argmax's blocks
// cover. lm_screen_launch: that record's index, or -1; lm_screen_bytes: the copy's bytes, 0 without one.
inline int lm_screen_launch(const plan::CudaLaunch* sched, size_t n, const plan::PlanOp* ops,
                            const plan::PlanTensor* tensors, int32_t logits) {
    for (size_t i = 0; i < n; ++i) {
        if (sched[i].kind != (uint16_t)plan::LaunchKind::Gemv) continue;
        const plan::GemvLaunch l = plan::launch_params<plan::GemvLaunch>(sched[i]);
        const plan::PlanOp& op   = ops[l.mat0];
        if ((int32_t)op.out[0] != logits) continue;
        const plan::PlanTensor& w = tensors[op.in[1]];
        const int64_t V = w.dims[0], K = w.dims[1];
        const bool lanes = l.lanes == 8 || l.lanes == 16 || l.lanes == 32 || l.lanes == 64 || l.lanes == 128;
        if (l.nmat != 1 || (l.epilogue != 0 && l.epilogue != 3) || w.dtype != (uint8_t)DType::BF16 ||
            !lanes || K % 16 || K > 4096 ||
            (V + 128 / l.lanes * 4 - 1) / (128 / l.lanes * 4) > (int64_t)kArgmaxBlocks * 1024)
            return -1;
        return (int)i;
    }
    return -1;
}
inline uint64_t lm_screen_scale_at(const plan::PlanTensor& w) {
    return ((uint64_t)w.dims[0] * (uint64_t)w.dims[1] + 255) / 256 * 256;
}
inline uint64_t lm_screen_bytes(const plan::PlanTensor& w) {
    return lm_screen_scale_at(w) + (uint64_t)w.dims[0] * 8;
}
// What each session adds (backend.cpp): a pair of bounds per row and one more, and the threshold.
inline uint64_t lm_screen_session_bytes(const plan::PlanTensor& w) {
    return align256(((uint64_t)w.dims[0] + 1) * 8) + align256(4);
}

} // namespace g4::cuda_ws
