// `g4 compile`: a Hugging Face checkpoint (and PEFT adapter) -> one plan file, through compiler/compile.h;
// the long stages show progress on stderr.
#include "compiler/compile.h"
#include "tools/cli_common.h"

#include <filesystem>
#include <iostream>
#include <memory>

namespace g4::cli {

const Command kCompile = {
    "compile",
    "--model DIR -o PLAN [options]",
    "Compiles a Hugging Face Gemma 4 checkpoint directory (config.json, safetensors, tokenizer.json; the "
    "output of save_pretrained) into one plan file, optionally with a PEFT LoRA adapter merged in. The "
    "report on stderr gives the placement, the memory plan and, for lossy plans, the fidelity figure.",
    {
        {"--model", "DIR",
         "the checkpoint directory (gemma4 or gemma4_text; single-file or sharded safetensors)"},
        {"-o", "PLAN", "the plan file to write (atomically: a temporary file renamed over it)"},
        {"--adapter", "DIR",
         "a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors), merged in "
         "fp32 before quantization"},
        {"--tokenizer", "FILE",
         "the tokenizer.json to embed. Default: DIR/tokenizer.json; without one the plan "
         "takes token ids only (a warning says so)"},
        {"--weights", "nf4|bf16|f32",
         "stored weight type: nf4 puts the text decoder's projections in NF4 and "
         "the rest in bf16. Default: nf4"},
        {"--quantize", "REGEX",
         "NF4 for the matmul weights whose Hugging Face name matches (replaces the "
         "default set)"},
        {"--keep", "REGEX", "never quantize the weights whose Hugging Face name matches"},
        {"--double-quant", nullptr,
         "8-bit NF4 absmax (bitsandbytes' double quantization). Default: fp32 absmax"},
        {"--no-fidelity", nullptr,
         "skip the fidelity check of lossy plans (saves about 40% of an E2B "
         "compile). Default: measured"},
        {"--no-lm-screen", nullptr,
         "no int8 copy of the LM head (about 1 byte a head weight, built when a plan is opened) to "
         "screen the head of greedy decode steps: every step computes every logit. Default: screened "
         "where the plan's memory budget allows"},
        {"--device", "cpu|cuda[:N]", "where the text decoder runs. Default: cpu"},
        {"--target", "sm_XX", "CUDA architecture (sm_80, sm_86, sm_89, sm_90). Default: the GPU present"},
        {"--prefill-precision", "bf16|fp32",
         "CUDA prefill matmuls: bf16 tensor cores or exact fp32. Default: bf16"},
        {"--cpu-precision", "fast|bf16|f32",
         "CPU matmuls: NF4 weights with int16 activations in integer dot products (~6e-5 relative "
         "error a matmul; decode 1.2-1.45x, prefill ~2x faster), bf16 weights (the LM head) widened in "
         "registers, vectorised GELU and prefill attention; bf16: fast, and the NF4 matmuls of prefill "
         "chunks with bf16 operands on AMX tiles where the CPU has them (1.4-1.9x faster prefill, ~1e-2 "
         "relative error in the logits); or fp32 throughout as the reference. Default: fast"},
        {"--mlp-precision", "f16|f32",
         "sm_90 decode MLP products: packed f16 (~1e-3 relative error an MLP, "
         "~5% faster) or f32. Default: f16"},
        {"--deterministic", nullptr,
         "CUDA decode sums in a fixed order: bit-identical runs (sm_90 decode "
         "~3-4% slower). Default: off"},
        {"--mlp-replicas", "auto|1|2|3|4",
         "sm_90 fused MLP output replicas, for measurements. Default: auto"},
        {"--ple-fold", "on|off", "sm_90: the ResNorm before a PLE inside the PLE's kernel. Default: on"},
        {"--mlp-fold", "one-wave|all|off",
         "sm_90: the ResNorm before a packed-f16 MLP inside the MLP's kernel. "
         "Default: one-wave"},
        {"--kernel-trace", "off|launches|blocks",
         "CUDA kernels that record timers (G4_TRACE_OUT names the "
         "file; ~8% slower, not for use). Default: off"},
        {"--kv-dtype", "bf16|f32", "KV cache element type. Default: bf16 for CUDA plans, f32 for CPU plans"},
        {"--max-context", "N", "positions a session holds. Default: min(4096, max_position_embeddings)"},
        {"--chunk", "N", "tokens per prefill step. Default: 256 (CPU plans), 1024 (CUDA plans)"},
        {"--logits-rows", "N", "logits rows one step can produce. Default: 16"},
        {"--max-sessions", "N",
         "sessions the memory plan counts (g4 serve --max-sessions): the weights once, each session's KV "
         "cache and buffers N times, 1..256. Default: 1"},
        {"--gpu-mem", "[IDX:]SIZE",
         "GPU memory budget (12GiB, 4GB, 512MiB; repeatable, one per GPU). "
         "Default: none (nothing is placed on a GPU without one)"},
        {"--cpu-mem", "SIZE", "host memory budget. Default: none"},
        {"--place", "LIST",
         "component=target items: components vision, audio, ple, embed, lm_head, layers; "
         "targets cpu, gpu, gpuN, cuda:N, host (ple only); layers=0-29:gpu0,30-34:cpu "
         "gives ranges (docs/placement.md)"},
        {"--dry-run", nullptr, "validate and print the placement and memory plan; write nothing"},
        {"--no-vision", nullptr, "leave the vision tower out"},
        {"--no-audio", nullptr, "leave the audio tower out"},
        {"--image-tokens", "70|140|280|560|1120", "soft tokens an image gives at most. Default: 280"},
        {"--max-image-pixels", "N",
         "largest input image (width x height) a session takes. Default: 16777216"},
        {"--max-audio-seconds", "S", "longest audio clip. Default: 30"},
        {"--video-frames", "N",
         "frames a video gives by default (g4 run / chat --video-frames overrides it), 1..1024. Default: 32"},
        {"--max-video-seconds", "S", "longest video stream by default. Default: 3600"},
        {"--max-video-stream-frames", "N", "most frames a video stream may hold by default. Default: 216000"},
        {"--max-video-pixels", "N",
         "largest video frame (width x height) by default; at most --max-image-pixels. Default: that"},
        {"--max-video-bytes", "N", "largest video file by default. Default: 2147483648"},
        {"--max-media-tokens", "N",
         "soft tokens a session holds queued. Default: max(2048, one image/clip, with video: one video "
         "(--video-frames x 70) and an image)"},
        {"--tower-precision", "fp32|bf16",
         "towers' matmuls: fp32 (Hugging Face float32) or bf16 (faster, ~3e-3 "
         "off). Default: bf16; fp32 with --weights f32"},
    },
    "Fidelity (lossy plans: NF4 weights or an adapter): the plan and the full-precision (fp32, adapter "
    "merged, unquantized) model both run a 32-token calibration prompt on the CPU; the report gives the "
    "relative L2 distance of their logits (0 = identical) and on how many positions both pick the same next "
    "token (docs/architecture.md). Progress of the weights and fidelity stages goes to stderr: a bar on a "
    "terminal, a line every 10% otherwise."};

int cmd_compile(int argc, char** argv) {
    Args a(argc, argv, 2, kCompile);
    if (!a.pos.empty()) throw UsageError("unexpected argument '" + a.pos[0] + "'");
    if (!a.has("--model")) throw UsageError("missing --model DIR");
    if (!a.has("-o") && !a.on("--dry-run")) throw UsageError("missing -o PLAN");
    g4::CompileOptions o;
    o.model_dir   = a.get("--model");
    o.adapter_dir = a.get("--adapter");
    o.out_path    = a.get("-o");
    o.weights     = a.get("--weights", o.weights);
    o.device      = a.get("--device", o.device);
    if (a.has("--max-context"))
        o.max_context = (int)parse_int("--max-context", a.get("--max-context"), 1, 1 << 30);
    // Prefill chunk: 256 rows on the CPU (the int16 GEMM's tasks then cover 8 row tiles; E2B activations
    // ~48 MiB); 1024 on a GPU, where tensor cores and the per-chunk NF4 dequantisation want long chunks
    // (E2B/E4B activations at 1024 rows: ~190 MiB).
    if (o.device.rfind("cuda", 0) == 0) o.max_rows = 1024;
    if (a.has("--chunk")) o.max_rows = (int)parse_int("--chunk", a.get("--chunk"), 1, 8192);
    if (a.has("--logits-rows"))
        o.logits_rows = (int)parse_int("--logits-rows", a.get("--logits-rows"), 1, 8192);
    if (o.logits_rows > o.max_rows) o.logits_rows = o.max_rows;
    if (a.has("--max-sessions"))
        o.sessions = (int)parse_int("--max-sessions", a.get("--max-sessions"), 1, 256);
    o.quantize_regex    = a.get("--quantize");
    o.keep_regex        = a.get("--keep");
    o.double_quant      = a.on("--double-quant");
    o.fidelity          = !a.on("--no-fidelity");
    o.tokenizer_path    = a.get("--tokenizer");
    o.dry_run           = a.on("--dry-run");
    o.lm_screen         = !a.on("--no-lm-screen");
    o.cuda_target       = a.get("--target");
    o.prefill_precision = a.get("--prefill-precision", o.prefill_precision);
    o.deterministic     = a.on("--deterministic");
    o.mlp_precision     = a.get("--mlp-precision", o.mlp_precision);
    o.cpu_precision     = a.get("--cpu-precision", o.cpu_precision);
    o.mlp_replicas      = a.get("--mlp-replicas", o.mlp_replicas);
    o.ple_fold          = a.get("--ple-fold", o.ple_fold);
    o.mlp_fold          = a.get("--mlp-fold", o.mlp_fold);
    o.kernel_trace      = a.get("--kernel-trace", o.kernel_trace);
    o.kv_dtype          = a.get("--kv-dtype");
    if (a.has("--kv-dtype") && o.kv_dtype.empty()) throw UsageError("--kv-dtype needs a value: bf16 or f32");
    if (a.multi.count("--gpu-mem")) o.gpu_mem = a.multi.at("--gpu-mem");
    o.cpu_mem = a.get("--cpu-mem");
    if (a.multi.count("--place"))
        for (const auto& p : a.multi.at("--place"))
            o.place += (o.place.empty() ? "" : ",") + p;
    o.vision = !a.on("--no-vision");
    o.audio  = !a.on("--no-audio");
    if (a.has("--image-tokens"))
        o.image_tokens = (int)parse_int("--image-tokens", a.get("--image-tokens"), 1, 1 << 20);
    if (a.has("--max-image-pixels"))
        o.max_image_pixels = parse_int("--max-image-pixels", a.get("--max-image-pixels"), 1, 1ll << 32);
    if (a.has("--max-audio-seconds"))
        o.max_audio_seconds = parse_float("--max-audio-seconds", a.get("--max-audio-seconds"));
    if (a.has("--video-frames"))
        o.video_frames = (int)parse_int("--video-frames", a.get("--video-frames"), 1, 1 << 20);
    if (a.has("--max-video-seconds"))
        o.max_video_seconds = parse_float("--max-video-seconds", a.get("--max-video-seconds"));
    if (a.has("--max-video-stream-frames"))
        o.max_video_stream_frames =
            parse_int("--max-video-stream-frames", a.get("--max-video-stream-frames"), 1, int64_t(1) << 40);
    if (a.has("--max-video-pixels"))
        o.max_video_pixels =
            parse_int("--max-video-pixels", a.get("--max-video-pixels"), 1, int64_t(1) << 40);
    if (a.has("--max-video-bytes"))
        o.max_video_bytes = parse_int("--max-video-bytes", a.get("--max-video-bytes"), 1, int64_t(1) << 50);
    o.tower_precision = a.get("--tower-precision", o.tower_precision);
    if (a.has("--max-media-tokens"))
        o.max_media_tokens = (int)parse_int("--max-media-tokens", a.get("--max-media-tokens"), 1, 1 << 30);
    namespace fs = std::filesystem;
    if (o.tokenizer_path.empty() && fs::exists(fs::path(o.model_dir) / "config.json") &&
        !fs::exists(fs::path(o.model_dir) / "tokenizer.json"))
        std::fprintf(
            stderr,
            "g4 compile: warning: %s has no tokenizer.json: the plan will take token ids only (g4 run "
            "--tokens); -p TEXT and g4 chat need a tokenizer: copy the model's tokenizer.json into %s or "
            "pass --tokenizer FILE\n",
            o.model_dir.c_str(), o.model_dir.c_str());
    std::unique_ptr<Progress> bar;
    std::string stage;
    o.progress = [&](const char* s, double f) {
        if (stage != s) {
            if (bar) bar->done();
            stage = s;
            bar   = std::make_unique<Progress>(std::string("g4 compile: ") + s);
        }
        bar->update(f);
        if (f >= 1.0) bar->done();
    };
    g4::compile_plan(o, std::cerr);
    return 0;
}

} // namespace g4::cli
