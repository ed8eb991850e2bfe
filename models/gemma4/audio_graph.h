// Compiler-only graph builder for Gemma 4's audio encoder (HF Gemma4AudioModel + embed_audio): emits the
// encoder as an op program of its own, run once per clip on the log-mel features the runtime's front end
// makes. Weights are referenced by their Hugging Face names relative to "model.".
#pragma once
#include "models/gemma4/audio_config.h"
#include "models/gemma4/graph.h"

#include <array>
#include <functional>
#include <string>
#include <vector>

namespace g4::gemma4 {

// The program's row counts (plan_format.h PlanProgram): log-mel frames, frames after the first stride-2
// conv, soft tokens (after the second), relative positions (fixed).
enum AudioRowCount : int { kAudioFrames = 0, kAudioHalfFrames = 1, kAudioTokens = 2, kAudioRelPositions = 3 };

struct AudioProgram {
    Program graph;                     // tensors and ops; graph.ids / logits unused
    int features = -1;                 // Input [max frames, mel_bins]: the clip's log-mel features
    int output   = -1;                 // Activation [max tokens, text hidden]: the soft tokens
    std::array<int32_t, 4> max_rows{}; // bound of each AudioRowCount
    uint64_t thread_floats = 0;        // per-thread scratch its CPU kernels need
};

struct AudioBuildOptions {
    int64_t max_samples = 480000; // the longest clip (HF: 30 s)
    bool bf16_matmuls   = false;  // CPU matmuls with bf16 operands (the towers' --tower-precision bf16)
};

// Values of checkpoint tensors read at compile time (relative to "model."): the ClippableLinear bounds
// (0-d) and the output projection's bias. Returns "" or an error naming the tensor.
using AudioTensorReader = std::function<std::string(const std::string& name, std::vector<float>* values)>;

// Builds the encoder program. hp from parse_audio_hparams. Returns "" or an error naming the tensor.
std::string build_audio_program(const AudioHParams& hp, const AudioBuildOptions& opt,
                                const AudioTensorReader& read, AudioProgram* out);

// The relative-position sinusoids [n_rel, hidden] HF computes in float32 (positions n_rel-1 .. 0).
std::vector<float> audio_relative_positions(const AudioHParams& hp, int* n_rel);

} // namespace g4::gemma4
