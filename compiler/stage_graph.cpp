// The graph stage of `g4 compile` (compiler/stages.h): the model's op program (models/gemma4/graph.cpp)
// with the adapter's biases and untied head, split over devices for cross-device plans, and the tower
// weights appended.
#include "compiler/stages.h"

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
                std::string mod = m.module + ".weight";
                if (mod.rfind(in.mc.tensor_prefix, 0) == 0)
                    bo.biased.insert(mod.substr(in.mc.tensor_prefix.size()));
                else if (mod.rfind("model.language_model.", 0) == 0)
                    bo.biased.insert(mod.substr(21));
            }
    // PEFT keeps a tied LM head on the ORIGINAL embedding when modules_to_save replaces embed_tokens
    // (unless the adapter also saves lm_head.weight): untie it so the head can differ.
    if (in.adapter)
        for (const auto& r : in.adapter->replacements())
            if (r == "lm_head.weight" || r == "model.language_model.embed_tokens.weight" ||
                r == in.mc.tensor_prefix + "embed_tokens.weight")
                bo.separate_lm_head = true;
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
}

} // namespace g4::stage
