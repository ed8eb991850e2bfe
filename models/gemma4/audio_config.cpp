// Gemma 4 audio configuration parsing and the feature extractor's constants (see audio_config.h).
#include "models/gemma4/audio_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

namespace g4::gemma4 {

std::string parse_audio_hparams(const std::string& audio_config_json, int text_hidden_size,
                                AudioHParams* out) {
    nlohmann::json j = nlohmann::json::parse(audio_config_json, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return "audio_config: not a JSON object";
    AudioHParams hp{};
    std::string err;
    auto num = [&](const char* key, double def) -> double { // HF Gemma4AudioConfig defaults when absent
        if (!j.contains(key) || j[key].is_null()) return def;
        if (!j[key].is_number()) {
            if (err.empty()) err = std::string("audio_config.") + key + ": expected a number";
            return def;
        }
        return j[key].get<double>();
    };
    auto integer = [&](const char* key, int def, int min) -> int {
        double v = num(key, def);
        if (v != std::floor(v) || v < min || v > 1e8) { // NaN fails the first test
            if (err.empty())
                err = std::string("audio_config.") + key + ": expected an integer >= " + std::to_string(min) +
                      ", got " + std::to_string(v);
            return def; // never converted: the value may not fit an int
        }
        return (int)v;
    };
    hp.hidden_size                    = integer("hidden_size", 1024, 2);
    hp.num_hidden_layers              = integer("num_hidden_layers", 12, 0);
    hp.num_attention_heads            = integer("num_attention_heads", 8, 1);
    hp.conv_kernel_size               = integer("conv_kernel_size", 5, 1);
    hp.attention_chunk_size           = integer("attention_chunk_size", 12, 1);
    hp.attention_context_left         = integer("attention_context_left", 13, 2);
    hp.attention_context_right        = integer("attention_context_right", 0, 0);
    hp.output_proj_dims               = integer("output_proj_dims", 1536, 1);
    hp.attention_logit_cap            = (float)num("attention_logit_cap", 50.0);
    hp.attention_invalid_logits_value = (float)num("attention_invalid_logits_value", -1e9);
    hp.residual_weight                = (float)num("residual_weight", 0.5);
    hp.rms_norm_eps                   = (float)num("rms_norm_eps", 1e-6);
    hp.gradient_clipping =
        (float)std::min(num("gradient_clipping", 1e10), (double)std::numeric_limits<float>::max());
    hp.use_clipped_linears = true;
    if (j.contains("use_clipped_linears") && !j["use_clipped_linears"].is_null()) {
        if (!j["use_clipped_linears"].is_boolean())
            return "audio_config.use_clipped_linears: expected true or false";
        hp.use_clipped_linears = j["use_clipped_linears"].get<bool>();
    }
    hp.subsampling_conv_channels[0] = 128;
    hp.subsampling_conv_channels[1] = 32;
    if (j.contains("subsampling_conv_channels")) {
        const auto& c = j["subsampling_conv_channels"];
        if (!c.is_array() || c.size() != 2 || !c[0].is_number_integer() || !c[1].is_number_integer() ||
            c[0].get<int64_t>() < 4 || c[1].get<int64_t>() < 1 || c[0].get<int64_t>() > (1 << 20) ||
            c[1].get<int64_t>() > (1 << 20))
            return "audio_config.subsampling_conv_channels: expected two integers [4 <= c0, 1 <= c1, both <= "
                   "1048576]";
        hp.subsampling_conv_channels[0] = int(c[0].get<int64_t>());
        hp.subsampling_conv_channels[1] = int(c[1].get<int64_t>());
    }
    if (!err.empty()) return err;
    if (j.contains("hidden_act") && j["hidden_act"] != "silu")
        return "audio_config.hidden_act: only \"silu\" is supported (Gemma 4), got " + j["hidden_act"].dump();
    if (hp.hidden_size % hp.num_attention_heads != 0)
        return "audio_config: hidden_size " + std::to_string(hp.hidden_size) +
               " is not a multiple of num_attention_heads " + std::to_string(hp.num_attention_heads);
    if (hp.hidden_size % 2 != 0)
        return "audio_config.hidden_size must be even (sin/cos relative position table)";
    if (hp.attention_context_right != 0)
        return "audio_config.attention_context_right = " + std::to_string(hp.attention_context_right) +
               " is not supported (Gemma 4 audio attention looks only at past frames: 0)";
    if (!(hp.attention_logit_cap > 0)) return "audio_config.attention_logit_cap must be > 0";
    if (!(hp.rms_norm_eps > 0)) return "audio_config.rms_norm_eps must be > 0";
    if (!(hp.gradient_clipping > 0)) return "audio_config.gradient_clipping must be > 0";
    if (text_hidden_size <= 0)
        return "audio encoder: text hidden size must be > 0, got " + std::to_string(text_hidden_size);
    hp.text_hidden_size = text_hidden_size;
    hp.mel_bins         = 4 * (hp.subsampling_conv_channels[0] / 4);
    *out                = hp;
    return "";
}

AudioFrontEnd audio_front_end(const AudioHParams& hp) {
    AudioFrontEnd fe;
    fe.mel_bins = hp.mel_bins;
    return fe;
}

std::vector<std::string> audio_weight_names(const AudioHParams& hp) {
    std::vector<std::string> v;
    const std::string s = "audio_tower.subsample_conv_projection.";
    for (const char* n : {"layer0.conv.weight", "layer0.norm.weight", "layer1.conv.weight",
                          "layer1.norm.weight", "input_proj_linear.weight"})
        v.push_back(s + n);
    auto clip = [&](const std::string& p) {
        v.push_back(p + ".linear.weight");
        if (hp.use_clipped_linears)
            for (const char* b : {".input_min", ".input_max", ".output_min", ".output_max"})
                v.push_back(p + b);
    };
    for (int l = 0; l < hp.num_hidden_layers; ++l) {
        const std::string p = "audio_tower.layers." + std::to_string(l) + ".";
        for (const char* ff : {"feed_forward1", "feed_forward2"}) {
            clip(p + ff + ".ffw_layer_1");
            clip(p + ff + ".ffw_layer_2");
            v.push_back(p + ff + ".pre_layer_norm.weight");
            v.push_back(p + ff + ".post_layer_norm.weight");
        }
        for (const char* n : {"q_proj", "k_proj", "v_proj", "post"})
            clip(p + "self_attn." + n);
        v.push_back(p + "self_attn.relative_k_proj.weight");
        v.push_back(p + "self_attn.per_dim_scale");
        clip(p + "lconv1d.linear_start");
        clip(p + "lconv1d.linear_end");
        v.push_back(p + "lconv1d.depthwise_conv1d.weight");
        v.push_back(p + "lconv1d.pre_layer_norm.weight");
        v.push_back(p + "lconv1d.conv_norm.weight");
        for (const char* n : {"norm_pre_attn", "norm_post_attn", "norm_out"})
            v.push_back(p + n + ".weight");
    }
    v.push_back("audio_tower.output_proj.weight");
    v.push_back("audio_tower.output_proj.bias");
    v.push_back("embed_audio.embedding_projection.weight");
    return v;
}

int64_t audio_valid_frames(const AudioFrontEnd& fe, int64_t n_samples) {
    // Frame f covers padded samples [hop f, hop f + frame_length] (frame_length / 2 zeros prepended); it is
    // valid when the last of them is real audio.
    const int64_t first = fe.frame_length + 1 - fe.frame_length / 2; // 161: the end of frame 0's window
    if (n_samples < first) return 0;
    return (n_samples - first) / fe.hop_length + 1;
}

int audio_soft_tokens(const AudioFrontEnd& fe, int64_t n_samples) {
    const int64_t f = audio_valid_frames(fe, std::min(n_samples, fe.max_samples));
    const int64_t t = ((f + 1) / 2 + 1) / 2;
    return (int)std::min<int64_t>(t, fe.max_tokens);
}

} // namespace g4::gemma4
