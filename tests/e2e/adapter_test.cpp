// LoRA adapters and NF4 end to end: `g4 compile --adapter` against PEFT's PeftModel (float32,
// adapter unmerged) and, for NF4 plans, against HF with the merged weights replaced by their NF4
// round trip (tests/fixtures/adapters, made by tools/make_adapter_fixtures.py); a pre-quantized
// bitsandbytes base (tests/fixtures/e2b_tiny_bnb4); determinism, provenance, and bad adapters.
#include "test_util.h"

#include <filesystem>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

using json = nlohmann::json;
using namespace g4test;

std::string csv(const std::vector<int32_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i)
        s += (i ? "," : "") + std::to_string(v[i]);
    return s;
}

struct Check {
    double worst = 0;
};

// Runs every prompt of `ref_dir`/reference.json through `plan`; compares logits (key `logits_key`)
// and greedy tokens (key `greedy_key`).
void check_plan(const std::string& plan, const std::string& ref_dir, const char* logits_key,
                const char* greedy_key, double tol, const std::string& label) {
    json ref = json::parse(read_file(ref_dir + "/reference.json"));
    TempDir td;
    for (auto& p : ref.at("prompts")) {
        auto ids        = p.at("ids").get<std::vector<int32_t>>();
        std::string out = td.file("l.f32");
        CmdResult r     = run_g4("run '" + plan + "' --tokens " + csv(ids) +
                                 " -n 16 --temp 0 --ignore-eos --print-ids --dump-logits '" + out + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        auto got  = read_f32(out);
        auto want = read_f32(ref_dir + "/" + p.at(logits_key).get<std::string>());
        ASSERT_EQ(got.size(), want.size());
        double err = rel_l2(got.data(), want.data(), got.size());
        std::printf("ADAPTER %s prompt=%s %s rel_l2=%.3e\n", label.c_str(),
                    p.at("name").get<std::string>().c_str(), logits_key, err);
        EXPECT_LE(err, tol) << label << " " << p.at("name");
        EXPECT_EQ(parse_ids(r.out), p.at(greedy_key).get<std::vector<int32_t>>())
            << label << " " << p.at("name");
    }
}

std::string compile(const TempDir& td, const std::string& base, const std::string& adapter,
                    const std::string& flags, std::string* log = nullptr) {
    std::string plan = td.file("p" + std::to_string(std::rand()) + ".g4plan");
    std::string a    = adapter.empty() ? "" : " --adapter '" + fixture("adapters/" + adapter) + "'";
    CmdResult r = run_g4("compile --model '" + fixture(base) + "'" + a + " " + flags + " -o '" + plan + "'");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (log) *log = r.err;
    return plan;
}

struct AdapterCase {
    std::string adapter, base;
};
class AdapterParity : public ::testing::TestWithParam<AdapterCase> {};

TEST_P(AdapterParity, F32PlanMatchesPeftModelAndNf4PlanMatchesRoundTrippedMerge) {
    const auto c = GetParam();
    TempDir td;
    std::string ref_dir = fixture("adapters/" + c.adapter + "/reference");
    check_plan(compile(td, c.base, c.adapter, "--weights f32 --no-fidelity"), ref_dir, "logits", "greedy",
               1e-4, c.adapter + " f32");
    // NF4 plans against the reference with float32 arithmetic (--cpu-precision f32): the default int16
    // activations add their own ~5e-4 (tests/e2e/parity_test.cpp CpuPrecision).
    check_plan(compile(td, c.base, c.adapter, "--weights nf4 --cpu-precision f32 --no-fidelity"), ref_dir,
               "nf4_logits", "nf4_greedy", 1e-3, c.adapter + " nf4");
}

INSTANTIATE_TEST_SUITE_P(
    Adapters, AdapterParity,
    ::testing::Values(AdapterCase{"e2b_lora", "e2b_tiny"}, AdapterCase{"e2b_rslora_patterns", "e2b_tiny"},
                      AdapterCase{"e2b_dora", "e2b_tiny"}, AdapterCase{"e2b_modules_to_save", "e2b_tiny"},
                      AdapterCase{"e2b_modules_to_save_tied", "e2b_tiny"},
                      AdapterCase{"e2b_tower_linear", "e2b_tiny"}, AdapterCase{"e4b_lora", "e4b_tiny"}),
    [](const auto& i) { return i.param.adapter; });

TEST(Adapter, MultimodalAdapterOnTextOnlyCheckpoint) {
    TempDir td;
    check_plan(compile(td, "e2b_tiny_text", "e2b_lora", "--weights f32 --no-fidelity"),
               fixture("adapters/e2b_lora/reference"), "logits", "greedy", 1e-4, "e2b_lora on e2b_tiny_text");
}

TEST(Adapter, CompileReportAndProvenance) {
    TempDir td;
    std::string log;
    std::string plan = compile(td, "e2b_tiny", "e2b_lora", "--weights nf4", &log);
    for (const char* s : {"policy: weights nf4", "mlp_proj", "attn_proj", "weights merged in fp32", "r=8",
                          "alpha=16", "dropped model.language_model.layers.7.self_attn.k_proj", "no effect",
                          "fidelity: relative L2 logit error"})
        EXPECT_NE(log.find(s), std::string::npos) << "missing '" << s << "' in:\n" << log;
    CmdResult r = run_g4("inspect '" + plan + "' --tensors");
    ASSERT_EQ(r.exit_code, 0);
    EXPECT_NE(r.out.find("nf4    layers.3.mlp.down_proj.weight"), std::string::npos) << r.out.substr(0, 3000);
    EXPECT_NE(r.out.find("bf16   embed_tokens.weight"), std::string::npos);
    EXPECT_NE(r.out.find("bf16   layers.3.input_layernorm.weight"), std::string::npos);
    CmdResult all = run_g4("inspect '" + plan + "'");
    for (const char* s : {"provenance", "sha256", "adapter_model.safetensors", "model.safetensors",
                          "\"weights\":\"nf4\"", "g4_version"})
        EXPECT_NE(all.out.find(s), std::string::npos) << "missing '" << s << "'";
}

TEST(Adapter, PolicyFlags) {
    TempDir td;
    std::string plan = compile(td, "e2b_tiny", "", "--weights nf4 --keep 'mlp\\.down_proj' --no-fidelity");
    CmdResult r      = run_g4("inspect '" + plan + "' --tensors");
    EXPECT_NE(r.out.find("bf16   layers.3.mlp.down_proj.weight"), std::string::npos);
    EXPECT_NE(r.out.find("nf4    layers.3.mlp.up_proj.weight"), std::string::npos);
    plan = compile(td, "e2b_tiny", "",
                   "--weights bf16 --quantize 'per_layer_input_gate' --double-quant --no-fidelity");
    r    = run_g4("inspect '" + plan + "' --tensors");
    EXPECT_NE(r.out.find("nf4-dq layers.2.per_layer_input_gate.weight"), std::string::npos);
    EXPECT_NE(r.out.find("bf16   layers.2.mlp.up_proj.weight"), std::string::npos);
    CmdResult run = run_g4("run '" + plan + "' --tokens 2,5,9 -n 4 --temp 0");
    EXPECT_EQ(run.exit_code, 0) << run.err;
}

TEST(Adapter, CompileIsByteIdentical) {
    TempDir td;
    std::string a = compile(td, "e2b_tiny", "e2b_dora", "--weights nf4 --double-quant --no-fidelity");
    std::string b = compile(td, "e2b_tiny", "e2b_dora", "--weights nf4 --double-quant --no-fidelity");
    EXPECT_TRUE(read_file(a) == read_file(b));
}

TEST(Adapter, BitsandbytesNf4Base) {
    TempDir td;
    std::string ref = fixture("e2b_tiny_bnb4/reference");
    // Dequantized exactly (f32) and requantized losslessly (nf4: same codes and scales).
    check_plan(compile(td, "e2b_tiny_bnb4", "", "--weights f32 --no-fidelity"), ref, "logits", "greedy", 1e-4,
               "bnb4 f32");
    check_plan(compile(td, "e2b_tiny_bnb4", "", "--weights nf4 --cpu-precision f32 --no-fidelity"), ref,
               "logits", "greedy", 1e-4, "bnb4 nf4");
}

void expect_adapter_error(const std::string& adapter, const std::vector<std::string>& needles) {
    TempDir td;
    std::string plan = td.file("x.g4plan");
    CmdResult r =
        run_g4("compile --model '" + fixture("e2b_tiny") + "' --adapter '" + adapter + "' -o '" + plan + "'");
    EXPECT_EQ(r.exit_code, 1) << r.err;
    for (auto& n : needles)
        EXPECT_NE(r.err.find(n), std::string::npos) << "expected '" << n << "' in: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(std::filesystem::is_empty(td.path)) << "partial output left behind";
}

TEST(Adapter, BadAdapters) {
    expect_adapter_error(fixture("adapters/bad_shape"), {"does not fit", "model.language_model.layers"});
    expect_adapter_error(fixture("adapters/bad_peft_type"), {"IA3"});
    expect_adapter_error(fixture("adapters/bin_only"), {"adapter_model.bin", "safetensors"});
    expect_adapter_error(fixture("adapters/pissa"), {"pissa", "base"});
    expect_adapter_error("/nonexistent/adapter", {"/nonexistent/adapter"});
    // An adapter for another model: e4b_tiny's adapter on e2b_tiny.
    expect_adapter_error(fixture("adapters/e4b_lora"), {"does not fit"});
}

} // namespace
