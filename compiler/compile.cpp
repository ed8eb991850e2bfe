// Plan compiler (see compile.h).
#include "compiler/compile.h"
#include "compiler/config.h"
#include "compiler/error.h"
#include "compiler/safetensors.h"
#include "models/gemma4/graph.h"
#include "runtime/src/plan/plan_format.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <unistd.h>

namespace g4 {
namespace {

namespace fs = std::filesystem;
using json   = nlohmann::json;
using gemma4::Program;
using gemma4::TensorDesc;
using plan::TensorKind;

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string shape_str(const std::vector<int64_t>& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
}

int64_t numel(const std::vector<int64_t>& d) {
    int64_t n = 1;
    for (auto v : d) n *= v;
    return n;
}

// Greedy first-fit placement of activations by live range [first op, last op] over one arena.
uint64_t plan_activations(Program& p, std::vector<uint64_t>& offset) {
    const int nt = (int)p.tensors.size();
    std::vector<int> first(nt, -1), last(nt, -1);
    auto touch = [&](int t, int i) {
        if (t < 0) return;
        if (first[t] < 0) first[t] = i;
        last[t] = i;
    };
    for (int i = 0; i < (int)p.ops.size(); ++i) {
        for (int t : p.ops[i].op.in) touch(t, i);
        for (int t : p.ops[i].op.out) touch(t, i);
    }
    // Inputs and logits live for the whole step (written before / read after the program).
    const int n_ops = (int)p.ops.size();
    if (p.ids >= 0) first[p.ids] = 0, last[p.ids] = n_ops;
    if (p.logits >= 0) last[p.logits] = n_ops;

    struct Block { uint64_t off, size; int first, last; };
    std::vector<Block> placed;
    std::vector<int> order;
    for (int t = 0; t < nt; ++t) {
        auto k = p.tensors[t].kind;
        if ((k == TensorKind::Activation || k == TensorKind::Input) && first[t] >= 0) order.push_back(t);
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return dtype_bytes(p.tensors[a].dtype, numel(p.tensors[a].dims)) > dtype_bytes(p.tensors[b].dtype, numel(p.tensors[b].dims));
    });
    uint64_t arena = 0;
    offset.assign(nt, 0);
    for (int t : order) {
        uint64_t size = align_up(dtype_bytes(p.tensors[t].dtype, numel(p.tensors[t].dims)), plan::kTensorAlign);
        std::vector<std::pair<uint64_t, uint64_t>> busy;
        for (const Block& b : placed)
            if (!(b.last < first[t] || last[t] < b.first)) busy.push_back({b.off, b.off + b.size});
        std::sort(busy.begin(), busy.end());
        uint64_t off = 0;
        for (auto& [b0, b1] : busy) {
            if (off + size <= b0) break;
            off = std::max(off, b1);
        }
        placed.push_back({off, size, first[t], last[t]});
        offset[t] = off;
        arena     = std::max(arena, off + size);
    }
    return arena;
}

struct WeightSource {
    const st::TensorView* view = nullptr;   // checkpoint tensor, or
    const std::vector<float>* constant = nullptr;
};

// Writes the weight bytes of `t` converted to `dt` into `out` (exactly dtype_bytes(dt, numel) bytes).
void convert_weight(const WeightSource& src, DType dt, int64_t n, std::vector<uint8_t>& out) {
    out.resize(dtype_bytes(dt, n));
    std::vector<float> f32;
    const float* vals;
    if (src.constant) {
        vals = src.constant->data();
    } else if (dt == DType::BF16 && src.view->dtype == st::DType::BF16) {
        std::memcpy(out.data(), src.view->data, out.size());
        return;
    } else {
        f32.resize(n);
        st::to_f32(*src.view, f32.data());
        vals = f32.data();
    }
    if (dt == DType::F32) {
        std::memcpy(out.data(), vals, out.size());
    } else if (dt == DType::BF16) {
        uint16_t* o = (uint16_t*)out.data();
        for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(vals[i]);
    } else {
        throw CompileError(std::string("internal: unsupported weight dtype ") + dtype_str(dt));
    }
}

// Output file that only appears under its final name once complete.
class AtomicFile {
public:
    explicit AtomicFile(const std::string& path) : path_(path) {
        tmp_ = path + ".tmp." + std::to_string(::getpid());
        f_   = std::fopen(tmp_.c_str(), "wb+");
        if (!f_) throw CompileError("cannot create output file " + tmp_ + ": check the directory exists and is writable");
    }
    ~AtomicFile() {
        if (f_) std::fclose(f_);
        if (!committed_) std::remove(tmp_.c_str());
    }
    void write_at(uint64_t off, const void* data, size_t n) {
        if (fseeko(f_, (off_t)off, SEEK_SET) != 0 || std::fwrite(data, 1, n, f_) != n)
            throw CompileError("write failed on " + tmp_ + " (disk full?)");
    }
    void commit() {
        if (std::fflush(f_) != 0 || ::fsync(fileno(f_)) != 0) throw CompileError("flush failed on " + tmp_);
        std::fclose(f_);
        f_ = nullptr;
        if (std::rename(tmp_.c_str(), path_.c_str()) != 0) throw CompileError("cannot rename " + tmp_ + " to " + path_);
        committed_ = true;
    }

private:
    std::string path_, tmp_;
    std::FILE* f_   = nullptr;
    bool committed_ = false;
};

json hparams_json(const gemma4::TextHParams& hp) {
    json lt = json::array();
    for (int i = 0; i < hp.num_layers; ++i) lt.push_back(gemma4::layer_type_name(hp.layer_types[i]));
    return json{{"vocab_size", hp.vocab_size}, {"hidden_size", hp.hidden_size},
                {"intermediate_size", hp.intermediate_size}, {"num_hidden_layers", hp.num_layers},
                {"num_attention_heads", hp.num_heads}, {"num_key_value_heads", hp.num_kv_heads},
                {"num_key_value_heads_full", hp.num_kv_heads_full}, {"head_dim", hp.head_dim},
                {"global_head_dim", hp.head_dim_full}, {"sliding_window", hp.sliding_window},
                {"num_kv_shared_layers", hp.num_kv_shared_layers}, {"use_double_wide_mlp", (bool)hp.use_double_wide_mlp},
                {"hidden_size_per_layer_input", hp.ple_dim}, {"vocab_size_per_layer_input", hp.ple_vocab_size},
                {"max_position_embeddings", hp.max_position_embeddings}, {"rms_norm_eps", hp.rms_norm_eps},
                {"final_logit_softcapping", hp.final_logit_softcap}, {"rope_theta_sliding", hp.rope_theta_sliding},
                {"rope_theta_full", hp.rope_theta_full}, {"partial_rotary_factor_full", hp.partial_rotary_full},
                {"layer_types", lt}};
}

} // namespace

void compile_plan(const CompileOptions& opt, std::ostream& log) {
    // Options that later issues implement are refused before any heavy work.
    if (!opt.adapter_dir.empty())
        throw CompileError("--adapter is not supported yet: LoRA merging is not implemented in this build");
    if (opt.weights == "nf4")
        throw CompileError("--weights nf4 is not supported yet: use --weights bf16 or --weights f32");
    if (opt.weights != "f32" && opt.weights != "bf16")
        throw CompileError("unknown --weights '" + opt.weights + "': expected nf4, bf16 or f32");
    if (opt.device.rfind("cuda", 0) == 0)
        throw CompileError("--device " + opt.device + " is not supported yet: this build runs plans on the CPU (--device cpu)");
    if (opt.device != "cpu") throw CompileError("unknown --device '" + opt.device + "': expected cpu or cuda[:N]");
    if (opt.out_path.empty()) throw CompileError("missing -o PLAN: the output plan path");
    if (opt.max_rows < 1 || opt.max_rows > 8192) throw CompileError("--chunk must be in 1..8192");
    if (opt.logits_rows < 1 || opt.logits_rows > opt.max_rows)
        throw CompileError("--logits-rows must be in 1..chunk (" + std::to_string(opt.max_rows) + ")");

    ModelConfig mc = load_model_config(opt.model_dir);
    const auto& hp = mc.text;
    int max_context = opt.max_context > 0 ? opt.max_context : std::min(4096, hp.max_position_embeddings);
    if (max_context > hp.max_position_embeddings)
        throw CompileError("--max-context " + std::to_string(max_context) + " exceeds the model's limit (max_position_embeddings = " +
                           std::to_string(hp.max_position_embeddings) + ")");
    st::Checkpoint ckpt = st::Checkpoint::open(opt.model_dir);
    const DType wdt     = opt.weights == "f32" ? DType::F32 : DType::BF16;

    gemma4::BuildOptions bo;
    bo.max_rows    = opt.max_rows;
    bo.max_context = max_context;
    bo.logits_rows = opt.logits_rows;
    Program prog   = gemma4::build_text_program(hp, bo);

    // Resolve weights: every tensor the program names must exist with the shape config.json implies.
    std::vector<WeightSource> sources(prog.tensors.size());
    std::map<std::string, bool> used;
    for (size_t t = 0; t < prog.tensors.size(); ++t) {
        TensorDesc& d = prog.tensors[t];
        if (d.kind != TensorKind::Weight) continue;
        if (d.role == gemma4::WeightRole::Constant) {
            d.dtype            = DType::F32;
            sources[t].constant = &d.constant;
            continue;
        }
        std::string hf = mc.tensor_prefix + d.name;
        if (!ckpt.has(hf))
            throw CompileError("missing tensor '" + hf + "' in checkpoint " + opt.model_dir +
                               " (config.json implies it; is the checkpoint complete and for this config?)");
        const st::TensorView& v = ckpt.get(hf);
        if (v.shape != d.dims)
            throw CompileError("tensor '" + hf + "' in " + v.file + " has shape " + shape_str(v.shape) +
                               " but config.json implies " + shape_str(d.dims) + "; the checkpoint and config.json disagree");
        if (v.dtype != st::DType::F32 && v.dtype != st::DType::BF16 && v.dtype != st::DType::F16)
            throw CompileError("tensor '" + hf + "' in " + v.file + " has dtype " + st::dtype_name(v.dtype) +
                               "; g4 reads F32, BF16 or F16 weights");
        d.dtype    = wdt;
        sources[t] = {&v, nullptr};
        used[hf]   = true;
    }
    size_t ignored_text = 0, ignored_other = 0;
    for (const auto& n : ckpt.names()) {
        if (used.count(n)) continue;
        (n.rfind(mc.tensor_prefix, 0) == 0 ? ignored_text : ignored_other)++;
    }

    // Memory plan: activations share one arena by live range; KV caches are laid out back to back.
    std::vector<uint64_t> act_off;
    uint64_t act_arena = plan_activations(prog, act_off);
    uint64_t kv_arena  = 0, weights_size = 0;
    std::vector<uint64_t> off(prog.tensors.size(), 0), nbytes(prog.tensors.size(), 0);
    int64_t max_k = 1;
    for (size_t t = 0; t < prog.tensors.size(); ++t) {
        const TensorDesc& d = prog.tensors[t];
        nbytes[t]           = dtype_bytes(d.dtype, numel(d.dims));
        switch (d.kind) {
        case TensorKind::Weight:
            weights_size = align_up(weights_size, plan::kTensorAlign);
            off[t]       = weights_size;
            weights_size += nbytes[t];
            if (d.dims.size() == 2) max_k = std::max(max_k, d.dims[1]);
            break;
        case TensorKind::KvCache:
            kv_arena = align_up(kv_arena, plan::kTensorAlign);
            off[t]   = kv_arena;
            kv_arena += nbytes[t];
            break;
        default: off[t] = act_off[t]; break;
        }
    }

    // STRINGS, TENSORS, OPS
    std::string strings(1, '\0');
    auto intern = [&](const std::string& s) {
        uint32_t o = (uint32_t)strings.size();
        strings += s;
        strings.push_back('\0');
        return o;
    };
    std::vector<plan::PlanTensor> tensors(prog.tensors.size());
    for (size_t t = 0; t < prog.tensors.size(); ++t) {
        const TensorDesc& d = prog.tensors[t];
        plan::PlanTensor& r = tensors[t];
        std::memset(&r, 0, sizeof r);
        r.name  = intern(d.name);
        r.dtype = (uint8_t)d.dtype;
        r.kind  = (uint8_t)d.kind;
        r.ndim  = (uint8_t)d.dims.size();
        for (size_t i = 0; i < d.dims.size(); ++i) r.dims[i] = d.dims[i];
        r.offset = off[t];
        r.nbytes = nbytes[t];
        r.flags  = (uint8_t)d.role;
    }
    std::vector<plan::PlanOp> ops(prog.ops.size());
    for (size_t i = 0; i < prog.ops.size(); ++i) {
        ops[i]      = prog.ops[i].op;
        ops[i].name = intern(prog.ops[i].name);
    }

    json meta;
    meta["format"]       = "g4plan";
    meta["g4_version"]   = G4_VERSION_STRING;
    meta["architecture"] = mc.model_type;
    meta["head_dim_form"] = mc.head_dim_form;
    meta["device"]       = opt.device;
    meta["weights_dtype"] = opt.weights;
    meta["hparams"]      = hparams_json(hp);
    meta["program"]      = {{"max_rows", opt.max_rows},       {"max_context", max_context},
                            {"logits_rows", opt.logits_rows}, {"sliding_slots", prog.sliding_slots},
                            {"act_arena_bytes", act_arena},   {"kv_arena_bytes", kv_arena},
                            {"ids_tensor", prog.ids},         {"logits_tensor", prog.logits},
                            {"max_k", max_k},                 {"max_slots", max_context},
                            {"vocab_size", hp.vocab_size},
                            {"embed_vocab_limit", hp.ple_dim > 0 ? std::min(hp.vocab_size, hp.ple_vocab_size) : hp.vocab_size}};
    const auto& g        = mc.generation;
    meta["generation"]   = {{"eos_token_ids", g.eos_token_ids}, {"bos_token_id", g.bos_token_id},
                            {"pad_token_id", g.pad_token_id},   {"do_sample", g.do_sample},
                            {"temperature", g.temperature},     {"top_k", g.top_k},
                            {"top_p", g.top_p},                 {"min_p", g.min_p},
                            {"repetition_penalty", g.repetition_penalty}};
    meta["source"]       = {{"model_dir", fs::path(opt.model_dir).filename().string()},
                            {"checkpoint_files", (int)ckpt.files().size()}};
    std::string meta_text = meta.dump(1);

    // Layout: header, section table, then 4096-aligned sections; weights streamed last.
    struct Sec { plan::SectionKind kind; const void* data; uint64_t size; };
    std::vector<Sec> small = {{plan::SectionKind::Meta, meta_text.data(), meta_text.size()},
                              {plan::SectionKind::Strings, strings.data(), strings.size()},
                              {plan::SectionKind::Tensors, tensors.data(), tensors.size() * sizeof(plan::PlanTensor)},
                              {plan::SectionKind::Ops, ops.data(), ops.size() * sizeof(plan::PlanOp)}};
    const uint32_t nsec = (uint32_t)small.size() + 1;
    std::vector<plan::PlanSection> table(nsec);
    uint64_t cursor = align_up(sizeof(plan::PlanHeader) + nsec * sizeof(plan::PlanSection), plan::kSectionAlign);
    AtomicFile out(opt.out_path);
    for (uint32_t i = 0; i < small.size(); ++i) {
        table[i]          = {(uint32_t)small[i].kind, 0, cursor, small[i].size, plan::fnv1a64(small[i].data, small[i].size)};
        out.write_at(cursor, small[i].data, small[i].size);
        cursor = align_up(cursor + small[i].size, plan::kSectionAlign);
    }
    const uint64_t wbase = cursor;
    uint64_t wsum        = plan::fnv1a64(nullptr, 0);
    uint64_t wpos        = 0;
    std::vector<uint8_t> buf;
    static const uint8_t zeros[plan::kTensorAlign] = {};
    for (size_t t = 0; t < prog.tensors.size(); ++t) {
        if (prog.tensors[t].kind != TensorKind::Weight) continue;
        if (off[t] > wpos) {   // alignment padding, part of the checksum
            wsum = plan::fnv1a64(zeros, off[t] - wpos, wsum);
            out.write_at(wbase + wpos, zeros, off[t] - wpos);
            wpos = off[t];
        }
        convert_weight(sources[t], prog.tensors[t].dtype, numel(prog.tensors[t].dims), buf);
        out.write_at(wbase + wpos, buf.data(), buf.size());
        wsum = plan::fnv1a64(buf.data(), buf.size(), wsum);
        wpos += buf.size();
    }
    table[nsec - 1] = {(uint32_t)plan::SectionKind::Weights, 0, wbase, weights_size, wsum};
    const uint64_t file_size = wbase + weights_size;

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
    h.header_checksum      = (uint32_t)plan::fnv1a64(&h, sizeof h);
    out.write_at(0, &h, sizeof h);
    out.write_at(sizeof h, table.data(), table.size() * sizeof(plan::PlanSection));
    if (weights_size == 0) out.write_at(file_size - 1, "", 0);
    out.commit();

    log << "g4 compile: " << opt.model_dir << " (" << mc.model_type << ", " << mc.head_dim_form << " config, "
        << hp.num_layers << " layers, " << hp.num_kv_shared_layers << " KV-shared) -> " << opt.out_path << "\n";
    log << "  weights " << opt.weights << ": " << weights_size << " bytes; activation arena " << act_arena
        << " bytes; KV cache " << kv_arena << " bytes (max_context " << max_context << ", sliding ring "
        << prog.sliding_slots << " slots, chunk " << opt.max_rows << ")\n";
    log << "  ops " << ops.size() << ", tensors " << tensors.size() << "; checkpoint tensors not used by the text decoder: "
        << ignored_text << " (KV-shared layers' k/v/k_norm and similar) + " << ignored_other << " (vision/audio towers)\n";
}

} // namespace g4
