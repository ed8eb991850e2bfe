// Derived Gemma 4 layer roles and constants (see model.h).
#include "models/gemma4/model.h"

#include <cmath>

namespace g4::gemma4 {

const char* layer_type_name(LayerType t) {
    return t == LayerType::Full ? "full_attention" : "sliding_attention";
}

int first_kv_shared_layer(const TextHParams& hp) {
    return hp.num_layers - hp.num_kv_shared_layers;
}

static int last_non_shared_of_type(const TextHParams& hp, LayerType t) {
    int first_shared = first_kv_shared_layer(hp);
    for (int j = first_shared - 1; j >= 0; --j)
        if (hp.layer_types[j] == t) return j;
    return -1;
}

std::string validate(const TextHParams& hp) {
    auto bad = [](const std::string& s) { return s; };
    if (hp.num_layers <= 0 || hp.num_layers > kMaxLayers) return bad("num_hidden_layers out of range 1..128");
    if (hp.vocab_size <= 0) return bad("vocab_size must be positive");
    if (hp.hidden_size <= 0 || hp.intermediate_size <= 0)
        return bad("hidden_size/intermediate_size must be positive");
    if (hp.num_heads <= 0 || hp.num_kv_heads <= 0 || hp.num_kv_heads_full <= 0)
        return bad("head counts must be positive");
    if (hp.num_heads % hp.num_kv_heads || hp.num_heads % hp.num_kv_heads_full)
        return bad("num_attention_heads must be a multiple of num_key_value_heads");
    if (hp.head_dim <= 0 || hp.head_dim % 2 || hp.head_dim_full <= 0 || hp.head_dim_full % 2)
        return bad("head_dim/global_head_dim must be positive and even");
    if (hp.sliding_window <= 0) return bad("sliding_window must be positive");
    if (hp.num_kv_shared_layers < 0 || hp.num_kv_shared_layers >= hp.num_layers)
        return bad("num_kv_shared_layers must be in 0..num_hidden_layers-1");
    if (hp.ple_dim < 0) return bad("hidden_size_per_layer_input must be >= 0");
    if (hp.ple_dim > 0 && hp.ple_vocab_size <= 0) return bad("vocab_size_per_layer_input must be positive");
    if (hp.num_kv_shared_layers > 0) {
        for (int i = first_kv_shared_layer(hp); i < hp.num_layers; ++i)
            if (last_non_shared_of_type(hp, hp.layer_types[i]) < 0)
                return bad(std::string("KV-shared layer ") + std::to_string(i) + " (" +
                           layer_type_name(hp.layer_types[i]) +
                           ") has no earlier non-shared layer of its type");
    }
    return "";
}

LayerInfo layer_info(const TextHParams& hp, int layer) {
    LayerInfo li{};
    li.type          = hp.layer_types[layer];
    bool full        = li.type == LayerType::Full;
    li.head_dim      = full ? hp.head_dim_full : hp.head_dim;
    li.num_kv_heads  = full ? hp.num_kv_heads_full : hp.num_kv_heads;
    int first_shared = first_kv_shared_layer(hp);
    li.kv_shared     = hp.num_kv_shared_layers > 0 && layer >= first_shared;
    li.donor = hp.num_kv_shared_layers > 0 && !li.kv_shared && last_non_shared_of_type(hp, li.type) == layer;
    li.kv_source = li.kv_shared ? last_non_shared_of_type(hp, li.type) : layer;
    li.ff_dim    = hp.intermediate_size * ((hp.use_double_wide_mlp && li.kv_shared) ? 2 : 1);
    return li;
}

std::vector<float> rope_inv_freq(const TextHParams& hp, LayerType t) {
    bool full         = t == LayerType::Full;
    int dim           = full ? hp.head_dim_full : hp.head_dim;
    float theta       = full ? hp.rope_theta_full : hp.rope_theta_sliding;
    bool proportional = full ? hp.rope_full_proportional : hp.rope_sliding_proportional;
    float partial     = full ? hp.partial_rotary_full : hp.partial_rotary_sliding;
    std::vector<float> inv(dim / 2, 0.0f);
    // "proportional": int(partial * dim // 2) rotated angles with exponent denominator dim; rest 0.
    // "default": all dim/2 angles rotate (partial_rotary_factor is not applied by Gemma 4's default rope).
    int angles = proportional ? (int)std::floor((double)partial * dim / 2.0) : dim / 2;
    for (int k = 0; k < angles && k < dim / 2; ++k) {
        float expo = (float)(2 * k) / (float)dim;
        float p    = (float)std::pow((double)theta, (double)expo); // torch: fp32 pow, correctly rounded
        inv[k]     = 1.0f / p;
    }
    return inv;
}

float embed_scale(const TextHParams& hp, bool bf16_weights) {
    float s = (float)std::sqrt((double)hp.hidden_size);
    if (!bf16_weights) return s;
    uint32_t u;
    static_assert(sizeof(float) == 4);
    __builtin_memcpy(&u, &s, 4);
    u += 0x7FFF + ((u >> 16) & 1); // round to nearest even
    u &= 0xFFFF0000u;
    __builtin_memcpy(&s, &u, 4);
    return s;
}

std::string layer_tensor(int layer, const char* suffix) {
    return "layers." + std::to_string(layer) + "." + suffix;
}

} // namespace g4::gemma4
