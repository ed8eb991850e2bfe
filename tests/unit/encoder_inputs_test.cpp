// rt::check_patch_grid / rt::patch_pool_index (runtime/src/encoder_inputs.h): the patch-grid inputs of an
// encoder program, on small hand-made grids.
#include "runtime/src/encoder_inputs.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace g4;

namespace {

bool has(const std::string& s, const char* what) {
    return s.find(what) != std::string::npos;
}

} // namespace

// A 4 x 2 grid given column-major, then two padding rows: 2 x 2 cells, each cell's patches ascending.
TEST(EncoderInputs, GridAndPoolIndex) {
    std::vector<int32_t> pos;
    for (int x = 0; x < 4; ++x)
        for (int y = 0; y < 2; ++y)
            pos.push_back(x), pos.push_back(y);
    pos.insert(pos.end(), {-1, -1, -1, -1});
    std::vector<int32_t> seen(10);
    rt::PatchGrid g;
    ASSERT_EQ(rt::check_patch_grid(pos.data(), 10, 10, 2, 8, seen.data(), &g), "");
    EXPECT_EQ(g.n, 8);
    EXPECT_EQ(g.gw, 4);
    EXPECT_EQ(g.gh, 2);
    std::vector<int32_t> idx(2 * 4);
    rt::patch_pool_index(g, 2, seen.data(), idx.data());
    EXPECT_EQ(idx, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
    std::vector<int32_t> one(8);
    rt::PatchGrid g1;
    ASSERT_EQ(rt::check_patch_grid(pos.data(), 8, 8, 1, 8, seen.data(), &g1), "");
    rt::patch_pool_index(g1, 1, seen.data(), one.data());
    EXPECT_EQ(one, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(EncoderInputs, BadGridsAreRefused) {
    std::vector<int32_t> seen(8);
    rt::PatchGrid g;
    std::vector<int32_t> dup = {0, 0, 1, 0, 0, 0, 1, 1};
    EXPECT_TRUE(has(rt::check_patch_grid(dup.data(), 4, 8, 1, 8, seen.data(), &g), "share position"));
    std::vector<int32_t> out = {0, 0, 9, 0};
    EXPECT_TRUE(has(rt::check_patch_grid(out.data(), 2, 8, 1, 8, seen.data(), &g), "outside"));
    std::vector<int32_t> pad = {-1, -1, 0, 0};
    EXPECT_TRUE(has(rt::check_patch_grid(pad.data(), 2, 8, 1, 8, seen.data(), &g), "padding"));
    std::vector<int32_t> odd = {0, 0, 1, 0};
    EXPECT_TRUE(has(rt::check_patch_grid(odd.data(), 2, 8, 2, 8, seen.data(), &g), "pooling cells"));
    EXPECT_TRUE(has(rt::check_patch_grid(odd.data(), 9, 8, 1, 8, seen.data(), &g), "9 patches given"));
    EXPECT_TRUE(has(rt::check_patch_grid(odd.data(), 0, 8, 1, 8, seen.data(), &g), "0 patches given"));
}
