// Compiler-only graph builder for the Gemma 4 vision encoder (Hugging Face Gemma4VisionModel +
// Gemma4MultimodalEmbedder, float32): emits the "vision" encoder program that turns one image's patches
// into soft tokens of the text model's width. Weights are named relative to "model.".
#pragma once
#include "models/gemma4/graph.h"

#include <functional>
#include <optional>
#include <string>

namespace g4::gemma4 {

struct VisionHParams { // config.json "vision_config" (+ the text hidden size)
    int hidden_size = 0, num_hidden_layers = 0, num_attention_heads = 0, num_key_value_heads = 0,
        head_dim = 0, intermediate_size = 0, patch_size = 0, pooling_kernel_size = 0,
        position_embedding_size = 0;
    float rms_norm_eps = 1e-6f, rope_theta = 100.0f;
    bool use_clipped_linears = false;
    int text_hidden_size     = 0;
};

struct VisionBuildOptions {
    int max_patches   = 0; // patches of the largest image (a multiple of pooling_kernel_size^2)
    int matmul_kernel = 1; // PlanOp ip4 of every matmul: the CPU kernel (1 fp32 GEMM, 2 bf16 GEMM)
    // A 0-d checkpoint tensor's value (ClippableLinear bounds), nullopt when absent.
    std::function<std::optional<float>(const std::string&)> scalar;
};

// The program: inputs pixels [max_patches, 3 * patch^2] f32 (normalised as pixel_mean / pixel_std say),
// positions [max_patches, 2] i32 (x, y) and pool index [max_cells, k^2] i32 (each cell's patches in
// increasing order); output [max_cells, text_hidden]. Row count 0 is the image's patches, 1 its cells.
struct VisionProgram {
    Program graph;
    int pixels = -1, positions = -1, pool_index = -1, output = -1;
    int max_patches = 0, max_cells = 0;
    float pixel_mean = 0.5f, pixel_std = 0.5f; // the patch embedder's 2 * (p - 0.5)
};
VisionProgram build_vision_program(const VisionHParams& hp, const VisionBuildOptions& opt);

} // namespace g4::gemma4
