// PEFT LoRA adapters (adapter_config.json + adapter_model.safetensors): parsing, validation and the
// full-precision merge W' = W + scale * (B @ A) (DoRA: W' = m / ||V||_row * V, V = W + scale * B @ A).
// Targets are resolved from the adapter's own tensor keys, never by re-running target patterns.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace g4::lora {

struct ModuleMerge {
    std::string
        module; // module path as in the adapter keys, e.g. model.language_model.layers.3.self_attn.q_proj
    int r         = 0;
    float alpha   = 0;
    float scale   = 0; // alpha / r, or alpha / sqrt(r) with use_rslora
    bool dora     = false;
    bool has_bias = false;   // lora_bias: lora_B.bias present
    int64_t out = 0, in = 0; // from lora_B / lora_A shapes
};

class Adapter {
public:
    // Opens DIR/adapter_config.json and DIR/adapter_model.safetensors; validates everything it can
    // without the base model. Throws g4::CompileError (names the file/module, says how to fix).
    static std::unique_ptr<Adapter> open(const std::string& dir);
    ~Adapter();

    const std::string& dir() const;
    const std::vector<ModuleMerge>& merges() const; // sorted by module
    // Names of base tensors fully replaced through modules_to_save (e.g.
    // "model.language_model.embed_tokens.weight").
    std::vector<std::string> replacements() const;

    // Base tensor `tensor_name` (e.g. "model.language_model.layers.3.self_attn.q_proj.weight"), shape
    // [out, in], values `w` (float32, row-major). If the adapter targets this tensor's module (or
    // replaces it via modules_to_save), updates `w` in place and returns true. A LoRA bias, if any,
    // is added to `bias` ([out], zero-initialised by the caller) and *has_bias set.
    // Throws on a shape mismatch, naming the module and both shapes.
    // `alias_prefixes`: pairs (adapter prefix, checkpoint prefix) tried when names differ, e.g.
    // {"model.language_model.", "model."} for a text-only checkpoint.
    bool apply(const std::string& tensor_name, const std::vector<int64_t>& shape, float* w,
               std::vector<float>* bias, bool* has_bias) const;

    // Modules/replacements that apply() never consumed (for the compile log and errors).
    std::vector<std::string> unconsumed() const;

    // Called by the compiler to map names between a multimodal adapter and a text-only checkpoint.
    void set_name_alias(const std::string& adapter_prefix, const std::string& checkpoint_prefix);

    struct Impl;

private:
    Adapter() = default;
    std::unique_ptr<Impl> impl_;
};

} // namespace g4::lora
