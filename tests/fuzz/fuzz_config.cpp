// Fuzz target: config.json [NUL generation_config.json] through the compiler's parser, then the vision and
// audio tower configs it extracts through their parsers (models/gemma4).
#include "compiler/config.h"
#include "compiler/error.h"
#include "fuzz_util.h"
#include "models/gemma4/audio_config.h"
#include "models/gemma4/vision_graph.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto parts = g4fuzz::split_nul(data, size, 2);
    try {
        g4::ModelConfig mc =
            g4::parse_model_config(parts[0], parts.size() > 1 ? parts[1] : "", "fuzz/config.json");
        if (!mc.vision_config_json.empty()) {
            g4::gemma4::VisionHParams vh;
            (void)g4::gemma4::parse_vision_config(mc.vision_config_json, mc.text.hidden_size, &vh);
        }
        if (!mc.audio_config_json.empty()) {
            g4::gemma4::AudioHParams ah;
            (void)g4::gemma4::parse_audio_hparams(mc.audio_config_json, mc.text.hidden_size, &ah);
        }
    } catch (const g4::CompileError&) {
    }
    return 0;
}
