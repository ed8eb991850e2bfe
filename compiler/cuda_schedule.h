// Ahead-of-time CUDA choices for a plan: each op's kernel variant for decode and prefill steps, and
// the decode schedule, which replaces op sequences of the op program (matched by op codes and the tensors
// they share, not by names) with single fused kernels (launched by runtime/src/cuda/decode_launch.cpp; record
// layout in runtime/plan/plan_format.h).
#pragma once
#include "runtime/plan/plan_format.h"

#include <cstdint>
#include <string>
#include <vector>

namespace g4::cuda {

// Sets MatmulParams decode_variant / prefill_variant and AttentionParams prefill_splits / decode_splits
// from the real shapes. prefill_precision: "bf16" (tensor cores) or "fp32".
void choose_variants(std::vector<plan::PlanOp>& ops, const std::vector<plan::PlanTensor>& tensors,
                     int64_t max_context, const std::string& prefill_precision);

// Key splits of the decode attention kernel for a layer whose span (window, or the context) is `span`:
// one block per (kv head, split), >= 8 keys a split (g4_attn_decode's AD_MIN) so a short context
// still spreads over many blocks; at most 1024 splits (the merge kernel's limit), so <= 256 keys a
// split up to 256K positions.
int decode_attention_splits(int64_t span);

// Lanes that share one weight row in the decode GEMV (8..128); K is read in 16-byte chunks (32 NF4 or
// 8 bf16 values). A lane loads its first two chunks of each of its rows before waiting on the previous
// kernel (g4_gemv_*'s FC); later chunks are loaded after it. bf16: each lane takes up to four chunks of a
// row, unless the matrix has too few groups of 4 weight rows to give the GPU about 64K threads: then more
// lanes share a row, up to one per chunk; and at least enough lanes that a lane takes at most
// kGemvLaneChunks chunks of a row (the LM head and the PLE context projection: E2B 32 -> 64 lanes, E4B 32 ->
// 128; on an H200 with all three chunks before the wait: +1.2% E2B and +1.6% E4B decode, the LM head's
// isolated optima in bench/labs/gemv_bench.cu; in bf16-weight plans also the gate/up pairs, not timed; on an
// H100 with two before the wait, two chunks a lane, E2B's LM head at 128 lanes measured +0.3% / +0.1%, noise,
// not taken). NF4 with K <= kGemvXsMax (x staged in shared memory, GV_XS_MAX in
// kernels/cuda/decode_gemv.cu): the fewest lanes that give about 40K threads, at most C / 2 (at least two
// chunks a lane), or C when a row has 64 chunks or more and that stays within 40K threads; then up to 32
// lanes so that every chunk comes before the wait (E2B's q/k/v, C = 48: 16 -> 32 lanes, +1.1% E2B decode on
// an H100; E4B's q/k/v, C = 80, at 64 lanes, two warps a row reduced through shared memory, lost 1.2%). Other
// NF4 (the down projections): the fewest lanes giving about 40K threads. Measured on an H200
// (bench/labs/gemv_bench.cu and end to end with `g4 bench`): E2B attn_o 32 -> 64 and down 64 -> 128 lanes
// +2.7% E2B decode; E4B down 128 -> 64 lanes +1.7% E4B decode (E4B q/k/v at 64 lanes lost 1.4%). Inline so
// bench/labs/gemv_bench.cu, built alone with nvcc, marks the same choice.
inline constexpr int kGemvLaneChunks = 3;
inline constexpr int kGemvXsMax      = 2560;
inline int gemv_lanes(int64_t K, bool nf4, int64_t groups) {
    const int64_t C = K / (nf4 ? 32 : 8); // 16-byte chunks per row
    int L           = 8;
    if (nf4 && K <= kGemvXsMax) {
        while (L < 128 && groups * L < 40960 &&
               ((int64_t)L * 4 <= C || (C >= 64 && (int64_t)L * 2 <= C && groups * L * 2 <= 40960)))
            L *= 2;
        while (L < 32 && (int64_t)L * 2 < C)
            L *= 2; // every chunk before the wait, within one warp
        return L;
    }
    if (nf4) {
        while (L < 128 && groups * L < 40960)
            L *= 2;
        return L;
    }
    while (L < 32 && (int64_t)L * 4 < C)
        L *= 2;
    while (L < 128 && L < C && groups * L < 65536)
        L *= 2;
    // Enough lanes for at most kGemvLaneChunks chunks a lane (the LM head, the PLE context projection).
    while (L < 128 && (int64_t)L * kGemvLaneChunks < C)
        L *= 2;
    return L;
}

// Threads a block of the fused decode MLP (g4_mlp_nf4[_b256], I / 32 blocks): 256 (two blocks an SM) when
// the grid is at most 192 blocks, else 128 (three). bench/labs/mlp_lab.cu on an H100, gate/up +
// down of E2B's narrow layers (I = 6144, 192 blocks): 12.7 us at 128 threads, 11.0 at 256; E2B's wide
// layers (384 blocks) 18.9 / 21.4, E4B (320) 25.5 / 29.0.
inline int mlp_threads(int64_t I) {
    return I / 32 <= 192 ? 256 : 128;
}

// Output replicas of the fused decode MLP (CudaLaunch ip6): kMlpReplicasMax when the grid is at least 384
// blocks, else 1. Its blocks' fp32 atomic adds into the [H] output contend at the wide grids; with R
// replicas, R times fewer meet at each address and the ResNorm after sums them. On an H100 (`g4 bench`,
// docs/performance.md): R = 4 on E2B's 20 wide layers (I = 12288, 384 blocks) alone, decode +1.5% at
// depth 16 (about 1.1 us a layer); on its 15 narrow layers (192 blocks) too, only +1.1%; on E4B (320
// blocks) -0.4%.
inline int mlp_replicas(int64_t I) {
    return I / 32 >= 384 ? plan::kMlpReplicasMax : 1;
}

// The fused decode MLP's arithmetic (CudaLaunch ip7, g4 compile --mlp-precision f16|f32): packed f16
// products (g4_mlp_nf4*_h2: one PRMT, one 32-bit lookup and one HFMA2 a code byte; x and act scaled into f16
// by powers of two; ~1e-3 relative error an MLP against ~5e-7) wherever the weights allow them: f32 block
// scales (not double quant), H % 32 == 0, H <= plan::kMlpF16MaxH. On an H200 (g4 bench): E2B decode
// 743.9 -> 785.4 tok/s at depth 16 against f32 (680.0 -> 709.3 at 4096); in bench/labs/mlp_h2_lab.cu, an MLP
// and a one-block ResNorm: E2B's narrow layers 12.00 -> 10.98 us, E4B 25.59 -> 23.47.
inline bool mlp_f16(bool f16, int64_t H, bool double_quant) {
    return f16 && !double_quant && plan::mlp_f16_width_ok(H);
}
// Threads a block of the f16 kernels: 256 (two blocks an SM) up to 320 blocks (E2B's narrow layers, E4B),
// else 128 (E2B's wide layers, 384 blocks). bench/labs/mlp_h2_lab.cu (H200), with the ResNorm stand-in:
// E4B 25.04 us at 128 threads, 23.47 at 256; E2B wide 18.79 / 18.95.
inline int mlp_threads_f16(int64_t I) {
    return I / 32 <= 320 ? 256 : 128;
}

// Whether the ResNorm between a fused MLP (I, threads a block, output replicas) and the PLE after it runs in
// the PLE's kernel (g4_resnorm_gated_proj). The PLE's 32 blocks (256 threads, ~120 registers at H 1536) are
// launched while the MLP runs and wait beside its blocks: where the MLP leaves an SM with room for one (up to
// 192 blocks of 256 threads: one a block on most of 132 SMs) the fold saves the ResNorm's launch; where it
// does not (E2B's wide layers: 384 blocks of 128 threads, three an SM) that MLP ran 2.3 us longer. On an H200
// (g4 bench): E2B decode 782.1 -> 796.5 tok/s folding its 15 narrow layers, 775.0 folding all 35. One output
// (no replicas: the PLE reads the MLP's output alone).
inline bool ple_fold_after(int64_t I, int mlp_threads, int replicas) {
    return mlp_threads == 256 && I / 32 <= 192 && replicas == 1;
}

// Whether the ResNorm before a packed-f16 MLP (I, threads a block) runs in the MLP's kernel by default: where
// its grid is one wave on a 132-SM Hopper (2 blocks an SM at 256 threads, 3 at 128). Every block then pays
// the ResNorm's loads and block reduction after the wait, ~1 us, in place of the one-block launch's ~1.5 us
// step plus its hand-off; blocks of a second wave would pay it again after the first. On an H200 (g4
// bench): E2B (192 and 384 blocks) decode 810.4 -> 819.1 tok/s. E4B's 320 blocks of 256 threads take two
// waves: not measured, not folded (g4 compile --mlp-fold all folds them).
inline bool mlp_fold_one_wave(int64_t I, int threads) {
    return I / 32 <= (threads == 256 ? 2 : 3) * 132;
}

// The launches of one decode step, covering every op exactly once, in order. Fusions (op sequences):
//   RmsNorm(d, in place) + Add(x, d) [+ Scale] [+ RmsNorm(x_out)]     -> ResNorm
//   a lone full-row RmsNorm(x) -> y with a weight                      -> ResNorm (no residual: t0 x, t5, t6)
//   Scale(ctx) + RmsNorm(ctx, groups) + Add(ctx, tok) + Scale          -> GroupNormAdd
//   Matmul x1..3 sharing x (q, k, v)                                  -> Gemv (epilogue 0)
//   Matmul gate + Matmul up + GeluMul                                 -> Gemv (gate/up pairs)
//   Matmul + GeluMul(y, aux) / Matmul + Softcap                       -> Gemv (epilogue 2 / 3)
//   q_norm + q_rope [+ k_norm + k_rope + v_norm + kv_store]           -> QkvPost
//   the same + a sliding Attention op with one or two kv heads reading q and the caches -> QkvAttn (the
//     runtime falls back to QkvPost + the attention op where the decode kernel does not fit the shape)
//   fuse_mlp (sm_90 plans): Matmul gate + Matmul up + GeluMul + Matmul down, NF4, after a ResNorm that
//     makes their input -> Mlp (g4_mlp_nf4; the compiler stores those down weights kQuantTiled32); and
//     Matmul gate (bf16) + GeluMul(aux) + Matmul projection (bf16) after a ResNorm that makes the gate's
//     input -> GatedProj (g4_gated_proj_bf16); the ResNorm zeroes the fused kernel's output
//   fuse_attn_o (sm_90 plans): the NF4 o Matmul right after a decode Attention op that takes g4_attn_decode
//     (attn_hpg: the plan's cuda.attn_hpg) -> AttnO (the attention's merge in g4_attn_o_nf4; the o weights
//     stored kQuantTiled32; the ResNorm making the layer's q/k/v input zeroes the o output)
//   An Mlp launch followed by the ResNorm that reads its output as d, on the same device, gets
//   mlp_replicas(I) output replicas (ip6; mlp_replicas_all > 0: that many for every such launch:
//   --mlp-replicas); any other Mlp launch gets 1. mlp_f16 picks each Mlp launch's arithmetic (ip7, and its
//   threads, ip5). fold_ple (with fuse_mlp): a ResNorm between an Mlp launch and the GatedProj launch
//   reading its output is run by that GatedProj launch (ResNorm ip1 = 1; g4_resnorm_gated_proj) where the
//   tensors allow it (Matcher::gated_proj_fold) and ple_fold_after takes the MLP (its final threads and
//   replicas). fold_mlp (with fuse_mlp): the ResNorm making a packed-f16 Mlp launch's input is run by that
//   launch (ResNorm ip1 = 2; the _r kernels) where plan::mlp_res_fits takes its width and the tensors allow
//   it (Matcher::mlp_fold); the MLP's output is then zeroed by the ResNorm launch before (its ip2 = y + 1).
//   fold_mlp 0: never, 1: where mlp_fold_one_wave takes the MLP's grid, 2: whatever the grid
//   (g4 compile --mlp-fold).
// A fusion is taken only when the intermediates it skips writing are read by no later op and all its
// ops run on one device. device: per op, the CUDA index it runs on or -1 for the CPU (cross-device
// plans; empty: all on one GPU). CPU ops and copy steps are never fused: each is one Op record, which
// the runtime runs on the CPU or as a copy.
std::vector<plan::CudaLaunch> decode_schedule(const std::vector<plan::PlanOp>& ops,
                                              const std::vector<plan::PlanTensor>& tensors,
                                              const std::vector<int>& device = {}, bool fuse_mlp = false,
                                              bool fuse_attn_o = false, int attn_hpg = 0,
                                              int mlp_replicas_all = 0, bool mlp_f16 = false,
                                              bool fold_ple = false, int fold_mlp = 0);

} // namespace g4::cuda
