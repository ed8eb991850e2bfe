// The plan's META section as one struct, and the one codec that writes it (the compiler) and reads it (the
// plan reader, `g4 inspect`). Every META key is spelled in meta.cpp only; docs/plan-format.md lists them
// (tests/unit/plan_meta_test.cpp checks that every key the codec writes is documented there).
#pragma once
#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace g4::plan {

using ByteRange = std::array<uint64_t, 2>; // [begin, end)

struct MetaCuda {
    std::string target; // "sm_90"
    int32_t device_index = 0;
    int32_t attn_hpg     = 0; // heads per KV group the decode attention kernels were compiled for, 0 = any
    std::string kernel_trace; // "" = absent (no timeline trace compiled in)
};

// How the weights were stored. The CUDA-only fields are absent ("" / -1) in CPU plans and where they keep
// their defaults.
struct MetaPolicy {
    std::string weights;
    bool double_quant = false;
    std::string quantize, keep;
    int32_t nf4_blocksize = 0;
    std::string kv_dtype  = "f32";
    std::optional<bool> deterministic;
    std::string prefill_precision, mlp_precision; // "" = absent
    int32_t mlp_replicas = -1;                    // -1 = absent ("auto")
    std::string ple_fold, mlp_fold;               // "" = absent (the defaults)
    std::string cpu_precision; // CPU NF4 matmuls: "fast" (int16 x, kernels/q16.h) | "bf16" (fast; prefill
                               // chunks with bf16 operands on AMX) | "f32"; "" = absent (f32)
};

// The model's hyper-parameters: the two every reader needs, and the model's own (the model definition's,
// written as given: the runtime never reads them).
struct MetaHParams {
    int32_t num_hidden_layers = 0, hidden_size = 0;
    nlohmann::json model = nlohmann::json::object();
};

struct MetaGpuPart {
    int32_t index = 0;
    std::vector<ByteRange> weights; // of WEIGHTS
    ByteRange kv{};                 // of the KV arena
};

struct MetaProgram {
    int32_t max_rows = 0, max_context = 0, logits_rows = 0, sliding_slots = 0;
    uint64_t act_arena_bytes = 0, kv_arena_bytes = 0;
    int32_t ids_tensor = -1, logits_tensor = -1;
    int64_t max_k = 0, max_slots = 0;
    int32_t vocab_size = 0, embed_vocab_limit = 0;
    // Plans over several devices only (empty / absent otherwise).
    std::vector<int32_t> layer_devices;
    std::vector<MetaGpuPart> gpus;
    std::optional<uint64_t> kv_host_begin;
};

struct MetaGeneration {
    std::vector<int32_t> eos_token_ids;
    int32_t bos_token_id = 2, pad_token_id = 0;
    bool do_sample    = false;
    float temperature = 1.0f;
    int32_t top_k     = 0;
    float top_p = 1.0f, min_p = 0.0f, repetition_penalty = 1.0f;
};

struct MetaFile {
    std::string file, sha256;
};
struct MetaMerge {
    std::string module;
    int32_t r   = 0;
    float alpha = 0, scale = 0;
    bool dora = false;
};
struct MetaProvenance {
    std::string base_dir;
    std::vector<MetaFile> base_files;
    bool has_adapter = false;
    std::string adapter_dir;
    std::vector<MetaFile> adapter_files;
    std::vector<MetaMerge> merges;
    std::string g4_version;
};

struct MetaTokenizer { // written as {} when the plan has none
    bool present       = false;
    int32_t vocab_size = 0;
    bool add_bos_token = false;
    std::string chat_template, sha256;
};

struct MetaLayerRange {
    int32_t first = 0, last = 0;
    std::string device;
};
struct MetaPlacement {
    std::string device;
    std::vector<MetaLayerRange> layers;
    std::string embed, lm_head;
    std::string ple = "device"; // "host": the gathered embedding table stays in pinned host memory
    bool ple_auto   = false;
    std::string vision, audio; // where each tower runs, or why it is not there
    // CUDA plans from 1.3: whether sessions screen the LM head with its int8 copy (its bytes are a part of
    // the plan's GPU memory). Absent (CPU plans, older plans): the runtime decides from the free memory.
    std::optional<bool> lm_head_screen;
    // From 1.5: the sessions the memory figures count (g4 compile --max-sessions). Absent: 1.
    int32_t sessions = 1;
};
struct MetaDeviceMemory {
    std::string device;
    std::vector<std::pair<std::string, uint64_t>> parts; // what, bytes
    uint64_t scratch_per_thread = 0;                     // 0 = absent
    std::optional<uint64_t> budget;
    uint64_t total() const;
};

// The video limits a plan's sessions default to (g4 compile --video-frames, --max-video-seconds,
// --max-video-stream-frames, --max-video-pixels, --max-video-bytes); the run-time flags override them. Absent
// in plans compiled before they were recorded: the runtime's defaults (runtime/src/media/video_decode.h).
struct MetaVideo {
    int32_t frames            = 0; // frames a video gives (sampled as the processor does)
    double max_seconds        = 0; // the stream's duration
    int64_t max_stream_frames = 0; // frames in the stream
    int64_t max_pixels        = 0; // a frame's width x height (at most max_image_pixels)
    int64_t max_file_bytes    = 0; // the file's size
};

struct MetaVision {
    std::string config; // config.json's vision_config, JSON text
    int32_t image_tokens = 0, max_patches = 0;
    int64_t max_image_pixels = 0;
    int32_t image_token_id = -1, boi_token_id = -1, eoi_token_id = -1;
    int32_t video_token_id = -1; // absent before video
    // The vision encoder program (PROGRAMS) and its input layout; program "" = absent (a plan whose vision
    // tower is not an encoder program: the other fields are then not written).
    std::string program;
    int32_t patch_size = 0, pooling_kernel_size = 0, position_size = 0;
    float pixel_mean = 0, pixel_std = 1; // (p - pixel_mean) / pixel_std of pixel values in [0, 1]
    std::string device;                  // "" = absent (the CPU); "cuda:N"
    uint64_t gpu_bytes = 0;              // with device
    std::optional<ByteRange> weights;
    std::optional<MetaVideo> video; // with video_token_id >= 0
};
struct MetaAudio {
    std::string config;
    int64_t max_samples    = 0;
    int32_t sample_rate    = 0;
    int32_t audio_token_id = -1, boa_token_id = -1, eoa_token_id = -1;
    // The audio encoder program (PROGRAMS) and the log-mel front end that makes its input; program "" =
    // absent (a plan whose audio tower is not an encoder program: the other fields are then not written).
    std::string program;
    int32_t frame_length = 0, hop_length = 0, fft_length = 0, mel_bins = 0;
    double min_hz = 0, max_hz = 0, mel_floor = 0;
    std::string device;
    uint64_t gpu_bytes = 0;
    std::optional<ByteRange> weights;
};
struct MetaTowers {
    ByteRange weights{};
    int32_t max_media_tokens       = 0;
    uint64_t thread_scratch_floats = 0;
    uint64_t session_bytes         = 0;      // required from format 1.2; before, absent: 0
    std::string precision          = "fp32"; // "fp32" | "bf16"; required from 1.2
    std::optional<MetaVision> vision;
    std::optional<MetaAudio> audio;
};

struct Meta {
    std::string format = "g4plan";
    std::string g4_version, architecture, head_dim_form;
    std::string device = "cpu"; // "cpu" | "cuda"
    std::optional<MetaCuda> cuda;
    std::string weights_dtype;
    MetaPolicy policy;
    bool reference_plan = false;
    MetaHParams hparams;
    MetaProgram program;
    MetaGeneration generation;
    MetaProvenance provenance;
    MetaTokenizer tokenizer;
    // The model's chat template pieces, as the chat template's own codec writes them (an object; null or
    // empty: absent, and the plan refuses chat only).
    nlohmann::json chat;
    std::optional<MetaPlacement> placement; // with memory: plans (not the fidelity reference)
    std::vector<MetaDeviceMemory> memory;
    std::optional<MetaTowers> towers;
};

// META's text as the compiler writes it (sorted keys, one space of indentation).
std::string write_meta(const Meta& m);
// Parses META text of a plan of format minor `minor` into *m. A field that minor's writer always writes is
// required; one added later takes its default. False with *err = the first defect ("META field max_rows:
// expected ...").
bool read_meta(std::string_view text, uint16_t minor, Meta* m, std::string* err);

// The parts as JSON objects, for `g4 inspect` and the Python package.
nlohmann::json to_json(const Meta& m);
nlohmann::json to_json(const MetaHParams& h);
nlohmann::json to_json(const MetaProgram& p);
nlohmann::json to_json(const MetaGeneration& g);
nlohmann::json to_json(const MetaPolicy& p);
nlohmann::json to_json(const MetaTokenizer& t);
nlohmann::json to_json(const MetaProvenance& p);

// Every key the codec writes, as "parent.key" paths ("program.max_rows"), for the documentation check.
std::vector<std::string> meta_keys();

} // namespace g4::plan
