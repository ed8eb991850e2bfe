// Gemma 4's config.json and generation_config.json, interpreted (compiler only). Accepts model_type
// "gemma4" (text_config nested; tensors under model.language_model.) and "gemma4_text" (flat; tensors under
// model.), with full-attention head sizes given either as global_head_dim (released checkpoints) or
// per_layer_config (re-saved by recent transformers). Reading the files and parsing the JSON text is the
// compiler's (compiler/config.h).
#pragma once
#include "models/gemma4/model.h"

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace g4::gemma4 {

struct GenerationDefaults {
    std::vector<int> eos_token_ids; // generation stops at any of these
    int bos_token_id         = 2;
    int pad_token_id         = 0;
    bool do_sample           = false;
    float temperature        = 1.0f;
    int top_k                = 0;
    float top_p              = 1.0f;
    float min_p              = 0.0f;
    float repetition_penalty = 1.0f;
};

struct ModelConfig {
    std::string model_type;    // "gemma4" or "gemma4_text"
    std::string tensor_prefix; // "model.language_model." or "model."
    std::string head_dim_form; // "global_head_dim" or "per_layer_config"
    TextHParams text;
    GenerationDefaults generation;
    bool has_vision = false, has_audio = false;
    // Multimodal checkpoints: the towers' config objects as JSON text (parsed by runtime/src/towers,
    // stored verbatim in the plan) and the prompt's special ids (-1 when config.json has none).
    std::string vision_config_json, audio_config_json;
    int image_token_id = -1, boi_token_id = -1, eoi_token_id = -1, video_token_id = -1;
    int audio_token_id = -1, boa_token_id = -1, eoa_token_id = -1;
};

// `config`: config.json's top-level object; `generation()`: generation_config.json parsed, or null when
// there is none (called once, after config.json is read). Throws g4::CompileError naming `source` and the
// field on any problem, and refuses what g4 does not implement.
ModelConfig parse_config(const nlohmann::json& config, const std::function<nlohmann::json()>& generation,
                         const std::string& source);

} // namespace g4::gemma4
