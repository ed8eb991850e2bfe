// Hugging Face names of a Gemma 4 checkpoint's tensors, as the compiler resolves the plan's weights against
// them and matches an adapter's modules to them (compiler only). The plan names a text weight relative to
// the text model ("layers.3.mlp.up_proj.weight") and a tower weight relative to "model."
// ("vision_tower.encoder...."); the checkpoint's text prefix is "model.language_model." (multimodal,
// model_type gemma4) or "model." (text-only, gemma4_text).
#pragma once
#include "models/gemma4/model.h"

#include <string>

namespace g4::gemma4 {

inline constexpr const char* kMultimodalTextPrefix = "model.language_model.";

// The checkpoint tensor behind a plan weight (the LM head is tied to the token embedding).
std::string checkpoint_tensor(const std::string& text_prefix, const std::string& name, bool tower);
// The name an adapter knows a plan weight by.
std::string adapter_tensor(const std::string& text_prefix, const std::string& name, bool tower);
// An adapter trained on the multimodal checkpoint names a text-only checkpoint's "model.X" as
// "model.language_model.X": that spelling of `hf`, or "" when there is none.
std::string multimodal_spelling(const std::string& text_prefix, const std::string& hf);
// The checkpoint name of a module weight an adapter names in the multimodal spelling ("" if it has none).
std::string text_only_spelling(const std::string& text_prefix, const std::string& hf);
// The plan-relative name of a text weight an adapter names (either spelling), or "" when it names none.
std::string text_relative(const std::string& text_prefix, const std::string& hf);
// True when an adapter that replaces `name` (modules_to_save) replaces the token embedding or the LM head,
// which then no longer share one tensor.
bool unties_lm_head(const std::string& text_prefix, const std::string& name);
// "vision tower" or "audio tower": the tower a tower weight (plan-relative name) belongs to.
const char* tower_of(const std::string& name);

// Why an adapter module that matched no compiled weight is dropped: the k/v of a KV-shared layer (never
// used), a tower left out of the plan, or nothing (then it is not for this model).
enum class UnusedModule { KvShared, VisionTower, AudioTower, Unknown };
UnusedModule classify_unused(const TextHParams& hp, const std::string& module);

} // namespace g4::gemma4
