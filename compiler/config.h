// The checkpoint's config.json and generation_config.json: read and parsed as JSON here, interpreted by the
// model (models/gemma4/config.h).
#pragma once
#include "models/gemma4/config.h"

#include <string>

namespace g4 {

using gemma4::GenerationDefaults;
using gemma4::ModelConfig;

// Reads a whole file; throws g4::CompileError naming it if it is missing or unreadable.
std::string read_text_file(const std::string& path);

// Parses DIR/config.json and, when present, DIR/generation_config.json. Throws g4::CompileError
// naming the file and field on any problem.
ModelConfig load_model_config(const std::string& dir);
// Same from JSON text (for tests); `source` names the origin in error messages.
ModelConfig parse_model_config(const std::string& config_json, const std::string& generation_json,
                               const std::string& source);

} // namespace g4
