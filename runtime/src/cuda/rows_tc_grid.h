// The grid of the tensor-core row matmuls g4_mm_rows_tcs_* (kernels/cuda/matmul_rows_tc.cu) for an [N, K]
// weight, shared by the runtime's launch and the compiler's memory plan (workspace.h sizes the partial sums
// from it). Fixed for every GPU, so a plan's memory figure does not depend on the device it runs on.
// Header-only; no CUDA dependency.
#pragma once
#include <algorithm>
#include <cstdint>

namespace g4::cuda_ws {

inline constexpr int kRowsTcMaxRows = 16; // rows of one launch
inline constexpr int kRowsTcCols    = 16; // a warp's output columns (2 n8 tiles, TCS_TILES)

// wn: column groups of a block (2, 4 or 8; its 8 warps split the block's K range by 8 / wn). splits: K
// ranges over blocks (blockIdx.y); above 1 each writes partial sums [splits, rows, N] to the lane's part
// buffer and g4_mm_rows_tcs_sum adds them.
struct RowsTcGrid {
    int wn = 8, splits = 1;
};

// At least 192 blocks, and up to 384 where that gives K splits of 6 K blocks (of 64), each warp keeping at
// least 2 K blocks; no split below 8 K blocks; 8 column groups a block where the weight has them. On an H200
// at 16 rows (bench/labs/mm_rows_tc_bench.cu at the projection shapes of Gemma 4 E2B): at every NF4 shape
// within 0.3 us or 13% of the fastest grid of the sweep, bf16 within 0.6 us but for the 8960x1536 per-layer
// input projection (17.0 us against 14.2, once a step).
inline RowsTcGrid rows_tc_grid(int64_t N, int64_t K) {
    constexpr int64_t kMinBlocks = 192, kMaxBlocks = 384, kPerSplit = 6;
    const int64_t groups = (N + kRowsTcCols - 1) / kRowsTcCols, kb = std::max<int64_t>(1, K / 64);
    RowsTcGrid g;
    while (g.wn > 2 && groups < g.wn)
        g.wn /= 2;
    const int64_t bx = (groups + g.wn - 1) / g.wn;
    auto at_least    = [&](int64_t blocks) { return (blocks + bx - 1) / bx; };
    const int64_t want =
        std::max(at_least(kMinBlocks), std::min((kb + kPerSplit - 1) / kPerSplit, at_least(kMaxBlocks)));
    const int64_t splits = kb < 8 ? 1 : std::clamp<int64_t>(want, 1, kb / 2);
    const int64_t kps    = (kb + splits - 1) / splits;
    g.splits             = (int)((kb + kps - 1) / kps);
    return g;
}

// Floats of the partial sums g4_mm_rows_tcs_* needs for an [N, K] weight (0: one split).
inline uint64_t rows_tc_part_floats(int64_t N, int64_t K) {
    const RowsTcGrid g = rows_tc_grid(N, K);
    return g.splits > 1 ? (uint64_t)g.splits * kRowsTcMaxRows * (uint64_t)N : 0;
}

} // namespace g4::cuda_ws
