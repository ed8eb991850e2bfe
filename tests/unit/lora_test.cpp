// Unit tests for the PEFT LoRA adapter reader and fp32 merge (compiler/lora.h), called directly (not
// through the CLI). Reference data: tests/fixtures/adapters/<name>/ made by
// tools/make_adapter_fixtures.py (PEFT 0.21 merge_and_unload in fp32 -> reference/merged.safetensors,
// PEFT's resolved r/alpha/scale per module -> reference/reference.json). Synthetic adapters written
// here cover key layouts and errors that PEFT itself does not produce.
#include "compiler/error.h"
#include "compiler/lora.h"
#include "compiler/safetensors.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

using g4test::randn;

using g4::CompileError;
using g4::lora::Adapter;
using nlohmann::json;

std::string adapter_dir(const std::string& name) {
    return g4test::fixture("adapters/" + name);
}

json load_json(const std::string& path) {
    return json::parse(g4test::read_file(path));
}

std::vector<float> f32(const g4::st::TensorView& t) {
    std::vector<float> v((size_t)t.numel());
    g4::st::to_f32(t, v.data());
    return v;
}

// Runs `fn` and returns the CompileError message (fails the test if nothing or something else is thrown).
std::string error_of(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const CompileError& e) {
        std::string m = e.what();
        EXPECT_EQ(m.find('\n'), std::string::npos) << "multi-line message: " << m;
        return m;
    } catch (const std::exception& e) {
        ADD_FAILURE() << "expected g4::CompileError, got std::exception: " << e.what();
        return "";
    }
    ADD_FAILURE() << "expected g4::CompileError, nothing was thrown";
    return "";
}

#define EXPECT_HAS(msg, sub)                                                                                 \
    EXPECT_NE((msg).find(sub), std::string::npos) << "message: " << (msg) << "\nexpected: " << (sub)

// First KV-shared layer of a fixture checkpoint (from config.json text_config).
int first_shared(const std::string& base_dir) {
    json c  = load_json(base_dir + "/config.json");
    json tc = c.contains("text_config") ? c["text_config"] : c;
    return tc["num_hidden_layers"].get<int>() - tc["num_kv_shared_layers"].get<int>();
}

// Tensors the compiler never reads (like g4's graph): the unused K/V of KV-shared layers.
bool dropped_like_compiler(const std::string& name, int first_sh) {
    int layer      = -1;
    char rest[256] = {};
    for (const char* pre : {"model.language_model.layers.%d.%255s", "model.layers.%d.%255s"})
        if (std::sscanf(name.c_str(), pre, &layer, rest) == 2) break;
    if (layer < first_sh) return false;
    std::string r = rest;
    return r.rfind("self_attn.k_proj", 0) == 0 || r.rfind("self_attn.v_proj", 0) == 0 ||
           r.rfind("self_attn.k_norm", 0) == 0;
}

struct MergeRun {
    std::map<std::string, std::vector<float>> merged; // every tensor apply() changed, after the merge
    std::map<std::string, std::vector<float>> base;   // the same tensors before
    std::map<std::string, std::vector<int64_t>> shape;
};

// apply() on every floating tensor of the checkpoint (skipping what the compiler drops).
MergeRun merge_all(const Adapter& a, const std::string& base_dir) {
    MergeRun run;
    auto ck      = g4::st::Checkpoint::open(base_dir);
    const int fs = first_shared(base_dir);
    for (const auto& name : ck.names()) {
        const auto& tv = ck.get(name);
        if (tv.dtype != g4::st::DType::F32 && tv.dtype != g4::st::DType::BF16 &&
            tv.dtype != g4::st::DType::F16)
            continue;
        if (dropped_like_compiler(name, fs)) continue;
        std::vector<float> w = f32(tv), before = w;
        std::vector<float> bias(tv.shape.empty() ? 0 : (size_t)tv.shape[0], 0.0f);
        bool has_bias = false;
        if (a.apply(name, tv.shape, w.data(), &bias, &has_bias)) {
            EXPECT_FALSE(has_bias) << name;
            EXPECT_NE(w, before) << name << ": apply() returned true but changed nothing";
            run.merged[name] = std::move(w);
            run.base[name]   = std::move(before);
            run.shape[name]  = tv.shape;
        } else {
            EXPECT_EQ(w, before) << name << ": apply() returned false but changed the tensor";
        }
    }
    return run;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double m = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
        m = std::max(m, (double)std::fabs(a[i] - b[i]));
    return m;
}

// ---------------------------------------------------------------------------------------------
// Fixture adapters against PEFT
// ---------------------------------------------------------------------------------------------

const char* kGood[] = {"e2b_lora",
                       "e2b_rslora_patterns",
                       "e2b_dora",
                       "e2b_modules_to_save",
                       "e2b_modules_to_save_tied",
                       "e2b_tower_linear",
                       "e4b_lora"};

class GoodAdapter : public ::testing::TestWithParam<const char*> {};

TEST_P(GoodAdapter, MergesLikePeft) {
    const std::string name = GetParam();
    const std::string dir  = adapter_dir(name);
    json ref               = load_json(dir + "/reference/reference.json");
    const std::string base = g4test::fixture(ref["base"].get<std::string>());
    auto a                 = Adapter::open(dir);
    EXPECT_EQ(a->dir(), dir);

    // merges(): PEFT's modules (r, alpha, scale as PEFT resolved them) plus hand-added extras, sorted.
    std::map<std::string, json> want;
    for (const auto& m : ref["modules"])
        want[m["module"].get<std::string>()] = m;
    std::set<std::string> extra;
    for (const auto& e : ref["extra_modules"])
        extra.insert(e.get<std::string>());
    const auto& merges = a->merges();
    EXPECT_EQ(merges.size(), want.size() + extra.size());
    EXPECT_TRUE(std::is_sorted(merges.begin(), merges.end(),
                               [](const auto& x, const auto& y) { return x.module < y.module; }));
    for (const auto& m : merges) {
        if (extra.count(m.module)) continue;
        auto it = want.find(m.module);
        ASSERT_NE(it, want.end()) << "unexpected module " << m.module;
        const json& w = it->second;
        EXPECT_EQ(m.r, w["r"].get<int>()) << m.module;
        EXPECT_FLOAT_EQ(m.alpha, w["alpha"].get<float>()) << m.module;
        EXPECT_FLOAT_EQ(m.scale, (float)w["scale"].get<double>()) << m.module;
        EXPECT_EQ(m.dora, w["dora"].get<bool>()) << m.module;
        EXPECT_EQ(m.has_bias, w["has_bias"].get<bool>()) << m.module;
        EXPECT_GT(m.out, 0);
        EXPECT_GT(m.in, 0);
    }
    std::vector<std::string> repl_want;
    for (const auto& r : ref["replacements"])
        repl_want.push_back(r.get<std::string>());
    EXPECT_EQ(a->replacements(), repl_want);

    MergeRun run = merge_all(*a, base);

    // Merged weights against PEFT merge_and_unload (fp32).
    auto mf = g4::st::File::open(dir + "/reference/merged.safetensors");
    ASSERT_FALSE(mf->tensors().empty());
    for (const auto& [tname, tv] : mf->tensors()) {
        ASSERT_TRUE(run.merged.count(tname)) << tname << " was not merged";
        EXPECT_EQ(run.shape[tname], tv.shape) << tname;
        double d = max_abs_diff(run.merged[tname], f32(tv));
        EXPECT_LT(d, 1e-6) << name << ": " << tname << " differs from PEFT's merge by " << d;
    }

    // Every LoRA module of PEFT was merged; every replacement in the checkpoint was applied verbatim.
    std::set<std::string> merged_modules;
    for (const auto& [tname, w] : run.merged)
        if (tname.size() > 7 && tname.compare(tname.size() - 7, 7, ".weight") == 0)
            merged_modules.insert(tname.substr(0, tname.size() - 7));
    for (const auto& [mod, w] : want)
        EXPECT_TRUE(merged_modules.count(mod)) << mod << " never merged";
    auto af = g4::st::File::open(dir + "/adapter_model.safetensors");
    for (const auto& r : repl_want) {
        const auto& src = af->tensors().at("base_model.model." + r);
        if (run.merged.count(r)) {
            EXPECT_EQ(run.merged[r], f32(src)) << r;
        }
    }

    // Unconsumed: only the hand-added shared-layer module, and (tied-head adapters) lm_head.weight,
    // which a checkpoint with tied embeddings does not have.
    std::vector<std::string> unc_want(extra.begin(), extra.end());
    for (const auto& r : repl_want)
        if (!run.merged.count(r)) unc_want.push_back(r);
    std::sort(unc_want.begin(), unc_want.end());
    EXPECT_EQ(a->unconsumed(), unc_want);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoodAdapter, ::testing::ValuesIn(kGood),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

TEST(LoraFixtures, SharedLayerKProjIsUnconsumed) {
    auto a     = Adapter::open(adapter_dir("e2b_lora"));
    MergeRun r = merge_all(*a, g4test::fixture("e2b_tiny"));
    EXPECT_EQ(a->unconsumed(), std::vector<std::string>{"model.language_model.layers.7.self_attn.k_proj"});
    // PEFT made no k/v modules on the shared layers 6..9; everything else of the text decoder was merged.
    int kv = 0;
    for (const auto& [n, w] : r.merged)
        if (n.find("self_attn.k_proj") != std::string::npos ||
            n.find("self_attn.v_proj") != std::string::npos)
            ++kv;
    EXPECT_EQ(kv, 12); // layers 0..5, k and v
    EXPECT_EQ(r.merged.size(), 62u);
}

TEST(LoraFixtures, RsloraAndPatterns) {
    auto a = Adapter::open(adapter_dir("e2b_rslora_patterns"));
    std::map<std::string, g4::lora::ModuleMerge> by;
    for (const auto& m : a->merges())
        by[m.module] = m;
    const std::string L = "model.language_model.layers.";
    ASSERT_EQ(by.size(), 42u); // q,k,v,o,down on layers 0..5; q,o,down on 6..9 (no k/v modules there)
    // rank_pattern (saved with sorted keys): "down_proj": 4, "layers\.3\.self_attn\.q_proj": 12, "q_proj": 6
    EXPECT_EQ(by[L + "3.self_attn.q_proj"].r, 12); // first match wins over "q_proj"
    EXPECT_EQ(by[L + "1.self_attn.q_proj"].r, 6);
    EXPECT_EQ(by[L + "8.mlp.down_proj"].r, 4);
    EXPECT_EQ(by[L + "2.self_attn.k_proj"].r, 8);
    // alpha_pattern: "layers\.[0-4]\.mlp\.down_proj": 8, "o_proj": 24, "proj": 99 (never matches: anchored at
    // '.')
    EXPECT_EQ(by[L + "4.mlp.down_proj"].alpha, 8.0f);
    EXPECT_EQ(by[L + "5.mlp.down_proj"].alpha, 16.0f);
    EXPECT_EQ(by[L + "9.self_attn.o_proj"].alpha, 24.0f);
    for (const auto& [m, mm] : by)
        EXPECT_NE(mm.alpha, 99.0f) << m;
    // use_rslora: alpha / sqrt(r)
    EXPECT_FLOAT_EQ(by[L + "3.self_attn.q_proj"].scale, (float)(16.0 / std::sqrt(12.0)));
    EXPECT_FLOAT_EQ(by[L + "4.mlp.down_proj"].scale, 4.0f);
    EXPECT_FLOAT_EQ(by[L + "9.self_attn.o_proj"].scale, (float)(24.0 / std::sqrt(8.0)));
}

TEST(LoraFixtures, DoraRowNormsEqualMagnitude) {
    const std::string dir = adapter_dir("e2b_dora");
    auto a                = Adapter::open(dir);
    for (const auto& m : a->merges())
        EXPECT_TRUE(m.dora) << m.module;
    MergeRun r = merge_all(*a, g4test::fixture("e2b_tiny"));
    auto af    = g4::st::File::open(dir + "/adapter_model.safetensors");
    ASSERT_EQ(r.merged.size(), a->merges().size());
    for (const auto& m : a->merges()) {
        const auto& w = r.merged.at(m.module + ".weight");
        auto mag      = f32(af->tensors().at("base_model.model." + m.module + ".lora_magnitude_vector"));
        for (int64_t i = 0; i < m.out; ++i) {
            double ss = 0;
            for (int64_t j = 0; j < m.in; ++j)
                ss += (double)w[i * m.in + j] * w[i * m.in + j];
            EXPECT_NEAR(std::sqrt(ss), mag[i], 1e-5 * std::max(1.0f, std::fabs(mag[i])))
                << m.module << " row " << i;
        }
    }
}

TEST(LoraFixtures, ModulesToSaveReplacesTheEmbedding) {
    const std::string dir = adapter_dir("e2b_modules_to_save");
    auto a                = Adapter::open(dir);
    EXPECT_EQ(a->replacements(), std::vector<std::string>{"model.language_model.embed_tokens.weight"});
    auto ck              = g4::st::Checkpoint::open(g4test::fixture("e2b_tiny"));
    const auto& tv       = ck.get("model.language_model.embed_tokens.weight");
    std::vector<float> w = f32(tv), orig = w;
    std::vector<float> bias;
    bool hb = true;
    ASSERT_TRUE(a->apply(tv.name, tv.shape, w.data(), &bias, &hb));
    EXPECT_FALSE(hb);
    auto af = g4::st::File::open(dir + "/adapter_model.safetensors");
    EXPECT_EQ(w, f32(af->tensors().at("base_model.model.model.language_model.embed_tokens.weight")));
    EXPECT_NE(w, orig);
    // A replacement of the wrong shape is rejected.
    std::vector<float> small(10 * 64);
    std::string msg = error_of([&] { a->apply(tv.name, {10, 64}, small.data(), &bias, &hb); });
    EXPECT_HAS(msg, "adapter does not fit this model");
    EXPECT_HAS(msg, "model.language_model.embed_tokens.weight");
    EXPECT_HAS(msg, "[512, 64]");
    EXPECT_HAS(msg, "[10, 64]");
}

TEST(LoraFixtures, TiedHeadReplacementCanBeAppliedToTheHead) {
    auto a = Adapter::open(adapter_dir("e2b_modules_to_save_tied"));
    EXPECT_EQ(a->replacements(),
              (std::vector<std::string>{"lm_head.weight", "model.language_model.embed_tokens.weight"}));
    auto ck                = g4::st::Checkpoint::open(g4test::fixture("e2b_tiny"));
    const auto& tv         = ck.get("model.language_model.embed_tokens.weight");
    std::vector<float> emb = f32(tv), head = emb, bias;
    bool hb = false;
    ASSERT_TRUE(a->apply(tv.name, tv.shape, emb.data(), &bias, &hb));
    auto has_head = [&] {
        auto u = a->unconsumed();
        return std::find(u.begin(), u.end(), "lm_head.weight") != u.end();
    };
    EXPECT_TRUE(has_head());
    ASSERT_TRUE(
        a->apply("lm_head.weight", tv.shape, head.data(), &bias, &hb)); // e.g. a compiler untying the head
    EXPECT_EQ(head, emb); // ensure_weight_tying: the saved head equals the saved embedding
    EXPECT_FALSE(has_head());
}

TEST(LoraFixtures, TowerLinearModules) {
    auto a    = Adapter::open(adapter_dir("e2b_tower_linear"));
    int tower = 0;
    for (const auto& m : a->merges())
        if (m.module.find("vision_tower") != std::string::npos) {
            ++tower;
            EXPECT_EQ(m.module.substr(m.module.size() - 7), ".linear") << m.module;
        }
    EXPECT_EQ(tower, 2);
    // A text-only compile never applies the tower modules: they stay unconsumed.
    auto ck = g4::st::Checkpoint::open(g4test::fixture("e2b_tiny"));
    for (const auto& n : ck.names()) {
        if (n.rfind("model.language_model.", 0) != 0) continue;
        std::vector<float> w = f32(ck.get(n)), b(ck.get(n).shape.empty() ? 0 : ck.get(n).shape[0]);
        bool hb              = false;
        a->apply(n, ck.get(n).shape, w.data(), &b, &hb);
    }
    EXPECT_EQ(a->unconsumed(),
              (std::vector<std::string>{"model.vision_tower.encoder.layers.0.self_attn.q_proj.linear",
                                        "model.vision_tower.encoder.layers.1.self_attn.q_proj.linear"}));
}

TEST(LoraFixtures, NameAliasForTextOnlyCheckpoint) {
    const std::string dir = adapter_dir("e2b_lora");
    auto a                = Adapter::open(dir);
    a->set_name_alias("model.language_model.", "model.");
    MergeRun r = merge_all(*a, g4test::fixture("e2b_tiny_text"));
    EXPECT_EQ(r.merged.size(), 62u);
    auto mf = g4::st::File::open(dir + "/reference/merged.safetensors");
    for (const auto& [tname, tv] : mf->tensors()) {
        std::string text_name = "model." + tname.substr(std::string("model.language_model.").size());
        ASSERT_TRUE(r.merged.count(text_name)) << text_name;
        EXPECT_LT(max_abs_diff(r.merged[text_name], f32(tv)), 1e-6) << text_name;
    }
    EXPECT_EQ(a->unconsumed(), std::vector<std::string>{"model.language_model.layers.7.self_attn.k_proj"});
}

TEST(LoraFixtures, Bf16AdapterIsUpcast) {
    // e4b_lora is stored in bfloat16; PEFT upcasts to fp32 before B @ A, so does g4.
    auto af = g4::st::File::open(adapter_dir("e4b_lora") + "/adapter_model.safetensors");
    for (const auto& [k, tv] : af->tensors())
        EXPECT_EQ(tv.dtype, g4::st::DType::BF16) << k;
}

// ---------------------------------------------------------------------------------------------
// Bad fixture adapters
// ---------------------------------------------------------------------------------------------

TEST(LoraErrors, BadShapeFixture) {
    auto a          = Adapter::open(adapter_dir("bad_shape"));
    std::string msg = error_of([&] { merge_all(*a, g4test::fixture("e2b_tiny")); });
    EXPECT_HAS(msg, "adapter does not fit this model: module model.language_model.layers.1.self_attn.o_proj "
                    "has lora_B [96, 2] / "
                    "lora_A [2, 64] but the base weight is [64, 64]");
}

TEST(LoraErrors, BadPeftTypeFixture) {
    std::string msg = error_of([&] { Adapter::open(adapter_dir("bad_peft_type")); });
    EXPECT_HAS(msg, "peft_type \"IA3\"");
    EXPECT_HAS(msg, "adapter_config.json");
}

TEST(LoraErrors, BinOnlyFixture) {
    std::string msg = error_of([&] { Adapter::open(adapter_dir("bin_only")); });
    EXPECT_HAS(msg, "adapter_model.bin (pickle) is not supported; re-save with safe_serialization=True / "
                    "convert to safetensors");
}

TEST(LoraErrors, PissaFixture) {
    std::string msg = error_of([&] { Adapter::open(adapter_dir("pissa")); });
    EXPECT_HAS(msg, "adapter initialised with pissa changes the base weights; it cannot be merged onto the "
                    "original base");
}

// ---------------------------------------------------------------------------------------------
// Synthetic adapters
// ---------------------------------------------------------------------------------------------

struct T {
    std::string dtype = "F32";
    std::vector<int64_t> shape;
    std::vector<float> v;
};

std::string le64(uint64_t v) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i)
        s[i] = (char)((v >> (8 * i)) & 0xff);
    return s;
}

std::string safetensors_bytes(const std::map<std::string, T>& ts) {
    json hdr = json::object();
    std::string data;
    for (const auto& [name, t] : ts) {
        std::string bytes;
        if (t.dtype == "F32") {
            bytes.assign((const char*)t.v.data(), t.v.size() * 4);
        } else { // BF16, truncating (test values are chosen exactly representable)
            for (float f : t.v) {
                uint32_t u;
                std::memcpy(&u, &f, 4);
                uint16_t h = (uint16_t)(u >> 16);
                bytes.append((const char*)&h, 2);
            }
        }
        hdr[name] = {{"dtype", t.dtype},
                     {"shape", t.shape},
                     {"data_offsets", {data.size(), data.size() + bytes.size()}}};
        data += bytes;
    }
    std::string h = hdr.dump();
    return le64(h.size()) + h + data;
}

const std::string P = "base_model.model.";

struct Synth {
    g4test::TempDir tmp;
    json cfg = {{"peft_type", "LORA"},
                {"r", 2},
                {"lora_alpha", 4},
                {"target_modules", {"q_proj"}},
                {"fan_in_fan_out", false}};
    std::map<std::string, T> ts;
    std::string cfg_text; // overrides cfg when set (raw, e.g. ordered patterns or broken JSON)
    std::string write() {
        g4test::write_file(tmp.file("adapter_config.json"), cfg_text.empty() ? cfg.dump(1) : cfg_text);
        g4test::write_file(tmp.file("adapter_model.safetensors"), safetensors_bytes(ts));
        return tmp.path;
    }
    void lora(const std::string& mod, int64_t out, int64_t in, int64_t r, uint32_t seed,
              const std::string& infix = "") {
        ts[P + mod + ".lora_A" + infix + ".weight"] = {"F32", {r, in}, randn((size_t)(r * in), seed)};
        ts[P + mod + ".lora_B" + infix + ".weight"] = {"F32", {out, r}, randn((size_t)(out * r), seed + 1)};
    }
};

// Reference merge in double: W + scale * B @ A.
std::vector<float> ref_merge(const std::vector<float>& W, const std::vector<float>& A,
                             const std::vector<float>& B, int64_t out, int64_t in, int64_t r, double scale) {
    std::vector<float> o(W.size());
    for (int64_t i = 0; i < out; ++i)
        for (int64_t j = 0; j < in; ++j) {
            double s = 0;
            for (int64_t k = 0; k < r; ++k)
                s += (double)B[i * r + k] * A[k * in + j];
            o[i * in + j] = (float)(W[i * in + j] + scale * s);
        }
    return o;
}

TEST(LoraSynthetic, AdapterNameInfixAndMerge) {
    Synth s;
    s.lora("model.layers.0.self_attn.q_proj", 6, 5, 2, 1, ".default");
    auto a = Adapter::open(s.write());
    ASSERT_EQ(a->merges().size(), 1u);
    EXPECT_EQ(a->merges()[0].module, "model.layers.0.self_attn.q_proj");
    EXPECT_EQ(a->merges()[0].out, 6);
    EXPECT_EQ(a->merges()[0].in, 5);
    EXPECT_FLOAT_EQ(a->merges()[0].scale, 2.0f);
    std::vector<float> W = randn(30, 9), w = W, bias(6);
    bool hb = true;
    EXPECT_FALSE(a->apply("model.layers.0.self_attn.k_proj.weight", {6, 5}, w.data(), &bias, &hb));
    EXPECT_EQ(a->unconsumed(), std::vector<std::string>{"model.layers.0.self_attn.q_proj"});
    ASSERT_TRUE(a->apply("model.layers.0.self_attn.q_proj.weight", {6, 5}, w.data(), &bias, &hb));
    EXPECT_FALSE(hb);
    auto want = ref_merge(W, s.ts[P + "model.layers.0.self_attn.q_proj.lora_A.default.weight"].v,
                          s.ts[P + "model.layers.0.self_attn.q_proj.lora_B.default.weight"].v, 6, 5, 2, 2.0);
    EXPECT_LT(max_abs_diff(w, want), 1e-5);
    EXPECT_TRUE(a->unconsumed().empty());
}

TEST(LoraSynthetic, LargeMergeUsesThreadsAndMatches) {
    Synth s;
    const int64_t out = 768, in = 1024, r = 16;
    s.cfg["r"]                         = r;
    s.cfg["lora_alpha"]                = 8;
    s.cfg["use_rslora"]                = true;
    s.ts[P + "m.q_proj.lora_A.weight"] = {"F32", {r, in}, randn((size_t)(r * in), 3, 0.05f)};
    s.ts[P + "m.q_proj.lora_B.weight"] = {"F32", {out, r}, randn((size_t)(out * r), 4, 0.05f)};
    auto a                             = Adapter::open(s.write());
    EXPECT_FLOAT_EQ(a->merges()[0].scale, 2.0f); // 8 / sqrt(16)
    std::vector<float> W = randn((size_t)(out * in), 5, 0.03f), w = W, bias(out);
    bool hb = false;
    ASSERT_TRUE(a->apply("m.q_proj.weight", {out, in}, w.data(), &bias, &hb));
    auto want = ref_merge(W, s.ts[P + "m.q_proj.lora_A.weight"].v, s.ts[P + "m.q_proj.lora_B.weight"].v, out,
                          in, r, 2.0);
    EXPECT_LT(max_abs_diff(w, want), 1e-6);
}

TEST(LoraSynthetic, LoraBias) {
    Synth s;
    s.cfg["lora_bias"] = true;
    s.lora("m.o_proj", 4, 3, 2, 11);
    s.ts[P + "m.o_proj.lora_B.bias"] = {"F32", {4}, {1, 2, 3, 4}};
    auto a                           = Adapter::open(s.write());
    EXPECT_TRUE(a->merges()[0].has_bias);
    std::vector<float> w(12, 0.0f), bias(4, 0.5f);
    bool hb = false;
    ASSERT_TRUE(a->apply("m.o_proj.weight", {4, 3}, w.data(), &bias, &hb));
    EXPECT_TRUE(hb);
    EXPECT_EQ(bias, (std::vector<float>{2.5f, 4.5f, 6.5f, 8.5f})); // 0.5 + 2 * b

    Synth s2; // a bias without lora_bias in the config
    s2.lora("m.o_proj", 4, 3, 2, 11);
    s2.ts[P + "m.o_proj.lora_B.bias"] = {"F32", {4}, {1, 2, 3, 4}};
    EXPECT_HAS(error_of([&] { Adapter::open(s2.write()); }), "lora_bias is false");
}

TEST(LoraSynthetic, DoraMagnitudeKeyForms) {
    for (const std::string suffix : {"", ".weight", ".default.weight", ".default"}) {
        Synth s;
        s.cfg["use_dora"] = true;
        s.lora("m.v_proj", 3, 4, 2, 21);
        std::vector<float> mag                              = {1.0f, 2.0f, 0.5f};
        s.ts[P + "m.v_proj.lora_magnitude_vector" + suffix] = {"F32", {3}, mag};
        auto a                                              = Adapter::open(s.write());
        ASSERT_TRUE(a->merges()[0].dora) << suffix;
        std::vector<float> W = randn(12, 22), w = W, bias(3);
        bool hb = false;
        ASSERT_TRUE(a->apply("m.v_proj.weight", {3, 4}, w.data(), &bias, &hb));
        auto V = ref_merge(W, s.ts[P + "m.v_proj.lora_A.weight"].v, s.ts[P + "m.v_proj.lora_B.weight"].v, 3,
                           4, 2, 2.0);
        for (int i = 0; i < 3; ++i) {
            double n = 0;
            for (int j = 0; j < 4; ++j)
                n += (double)V[i * 4 + j] * V[i * 4 + j];
            n = std::sqrt(n);
            for (int j = 0; j < 4; ++j)
                EXPECT_NEAR(w[i * 4 + j], mag[i] / n * V[i * 4 + j], 1e-5) << suffix;
        }
    }
    Synth s; // magnitude without use_dora
    s.lora("m.v_proj", 3, 4, 2, 21);
    s.ts[P + "m.v_proj.lora_magnitude_vector"] = {"F32", {3}, {1, 1, 1}};
    EXPECT_HAS(error_of([&] { Adapter::open(s.write()); }), "use_dora is false");
    Synth s2; // use_dora without magnitude
    s2.cfg["use_dora"] = true;
    s2.lora("m.v_proj", 3, 4, 2, 21);
    EXPECT_HAS(error_of([&] { Adapter::open(s2.write()); }), "no lora_magnitude_vector");
}

TEST(LoraSynthetic, ModulesToSaveInfixes) {
    Synth s;
    s.lora("model.layers.0.q_proj", 2, 2, 2, 31);
    s.ts[P + "model.embed_tokens.modules_to_save.default.weight"] = {"F32", {2, 2}, {1, 2, 3, 4}};
    s.ts[P + "lm_head.modules_to_save.weight"]                    = {"F32", {2, 2}, {5, 6, 7, 8}};
    s.ts[P + "model.norm.weight"]                                 = {"BF16", {2}, {0.5f, 1.5f}};
    auto a                                                        = Adapter::open(s.write());
    EXPECT_EQ(a->replacements(),
              (std::vector<std::string>{"lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"}));
    std::vector<float> w(4, 0.0f), b;
    bool hb = false;
    ASSERT_TRUE(a->apply("model.embed_tokens.weight", {2, 2}, w.data(), &b, &hb));
    EXPECT_EQ(w, (std::vector<float>{1, 2, 3, 4}));
    std::vector<float> n(2, 0.0f);
    ASSERT_TRUE(a->apply("model.norm.weight", {2}, n.data(), &b, &hb));
    EXPECT_EQ(n, (std::vector<float>{0.5f, 1.5f}));
    EXPECT_EQ(a->unconsumed(), (std::vector<std::string>{"lm_head.weight", "model.layers.0.q_proj"}));
}

TEST(LoraSynthetic, AliasBothDirections) {
    Synth s;
    s.lora("model.language_model.layers.0.q_proj", 2, 2, 2, 41);
    auto a = Adapter::open(s.write());
    a->set_name_alias("model.language_model.", "model.");
    std::vector<float> w(4, 0.0f), b;
    bool hb = false;
    EXPECT_TRUE(a->apply("model.layers.0.q_proj.weight", {2, 2}, w.data(), &b, &hb));
    EXPECT_TRUE(a->unconsumed().empty());

    Synth s2; // text-only adapter on a multimodal checkpoint
    s2.lora("model.layers.0.q_proj", 2, 2, 2, 41);
    auto a2 = Adapter::open(s2.write());
    a2->set_name_alias("model.", "model.language_model.");
    EXPECT_TRUE(a2->apply("model.language_model.layers.0.q_proj.weight", {2, 2}, w.data(), &b, &hb));
}

TEST(LoraSynthetic, PatternSemantics) {
    // Ordered JSON: the first matching key wins, even if a later key is more specific.
    Synth s;
    s.cfg_text = R"({"peft_type": "LORA", "r": 8, "lora_alpha": 8,
        "rank_pattern": {"q_proj": 4, "layers\\.0\\.q_proj": 2, "0.k_proj": 3},
        "alpha_pattern": {"proj": 99, "layers\\.1\\.q_proj": 12, "q_proj": 6}})";
    s.lora("m.layers.0.q_proj", 4, 4, 4, 51);  // "q_proj" first -> r 4; alpha "q_proj" -> 6
    s.lora("m.layers.1.q_proj", 4, 4, 4, 53);  // r 4; alpha 12 (before "q_proj")
    s.lora("m.layers.0.k_proj", 4, 4, 3, 55);  // "0.k_proj" on a '.' boundary -> r 3
    s.lora("m.layers.10.k_proj", 4, 4, 8, 57); // "0.k_proj" must not match "10.k_proj" -> r 8 default
    s.lora("m.layers.0.v_proj", 4, 4, 8, 59);  // "proj" never matches "v_proj" -> alpha 8
    auto a = Adapter::open(s.write());
    std::map<std::string, g4::lora::ModuleMerge> by;
    for (const auto& m : a->merges())
        by[m.module] = m;
    EXPECT_EQ(by["m.layers.0.q_proj"].r, 4);
    EXPECT_EQ(by["m.layers.0.q_proj"].alpha, 6.0f);
    EXPECT_EQ(by["m.layers.1.q_proj"].alpha, 12.0f);
    EXPECT_FLOAT_EQ(by["m.layers.1.q_proj"].scale, 3.0f);
    EXPECT_EQ(by["m.layers.0.k_proj"].r, 3);
    EXPECT_EQ(by["m.layers.10.k_proj"].r, 8);
    EXPECT_EQ(by["m.layers.0.v_proj"].alpha, 8.0f);
    EXPECT_FLOAT_EQ(by["m.layers.0.v_proj"].scale, 1.0f);
}

TEST(LoraSynthetic, RankMismatchNamesModule) {
    Synth s;
    s.cfg["rank_pattern"] = {{"o_proj", 4}};
    s.lora("m.layers.2.o_proj", 4, 4, 2, 61);
    std::string msg = error_of([&] { Adapter::open(s.write()); });
    EXPECT_HAS(msg, "m.layers.2.o_proj");
    EXPECT_HAS(msg, "r=4");
    EXPECT_HAS(msg, "rank_pattern 'o_proj'");
    Synth s2;
    s2.lora("m.q_proj", 4, 4, 3, 63);
    EXPECT_HAS(error_of([&] { Adapter::open(s2.write()); }), "has rank 3 but adapter_config.json says r=2");
}

TEST(LoraSynthetic, ShapeMismatchMessage) {
    Synth s;
    s.lora("m.q_proj", 8, 4, 2, 71);
    auto a = Adapter::open(s.write());
    std::vector<float> w(8 * 5), b(8);
    bool hb         = false;
    std::string msg = error_of([&] { a->apply("m.q_proj.weight", {8, 5}, w.data(), &b, &hb); });
    EXPECT_HAS(msg, "adapter does not fit this model: module m.q_proj has lora_B [8, 2] / lora_A [2, 4] but "
                    "the base weight is [8, 5]");
}

TEST(LoraSynthetic, ConfigErrors) {
    {
        std::string msg = error_of([&] { Adapter::open("/nonexistent/g4-adapter"); });
        EXPECT_HAS(msg, "/nonexistent/g4-adapter");
        EXPECT_HAS(msg, "does not exist");
    }
    {
        g4test::TempDir t;
        EXPECT_HAS(error_of([&] { Adapter::open(t.path); }), "adapter_config.json not found");
    }
    {
        Synth s;
        s.cfg_text = "{\"peft_type\": \"LORA\", \"r\": ";
        EXPECT_HAS(error_of([&] { Adapter::open(s.write()); }), "is not valid JSON");
    }
    {
        Synth s;
        s.lora("m.q_proj", 2, 2, 2, 1);
        s.write();
        std::remove(s.tmp.file("adapter_model.safetensors").c_str());
        EXPECT_HAS(error_of([&] { Adapter::open(s.tmp.path); }), "adapter_model.safetensors not found");
    }
    for (const char* init : {"olora", "corda", "loftq", "pissa_niter_4", "lora_ga"}) {
        Synth s;
        s.cfg["init_lora_weights"] = init;
        s.lora("m.q_proj", 2, 2, 2, 1);
        EXPECT_HAS(error_of([&] { Adapter::open(s.write()); }),
                   std::string("adapter initialised with ") + init +
                       " changes the base weights; it cannot be merged onto the original base");
    }
    for (const json& init : {json(true), json(false), json("gaussian"), json("eva"), json(nullptr)}) {
        Synth s;
        s.cfg["init_lora_weights"] = init;
        s.lora("m.q_proj", 2, 2, 2, 1);
        EXPECT_NO_THROW(Adapter::open(s.write())) << init.dump();
    }
    {
        Synth s;
        s.cfg["fan_in_fan_out"] = true;
        s.lora("m.q_proj", 2, 2, 2, 1);
        EXPECT_HAS(error_of([&] { Adapter::open(s.write()); }), "fan_in_fan_out");
    }
    {
        Synth s;
        s.cfg["peft_type"] = "LOHA";
        s.lora("m.q_proj", 2, 2, 2, 1);
        EXPECT_HAS(error_of([&] { Adapter::open(s.write()); }), "peft_type \"LOHA\" is not supported");
    }
    {
        Synth s;
        s.cfg["target_modules"] = ".*q_proj"; // a regex string is fine: targets come from the keys
        s.cfg["rank_pattern"]   = {{"(unclosed", 2}};
        s.lora("m.q_proj", 2, 2, 2, 1);
        EXPECT_HAS(error_of([&] { Adapter::open(s.write()); }),
                   "'(unclosed', which is not a valid regular expression");
    }
    {
        Synth s;
        s.cfg["alora_invocation_tokens"] = {1, 2};
        s.lora("m.q_proj", 2, 2, 2, 1);
        EXPECT_HAS(error_of([&] { Adapter::open(s.write()); }), "alora_invocation_tokens");
    }
}

TEST(LoraSynthetic, TensorErrors) {
    {
        Synth s; // lora_A without lora_B
        s.ts[P + "m.layers.3.q_proj.lora_A.weight"] = {"F32", {2, 2}, {1, 2, 3, 4}};
        std::string msg                             = error_of([&] { Adapter::open(s.write()); });
        EXPECT_HAS(msg, "m.layers.3.q_proj has lora_A but no lora_B");
    }
    {
        Synth s; // ranks disagree between A and B
        s.ts[P + "m.q_proj.lora_A.weight"] = {"F32", {2, 3}, randn(6, 1)};
        s.ts[P + "m.q_proj.lora_B.weight"] = {"F32", {4, 3}, randn(12, 2)};
        EXPECT_HAS(error_of([&] { Adapter::open(s.write()); }), "disagree on the rank");
    }
    {
        Synth s;
        s.ts[P + "model.embed_tokens.lora_embedding_A"] = {"F32", {2, 3}, randn(6, 1)};
        EXPECT_HAS(error_of([&] { Adapter::open(s.write()); }), "lora_embedding_A/B");
    }
    {
        Synth s;
        s.ts["model.q_proj.lora_A.weight"] = {"F32", {2, 3}, randn(6, 1)};
        EXPECT_HAS(error_of([&] { Adapter::open(s.write()); }), "does not start with 'base_model.model.'");
    }
    {
        Synth s;
        s.lora("m.q_proj", 2, 2, 2, 1, ".default");
        s.lora("m.k_proj", 2, 2, 2, 1, ".other");
        EXPECT_HAS(error_of([&] { Adapter::open(s.write()); }), "several adapters (default, other)");
    }
    {
        Synth s;
        EXPECT_HAS(error_of([&] { Adapter::open(s.write()); }), "holds no LoRA tensors");
    }
}

} // namespace
