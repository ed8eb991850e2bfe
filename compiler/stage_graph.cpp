// The graph stage of `g4 compile` (compiler/stages.h): the model's op program (models/gemma4/graph.cpp)
// with the adapter's biases and untied head, split over devices for cross-device plans, and the tower
// weights appended.
#include "compiler/stages.h"
#include "models/gemma4/names.h"

namespace g4::stage {

using gemma4::TensorDesc;
using gemma4::WeightRole;
using plan::TensorKind;

void build_graph(const Inputs& in, BuiltPlan& b, Report* rep) {
    const CompileOptions& opt = in.opt;
    const auto& hp            = in.mc.text;
    const Mode mode           = b.mode;
    auto& bo                  = b.bo;
    auto& prog                = b.prog;
    bo.max_rows               = opt.max_rows;
    bo.max_context            = in.max_context;
    bo.logits_rows            = opt.logits_rows;
    bo.kv_dtype               = mode == Mode::Reference ? DType::F32 : in.kv_dtype;
    if (in.adapter)
        for (const auto& m : in.adapter->merges())
            if (m.has_bias) {
                if (std::string rel = gemma4::text_relative(in.mc.tensor_prefix, m.module + ".weight");
                    !rel.empty())
                    bo.biased.insert(rel);
            }
    // PEFT keeps a tied LM head on the ORIGINAL embedding when modules_to_save replaces embed_tokens
    // (unless the adapter also saves lm_head.weight): untie it so the head can differ.
    if (in.adapter)
        for (const auto& r : in.adapter->replacements())
            if (gemma4::unties_lm_head(in.mc.tensor_prefix, r)) bo.separate_lm_head = true;
    prog     = gemma4::build_text_program(hp, bo);
    b.hybrid = mode == Mode::Plan && !in.layer_device.empty(); // layer_device: CUDA plans only
    if (b.hybrid) rep->cross = cross_device::split(prog, in.layer_device, in.cuda_index);
    // Tower weights: no ops read them; they follow every text weight in WEIGHTS (the CUDA runtime
    // uploads none of them) with their checkpoint shapes (0-d bounds stored as [1]).
    b.n_text_tensors = prog.tensors.size();
    if (mode == Mode::Plan)
        for (const auto& n : in.tower_names) {
            const st::TensorView& v = in.ckpt->get("model." + n);
            TensorDesc d;
            d.name = n;
            d.kind = TensorKind::Weight;
            d.dims = v.shape.empty() ? std::vector<int64_t>{1} : v.shape;
            d.role = v.shape.empty() ? WeightRole::TowerScalar : WeightRole::Tower;
            prog.tensors.push_back(std::move(d));
        }
    // The programs: text (with the tower weights above), then each encoder program's tensors and ops (its
    // weights are tower weights too: after every text weight in WEIGHTS).
    b.programs.assign(1, ProgramRange{});
    ProgramRange& text = b.programs[0];
    text.name          = "text";
    text.device        = in.cuda_index >= 0 && mode == Mode::Plan ? in.cuda_index : -1;
    text.op_end        = prog.ops.size();
    text.tensor_end    = prog.tensors.size();
    text.inputs        = {prog.ids};
    text.outputs       = {prog.logits};
    text.max_rows      = {opt.max_rows, opt.logits_rows, 0, 0};
    if (mode == Mode::Plan)
        for (const EncoderProgram& e : in.encoders)
            b.programs.push_back(append_program(prog, e));
    b.n_text_ops = b.programs[0].op_end;
}

} // namespace g4::stage
