// The inputs stage of `g4 compile` (compiler/stages.h): the options checked, the device and context
// resolved, the tokenizer, checkpoint and adapter opened and checked, provenance and CUDA kernels.
#include "compiler/cuda_compile.h"
#include "compiler/sha256.h"
#include "compiler/stages.h"
#include "models/gemma4/chat.h"
#include "models/gemma4/names.h"
#include "runtime/src/cuda/driver.h"
#include "runtime/src/json_limits.h"
#include "runtime/src/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace g4::stage {

namespace fs = std::filesystem;

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

PlanFile::PlanFile(const std::string& path) {
    std::string err;
    if (!f.open(path, &err)) throw CompileError(err);
}
void PlanFile::write_at(uint64_t off, const void* data, size_t n) {
    std::string err;
    if (!f.write_at(off, data, n, &err)) throw CompileError(err);
}
void PlanFile::commit() {
    std::string err;
    if (!f.commit(&err)) throw CompileError(err);
}

// Options are checked before any heavy work.
CheckedOptions check_options(const CompileOptions& opt) {
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
    if (opt.cpu_precision != "fast" && opt.cpu_precision != "bf16" && opt.cpu_precision != "f32")
        throw CompileError("unknown --cpu-precision '" + opt.cpu_precision + "': expected fast, bf16 or f32");
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
    if (opt.sessions < 1 || opt.sessions > 256)
        throw CompileError("--max-sessions must be in 1..256 (got " + std::to_string(opt.sessions) + ")");
    if (opt.logits_rows < 1 || opt.logits_rows > opt.max_rows)
        throw CompileError("--logits-rows must be in 1..chunk (" + std::to_string(opt.max_rows) + ")");
    const auto& targets = cuda::supported_targets();
    if (!opt.cuda_target.empty() &&
        std::find(targets.begin(), targets.end(), opt.cuda_target) == targets.end())
        throw CompileError("unsupported --target '" + opt.cuda_target +
                           "': expected sm_80, sm_86, sm_89 or sm_90");
    return {cuda_index, placement::parse_request(opt.gpu_mem, opt.cpu_mem, opt.place)};
}

int resolve_device(Inputs& in, int cuda_index) {
    const CompileOptions& opt = in.opt;
    // KV cache: 16-bit on GPUs (as Hugging Face's bf16 run, llama.cpp and TensorRT-LLM); CPU plans stay the
    // fp32 reference.
    in.kv_dtype_name = !opt.kv_dtype.empty() ? opt.kv_dtype : cuda_index >= 0 ? "bf16" : "f32";
    in.kv_dtype      = in.kv_dtype_name == "bf16" ? DType::BF16 : DType::F32;
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
    return gpu_count;
}

void resolve_context(Inputs& in) {
    const CompileOptions& opt = in.opt;
    const auto& hp            = in.mc.text;
    in.max_context = opt.max_context > 0 ? opt.max_context : std::min(4096, hp.max_position_embeddings);
    if (in.max_context > hp.max_position_embeddings)
        throw CompileError("--max-context " + std::to_string(in.max_context) +
                           " exceeds the model's limit (max_position_embeddings = " +
                           std::to_string(hp.max_position_embeddings) + ")");
}

// Tokenizer and chat template travel inside the plan, so a plan file is self-contained.
void load_tokenizer(Inputs& in) {
    const CompileOptions& opt = in.opt;
    in.meta.chat              = gemma4::chat_template().to_json();
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
        in.meta.tokenizer = {true, (int32_t)tk.vocab_size(), add_bos,
                             fs::exists(dir + "/chat_template.jinja") ? "gemma4" : "gemma4-default",
                             sha256_file(tok_path)};
    }
}

void open_checkpoint(Inputs& in) {
    const CompileOptions& opt = in.opt;
    in.ckpt                   = std::make_unique<st::Checkpoint>(st::Checkpoint::open(opt.model_dir));
    if (in.adapter && in.mc.tensor_prefix == "model.")
        in.adapter->set_name_alias(gemma4::kMultimodalTextPrefix, "model.");
    // Adapter shapes vs the base, before any heavy work; the first mismatch in sorted module order.
    if (in.adapter) {
        for (const auto& m : in.adapter->merges()) {
            std::string name = m.module + ".weight";
            if (const std::string alt = gemma4::text_only_spelling(in.mc.tensor_prefix, name);
                !in.ckpt->has(name) && !alt.empty())
                name = alt;
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
}

// Provenance: digests of every input file.
void record_provenance(Inputs& in) {
    const CompileOptions& opt = in.opt;
    plan::MetaProvenance& pv  = in.meta.provenance;
    for (const auto& f : in.ckpt->files())
        pv.base_files.push_back({fs::path(f).filename().string(), sha256_file(f)});
    pv.base_files.push_back({"config.json", sha256_file(opt.model_dir + "/config.json")});
    pv.base_dir = fs::path(opt.model_dir).filename().string();
    if (in.adapter) {
        pv.has_adapter = true;
        pv.adapter_dir = fs::path(opt.adapter_dir).filename().string();
        for (const char* f : {"adapter_config.json", "adapter_model.safetensors"})
            pv.adapter_files.push_back({f, sha256_file(opt.adapter_dir + "/" + f)});
        for (const auto& m : in.adapter->merges())
            pv.merges.push_back({m.module, m.r, m.alpha, m.scale, m.dora});
    }
    pv.g4_version = G4_VERSION_STRING;
}

void compile_cuda_kernels(Inputs& in) {
    if (in.cuda_index >= 0) {
        cuda::KernelBinary kb = cuda::compile_kernels(in.cuda_target, in.cuda_spec);
        in.cubin              = std::move(kb.cubin);
        in.ptx                = std::move(kb.ptx);
        in.kernels_cached     = kb.cached;
    }
}

} // namespace g4::stage
