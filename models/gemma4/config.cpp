// Gemma 4 config.json and generation_config.json interpretation (see config.h). Field defaults mirror
// transformers' Gemma4TextConfig.
#include "models/gemma4/config.h"
#include "compiler/error.h"

#include <cmath>
#include <cstdlib>
#include <map>

namespace g4::gemma4 {
namespace {

using json = nlohmann::json;

struct Reader {
    const json& j;
    std::string where;

    bool has(const char* k) const { return j.contains(k) && !j[k].is_null(); }
    [[noreturn]] void fail(const char* k, const std::string& what) const {
        throw CompileError(where + ": field '" + k + "' " + what);
    }
    int64_t integer(const char* k, int64_t def) const {
        if (!has(k)) return def;
        if (!j[k].is_number_integer()) fail(k, "must be an integer");
        return j[k].get<int64_t>();
    }
    double number(const char* k, double def) const {
        if (!has(k)) return def;
        if (!j[k].is_number()) fail(k, "must be a number");
        return j[k].get<double>();
    }
    bool boolean(const char* k, bool def) const {
        if (!has(k)) return def;
        if (!j[k].is_boolean()) fail(k, "must be true or false");
        return j[k].get<bool>();
    }
    std::string string(const char* k, const std::string& def) const {
        if (!has(k)) return def;
        if (!j[k].is_string()) fail(k, "must be a string");
        return j[k].get<std::string>();
    }
    int32_t int32(const char* k, int64_t def, int64_t lo, int64_t hi) const {
        int64_t v = integer(k, def);
        if (v < lo || v > hi)
            fail(k, "= " + std::to_string(v) + " is out of range " + std::to_string(lo) + ".." +
                        std::to_string(hi));
        return (int32_t)v;
    }
};

std::vector<int> id_list(const json& v) {
    std::vector<int> ids;
    if (v.is_number_integer())
        ids.push_back(v.get<int>());
    else if (v.is_array())
        for (auto& e : v)
            if (e.is_number_integer()) ids.push_back(e.get<int>());
    return ids;
}

void parse_rope(const Reader& r, TextHParams& hp) {
    if (!r.has("rope_parameters")) return; // HF defaults already in hp
    const json& rp = r.j["rope_parameters"];
    if (!rp.is_object()) r.fail("rope_parameters", "must be an object");
    for (const char* type : {"sliding_attention", "full_attention"}) {
        if (!rp.contains(type) || rp[type].is_null()) continue;
        Reader t{rp[type], r.where + ": rope_parameters." + type};
        std::string rope_type = t.string("rope_type", "default");
        if (rope_type != "default" && rope_type != "proportional")
            t.fail("rope_type",
                   "= '" + rope_type + "' is not supported (g4 supports default and proportional)");
        if (t.has("factor") && t.number("factor", 1.0) != 1.0) t.fail("factor", "!= 1 is not supported");
        bool full   = std::string(type) == "full_attention";
        float theta = (float)t.number("rope_theta", full ? 1e6 : 1e4);
        float part  = (float)t.number("partial_rotary_factor", 1.0);
        if (full) {
            hp.rope_theta_full        = theta;
            hp.partial_rotary_full    = part;
            hp.rope_full_proportional = rope_type == "proportional";
        } else {
            hp.rope_theta_sliding        = theta;
            hp.partial_rotary_sliding    = part;
            hp.rope_sliding_proportional = rope_type == "proportional";
        }
    }
}

TextHParams parse_text(const json& tc, const std::string& where, const json* top, std::string* form) {
    Reader r{tc, where};
    TextHParams hp;
    hp.vocab_size              = r.int32("vocab_size", 262144, 1, 1 << 24);
    hp.hidden_size             = r.int32("hidden_size", 2304, 1, 1 << 16);
    hp.intermediate_size       = r.int32("intermediate_size", 9216, 1, 1 << 20);
    hp.num_layers              = r.int32("num_hidden_layers", 30, 1, kMaxLayers);
    hp.num_heads               = r.int32("num_attention_heads", 8, 1, 1024);
    hp.num_kv_heads            = r.int32("num_key_value_heads", 4, 1, 1024);
    hp.head_dim                = r.int32("head_dim", 256, 2, 4096);
    hp.sliding_window          = r.int32("sliding_window", 512, 1, 1 << 24);
    hp.num_kv_shared_layers    = r.int32("num_kv_shared_layers", 0, 0, kMaxLayers);
    hp.use_double_wide_mlp     = r.boolean("use_double_wide_mlp", false);
    hp.ple_dim                 = r.int32("hidden_size_per_layer_input", 256, 0, 1 << 16);
    hp.ple_vocab_size          = r.int32("vocab_size_per_layer_input", 262144, 0, 1 << 24);
    hp.max_position_embeddings = r.int32("max_position_embeddings", 131072, 1, 1 << 30);
    hp.rms_norm_eps            = (float)r.number("rms_norm_eps", 1e-6);
    hp.final_logit_softcap     = (float)r.number("final_logit_softcapping", 0.0);
    hp.bos_token_id            = (int32_t)r.integer("bos_token_id", 2);
    hp.pad_token_id            = (int32_t)r.integer("pad_token_id", 0);
    std::string act            = r.string("hidden_activation", "gelu_pytorch_tanh");
    if (act != "gelu_pytorch_tanh")
        r.fail("hidden_activation", "= '" + act + "' is not supported (expected gelu_pytorch_tanh)");
    if (r.boolean("enable_moe_block", false))
        r.fail("enable_moe_block", "= true (MoE Gemma 4) is not supported by g4");
    if (r.boolean("attention_k_eq_v", false))
        r.fail("attention_k_eq_v", "= true is not supported by g4 (E2B/E4B use false)");
    if (r.boolean("attention_bias", false)) r.fail("attention_bias", "= true is not supported by g4");
    std::string bidir = r.string("use_bidirectional_attention", "");
    if (bidir == "all") r.fail("use_bidirectional_attention", "= 'all' is not supported by g4");

    // layer_types: HF default is a 5:1 sliding:full pattern; the last layer is always full.
    if (r.has("layer_types")) {
        const json& lt = tc["layer_types"];
        if (!lt.is_array() || (int)lt.size() != hp.num_layers)
            r.fail("layer_types",
                   "must be a list of num_hidden_layers (" + std::to_string(hp.num_layers) + ") strings");
        for (int i = 0; i < hp.num_layers; ++i) {
            std::string s = lt[i].is_string() ? lt[i].get<std::string>() : "";
            if (s == "sliding_attention")
                hp.layer_types[i] = LayerType::Sliding;
            else if (s == "full_attention")
                hp.layer_types[i] = LayerType::Full;
            else
                r.fail("layer_types",
                       "entry " + std::to_string(i) + " must be sliding_attention or full_attention");
        }
    } else {
        for (int i = 0; i < hp.num_layers; ++i)
            hp.layer_types[i] = (i + 1) % 6 ? LayerType::Sliding : LayerType::Full;
    }
    hp.layer_types[hp.num_layers - 1] = LayerType::Full;
    parse_rope(r, hp);

    // Full-attention head size and KV heads: per_layer_config (re-saved) or global_head_dim (released).
    hp.head_dim_full     = hp.head_dim;
    hp.num_kv_heads_full = hp.num_kv_heads;
    if (r.has("per_layer_config")) {
        *form           = "per_layer_config";
        const json& plc = tc["per_layer_config"];
        if (!plc.is_object()) r.fail("per_layer_config", "must be an object keyed by layer index");
        // Keys are layer indices as strings, zero-padded by transformers when there are >= 10 layers ("05").
        std::map<int, const json*> by_layer;
        for (auto it = plc.begin(); it != plc.end(); ++it) {
            const std::string& key = it.key();
            char* end              = nullptr;
            long idx               = std::strtol(key.c_str(), &end, 10);
            if (key.empty() || *end || idx < 0 || idx >= hp.num_layers)
                r.fail("per_layer_config", "has key '" + key + "', which is not a layer index 0.." +
                                               std::to_string(hp.num_layers - 1));
            if (!it.value().is_object()) r.fail("per_layer_config", "entry '" + key + "' must be an object");
            by_layer[(int)idx] = &it.value();
        }
        int full_hd = -1, full_kv = -1;
        for (int i = 0; i < hp.num_layers; ++i) {
            std::string key = std::to_string(i);
            bool full       = hp.layer_types[i] == LayerType::Full;
            int hd = hp.head_dim, kv = hp.num_kv_heads;
            if (by_layer.count(i)) {
                Reader lr{*by_layer[i], where + ": per_layer_config." + key};
                hd = lr.int32("head_dim", hp.head_dim, 2, 4096);
                kv = lr.int32("num_key_value_heads", hp.num_kv_heads, 1, 1024);
            }
            if (!full && (hd != hp.head_dim || kv != hp.num_kv_heads))
                r.fail("per_layer_config", "overrides sliding layer " + key + ", which g4 does not support");
            if (full) {
                if (full_hd >= 0 && (hd != full_hd || kv != full_kv))
                    r.fail("per_layer_config",
                           "gives full-attention layers different head sizes; g4 needs one");
                full_hd = hd, full_kv = kv;
            }
        }
        if (full_hd > 0) hp.head_dim_full = full_hd, hp.num_kv_heads_full = full_kv;
    } else {
        *form            = "global_head_dim";
        hp.head_dim_full = r.int32("global_head_dim", 512, 2, 4096);
        if (r.has("num_global_key_value_heads"))
            hp.num_kv_heads_full = r.int32("num_global_key_value_heads", 0, 1, 1024);
    }
    (void)top;
    std::string err = validate(hp);
    if (!err.empty()) throw CompileError(where + ": inconsistent text config: " + err);
    return hp;
}

} // namespace

ModelConfig parse_config(const json& j, const std::function<json()>& generation, const std::string& source) {
    ModelConfig mc;
    Reader top{j, source};
    mc.model_type = top.string("model_type", "");
    if (mc.model_type == "gemma4") {
        if (!top.has("text_config") || !j["text_config"].is_object())
            throw CompileError(source + ": model_type gemma4 needs a text_config object");
        mc.tensor_prefix = "model.language_model.";
        mc.text          = parse_text(j["text_config"], source + ": text_config", &j, &mc.head_dim_form);
        mc.has_vision    = top.has("vision_config") && j["vision_config"].is_object();
        mc.has_audio     = top.has("audio_config") && j["audio_config"].is_object();
        if (mc.has_vision) mc.vision_config_json = j["vision_config"].dump();
        if (mc.has_audio) mc.audio_config_json = j["audio_config"].dump();
        auto id = [&](std::initializer_list<const char*> keys) {
            for (const char* k : keys)
                if (j.contains(k) && j[k].is_number_integer()) return j[k].get<int>();
            return -1;
        };
        mc.image_token_id = id({"image_token_id", "image_token_index"});
        mc.boi_token_id   = id({"boi_token_id", "boi_token_index"});
        mc.eoi_token_id   = id({"eoi_token_id", "eoi_token_index"});
        mc.video_token_id = id({"video_token_id", "video_token_index"});
        mc.audio_token_id = id({"audio_token_id", "audio_token_index"});
        mc.boa_token_id   = id({"boa_token_id", "boa_token_index"});
        mc.eoa_token_id   = id({"eoa_token_id", "eoa_token_index"});
    } else if (mc.model_type == "gemma4_text") {
        mc.tensor_prefix = "model.";
        mc.text          = parse_text(j, source, nullptr, &mc.head_dim_form);
    } else {
        throw CompileError(source + ": unsupported architecture: model_type '" + mc.model_type +
                           "' (g4 compiles Gemma 4 checkpoints: model_type gemma4 or gemma4_text)");
    }

    GenerationDefaults& g = mc.generation;
    g.bos_token_id        = mc.text.bos_token_id;
    g.pad_token_id        = mc.text.pad_token_id;
    const json& tc        = mc.model_type == "gemma4" ? j["text_config"] : j;
    if (j.contains("eos_token_id")) g.eos_token_ids = id_list(j["eos_token_id"]);
    if (g.eos_token_ids.empty() && tc.contains("eos_token_id")) g.eos_token_ids = id_list(tc["eos_token_id"]);
    if (const json gj = generation(); !gj.is_null()) {
        Reader gr{gj, "generation_config.json"};
        if (gj.contains("eos_token_id")) {
            auto ids = id_list(gj["eos_token_id"]);
            if (!ids.empty()) g.eos_token_ids = ids;
        }
        // The sampler's ranges (runtime/src/sampler.cpp check_sampling): a plan with defaults outside them
        // could never sample, so the compile refuses them.
        auto in_range = [&](const char* k, double def, double lo, bool lo_open, double hi) {
            const double v = gr.number(k, def);
            const float f  = (float)v;
            if (!std::isfinite(f) || (lo_open ? !(f > lo) : !(f >= lo)) || f > hi)
                gr.fail(k, "= " + gj[k].dump() + " is out of range " + (lo_open ? "(" : "[") +
                               json(lo).dump() + ", " +
                               (std::isinf(hi) ? std::string("inf)") : json(hi).dump() + "]") +
                               "; fix or remove it in generation_config.json");
            return f;
        };
        g.do_sample          = gr.boolean("do_sample", false);
        g.temperature        = in_range("temperature", 1.0, 0.0, false, INFINITY);
        g.top_k              = gr.int32("top_k", 0, 0, 1 << 30);
        g.top_p              = in_range("top_p", 1.0, 0.0, true, 1.0);
        g.min_p              = in_range("min_p", 0.0, 0.0, false, 1.0);
        g.repetition_penalty = in_range("repetition_penalty", 1.0, 0.0, true, INFINITY);
    }
    if (g.eos_token_ids.empty()) g.eos_token_ids.push_back(1);
    // Token ids the runtime looks up must be in the vocabulary (the plan reader refuses others).
    auto check_id = [&](const char* what, int id) {
        if (id < 0 || id >= mc.text.vocab_size)
            throw CompileError(source + ": " + what + " " + std::to_string(id) +
                               " is outside the vocabulary of " + std::to_string(mc.text.vocab_size) +
                               " (config.json / generation_config.json)");
    };
    check_id("bos_token_id", g.bos_token_id);
    check_id("pad_token_id", g.pad_token_id);
    for (int id : g.eos_token_ids)
        check_id("eos_token_id", id);
    if (g.eos_token_ids.size() > 64) throw CompileError(source + ": more than 64 eos_token_id entries");
    return mc;
}

} // namespace g4::gemma4
