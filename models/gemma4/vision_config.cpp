// config.json's "vision_config" read for the vision encoder program (models/gemma4/vision_graph.h): required
// shape keys, HF Gemma4VisionConfig defaults for the rest, unsupported settings refused.
#include "models/gemma4/vision_graph.h"

#include <cstdint>
#include <nlohmann/json.hpp>

namespace g4::gemma4 {

using json = nlohmann::json;

std::string parse_vision_config(const std::string& text, int text_hidden_size, VisionHParams* out) {
    json j;
    try {
        j = json::parse(text);
    } catch (const std::exception& e) {
        return std::string("vision_config: not valid JSON: ") + e.what();
    }
    if (!j.is_object()) return "vision_config: expected a JSON object";
    VisionHParams hp{};
    std::string err;
    auto get_int = [&](const char* key, int* dst, int lo) {
        if (!err.empty()) return;
        auto it = j.find(key);
        if (it == j.end()) {
            err = std::string("vision_config: missing key \"") + key + "\"";
        } else if (!it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > (1 << 30)) {
            err = std::string("vision_config: \"") + key + "\" must be an integer >= " + std::to_string(lo) +
                  ", got " + it->dump();
        } else {
            *dst = (int)it->get<int64_t>();
        }
    };
    get_int("hidden_size", &hp.hidden_size, 1);
    get_int("num_hidden_layers", &hp.num_hidden_layers, 0);
    get_int("num_attention_heads", &hp.num_attention_heads, 1);
    get_int("num_key_value_heads", &hp.num_key_value_heads, 1);
    get_int("head_dim", &hp.head_dim, 4);
    get_int("intermediate_size", &hp.intermediate_size, 1);
    get_int("patch_size", &hp.patch_size, 1);
    get_int("pooling_kernel_size", &hp.pooling_kernel_size, 1);
    get_int("position_embedding_size", &hp.position_embedding_size, 1);
    if (!err.empty()) return err;

    auto num_or = [&](const json& o, const char* key, double def, double* dst) -> bool {
        auto it = o.find(key);
        if (it == o.end() || it->is_null()) {
            *dst = def;
            return true;
        }
        if (!it->is_number()) return false;
        *dst = it->get<double>();
        return true;
    };
    double eps = 0, theta = 0;
    if (!num_or(j, "rms_norm_eps", 1e-6, &eps) || !(eps > 0))
        return "vision_config: \"rms_norm_eps\" must be a positive number";
    hp.rms_norm_eps = (float)eps;

    theta = 100.0; // Gemma4VisionConfig.default_theta
    if (auto rp = j.find("rope_parameters"); rp != j.end() && !rp->is_null()) {
        if (!rp->is_object()) return "vision_config: \"rope_parameters\" must be an object";
        if (auto rt = rp->find("rope_type");
            rt != rp->end() && !(rt->is_string() && rt->get<std::string>() == "axial"))
            return "vision_config: rope_parameters.rope_type " + rt->dump() +
                   " is not supported (only \"axial\")";
        if (!num_or(*rp, "rope_theta", 100.0, &theta))
            return "vision_config: rope_parameters.rope_theta must be a number";
    } else if (!num_or(j, "rope_theta", 100.0, &theta)) {
        return "vision_config: \"rope_theta\" must be a number";
    }
    if (!(theta > 0)) return "vision_config: rope theta must be positive";
    hp.rope_theta = (float)theta;

    auto flag = [&](const char* key, bool def, bool* dst) -> bool {
        auto it = j.find(key);
        if (it == j.end() || it->is_null()) {
            *dst = def;
            return true;
        }
        if (!it->is_boolean()) return false;
        *dst = it->get<bool>();
        return true;
    };
    if (!flag("use_clipped_linears", false, &hp.use_clipped_linears))
        return "vision_config: \"use_clipped_linears\" must be true or false";
    bool b = false;
    if (!flag("standardize", false, &b)) return "vision_config: \"standardize\" must be true or false";
    if (b) return "vision_config: \"standardize\": true is not supported (std_bias/std_scale towers)";
    if (!flag("attention_bias", false, &b)) return "vision_config: \"attention_bias\" must be true or false";
    if (b) return "vision_config: \"attention_bias\": true is not supported";
    if (auto it = j.find("hidden_activation");
        it != j.end() && !it->is_null() &&
        !(it->is_string() && it->get<std::string>() == "gelu_pytorch_tanh"))
        return "vision_config: \"hidden_activation\" " + it->dump() +
               " is not supported (only \"gelu_pytorch_tanh\")";

    if (hp.num_attention_heads % hp.num_key_value_heads)
        return "vision_config: num_attention_heads (" + std::to_string(hp.num_attention_heads) +
               ") must be a multiple of num_key_value_heads (" + std::to_string(hp.num_key_value_heads) + ")";
    if (hp.head_dim % 4)
        return "vision_config: head_dim (" + std::to_string(hp.head_dim) +
               ") must be a multiple of 4 (2-D RoPE)";
    if (text_hidden_size < 1) return "vision tower: text hidden size must be positive";
    hp.text_hidden_size = text_hidden_size;
    *out                = hp;
    return "";
}

} // namespace g4::gemma4
