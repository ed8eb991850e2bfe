// Gemma 4 checkpoint tensor names (see names.h).
#include "models/gemma4/names.h"

#include <cstdio>
#include <cstring>

namespace g4::gemma4 {

std::string checkpoint_tensor(const std::string& text_prefix, const std::string& name, bool tower) {
    if (tower) return "model." + name;
    return text_prefix + (name == "lm_head.weight" ? std::string("embed_tokens.weight") : name);
}

std::string adapter_tensor(const std::string& text_prefix, const std::string& name, bool tower) {
    return tower ? "model." + name : name == "lm_head.weight" ? name : text_prefix + name;
}

std::string multimodal_spelling(const std::string& text_prefix, const std::string& hf) {
    if (text_prefix == "model." && hf.rfind("model.", 0) == 0) return kMultimodalTextPrefix + hf.substr(6);
    return "";
}

std::string text_only_spelling(const std::string& text_prefix, const std::string& hf) {
    const std::string mm = kMultimodalTextPrefix;
    if (text_prefix == "model." && hf.rfind(mm, 0) == 0) return "model." + hf.substr(mm.size());
    return "";
}

std::string text_relative(const std::string& text_prefix, const std::string& hf) {
    const std::string mm = kMultimodalTextPrefix;
    if (hf.rfind(text_prefix, 0) == 0) return hf.substr(text_prefix.size());
    if (hf.rfind(mm, 0) == 0) return hf.substr(mm.size());
    return "";
}

bool unties_lm_head(const std::string& text_prefix, const std::string& name) {
    return name == "lm_head.weight" || name == std::string(kMultimodalTextPrefix) + "embed_tokens.weight" ||
           name == text_prefix + "embed_tokens.weight";
}

const char* tower_of(const std::string& name) {
    return name.rfind("vision_tower.", 0) == 0 || name.rfind("embed_vision.", 0) == 0 ? "vision tower"
                                                                                      : "audio tower";
}

UnusedModule classify_unused(const TextHParams& hp, const std::string& module) {
    std::string rel = module;
    for (const char* pre : {kMultimodalTextPrefix, "model."})
        if (rel.rfind(pre, 0) == 0) {
            rel = rel.substr(std::strlen(pre));
            break;
        }
    int layer = -1;
    if (std::sscanf(rel.c_str(), "layers.%d.", &layer) == 1 && layer >= first_kv_shared_layer(hp) &&
        hp.num_kv_shared_layers > 0 &&
        (rel.find("self_attn.k_proj") != std::string::npos ||
         rel.find("self_attn.v_proj") != std::string::npos ||
         rel.find("self_attn.k_norm") != std::string::npos))
        return UnusedModule::KvShared;
    if (module.find("vision_tower") != std::string::npos || module.find("embed_vision") != std::string::npos)
        return UnusedModule::VisionTower;
    if (module.find("audio_tower") != std::string::npos || module.find("embed_audio") != std::string::npos)
        return UnusedModule::AudioTower;
    return UnusedModule::Unknown;
}

} // namespace g4::gemma4
