// The plan-writer stage of `g4 compile` (compiler/stages.h): the STRINGS, TENSORS and OPS records with the
// CUDA kernel choices and decode schedule, META, the section table and header; the weights are streamed by
// stream_weights (stage_weights.cpp). The plan format: runtime/plan/plan_format.h, docs/plan-format.md.
#include "compiler/stages.h"
#include "g4/g4.h"
#include "kernels/nf4.h"
#include "runtime/plan/launch_params.h"

#include <cstring>

namespace g4::stage {
namespace {

using gemma4::TensorDesc;

// META "hparams": the model's own keys (the codec writes num_hidden_layers and hidden_size).
json hparams_json(const gemma4::TextHParams& hp) {
    json lt = json::array();
    for (int i = 0; i < hp.num_layers; ++i)
        lt.push_back(gemma4::layer_type_name(hp.layer_types[i]));
    return json{{"vocab_size", hp.vocab_size},
                {"intermediate_size", hp.intermediate_size},
                {"num_attention_heads", hp.num_heads},
                {"num_key_value_heads", hp.num_kv_heads},
                {"num_key_value_heads_full", hp.num_kv_heads_full},
                {"head_dim", hp.head_dim},
                {"global_head_dim", hp.head_dim_full},
                {"sliding_window", hp.sliding_window},
                {"num_kv_shared_layers", hp.num_kv_shared_layers},
                {"use_double_wide_mlp", (bool)hp.use_double_wide_mlp},
                {"hidden_size_per_layer_input", hp.ple_dim},
                {"vocab_size_per_layer_input", hp.ple_vocab_size},
                {"max_position_embeddings", hp.max_position_embeddings},
                {"rms_norm_eps", hp.rms_norm_eps},
                {"final_logit_softcapping", hp.final_logit_softcap},
                {"rope_theta_sliding", hp.rope_theta_sliding},
                {"rope_theta_full", hp.rope_theta_full},
                {"partial_rotary_factor_full", hp.partial_rotary_full},
                {"layer_types", lt}};
}

} // namespace

// STRINGS, TENSORS, OPS
void make_records(const Inputs& in, BuiltPlan& b) {
    const CompileOptions& opt = in.opt;
    const Mode mode           = b.mode;
    auto& prog                = b.prog;
    auto& off                 = b.off;
    auto& nbytes              = b.nbytes;
    auto& op_dev              = b.op_dev;
    auto& strings             = b.strings;
    auto& tensors             = b.tensors;
    auto& ops                 = b.ops;
    auto& schedule            = b.schedule;
    const bool dq             = opt.double_quant;
    strings.assign(1, '\0');
    auto intern = [&](const std::string& s) {
        uint32_t o = (uint32_t)strings.size();
        strings += s;
        strings.push_back('\0');
        return o;
    };
    tensors.assign(prog.tensors.size(), plan::PlanTensor{});
    for (size_t t = 0; t < prog.tensors.size(); ++t) {
        const TensorDesc& d = prog.tensors[t];
        plan::PlanTensor& r = tensors[t];
        std::memset(&r, 0, sizeof r);
        r.name  = intern(d.name);
        r.dtype = (uint8_t)d.dtype;
        r.kind  = (uint8_t)d.kind;
        r.ndim  = (uint8_t)d.dims.size();
        for (size_t i = 0; i < d.dims.size(); ++i)
            r.dims[i] = d.dims[i];
        r.offset      = off[t];
        r.nbytes      = nbytes[t];
        r.flags       = (uint8_t)d.role;
        r.quant_flags = d.dtype == DType::NF4 && dq ? plan::kQuantDoubleQuant : 0;
    }
    ops.assign(prog.ops.size(), plan::PlanOp{});
    for (size_t i = 0; i < prog.ops.size(); ++i) {
        ops[i]      = prog.ops[i].op;
        ops[i].name = intern(prog.ops[i].name);
    }
    // The programs table: only plans with encoder programs have one (a plan without is the one program
    // "text").
    b.program_table.clear();
    if (b.programs.size() > 1) {
        b.programs[0].thread_floats = (uint64_t)std::max<int64_t>(32 * b.max_k, in.max_context + 64);
        b.program_table             = program_records(b.programs, intern);
    }
    // Ahead-of-time kernel choices for CUDA from the real shapes (the runtime keeps no heuristics).
    cuda::choose_variants(ops, tensors, in.max_context, in.opt.prefill_precision);
    if (in.cuda_index >= 0 && mode == Mode::Plan) {
        // sm_90: the decode MLP in one kernel, the attention's merge in the o projection's (fp32 atomic adds;
        // --deterministic keeps the separate kernels).
        const bool fuse = in.cuda_target == "sm_90" && !opt.deterministic;
        // --mlp-replicas R: every fused MLP followed by its ResNorm gets R output replicas instead of
        // cuda::mlp_replicas' choice (auto: 0).
        const int mlp_reps = opt.mlp_replicas == "auto" ? 0 : std::stoi(opt.mlp_replicas);
        // --mlp-precision f16 (default): the fused MLPs' products in packed f16 (g4_mlp_nf4*_h2) wherever the
        // weights allow (cuda::mlp_f16); f32: g4_mlp_nf4*.
        // The ResNorm between an MLP and its PLE in the PLE's kernel where cuda::ple_fold_after takes the
        // MLP;
        // --ple-fold off: never.
        const bool fold_ple = opt.ple_fold == "on";
        // The ResNorm making a packed-f16 MLP's input in the MLP's kernel where Matcher::mlp_fold takes it
        // and cuda::mlp_fold_one_wave the MLP's grid; --mlp-fold off: never, all: whatever the grid.
        const int fold_mlp = opt.mlp_fold == "all" ? 2 : opt.mlp_fold == "one-wave" ? 1 : 0;
        // The decode schedule covers the text program's ops (the encoder programs' follow them).
        const std::vector<plan::PlanOp> text_ops(ops.begin(), ops.begin() + b.n_text_ops);
        const std::vector<int> text_dev(op_dev.begin(),
                                        op_dev.begin() + std::min(op_dev.size(), b.n_text_ops));
        schedule = cuda::decode_schedule(text_ops, tensors, text_dev, fuse, fuse, in.cuda_spec.attn_hpg,
                                         mlp_reps, opt.mlp_precision == "f16", fold_ple, fold_mlp);
        for (const plan::CudaLaunch& l : schedule) {
            if (l.kind == (uint16_t)plan::LaunchKind::Mlp)
                tensors[ops[plan::launch_params<plan::MlpLaunch>(l).down].in[1]].quant_flags |=
                    plan::kQuantTiled32;
            if (l.kind == (uint16_t)plan::LaunchKind::AttnO)
                tensors[ops[l.op].in[1]].quant_flags |= plan::kQuantTiled32;
        }
    }
}

std::string plan_meta(const Inputs& in, const BuiltPlan& b, const Report& rep) {
    const CompileOptions& opt = in.opt;
    const auto& hp            = in.mc.text;
    const Mode mode           = b.mode;
    auto& bo                  = b.bo;
    auto& prog                = b.prog;
    const bool hybrid         = b.hybrid;
    auto& act_arena           = b.act_arena;
    auto& kv_arena            = b.kv_arena;
    auto& max_k               = b.max_k;
    auto& gpus                = b.gpus;
    auto& towers_group        = b.towers_group;
    auto& host_group          = b.host_group;
    auto& wstart              = b.wstart;
    auto& kstart              = b.kstart;
    plan::Meta m              = in.meta; // provenance, tokenizer, placement, memory, towers
    const bool cuda = in.cuda_index >= 0, plan_mode = mode == Mode::Plan;
    plan::MetaPolicy& po = m.policy;
    po.weights           = opt.weights;
    po.double_quant      = opt.double_quant;
    po.quantize          = opt.quantize_regex;
    po.keep              = opt.keep_regex;
    po.nf4_blocksize     = nf4::kBlock;
    po.kv_dtype          = dtype_str(bo.kv_dtype);
    // The full-precision reference and a CUDA plan's CPU twin (the GPU's arithmetic is fp32) keep fp32.
    po.cpu_precision = plan_mode ? opt.cpu_precision : "f32";
    if (cuda) {
        po.deterministic     = opt.deterministic;
        po.prefill_precision = opt.prefill_precision;
        po.mlp_precision     = opt.mlp_precision;
        // The schedule choices for measurements, only where they are not the default.
        if (opt.mlp_replicas != "auto") po.mlp_replicas = std::stoi(opt.mlp_replicas);
        if (opt.ple_fold != "on") po.ple_fold = opt.ple_fold;
        if (opt.mlp_fold != "one-wave") po.mlp_fold = opt.mlp_fold;
    }
    m.g4_version    = G4_VERSION_STRING;
    m.architecture  = in.mc.model_type;
    m.head_dim_form = in.mc.head_dim_form;
    m.device        = cuda && plan_mode ? "cuda" : "cpu";
    if (cuda && plan_mode)
        m.cuda = plan::MetaCuda{in.cuda_target, in.cuda_index, in.cuda_spec.attn_hpg,
                                in.cuda_spec.trace ? opt.kernel_trace : std::string()};
    m.weights_dtype             = opt.weights;
    m.reference_plan            = mode == Mode::Reference;
    m.hparams.num_hidden_layers = hp.num_layers;
    m.hparams.hidden_size       = hp.hidden_size;
    m.hparams.model             = hparams_json(hp);
    plan::MetaProgram& pg       = m.program;
    pg.max_rows                 = opt.max_rows;
    pg.max_context              = in.max_context;
    pg.logits_rows              = opt.logits_rows;
    pg.sliding_slots            = prog.sliding_slots;
    pg.act_arena_bytes          = act_arena;
    pg.kv_arena_bytes           = kv_arena;
    pg.ids_tensor               = prog.ids;
    pg.logits_tensor            = prog.logits;
    pg.max_k                    = max_k;
    pg.max_slots                = in.max_context;
    pg.vocab_size               = hp.vocab_size;
    pg.embed_vocab_limit        = hp.ple_dim > 0 ? std::min(hp.vocab_size, hp.ple_vocab_size) : hp.vocab_size;
    if (hybrid) {
        for (size_t g = 0; g < gpus.size(); ++g) {
            plan::MetaGpuPart part; // the weights several GPUs read, then its own (one range if adjacent)
            part.index = gpus[g];
            if (wstart[1] > wstart[0]) part.weights.push_back({wstart[0], wstart[1]});
            if (wstart[2 + g] > wstart[1 + g]) {
                if (!part.weights.empty() && part.weights.back()[1] == wstart[1 + g])
                    part.weights.back()[1] = wstart[2 + g];
                else
                    part.weights.push_back({wstart[1 + g], wstart[2 + g]});
            }
            part.kv = {kstart[1 + g], kstart[2 + g]};
            pg.gpus.push_back(part);
        }
        pg.layer_devices.assign(in.layer_device.begin(), in.layer_device.end());
        pg.kv_host_begin = kstart[host_group];
    }
    const auto& g = in.mc.generation;
    m.generation  = {std::vector<int32_t>(g.eos_token_ids.begin(), g.eos_token_ids.end()),
                     g.bos_token_id,
                     g.pad_token_id,
                     g.do_sample,
                     g.temperature,
                     g.top_k,
                     g.top_p,
                     g.min_p,
                     g.repetition_penalty};
    if (!plan_mode) {
        m.placement.reset();
        m.memory.clear();
    }
    if (plan_mode && (!in.tower_names.empty() || !in.encoders.empty()) && m.towers) {
        m.towers->weights = {wstart[towers_group], wstart[towers_group + 1]};
        if (m.towers->vision) m.towers->vision->weights = plan::ByteRange{rep.vision_begin, rep.vision_end};
        if (m.towers->audio) m.towers->audio->weights = plan::ByteRange{rep.audio_begin, rep.audio_end};
    } else {
        m.towers.reset();
    }
    return plan::write_meta(m);
}

// Builds and writes one plan.
void write_plan(const Inputs& in, PlanFile* out_file, Mode mode, Report* rep) {
    const BuiltPlan b           = build_plan(in, mode, rep);
    const std::string meta_text = plan_meta(in, b, *rep);
    const auto& strings         = b.strings;
    const auto& tensors         = b.tensors;
    const auto& ops             = b.ops;
    const auto& schedule        = b.schedule;
    // Layout: header, section table, then 4096-aligned sections; weights streamed last.
    struct Sec {
        plan::SectionKind kind;
        const void* data;
        uint64_t size;
    };
    std::vector<Sec> small = {
        {plan::SectionKind::Meta, meta_text.data(), meta_text.size()},
        {plan::SectionKind::Strings, strings.data(), strings.size()},
        {plan::SectionKind::Tensors, tensors.data(), tensors.size() * sizeof(plan::PlanTensor)},
        {plan::SectionKind::Ops, ops.data(), ops.size() * sizeof(plan::PlanOp)}};
    if (!b.program_table.empty())
        small.push_back({plan::SectionKind::Programs, b.program_table.data(),
                         b.program_table.size() * sizeof(plan::PlanProgram)});
    if (!in.tokenizer_json.empty())
        small.push_back({plan::SectionKind::Tokenizer, in.tokenizer_json.data(), in.tokenizer_json.size()});
    if (in.cuda_index >= 0 && mode == Mode::Plan) {
        small.push_back({plan::SectionKind::Cubin, in.cubin.data(), in.cubin.size()});
        small.push_back({plan::SectionKind::Ptx, in.ptx.data(), in.ptx.size()});
        small.push_back(
            {plan::SectionKind::CudaSchedule, schedule.data(), schedule.size() * sizeof(plan::CudaLaunch)});
    }
    const uint32_t nsec = (uint32_t)small.size() + 1;
    std::vector<plan::PlanSection> table(nsec);
    uint64_t cursor =
        align_up(sizeof(plan::PlanHeader) + nsec * sizeof(plan::PlanSection), plan::kSectionAlign);
    if (!out_file) throw CompileError("internal: no output file for the plan");
    PlanFile& out = *out_file;
    for (uint32_t i = 0; i < small.size(); ++i) {
        table[i] = {(uint32_t)small[i].kind, 0, cursor, small[i].size,
                    plan::fnv1a64(small[i].data, small[i].size)};
        out.write_at(cursor, small[i].data, small[i].size);
        cursor = align_up(cursor + small[i].size, plan::kSectionAlign);
    }

    const uint64_t wbase = cursor;
    const uint64_t wsum  = stream_weights(in, b, out, wbase, rep);
    // LoRA biases must precede nothing: the graph places them after their weight, so they were filled.
    table[nsec - 1]          = {(uint32_t)plan::SectionKind::Weights, 0, wbase, b.weights_size, wsum};
    const uint64_t file_size = wbase + b.weights_size;

    plan::PlanHeader h;
    std::memset(&h, 0, sizeof h);
    std::memcpy(h.magic, plan::kMagic, 8);
    h.format_major         = plan::kFormatMajor;
    h.format_minor         = plan::kFormatMinor;
    h.header_size          = sizeof(plan::PlanHeader);
    h.file_size            = file_size;
    h.section_table_offset = sizeof(plan::PlanHeader);
    h.section_count        = nsec;
    h.schema_hash          = plan::schema_hash();
    h.reserved0            = plan::fnv1a64(table.data(), table.size() * sizeof(plan::PlanSection));
    h.header_checksum      = (uint32_t)plan::fnv1a64(&h, sizeof h);
    out.write_at(0, &h, sizeof h);
    out.write_at(sizeof h, table.data(), table.size() * sizeof(plan::PlanSection));
}

} // namespace g4::stage
