// The report stage of `g4 compile` (compiler/stages.h): the adapter's modules checked against what was
// compiled, the compile report and the --dry-run summary (tensor groups, placement, per-device memory).
#include "compiler/stages.h"
#include "models/gemma4/names.h"

#include <cstdio>
#include <cstring>
#include <ostream>

namespace g4::stage {
namespace {

// The compile report's bytes per tensor group, before (checkpoint) and after (plan).
void print_groups(std::ostream& log, const Report& rep) {
    log << "  tensor group        tensors      before        after\n";
    for (const auto& [name, g] : rep.groups) {
        char line[160];
        std::snprintf(line, sizeof line, "  %-18s %8d %12s %12s\n", name.c_str(), g.tensors,
                      human(g.before).c_str(), human(g.after).c_str());
        log << line;
    }
}

// Placement and the per-device memory table (compile report and --dry-run).
void print_memory_plan(std::ostream& log, const placement::Decision& d, const Report& rep) {
    log << "  placement: " << d.placement_line() << "\n";
    if (d.placement.hybrid())
        log << "  cross-device: " << rep.cross.copies_to_host << " copy step(s) to the host, "
            << rep.cross.copies_to_device << " from the host and " << rep.cross.copies_peer
            << " between GPUs per step; " << rep.cross.mirrors
            << " KV cache(s) mirrored onto another device for KV-shared layers whose donor runs there\n";
    for (const auto& n : d.placement.notes)
        log << "  note: " << n << "\n";
    log << "  memory plan (exact bytes; CUDA context and allocator overhead not included"
        << (d.placement.sessions > 1 ? "; " + std::to_string(d.placement.sessions) + " sessions"
                                     : std::string())
        << "):\n";
    placement::print_memory(log, d.memory, "    ");
    if (d.placement.cuda_index >= 0)
        log << "    (the host also maps the plan file and reads its " << human(rep.weights_bytes)
            << " of weights once at load)\n";
}

} // namespace

// Adapter modules that matched nothing in the compiled model: dropped with a report line where they have
// no effect, refused otherwise.
DroppedModules check_adapter_consumed(const Inputs& in) {
    const CompileOptions& opt = in.opt;
    const auto& hp            = in.mc.text;
    DroppedModules dropped;
    auto& dropped_shared = dropped.shared;
    auto& dropped_tower  = dropped.tower;
    if (in.adapter) {
        for (const auto& m : in.adapter->unconsumed()) {
            using gemma4::UnusedModule;
            const UnusedModule why = gemma4::classify_unused(hp, m);
            if (why == UnusedModule::KvShared) {
                dropped_shared.push_back(m);
            } else if (why == UnusedModule::VisionTower && (!in.mc.has_vision || !opt.vision)) {
                dropped_tower.push_back(m);
            } else if (why == UnusedModule::AudioTower && (!in.mc.has_audio || !opt.audio)) {
                dropped_tower.push_back(m);
            } else {
                throw CompileError("adapter " + opt.adapter_dir + " targets '" + m +
                                   "', which is not in this model; is the adapter for another model?");
            }
        }
    }
    return dropped;
}

void print_dry_run(std::ostream& log, const Inputs& in, const placement::Decision& mem, const Report& rep) {
    const CompileOptions& opt   = in.opt;
    const auto& hp              = in.mc.text;
    const std::string& kv_dtype = in.kv_dtype_name;
    log << "g4 compile --dry-run: " << opt.model_dir << " (" << in.mc.model_type << ", " << hp.num_layers
        << " layers, " << hp.num_kv_shared_layers << " KV-shared), policy: weights " << opt.weights
        << "; KV cache " << kv_dtype << "; nothing written\n";
    print_groups(log, rep);
    print_memory_plan(log, mem, rep);
    log << "  KV cache: " << kv_dtype << ", max_context " << in.max_context << ", sliding ring "
        << rep.sliding_slots << " slots, KV-shared layers own none"
        << (mem.placement.hybrid() ? " (except mirrors of caches whose donor runs on another device)" : "")
        << "\n";
}

void print_report(std::ostream& log, const Inputs& in, const placement::Decision& mem, const Report& rep,
                  const DroppedModules& dropped) {
    const CompileOptions& opt       = in.opt;
    const auto& hp                  = in.mc.text;
    const std::string& kv_dtype     = in.kv_dtype_name;
    const auto& dropped_shared      = dropped.shared;
    const auto& dropped_tower       = dropped.tower;
    const uint64_t vision_gpu_bytes = in.towers.vision_gpu_bytes, audio_gpu_bytes = in.towers.audio_gpu_bytes;
    log << "g4 compile: " << opt.model_dir << " (" << in.mc.model_type << ", " << in.mc.head_dim_form
        << " config, " << hp.num_layers << " layers, " << hp.num_kv_shared_layers << " KV-shared) -> "
        << opt.out_path << "\n";
    log << "  policy: weights " << opt.weights << (opt.double_quant ? " (double quant)" : "")
        << (opt.quantize_regex.empty() ? "" : ", --quantize " + opt.quantize_regex)
        << (opt.keep_regex.empty() ? "" : ", --keep " + opt.keep_regex) << "; KV cache " << kv_dtype << "\n";
    print_groups(log, rep);
    if (in.cuda_index >= 0)
        log << "  CUDA kernels: " << in.cuda_target << " cubin + PTX"
            << (in.cuda_spec.attn_hpg ? ", decode attention for " + std::to_string(in.cuda_spec.attn_hpg) +
                                            " heads per KV group"
                                      : "")
            << (in.kernels_cached ? " (from the kernel cache)" : " (NVRTC)") << "\n";
    if (in.adapter) {
        log << "  adapter " << opt.adapter_dir << ": " << rep.merged.size() << " weights merged in fp32\n";
        for (const auto& m : in.adapter->merges()) {
            char line[320];
            std::snprintf(line, sizeof line, "    %-60s r=%-3d alpha=%-6g scale=%-8g%s%s\n", m.module.c_str(),
                          m.r, m.alpha, m.scale, m.dora ? " dora" : "", m.has_bias ? " bias" : "");
            log << line;
        }
        for (const auto& m : in.adapter->replacements())
            log << "    replaced (modules_to_save): " << m << "\n";
        for (const auto& m : dropped_shared)
            log << "  dropped " << m
                << ": LoRA on the k/v of a KV-shared layer has no effect in Gemma 4 (those weights are never "
                   "used)\n";
        for (const auto& m : dropped_tower)
            log << "  not compiled " << m
                << ": its tower is left out of the plan (--no-vision / --no-audio)\n";
    }
    log << "  weights " << human(rep.weights_bytes) << "; activation arena " << human(rep.act_arena)
        << "; KV cache " << human(rep.kv_arena) << " (" << kv_dtype << ", max_context " << in.max_context
        << ", sliding ring " << rep.sliding_slots << " slots, chunk " << opt.max_rows << ")\n";
    print_memory_plan(log, mem, rep);
    log << "  ops " << rep.n_ops << ", tensors " << rep.n_tensors
        << "; checkpoint tensors not used by the text decoder: " << rep.ignored_text
        << " (e.g. KV-shared layers' k/v) + " << rep.ignored_other << " (towers left out, if any)\n";
    if (!in.tower_names.empty() || !in.encoders.empty()) {
        const auto& tm   = in.meta.towers;
        const bool has_v = tm && tm->vision, has_a = tm && tm->audio;
        const bool vgpu = has_v && !tm->vision->device.empty();
        const bool agpu = has_a && !tm->audio->device.empty();
        const std::string vtext =
            "vision (" + std::to_string(opt.image_tokens) + " soft tokens an image at most) ";
        char secs[32];
        std::snprintf(secs, sizeof secs, "%g", opt.max_audio_seconds);
        const std::string atext = std::string("audio (") + secs + " s a clip at most) ";
        const uint64_t gpu_w =
            (vgpu ? rep.vision_end - rep.vision_begin : 0) + (agpu ? rep.audio_end - rep.audio_begin : 0);
        if (vgpu || agpu)
            log << "  towers on cuda:" << in.cuda_index << ": " << (vgpu ? vtext : "") << (agpu ? atext : "")
                << "- " << human(gpu_w) << " of weights (bf16 matmuls), "
                << human((vgpu ? vision_gpu_bytes : 0) + (agpu ? audio_gpu_bytes : 0))
                << " of session buffers there\n";
        if ((has_v && !vgpu) || (has_a && !agpu))
            log << "  towers on the CPU: " << (has_v && !vgpu ? vtext : "") << (has_a && !agpu ? atext : "")
                << "- " << human(rep.tower_weights - gpu_w) << " of weights (" << tm->precision
                << " matmuls), " << human(in.tower_session_bytes) << " of session buffers\n";
        else
            log << "  towers' host buffers (inputs, features, queued soft tokens): "
                << human(in.tower_session_bytes) << "\n";
    }
}

} // namespace g4::stage
