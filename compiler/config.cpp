// Checkpoint configuration files (see config.h): read, bounded in depth and parsed as JSON, then handed to
// the model's interpretation (models/gemma4/config.cpp).
#include "compiler/config.h"
#include "compiler/error.h"
#include "runtime/src/json_limits.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace g4 {

using json = nlohmann::json;

std::string read_text_file(const std::string& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
        throw CompileError("cannot read " + path + ": it is a directory, not a file");
    std::ifstream f(path, std::ios::binary);
    if (!f) throw CompileError("cannot read " + path + ": file missing or unreadable");
    std::ostringstream ss;
    ss << f.rdbuf();
    if (f.bad()) throw CompileError("cannot read " + path + ": read error");
    return ss.str();
}

ModelConfig parse_model_config(const std::string& config_json, const std::string& generation_json,
                               const std::string& source) {
    if (std::string e = json_depth_error(config_json); !e.empty()) throw CompileError(source + ": " + e);
    json j;
    try {
        j = json::parse(config_json);
    } catch (const std::exception& e) {
        throw CompileError(source + ": corrupt JSON (" + std::string(e.what()) +
                           "); re-download or re-save config.json");
    }
    if (!j.is_object()) throw CompileError(source + ": corrupt JSON: top level must be an object");
    auto generation = [&]() -> json {
        if (generation_json.empty()) return nullptr;
        if (std::string e = json_depth_error(generation_json); !e.empty())
            throw CompileError(source + " (generation_config.json): " + e);
        try {
            return json::parse(generation_json);
        } catch (const std::exception& e) {
            throw CompileError(source + " (generation_config.json): corrupt JSON (" + std::string(e.what()) +
                               ")");
        }
    };
    return gemma4::parse_config(j, generation, source);
}

ModelConfig load_model_config(const std::string& dir) {
    namespace fs = std::filesystem;
    if (!fs::is_directory(dir)) throw CompileError("model directory " + dir + " does not exist");
    std::string cfg = dir + "/config.json";
    if (!fs::exists(cfg))
        throw CompileError(cfg + " not found: --model must be a Hugging Face checkpoint directory");
    std::string gen_path = dir + "/generation_config.json";
    std::string gen      = fs::exists(gen_path) ? read_text_file(gen_path) : "";
    return parse_model_config(read_text_file(cfg), gen, cfg);
}

} // namespace g4
