// Bad input to `g4 compile` and `g4 run`: each case must exit non-zero with a one-line error that
// names the file or tensor, never crash, and never leave a partial plan behind.
#include "runtime/plan/plan_format.h"
#include "test_util.h"

#include <chrono>
#include <cmath>
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

// A safetensors file rewritten with its header padded by `pad` spaces and the length prefix `delta` off.
void repad_header(const std::string& path, size_t pad, int64_t delta) {
    std::string b = read_file(path);
    uint64_t n;
    std::memcpy(&n, b.data(), 8);
    std::string hs = b.substr(8, n);
    while (!hs.empty() && hs.back() == ' ')
        hs.pop_back();
    hs.append(pad, ' ');
    uint64_t m = uint64_t(int64_t(hs.size()) + delta);
    std::string out(8, '\0');
    std::memcpy(out.data(), &m, 8);
    write_file(path, out + hs + b.substr(8 + n));
}

// Sets element i of tensor `name` (F32 or BF16) in a safetensors file to v.
void poke(const std::string& path, const std::string& name, size_t i, float v) {
    std::string b = read_file(path);
    uint64_t n;
    std::memcpy(&n, b.data(), 8);
    json h          = json::parse(b.substr(8, n));
    const json& e   = h.at(name);
    const size_t at = 8 + n + e["data_offsets"][0].get<size_t>();
    if (e["dtype"] == "F32") {
        std::memcpy(&b[at + 4 * i], &v, 4);
    } else {
        uint32_t u;
        std::memcpy(&u, &v, 4);
        const uint16_t bf = uint16_t(u >> 16);
        std::memcpy(&b[at + 2 * i], &bf, 2);
    }
    write_file(path, b);
}

// Runs `g4 compile` expecting failure; checks the message and that no plan (or temp file) remains.
void expect_compile_error(const std::string& model_dir, const std::vector<std::string>& needles,
                          const std::string& extra = "") {
    TempDir out;
    std::string plan = out.file("p.g4plan");
    CmdResult r =
        run_g4("compile --model '" + model_dir + "' --weights bf16 " + extra + " -o '" + plan + "'");
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("error:"), std::string::npos) << r.err;
    for (auto& n : needles)
        EXPECT_NE(r.err.find(n), std::string::npos) << "expected '" << n << "' in: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "not one line: " << r.err;
    EXPECT_TRUE(fs::is_empty(out.path)) << "compile left files behind";
}

TEST(BadInput, MissingSafetensors) {
    CheckpointCopy c;
    fs::remove(c.st());
    expect_compile_error(c.dir, {"model.safetensors", c.dir});
}

TEST(BadInput, MissingModelDirectory) {
    expect_compile_error("/nonexistent/g4/model", {"/nonexistent/g4/model"});
}

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
    json cfg                                = json::parse(read_file(c.dir + "/config.json"));
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
    edit_header(c.st(), [&](json& h) { // renamed: its bytes stay covered, as in a valid file
        h["unrelated.scalar"] = h[victim];
        h.erase(victim);
    });
    expect_compile_error(c.dir, {"missing tensor", victim});
}

TEST(BadInput, BadOptions) {
    expect_compile_error(fixture("e2b_tiny"), {"/nonexistent-adapter"}, "--adapter /nonexistent-adapter");
    expect_compile_error(fixture("e2b_tiny"), {"--device 'cuda:x'"}, "--device cuda:x");
    expect_compile_error(fixture("e2b_tiny"), {"--target", "--device cuda"}, "--target sm_90");
    expect_compile_error(fixture("e2b_tiny"), {"--weights", "int8"}, "--weights int8");
    expect_compile_error(fixture("e2b_tiny"), {"--quantize", "regular expression"}, "--quantize '('");
    expect_compile_error(fixture("e2b_tiny"), {"embed_tokens", "embedding lookup"},
                         "--quantize embed_tokens");
    expect_compile_error(fixture("e2b_tiny"), {"--max-context", "max_position_embeddings"},
                         "--max-context 99999999");
    expect_compile_error(fixture("e2b_tiny"), {"unknown --kv-dtype 'f16'", "expected bf16 or f32"},
                         "--kv-dtype f16");
}

// CUDA plans compile anywhere the CUDA toolkit's NVRTC is (CI too); without a GPU, running one is a
// clear error, and a GPU that is not there cannot choose the target.
TEST(BadInput, CudaPlanWithoutGpu) {
    TempDir td;
    std::string plan = td.file("cuda.g4plan");
    CmdResult c      = run_g4("compile --model '" + fixture("e2b_tiny") +
                              "' --device cuda --target sm_86 --no-fidelity -o '" + plan + "'");
    if (c.exit_code != 0 && c.err.find("without the CUDA toolkit") != std::string::npos)
        GTEST_SKIP() << "built without NVRTC";
    ASSERT_EQ(c.exit_code, 0) << c.err;
    CmdResult i = run_g4("inspect '" + plan + "'");
    EXPECT_NE(i.out.find("device cuda"), std::string::npos);
    // The fixture has 4 query heads on one KV head: the decode attention kernels are compiled for that.
    EXPECT_NE(
        i.out.find("CUDA kernels: sm_86 cubin + PTX; decode attention specialised for 4 heads per KV group"),
        std::string::npos)
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
    CmdResult c32 =
        run_g4("compile --model '" + fixture("e2b_tiny") +
               "' --device cuda --target sm_86 --no-fidelity --prefill-precision fp32 -o '" + plan32 + "'");
    ASSERT_EQ(c32.exit_code, 0) << c32.err;
    CmdResult i32 = run_g4("inspect '" + plan32 + "'");
    EXPECT_NE(i32.out.find("attention 0 flash (tensor cores), 10 split"), std::string::npos) << i32.out;
    // sm_90: each layer's gate/up + down becomes one MLP launch (10 layers), its down weight stored tiled;
    // --deterministic keeps the two GEMVs (and the attention merge kernel).
    for (bool det : {false, true}) {
        std::string p90 = td.file(det ? "det90.g4plan" : "cuda90.g4plan");
        CmdResult c90   = run_g4("compile --model '" + fixture("e2b_tiny") +
                                 "' --device cuda --target sm_90 --no-fidelity" +
                                 (det ? " --deterministic" : "") + " -o '" + p90 + "'");
        ASSERT_EQ(c90.exit_code, 0) << c90.err;
        CmdResult i90 = run_g4("inspect '" + p90 + "'");
        EXPECT_NE(i90.out.find(det ? "31 ResNorm, 0 MLP" : "31 ResNorm, 10 MLP"), std::string::npos)
            << i90.out;
        // The full-attention layers' o projection takes the attention's merge (the sliding layers' head dim
        // 16 is not a multiple of the kernel's 32 columns a block).
        // Their products are packed f16 (the default --mlp-precision), and they run the ResNorm before them.
        EXPECT_NE(i90.out.find(det ? "0 MLP (gate/up + down in one kernel; 0 with packed-f16 products, 0 "
                                     "with the ResNorm before, which is "
                                     "then not launched), 0 attention-o"
                                   : "10 MLP (gate/up + down in one kernel; 10 with packed-f16 products, 10 "
                                     "with the ResNorm before, which "
                                     "is then not launched), 2 attention-o"),
                  std::string::npos)
            << i90.out;
        EXPECT_NE(i90.out.find(det ? "one kernel), 0 PLE" : "one kernel), 10 PLE"), std::string::npos)
            << i90.out;
    }
    EXPECT_NE(i.out.find("31 ResNorm, 0 MLP"), std::string::npos) << "sm_86 keeps the two GEMVs: " << i.out;
    EXPECT_NE(i.out.find("0 with packed-f16 products, 0 with the ResNorm before, which is then not "
                         "launched), 0 attention-o"),
              std::string::npos)
        << "sm_86 keeps the merge kernel: " << i.out;
    CmdResult r = run_g4("run '" + plan + "' --tokens 2,3 -n 2");
    if (r.exit_code == 0) GTEST_SKIP() << "this machine has a GPU";
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("sm_86"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--device cpu"), std::string::npos) << r.err;
    expect_compile_error(fixture("e2b_tiny"), {"sm_75"}, "--device cuda --target sm_75");
}

// The safetensors library rejects a header length one short (padding absorbs it, the data start a byte
// early).
TEST(BadInput, HeaderLengthOffByOne) {
    CheckpointCopy c;
    repad_header(c.st(), 16, -1);
    expect_compile_error(c.dir, {"model.safetensors", "its tensors cover"});
}

// A valid header of any length: tensors at odd addresses of the mapped file compile to the same model.
TEST(BadInput, UnalignedCheckpointCompilesTheSame) {
    CheckpointCopy c;
    std::string b = read_file(c.st());
    uint64_t n;
    std::memcpy(&n, b.data(), 8);
    size_t pad = 0;
    while ((8 + n + pad) % 8 != 1)
        ++pad;
    repad_header(c.st(), pad + (n - json::parse(b.substr(8, n)).dump().size()), 0);
    TempDir out;
    const std::string p1 = out.file("a.g4plan"), p2 = out.file("b.g4plan");
    CmdResult r1 = run_g4("compile --model '" + c.dir + "' --weights bf16 -o '" + p1 + "'");
    ASSERT_EQ(r1.exit_code, 0) << r1.err;
    CmdResult r2 = run_g4("compile --model '" + fixture("e2b_tiny") + "' --weights bf16 -o '" + p2 + "'");
    ASSERT_EQ(r2.exit_code, 0) << r2.err;
    CmdResult g1 = run_g4("run '" + p1 + "' --tokens 2,17,40 -n 6 --temp 0 --print-ids");
    CmdResult g2 = run_g4("run '" + p2 + "' --tokens 2,17,40 -n 6 --temp 0 --print-ids");
    ASSERT_EQ(g1.exit_code, 0) << g1.err;
    EXPECT_FALSE(g1.out.empty());
    EXPECT_EQ(g1.out, g2.out);
}

TEST(BadInput, NonFiniteBaseWeights) {
    const std::string norm = "model.language_model.norm.weight",
                      q    = "model.language_model.layers.2.self_attn.q_proj.weight";
    { // stored as it is (bf16 to bf16)
        CheckpointCopy c;
        poke(c.st(), norm, 5, std::nanf(""));
        expect_compile_error(c.dir, {norm, "NaN or infinity at element 5"});
    }
    { // converted (quantized to NF4)
        CheckpointCopy c;
        poke(c.st(), q, 7, INFINITY);
        TempDir out;
        CmdResult r =
            run_g4("compile --model '" + c.dir + "' --weights nf4 -o '" + out.file("p.g4plan") + "'");
        EXPECT_EQ(r.exit_code, 1) << r.err;
        EXPECT_NE(r.err.find(q + "' in " + c.st() + " holds a NaN or infinity at element 7"),
                  std::string::npos)
            << r.err;
        EXPECT_TRUE(fs::is_empty(out.path));
    }
    { // a vision tower weight
        CheckpointCopy c;
        const std::string v = "model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight";
        poke(c.st(), v, 0, -INFINITY);
        expect_compile_error(c.dir, {v, "NaN or infinity"});
    }
}

TEST(BadInput, NonFiniteAdapter) {
    auto adapter = [](const TempDir& td) {
        std::string dir = td.file("adapter");
        fs::create_directory(dir);
        for (auto& e : fs::directory_iterator(fixture("adapters/e2b_lora")))
            if (e.is_regular_file()) fs::copy_file(e.path(), dir + "/" + e.path().filename().string());
        return dir;
    };
    const std::string a = "base_model.model.model.language_model.layers.0.mlp.down_proj.lora_A.weight";
    const std::string b = "base_model.model.model.language_model.layers.0.mlp.down_proj.lora_B.weight";
    {
        TempDir td;
        std::string dir = adapter(td);
        poke(dir + "/adapter_model.safetensors", a, 3, std::nanf(""));
        expect_compile_error(fixture("e2b_tiny"),
                             {"adapter_model.safetensors", a, "NaN or infinity at element 3"},
                             "--adapter '" + dir + "'");
    }
    { // finite factors whose product overflows float32 in the merge
        TempDir td;
        std::string dir = adapter(td);
        for (size_t i = 0; i < 64; ++i) {
            poke(dir + "/adapter_model.safetensors", a, i, 3e38f);
            poke(dir + "/adapter_model.safetensors", b, i, 3e38f);
        }
        expect_compile_error(
            fixture("e2b_tiny"),
            {"adapter_model.safetensors", "model.language_model.layers.0.mlp.down_proj", "non-finite"},
            "--adapter '" + dir + "'");
    }
}

// Finite weights whose activations overflow: the fidelity figure is never printed as NaN, and no plan is
// kept.
TEST(BadInput, FidelityNeverReportsNonFinite) {
    CheckpointCopy c;
    for (size_t i = 0; i < 64; ++i)
        poke(c.st(), "model.language_model.norm.weight", i, 3e38f);
    TempDir out;
    CmdResult r = run_g4("compile --model '" + c.dir + "' --weights nf4 -o '" + out.file("p.g4plan") + "'");
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(r.err.find("nan"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("fidelity check"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("not finite"), std::string::npos) << r.err;
    EXPECT_TRUE(fs::is_empty(out.path));
}

TEST(BadInput, DeeplyNestedJson) {
    const std::string deep = std::string(70000, '[') + std::string(70000, ']');
    {
        CheckpointCopy c;
        json cfg                        = json::parse(read_file(c.dir + "/config.json"));
        cfg["vision_config"]["hostile"] = "X";
        std::string t                   = cfg.dump();
        t.replace(t.find("\"X\""), 3, deep);
        write_file(c.dir + "/config.json", t);
        expect_compile_error(c.dir, {"config.json", "JSON nests deeper than"});
    }
    {
        CheckpointCopy c;
        std::string t = read_file(c.dir + "/tokenizer.json");
        t.insert(t.rfind('}'), ", \"hostile\": " + deep);
        write_file(c.dir + "/tokenizer.json", t);
        expect_compile_error(c.dir, {"tokenizer.json", "JSON nests deeper than"});
    }
    {
        CheckpointCopy c;
        write_file(c.dir + "/generation_config.json", "{\"x\": " + deep + "}");
        expect_compile_error(c.dir, {"generation_config.json", "JSON nests deeper than"});
    }
}

TEST(BadInput, TokenizerIdFarPastTheVocab) {
    CheckpointCopy c;
    json t                      = json::parse(read_file(c.dir + "/tokenizer.json"));
    t["model"]["vocab"]["zzzz"] = 1 << 28;
    write_file(c.dir + "/tokenizer.json", t.dump());
    const auto t0 = std::chrono::steady_clock::now();
    expect_compile_error(c.dir, {"tokenizer.json", "vocab id 268435456 of 'zzzz'"});
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
}

TEST(BadInput, NoPartialPlanWhenOutputDirectoryMissing) {
    CmdResult r = run_g4("compile --model '" + fixture("e2b_tiny") + "' -o /nonexistent-dir/p.g4plan");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("/nonexistent-dir/p.g4plan"), std::string::npos) << r.err;
}

class RunBadInput : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_        = new TempDir();
        plan_       = dir_->file("good.g4plan");
        CmdResult r = run_g4("compile --model '" + fixture("e2b_tiny") + "' -o '" + plan_ + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    static void TearDownTestSuite() { delete dir_; }
    static void expect_run_error(const std::string& plan, const std::string& args,
                                 const std::vector<std::string>& needles, int code = 1) {
        CmdResult r = run_g4("run '" + plan + "' " + args);
        EXPECT_EQ(r.exit_code, code) << r.err;
        for (auto& n : needles)
            EXPECT_NE(r.err.find(n), std::string::npos) << "expected '" << n << "' in: " << r.err;
        EXPECT_TRUE(r.out.empty()) << r.out;
    }
    static TempDir* dir_;
    static std::string plan_;
};
TempDir* RunBadInput::dir_ = nullptr;
std::string RunBadInput::plan_;

TEST_F(RunBadInput, TokenIdOutsideVocabulary) {
    expect_run_error(plan_, "--tokens 2,512", {"512", "vocabulary"});
}

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

// Media files: every defect a one-line error naming the file, never a signal; `g4 chat` reports it and goes
// on.
TEST_F(RunBadInput, MediaFiles) {
    auto le16 = [](uint32_t v) { return std::string{char(v & 255), char(v >> 8)}; };
    auto le32 = [&](uint32_t v) { return le16(v & 0xFFFF) + le16(v >> 16); };
    // block_align 0 and a streamed data size: 44 bytes.
    const std::string fmt = le16(1) + le16(1) + le32(16000) + le32(0) + le16(0) + le16(16);
    const std::string wav = "RIFF" + le32(36) + "WAVE" + "fmt " + le32(16) + fmt + "data" + le32(0xFFFFFFFFu);
    ASSERT_EQ(wav.size(), 44u);
    const std::string bad_wav = dir_->file("block0.wav");
    write_file(bad_wav, wav);
    expect_run_error(plan_, "--tokens 2,3 -n 1 --audio '" + bad_wav + "'", {bad_wav, "block size 0"});
    expect_run_error(plan_, "--tokens 2,3 -n 1 --audio '" + dir_->path + "'", {dir_->path, "is a directory"});
    expect_run_error(plan_, "--tokens 2,3 -n 1 --image '" + dir_->path + "'", {dir_->path, "is a directory"});
    expect_run_error(plan_, "--tokens 2,3 -n 1 --image '" + dir_->file("none.png") + "'",
                     {dir_->file("none.png"), "No such file"});
    expect_run_error(plan_, "--tokens 2,3 -n 1 --audio '" + dir_->file("none.wav") + "'",
                     {dir_->file("none.wav"), "No such file"});
    // 275 bytes declaring 20000x20000: refused from the header, at once.
    const std::string pgm = dir_->file("huge.pgm");
    write_file(pgm, "P5 20000 20000 255\n" + std::string(256, '\x7f'));
    const auto t0 = std::chrono::steady_clock::now();
    expect_run_error(plan_, "--tokens 2,3 -n 1 --image '" + pgm + "'",
                     {pgm, "20000x20000 pixels, more than the limit"});
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
    // A 16-bit PPM past 200x200 runs (on e2b_tiny_mm, whose image tokens are in its vocabulary).
    const std::string mm = dir_->file("mm.g4plan");
    CmdResult c          = run_g4("compile --model '" + fixture("e2b_tiny_mm") +
                                  "' --weights f32 --image-tokens 70 -o '" + mm + "'");
    ASSERT_EQ(c.exit_code, 0) << c.err;
    const std::string ppm = dir_->file("deep.ppm");
    std::string px        = "P6 211 203 65535\n";
    for (int i = 0; i < 211 * 203 * 3; ++i)
        px += std::string{char((i * 7) & 255), char((i * 13) & 255)};
    write_file(ppm, px);
    CmdResult ok = run_g4("run '" + mm + "' --tokens 2,3 -n 1 --temp 0 --image '" + ppm + "'");
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
    // g4 chat: the undecodable clip is reported, the conversation goes on.
    CmdResult chat = run_cmd("(printf '/audio " + bad_wav + "\\nHi\\n/exit\\n' | '" + cli_path() +
                             "' chat '" + mm + "' -n 4 --temp 0)");
    EXPECT_EQ(chat.exit_code, 0) << chat.err;
    EXPECT_NE(chat.err.find(bad_wav), std::string::npos) << chat.err;
    EXPECT_NE(chat.err.find("block size 0"), std::string::npos) << chat.err;
    EXPECT_FALSE(chat.out.empty());
}

// A META field of another type than g4 writes: `g4 inspect` and `g4 run` name the plan and the field.
TEST_F(RunBadInput, WrongTypedMetaField) {
    auto rewrite = [&](const std::string& from, const std::string& to) {
        std::string b = read_file(plan_);
        g4::plan::PlanHeader h;
        std::memcpy(&h, b.data(), sizeof h);
        for (uint32_t i = 0; i < h.section_count; ++i) {
            g4::plan::PlanSection sec;
            const size_t at = h.section_table_offset + i * sizeof sec;
            std::memcpy(&sec, b.data() + at, sizeof sec);
            if (sec.kind != (uint32_t)g4::plan::SectionKind::Meta) continue;
            std::string meta = b.substr(sec.offset, sec.size);
            const size_t k   = meta.find(from);
            EXPECT_NE(k, std::string::npos) << from;
            EXPECT_EQ(from.size(), to.size());
            meta.replace(k, from.size(), to);
            b.replace(sec.offset, sec.size, meta);
        }
        reseal_plan(&b);
        const std::string p = dir_->file("meta.g4plan");
        write_file(p, b);
        return p;
    };
    std::string p = rewrite("\"weights_dtype\": \"nf4\"", "\"weights_dtype\": 12345");
    CmdResult r   = run_g4("inspect '" + p + "'");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("plan " + p + ": META field weights_dtype: expected a string, got 12345"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    p = rewrite("\"max_rows\": 256,", "\"max_rows\":\"25\",");
    expect_run_error(p, "--tokens 2,3", {p, "META field max_rows: expected an integer"});
}

TEST_F(RunBadInput, DumpLogitsToUnwritablePath) {
    expect_run_error(plan_, "--tokens 2,3 --dump-logits /nonexistent-dir/x.f32", {"/nonexistent-dir/x.f32"});
}

} // namespace
