// The one definition of the Gemma 4 text decoder shared by compiler and runtime: hyper-parameters,
// per-layer roles (sliding/full, KV-shared, donor), derived shapes and Hugging Face tensor names.
// Follows transformers' modeling_gemma4.py (docs/gemma4.md: "Shapes", "Configuration keys", "KV sharing").
// Pure data and arithmetic: no I/O, no JSON, no exceptions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace g4::gemma4 {

enum class LayerType : uint8_t { Sliding = 0, Full = 1 };

constexpr int kMaxLayers = 128;

// Text-decoder hyper-parameters, exactly as needed to run the model. Stored in the plan.
struct TextHParams {
    int32_t vocab_size                = 0;
    int32_t hidden_size               = 0; // H
    int32_t intermediate_size         = 0; // F (doubled on KV-shared layers when use_double_wide_mlp)
    int32_t num_layers                = 0; // L
    int32_t num_heads                 = 0; // query heads (same on every layer)
    int32_t num_kv_heads              = 0; // sliding layers
    int32_t num_kv_heads_full         = 0; // full layers (num_global_key_value_heads, else num_kv_heads)
    int32_t head_dim                  = 0; // sliding layers (256 in E2B/E4B)
    int32_t head_dim_full             = 0; // full layers (global_head_dim, 512)
    int32_t sliding_window            = 0; // keys visible to a query on sliding layers, itself included
    int32_t num_kv_shared_layers      = 0;
    int32_t use_double_wide_mlp       = 0;
    int32_t ple_dim                   = 0; // hidden_size_per_layer_input (0 = no PLE)
    int32_t ple_vocab_size            = 0; // vocab_size_per_layer_input
    int32_t max_position_embeddings   = 0;
    int32_t bos_token_id              = 2;
    int32_t pad_token_id              = 0;
    float rms_norm_eps                = 1e-6f;
    float final_logit_softcap         = 0.0f; // 0 = none
    float rope_theta_sliding          = 10000.0f;
    float rope_theta_full             = 1000000.0f;
    float partial_rotary_full         = 1.0f; // proportional RoPE fraction on full layers
    float partial_rotary_sliding      = 1.0f;
    int32_t rope_full_proportional    = 1; // 1: "proportional" (zero inv_freq tail); 0: "default"
    int32_t rope_sliding_proportional = 0;
    LayerType layer_types[kMaxLayers] = {};
};

// Role of one layer, derived from the hyper-parameters (HF Gemma4TextConfig.kv_sharing_modes; docs/gemma4.md
// "KV sharing").
struct LayerInfo {
    LayerType type;
    int head_dim; // 256/512
    int num_kv_heads;
    int ff_dim;     // MLP intermediate width of this layer
    bool kv_shared; // reads K/V of kv_source, owns no cache and no k/v weights in use
    bool donor;     // last non-shared layer of its type
    int kv_source;  // layer whose cache this layer attends to (itself when not shared)
};

// Returns an empty string when the hyper-parameters are consistent, else a description of the problem.
std::string validate(const TextHParams& hp);
LayerInfo layer_info(const TextHParams& hp, int layer);
int first_kv_shared_layer(const TextHParams& hp);
const char* layer_type_name(LayerType t); // "sliding_attention" / "full_attention"

// RoPE inverse frequencies for one layer type, computed in float32 exactly as transformers does:
// inv_freq[k] = 1 / theta ** (float(2k) / head_dim) for the rotated pairs, 0 for the pass-through tail
// ("proportional" rope; docs/gemma4.md "RoPE"). Returns head_dim/2 values.
std::vector<float> rope_inv_freq(const TextHParams& hp, LayerType t);

// Embedding scale sqrt(H) as HF applies it: the fp32 buffer cast to the weight dtype
// (bf16-rounded when the model runs in bf16; exact for float32 runs).
float embed_scale(const TextHParams& hp, bool bf16_weights);

// Hugging Face tensor names relative to the text-model prefix ("model.language_model." for the
// multimodal checkpoint, "model." for Gemma4ForCausalLM).
std::string layer_tensor(int layer, const char* suffix); // "layers.N.<suffix>"

} // namespace g4::gemma4
