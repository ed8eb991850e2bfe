// The towers in the inputs stage of `g4 compile` (compiler/stages.h): their configs and every weight's shape
// checked before any heavy work, their session buffers sized, where each may run. Each is an encoder program
// that runs on the CPU; in a CUDA plan either may run on the plan's GPU instead, as a whole (decided with the
// memory plan, stage_placement.cpp).
#include "compiler/stages.h"
#include "compiler/tower_lookup.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/thread_pool.h"
#include "models/gemma4/audio_graph.h"
#include "models/gemma4/vision_graph.h"
#include "runtime/plan/op_params.h"
#include "runtime/src/frontend/image.h"
#include "runtime/src/frontend/media.h"
#include "runtime/src/log_mel.h"
#include "runtime/src/media/video_decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <optional>

namespace g4::stage {
namespace {

// A checkpoint's tensors as the towers' builders read them (compiler/tower_lookup.h); f16 widened to f32, and
// a tensor that is not 4-byte aligned in the mapped file (a valid safetensors header may have any length)
// copied to aligned storage, since the towers read floats and bf16 words in place.
struct CheckpointLookup {
    const st::Checkpoint& ck;
    std::map<std::string, towers::Tensor> cache;
    std::deque<std::vector<float>> widened;
    const towers::Tensor* operator()(const std::string& rel) {
        auto it = cache.find(rel);
        if (it != cache.end()) return &it->second;
        const std::string hf = "model." + rel;
        if (!ck.has(hf)) return nullptr;
        const st::TensorView& v = ck.get(hf);
        towers::Tensor t;
        t.ndim = (int)v.shape.size();
        if (t.ndim > 4) return nullptr;
        for (int i = 0; i < t.ndim; ++i)
            t.dims[i] = v.shape[i];
        if (v.dtype == st::DType::BF16 || v.dtype == st::DType::F32) {
            t.data  = v.data;
            t.dtype = v.dtype == st::DType::BF16 ? DType::BF16 : DType::F32;
            if (reinterpret_cast<uintptr_t>(v.data) % alignof(float) != 0) {
                widened.emplace_back((v.nbytes + 3) / 4);
                std::memcpy(widened.back().data(), v.data, v.nbytes);
                t.data = widened.back().data();
            }
        } else if (v.dtype == st::DType::F16) {
            widened.emplace_back((size_t)t.numel());
            st::to_f32(v, widened.back().data());
            t.data = widened.back().data();
        } else {
            return nullptr;
        }
        return &(cache[rel] = t);
    }
};

// Refuses a tower whose prompt ids config.json lacks.
void need_ids(const std::string& cfg, const char* tower, const char* what,
              std::initializer_list<std::pair<const char*, int>> ids) {
    for (const auto& [k, v] : ids)
        if (v < 0)
            throw CompileError(cfg + ": " + k + " is missing; it is needed to place " + what +
                               " in a prompt (--no-" + tower + " leaves the tower out)");
}

// The vision encoder program (models/gemma4/vision_graph.h): GEMM matmuls in fp32 or bf16 on the CPU (bf16
// tensor-core GEMMs where stage_placement.cpp puts it on the plan's GPU), the per-thread scratch of its CPU
// kernels. The 0-d ClippableLinear bounds are the Clamp ops' parameters. Every weight it reads is checked
// against the checkpoint's shape.
EncoderProgram vision_program(const gemma4::VisionHParams& h, int max_patches, bool bf16,
                              const towers::Lookup& lookup, const std::string& model_dir) {
    gemma4::VisionBuildOptions o;
    o.max_patches   = max_patches;
    o.matmul_kernel = bf16 ? 2 : 1;
    o.scalar        = [&lookup](const std::string& name) -> std::optional<float> {
        const towers::Tensor* t = lookup(name);
        if (!t) return std::nullopt;
        return towers::tensor_at(*t, 0);
    };
    gemma4::VisionProgram v = gemma4::build_vision_program(h, o);
    for (const gemma4::TensorDesc& d : v.graph.tensors) {
        if (d.kind != plan::TensorKind::Weight || d.role != gemma4::WeightRole::Tower) continue;
        const towers::Tensor* t = lookup(d.name);
        auto shape              = [](const int64_t* dims, size_t n) {
            std::string r = "[";
            for (size_t i = 0; i < n; ++i)
                r += (i ? ", " : "") + std::to_string(dims[i]);
            return r + "]";
        };
        if (!t)
            throw CompileError("vision tower of " + model_dir + ": the checkpoint has no 'model." + d.name +
                               "' (--no-vision leaves the tower out)");
        if ((size_t)t->ndim != d.dims.size() || !std::equal(d.dims.begin(), d.dims.end(), t->dims))
            throw CompileError("vision tower of " + model_dir + ": 'model." + d.name + "' has shape " +
                               shape(t->dims, (size_t)t->ndim) + ", expected " +
                               shape(d.dims.data(), d.dims.size()) + " (--no-vision leaves the tower out)");
    }
    EncoderProgram e;
    e.name     = "vision";
    e.graph    = std::move(v.graph);
    e.inputs   = {v.pixels, v.positions, v.pool_index};
    e.outputs  = {v.output};
    e.max_rows = {v.max_patches, v.max_cells, 0, 0};
    const int64_t max_k =
        std::max({(int64_t)3 * h.patch_size * h.patch_size, (int64_t)h.hidden_size,
                  (int64_t)h.intermediate_size, (int64_t)h.num_attention_heads * h.head_dim});
    e.thread_floats = std::max({cpu::scratch_floats_per_thread(max_k, 0), cpu::gemm_scratch_floats(),
                                bf16 ? cpu::gemm_bf16_scratch_floats() : 0,
                                cpu::self_attention_thread_floats(max_patches)});
    return e;
}

void check_vision(Inputs& in, const std::string& cfg, const towers::Lookup& lookup, towers::Precision prec,
                  rt::MediaSizing& z) {
    const CompileOptions& opt  = in.opt;
    TowerSizing& ts            = in.towers;
    auto& vision_gpu_bytes     = ts.vision_gpu_bytes;
    auto& vision_gpu_no        = ts.vision_gpu_no;
    auto& vision_host_bytes    = ts.vision_host_bytes;
    auto& vision_thread_floats = ts.vision_thread_floats;
    auto& preprocess_floats    = ts.preprocess_floats;
    const int H                = in.mc.text.hidden_size;
    gemma4::VisionHParams h;
    std::string e = gemma4::parse_vision_config(in.mc.vision_config_json, H, &h);
    if (!e.empty()) throw CompileError(cfg + ": vision_config: " + e + " (--no-vision leaves the tower out)");
    if (opt.image_tokens != 70 && opt.image_tokens != 140 && opt.image_tokens != 280 &&
        opt.image_tokens != 560 && opt.image_tokens != 1120)
        throw CompileError("--image-tokens " + std::to_string(opt.image_tokens) +
                           ": expected 70, 140, 280, 560 or 1120 (Gemma 4's image token budgets)");
    if (opt.max_image_pixels < 1) throw CompileError("--max-image-pixels must be positive");
    if (opt.video_frames < 1 || opt.video_frames > media::kMaxVideoFrames)
        throw CompileError("--video-frames " + std::to_string(opt.video_frames) + " is outside 1.." +
                           std::to_string(media::kMaxVideoFrames));
    if (!(opt.max_video_seconds > 0) || !std::isfinite(opt.max_video_seconds))
        throw CompileError("--max-video-seconds must be a positive number of seconds");
    if (opt.max_video_stream_frames < 1 || opt.max_video_bytes < 1 || opt.max_video_pixels < 0)
        throw CompileError(
            "--max-video-stream-frames, --max-video-pixels and --max-video-bytes must be positive");
    if (opt.max_video_pixels > opt.max_image_pixels)
        throw CompileError("--max-video-pixels " + std::to_string(opt.max_video_pixels) +
                           " is over --max-image-pixels " + std::to_string(opt.max_image_pixels) +
                           " (a frame goes through the image buffers)");
    need_ids(cfg, "vision", "images",
             {{"image_token_id", in.mc.image_token_id},
              {"boi_token_id", in.mc.boi_token_id},
              {"eoi_token_id", in.mc.eoi_token_id}});
    const int k = h.pooling_kernel_size, patch = h.patch_size, max_patches = opt.image_tokens * k * k;
    EncoderProgram prog =
        vision_program(h, max_patches, prec == towers::Precision::BF16, lookup, opt.model_dir);
    // The program on the GPU: bf16 tensor-core matmuls and the flash kernel (head dims 16..512, powers of
    // two).
    const int hd = h.head_dim;
    if (in.cuda_index < 0)
        vision_gpu_no = "a CPU plan";
    else if (opt.weights == "f32")
        vision_gpu_no =
            "the GPU vision tower needs bf16 weights, and --weights f32 stores the towers' as f32";
    else if (opt.tower_precision == "fp32")
        vision_gpu_no = "--tower-precision fp32 was given, and the GPU vision tower's matmuls are "
                        "bf16 with fp32 accumulation";
    else if (hd < 16 || hd > 512 || (hd & (hd - 1)))
        vision_gpu_no =
            "its head_dim " + std::to_string(hd) + " has no GPU attention kernel (16..512, powers of two)";
    vision_gpu_bytes     = 0; // the program's arena, known with the memory plan (stage_placement.cpp)
    vision_host_bytes    = (size_t)max_patches * 8; // the patch grid's cells, on either device
    vision_thread_floats = prog.thread_floats;
    z.vision             = true;
    z.vision_scratch     = vision_host_bytes;
    z.resize_scratch     = towers::preprocess_reserve_bytes(opt.max_image_pixels, opt.image_tokens, patch, k);
    z.patch_floats       = (int64_t)max_patches * 3 * patch * patch;
    z.max_patches        = max_patches;
    preprocess_floats    = towers::preprocess_thread_floats(opt.image_tokens, patch, k);
    z.thread_floats      = std::max({z.thread_floats, (size_t)prog.thread_floats, preprocess_floats});
    z.max_soft           = std::max(z.max_soft, opt.image_tokens);
    in.encoders.push_back(std::move(prog));
    plan::MetaVision& v = towers_meta(in).vision.emplace();
    v.config            = json::parse(in.mc.vision_config_json).dump();
    v.image_tokens      = opt.image_tokens;
    v.max_patches       = max_patches;
    v.max_image_pixels  = opt.max_image_pixels;
    v.image_token_id    = in.mc.image_token_id;
    v.boi_token_id      = in.mc.boi_token_id;
    v.eoi_token_id      = in.mc.eoi_token_id;
    v.video_token_id    = in.mc.video_token_id;
    if (v.video_token_id >= 0)
        v.video = plan::MetaVideo{opt.video_frames, opt.max_video_seconds, opt.max_video_stream_frames,
                                  opt.max_video_pixels > 0 ? opt.max_video_pixels : opt.max_image_pixels,
                                  opt.max_video_bytes};
    v.program             = "vision";
    v.patch_size          = patch;
    v.pooling_kernel_size = k;
    v.position_size       = h.position_embedding_size;
    v.pixel_mean          = 0.5f;
    v.pixel_std           = 0.5f;
}

// Why the audio program cannot run on the plan's GPU (the encoder runner,
// runtime/src/cuda/encoder_launch.cpp), or "". Its matmuls there are bf16 tensor-core GEMMs with fp32
// accumulation; two of the sequence kernels (kernels/cuda/sequence_ops.cu) keep a block's data in shared
// memory, at most the 48 KiB a kernel gets without opting in: g4_conv2d_norm_relu a 3x3 input patch and one
// position's outputs, g4_local_attention one query's logits over its window.
std::string audio_gpu_no(const CompileOptions& opt, const EncoderProgram& prog) {
    if (opt.weights == "f32")
        return "the GPU audio tower needs bf16 weights, and --weights f32 stores the towers' as f32";
    if (opt.tower_precision == "fp32")
        return "--tower-precision fp32 was given, and the GPU audio tower's matmuls are bf16 with fp32 "
               "accumulation";
    constexpr size_t kSmem = 48 * 1024;
    for (const gemma4::OpDesc& o : prog.graph.ops) {
        if (o.op.code == (uint16_t)OpCode::Conv2dNormRelu) {
            const auto c      = plan::params<plan::Conv2dNormReluParams>(o.op);
            const size_t need = sizeof(float) * (9 * (size_t)c.c_in + (size_t)c.c_out);
            if (need > kSmem)
                return "its convolution " + o.name + " (" + std::to_string(c.c_in) + " to " +
                       std::to_string(c.c_out) + " channels: audio_config subsampling_conv_channels) needs " +
                       std::to_string(need) + " bytes of GPU shared memory, more than the kernel's 48 KiB";
        } else if (o.op.code == (uint16_t)OpCode::LocalAttention) {
            const auto a      = plan::params<plan::LocalAttentionParams>(o.op);
            const size_t need = sizeof(float) * (size_t)a.window;
            if (need > kSmem)
                return "its attention window of " + std::to_string(a.window) +
                       " keys (audio_config attention_context_left) needs " + std::to_string(need) +
                       " bytes of GPU shared memory, more than the kernel's 48 KiB";
        }
    }
    return "";
}

// The audio encoder program (models/gemma4/audio_graph.h), its input made by the runtime's log-mel front end
// on the CPU (META towers.audio). Every checkpoint tensor it reads is shape-checked here; the ClippableLinear
// bounds are read into its Clamp ops' parameters.
EncoderProgram audio_program(const gemma4::AudioHParams& h, int64_t max_samples, bool bf16,
                             const towers::Lookup& lookup, const std::string& where) {
    gemma4::AudioBuildOptions o;
    o.max_samples  = max_samples;
    o.bf16_matmuls = bf16;
    auto read      = [&](const std::string& name, std::vector<float>* v) -> std::string {
        const towers::Tensor* t = lookup(name);
        if (!t) return "missing tensor 'model." + name + "' in " + where;
        v->resize((size_t)t->numel());
        for (int64_t i = 0; i < t->numel(); ++i)
            (*v)[(size_t)i] = towers::tensor_at(*t, i);
        return "";
    };
    gemma4::AudioProgram a;
    if (std::string e = gemma4::build_audio_program(h, o, read, &a); !e.empty())
        throw CompileError("audio tower of " + where + ": " + e + " (--no-audio leaves the tower out)");
    for (const auto& t : a.graph.tensors) {
        if (t.kind != plan::TensorKind::Weight || t.role != gemma4::WeightRole::Tower) continue;
        const towers::Tensor* w = lookup(t.name);
        std::vector<int64_t> dims;
        for (int d = 0; w && d < w->ndim; ++d)
            dims.push_back(w->dims[d]);
        auto shape = [](const std::vector<int64_t>& v) {
            std::string r = "[";
            for (size_t i = 0; i < v.size(); ++i)
                r += (i ? ", " : "") + std::to_string(v[i]);
            return r + "]";
        };
        if (!w)
            throw CompileError("audio tower of " + where + ": the checkpoint has no 'model." + t.name +
                               "' (--no-audio leaves the tower out)");
        if (dims != t.dims)
            throw CompileError("audio tower of " + where + ": 'model." + t.name + "' has shape " +
                               shape(dims) + ", expected " + shape(t.dims) +
                               " (--no-audio leaves the tower out)");
    }
    EncoderProgram e;
    e.name          = "audio";
    e.graph         = std::move(a.graph);
    e.inputs        = {a.features};
    e.outputs       = {a.output};
    e.max_rows      = a.max_rows;
    e.thread_floats = a.thread_floats;
    return e;
}

void check_audio(Inputs& in, const std::string& cfg, const towers::Lookup& lookup, towers::Precision prec,
                 rt::MediaSizing& z) {
    const CompileOptions& opt = in.opt;
    TowerSizing& ts           = in.towers;
    const int H               = in.mc.text.hidden_size;
    gemma4::AudioHParams h;
    std::string e = gemma4::parse_audio_hparams(in.mc.audio_config_json, H, &h);
    if (!e.empty()) throw CompileError(cfg + ": audio_config: " + e + " (--no-audio leaves the tower out)");
    if (!(opt.max_audio_seconds > 0 && opt.max_audio_seconds <= 3600))
        throw CompileError("--max-audio-seconds must be in (0, 3600]");
    need_ids(cfg, "audio", "audio",
             {{"audio_token_id", in.mc.audio_token_id},
              {"boa_token_id", in.mc.boa_token_id},
              {"eoa_token_id", in.mc.eoa_token_id}});
    const gemma4::AudioFrontEnd fe = gemma4::audio_front_end(h);
    const int64_t max_samples      = (int64_t)std::llround(opt.max_audio_seconds * fe.sample_rate);
    EncoderProgram prog =
        audio_program(h, max_samples, prec == towers::Precision::BF16, lookup, opt.model_dir);
    media::LogMel mel;
    const media::LogMelParams lp{fe.sample_rate, fe.frame_length, fe.hop_length, fe.fft_length,
                                 fe.mel_bins,    fe.min_hz,       fe.max_hz,     fe.mel_floor};
    if (e = mel.init(lp); !e.empty()) throw CompileError("audio tower of " + opt.model_dir + ": " + e);
    // The CPU: the program (its own arena) and the log-mel front end writing its input; on the plan's GPU the
    // program's arena is device memory (sized with the memory plan) and the front end stays on the CPU.
    const size_t cpu_floats = std::max<size_t>(prog.thread_floats, mel.thread_floats());
    ts.audio_thread_floats  = cpu_floats;
    ts.audio_feature_floats = mel.thread_floats();
    ts.audio_gpu_no         = in.cuda_index < 0 ? "a CPU plan" : audio_gpu_no(opt, prog);
    z.audio                 = true;
    z.thread_floats         = std::max(z.thread_floats, cpu_floats);
    z.max_soft              = std::max(z.max_soft, prog.max_rows[gemma4::kAudioTokens]);
    in.encoders.push_back(std::move(prog));
    plan::MetaAudio& a = towers_meta(in).audio.emplace();
    a.config           = json::parse(in.mc.audio_config_json).dump();
    a.max_samples      = max_samples;
    a.sample_rate      = fe.sample_rate;
    a.audio_token_id   = in.mc.audio_token_id;
    a.boa_token_id     = in.mc.boa_token_id;
    a.eoa_token_id     = in.mc.eoa_token_id;
    a.program          = "audio";
    a.frame_length     = fe.frame_length;
    a.hop_length       = fe.hop_length;
    a.fft_length       = fe.fft_length;
    a.mel_bins         = fe.mel_bins;
    a.min_hz           = fe.min_hz;
    a.max_hz           = fe.max_hz;
    a.mel_floor        = fe.mel_floor;
}

} // namespace

rt::MediaSizing TowerSizing::sizing(bool vision_gpu, bool audio_gpu) const {
    rt::MediaSizing z = z_cpu;
    if (vision_gpu) z.vision_scratch = vision_host_bytes;
    z.thread_floats = std::max({vision_gpu ? 0 : vision_thread_floats, preprocess_floats,
                                audio_gpu ? audio_feature_floats : audio_thread_floats});
    return z;
}

// META's per-thread scratch and session figures of the towers' host buffers, sized as z.
void record_tower_sizing(Inputs& in, const rt::MediaSizing& z) {
    towers_meta(in).thread_scratch_floats = z.thread_floats;
    in.tower_session_bytes                = rt::media_block(z).total(); // with this machine's thread count
    rt::MediaSizing fixed                 = z;
    fixed.threads                         = 0;
    towers_meta(in).session_bytes         = rt::media_block(fixed).total(); // less the per-thread scratch
}

void check_towers(Inputs& in, placement::Placement& place) {
    const auto& hp            = in.mc.text;
    const CompileOptions& opt = in.opt;
    TowerSizing& ts           = in.towers;
    auto& vision_gpu_no       = ts.vision_gpu_no;
    auto& audio_gpu_no        = ts.audio_gpu_no;
    const std::string cfg     = opt.model_dir + "/config.json";
    const int threads         = cpu::default_thread_count();
    rt::MediaSizing z; // the towers' session buffers, as media_create allocates them
    z.hidden   = hp.hidden_size;
    z.max_rows = opt.max_rows;
    z.threads  = threads;
    CheckpointLookup ck{*in.ckpt, {}, {}};
    towers::Lookup lookup = [&ck](const std::string& n) { return ck(n); };
    // Default: bf16, as the GPU's towers and Hugging Face's bf16 checkpoints compute; fp32 (Hugging Face
    // float32) with --weights f32, the reference build.
    const std::string tower_precision = !opt.tower_precision.empty() ? opt.tower_precision
                                        : opt.weights == "f32"       ? "fp32"
                                                                     : "bf16";
    towers::Precision prec            = towers::Precision::F32;
    if (std::string e = towers::parse_precision(tower_precision, &prec); !e.empty())
        throw CompileError("--tower-precision: " + e);
    if (in.mc.has_vision && opt.vision) check_vision(in, cfg, lookup, prec, z);
    if (in.mc.has_audio && opt.audio) check_audio(in, cfg, lookup, prec, z);
    if (!in.tower_names.empty() || !in.encoders.empty()) {
        // Default: 2048, or more where one image or clip gives more; with video, a whole video (its frames
        // at the video processor's budget) and an image besides.
        int64_t dflt = std::max<int64_t>(2048, z.max_soft);
        if (const auto& v = towers_meta(in).vision; v && v->video)
            dflt = std::max<int64_t>(dflt, int64_t(v->video->frames) *
                                                   std::min(rt::kVideoFrameTokens, v->image_tokens) +
                                               v->image_tokens);
        int64_t queue = opt.max_media_tokens > 0 ? opt.max_media_tokens : dflt;
        queue         = std::min<int64_t>(queue, in.max_context);
        if (opt.max_media_tokens > in.max_context)
            throw CompileError("--max-media-tokens " + std::to_string(opt.max_media_tokens) +
                               " exceeds --max-context " + std::to_string(in.max_context));
        towers_meta(in).max_media_tokens = (int32_t)queue;
        towers_meta(in).precision        = towers::precision_name(prec);
        z.queue_rows                     = (int32_t)queue;
        record_tower_sizing(in, z);
        ts.z_cpu = z;
    }
    auto where = [&](const char* c, bool has, bool want) {
        place.tower_where[c] = !has    ? "not in the checkpoint"
                               : !want ? std::string("left out (--no-") + c + ")"
                                       : "cpu";
    };
    where("vision", in.mc.has_vision, opt.vision);
    where("audio", in.mc.has_audio, opt.audio);
    auto can_run = [&](const char* c, bool has, const std::string& no, bool& gpu, bool& automatic,
                       std::string& why) {
        const std::string item =
            std::string("--place ") + c + "=" + (place.towers.count(c) ? place.towers[c] : "gpu");
        if (!has) {
            if (gpu)
                throw CompileError(item + ": the plan has no " + c + " tower (" + place.tower_where[c] + ")");
            automatic = false;
        } else if (!no.empty()) {
            if (gpu) throw CompileError(item + ": " + no + "; --place " + c + "=cpu runs it on the CPU");
            if (automatic) why = no;
            automatic = false;
        }
    };
    can_run("vision", in.mc.has_vision && opt.vision, vision_gpu_no, place.vision_gpu, place.vision_auto,
            place.vision_why);
    can_run("audio", in.mc.has_audio && opt.audio, audio_gpu_no, place.audio_gpu, place.audio_auto,
            place.audio_why);
}

} // namespace g4::stage
