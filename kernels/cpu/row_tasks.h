// How the CPU GEMMs (kernels/cpu/gemm_bf16.cpp, gemm_bf16_amx.cpp) split a matmul into pool tasks (column
// groups x chunks of rows) and clamp the blocks they write, and how elementwise ops split their rows.
// Included by files compiled once per instruction-set level.
#pragma once
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/level.h"
#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <cstdint>

namespace g4::cpu::G4_CPU_NS {

// Splits `rows` into chunks of whole Block-row blocks, at least MinBlocks blocks a chunk where the rows
// allow, so that groups x chunks tasks balance the pool (about 4 a thread); task(g, r0, r1, th) runs each
// non-empty one on pool thread th.
template <int Block, int MinBlocks, typename Task>
void for_row_tasks(const Context& c, int rows, int64_t groups, Task&& task) {
    const int64_t want = 4LL * c.pool->size();
    const int chunks =
        (int)std::clamp<int64_t>((want + groups - 1) / groups, 1, std::max(1, rows / (MinBlocks * Block)));
    const int chunk_rows = ((rows + chunks - 1) / chunks + Block - 1) / Block * Block;
    c.pool->parallel_for(groups * chunks, [&](int64_t t, int th) {
        const int64_t g = t % groups;
        const int r0 = (int)(t / groups) * chunk_rows, r1 = std::min(rows, r0 + chunk_rows);
        if (r0 < r1) task(g, r0, r1, th);
    });
}

// Elementwise work below this many elements stays on the calling thread: handing it out costs more.
inline constexpr int64_t kInlineElems = 1 << 14;

// Rows [0, rows) of an elementwise op (cols values a row) as f(t) for each row t: on the calling thread below
// kInlineElems values, else in about 4 blocks of consecutive rows a pool thread, so that the pool hands out
// a block rather than each row (a row of a tower activation is about a microsecond of work).
template <typename F> void for_rows(const Context& c, int rows, int64_t cols, F&& f) {
    const int64_t blocks = std::min<int64_t>(rows, 4LL * c.pool->size());
    if ((int64_t)rows * cols < kInlineElems || c.pool->size() == 1 || blocks <= 1) {
        for (int t = 0; t < rows; ++t)
            f(t);
        return;
    }
    c.pool->parallel_for(blocks, [&](int64_t b, int) {
        for (int t = (int)(rows * b / blocks), end = (int)(rows * (b + 1) / blocks); t < end; ++t)
            f(t);
    });
}

// y[i * ldy + j] = min(max(y, lo), hi) for i < rows, j < cols, a NaN kept: MatmulArgs' output clamp, run on
// a block of y its GEMM task has just written.
inline void clamp_block(float* y, int64_t ldy, int rows, int64_t cols, float lo, float hi) {
    for (int i = 0; i < rows; ++i) {
        float* r = y + (int64_t)i * ldy;
        for (int64_t j = 0; j < cols; ++j)
            r[j] = clamp_value(r[j], lo, hi);
    }
}

// Whether MatmulArgs asks its GEMM to clamp x (as it rounds it) or y (as its blocks are written).
inline bool clamps_x(const MatmulArgs& a) {
    return bounded(a.x_lo, a.x_hi);
}
inline bool clamps_y(const MatmulArgs& a) {
    return bounded(a.y_lo, a.y_hi);
}

} // namespace g4::cpu::G4_CPU_NS
