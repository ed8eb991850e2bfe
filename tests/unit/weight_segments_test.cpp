// runtime/src/cuda/weight_segments.h without a GPU: a GPU's copy of the plan's weights keeps every plan
// offset modulo plan::kWeightAlign (so 256-byte aligned weights stay so on the device), covers every byte
// of its ranges but the PLE hole once, and packs the segments in order without overlap.
#include "runtime/src/cuda/weight_segments.h"

#include <gtest/gtest.h>

using g4::cuda_rt::place_weight_segments;
using g4::cuda_rt::WeightSeg;

namespace {

void check(const std::vector<std::pair<uint64_t, uint64_t>>& ranges, uint64_t hole_b, uint64_t hole_e) {
    std::vector<WeightSeg> segs;
    const uint64_t bytes = place_weight_segments(ranges, hole_b, hole_e, &segs);
    uint64_t covered = 0, want = 0, prev_end = 0;
    for (auto [b, e] : ranges) {
        want += e - b;
        if (hole_e > hole_b)
            want -= std::min(e, hole_e) > std::max(b, hole_b) ? std::min(e, hole_e) - std::max(b, hole_b) : 0;
    }
    for (const WeightSeg& s : segs) {
        EXPECT_LT(s.begin, s.end);
        EXPECT_EQ(s.at % g4::plan::kWeightAlign, s.begin % g4::plan::kWeightAlign)
            << "segment at plan offset " << s.begin;
        EXPECT_GE(s.at, prev_end);                                    // in order, no overlap
        EXPECT_LT(s.at - prev_end, g4::plan::kWeightAlign);           // at most the alignment's padding
        EXPECT_TRUE(s.end <= hole_b || s.begin >= hole_e) << s.begin; // nothing of the hole
        covered += s.end - s.begin, prev_end = s.at + (s.end - s.begin);
    }
    EXPECT_EQ(covered, want);
    EXPECT_EQ(bytes, prev_end);
}

TEST(WeightSegments, KeepPlanOffsetsModuloTheAlignment) {
    // One GPU: one range from an aligned start; from a 64-byte (older plan) start.
    check({{4096, 1 << 20}}, 0, 0);
    check({{4160, 1 << 20}}, 0, 0);
    // Two groups (the shared embeddings and this GPU's layers), the second starting 64 bytes into a line.
    check({{0, 100000}, {300064, 900000}}, 0, 0);
    // The PLE table on the host: a hole inside the first range, ending at an odd 64-byte unit.
    check({{0, 1000000}, {1200128, 2000000}}, 262144, 262144 + 3 * 64 + 5 * 256);
    // A hole that covers a whole range, and one at a range's very start and end.
    check({{0, 5000}, {8192, 9000}, {10240, 20000}}, 8192, 9000);
    check({{64, 65536}}, 64, 4096);
    check({{64, 65536}}, 60000, 65536);
}

TEST(WeightSegments, AlignedPlansNeedNoPadding) {
    // A plan whose ranges start at multiples of the alignment (as g4 compile writes them) and one hole
    // ending at one: the device copy is exactly the plan's bytes.
    std::vector<WeightSeg> segs;
    const uint64_t a     = g4::plan::kWeightAlign;
    const uint64_t bytes = place_weight_segments({{0, 40 * a + 64}, {50 * a, 90 * a}}, 10 * a, 20 * a, &segs);
    ASSERT_EQ(segs.size(), 3u);
    EXPECT_EQ(segs[0].at, 0u);
    EXPECT_EQ(segs[1].at, 10 * a);
    EXPECT_EQ(segs[2].at, 31 * a); // after 30 a + 64 bytes, the next multiple of a
    EXPECT_EQ(bytes, 71 * a);
}

} // namespace
