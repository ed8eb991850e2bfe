// Inputs of an encoder program over a patch grid (runtime/src/encoder_program.h): the grid check and the
// pooling-cell index built from (x, y) patch positions, independent of the model that defined the program.
#pragma once
#include <cstdint>
#include <string>

namespace g4::rt {

struct PatchGrid {
    int n = 0, gw = 0, gh = 0; // real patches (trailing (-1, -1) padding rows dropped), grid width, height
};

// Validates n_patches (x, y) positions: 1..max_patches rows, padding (-1, -1) only after the real rows,
// positions inside [0, table), covering a gw x gh grid of whole cell x cell pooling cells exactly once.
// seen [max_patches] int32 receives, for grid cell x + gw*y, 1 + the patch index there. Returns "" or the
// problem.
std::string check_patch_grid(const int32_t* pos, int n_patches, int max_patches, int cell, int table,
                             int32_t* seen, PatchGrid* g);

// The pooling cells' patches: idx [cells, cell^2], each cell's patch indices in increasing order, cells in
// row-major order (cx + (gw/cell)*cy); with cell 1, cell i is patch i. seen as check_patch_grid left it.
void patch_pool_index(const PatchGrid& g, int cell, const int32_t* seen, int32_t* idx);

} // namespace g4::rt
