// The weights stage of `g4 compile` (compiler/stages.h): the storage policy (--weights, --quantize, --keep),
// every weight resolved against the checkpoint and validated, and, when the plan is written, the weights
// streamed one tensor at a time: read (bf16/f16/f32, or a bitsandbytes NF4 base dequantized to fp32) ->
// merge the LoRA adapter in fp32 -> store as the policy says: NF4 quantized straight from the fp32 result
// (no bf16 rounding in between), bf16, or f32.
#include "compiler/nf4_quant.h"
#include "compiler/stages.h"
#include "kernels/nf4.h"
#include "models/gemma4/names.h"

#include <cmath>
#include <cstring>
#include <future>
#include <regex>

namespace g4::stage {

using gemma4::TensorDesc;
using gemma4::WeightRole;
using plan::TensorKind;

namespace {

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

} // namespace

static_assert((int)WeightRole::Tower == plan::kRoleTower &&
              (int)WeightRole::TowerScalar == plan::kRoleTowerScalar);
bool is_tower(const TensorDesc& d) {
    return d.role == WeightRole::Tower || d.role == WeightRole::TowerScalar;
}
std::string tower_group_name(const std::string& name) {
    return gemma4::tower_of(name);
}

std::string source_of(const Inputs& in, const TensorDesc& d) {
    return gemma4::checkpoint_tensor(in.mc.tensor_prefix, d.name, is_tower(d));
}

std::string adapter_name_of(const Inputs& in, const TensorDesc& d) {
    return gemma4::adapter_tensor(in.mc.tensor_prefix, d.name, is_tower(d));
}

bool is_targeted(const Inputs& in, const BuiltPlan& b, const std::string& hf) {
    if (b.targeted.count(hf)) return true;
    const std::string alt = gemma4::multimodal_spelling(in.mc.tensor_prefix, hf);
    return !alt.empty() && b.targeted.count(alt) > 0;
}

// Resolves and validates every weight; chooses its stored dtype.
void choose_storage(const Inputs& in, BuiltPlan& b, Report* rep) {
    const CompileOptions& opt = in.opt;
    const Mode mode           = b.mode;
    auto& prog                = b.prog;
    const DType rest_dt       = opt.weights == "f32" ? DType::F32 : DType::BF16;
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
            d.dtype                = rest_dt;
            used[source_of(in, d)] = true;
            continue;
        }
        std::string hf = source_of(in, d);
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
    if (in.adapter) {
        for (const auto& m : in.adapter->merges())
            b.targeted[m.module + ".weight"] = true;
        for (const auto& r : in.adapter->replacements())
            b.targeted[r] = true;
    }
    if (mode == Mode::Reference)
        for (auto& d : prog.tensors)
            if (d.kind == TensorKind::Weight && is_targeted(in, b, adapter_name_of(in, d)))
                d.dtype = DType::F32;

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
}

void size_groups(const Inputs& in, const BuiltPlan& b, Report* rep) {
    auto& prog   = b.prog;
    auto& nbytes = b.nbytes;
    for (size_t t = 0; t < prog.tensors.size(); ++t) {
        const TensorDesc& d = prog.tensors[t];
        if (d.kind != TensorKind::Weight || d.role == WeightRole::Constant || d.role == WeightRole::LoraBias)
            continue;
        auto& g = rep->groups[is_tower(d) ? tower_group_name(d.name) : gemma4::weight_role_name(d.role)];
        std::string hf = source_of(in, d);
        g.before += in.ckpt->has(hf) ? in.ckpt->get(hf).nbytes : 0;
        g.after += nbytes[t];
        g.tensors++;
    }
    return;
}

uint64_t stream_weights(const Inputs& in, const BuiltPlan& b, PlanFile& out, uint64_t wbase, Report* rep) {
    const CompileOptions& opt = in.opt;
    const Mode mode           = b.mode;
    auto& prog                = b.prog;
    auto& off                 = b.off;
    auto& nbytes              = b.nbytes;
    auto& worder              = b.worder;
    auto& tensors             = b.tensors;
    const bool dq             = opt.double_quant;
    // Weights: one tensor at a time (read, merge, convert), so memory stays at about two tensors: tensor t
    // is written and added to the checksum (FNV-1a, ~1.4 ns a byte, serial) on a second thread while t + 1
    // is read and converted, into the other of two buffers.
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
        std::string hf            = source_of(in, d);
        std::string an            = adapter_name_of(in, d);
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
            bool merge = in.adapter && is_targeted(in, b, an);
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
    return wsum;
}

} // namespace g4::stage
