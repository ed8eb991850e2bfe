// `g4 compile`: Hugging Face checkpoint directory -> one static plan file.
// Steps: parse config.json, build the op program (models/gemma4/graph), resolve and validate every
// weight against the checkpoint, convert to the plan dtype, plan activation/KV memory, then write
// the plan to a temporary name and rename it into place (never a half-written output file).
#pragma once
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

namespace g4 {

struct CompileOptions {
    std::string model_dir;
    std::string adapter_dir; // PEFT adapter (not supported yet)
    std::string out_path;
    std::string weights = "nf4"; // nf4 (NF4 projections, bf16 rest) | bf16 | f32
    std::string device  = "cpu"; // cpu | cuda[:N]
    std::string quantize_regex;  // NF4 for matmul weights whose HF name matches (replaces the default set)
    std::string keep_regex;      // never quantize weights whose HF name matches
    bool double_quant = false;   // bitsandbytes double quantization of the NF4 absmax
    bool fidelity     = true;    // measure logits vs the full-precision model when lossy
    bool dry_run      = false;   // validate and print the memory plan; write nothing
    // Greedy decode steps screen the bf16 LM head with an int8 copy built at engine open (CPU plans of the
    // fast precision, CUDA plans whose schedule's head takes one), its bytes counted in the plan's memory;
    // false (--no-lm-screen): every step computes the whole head, no copy.
    bool lm_screen = true;
    std::string cuda_target;                // sm_80 | sm_86 | sm_89 | sm_90; default: the GPU present
    std::string prefill_precision = "bf16"; // CUDA prefill matmuls: bf16 (tensor cores) | fp32 (exact SIMT)
    bool deterministic =
        false; // CUDA decode sums in a fixed order (sm_90: no fused MLP, whose atomic adds vary)
    // CPU decode matmuls of NF4 weights: fast (x quantized to int16 per block, integer dot products,
    // kernels/q16.h) | bf16 (fast, and prefill chunks' NF4 matmuls with bf16 operands on AMX tiles where
    // the CPU has them) | f32 (float32 arithmetic throughout). Recorded in META policy.cpu_precision.
    std::string cpu_precision = "fast";
    std::string mlp_precision =
        "f16"; // sm_90 fused decode MLP products: f16 (packed, where the weights allow) | f32
    // sm_90 decode schedule choices for measuring one form against another (recorded in the plan's policy
    // when not the default): the fused MLP's output replicas (auto: cuda::mlp_replicas by shape | 1..4), the
    // ResNorm before a PLE in the PLE's kernel (on: where cuda::ple_fold_after takes it | off), the ResNorm
    // before a packed-f16 MLP in the MLP's kernel (one-wave: where cuda::mlp_fold_one_wave takes it | all |
    // off).
    std::string mlp_replicas = "auto";
    std::string ple_fold     = "on";
    std::string mlp_fold     = "one-wave";
    std::string kernel_trace = "off"; // CUDA kernels with the timeline trace: off | launches | blocks
    std::string kv_dtype;       // KV cache storage: bf16 | f32; empty: bf16 for CUDA plans, f32 for CPU plans
    std::string tokenizer_path; // tokenizer.json to embed (default: MODEL/tokenizer.json if present)
    int max_context = 0;        // 0: min(4096, max_position_embeddings)
    int max_rows    = 256;      // prefill chunk (tokens per step); `g4 compile --device cuda`: 1024
    int logits_rows = 16;       // logits rows one step can produce
    // Sessions the memory plan counts (--max-sessions; META placement.sessions): the weights once, each
    // session's arenas, KV cache, workspaces and buffers that many times (g4 serve --max-sessions).
    int sessions = 1;
    std::vector<std::string> gpu_mem; // --gpu-mem [IDX:]SIZE, one per GPU (compiler/placement.h)
    std::string cpu_mem;              // --cpu-mem SIZE: host memory budget
    std::string place;                // --place LIST: component=target items
    bool vision = true, audio = true; // compile the towers the checkpoint has (--no-vision / --no-audio)
    int image_tokens = 280; // --image-tokens: soft tokens an image gives at most (70|140|280|560|1120)
    int64_t max_image_pixels =
        16ll << 20;                // --max-image-pixels: largest input image (width * height) a session takes
    double max_audio_seconds = 30; // --max-audio-seconds: longest clip (Hugging Face's processor keeps 30 s)
    // The video limits the plan records for its sessions (META towers.vision.video; g4 run / chat flags
    // of the same names override them): frames a video gives, the stream's duration and frame count, a
    // frame's pixels (0: max_image_pixels) and the file's size.
    int video_frames                = 32;
    double max_video_seconds        = 3600;
    int64_t max_video_stream_frames = 216000;
    int64_t max_video_pixels        = 0;
    int64_t max_video_bytes         = int64_t(2) << 30;
    std::string
        tower_precision; // --tower-precision: towers' matmuls fp32 (HF float32) | bf16 (faster, ~3e-3 off);
                         // "" = bf16 (fp32 with --weights f32); an explicit fp32 keeps the towers off the GPU
    int max_media_tokens =
        0; // --max-media-tokens: soft tokens a session holds queued; 0: max(2048, one image/clip)
    // Progress of the long stages, called often (the caller rate-limits its output): "weights" (read,
    // merge, quantize, write), then with the fidelity check "fidelity" (the reference model's weights and
    // both logit runs); fraction 0..1 of that stage.
    std::function<void(const char* stage, double fraction)> progress;
};

// The figures of the compile report that callers may want as data (the Python package returns them).
struct CompileReport {
    bool fidelity_measured  = false; // false: a lossless plan, fidelity off, or a dry run
    double fidelity_rel_l2  = 0;     // relative L2 logit error vs the full-precision merged model
    int fidelity_top1_agree = 0;     // calibration positions whose argmax agrees
    int fidelity_tokens     = 0;     // calibration prompt length
    uint64_t weights_bytes = 0, act_arena_bytes = 0, kv_arena_bytes = 0;
    int max_context    = 0;
    int adapter_merged = 0; // weights the adapter changed
};

// Throws g4::CompileError. Progress and the compile report go to `log`; `report` (may be null) receives the
// report's figures once the plan is written.
void compile_plan(const CompileOptions& opt, std::ostream& log, CompileReport* report = nullptr);

} // namespace g4
