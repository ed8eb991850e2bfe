// Nesting bound for every JSON text g4 reads (config.json, generation_config.json, adapter_config.json,
// tokenizer.json, tokenizer_config.json, safetensors headers and indexes, a plan's META): checked before
// parsing, so that no parser, copy, dump or walk of a hostile file recurses without bound. In the runtime
// library, which the compiler and the CLI link too.
#pragma once
#include <string>
#include <string_view>

namespace g4 {

// Deeper than any file of a real checkpoint, tokenizer or plan (they nest fewer than 10 levels).
inline constexpr int kMaxJsonDepth = 64;

// "" when the arrays and objects of `text` nest at most max_depth levels (brackets inside strings are not
// counted), else one line saying where the limit is passed. Does not check that the text is JSON.
std::string json_depth_error(std::string_view text, int max_depth = kMaxJsonDepth);

} // namespace g4
