// PEFT LoRA adapters (see lora.h): adapter_config.json parsing and validation, adapter key
// resolution, and the fp32 merge W' = W + scale * (B @ A) (DoRA: W' = (m / ||V||_row) * V).
//
// Semantics follow PEFT 0.21 (huggingface/peft):
//   - scale = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora; r and alpha per module from
//     rank_pattern / alpha_pattern: the first key (in file order) with
//     re.match(rf"(.*\.)?({key})$", module) wins (peft.utils.other.get_pattern_key). g4 matches these
//     keys with RE2 (linear time in the module name whatever the key, where Python's backtracking `re`, and
//     std::regex, can take exponential time on keys like "(.*)*x"); RE2 accepts Python's syntax except
//     backreferences and lookaround, which no PEFT target pattern needs: such a key is refused by name.
//   - LoRA merge (LoraLayer.get_delta_weight): delta = (B @ A) * scale, computed in fp32; W += delta.
//   - DoRA merge (DoraLinearVariant.merge_*): norm = ||W + delta||_2 per output row (fp32, detached,
//     delta already scaled), W' = (m / norm)[:, None] * (W + delta).
//   - lora_bias: b += scale * lora_B.bias.
//   - modules_to_save: the saved module tensors replace the base tensors.
#include "compiler/lora.h"

#include "compiler/error.h"
#include "compiler/safetensors.h"
#include "compiler/workers.h"
#include "runtime/src/json_limits.h"

#include <Eigen/Core>
#include <nlohmann/json.hpp>
#include <re2/re2.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>

namespace g4::lora {
namespace fs = std::filesystem;
using ojson  = nlohmann::ordered_json; // rank_pattern / alpha_pattern: first key in file order wins

namespace {

const std::string kPrefix = "base_model.model.";

[[noreturn]] void fail(std::string msg) {
    for (char& c : msg)
        if ((unsigned char)c < 0x20 || c == 0x7f) c = ' ';
    throw CompileError(msg);
}

std::string shape_str(const std::vector<int64_t>& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i)
        r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
}

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    size_t b = 0;
    for (;;) {
        size_t e = s.find(sep, b);
        out.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
        if (e == std::string::npos) break;
        b = e + 1;
    }
    return out;
}

std::string join(const std::vector<std::string>& v, size_t b, size_t e) {
    std::string r;
    for (size_t i = b; i < e; ++i)
        r += (i > b ? "." : "") + v[i];
    return r;
}

bool starts_with(const std::string& s, const std::string& p) {
    return s.rfind(p, 0) == 0;
}
bool ends_with(const std::string& s, const std::string& p) {
    return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

bool truthy(const ojson& v) {
    if (v.is_null()) return false;
    if (v.is_boolean()) return v.get<bool>();
    if (v.is_number()) return v.get<double>() != 0;
    if (v.is_string()) return !v.get<std::string>().empty();
    if (v.is_array() || v.is_object()) return !v.empty();
    return true;
}

// One pattern of rank_pattern / alpha_pattern, compiled as PEFT's re.match(rf"(.*\.)?({key})$"): RE2's
// full match of "(.*\.)?(key)" (module names hold no newline, the one place where `$` differs).
struct Pattern {
    std::string key;
    std::shared_ptr<const RE2> re;
    double value;
};

struct Module {
    ModuleMerge info;
    std::vector<float> A, B;      // [r, in], [out, r]
    std::vector<float> mag;       // DoRA magnitude [out]
    std::vector<float> bias;      // lora_B.bias [out]
    std::string r_key, alpha_key; // pattern keys that set r / alpha ("" = config default)
};

struct Replacement {
    std::vector<int64_t> shape;
    std::vector<float> data;
};

// Parts of one adapter tensor while collecting.
struct Parts {
    const st::TensorView* A    = nullptr;
    const st::TensorView* B    = nullptr;
    const st::TensorView* mag  = nullptr;
    const st::TensorView* bias = nullptr;
};

// An adapter tensor as fp32; a NaN or infinity is refused, naming the tensor.
std::vector<float> f32_of(const st::TensorView& t) {
    std::vector<float> v((size_t)t.numel());
    st::to_f32(t, v.data());
    for (size_t i = 0; i < v.size(); ++i)
        if (!std::isfinite(v[i]))
            fail(t.file + ": tensor '" + t.name + "' holds a NaN or infinity at element " +
                 std::to_string(i) + "; the adapter is corrupt (re-save it)");
    return v;
}

} // namespace

struct Adapter::Impl {
    std::string dir, cfg_path, st_path;
    std::vector<ModuleMerge> merges;         // sorted by module
    std::map<std::string, Module> modules;   // by adapter module name
    std::map<std::string, Replacement> repl; // by adapter tensor name
    std::vector<std::pair<std::string, std::string>> aliases;

    mutable std::mutex mu; // guards the consumed sets
    mutable std::set<std::string> used_modules, used_repl;

    void parse_config(const ojson& cfg, bool& use_rslora, bool& use_dora, bool& lora_bias, int& r,
                      double& alpha, std::vector<Pattern>& rank_pat, std::vector<Pattern>& alpha_pat) const;
    void merge(const Module& m, float* w, const std::string& tensor_name) const;
};

Adapter::~Adapter() = default;
const std::string& Adapter::dir() const {
    return impl_->dir;
}
const std::vector<ModuleMerge>& Adapter::merges() const {
    return impl_->merges;
}

std::vector<std::string> Adapter::replacements() const {
    std::vector<std::string> out;
    for (const auto& [k, v] : impl_->repl)
        out.push_back(k);
    return out;
}

void Adapter::set_name_alias(const std::string& adapter_prefix, const std::string& checkpoint_prefix) {
    impl_->aliases.emplace_back(adapter_prefix, checkpoint_prefix);
}

void Adapter::Impl::parse_config(const ojson& cfg, bool& use_rslora, bool& use_dora, bool& lora_bias, int& r,
                                 double& alpha, std::vector<Pattern>& rank_pat,
                                 std::vector<Pattern>& alpha_pat) const {
    const std::string& P = cfg_path;
    if (!cfg.is_object()) fail(P + ": expected a JSON object; re-save the adapter with PEFT save_pretrained");

    auto field_err = [&](const std::string& k, const std::string& what) -> std::string {
        return P + ": field '" + k + "' " + what +
               "; fix adapter_config.json or re-save the adapter with PEFT";
    };
    auto get_bool = [&](const char* k, bool def) {
        if (!cfg.contains(k) || cfg[k].is_null()) return def;
        if (!cfg[k].is_boolean()) fail(field_err(k, "must be true or false, got " + cfg[k].dump()));
        return cfg[k].get<bool>();
    };
    auto get_num = [&](const char* k, double def) {
        if (!cfg.contains(k) || cfg[k].is_null()) return def;
        if (!cfg[k].is_number()) fail(field_err(k, "must be a number, got " + cfg[k].dump()));
        return cfg[k].get<double>();
    };

    if (!cfg.contains("peft_type"))
        fail(P + ": no 'peft_type'; not a PEFT adapter config (expected peft_type \"LORA\")");
    if (!cfg["peft_type"].is_string())
        fail(P + ": 'peft_type' must be a string, got " + cfg["peft_type"].dump());
    std::string pt = cfg["peft_type"].get<std::string>();
    if (pt != "LORA")
        fail(P + ": peft_type \"" + pt +
             "\" is not supported; only LoRA adapters (peft_type \"LORA\") can be merged");

    if (get_bool("fan_in_fan_out", false))
        fail(P + ": fan_in_fan_out is true (weights stored transposed, GPT-2 Conv1D style); Gemma 4 uses "
                 "nn.Linear, so this adapter "
                 "was made for another model");

    if (cfg.contains("init_lora_weights")) {
        const auto& v = cfg["init_lora_weights"];
        if (v.is_string()) {
            std::string s = v.get<std::string>(), low = s;
            std::transform(low.begin(), low.end(), low.begin(),
                           [](unsigned char c) { return (char)std::tolower(c); });
            bool modifies = starts_with(low, "pissa") || starts_with(low, "corda") || low == "olora" ||
                            low == "loftq" || starts_with(low, "lora_ga");
            if (modifies)
                fail(P + ": adapter initialised with " + s +
                     " changes the base weights; it cannot be merged onto the original base (convert it "
                     "first with PEFT "
                     "save_pretrained(..., path_initial_model_for_weight_conversion=...))");
            if (low != "gaussian" && low != "eva" && low != "orthogonal" && low != "mica" && low != "true" &&
                low != "false")
                fail(P + ": unknown init_lora_weights \"" + s +
                     "\"; g4 cannot tell whether it changed the base weights (supported: true, false, "
                     "gaussian, eva, orthogonal)");
        } else if (!v.is_boolean() && !v.is_null()) {
            fail(field_err("init_lora_weights", "must be a boolean or a string, got " + v.dump()));
        }
    }

    // Variants whose merged form is not W + scale * B @ A.
    static const std::pair<const char*, const char*> unsupported[] = {
        {"alora_invocation_tokens",
         "activated LoRA (alora_invocation_tokens) only applies after its invocation tokens"},
        {"use_qalora", "QA-LoRA (use_qalora) pools the input"},
        {"velora_config", "VeLoRA (velora_config)"},
        {"monteclora_config", "MonteCLoRA (monteclora_config)"},
        {"kasa_config", "KaSA (kasa_config)"},
        {"arrow_config", "Arrow routing (arrow_config)"},
        {"use_bdlora", "block-diagonal LoRA (use_bdlora)"},
        {"layer_replication", "layer_replication changes the layer structure"},
        {"target_parameters", "LoRA on raw parameters (target_parameters)"},
        {"trainable_token_indices", "trainable tokens (trainable_token_indices)"},
    };
    for (const auto& [k, what] : unsupported)
        if (cfg.contains(k) && truthy(cfg[k]))
            fail(P + ": " + what +
                 "; this adapter cannot be merged as W + scale*B@A, which is all g4 supports");

    use_rslora = get_bool("use_rslora", false);
    use_dora   = get_bool("use_dora", false);
    lora_bias  = get_bool("lora_bias", false);
    double rr  = get_num("r", 8);
    if (rr < 1 || rr != std::floor(rr))
        fail(field_err("r", "must be a positive integer, got " + cfg["r"].dump()));
    r     = (int)rr;
    alpha = get_num("lora_alpha", 8);

    auto patterns = [&](const char* k, std::vector<Pattern>& out, bool integer) {
        if (!cfg.contains(k) || cfg[k].is_null()) return;
        if (!cfg[k].is_object())
            fail(field_err(k, "must be an object {pattern: value}, got " + cfg[k].dump()));
        for (const auto& [key, val] : cfg[k].items()) {
            if (!val.is_number() ||
                (integer && (val.get<double>() < 1 || val.get<double>() != std::floor(val.get<double>()))))
                fail(field_err(k, "has value " + val.dump() + " for '" + key + "', expected a " +
                                      (integer ? "positive integer" : "number")));
            Pattern p;
            p.key   = key;
            p.value = val.get<double>();
            if (key.size() > 4096)
                fail(field_err(k, "has a key of " + std::to_string(key.size()) +
                                      " bytes; module patterns are short"));
            RE2::Options o;
            o.set_log_errors(false);
            auto re = std::make_shared<const RE2>("(.*\\.)?(" + key + ")", o);
            if (!re->ok())
                fail(field_err(
                    k, "has key '" + key +
                           "', which is not a valid regular expression for g4's linear-time matcher (RE2: " +
                           re->error() + "; backreferences and lookaround are not supported)"));
            p.re = std::move(re);
            out.push_back(std::move(p));
        }
    };
    patterns("rank_pattern", rank_pat, true);
    patterns("alpha_pattern", alpha_pat, false);
}

namespace {
// adapter_config.json, parsed (nesting depth checked first).
ojson read_config(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("cannot read " + path + ": check its permissions");
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    if (std::string e = json_depth_error(text); !e.empty()) fail(path + ": " + e);
    try {
        return ojson::parse(text);
    } catch (const std::exception& e) {
        fail(path + " is not valid JSON (" + e.what() + "); fix the file or re-save the adapter with PEFT");
    }
}
} // namespace

std::unique_ptr<Adapter> Adapter::open(const std::string& dir) {
    std::unique_ptr<Adapter> a(new Adapter());
    a->impl_   = std::make_unique<Impl>();
    Impl& I    = *a->impl_;
    I.dir      = dir;
    I.cfg_path = (fs::path(dir) / "adapter_config.json").string();
    I.st_path  = (fs::path(dir) / "adapter_model.safetensors").string();

    std::error_code ec;
    if (!fs::exists(dir, ec))
        fail("LoRA adapter directory " + dir +
             " does not exist; pass the directory written by PEFT save_pretrained "
             "(adapter_config.json + adapter_model.safetensors)");
    if (!fs::is_directory(dir, ec))
        fail("LoRA adapter " + dir +
             " is not a directory; pass the directory written by PEFT save_pretrained "
             "(adapter_config.json + adapter_model.safetensors)");
    if (!fs::exists(I.cfg_path, ec))
        fail(I.cfg_path + " not found: " + dir +
             " is not a PEFT adapter directory (expected adapter_config.json + adapter_model.safetensors "
             "from save_pretrained)");

    const ojson cfg = read_config(I.cfg_path);
    bool use_rslora = false, use_dora = false, lora_bias = false;
    int r_cfg        = 8;
    double alpha_cfg = 8;
    std::vector<Pattern> rank_pat, alpha_pat;
    I.parse_config(cfg, use_rslora, use_dora, lora_bias, r_cfg, alpha_cfg, rank_pat, alpha_pat);

    // ---- adapter_model.safetensors
    if (!fs::exists(I.st_path, ec)) {
        if (fs::exists(fs::path(dir) / "adapter_model.bin", ec))
            fail((fs::path(dir) / "adapter_model.bin").string() +
                 " (pickle) is not supported; re-save with safe_serialization=True / convert to safetensors "
                 "(adapter_model.safetensors)");
        fail(I.st_path + " not found; re-save the adapter with PEFT save_pretrained (safetensors)");
    }
    std::unique_ptr<st::File> file = st::File::open(I.st_path);

    std::map<std::string, Parts> parts;
    std::map<std::string, const st::TensorView*> repl_src;
    std::set<std::string> adapter_names;
    auto bad_key = [&](const std::string& key, const std::string& what) {
        fail(I.st_path + ": tensor '" + key + "' " + what + "; not a PEFT LoRA adapter file g4 understands");
    };
    for (const auto& [key, tv] : file->tensors()) {
        if (!starts_with(key, kPrefix)) bad_key(key, "does not start with 'base_model.model.'");
        std::vector<std::string> c = split(key.substr(kPrefix.size()), '.');
        size_t i                   = 0;
        for (; i < c.size(); ++i)
            if (starts_with(c[i], "lora_") || c[i] == "modules_to_save" || c[i] == "trainable_tokens_delta" ||
                c[i] == "token_adapter")
                break;
        if (i < c.size() && (c[i] == "trainable_tokens_delta" || c[i] == "token_adapter"))
            bad_key(key, "belongs to trainable tokens (trainable_token_indices), which g4 cannot merge");
        if (i == c.size() || c[i] == "modules_to_save") {
            // modules_to_save (or trained base bias): a full replacement of a base tensor.
            std::vector<std::string> n = c;
            if (i < c.size()) {
                size_t after = c.size() - i - 1;
                if (after >= 2) adapter_names.insert(c[i + 1]);
                n.erase(n.begin() + i, n.begin() + i + (after >= 2 ? 2 : 1));
            }
            std::string name = join(n, 0, n.size());
            if (n.size() < 2) bad_key(key, "names no module");
            if (repl_src.count(name)) bad_key(key, "duplicates replacement tensor " + name);
            repl_src[name] = &tv;
            continue;
        }
        const std::string kind = c[i];
        std::string module     = join(c, 0, i);
        if (module.empty()) bad_key(key, "names no module");
        std::vector<std::string> tail(c.begin() + i + 1, c.end());
        if (kind == "lora_embedding_A" || kind == "lora_embedding_B")
            fail(I.st_path + ": module " + module +
                 " is an embedding with LoRA (lora_embedding_A/B); g4 merges LoRA on linear layers only "
                 "(retrain without "
                 "targeting the embedding, or put it in modules_to_save)");
        Parts& p = parts[module];
        std::string leaf;
        if (kind == "lora_A" || kind == "lora_B") {
            if (tail.size() == 2) adapter_names.insert(tail[0]);
            if (tail.empty() || tail.size() > 2) bad_key(key, "has an unexpected layout");
            leaf = tail.back();
            if (leaf == "weight")
                (kind == "lora_A" ? p.A : p.B) = &tv;
            else if (leaf == "bias" && kind == "lora_B")
                p.bias = &tv;
            else
                bad_key(key, "has an unexpected layout");
        } else if (kind == "lora_magnitude_vector") {
            // ...lora_magnitude_vector, ...lora_magnitude_vector.weight, or with an adapter name before
            // .weight
            if (tail.size() > 2 || (tail.size() == 2 && tail[1] != "weight"))
                bad_key(key, "has an unexpected layout");
            if (!tail.empty() && tail[0] != "weight") adapter_names.insert(tail[0]);
            p.mag = &tv;
        } else {
            bad_key(key, "is an unknown LoRA tensor kind '" + kind + "'");
        }
    }
    if (adapter_names.size() > 1) {
        std::string names;
        for (const auto& n : adapter_names)
            names += (names.empty() ? "" : ", ") + n;
        fail(I.st_path + ": holds several adapters (" + names + "); save one adapter per directory");
    }

    // ---- validate and convert each module
    for (const auto& [module, p] : parts) {
        const std::string where = I.st_path + ": module " + module;
        if (!p.A || !p.B)
            fail(where + " has " +
                 (p.A   ? "lora_A but no lora_B"
                  : p.B ? "lora_B but no lora_A"
                        : "a magnitude/bias but no lora_A/lora_B") +
                 "; the adapter file is incomplete (re-save it)");
        if (p.A->shape.size() != 2 || p.B->shape.size() != 2)
            fail(where + ": lora_A " + shape_str(p.A->shape) + " and lora_B " + shape_str(p.B->shape) +
                 " must both be 2-D; conv LoRA is not supported");
        const int64_t rank = p.A->shape[0], in = p.A->shape[1], out = p.B->shape[0];
        if (p.B->shape[1] != rank)
            fail(where + ": lora_B " + shape_str(p.B->shape) + " and lora_A " + shape_str(p.A->shape) +
                 " disagree on the rank; the adapter file is corrupt (re-save it)");
        Module m;
        m.info.module = module;
        int r         = r_cfg;
        double alpha  = alpha_cfg;
        for (const auto& pat : rank_pat)
            if (RE2::FullMatch(module, *pat.re)) {
                r       = (int)pat.value;
                m.r_key = pat.key;
                break;
            }
        for (const auto& pat : alpha_pat)
            if (RE2::FullMatch(module, *pat.re)) {
                alpha       = pat.value;
                m.alpha_key = pat.key;
                break;
            }
        if (rank != r)
            fail(where + ": lora_A " + shape_str(p.A->shape) + " has rank " + std::to_string(rank) +
                 " but adapter_config.json says r=" + std::to_string(r) +
                 (m.r_key.empty() ? "" : " (rank_pattern '" + m.r_key + "')") +
                 "; the config and the weights disagree (was the adapter saved with this config?)");
        m.info.r     = r;
        m.info.alpha = (float)alpha;
        m.info.scale = (float)(use_rslora ? alpha / std::sqrt((double)r) : alpha / (double)r);
        m.info.out   = out;
        m.info.in    = in;
        m.A          = f32_of(*p.A);
        m.B          = f32_of(*p.B);
        if (p.mag) {
            if (!use_dora)
                fail(where + " has a DoRA magnitude vector but use_dora is false in adapter_config.json; fix "
                             "the config or re-save the adapter");
            if (p.mag->shape != std::vector<int64_t>{out} && p.mag->shape != std::vector<int64_t>{1, out} &&
                p.mag->shape != std::vector<int64_t>{out, 1})
                fail(where + ": DoRA magnitude " + shape_str(p.mag->shape) + " does not match lora_B " +
                     shape_str(p.B->shape) + "; the adapter file is corrupt (re-save it)");
            m.mag       = f32_of(*p.mag);
            m.info.dora = true;
        } else if (use_dora) {
            fail(where + " has no lora_magnitude_vector but use_dora is true; the adapter file is incomplete "
                         "(re-save it)");
        }
        if (p.bias) {
            if (!lora_bias)
                fail(where + " has lora_B.bias but lora_bias is false in adapter_config.json; fix the config "
                             "or re-save the adapter");
            if (p.bias->shape != std::vector<int64_t>{out})
                fail(where + ": lora_B.bias " + shape_str(p.bias->shape) + " does not match lora_B " +
                     shape_str(p.B->shape) + "; the adapter file is corrupt (re-save it)");
            m.bias          = f32_of(*p.bias);
            m.info.has_bias = true;
        }
        I.merges.push_back(m.info);
        I.modules.emplace(module, std::move(m));
    }
    for (const auto& [name, tv] : repl_src) {
        if (ends_with(name, ".weight") && I.modules.count(name.substr(0, name.size() - 7)))
            fail(I.st_path + ": " + name +
                 " is both replaced (modules_to_save) and LoRA-targeted; g4 cannot tell which applies");
        Replacement rp;
        rp.shape = tv->shape;
        rp.data  = f32_of(*tv);
        I.repl.emplace(name, std::move(rp));
    }
    if (I.modules.empty() && I.repl.empty()) fail(I.st_path + " holds no LoRA tensors; nothing to merge");
    std::sort(I.merges.begin(), I.merges.end(),
              [](const ModuleMerge& x, const ModuleMerge& y) { return x.module < y.module; });
    return a;
}

// W[out, in] += scale * B @ A (DoRA: W = m / ||W + scale B A||_row * (W + scale B A)), in fp32, rows in
// parallel.
void Adapter::Impl::merge(const Module& m, float* w, const std::string& tensor_name) const {
    using RM          = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const int64_t out = m.info.out, in = m.info.in, r = m.info.r;
    const float scale = m.info.scale;
    const bool dora   = m.info.dora;
    Eigen::Map<const RM> A(m.A.data(), r, in), B(m.B.data(), out, r);
    Eigen::Map<RM> W(w, out, in);
    const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(64, (1 << 16) / std::max<int64_t>(1, in)));
    const int64_t nblk = (out + rows - 1) / rows;
    bool finite        = true;
    std::mutex fin_mu;

    auto block = [&](int64_t b, int) {
        const int64_t r0 = b * rows, n = std::min(rows, out - r0);
        RM D = B.middleRows(r0, n) * A; // B @ A, then * scale (PEFT's get_delta_weight order)
        D *= scale;
        auto Wb = W.middleRows(r0, n);
        if (!dora) {
            Wb += D;
        } else {
            D += Wb; // V = W + delta
            for (int64_t i = 0; i < n; ++i) {
                double ss = 0;
                for (int64_t j = 0; j < in; ++j)
                    ss += (double)D(i, j) * (double)D(i, j);
                const float norm   = (float)std::sqrt(ss);
                const float factor = m.mag[r0 + i] / norm;
                Wb.row(i)          = D.row(i) * factor;
            }
        }
        if (!Wb.allFinite()) {
            std::lock_guard<std::mutex> lk(fin_mu);
            finite = false;
        }
    };
    const double flops = (double)out * (double)in * (double)r;
    if (flops < (1 << 20) || nblk == 1) {
        for (int64_t b = 0; b < nblk; ++b)
            block(b, 0);
    } else {
        compiler::parallel_for(nblk, block);
    }
    if (!finite)
        fail(st_path + ": merging module " + m.info.module + " into " + tensor_name +
             " gives non-finite values; the adapter (or the base weight) is broken");
}

bool Adapter::apply(const std::string& tensor_name, const std::vector<int64_t>& shape, float* w,
                    std::vector<float>* bias, bool* has_bias) const {
    Impl& I = *impl_;
    if (has_bias) *has_bias = false;
    std::vector<std::string> cands{tensor_name};
    for (const auto& [ap, cp] : I.aliases)
        if (starts_with(tensor_name, cp)) cands.push_back(ap + tensor_name.substr(cp.size()));

    for (const auto& name : cands) {
        auto rit = I.repl.find(name);
        if (rit != I.repl.end()) {
            const Replacement& rp = rit->second;
            if (rp.shape != shape)
                fail("adapter does not fit this model: modules_to_save tensor " + name + " is " +
                     shape_str(rp.shape) + " but the base tensor " + tensor_name + " is " + shape_str(shape) +
                     " (" + I.st_path + "); use an adapter made for this model");
            std::copy(rp.data.begin(), rp.data.end(), w);
            std::lock_guard<std::mutex> lk(I.mu);
            I.used_repl.insert(name);
            return true;
        }
    }
    for (const auto& name : cands) {
        if (!ends_with(name, ".weight")) continue;
        auto mit = I.modules.find(name.substr(0, name.size() - 7));
        if (mit == I.modules.end()) continue;
        const Module& m = mit->second;
        if (shape.size() != 2 || shape[0] != m.info.out || shape[1] != m.info.in)
            fail("adapter does not fit this model: module " + m.info.module + " has lora_B " +
                 shape_str({m.info.out, (int64_t)m.info.r}) + " / lora_A " +
                 shape_str({(int64_t)m.info.r, m.info.in}) + " but the base weight is " + shape_str(shape) +
                 " (" + I.st_path + "); use an adapter made for this model");
        I.merge(m, w, tensor_name);
        if (m.info.has_bias) {
            if (!bias || !has_bias)
                fail("internal: module " + m.info.module +
                     " has a LoRA bias but the caller passed no bias buffer");
            if ((int64_t)bias->size() != m.info.out) bias->assign((size_t)m.info.out, 0.0f);
            for (int64_t i = 0; i < m.info.out; ++i)
                (*bias)[i] += m.info.scale * m.bias[i];
            *has_bias = true;
        }
        std::lock_guard<std::mutex> lk(I.mu);
        I.used_modules.insert(m.info.module);
        return true;
    }
    return false;
}

std::vector<std::string> Adapter::unconsumed() const {
    const Impl& I = *impl_;
    std::lock_guard<std::mutex> lk(I.mu);
    std::vector<std::string> out;
    for (const auto& m : I.merges)
        if (!I.used_modules.count(m.module)) out.push_back(m.module);
    for (const auto& [name, rp] : I.repl)
        if (!I.used_repl.count(name)) out.push_back(name);
    std::sort(out.begin(), out.end());
    return out;
}

} // namespace g4::lora
