// Plan compiler (see compile.h): the stages of compiler/stages.h in order. Everything that can fail on
// bad input fails before any weight is read; the plan goes to a temporary file beside -o and replaces it
// only once every check has passed (a failing compile leaves the previous plan at -o as it was).
#include "compiler/compile.h"
#include "compiler/stages.h"

#include <ostream>

namespace g4 {

void compile_plan(const CompileOptions& opt, std::ostream& log, CompileReport* report) {
    using namespace stage;
    // Inputs: options, config, device, context, adapter, tokenizer, checkpoint, towers.
    const CheckedOptions checked = check_options(opt);
    Inputs in(opt, load_model_config(opt.model_dir));
    const int gpu_count = resolve_device(in, checked.cuda_index);
    resolve_context(in);
    placement::Placement place =
        placement::resolve(checked.place_req, in.mc.text.num_layers, checked.cuda_index, gpu_count);
    in.layer_device = place.layer_device;
    place.sessions  = opt.sessions;
    if (!opt.adapter_dir.empty()) in.adapter = lora::Adapter::open(opt.adapter_dir);
    load_tokenizer(in);
    open_checkpoint(in);
    check_towers(in, place);

    // Graph, weights policy and memory plan (no weight read yet), then the placement they fit.
    Report rep                     = plan_memory(in);
    const placement::Decision& mem = decide_placement(in, place, checked.place_req, rep);
    if (opt.dry_run) {
        print_dry_run(log, in, mem, rep);
        return;
    }
    compile_cuda_kernels(in);
    record_provenance(in);

    // Plan writer: records, META, sections, the weights streamed.
    rep = Report();
    PlanFile out(opt.out_path);
    write_plan(in, &out, Mode::Plan, &rep);
    if (opt.progress) opt.progress("weights", 1.0);

    // Report and fidelity.
    const DroppedModules dropped = check_adapter_consumed(in);
    print_report(log, in, mem, rep, dropped);
    measure_fidelity(log, in, out, report);
    out.commit();
    if (report) {
        report->weights_bytes   = rep.weights_bytes;
        report->act_arena_bytes = rep.act_arena;
        report->kv_arena_bytes  = rep.kv_arena;
        report->max_context     = in.max_context;
        report->adapter_merged  = in.adapter ? (int)rep.merged.size() : 0;
    }
}

} // namespace g4
