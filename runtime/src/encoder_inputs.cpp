// The patch-grid check and pooling-cell index of an encoder program's inputs (see encoder_inputs.h).
#include "runtime/src/encoder_inputs.h"

#include <algorithm>
#include <cstring>

namespace g4::rt {

std::string check_patch_grid(const int32_t* pos, int n_patches, int max_patches, int cell, int table,
                             int32_t* seen, PatchGrid* g) {
    if (n_patches < 1 || n_patches > max_patches)
        return std::to_string(n_patches) + " patches given; it takes 1.." + std::to_string(max_patches) +
               " (max_patches)";
    // Real rows first, padding (-1, -1) only after them.
    int n = n_patches;
    for (int i = 0; i < n_patches; ++i)
        if (pos[2 * i] == -1 && pos[2 * i + 1] == -1) {
            n = i;
            break;
        }
    for (int i = n; i < n_patches; ++i)
        if (pos[2 * i] != -1 || pos[2 * i + 1] != -1)
            return "patch " + std::to_string(i) + " has position (" + std::to_string(pos[2 * i]) + ", " +
                   std::to_string(pos[2 * i + 1]) + ") after padding patch " + std::to_string(n) +
                   "; padding (-1, -1) may only trail the real patches";
    if (n == 0) return "every patch is padding (-1, -1)";

    const int k = cell, P = table;
    int gw = 0, gh = 0;
    for (int i = 0; i < n; ++i) {
        const int x = pos[2 * i], y = pos[2 * i + 1];
        if (x < 0 || y < 0 || x >= P || y >= P)
            return "patch " + std::to_string(i) + " position (" + std::to_string(x) + ", " +
                   std::to_string(y) + ") is outside the position table [0, " + std::to_string(P) + ")";
        gw = std::max(gw, x + 1), gh = std::max(gh, y + 1);
    }
    if ((int64_t)gw * gh != n || gw % k || gh % k)
        return "the " + std::to_string(n) + " patch positions span a " + std::to_string(gw) + " x " +
               std::to_string(gh) + " grid; they must cover a grid of whole " + std::to_string(k) + " x " +
               std::to_string(k) + " pooling cells exactly once";
    std::memset(seen, 0, sizeof(int32_t) * n);
    for (int i = 0; i < n; ++i) {
        int32_t& c = seen[pos[2 * i] + gw * pos[2 * i + 1]];
        if (c)
            return "patches " + std::to_string(c - 1) + " and " + std::to_string(i) + " share position (" +
                   std::to_string(pos[2 * i]) + ", " + std::to_string(pos[2 * i + 1]) + ")";
        c = i + 1;
    }

    *g = {n, gw, gh};
    return "";
}

void patch_pool_index(const PatchGrid& g, int cell, const int32_t* seen, int32_t* idx) {
    const int k = cell, cw = g.gw / k, kk = k * k;
    for (int cy = 0; cy < g.gh / k; ++cy)
        for (int cx = 0; cx < cw; ++cx) {
            int32_t* c = idx + (size_t)(cx + cw * cy) * kk;
            for (int dy = 0; dy < k; ++dy)
                for (int dx = 0; dx < k; ++dx)
                    c[dy * k + dx] = seen[(cx * k + dx) + g.gw * (cy * k + dy)] - 1;
            std::sort(c, c + kk);
        }
    if (k == 1) // cell i is patch i
        for (int i = 0; i < g.n; ++i)
            idx[i] = i;
}

} // namespace g4::rt
