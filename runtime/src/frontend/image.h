// Image preprocessing on the CPU for patch-pooling vision encoders, matching Hugging Face's default image
// processor of such models (transformers 5.23, torchvision backend): aspect-ratio-preserving target size,
// bicubic antialiased resize of the uint8 image exactly as torch's CPU uint8 kernel does it (Pillow-style
// int16 fixed-point weights, horizontal pass then vertical pass, each rounded and clamped to uint8), rescale
// by 1/255, patchify. Nothing is allocated: the caller provides scratch sized by preprocess_scratch_bytes().
#pragma once
#include "kernels/cpu/cpu.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace g4::towers {

struct ImageLayout {
    int out_h = 0, out_w = 0;   // resized size in pixels (multiples of patch*pool)
    int grid_h = 0, grid_w = 0; // patches per column / row
    int n_patches = 0;          // grid_h * grid_w
    int n_soft    = 0;          // soft tokens = (grid_h/pool) * (grid_w/pool)
};

// The HF processor's target size for an in_h x in_w image with at most max_soft_tokens soft tokens
// (max_patches = max_soft_tokens * pool^2), including its special cases for extreme aspect ratios (a side
// that would round to 0 becomes patch*pool and the other floor(long/short)*patch*pool, capped at
// max_soft_tokens*patch*pool). HF accepts only max_soft_tokens in {70, 140, 280, 560, 1120}; any positive
// budget is accepted here.
std::string image_layout(int in_h, int in_w, int max_soft_tokens, int patch, int pool, ImageLayout* out);

// Scratch for preprocess_image of any image with at most max_in_pixels input pixels (h*w): the resampling
// weight tables (int16, O(in_h + in_w + out_h + out_w)) and one uint8 row. Worst case (a 1-pixel-wide image)
// is about 8 bytes per input pixel; typical photos need far less (preprocess_scratch_bytes_for).
size_t preprocess_scratch_bytes(int64_t max_in_pixels, int max_soft_tokens, int patch, int pool);
// The exact scratch one in_h x in_w image needs (0 if the arguments are invalid).
size_t preprocess_scratch_bytes_for(int in_h, int in_w, int max_soft_tokens, int patch, int pool);
// What a session reserves for preprocess_image: preprocess_scratch_bytes, capped at kPreprocessReserveCap (8
// MiB, which covers every image up to 16M pixels with an aspect ratio below ~1:1500); an image that needs
// more (preprocess_scratch_bytes_for) is refused by the session with both figures.
constexpr size_t kPreprocessReserveCap = 8u << 20;
size_t preprocess_reserve_bytes(int64_t max_in_pixels, int max_soft_tokens, int patch, int pool);

// rgb [in_h, in_w, 3] uint8 (row-major, RGB). Writes patches [n_patches, 3*patch*patch] in HF's pixel_values
// row layout (within a patch: row, column, channel) and pos [n_patches, 2] = (x, y) as HF's
// image_position_ids (real patches only, no padding rows). patches must hold max_soft_tokens*pool^2*3*patch^2
// floats (it is also used as the int32 accumulator of the vertical pass); pos max_soft_tokens*pool^2*2 ints.
// Returns "" or an error (bad arguments, empty image, scratch too small). ctx (optional): blocks of output
// rows run on its pool, each thread's row buffer in its per-thread scratch (at least
// preprocess_thread_floats floats, else one thread does it all); bit-identical to the one-thread result.
std::string preprocess_image(const uint8_t* rgb, int in_h, int in_w, int max_soft_tokens, int patch, int pool,
                             void* scratch, size_t scratch_bytes, float* patches, int32_t* pos,
                             ImageLayout* layout, const cpu::Context* ctx = nullptr);
// Per-thread scratch floats preprocess_image uses with a pool: one resampled row of the widest output.
size_t preprocess_thread_floats(int max_soft_tokens, int patch, int pool);

} // namespace g4::towers
