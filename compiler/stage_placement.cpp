// The placement stage of `g4 compile` (compiler/stages.h): the budgets (--gpu-mem, --cpu-mem) and --place
// checked against the memory plan's figures (stage_memory.cpp), the text layers split over GPUs when one
// does not hold them, and where each tower runs. Policy and figures: compiler/placement.cpp.
#include "compiler/stages.h"
#include "kernels/cpu/thread_pool.h"

namespace g4::stage {

placement::Decision decide_placement(Inputs& in, placement::Placement& place,
                                     const placement::Request& place_req, Report& rep) {
    const int cuda_index = in.cuda_index;
    auto figures_at      = [&](int max_context) {
        return figures_with(in, place.has_cpu_layers(), max_context, in.layer_device);
    };
    const int threads = cuda_index < 0 || place.has_cpu_layers() ? cpu::default_thread_count() : 0;
    std::optional<placement::Decision> decided;
    try {
        decided = placement::decide(place, figures_of(in, rep, place.has_cpu_layers()), in.max_context,
                                    figures_at, threads);
    } catch (const CompileError& refused) {
        // Budgets for several GPUs and no layers= in --place: split the layers over them.
        std::optional<placement::Placement> split;
        const bool may_split = !placement::layers_placed(place_req) && place.gpu_budgets.size() > 1;
        if (may_split)
            split = placement::split_layers(
                place,
                [&](const std::vector<int>& layer_device) {
                    return figures_with(in, place.has_cpu_layers(), in.max_context, layer_device);
                },
                threads);
        if (!split && may_split)
            throw CompileError(
                std::string(refused.what()) +
                "; splitting the text layers across the GPUs with a --gpu-mem budget does not fit either");
        if (!split) throw;
        place           = *split;
        in.layer_device = place.layer_device;
        rep             = plan_memory(in);
        decided = placement::decide(place, figures_of(in, rep, place.has_cpu_layers()), in.max_context,
                                    figures_at, threads);
    }
    { // META and the report: where each tower runs, its buffers; the encoder programs' devices
        placement::Placement& pl   = decided->placement;
        in.towers.vision_gpu_bytes = rep.vision_program_gpu;
        in.towers.audio_gpu_bytes  = rep.audio_program_gpu;
        for (EncoderProgram& e : in.encoders) {
            if (e.name == "vision") e.device = pl.vision_gpu ? in.cuda_index : -1;
            if (e.name == "audio") e.device = pl.audio_gpu ? in.cuda_index : -1;
        }
        const std::string dev = "cuda:" + std::to_string(in.cuda_index);
        for (const char* c : {"vision", "audio"}) {
            const bool gpu         = std::string(c) == "vision" ? pl.vision_gpu : pl.audio_gpu;
            const std::string& why = std::string(c) == "vision" ? pl.vision_why : pl.audio_why;
            if (gpu) {
                plan::MetaTowers& tm = towers_meta(in);
                if (std::string(c) == "vision" && tm.vision) {
                    tm.vision->device    = dev;
                    tm.vision->gpu_bytes = in.towers.vision_gpu_bytes;
                } else if (std::string(c) == "audio" && tm.audio) {
                    tm.audio->device    = dev;
                    tm.audio->gpu_bytes = in.towers.audio_gpu_bytes;
                }
                pl.tower_where[c] = dev;
            } else if (!why.empty() && pl.tower_where[c] == "cpu") {
                pl.tower_where[c] = "cpu (" + why + ")";
            }
        }
        if (pl.vision_gpu || pl.audio_gpu)
            record_tower_sizing(in, in.towers.sizing(pl.vision_gpu, pl.audio_gpu));
    }
    decided->to_meta(&in.meta);
    return *decided;
}

} // namespace g4::stage
