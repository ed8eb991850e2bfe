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

// About 384 blocks (three a multiprocessor of a 132-SM GPU), each warp keeping at least 2 K blocks of 64;
// 8 column groups a block where the weight has them. On an H200 at 16 rows, within 10% of the fastest grid
// of the sweep of bench/labs/mm_rows_tc_bench.cu at the projection shapes of Gemma 4 E2B.
inline RowsTcGrid rows_tc_grid(int64_t N, int64_t K) {
    constexpr int64_t kBlocks = 384;
    const int64_t groups = (N + kRowsTcCols - 1) / kRowsTcCols, kb = std::max<int64_t>(1, K / 64);
    RowsTcGrid g;
    while (g.wn > 2 && groups < g.wn)
        g.wn /= 2;
    const int64_t bx  = (groups + g.wn - 1) / g.wn;
    int64_t splits    = std::clamp<int64_t>((kBlocks + bx - 1) / bx, 1, std::max<int64_t>(1, kb / 2));
    const int64_t kps = (kb + splits - 1) / splits;
    g.splits          = (int)((kb + kps - 1) / kps);
    return g;
}

// Floats of the partial sums g4_mm_rows_tcs_* needs for an [N, K] weight (0: one split).
inline uint64_t rows_tc_part_floats(int64_t N, int64_t K) {
    const RowsTcGrid g = rows_tc_grid(N, K);
    return g.splits > 1 ? (uint64_t)g.splits * kRowsTcMaxRows * (uint64_t)N : 0;
}

} // namespace g4::cuda_ws
