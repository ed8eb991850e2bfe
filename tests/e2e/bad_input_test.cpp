// Bad input to `g4 compile` and `g4 run`: each case must exit non-zero with a one-line error that
// names the file or tensor, never crash, and never leave a partial plan behind.
#include "test_util.h"

#include <cstring>
#include <filesystem>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

using json = nlohmann::json;
using namespace g4test;
namespace fs = std::filesystem;

// A writable copy of a fixture checkpoint.
struct CheckpointCopy {
    TempDir td;
    std::string dir;
    explicit CheckpointCopy(const std::string& name = "e2b_tiny") {
        dir = td.file("model");
        fs::create_directory(dir);
        for (auto& e : fs::directory_iterator(fixture(name)))
            if (e.is_regular_file()) fs::copy_file(e.path(), dir + "/" + e.path().filename().string());
    }
    std::string st() const { return dir + "/model.safetensors"; }
};

// Rewrites a safetensors header through `edit`, keeping the data section as is.
template <class F> void edit_header(const std::string& path, F&& edit) {
    std::string b = read_file(path);
    uint64_t n;
    std::memcpy(&n, b.data(), 8);
    json h = json::parse(b.substr(8, n));
    edit(h);
    std::string hs = h.dump();
    uint64_t m     = hs.size();
    std::string out(8, '\0');
    std::memcpy(out.data(), &m, 8);
    write_file(path, out + hs + b.substr(8 + n));
}

// Runs `g4 compile` expecting failure; checks the message and that no plan (or temp file) remains.
void expect_compile_error(const std::string& model_dir, const std::vector<std::string>& needles, const std::string& extra = "") {
    TempDir out;
    std::string plan = out.file("p.g4plan");
    CmdResult r      = run_g4("compile --model '" + model_dir + "' --weights bf16 " + extra + " -o '" + plan + "'");
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("error:"), std::string::npos) << r.err;
    for (auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "expected '" << n << "' in: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "not one line: " << r.err;
    EXPECT_TRUE(fs::is_empty(out.path)) << "compile left files behind";
}

TEST(BadInput, MissingSafetensors) {
    CheckpointCopy c;
    fs::remove(c.st());
    expect_compile_error(c.dir, {"model.safetensors", c.dir});
}

TEST(BadInput, MissingModelDirectory) { expect_compile_error("/nonexistent/g4/model", {"/nonexistent/g4/model"}); }

TEST(BadInput, TruncatedSafetensors) {
    CheckpointCopy c;
    std::string b = read_file(c.st());
    write_file(c.st(), b.substr(0, b.size() / 2));
    expect_compile_error(c.dir, {"model.safetensors"});
}

TEST(BadInput, HeaderLengthOutsideFile) {
    CheckpointCopy c;
    std::string b = read_file(c.st());
    uint64_t huge = b.size() + 1000;
    std::memcpy(b.data(), &huge, 8);
    write_file(c.st(), b);
    expect_compile_error(c.dir, {"model.safetensors"});
}

TEST(BadInput, TensorOffsetOutsideFile) {
    CheckpointCopy c;
    std::string victim = "model.language_model.norm.weight";
    edit_header(c.st(), [&](json& h) {
        auto& o = h[victim]["data_offsets"];
        o[0]    = 1ull << 40;
        o[1]    = (1ull << 40) + 128;
    });
    expect_compile_error(c.dir, {"model.safetensors", victim});
}

TEST(BadInput, ShapeDisagreesWithConfig) {
    CheckpointCopy c;
    json cfg = json::parse(read_file(c.dir + "/config.json"));
    cfg["text_config"]["intermediate_size"] = 100;
    write_file(c.dir + "/config.json", cfg.dump());
    expect_compile_error(c.dir, {"mlp.gate_proj.weight", "config.json"});
}

TEST(BadInput, CorruptConfigJson) {
    CheckpointCopy c;
    write_file(c.dir + "/config.json", "{\"model_type\": \"gemma4\", \"text_config\": {");
    expect_compile_error(c.dir, {"config.json", "corrupt JSON"});
}

TEST(BadInput, UnknownArchitecture) {
    CheckpointCopy c;
    json cfg          = json::parse(read_file(c.dir + "/config.json"));
    cfg["model_type"] = "llama";
    write_file(c.dir + "/config.json", cfg.dump());
    expect_compile_error(c.dir, {"llama", "unsupported architecture"});
}

TEST(BadInput, MissingTensor) {
    CheckpointCopy c;
    std::string victim = "model.language_model.layers.3.layer_scalar";
    edit_header(c.st(), [&](json& h) { h.erase(victim); });
    expect_compile_error(c.dir, {"missing tensor", victim});
}

TEST(BadInput, BadOptions) {
    expect_compile_error(fixture("e2b_tiny"), {"/nonexistent-adapter"}, "--adapter /nonexistent-adapter");
    expect_compile_error(fixture("e2b_tiny"), {"--device 'cuda:x'"}, "--device cuda:x");
    expect_compile_error(fixture("e2b_tiny"), {"--target", "--device cuda"}, "--target sm_90");
    expect_compile_error(fixture("e2b_tiny"), {"--weights", "int8"}, "--weights int8");
    expect_compile_error(fixture("e2b_tiny"), {"--quantize", "regular expression"}, "--quantize '('");
    expect_compile_error(fixture("e2b_tiny"), {"embed_tokens", "embedding lookup"}, "--quantize embed_tokens");
    expect_compile_error(fixture("e2b_tiny"), {"--max-context", "max_position_embeddings"}, "--max-context 99999999");
    expect_compile_error(fixture("e2b_tiny"), {"unknown --kv-dtype 'f16'", "expected bf16 or f32"}, "--kv-dtype f16");
}

// CUDA plans compile anywhere the CUDA toolkit's NVRTC is (CI too); without a GPU, running one is a
// clear error, and a GPU that is not there cannot choose the target.
TEST(BadInput, CudaPlanWithoutGpu) {
    TempDir td;
    std::string plan = td.file("cuda.g4plan");
    CmdResult c = run_g4("compile --model '" + fixture("e2b_tiny") + "' --device cuda --target sm_86 --no-fidelity -o '" + plan + "'");
    if (c.exit_code != 0 && c.err.find("without the CUDA toolkit") != std::string::npos) GTEST_SKIP() << "built without NVRTC";
    ASSERT_EQ(c.exit_code, 0) << c.err;
    CmdResult i = run_g4("inspect '" + plan + "'");
    EXPECT_NE(i.out.find("device cuda"), std::string::npos);
    // The fixture has 4 query heads on one KV head: the decode attention kernels are compiled for that.
    EXPECT_NE(i.out.find("CUDA kernels: sm_86 cubin + PTX; decode attention specialised for 4 heads per KV group"), std::string::npos)
        << i.out;
    // Every residual/norm chain (3 per layer, 10 layers) becomes one ResNorm launch of the decode schedule,
    // and so does the first layer's input norm, which no residual add precedes.
    EXPECT_NE(i.out.find(", 31 ResNorm"), std::string::npos) << i.out;
    // The sliding layers' q/k/v post-projection runs in their decode attention kernel (QkvAttn, KV-shared
    // layers too); the 2 full-attention layers keep QkvPost.
    EXPECT_NE(i.out.find("2 QkvPost, 8 QkvPost+attention"), std::string::npos) << i.out;
    // bf16 prefill (the default): every attention op takes the tensor-core flash kernel; fp32 prefill
    // keeps the exact split-over-keys kernel, whose scores workspace grows with chunk x context.
    EXPECT_NE(i.out.find("attention 10 flash (tensor cores), 0 split"), std::string::npos) << i.out;
    std::string plan32 = td.file("cuda32.g4plan");
    CmdResult c32 = run_g4("compile --model '" + fixture("e2b_tiny") + "' --device cuda --target sm_86 --no-fidelity --prefill-precision fp32 -o '" + plan32 + "'");
    ASSERT_EQ(c32.exit_code, 0) << c32.err;
    CmdResult i32 = run_g4("inspect '" + plan32 + "'");
    EXPECT_NE(i32.out.find("attention 0 flash (tensor cores), 10 split"), std::string::npos) << i32.out;
    // sm_90: each layer's gate/up + down becomes one MLP launch (10 layers), its down weight stored tiled;
    // --deterministic keeps the two GEMVs (and the attention merge kernel).
    for (bool det : {false, true}) {
        std::string p90 = td.file(det ? "det90.g4plan" : "cuda90.g4plan");
        CmdResult c90 = run_g4("compile --model '" + fixture("e2b_tiny") + "' --device cuda --target sm_90 --no-fidelity" +
                               (det ? " --deterministic" : "") + " -o '" + p90 + "'");
        ASSERT_EQ(c90.exit_code, 0) << c90.err;
        CmdResult i90 = run_g4("inspect '" + p90 + "'");
        EXPECT_NE(i90.out.find(det ? "31 ResNorm, 0 MLP" : "31 ResNorm, 10 MLP"), std::string::npos) << i90.out;
        // The full-attention layers' o projection takes the attention's merge (the sliding layers' head dim
        // 16 is not a multiple of the kernel's 32 columns a block).
        // Their products are packed f16 (the default --mlp-precision), and they run the ResNorm before them.
        EXPECT_NE(i90.out.find(det ? "0 MLP (gate/up + down in one kernel; 0 with packed-f16 products, 0 with the ResNorm before, which is "
                                     "then not launched), 0 attention-o"
                                   : "10 MLP (gate/up + down in one kernel; 10 with packed-f16 products, 10 with the ResNorm before, which "
                                     "is then not launched), 2 attention-o"),
                  std::string::npos)
            << i90.out;
        EXPECT_NE(i90.out.find(det ? "one kernel), 0 PLE" : "one kernel), 10 PLE"), std::string::npos) << i90.out;
    }
    EXPECT_NE(i.out.find("31 ResNorm, 0 MLP"), std::string::npos) << "sm_86 keeps the two GEMVs: " << i.out;
    EXPECT_NE(i.out.find("0 with packed-f16 products, 0 with the ResNorm before, which is then not launched), 0 attention-o"), std::string::npos) << "sm_86 keeps the merge kernel: " << i.out;
    CmdResult r = run_g4("run '" + plan + "' --tokens 2,3 -n 2");
    if (r.exit_code == 0) GTEST_SKIP() << "this machine has a GPU";
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("sm_86"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--device cpu"), std::string::npos) << r.err;
    expect_compile_error(fixture("e2b_tiny"), {"sm_75"}, "--device cuda --target sm_75");
}

TEST(BadInput, NoPartialPlanWhenOutputDirectoryMissing) {
    CmdResult r = run_g4("compile --model '" + fixture("e2b_tiny") + "' -o /nonexistent-dir/p.g4plan");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("/nonexistent-dir/p.g4plan"), std::string::npos) << r.err;
}

class RunBadInput : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_  = new TempDir();
        plan_ = dir_->file("good.g4plan");
        CmdResult r = run_g4("compile --model '" + fixture("e2b_tiny") + "' -o '" + plan_ + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    static void TearDownTestSuite() { delete dir_; }
    static void expect_run_error(const std::string& plan, const std::string& args, const std::vector<std::string>& needles,
                                 int code = 1) {
        CmdResult r = run_g4("run '" + plan + "' " + args);
        EXPECT_EQ(r.exit_code, code) << r.err;
        for (auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "expected '" << n << "' in: " << r.err;
        EXPECT_TRUE(r.out.empty()) << r.out;
    }
    static TempDir* dir_;
    static std::string plan_;
};
TempDir* RunBadInput::dir_ = nullptr;
std::string RunBadInput::plan_;

TEST_F(RunBadInput, TokenIdOutsideVocabulary) { expect_run_error(plan_, "--tokens 2,512", {"512", "vocabulary"}); }

TEST_F(RunBadInput, MalformedTokens) {
    expect_run_error(plan_, "--tokens 2,,3", {"--tokens"}, 2);
    expect_run_error(plan_, "--tokens 2,x", {"--tokens"}, 2);
    expect_run_error(plan_, "", {"--tokens"}, 2);
}

TEST_F(RunBadInput, TruncatedPlan) {
    std::string p = dir_->file("trunc.g4plan");
    std::string b = read_file(plan_);
    for (size_t keep : {size_t(10), size_t(200), b.size() / 2, b.size() - 1}) {
        write_file(p, b.substr(0, keep));
        expect_run_error(p, "--tokens 2,3", {p});
    }
}

TEST_F(RunBadInput, CorruptPlan) {
    std::string p = dir_->file("corrupt.g4plan");
    std::string b = read_file(plan_);
    // Flip bytes in the header, in the metadata/op sections (first pages after the header).
    for (size_t off : {size_t(0), size_t(20), size_t(4096 + 3), size_t(3 * 4096 + 50)}) {
        std::string c = b;
        c[off] ^= 0x5A;
        write_file(p, c);
        expect_run_error(p, "--tokens 2,3", {p});
    }
    // Weight corruption is found by `g4 inspect --verify`.
    std::string c = b;
    c[c.size() - 7] ^= 0x01;
    write_file(p, c);
    CmdResult r = run_g4("inspect '" + p + "' --verify");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("weights"), std::string::npos) << r.err;
    EXPECT_EQ(run_g4("inspect '" + plan_ + "' --verify").exit_code, 0);
}

TEST_F(RunBadInput, NotAPlan) {
    std::string p = dir_->file("text.g4plan");
    write_file(p, std::string(5000, 'x'));
    expect_run_error(p, "--tokens 2", {"not a g4 plan"});
    expect_run_error(dir_->file("missing.g4plan"), "--tokens 2", {"missing.g4plan"});
}

TEST_F(RunBadInput, DumpLogitsToUnwritablePath) {
    expect_run_error(plan_, "--tokens 2,3 --dump-logits /nonexistent-dir/x.f32", {"/nonexistent-dir/x.f32"});
}

} // namespace
