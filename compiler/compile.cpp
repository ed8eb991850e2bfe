// Plan compiler (see compile.h).
//
// Per weight: read from the checkpoint (bf16/f16/f32, or a bitsandbytes NF4 base dequantized to
// fp32) -> merge the LoRA adapter in fp32 -> store as the policy says: NF4 quantized straight from
// the fp32 result (no bf16 rounding in between), bf16, or f32.
#include "compiler/compile.h"
#include "compiler/config.h"
#include "compiler/cross_device.h"
#include "compiler/cuda_compile.h"
#include "compiler/cuda_schedule.h"
#include "compiler/error.h"
#include "compiler/lora.h"
#include "compiler/nf4_quant.h"
#include "compiler/output_file.h"
#include "compiler/placement.h"
#include "compiler/programs.h"
#include "compiler/safetensors.h"
#include "compiler/sha256.h"
#include "g4/g4.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/nf4.h"
#include "models/gemma4/graph.h"
#include "models/gemma4/vision_graph.h"
#include "runtime/plan/plan_format.h"
#include "runtime/src/cuda/driver.h"
#include "runtime/src/cuda/workspace.h"
#include "runtime/src/json_limits.h"
#include "runtime/src/tokenizer.h"
#include "runtime/src/towers/audio.h"
#include "runtime/src/towers/image.h"
#include "runtime/src/towers/media.h"
#include "runtime/src/towers/vision.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <regex>
#include <set>
#include <unistd.h>

namespace g4 {
namespace {

namespace fs = std::filesystem;
using json   = nlohmann::json;
using gemma4::Program;
using gemma4::TensorDesc;
using gemma4::WeightRole;
using plan::TensorKind;

uint64_t align_up(uint64_t v, uint64_t a) {
    return (v + a - 1) / a * a;
}

std::string shape_str(const std::vector<int64_t>& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i)
        r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
}

int64_t numel(const std::vector<int64_t>& d) {
    int64_t n = 1;
    for (auto v : d)
        n *= v;
    return n;
}

std::string human(uint64_t b) {
    char buf[64];
    if (b >= (1ull << 30))
        std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
    else if (b >= (1ull << 20))
        std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1048576.0);
    else
        std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
    return buf;
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
        for (int t : p.ops[i].op.in)
            touch(t, i);
        for (int t : p.ops[i].op.out)
            touch(t, i);
    }
    // A fused CUDA kernel (compiler/cuda_schedule.cpp) reads an op's inputs while it writes what the
    // next ops make of that op's outputs (gate/up GEMV + GeluMul writes the product while blocks still
    // read x), so every input lives until the first op that consumes the op's outputs.
    for (int i = (int)p.ops.size() - 1; i >= 0; --i)
        for (int o : p.ops[i].op.out) {
            if (o < 0) continue;
            int r = -1;
            for (int j = i + 1; j < (int)p.ops.size() && r < 0; ++j)
                for (int t : p.ops[j].op.in)
                    if (t == o) r = j;
            for (int t : p.ops[i].op.in)
                if (t >= 0 && r > last[t]) last[t] = r;
        }
    auto first_reader = [&](int t, int after) {
        for (int j = after + 1; j < (int)p.ops.size(); ++j)
            for (int x : p.ops[j].op.in)
                if (x == t) return j;
        return -1;
    };
    auto code     = [&](int j) { return (OpCode)p.ops[j].op.code; };
    auto producer = [&](int t, int before) {
        for (int j = before - 1; j >= 0; --j)
            for (int o : p.ops[j].op.out)
                if (o == t) return j;
        return -1;
    };
    // The fused decode MLP (g4_mlp_nf4, sm_90 plans) still reads the gate/up input while it adds into the
    // down projection's output: that input lives until the down's output is consumed.
    // Where it runs the ResNorm before it (cuda_schedule.cpp mlp_fold), every block reads that ResNorm's
    // residual x and attention output d while block 0 writes x1 and the blocks add into the MLP's output y,
    // which the ResNorm making the layer's q/k/v input zeroes. So x and d live until y is consumed too, and y
    // lives from the residual add before the layer's q/k/v input on. Chain: x, d -> Add -> x1 -> RmsNorm ->
    // xn -> gate Matmul -> GeluMul -> down Matmul -> y; the layer's Attention op reads q, made by a Matmul of
    // the q/k/v input.
    for (int k = 0; k < (int)p.ops.size(); ++k) {
        if (code(k) != OpCode::GeluMul) continue;
        const int m = first_reader(p.ops[k].op.out[0], k);
        if (m < 0 || code(m) != OpCode::Matmul) continue;
        const int r = std::max(m, first_reader(p.ops[m].op.out[0], m));
        for (int pi = k - 1; pi >= 0 && pi >= k - 2; --pi)
            if (code(pi) == OpCode::Matmul && p.ops[pi].op.in[0] >= 0)
                last[p.ops[pi].op.in[0]] = std::max(last[p.ops[pi].op.in[0]], r);
        const int ga = producer(p.ops[k].op.in[0], k), y = p.ops[m].op.out[0];
        if (ga < 0 || code(ga) != OpCode::Matmul || y < 0 || first[y] < 0) continue;
        const int pn = producer(p.ops[ga].op.in[0], ga),
                  ad = pn >= 0 && code(pn) == OpCode::RmsNorm ? producer(p.ops[pn].op.in[0], pn) : -1;
        if (ad < 0 || code(ad) != OpCode::Add) continue;
        for (int t : {p.ops[ad].op.in[0], p.ops[ad].op.in[1]})
            if (t >= 0) last[t] = std::max(last[t], r);
        for (int a = ad - 1; a >= 0; --a) {
            if (code(a) != OpCode::Attention || p.ops[a].op.layer != p.ops[m].op.layer) continue;
            const int q = p.ops[a].op.in[0], qm = q >= 0 ? first[q] : -1;
            if (qm < 0 || code(qm) != OpCode::Matmul || p.ops[qm].op.in[0] < 0) break;
            const int qn = producer(p.ops[qm].op.in[0], qm);
            const int x2 = qn >= 0 && code(qn) == OpCode::RmsNorm ? p.ops[qn].op.in[0] : p.ops[qm].op.in[0];
            if (x2 >= 0 && first[x2] >= 0) first[y] = std::min(first[y], first[x2]);
            break;
        }
    }
    // The decode attention's merge + o projection (g4_attn_o_nf4, sm_90 plans) adds into the o output, which
    // the ResNorm making the layer's q/k/v input zeroes: the o output lives from that input's making on.
    for (int a = 0; a < (int)p.ops.size(); ++a) {
        if (p.ops[a].op.code != (uint16_t)OpCode::Attention || p.ops[a].op.in[0] < 0) continue;
        const int m = first_reader(p.ops[a].op.out[0], a), qm = first[p.ops[a].op.in[0]];
        if (m < 0 || p.ops[m].op.code != (uint16_t)OpCode::Matmul || qm < 0 ||
            p.ops[qm].op.code != (uint16_t)OpCode::Matmul)
            continue;
        const int y = p.ops[m].op.out[0], xn = p.ops[qm].op.in[0];
        if (y >= 0 && xn >= 0 && first[xn] >= 0 && first[y] >= 0) first[y] = std::min(first[y], first[xn]);
    }
    // The per-layer-input projection after a ResNorm folded into its kernel (cuda_schedule.cpp ple_fold): the
    // MLP before zeroes its output y while blocks still read the MLP's input xn, and the projection adds into
    // y while its blocks read the residual and the MLP's output: y lives from xn's making on. Chain: xn ->
    // gate/up Matmul -> GeluMul -> down Matmul -> d [in-place RmsNorm] -> Add -> PLE gate Matmul -> GeluMul
    // -> projection.
    for (int k = 0; k < (int)p.ops.size(); ++k) {
        if (code(k) != OpCode::GeluMul) continue;
        const int pr = first_reader(p.ops[k].op.out[0], k), g = producer(p.ops[k].op.in[0], k);
        if (pr < 0 || code(pr) != OpCode::Matmul || g < 0 || code(g) != OpCode::Matmul) continue;
        const int a = producer(p.ops[g].op.in[0], g);
        if (a < 0 || code(a) != OpCode::Add) continue;
        for (int d : {p.ops[a].op.in[0], p.ops[a].op.in[1]}) {
            int dn = producer(d, a);
            if (dn >= 0 && code(dn) == OpCode::RmsNorm && p.ops[dn].op.in[0] == d && p.ops[dn].op.out[0] == d)
                dn = producer(d, dn);
            if (dn < 0 || code(dn) != OpCode::Matmul) continue;
            const int u = producer(p.ops[dn].op.in[0], dn);
            if (u < 0 || code(u) != OpCode::GeluMul) continue;
            const int ga = producer(p.ops[u].op.in[0], u);
            if (ga < 0 || code(ga) != OpCode::Matmul) continue;
            const int y = p.ops[pr].op.out[0], xn = p.ops[ga].op.in[0];
            if (y >= 0 && xn >= 0 && first[xn] >= 0 && first[y] >= 0)
                first[y] = std::min(first[y], first[xn]);
        }
    }
    // Inputs and logits (the output) live for the whole step (written before / read after the program).
    const int n_ops = (int)p.ops.size();
    if (p.ids >= 0) first[p.ids] = 0, last[p.ids] = n_ops;
    if (p.logits >= 0) last[p.logits] = n_ops;
    for (int t = 0; t < nt; ++t)
        if (p.tensors[t].kind == TensorKind::Input && first[t] >= 0) first[t] = 0, last[t] = n_ops;

    struct Block {
        uint64_t off, size;
        int first, last;
    };
    std::vector<Block> placed;
    std::vector<int> order;
    for (int t = 0; t < nt; ++t) {
        auto k = p.tensors[t].kind;
        if ((k == TensorKind::Activation || k == TensorKind::Input) && first[t] >= 0) order.push_back(t);
    }
    auto bytes = [&](int t) { return dtype_bytes(p.tensors[t].dtype, numel(p.tensors[t].dims)); };
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return bytes(a) > bytes(b); });
    uint64_t arena = 0;
    offset.assign(nt, 0);
    for (int t : order) {
        uint64_t size = align_up(bytes(t), plan::kTensorAlign);
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

// Each program's activations in its own arena: plan_activations over that program's ops (tensors keep their
// indices); sets r.arena_bytes. The text program is ranges[0] (its ids and logits live for the whole step).
void plan_program_activations(const Program& prog, std::vector<ProgramRange>& ranges,
                              std::vector<uint64_t>& offset) {
    offset.assign(prog.tensors.size(), 0);
    for (size_t k = 0; k < ranges.size(); ++k) {
        ProgramRange& r = ranges[k];
        Program sub;
        sub.tensors = prog.tensors;
        sub.ops.assign(prog.ops.begin() + r.op_begin, prog.ops.begin() + r.op_end);
        sub.ids    = k == 0 ? prog.ids : -1;
        sub.logits = k == 0 ? prog.logits : r.outputs.empty() ? -1 : r.outputs[0];
        std::vector<uint64_t> off;
        r.arena_bytes = plan_activations(sub, off);
        for (size_t t = r.tensor_begin; t < r.tensor_end; ++t)
            offset[t] = off[t];
    }
}

// A plan being written (compiler/output_file.h): write failures throw; it replaces its path only on
// commit, and is deleted if never committed.
struct PlanFile {
    OutputFile f;
    explicit PlanFile(const std::string& path) {
        std::string err;
        if (!f.open(path, &err)) throw CompileError(err);
    }
    void write_at(uint64_t off, const void* data, size_t n) {
        std::string err;
        if (!f.write_at(off, data, n, &err)) throw CompileError(err);
    }
    void commit() {
        std::string err;
        if (!f.commit(&err)) throw CompileError(err);
    }
};

json hparams_json(const gemma4::TextHParams& hp) {
    json lt = json::array();
    for (int i = 0; i < hp.num_layers; ++i)
        lt.push_back(gemma4::layer_type_name(hp.layer_types[i]));
    return json{{"vocab_size", hp.vocab_size},
                {"hidden_size", hp.hidden_size},
                {"intermediate_size", hp.intermediate_size},
                {"num_hidden_layers", hp.num_layers},
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

// Everything decided once per compile and shared by the plan and the fidelity reference plan.
struct Inputs {
    Inputs(const CompileOptions& o, ModelConfig m) : opt(o), mc(std::move(m)) {}
    const CompileOptions& opt;
    ModelConfig mc;
    std::unique_ptr<st::Checkpoint> ckpt;
    std::unique_ptr<lora::Adapter> adapter;
    int max_context   = 0;
    bool prequantized = false; // base checkpoint is bitsandbytes 4-bit
    json provenance   = json::object();
    std::string tokenizer_json; // embedded verbatim as the TOKENIZER section ("" = none)
    json tokenizer_meta = json::object();
    int cuda_index      = -1; // CUDA plans: device index, target and kernels
    std::string cuda_target;
    cuda::KernelSpec cuda_spec; // the model constants the kernels are compiled for
    std::vector<char> cubin;
    std::string ptx;
    bool kernels_cached = false;          // cubin and PTX came from the kernel cache (cuda_compile.h)
    json placement_meta = json::object(); // META "placement" and "memory" (compiler/placement.h)
    bool size_only      = false;          // write_plan stops after the memory plan
    DType kv_dtype      = DType::F32;     // KV cache storage (the fidelity reference plan keeps f32)
    std::vector<int>
        layer_device; // CUDA plans: each text layer's device, -1 the CPU (empty: all on cuda_index)
    // Vision/audio towers compiled into the plan (Mode::Plan only; they run on the CPU): their weights'
    // HF names relative to "model.", META "towers" (less the weights range), host bytes a session adds.
    std::vector<std::string> tower_names;
    std::vector<EncoderProgram> encoders; // encoder programs after the text program (Mode::Plan only)
    json towers_meta             = json::object();
    uint64_t tower_session_bytes = 0;
};

static_assert((int)WeightRole::Tower == plan::kRoleTower &&
              (int)WeightRole::TowerScalar == plan::kRoleTowerScalar);
bool is_tower(const TensorDesc& d) {
    return d.role == WeightRole::Tower || d.role == WeightRole::TowerScalar;
}
std::string tower_group_name(const std::string& name) {
    return name.rfind("vision_tower.", 0) == 0 || name.rfind("embed_vision.", 0) == 0 ? "vision tower"
                                                                                      : "audio tower";
}

// A checkpoint's tensors as the towers read them (runtime/src/towers/tower.h); f16 widened to f32, and a
// tensor that is not 4-byte aligned in the mapped file (a valid safetensors header may have any length)
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

// Index of the first NaN or infinity among n floats (or bf16 words), or -1.
int64_t first_non_finite(const float* p, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(p[i])) return i;
    return -1;
}
int64_t first_non_finite_bf16(const uint8_t* p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        if ((h & 0x7f80) == 0x7f80) return i;
    }
    return -1;
}

// Reads a base weight as fp32: plain floats, or a bitsandbytes NF4 tensor dequantized.
void read_base_f32(const Inputs& in, const std::string& hf, const std::vector<int64_t>& shape,
                   std::vector<float>& out) {
    out.resize(numel(shape));
    const std::string qs = hf + ".quant_state.bitsandbytes__nf4";
    if (in.ckpt->has(qs)) {
        auto view = [&](const std::string& n, std::string* dt = nullptr) {
            nf4::ByteView bv;
            if (!in.ckpt->has(n)) return bv;
            const st::TensorView& v = in.ckpt->get(n);
            bv.data = v.data, bv.size = v.nbytes;
            if (dt) *dt = st::dtype_name(v.dtype);
            return bv;
        };
        const st::TensorView& state = in.ckpt->get(qs);
        nf4::BnbNf4 t;
        t.name             = hf;
        t.weight           = view(hf);
        t.absmax           = view(hf + ".absmax", &t.absmax_dtype);
        t.quant_map        = view(hf + ".quant_map");
        t.nested_absmax    = view(hf + ".nested_absmax");
        t.nested_quant_map = view(hf + ".nested_quant_map");
        t.quant_state      = std::string_view((const char*)state.data, state.nbytes);
        t.quant_state_key  = "bitsandbytes__nf4";
        std::vector<int64_t> got;
        out = nf4::dequantize_bnb(t, &got);
        if (got != shape)
            throw CompileError("tensor '" + hf + "' (bitsandbytes 4-bit) has shape " + shape_str(got) +
                               " but config.json implies " + shape_str(shape));
        return;
    }
    const st::TensorView& v = in.ckpt->get(hf);
    st::to_f32(v, out.data());
}

struct Report {
    struct Group {
        uint64_t before = 0, after = 0;
        int tensors = 0;
    };
    std::map<std::string, Group> groups;
    std::vector<std::string> merged; // adapter modules merged
    std::map<std::string, std::string> tensor_dtype;
    uint64_t weights_bytes = 0, act_arena = 0, kv_arena = 0, cuda_workspace = 0, cuda_pinned = 0,
             cpu_scratch_per_thread = 0;
    uint64_t ple_table_bytes        = 0; // part of weights_bytes; in host memory with --place ple=host
    uint64_t host_weights           = 0,
             host_kv       = 0; // CPU-placed layers: parts of weights_bytes / kv_arena in host memory
    uint64_t tower_weights = 0; // vision/audio towers: part of weights_bytes, host memory
    uint64_t vision_begin  = 0,
             vision_end    = 0; // the vision tower's weights within WEIGHTS (a GPU vision tower uploads them)
    uint64_t audio_begin = 0, audio_end = 0;     // the audio tower's (likewise)
    std::map<int, placement::Figures::Gpu> gpus; // cross-device plans: per GPU
    cross_device::Stats cross;
    std::string kv_dtype;
    int sliding_slots = 0;
    size_t n_ops = 0, n_tensors = 0, ignored_text = 0, ignored_other = 0;
};

enum class Mode {
    Plan,
    Reference,
    CpuTwin
}; // CpuTwin: the plan's weights, for the CPU (fidelity of CUDA plans)

// Builds and writes one plan. Mode::Reference stores every quantized or merged weight as f32
// (the full-precision model the fidelity figure compares against).
void write_plan(const Inputs& in, PlanFile* out_file, Mode mode, Report* rep) {
    const CompileOptions& opt = in.opt;
    const auto& hp            = in.mc.text;
    const DType rest_dt       = opt.weights == "f32" ? DType::F32 : DType::BF16;

    gemma4::BuildOptions bo;
    bo.max_rows    = opt.max_rows;
    bo.max_context = in.max_context;
    bo.logits_rows = opt.logits_rows;
    bo.kv_dtype    = mode == Mode::Reference ? DType::F32 : in.kv_dtype;
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
    Program prog      = gemma4::build_text_program(hp, bo);
    const bool hybrid = mode == Mode::Plan && !in.layer_device.empty(); // layer_device: CUDA plans only
    if (hybrid) rep->cross = cross_device::split(prog, in.layer_device, in.cuda_index);
    // Tower weights: no ops read them; they follow every text weight in WEIGHTS (the CUDA runtime
    // uploads none of them) with their checkpoint shapes (0-d bounds stored as [1]).
    const size_t n_text_tensors = prog.tensors.size();
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
    std::vector<ProgramRange> programs(1);
    programs[0].name       = "text";
    programs[0].device     = in.cuda_index >= 0 && mode == Mode::Plan ? in.cuda_index : -1;
    programs[0].op_end     = prog.ops.size();
    programs[0].tensor_end = prog.tensors.size();
    programs[0].inputs     = {prog.ids};
    programs[0].outputs    = {prog.logits};
    programs[0].max_rows   = {opt.max_rows, opt.logits_rows, 0, 0};
    if (mode == Mode::Plan)
        for (const EncoderProgram& e : in.encoders)
            programs.push_back(append_program(prog, e));
    const size_t n_text_ops = programs[0].op_end;

    // Quantization policy: default set = text attention/MLP projections when --weights nf4.
    std::regex qre, kre;
    try {
        if (!opt.quantize_regex.empty()) qre = std::regex(opt.quantize_regex);
        if (!opt.keep_regex.empty()) kre = std::regex(opt.keep_regex);
    } catch (const std::regex_error& e) {
        throw CompileError(std::string("invalid --quantize/--keep regular expression: ") + e.what());
    }
    std::map<int, bool> matmul_weight, gathered;
    for (const auto& o : prog.ops) {
        if (o.op.code == (uint16_t)OpCode::Matmul) matmul_weight[o.op.in[1]] = true;
        if (o.op.code == (uint16_t)OpCode::Embed) gathered[o.op.in[1]] = true;
    }

    // Checkpoint tensor behind each weight, and the name the adapter knows it by.
    auto source_of = [&](const TensorDesc& d) {
        if (is_tower(d)) return "model." + d.name;
        return in.mc.tensor_prefix +
               (d.name == "lm_head.weight" ? std::string("embed_tokens.weight") : d.name);
    };
    auto adapter_name_of = [&](const TensorDesc& d) {
        return is_tower(d)                  ? "model." + d.name
               : d.name == "lm_head.weight" ? d.name
                                            : in.mc.tensor_prefix + d.name;
    };

    // Resolve and validate every weight; choose its stored dtype.
    std::map<std::string, bool> used;
    std::vector<bool> quantized(prog.tensors.size(), false);
    for (size_t t = 0; t < prog.tensors.size(); ++t) {
        TensorDesc& d = prog.tensors[t];
        if (d.kind != TensorKind::Weight) continue;
        if (d.role == WeightRole::Constant || d.role == WeightRole::LoraBias) {
            d.dtype = DType::F32;
            continue;
        }
        if (is_tower(d)) { // shapes and dtypes checked by the tower's init (compile_plan)
            d.dtype            = rest_dt;
            used[source_of(d)] = true;
            continue;
        }
        std::string hf = source_of(d);
        bool bnb       = in.ckpt->has(hf + ".quant_state.bitsandbytes__nf4");
        if (in.ckpt->has(hf + ".quant_state.bitsandbytes__fp4"))
            throw CompileError(
                "tensor '" + hf +
                "' is bitsandbytes FP4, which is not supported; use an NF4 or a bf16 base checkpoint");
        if (!in.ckpt->has(hf))
            throw CompileError("missing tensor '" + hf + "' in checkpoint " + opt.model_dir +
                               " (config.json implies it; is the checkpoint complete and for this config?)");
        const st::TensorView& v = in.ckpt->get(hf);
        if (!bnb) {
            if (v.shape != d.dims)
                throw CompileError("tensor '" + hf + "' in " + v.file + " has shape " + shape_str(v.shape) +
                                   " but config.json implies " + shape_str(d.dims) +
                                   "; the checkpoint and config.json disagree");
            if (v.dtype != st::DType::F32 && v.dtype != st::DType::BF16 && v.dtype != st::DType::F16)
                throw CompileError("tensor '" + hf + "' in " + v.file + " has dtype " +
                                   st::dtype_name(v.dtype) +
                                   "; g4 reads F32, BF16 or F16 weights (or bitsandbytes NF4)");
        }
        used[hf]    = true;
        bool want_q = false;
        if (matmul_weight.count((int)t) && !gathered.count((int)t)) {
            if (!opt.quantize_regex.empty())
                want_q = std::regex_search(hf, qre);
            else
                want_q =
                    opt.weights == "nf4" && (d.role == WeightRole::AttnProj || d.role == WeightRole::MlpProj);
            if (!opt.keep_regex.empty() && std::regex_search(hf, kre)) want_q = false;
        } else if (!opt.quantize_regex.empty() && std::regex_search(hf, qre) && gathered.count((int)t) &&
                   d.role != WeightRole::Norm && d.role != WeightRole::Scalar) {
            throw CompileError("--quantize matches '" + hf +
                               "', which is read by an embedding lookup; NF4 embeddings are not supported "
                               "(add it to --keep)");
        }
        quantized[t] = want_q;
        d.dtype      = want_q ? DType::NF4 : rest_dt;
        if (mode == Mode::Reference && (want_q || bnb)) d.dtype = DType::F32;
    }
    // Adapter-merged weights are full precision in the reference.
    std::map<std::string, bool> targeted;
    if (in.adapter) {
        for (const auto& m : in.adapter->merges())
            targeted[m.module + ".weight"] = true;
        for (const auto& r : in.adapter->replacements())
            targeted[r] = true;
    }
    auto is_targeted = [&](const std::string& hf) {
        if (targeted.count(hf)) return true;
        if (in.mc.tensor_prefix == "model." && hf.rfind("model.", 0) == 0)
            return targeted.count("model.language_model." + hf.substr(6)) > 0;
        return false;
    };
    if (mode == Mode::Reference)
        for (auto& d : prog.tensors)
            if (d.kind == TensorKind::Weight && is_targeted(adapter_name_of(d))) d.dtype = DType::F32;

    for (const auto& n : in.ckpt->names()) {
        if (used.count(n)) continue;
        bool aux = false; // bitsandbytes side tensors of a used weight
        for (const char* suf : {".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map",
                                ".quant_state.bitsandbytes__nf4"}) {
            std::string s = suf;
            if (n.size() > s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0 &&
                used.count(n.substr(0, n.size() - s.size())))
                aux = true;
        }
        if (aux) continue;
        (n.rfind(in.mc.tensor_prefix, 0) == 0 ? rep->ignored_text : rep->ignored_other)++;
    }

    // Byte sizes and memory plan.
    const bool dq = opt.double_quant;
    std::vector<uint64_t> act_off;
    plan_program_activations(prog, programs, act_off);
    const uint64_t act_arena = programs[0].arena_bytes;
    uint64_t kv_arena = 0, weights_size = 0;
    std::vector<uint64_t> off(prog.tensors.size(), 0), nbytes(prog.tensors.size(), 0);
    // Cross-device plans: weights and caches are grouped by the devices whose ops touch them, so each
    // GPU uploads at most two ranges of the weights section (those several GPUs read, then its own)
    // and owns one range of the KV arena; what no GPU touches (CPU-placed layers) goes last. Relative
    // order is kept within a group (a LoRA bias follows its weight).
    std::vector<int> op_dev(hybrid ? prog.ops.size() : 0); // per op: CUDA index or -1 (the CPU)
    std::vector<int> gpus;                                 // GPUs that run ops, the plan's GPU first
    std::vector<int> group(prog.tensors.size(), 0);        // layout group of each weight / cache
    if (hybrid) {
        gpus.push_back(in.cuda_index);
        std::vector<std::set<int>> touched(prog.tensors.size());
        for (size_t i = 0; i < prog.ops.size(); ++i) {
            const auto& op = prog.ops[i].op;
            op_dev[i]      = cross_device::op_device(op, in.layer_device, in.cuda_index);
            if (op_dev[i] >= 0 && std::find(gpus.begin(), gpus.end(), op_dev[i]) == gpus.end())
                gpus.push_back(op_dev[i]);
            if (op.code == (uint16_t)OpCode::Copy) continue;
            for (int32_t t : {op.in[0], op.in[1], op.in[2], op.in[3], op.out[0], op.out[1]})
                if (t >= 0) touched[t].insert(op_dev[i]);
        }
        // Groups: 0 weights read by several GPUs, 1 + g GPU g's own, 1 + gpus.size() no GPU's.
        for (size_t t = 0; t < prog.tensors.size(); ++t) {
            std::set<int> g = touched[t];
            g.erase(cross_device::kHost);
            if (g.size() > 1 && prog.tensors[t].kind == TensorKind::KvCache)
                throw CompileError("internal: KV cache '" + prog.tensors[t].name +
                                   "' is touched by ops on several GPUs");
            group[t] = g.empty() ? 1 + (int)gpus.size()
                       : g.size() > 1
                           ? 0
                           : 1 + (int)(std::find(gpus.begin(), gpus.end(), *g.begin()) - gpus.begin());
        }
    }
    const int towers_group = 2 + (int)gpus.size(); // after the host group
    for (size_t t = n_text_tensors; t < prog.tensors.size(); ++t)
        group[t] = towers_group;
    int64_t max_k = 1;
    for (size_t t = 0; t < prog.tensors.size(); ++t) {
        const TensorDesc& d = prog.tensors[t];
        nbytes[t]           = d.dtype == DType::NF4 ? nf4::layout(numel(d.dims), dq).total
                                                    : dtype_bytes(d.dtype, numel(d.dims));
        if (d.kind == TensorKind::Weight && d.dims.size() == 2 && t < n_text_tensors)
            max_k = std::max(max_k, d.dims[1]);
        if (d.kind != TensorKind::Weight && d.kind != TensorKind::KvCache) off[t] = act_off[t];
    }
    // Lays out the tensors of `kind` group by group, each aligned (weights plan::kWeightAlign, caches
    // kTensorAlign), in `order`; returns where each group starts (and, last, the end).
    auto lay_out = [&](TensorKind kind, uint64_t& size, std::vector<size_t>& order) {
        const uint64_t align = kind == TensorKind::Weight ? plan::kWeightAlign : plan::kTensorAlign;
        std::vector<uint64_t> starts;
        for (int g = 0; g <= towers_group; ++g) {
            starts.push_back(size);
            for (size_t t = 0; t < prog.tensors.size(); ++t) {
                if (prog.tensors[t].kind != kind || group[t] != g) continue;
                size   = align_up(size, align);
                off[t] = size;
                size += nbytes[t];
                order.push_back(t);
            }
        }
        starts.push_back(size);
        return starts;
    };
    std::vector<size_t> worder, kvorder; // weights in WEIGHTS order; caches in KV-arena order
    const std::vector<uint64_t> wstart = lay_out(TensorKind::Weight, weights_size, worder);
    const std::vector<uint64_t> kstart = lay_out(TensorKind::KvCache, kv_arena, kvorder);
    const size_t host_group            = 1 + gpus.size();
    rep->host_weights                  = wstart[host_group + 1] - wstart[host_group];
    rep->tower_weights                 = wstart[towers_group + 1] - wstart[towers_group];
    for (size_t t = n_text_tensors; t < prog.tensors.size(); ++t) { // each tower's weights contiguous
        if (prog.tensors[t].kind != TensorKind::Weight) continue;
        const bool vision = tower_group_name(prog.tensors[t].name) == "vision tower";
        uint64_t& b       = vision ? rep->vision_begin : rep->audio_begin;
        uint64_t& e       = vision ? rep->vision_end : rep->audio_end;
        if (e == 0) b = off[t];
        e = off[t] + nbytes[t];
    }
    rep->host_kv = kv_arena - kstart[host_group];

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
        for (size_t i = 0; i < d.dims.size(); ++i)
            r.dims[i] = d.dims[i];
        r.offset      = off[t];
        r.nbytes      = nbytes[t];
        r.flags       = (uint8_t)d.role;
        r.quant_flags = d.dtype == DType::NF4 && dq ? plan::kQuantDoubleQuant : 0;
    }
    std::vector<plan::PlanOp> ops(prog.ops.size());
    for (size_t i = 0; i < prog.ops.size(); ++i) {
        ops[i]      = prog.ops[i].op;
        ops[i].name = intern(prog.ops[i].name);
    }
    programs[0].thread_floats = (uint64_t)std::max<int64_t>(32 * max_k, in.max_context + 64);
    const std::vector<plan::PlanProgram> program_table = program_records(programs, intern);
    // Ahead-of-time kernel choices for CUDA from the real shapes (the runtime keeps no heuristics).
    cuda::choose_variants(ops, tensors, in.max_context, in.opt.prefill_precision);
    std::vector<plan::CudaLaunch> schedule;
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
        const std::vector<plan::PlanOp> text_ops(ops.begin(), ops.begin() + n_text_ops);
        const std::vector<int> text_dev(op_dev.begin(), op_dev.begin() + std::min(op_dev.size(), n_text_ops));
        schedule = cuda::decode_schedule(text_ops, tensors, text_dev, fuse, fuse, in.cuda_spec.attn_hpg,
                                         mlp_reps, opt.mlp_precision == "f16", fold_ple, fold_mlp);
        for (const plan::CudaLaunch& l : schedule) {
            if (l.kind == (uint16_t)plan::LaunchKind::Mlp)
                tensors[ops[l.ip[3]].in[1]].quant_flags |= plan::kQuantTiled32;
            if (l.kind == (uint16_t)plan::LaunchKind::AttnO)
                tensors[ops[l.op].in[1]].quant_flags |= plan::kQuantTiled32;
        }
    }

    json policy = {{"weights", opt.weights},         {"double_quant", dq},
                   {"quantize", opt.quantize_regex}, {"keep", opt.keep_regex},
                   {"nf4_blocksize", nf4::kBlock},   {"kv_dtype", dtype_str(bo.kv_dtype)}};
    if (in.cuda_index >= 0) policy["deterministic"] = opt.deterministic;
    if (in.cuda_index >= 0) policy["prefill_precision"] = opt.prefill_precision;
    if (in.cuda_index >= 0) policy["mlp_precision"] = opt.mlp_precision;
    // The schedule choices for measurements, only where they are not the default.
    if (in.cuda_index >= 0 && opt.mlp_replicas != "auto")
        policy["mlp_replicas"] = std::stoi(opt.mlp_replicas);
    if (in.cuda_index >= 0 && opt.ple_fold != "on") policy["ple_fold"] = opt.ple_fold;
    if (in.cuda_index >= 0 && opt.mlp_fold != "one-wave") policy["mlp_fold"] = opt.mlp_fold;
    json meta;
    meta["format"]        = "g4plan";
    meta["g4_version"]    = G4_VERSION_STRING;
    meta["architecture"]  = in.mc.model_type;
    meta["head_dim_form"] = in.mc.head_dim_form;
    meta["device"]        = in.cuda_index >= 0 && mode == Mode::Plan ? "cuda" : "cpu";
    if (in.cuda_index >= 0 && mode == Mode::Plan)
        meta["cuda"] = {
            {"target", in.cuda_target}, {"device_index", in.cuda_index}, {"attn_hpg", in.cuda_spec.attn_hpg}};
    if (in.cuda_index >= 0 && mode == Mode::Plan && in.cuda_spec.trace)
        meta["cuda"]["kernel_trace"] = opt.kernel_trace;
    meta["weights_dtype"]  = opt.weights;
    meta["policy"]         = policy;
    meta["reference_plan"] = mode == Mode::Reference;
    meta["hparams"]        = hparams_json(hp);
    meta["program"]        = {
               {"max_rows", opt.max_rows},
               {"max_context", in.max_context},
               {"logits_rows", opt.logits_rows},
               {"sliding_slots", prog.sliding_slots},
               {"act_arena_bytes", act_arena},
               {"kv_arena_bytes", kv_arena},
               {"ids_tensor", prog.ids},
               {"logits_tensor", prog.logits},
               {"max_k", max_k},
               {"max_slots", in.max_context},
               {"vocab_size", hp.vocab_size},
               {"embed_vocab_limit", hp.ple_dim > 0 ? std::min(hp.vocab_size, hp.ple_vocab_size) : hp.vocab_size}};
    if (hybrid) {
        json parts = json::array();
        for (size_t g = 0; g < gpus.size(); ++g) {
            json w = json::array(); // the weights several GPUs read, then its own (one range if adjacent)
            if (wstart[1] > wstart[0]) w.push_back({wstart[0], wstart[1]});
            if (wstart[2 + g] > wstart[1 + g]) {
                if (!w.empty() && w.back()[1] == wstart[1 + g])
                    w.back()[1] = wstart[2 + g];
                else
                    w.push_back({wstart[1 + g], wstart[2 + g]});
            }
            parts.push_back({{"index", gpus[g]}, {"weights", w}, {"kv", {kstart[1 + g], kstart[2 + g]}}});
        }
        meta["program"]["layer_devices"] = in.layer_device;
        meta["program"]["gpus"]          = parts;
        meta["program"]["kv_host_begin"] = kstart[host_group];
    }
    const auto& g      = in.mc.generation;
    meta["generation"] = {{"eos_token_ids", g.eos_token_ids},
                          {"bos_token_id", g.bos_token_id},
                          {"pad_token_id", g.pad_token_id},
                          {"do_sample", g.do_sample},
                          {"temperature", g.temperature},
                          {"top_k", g.top_k},
                          {"top_p", g.top_p},
                          {"min_p", g.min_p},
                          {"repetition_penalty", g.repetition_penalty}};
    meta["provenance"] = in.provenance;
    meta["tokenizer"]  = in.tokenizer_meta;
    if (mode == Mode::Plan) meta.update(in.placement_meta);
    if (mode == Mode::Plan && (!in.tower_names.empty() || !in.encoders.empty())) {
        meta["towers"]            = in.towers_meta;
        meta["towers"]["weights"] = {wstart[towers_group], wstart[towers_group + 1]};
        if (meta["towers"].contains("vision"))
            meta["towers"]["vision"]["weights"] = {rep->vision_begin, rep->vision_end};
        if (meta["towers"].contains("audio"))
            meta["towers"]["audio"]["weights"] = {rep->audio_begin, rep->audio_end};
    }
    std::string meta_text = meta.dump(1);

    // Session memory beyond the arenas: CUDA workspaces (runtime/src/cuda/workspace.h, which the
    // runtime allocates from), CPU per-thread scratch.
    {
        rep->cuda_workspace =
            cuda_ws::workspace(ops.data(), n_text_ops, tensors.data(), opt.max_rows, in.max_context,
                               hp.vocab_size, true, nullptr, 0, schedule.data(), schedule.size())
                .device_bytes();
        for (size_t g = 0; g < gpus.size(); ++g) {
            auto& f     = rep->gpus[gpus[g]];
            f.workspace = cuda_ws::workspace(ops.data(), n_text_ops, tensors.data(), opt.max_rows,
                                             in.max_context, hp.vocab_size, g == 0, op_dev.data(), gpus[g],
                                             schedule.data(), schedule.size())
                              .device_bytes();
            f.weights = (wstart[1] - wstart[0]) + (wstart[2 + g] - wstart[1 + g]);
            f.kv      = kstart[2 + g] - kstart[1 + g];
        }
        rep->cuda_pinned =
            cuda_ws::pinned_bytes(opt.max_rows, opt.logits_rows, hp.vocab_size, in.max_context);
        rep->cpu_scratch_per_thread = (uint64_t)std::max<int64_t>(32 * max_k, in.max_context + 64) * 4;
    }
    rep->weights_bytes = weights_size;
    for (size_t t = 0; t < prog.tensors.size(); ++t)
        if (prog.tensors[t].kind == TensorKind::Weight && prog.tensors[t].role == WeightRole::PleTable)
            rep->ple_table_bytes += nbytes[t];
    rep->act_arena     = act_arena;
    rep->kv_arena      = kv_arena;
    rep->kv_dtype      = dtype_str(bo.kv_dtype);
    rep->sliding_slots = prog.sliding_slots;
    rep->n_ops         = ops.size();
    rep->n_tensors     = tensors.size();
    if ((opt.dry_run || in.size_only) && mode == Mode::Plan) {
        for (size_t t = 0; t < prog.tensors.size(); ++t) {
            const TensorDesc& d = prog.tensors[t];
            if (d.kind != TensorKind::Weight || d.role == WeightRole::Constant ||
                d.role == WeightRole::LoraBias)
                continue;
            auto& g = rep->groups[is_tower(d) ? tower_group_name(d.name) : gemma4::weight_role_name(d.role)];
            std::string hf = source_of(d);
            g.before += in.ckpt->has(hf) ? in.ckpt->get(hf).nbytes : 0;
            g.after += nbytes[t];
            g.tensors++;
        }
        return;
    }

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
        {plan::SectionKind::Ops, ops.data(), ops.size() * sizeof(plan::PlanOp)},
        {plan::SectionKind::Programs, program_table.data(),
         program_table.size() * sizeof(plan::PlanProgram)}};
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

    // Weights: one tensor at a time (read, merge, convert), so memory stays at about two tensors: tensor t
    // is written and added to the checksum (FNV-1a, ~1.4 ns a byte, serial) on a second thread while t + 1
    // is read and converted, into the other of two buffers.
    const uint64_t wbase = cursor;
    uint64_t wsum = plan::fnv1a64(nullptr, 0), wpos = 0;
    std::vector<uint8_t> bufs[2];
    int cur = 0;
    std::vector<float> f32;
    std::future<void> pending; // declared after the buffers: its destructor waits before they go
    std::map<std::string, std::vector<float>> biases; // weight name -> LoRA bias
    static const uint8_t zeros[plan::kWeightAlign] = {};
    double total_elems = 0, done_elems = 0; // progress, by elements (the PLE table is most of E2B)
    for (size_t t : worder)
        total_elems += (double)numel(prog.tensors[t].dims);
    for (size_t t : worder) {
        if (in.opt.progress) {
            // The fidelity stage: its reference plan's weights are its first half (the CPU twin of a CUDA
            // plan, when there is one, counts in the same half), the two logit runs the second.
            const double f = done_elems / std::max(total_elems, 1.0);
            if (mode == Mode::Plan)
                in.opt.progress("weights", f);
            else
                in.opt.progress("fidelity", mode == Mode::Reference ? 0.25 * f : 0.25 + 0.25 * f);
        }
        done_elems += (double)numel(prog.tensors[t].dims);
        std::vector<uint8_t>& buf = bufs[cur];
        const TensorDesc& d       = prog.tensors[t];
        const int64_t n           = numel(d.dims);
        std::string hf            = source_of(d);
        std::string an            = adapter_name_of(d);
        const st::TensorView* src = nullptr;
        bool raw_copy             = false;
        std::string group         = is_tower(d) ? tower_group_name(d.name) : gemma4::weight_role_name(d.role);
        if (d.role == WeightRole::Constant) {
            f32 = d.constant;
        } else if (d.role == WeightRole::LoraBias) {
            auto it = biases.find(in.mc.tensor_prefix + d.bias_of);
            f32     = it != biases.end() ? it->second : std::vector<float>(n, 0.0f);
        } else {
            src        = in.ckpt->has(hf) ? &in.ckpt->get(hf) : nullptr;
            bool bnb   = in.ckpt->has(hf + ".quant_state.bitsandbytes__nf4");
            bool merge = in.adapter && is_targeted(an);
            raw_copy   = !bnb && !merge && d.dtype == DType::BF16 && src->dtype == st::DType::BF16;
            // A NaN or infinity in a weight poisons every logit: refused, naming the tensor.
            const std::string bad =
                "tensor '" + hf + "' in " + src->file + " holds a NaN or infinity at element ";
            if (raw_copy) {
                if (int64_t i = first_non_finite_bf16(src->data, n); i >= 0)
                    throw CompileError(bad + std::to_string(i) +
                                       "; the checkpoint is corrupt (re-download or re-save it)");
            } else {
                read_base_f32(in, hf, d.dims, f32);
                if (int64_t i = first_non_finite(f32.data(), n); i >= 0)
                    throw CompileError(bad + std::to_string(i) +
                                       "; the checkpoint is corrupt (re-download or re-save it)");
                if (in.adapter) {
                    std::vector<float> bias(d.dims[0], 0.0f);
                    bool has_bias = false;
                    if (in.adapter->apply(an, d.dims, f32.data(), &bias, &has_bias)) {
                        rep->merged.push_back(an);
                        if (has_bias) biases[hf] = bias;
                        int64_t i = first_non_finite(f32.data(), n);
                        if (i < 0 && has_bias) i = first_non_finite(bias.data(), (int64_t)bias.size());
                        if (i >= 0)
                            throw CompileError("tensor '" + hf + "' holds a NaN or infinity at element " +
                                               std::to_string(i) + " after merging the adapter (" + an +
                                               "): the adapter's update overflows float32");
                    }
                }
            }
            auto& gr = rep->groups[group];
            gr.before += src->nbytes;
            gr.tensors++;
        }
        // Convert to the stored dtype (a bf16 tensor stored as it is in the checkpoint is written from the
        // mapped file: the PLE table is 4.7 GB at E2B).
        if (raw_copy) {
            buf.clear();
        } else if (d.dtype == DType::NF4) {
            buf = nf4::quantize(f32.data(), n, dq);
            if (tensors[t].quant_flags & plan::kQuantTiled32)
                buf = nf4::tile32(buf, d.dims[0], d.dims[1], dq);
        } else if (d.dtype == DType::F32) {
            buf.resize((size_t)n * 4);
            std::memcpy(buf.data(), f32.data(), buf.size());
        } else {
            buf.resize((size_t)n * 2);
            uint16_t* o = (uint16_t*)buf.data();
            for (int64_t i = 0; i < n; ++i)
                o[i] = f32_to_bf16(f32[i]);
        }
        const uint8_t* bytes = raw_copy ? src->data : buf.data();
        const uint64_t size  = raw_copy ? src->nbytes : buf.size();
        if (size != nbytes[t])
            throw CompileError("internal: size of " + d.name + " disagrees with the layout");
        if (d.role != WeightRole::Constant && d.role != WeightRole::LoraBias)
            rep->groups[group].after += size;
        rep->tensor_dtype[d.name] = dtype_str(d.dtype);
        if (pending.valid()) pending.get(); // tensor t - 1 written (its error, if any, thrown here)
        const uint64_t pad = off[t] > wpos ? off[t] - wpos : 0, at = wpos;
        pending = std::async(std::launch::async, [&out, &wsum, wbase, at, pad, bytes, size] {
            if (pad) { // alignment padding, part of the checksum
                wsum = plan::fnv1a64(zeros, pad, wsum);
                out.write_at(wbase + at, zeros, pad);
            }
            out.write_at(wbase + at + pad, bytes, size);
            wsum = plan::fnv1a64(bytes, size, wsum);
        });
        wpos    = at + pad + size;
        cur ^= 1;
    }
    if (pending.valid()) pending.get();
    // LoRA biases must precede nothing: the graph places them after their weight, so they were filled.
    table[nsec - 1]          = {(uint32_t)plan::SectionKind::Weights, 0, wbase, weights_size, wsum};
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
    h.reserved0            = plan::fnv1a64(table.data(), table.size() * sizeof(plan::PlanSection));
    h.header_checksum      = (uint32_t)plan::fnv1a64(&h, sizeof h);
    out.write_at(0, &h, sizeof h);
    out.write_at(sizeof h, table.data(), table.size() * sizeof(plan::PlanSection));
}

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
    log << "  memory plan (exact bytes; CUDA context and allocator overhead not included):\n";
    placement::print_memory(log, d.memory, "    ");
    if (d.placement.cuda_index >= 0)
        log << "    (the host also maps the plan file and reads its " << human(rep.weights_bytes)
            << " of weights once at load)\n";
}

// Logits of a fixed calibration prompt through the CPU runtime.
std::vector<float> calibration_logits(const std::string& plan, int vocab, int n_tokens) {
    g4_engine* e = nullptr;
    if (g4_engine_open(plan.c_str(), nullptr, &e) != G4_OK)
        throw CompileError(std::string("fidelity check: ") + g4_last_error_message());
    g4_session* s = nullptr;
    if (g4_session_create(e, nullptr, &s) != G4_OK) {
        g4_engine_close(e);
        throw CompileError(std::string("fidelity check: ") + g4_last_error_message());
    }
    std::vector<int32_t> ids(n_tokens);
    for (int i = 0; i < n_tokens; ++i)
        ids[i] =
            i == 0 ? 2 : 3 + (int32_t)((i * 7919ull + 13) % (uint64_t)std::max(1, std::min(vocab, 4096) - 3));
    std::vector<float> logits((size_t)n_tokens * vocab);
    g4_status st    = g4_session_append_tokens(s, ids.data(), ids.size(), logits.data(), logits.size());
    std::string err = g4_last_error_message();
    g4_session_destroy(s);
    g4_engine_close(e);
    if (st != G4_OK) throw CompileError("fidelity check: " + err);
    return logits;
}

} // namespace

// The vision encoder program (models/gemma4/vision_graph.h) on the CPU: GEMM matmuls in fp32 or bf16, the
// per-thread scratch of its kernels. The 0-d ClippableLinear bounds are the Clamp ops' parameters; they stay
// tensors of the program too (unread by its ops) for the GPU encoder, which reads them by name.
static EncoderProgram vision_program(const towers::VisionHParams& vh, int max_patches, bool bf16,
                                     CheckpointLookup& ck) {
    gemma4::VisionHParams h;
    h.hidden_size = vh.hidden_size, h.num_hidden_layers = vh.num_hidden_layers;
    h.num_attention_heads = vh.num_attention_heads, h.num_key_value_heads = vh.num_key_value_heads;
    h.head_dim = vh.head_dim, h.intermediate_size = vh.intermediate_size, h.patch_size = vh.patch_size;
    h.pooling_kernel_size = vh.pooling_kernel_size, h.position_embedding_size = vh.position_embedding_size;
    h.rms_norm_eps = vh.rms_norm_eps, h.rope_theta = vh.rope_theta,
    h.use_clipped_linears = vh.use_clipped_linears;
    h.text_hidden_size    = vh.text_hidden_size;
    gemma4::VisionBuildOptions o;
    o.max_patches   = max_patches;
    o.matmul_kernel = bf16 ? 2 : 1;
    o.scalar        = [&ck](const std::string& name) -> std::optional<float> {
        const towers::Tensor* t = ck(name);
        if (!t) return std::nullopt;
        return towers::tensor_at(*t, 0);
    };
    gemma4::VisionProgram v = gemma4::build_vision_program(h, o);
    std::set<std::string> held;
    for (const auto& t : v.graph.tensors)
        held.insert(t.name);
    for (const auto& n : towers::vision_weight_names(vh))
        if (!held.count(n)) {
            TensorDesc d;
            d.name = n;
            d.kind = TensorKind::Weight;
            d.dims = {1};
            d.role = WeightRole::TowerScalar;
            v.graph.tensors.push_back(std::move(d));
        }
    EncoderProgram e;
    e.name     = "vision";
    e.graph    = std::move(v.graph);
    e.inputs   = {v.pixels, v.positions, v.pool_index};
    e.outputs  = {v.output};
    e.max_rows = {v.max_patches, v.max_cells, 0, 0};
    const int64_t max_k =
        std::max({(int64_t)3 * vh.patch_size * vh.patch_size, (int64_t)vh.hidden_size,
                  (int64_t)vh.intermediate_size, (int64_t)vh.num_attention_heads * vh.head_dim});
    e.thread_floats = std::max({cpu::scratch_floats_per_thread(max_k, 0), cpu::gemm_scratch_floats(),
                                bf16 ? cpu::gemm_bf16_scratch_floats() : 0,
                                cpu::self_attention_thread_floats(max_patches)});
    return e;
}

void compile_plan(const CompileOptions& opt, std::ostream& log, CompileReport* report) {
    // Options are checked before any heavy work.
    if (opt.weights != "f32" && opt.weights != "bf16" && opt.weights != "nf4")
        throw CompileError("unknown --weights '" + opt.weights + "': expected nf4, bf16 or f32");
    int cuda_index = -1;
    if (opt.device == "cuda")
        cuda_index = 0;
    else if (opt.device.rfind("cuda:", 0) == 0) {
        const std::string n = opt.device.substr(5);
        if (n.empty() || n.size() > 3 || n.find_first_not_of("0123456789") != std::string::npos)
            throw CompileError("bad --device '" + opt.device + "': expected cuda or cuda:N");
        cuda_index = std::stoi(n);
    } else if (opt.device != "cpu") {
        throw CompileError("unknown --device '" + opt.device + "': expected cpu or cuda[:N]");
    }
    if (cuda_index < 0 && !opt.cuda_target.empty())
        throw CompileError("--target applies to --device cuda only");
    if (opt.prefill_precision != "bf16" && opt.prefill_precision != "fp32")
        throw CompileError("unknown --prefill-precision '" + opt.prefill_precision +
                           "': expected bf16 or fp32");
    if (opt.mlp_precision != "f16" && opt.mlp_precision != "f32")
        throw CompileError("unknown --mlp-precision '" + opt.mlp_precision + "': expected f16 or f32");
    const std::string& reps = opt.mlp_replicas;
    if (reps != "auto" && !(reps.size() == 1 && reps[0] >= '1' && reps[0] < '1' + plan::kMlpReplicasMax))
        throw CompileError("unknown --mlp-replicas '" + reps +
                           "': expected auto or a number of output replicas from 1 to " +
                           std::to_string(plan::kMlpReplicasMax));
    if (opt.ple_fold != "on" && opt.ple_fold != "off")
        throw CompileError("unknown --ple-fold '" + opt.ple_fold + "': expected on or off");
    if (opt.mlp_fold != "one-wave" && opt.mlp_fold != "all" && opt.mlp_fold != "off")
        throw CompileError("unknown --mlp-fold '" + opt.mlp_fold + "': expected one-wave, all or off");
    if (opt.kernel_trace != "off" && opt.kernel_trace != "launches" && opt.kernel_trace != "blocks")
        throw CompileError("unknown --kernel-trace '" + opt.kernel_trace +
                           "': expected off, launches or blocks");
    const char* cuda_only = reps != "auto"               ? "--mlp-replicas"
                            : opt.ple_fold != "on"       ? "--ple-fold"
                            : opt.mlp_fold != "one-wave" ? "--mlp-fold"
                            : opt.kernel_trace != "off"  ? "--kernel-trace"
                                                         : nullptr;
    if (cuda_index < 0 && cuda_only)
        throw CompileError(std::string(cuda_only) + " applies to --device cuda only");
    if (!opt.kv_dtype.empty() && opt.kv_dtype != "bf16" && opt.kv_dtype != "f32")
        throw CompileError("unknown --kv-dtype '" + opt.kv_dtype + "': expected bf16 or f32");
    if (opt.out_path.empty() && !opt.dry_run) throw CompileError("missing -o PLAN: the output plan path");
    if (!opt.dry_run) { // refused before any work: -o naming a device, FIFO or directory (output_file.h)
        std::string err;
        if (output_target(opt.out_path, &err).empty()) throw CompileError("-o " + err);
    }
    if (opt.max_rows < 1 || opt.max_rows > 8192) throw CompileError("--chunk must be in 1..8192");
    if (opt.logits_rows < 1 || opt.logits_rows > opt.max_rows)
        throw CompileError("--logits-rows must be in 1..chunk (" + std::to_string(opt.max_rows) + ")");
    const auto& targets = cuda::supported_targets();
    if (!opt.cuda_target.empty() &&
        std::find(targets.begin(), targets.end(), opt.cuda_target) == targets.end())
        throw CompileError("unsupported --target '" + opt.cuda_target +
                           "': expected sm_80, sm_86, sm_89 or sm_90");
    const placement::Request place_req = placement::parse_request(opt.gpu_mem, opt.cpu_mem, opt.place);

    Inputs in(opt, load_model_config(opt.model_dir));
    // KV cache: 16-bit on GPUs (as Hugging Face's bf16 run, llama.cpp and TensorRT-LLM); CPU plans stay the
    // fp32 reference.
    const std::string kv_dtype = !opt.kv_dtype.empty() ? opt.kv_dtype : cuda_index >= 0 ? "bf16" : "f32";
    in.kv_dtype                = kv_dtype == "bf16" ? DType::BF16 : DType::F32;
    // CUDA: pick the target (the GPU present unless --target); NVRTC runs once the plan is known to fit.
    int gpu_count = -1; // GPUs here, to check --gpu-mem against; -1: not queried (--target) or none
    if (cuda_index >= 0 && opt.dry_run && opt.cuda_target.empty()) {
        std::string why;
        int count = 0;
        if (const cu::Driver* d = cu::driver(&why); d && d->cuDeviceGetCount(&count) == 0 && count > 0)
            gpu_count = count;
    }
    if (cuda_index >= 0 && !opt.dry_run) {
        if (in.mc.text.head_dim > 512 || in.mc.text.head_dim_full > 512)
            throw CompileError("--device cuda supports head dims up to 512 (this model has " +
                               std::to_string(in.mc.text.head_dim_full) + ")");
        std::string target = opt.cuda_target;
        if (target.empty()) {
            std::string why;
            const cu::Driver* d = cu::driver(&why);
            int count           = 0;
            cu::CUdevice dev;
            int major = 0, minor = 0;
            if (!d || d->cuDeviceGetCount(&count) != 0 || count <= cuda_index ||
                d->cuDeviceGet(&dev, cuda_index) != 0)
                throw CompileError("--device " + opt.device + ": no such GPU here (" +
                                   (d ? std::to_string(count) + " CUDA device(s)" : why) +
                                   "); pass --target sm_80|sm_86|sm_89|sm_90 to compile for another machine");
            gpu_count = count;
            d->cuDeviceGetAttribute(&major, cu::kAttrComputeMajor, dev);
            d->cuDeviceGetAttribute(&minor, cu::kAttrComputeMinor, dev);
            target         = "sm_" + std::to_string(major * 10 + minor);
            const auto& ts = cuda::supported_targets();
            if (std::find(ts.begin(), ts.end(), target) == ts.end()) {
                // A newer GPU runs the PTX of the newest supported target.
                if (major * 10 + minor > 90)
                    target = "sm_90";
                else
                    throw CompileError("GPU " + std::to_string(cuda_index) + " is " + target +
                                       "; g4 supports sm_80, sm_86, sm_89 and sm_90");
            }
        }
        in.cuda_target = target;
    }
    in.cuda_index  = cuda_index; // --dry-run too: the memory plan depends on which GPU runs what
    const auto& hp = in.mc.text;
    if (cuda_index >= 0) {
        std::vector<int> hpg;
        for (int l = 0; l < hp.num_layers; ++l) {
            const int kvh = gemma4::layer_info(hp, l).num_kv_heads;
            hpg.push_back(kvh > 0 && hp.num_heads % kvh == 0 ? hp.num_heads / kvh : 0);
        }
        in.cuda_spec       = cuda::kernel_spec(hpg);
        in.cuda_spec.trace = opt.kernel_trace == "blocks" ? 2 : opt.kernel_trace == "launches" ? 1 : 0;
    }
    in.max_context = opt.max_context > 0 ? opt.max_context : std::min(4096, hp.max_position_embeddings);
    if (in.max_context > hp.max_position_embeddings)
        throw CompileError("--max-context " + std::to_string(in.max_context) +
                           " exceeds the model's limit (max_position_embeddings = " +
                           std::to_string(hp.max_position_embeddings) + ")");
    placement::Placement place = placement::resolve(place_req, hp.num_layers, cuda_index, gpu_count);
    in.layer_device            = place.layer_device;
    if (!opt.adapter_dir.empty()) in.adapter = lora::Adapter::open(opt.adapter_dir);

    // Tokenizer and chat template travel inside the plan, so a plan file is self-contained.
    std::string tok_path =
        !opt.tokenizer_path.empty() ? opt.tokenizer_path : opt.model_dir + "/tokenizer.json";
    if (!opt.tokenizer_path.empty() && !fs::exists(tok_path))
        throw CompileError("--tokenizer " + tok_path + ": file not found");
    if (fs::exists(tok_path)) {
        in.tokenizer_json = read_text_file(tok_path);
        Tokenizer tk;
        std::string err;
        if (!Tokenizer::load_from_json(in.tokenizer_json, &tk, &err))
            throw CompileError(tok_path + ": " + err);
        if (tk.vocab_size() > in.mc.text.vocab_size + 1)
            throw CompileError(tok_path + " has " + std::to_string(tk.vocab_size()) +
                               " tokens but the model's vocabulary is " +
                               std::to_string(in.mc.text.vocab_size) +
                               "; is it the tokenizer of this model?");
        std::string dir = fs::path(tok_path).parent_path().string();
        bool add_bos    = true;
        if (fs::exists(dir + "/tokenizer_config.json")) {
            try {
                const std::string tc_text = read_text_file(dir + "/tokenizer_config.json");
                if (std::string e = json_depth_error(tc_text); !e.empty())
                    throw CompileError(dir + "/tokenizer_config.json: " + e);
                json tc = json::parse(tc_text);
                if (tc.contains("add_bos_token") && tc["add_bos_token"].is_boolean())
                    add_bos = tc["add_bos_token"].get<bool>();
            } catch (const json::exception& e) {
                throw CompileError(dir + "/tokenizer_config.json: corrupt JSON (" + std::string(e.what()) +
                                   ")");
            }
        }
        in.tokenizer_meta = {
            {"present", true},
            {"vocab_size", tk.vocab_size()},
            {"add_bos_token", add_bos},
            {"chat_template", fs::exists(dir + "/chat_template.jinja") ? "gemma4" : "gemma4-default"},
            {"sha256", sha256_file(tok_path)}};
    }
    in.ckpt = std::make_unique<st::Checkpoint>(st::Checkpoint::open(opt.model_dir));
    if (in.adapter && in.mc.tensor_prefix == "model.")
        in.adapter->set_name_alias("model.language_model.", "model.");
    // Adapter shapes vs the base, before any heavy work; the first mismatch in sorted module order.
    if (in.adapter) {
        for (const auto& m : in.adapter->merges()) {
            std::string name = m.module + ".weight";
            if (!in.ckpt->has(name) && in.mc.tensor_prefix == "model." &&
                name.rfind("model.language_model.", 0) == 0)
                name = "model." + name.substr(21);
            if (!in.ckpt->has(name) || in.ckpt->has(name + ".quant_state.bitsandbytes__nf4")) continue;
            const auto& shape = in.ckpt->get(name).shape;
            if (shape.size() != 2 || shape[0] != m.out || shape[1] != m.in)
                throw CompileError("adapter " + opt.adapter_dir + " does not fit this model: module " +
                                   m.module + " has lora_B [" + std::to_string(m.out) + ", " +
                                   std::to_string(m.r) + "] / lora_A [" + std::to_string(m.r) + ", " +
                                   std::to_string(m.in) + "] but the base weight is " + shape_str(shape) +
                                   " (is it an adapter for another model?)");
        }
    }

    // Towers: config and every weight's shape checked now, before any heavy work. They run on the CPU; in a
    // CUDA plan either may run on the plan's GPU instead (decided with the memory plan below).
    uint64_t vision_gpu_bytes = 0, audio_gpu_bytes = 0; // their device buffers there
    std::string vision_gpu_no, audio_gpu_no;            // why one cannot run there ("" = it can)
    // The towers' host buffers with the vision / audio tower on the GPU (media_create's sizing).
    rt::MediaSizing z_cpu;
    size_t vision_host_bytes = 0, audio_host_bytes = 0, vision_thread_floats = 0, audio_thread_floats = 0,
           audio_feature_floats = 0, preprocess_floats = 0;
    auto sizing = [&](bool vision_gpu, bool audio_gpu) {
        rt::MediaSizing z = z_cpu;
        if (vision_gpu) z.vision_scratch = vision_host_bytes;
        if (audio_gpu) z.audio_scratch = audio_host_bytes;
        z.thread_floats = std::max({vision_gpu ? 0 : vision_thread_floats, preprocess_floats,
                                    audio_gpu ? audio_feature_floats : audio_thread_floats});
        return z;
    };
    // META's per-thread scratch and session figures of the towers' host buffers, sized as z.
    auto record_sizing = [&in](const rt::MediaSizing& z) {
        in.towers_meta["thread_scratch_floats"] = z.thread_floats;
        in.tower_session_bytes          = rt::media_block(z).total(); // with this machine's thread count
        rt::MediaSizing fixed           = z;
        fixed.threads                   = 0;
        in.towers_meta["session_bytes"] = rt::media_block(fixed).total(); // less the per-thread scratch
    };
    {
        const std::string cfg = opt.model_dir + "/config.json";
        const int threads     = cpu::default_thread_count();
        rt::MediaSizing z; // the towers' session buffers, as media_create allocates them
        z.hidden   = hp.hidden_size;
        z.max_rows = opt.max_rows;
        z.threads  = threads;
        CheckpointLookup ck{*in.ckpt, {}, {}};
        towers::Lookup lookup  = [&ck](const std::string& n) { return ck(n); };
        const int H            = hp.hidden_size;
        towers::Precision prec = towers::Precision::F32;
        if (std::string e =
                towers::parse_precision(opt.tower_precision.empty() ? "fp32" : opt.tower_precision, &prec);
            !e.empty())
            throw CompileError("--tower-precision: " + e);
        auto need_ids = [&](const char* tower, const char* what,
                            std::initializer_list<std::pair<const char*, int>> ids) {
            for (const auto& [k, v] : ids)
                if (v < 0)
                    throw CompileError(cfg + ": " + k + " is missing; it is needed to place " + what +
                                       " in a prompt (--no-" + tower + " leaves the tower out)");
        };
        if (in.mc.has_vision && opt.vision) {
            towers::VisionHParams vh;
            std::string e = towers::parse_vision_hparams(in.mc.vision_config_json, H, &vh);
            if (!e.empty())
                throw CompileError(cfg + ": vision_config: " + e + " (--no-vision leaves the tower out)");
            if (opt.image_tokens != 70 && opt.image_tokens != 140 && opt.image_tokens != 280 &&
                opt.image_tokens != 560 && opt.image_tokens != 1120)
                throw CompileError("--image-tokens " + std::to_string(opt.image_tokens) +
                                   ": expected 70, 140, 280, 560 or 1120 (Gemma 4's image token budgets)");
            if (opt.max_image_pixels < 1) throw CompileError("--max-image-pixels must be positive");
            need_ids("vision", "images",
                     {{"image_token_id", in.mc.image_token_id},
                      {"boi_token_id", in.mc.boi_token_id},
                      {"eoi_token_id", in.mc.eoi_token_id}});
            const int k = vh.pooling_kernel_size, patch = vh.patch_size,
                      max_patches = opt.image_tokens * k * k;
            vh.precision          = prec;
            towers::VisionTower vt;
            e = vt.init(vh, lookup, max_patches);
            if (!e.empty())
                throw CompileError("vision tower of " + opt.model_dir + ": " + e +
                                   " (--no-vision leaves the tower out)");
            // The GPU tower: bf16 tensor-core matmuls and the flash kernel (head dims 16..512, powers of
            // two).
            const int hd = vh.head_dim;
            if (in.cuda_index < 0)
                vision_gpu_no = "a CPU plan";
            else if (opt.weights == "f32")
                vision_gpu_no =
                    "the GPU vision tower needs bf16 weights, and --weights f32 stores the towers' as f32";
            else if (opt.tower_precision == "fp32")
                vision_gpu_no = "--tower-precision fp32 was given, and the GPU vision tower's matmuls are "
                                "bf16 with fp32 accumulation";
            else if (hd < 16 || hd > 512 || (hd & (hd - 1)))
                vision_gpu_no = "its head_dim " + std::to_string(hd) +
                                " has no GPU attention kernel (16..512, powers of two)";
            vision_gpu_bytes     = vt.gpu_layout().total;
            vision_host_bytes    = vt.gpu_host_scratch_bytes();
            vision_thread_floats = vt.thread_scratch_floats();
            z.vision             = true;
            z.vision_scratch = vt.gpu_host_scratch_bytes(); // the CPU runs the vision program (its own arena)
            z.resize_scratch =
                towers::preprocess_reserve_bytes(opt.max_image_pixels, opt.image_tokens, patch, k);
            z.patch_floats    = (int64_t)max_patches * 3 * patch * patch;
            z.max_patches     = max_patches;
            preprocess_floats = towers::preprocess_thread_floats(opt.image_tokens, patch, k);
            z.thread_floats   = std::max({z.thread_floats, vt.thread_scratch_floats(), preprocess_floats});
            z.max_soft        = std::max(z.max_soft, opt.image_tokens);
            in.encoders.push_back(vision_program(vh, max_patches, prec == towers::Precision::BF16, ck));
            in.towers_meta["vision"] = {{"config", json::parse(in.mc.vision_config_json)},
                                        {"program", "vision"},
                                        {"patch_size", patch},
                                        {"pooling_kernel_size", k},
                                        {"position_size", vh.position_embedding_size},
                                        {"pixel_mean", 0.5},
                                        {"pixel_std", 0.5},
                                        {"image_tokens", opt.image_tokens},
                                        {"max_patches", max_patches},
                                        {"max_image_pixels", opt.max_image_pixels},
                                        {"image_token_id", in.mc.image_token_id},
                                        {"boi_token_id", in.mc.boi_token_id},
                                        {"eoi_token_id", in.mc.eoi_token_id},
                                        {"video_token_id", in.mc.video_token_id}};
        }
        if (in.mc.has_audio && opt.audio) {
            towers::AudioHParams ah;
            std::string e = towers::parse_audio_hparams(in.mc.audio_config_json, H, &ah);
            if (!e.empty())
                throw CompileError(cfg + ": audio_config: " + e + " (--no-audio leaves the tower out)");
            if (!(opt.max_audio_seconds > 0 && opt.max_audio_seconds <= 3600))
                throw CompileError("--max-audio-seconds must be in (0, 3600]");
            need_ids("audio", "audio",
                     {{"audio_token_id", in.mc.audio_token_id},
                      {"boa_token_id", in.mc.boa_token_id},
                      {"eoa_token_id", in.mc.eoa_token_id}});
            const int64_t max_samples = (int64_t)std::llround(opt.max_audio_seconds * ah.sample_rate);
            ah.precision              = prec;
            towers::AudioTower at;
            e = at.init(ah, lookup, max_samples);
            if (!e.empty())
                throw CompileError("audio tower of " + opt.model_dir + ": " + e +
                                   " (--no-audio leaves the tower out)");
            // The GPU tower: bf16 tensor-core matmuls; the SSCP conv kernel stages a 3x3 patch and a
            // position's outputs in shared memory, the attention kernel the logits of a query's W keys (48
            // KiB at most without opting in).
            const int c0 = ah.subsampling_conv_channels[0], c1 = ah.subsampling_conv_channels[1];
            const size_t conv_smem = 4 * std::max<size_t>(9 + c0, 9 * (size_t)c0 + c1),
                         attn_smem = 4 * (size_t)(ah.attention_context_left - 1);
            if (in.cuda_index < 0)
                audio_gpu_no = "a CPU plan";
            else if (opt.weights == "f32")
                audio_gpu_no =
                    "the GPU audio tower needs bf16 weights, and --weights f32 stores the towers' as f32";
            else if (opt.tower_precision == "fp32")
                audio_gpu_no = "--tower-precision fp32 was given, and the GPU audio tower's matmuls are bf16 "
                               "with fp32 accumulation";
            else if (conv_smem > 48 * 1024 || attn_smem > 48 * 1024)
                audio_gpu_no = "its subsampling_conv_channels / attention_context_left need more shared "
                               "memory than the GPU kernels take (48 KiB)";
            audio_gpu_bytes      = at.gpu_layout().total;
            audio_host_bytes     = at.gpu_host_scratch_bytes();
            audio_feature_floats = at.gpu_thread_scratch_floats();
            z.audio              = true;
            z.audio_scratch      = at.scratch_bytes();
            z.thread_floats      = std::max<size_t>(z.thread_floats, at.thread_scratch_floats());
            audio_thread_floats  = at.thread_scratch_floats();
            z.max_soft           = std::max(z.max_soft, towers::audio_soft_tokens(ah, max_samples));
            for (auto& n : towers::audio_weight_names(ah))
                in.tower_names.push_back(n);
            in.towers_meta["audio"] = {{"config", json::parse(in.mc.audio_config_json)},
                                       {"max_samples", max_samples},
                                       {"sample_rate", ah.sample_rate},
                                       {"audio_token_id", in.mc.audio_token_id},
                                       {"boa_token_id", in.mc.boa_token_id},
                                       {"eoa_token_id", in.mc.eoa_token_id}};
        }
        if (!in.tower_names.empty() || !in.encoders.empty()) {
            int64_t queue =
                opt.max_media_tokens > 0 ? opt.max_media_tokens : std::max<int64_t>(2048, z.max_soft);
            queue = std::min<int64_t>(queue, in.max_context);
            if (opt.max_media_tokens > in.max_context)
                throw CompileError("--max-media-tokens " + std::to_string(opt.max_media_tokens) +
                                   " exceeds --max-context " + std::to_string(in.max_context));
            in.towers_meta["max_media_tokens"] = queue;
            in.towers_meta["precision"]        = towers::precision_name(prec);
            z.queue_rows                       = (int32_t)queue;
            record_sizing(z);
            z_cpu = z;
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
                    throw CompileError(item + ": the plan has no " + c + " tower (" + place.tower_where[c] +
                                       ")");
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

    // The exact memory plan (no weight read yet), the placement it fits, the budget check.
    in.size_only = true;
    Report rep;
    write_plan(in, nullptr, Mode::Plan, &rep);
    auto figures_of = [&](const Report& r) {
        placement::Figures f;
        f.weights             = r.weights_bytes;
        f.ple_table           = r.ple_table_bytes;
        f.activations         = r.act_arena;
        f.kv_cache            = r.kv_arena;
        f.attention_workspace = r.cuda_workspace;
        f.scratch_per_thread  = r.cpu_scratch_per_thread;
        f.pinned              = r.cuda_pinned;
        f.kv_dtype            = r.kv_dtype;
        f.host_weights        = r.host_weights;
        f.host_kv             = r.host_kv;
        f.gpus                = r.gpus;
        f.tower_weights       = r.tower_weights;
        f.tower_buffers       = in.tower_session_bytes;
        f.vision_weights      = r.vision_end - r.vision_begin;
        f.vision_gpu_buffers  = vision_gpu_bytes;
        f.audio_weights       = r.audio_end - r.audio_begin;
        f.audio_gpu_buffers   = audio_gpu_bytes;
        if (!in.tower_names.empty() || !in.encoders.empty()) {
            f.tower_buffers_vision_gpu = rt::media_block(sizing(true, false)).total();
            f.tower_buffers_audio_gpu  = rt::media_block(sizing(false, true)).total();
            f.tower_buffers_both_gpu   = rt::media_block(sizing(true, true)).total();
        }
        if (place.has_cpu_layers()) {
            f.host_activations        = r.act_arena;
            f.host_scratch_per_thread = r.cpu_scratch_per_thread;
        }
        return f;
    };
    // The figures of a size-only plan at another --max-context or layer split.
    auto figures_with = [&](int max_context, const std::vector<int>& layer_device) {
        const int keep_context = in.max_context;
        const auto keep_layers = in.layer_device;
        in.max_context         = max_context;
        in.layer_device        = layer_device;
        Report r;
        write_plan(in, nullptr, Mode::Plan, &r);
        in.max_context  = keep_context;
        in.layer_device = keep_layers;
        return figures_of(r);
    };
    auto figures_at   = [&](int max_context) { return figures_with(max_context, in.layer_device); };
    const int threads = cuda_index < 0 || place.has_cpu_layers() ? cpu::default_thread_count() : 0;
    std::optional<placement::Decision> decided;
    try {
        decided = placement::decide(place, figures_of(rep), in.max_context, figures_at, threads);
    } catch (const CompileError& refused) {
        // Budgets for several GPUs and no layers= in --place: split the layers over them.
        std::optional<placement::Placement> split;
        const bool may_split = !placement::layers_placed(place_req) && place.gpu_budgets.size() > 1;
        if (may_split)
            split = placement::split_layers(
                place,
                [&](const std::vector<int>& layer_device) {
                    return figures_with(in.max_context, layer_device);
                },
                threads);
        if (!split && may_split)
            throw CompileError(
                std::string(refused.what()) +
                "; splitting the text layers across the GPUs with a --gpu-mem budget does not fit either");
        if (!split) throw;
        place           = *split;
        in.layer_device = place.layer_device;
        rep             = Report();
        write_plan(in, nullptr, Mode::Plan, &rep);
        decided = placement::decide(place, figures_of(rep), in.max_context, figures_at, threads);
    }
    { // META and the report: where each tower runs, its buffers
        placement::Placement& pl = decided->placement;
        const std::string dev    = "cuda:" + std::to_string(in.cuda_index);
        for (const char* c : {"vision", "audio"}) {
            const bool gpu         = std::string(c) == "vision" ? pl.vision_gpu : pl.audio_gpu;
            const std::string& why = std::string(c) == "vision" ? pl.vision_why : pl.audio_why;
            if (gpu) {
                in.towers_meta[c]["device"] = dev;
                in.towers_meta[c]["gpu_bytes"] =
                    std::string(c) == "vision" ? vision_gpu_bytes : audio_gpu_bytes;
                pl.tower_where[c] = dev;
            } else if (!why.empty() && pl.tower_where[c] == "cpu") {
                pl.tower_where[c] = "cpu (" + why + ")";
            }
        }
        if (pl.vision_gpu || pl.audio_gpu) record_sizing(sizing(pl.vision_gpu, pl.audio_gpu));
    }
    const placement::Decision& mem = *decided;
    in.placement_meta              = mem.meta();
    in.size_only                   = false;
    if (opt.dry_run) {
        log << "g4 compile --dry-run: " << opt.model_dir << " (" << in.mc.model_type << ", " << hp.num_layers
            << " layers, " << hp.num_kv_shared_layers << " KV-shared), policy: weights " << opt.weights
            << "; KV cache " << kv_dtype << "; nothing written\n";
        print_groups(log, rep);
        print_memory_plan(log, mem, rep);
        log << "  KV cache: " << kv_dtype << ", max_context " << in.max_context << ", sliding ring "
            << rep.sliding_slots << " slots, KV-shared layers own none"
            << (place.hybrid() ? " (except mirrors of caches whose donor runs on another device)" : "")
            << "\n";
        return;
    }
    if (in.cuda_index >= 0) {
        cuda::KernelBinary kb = cuda::compile_kernels(in.cuda_target, in.cuda_spec);
        in.cubin              = std::move(kb.cubin);
        in.ptx                = std::move(kb.ptx);
        in.kernels_cached     = kb.cached;
    }

    // Provenance: digests of every input file.
    json base_files = json::array();
    for (const auto& f : in.ckpt->files())
        base_files.push_back({{"file", fs::path(f).filename().string()}, {"sha256", sha256_file(f)}});
    base_files.push_back({{"file", "config.json"}, {"sha256", sha256_file(opt.model_dir + "/config.json")}});
    in.provenance["base"] = {{"dir", fs::path(opt.model_dir).filename().string()}, {"files", base_files}};
    if (in.adapter) {
        json af = json::array();
        for (const char* f : {"adapter_config.json", "adapter_model.safetensors"})
            af.push_back({{"file", f}, {"sha256", sha256_file(opt.adapter_dir + "/" + f)}});
        json merges = json::array();
        for (const auto& m : in.adapter->merges())
            merges.push_back(
                {{"module", m.module}, {"r", m.r}, {"alpha", m.alpha}, {"scale", m.scale}, {"dora", m.dora}});
        in.provenance["adapter"] = {
            {"dir", fs::path(opt.adapter_dir).filename().string()}, {"files", af}, {"merges", merges}};
    }
    in.provenance["g4_version"] = G4_VERSION_STRING;

    // The plan goes to a temporary file beside -o and replaces it only once every check below has passed:
    // a failing compile leaves the previous plan at -o as it was.
    rep = Report();
    PlanFile out(opt.out_path);
    write_plan(in, &out, Mode::Plan, &rep);
    if (opt.progress) opt.progress("weights", 1.0);

    // Adapter modules that matched nothing in the compiled model.
    std::vector<std::string> dropped_shared, dropped_tower;
    if (in.adapter) {
        for (const auto& m : in.adapter->unconsumed()) {
            std::string rel = m;
            for (const char* pre : {"model.language_model.", "model."})
                if (rel.rfind(pre, 0) == 0) {
                    rel = rel.substr(std::strlen(pre));
                    break;
                }
            int layer = -1;
            if (std::sscanf(rel.c_str(), "layers.%d.", &layer) == 1 &&
                layer >= gemma4::first_kv_shared_layer(hp) && hp.num_kv_shared_layers > 0 &&
                (rel.find("self_attn.k_proj") != std::string::npos ||
                 rel.find("self_attn.v_proj") != std::string::npos ||
                 rel.find("self_attn.k_norm") != std::string::npos)) {
                dropped_shared.push_back(m);
            } else if ((m.find("vision_tower") != std::string::npos ||
                        m.find("embed_vision") != std::string::npos) &&
                       (!in.mc.has_vision || !opt.vision)) {
                dropped_tower.push_back(m);
            } else if ((m.find("audio_tower") != std::string::npos ||
                        m.find("embed_audio") != std::string::npos) &&
                       (!in.mc.has_audio || !opt.audio)) {
                dropped_tower.push_back(m);
            } else {
                throw CompileError("adapter " + opt.adapter_dir + " targets '" + m +
                                   "', which is not in this model; is the adapter for another model?");
            }
        }
    }

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
        const bool has_v = in.towers_meta.contains("vision"), has_a = in.towers_meta.contains("audio");
        const bool vgpu = has_v && in.towers_meta["vision"].contains("device");
        const bool agpu = has_a && in.towers_meta["audio"].contains("device");
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
                << "- " << human(rep.tower_weights - gpu_w) << " of weights, "
                << human(in.tower_session_bytes) << " of session buffers\n";
        else
            log << "  towers' host buffers (inputs, features, queued soft tokens): "
                << human(in.tower_session_bytes) << "\n";
    }

    // Fidelity: logits of the plan vs the full-precision (fp32-merged, unquantized) model.
    bool lossy = in.adapter || opt.weights == "nf4" || !opt.quantize_regex.empty();
    if (opt.fidelity && lossy) {
        // The reference plan and the CPU twin are temporary files beside the plan, never committed.
        PlanFile ref(opt.out_path);
        Report ref_rep;
        write_plan(in, &ref, Mode::Reference, &ref_rep);
        const int n_tok      = std::min(32, in.max_context);
        std::string measured = out.f.temp_path();
        std::optional<PlanFile> twin;
        if (in.cuda_index >= 0) { // measured on the CPU path: a CPU twin with the same weights
            Report twin_rep;
            twin.emplace(opt.out_path);
            write_plan(in, &*twin, Mode::CpuTwin, &twin_rep);
            measured = twin->f.temp_path();
        }
        if (opt.progress) opt.progress("fidelity", 0.5);
        auto a = calibration_logits(measured, hp.vocab_size, n_tok);
        if (opt.progress) opt.progress("fidelity", 0.75);
        auto b = calibration_logits(ref.f.temp_path(), hp.vocab_size, n_tok);
        if (opt.progress) opt.progress("fidelity", 1.0);
        double num = 0, den = 0;
        int agree = 0;
        for (int r = 0; r < n_tok; ++r) {
            const float* x = a.data() + (size_t)r * hp.vocab_size;
            const float* y = b.data() + (size_t)r * hp.vocab_size;
            agree += std::max_element(x, x + hp.vocab_size) - x == std::max_element(y, y + hp.vocab_size) - y;
            for (int i = 0; i < hp.vocab_size; ++i)
                num += ((double)x[i] - y[i]) * ((double)x[i] - y[i]), den += (double)y[i] * y[i];
        }
        const double rel = std::sqrt(num / std::max(den, 1e-300));
        if (!std::isfinite(rel)) { // never reported as a figure: the plan just written is unusable
            std::remove(opt.out_path.c_str());
            throw CompileError(
                "fidelity check: the " +
                std::string(std::isfinite(den) ? "plan's" : "full-precision model's") +
                " logits on the calibration prompt are not finite (NaN or infinity): the weights overflow "
                "float32; " +
                opt.out_path + " was not kept");
        }
        char line[256];
        std::snprintf(line, sizeof line,
                      "  fidelity: relative L2 logit error %.3e, top-1 agreement %d/%d, vs the "
                      "full-precision merged model "
                      "(%d-token calibration prompt, CPU)\n",
                      rel, agree, n_tok, n_tok);
        log << line
            << "    (the distance ||plan - reference|| / ||reference|| of the two models' logits, 0 = "
               "identical;"
               " top-1:\n"
               "    positions where both pick the same next token. A low error and near-full agreement mean "
               "the\n"
               "    quantization kept the model's choices; an error near 1 means the logits changed about as "
               "much\n"
               "    as their size: expected for random-weight test checkpoints, on a trained model try "
               "--weights bf16\n"
               "    or --keep REGEX for the sensitive weights)\n";
        if (report) {
            report->fidelity_measured   = true;
            report->fidelity_rel_l2     = rel;
            report->fidelity_top1_agree = agree;
            report->fidelity_tokens     = n_tok;
        }
    }
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
