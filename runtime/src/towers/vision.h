// Gemma 4 vision tower on the CPU: patch embedder, bidirectional encoder with 2-D RoPE, k x k
// average pooling, sqrt(hidden) scale and the embed_vision projection into the text model's width.
// Matches Hugging Face transformers' Gemma4VisionModel + Gemma4MultimodalEmbedder run in float32
// (get_image_features' pooler_output), one image at a time, from HF-style pixel_values rows.
#pragma once
#include "kernels/cpu/cpu.h"
#include "runtime/src/towers/tower.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace g4::towers {

struct VisionHParams { // from config.json "vision_config" (+ the text hidden size)
    int hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
        patch_size, pooling_kernel_size, position_embedding_size;
    float rms_norm_eps, rope_theta;
    bool use_clipped_linears;
    int text_hidden_size; // output width (embed_vision projection rows)
    Precision precision =
        Precision::F32; // not in config.json: set by the caller before init (plan META towers)
};

// Parses the JSON text of config.json's "vision_config" object. Shape keys (hidden_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, intermediate_size, patch_size,
// pooling_kernel_size, position_embedding_size) are required; the others default as in HF's
// Gemma4VisionConfig (rms_norm_eps 1e-6, rope theta 100 "axial", use_clipped_linears false).
// Unsupported settings (standardize true, an activation other than gelu_pytorch_tanh, attention_bias,
// a rope type other than axial) are errors. Returns "" or a message naming the bad or missing key.
// The hand-written tower's copy; the compiler reads the config with gemma4::parse_vision_config.
std::string parse_vision_hparams(const std::string& vision_config_json, int text_hidden_size,
                                 VisionHParams* out);

// Every weight the tower reads, names relative to "model." (the 0-d clip bounds only when
// use_clipped_linears), in a fixed order.
std::vector<std::string> vision_weight_names(const VisionHParams& hp);

class VisionTower {
public:
    // Resolves and shape-checks every weight (F32 or BF16) and fixes the largest image it will take:
    // max_patches patches (HF: max_soft_tokens * pooling_kernel_size^2). Returns "" or an error.
    std::string init(const VisionHParams& hp, const Lookup& lookup, int max_patches);
    size_t scratch_bytes() const;         // caller allocates this once (64-byte aligned)
    size_t thread_scratch_floats() const; // per-thread floats needed in the cpu::Context
    // One image. patches [n_patches, 3*patch_size^2]: pixel values in [0,1] laid out as HF's pixel_values
    // rows; pos [n_patches, 2] = (x, y) as HF's image_position_ids. Trailing HF padding rows (pos (-1,-1))
    // may be passed and are ignored, so n_patches <= max_patches counts real plus padding rows. The real
    // positions must cover a grid_w x grid_h grid exactly once, both multiples of pooling_kernel_size,
    // inside the position table. Writes out [n_soft, text_hidden_size] (HF get_image_features rows, in
    // HF's order: pooled cell cx + (grid_w/k)*cy); *n_soft = (grid_h/k)*(grid_w/k). Returns "" or an
    // error. Thread-compatible (const; all state lives in `scratch` and ctx's per-thread scratch).
    std::string forward(const cpu::Context& ctx, const float* patches, const int32_t* pos, int n_patches,
                        void* scratch, float* out, int* n_soft) const;

    // The patch grid of one image, validated as forward() does: n real patches (HF padding rows dropped) on a
    // gw x gh grid. seen [max_patches] int32 scratch receives, for grid cell x + gw*y, 1 + the patch index
    // there.
    struct Grid {
        int n = 0, gw = 0, gh = 0;
    };
    std::string check_grid(const int32_t* pos, int n_patches, int32_t* seen, Grid* g) const;
    // The pooling cells' patches: idx [cells, k^2], each cell's patch indices in increasing order (the
    // order forward() sums them in). seen as check_grid left it.
    void pool_index(const Grid& g, const int32_t* seen, int32_t* idx) const;

    // The GPU forward's device buffer (runtime/src/cuda/vision.cpp), byte offsets, sized for max_patches:
    // steps (two Step structs: rows n, rows cells), pos [n, 2] and pool index [cells, k^2] int32, pixels x
    // [n, pin], z / a / t [n, H], c [n, max(H, I, heads*D)] clamped linear input, q [n, heads*D], k / v
    // [n, kv_heads*D] (dense: the flash kernel's cache layout), o [n, heads*D], gate / up [n, I], out
    // [cells, text_hidden]. The compiler counts `total` in the GPU's memory plan.
    struct GpuLayout {
        size_t steps, pos, idx, x, z, a, t, c, q, k, v, o, g, u, out, total;
    };
    const GpuLayout& gpu_layout() const { return gpu_; }
    // Host scratch of the GPU forward (seen and the pool index, 2 * max_patches int32).
    size_t gpu_host_scratch_bytes() const { return (size_t)max_patches_ * 8; }

    struct Linear { // Gemma4ClippableLinear: clamp(clamp(x, in) . W^T, out); bounds +-inf if unclipped
        const Tensor* w = nullptr; // [out, in]
        float in_min, in_max, out_min, out_max;
    };
    struct Layer {
        Linear q, k, v, o, gate, up, down;
        const Tensor *ln_in, *ln_post_attn, *ln_pre_ff, *ln_post_ff; // [hidden]
        const Tensor *q_norm, *k_norm;                               // [head_dim]
    };
    const std::vector<Layer>& layers() const { return layers_; }
    const Tensor* patch_proj() const { return patch_proj_; } // [hidden, 3*patch^2]
    const Tensor* pos_table() const { return pos_table_; }   // [2, position_embedding_size, hidden]
    const Tensor* embed_proj() const { return embed_proj_; } // [text_hidden, hidden]

    const VisionHParams& hparams() const { return hp_; }
    int max_patches() const { return max_patches_; }
    int max_soft_tokens() const { return max_patches_ / (hp_.pooling_kernel_size * hp_.pooling_kernel_size); }

private:
    struct Layout { // float offsets into the scratch buffer
        size_t z, a, t, c, r, seen, kv, total;
        int64_t ldc, ldr;
    };

    void linear(const cpu::Context& ctx, const Linear& l, const float* x, int64_t ldx, int rows, int64_t in,
                int64_t outw, float* clamp_buf, float* y, int64_t ldy) const;
    void attention(const cpu::Context& ctx, const float* q, const float* k, const float* v, int64_t ldq,
                   int64_t ldkv, int n, float* o, float* kv) const;

    VisionHParams hp_{};
    int max_patches_          = 0;
    bool ready_               = false;
    const Tensor* patch_proj_ = nullptr; // [hidden, 3*patch^2]
    const Tensor* pos_table_  = nullptr; // [2, position_embedding_size, hidden]
    const Tensor* embed_proj_ = nullptr; // [text_hidden, hidden]
    std::vector<Layer> layers_;
    std::vector<float> rope_cos_, rope_sin_; // [position_embedding_size, head_dim/4]
    Layout lay_{};
    GpuLayout gpu_{};
};

} // namespace g4::towers
