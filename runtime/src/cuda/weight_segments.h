// Where a GPU's copy of the plan's weights puts each byte range (runtime/src/cuda/backend.cpp uploads them
// into one allocation). Header-only, no CUDA: tests/unit/weight_segments_test.cpp checks it without a GPU.
#pragma once
#include "runtime/plan/plan_format.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace g4::cuda_rt {

// Plan weight bytes [begin, end) live at device offset at.
struct WeightSeg {
    uint64_t begin, end, at;
};

// The plan's ranges for one GPU, less the hole [hole_b, hole_e) (a weight kept in host memory; empty:
// hole_e <= hole_b), packed in order, each segment at an offset congruent to its plan offset modulo
// plan::kWeightAlign, so a device base aligned to it (cuMemAlloc's is at least 256 bytes) keeps the
// alignment the compiler gave every weight. Appends to *segs; returns the bytes the allocation needs.
inline uint64_t place_weight_segments(const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                                      uint64_t hole_b, uint64_t hole_e, std::vector<WeightSeg>* segs) {
    uint64_t at = 0;
    auto add    = [&](uint64_t x, uint64_t y) {
        if (y <= x) return;
        at += (x - at) & (plan::kWeightAlign - 1);
        segs->push_back({x, y, at});
        at += y - x;
    };
    for (auto [b, e] : ranges) {
        if (hole_e > hole_b && hole_e > b && hole_b < e)
            add(b, hole_b), add(std::min(e, hole_e), e);
        else
            add(b, e);
    }
    return at;
}

} // namespace g4::cuda_rt
