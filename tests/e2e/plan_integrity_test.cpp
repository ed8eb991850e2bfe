// Plans refused at open when a record is wrong (checksums recomputed, so only validation can catch it),
// per-section integrity checks, outputs replaced atomically (and non-regular targets refused), a failing
// compile leaving the previous plan at -o untouched, plans that compile but could never run (window
// above the context, bad generation_config.json), sampling values checked before any work, and every op's
// parameters edited outside the values its definition declares.
#include "g4/g4.h"
#include "runtime/plan/op_params.h"
#include "runtime/plan/plan_reader.h"
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <gtest/gtest.h>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

namespace {

using namespace g4test;
namespace fs = std::filesystem;
using g4::plan::PlanOp;
using g4::plan::PlanTensor;
using g4::plan::SectionKind;

class PlanIntegrity : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_  = new TempDir();
        plan_ = dir_->file("good.g4plan");
        CmdResult r =
            run_g4("compile --model '" + fixture("e2b_tiny") + "' --no-fidelity -o '" + plan_ + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    static void TearDownTestSuite() { delete dir_; }

    // Index of the op / tensor named `name` in the good plan.
    static size_t op_index(const std::string& name) {
        g4::plan::Plan p;
        std::string err;
        EXPECT_EQ(p.load(plan_, false, &err), G4_OK) << err;
        for (size_t i = 0; i < p.n_ops(); ++i)
            if (name == p.str(p.op(i).name)) return i;
        ADD_FAILURE() << "no op " << name;
        return 0;
    }
    static size_t tensor_index(const std::string& name) {
        g4::plan::Plan p;
        std::string err;
        EXPECT_EQ(p.load(plan_, false, &err), G4_OK) << err;
        for (size_t i = 0; i < p.n_tensors(); ++i)
            if (name == p.str(p.tensor(i).name)) return i;
        ADD_FAILURE() << "no tensor " << name;
        return 0;
    }
    // A copy of the good plan with one record patched by `edit` and every checksum recomputed.
    template <class T, class Edit>
    static std::string patched(const std::string& name, SectionKind kind, size_t index, Edit edit) {
        std::string b          = read_file(plan_);
        const auto [off, size] = plan_section(b, (uint32_t)kind);
        EXPECT_LT((index + 1) * sizeof(T), size + 1);
        T rec;
        std::memcpy(&rec, b.data() + off + index * sizeof(T), sizeof rec);
        edit(rec);
        std::memcpy(b.data() + off + index * sizeof(T), &rec, sizeof rec);
        reseal_plan(&b);
        const std::string path = dir_->file(name + ".g4plan");
        write_file(path, b);
        return path;
    }
    // The patched plan is refused by the reader, by `g4 inspect --verify` and by `g4 run`, each naming
    // `want`.
    static void expect_refused(const std::string& path, const std::vector<std::string>& want) {
        g4::plan::Plan p;
        std::string err;
        EXPECT_EQ(p.load(path, false, &err), G4_ERR_PLAN_CORRUPT) << path;
        for (const auto& w : want)
            EXPECT_NE(err.find(w), std::string::npos) << "expected '" << w << "' in: " << err;
        EXPECT_NE(err.find("re-run g4 compile"), std::string::npos) << err;
        CmdResult r = run_g4("inspect '" + path + "' --verify");
        EXPECT_EQ(r.exit_code, 1) << r.out;
        for (const auto& w : want)
            EXPECT_NE(r.err.find(w), std::string::npos) << r.err;
        r = run_g4("run '" + path + "' --tokens 2,17,99 -n 2");
        EXPECT_EQ(r.exit_code, 1) << r.err; // refused, not a crash (128 + signal)
        EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    }
    static TempDir* dir_;
    static std::string plan_;
};
TempDir* PlanIntegrity::dir_ = nullptr;
std::string PlanIntegrity::plan_;

TEST_F(PlanIntegrity, KvStoreCacheColumnOutsideTheRow) {
    const size_t i = op_index("kv_store-4"); // the full-attention layer: cache rows of 32
    for (int o = 0; o < 2; ++o) {
        std::string p = patched<PlanOp>("kv_col" + std::to_string(o), SectionKind::Ops, i,
                                        [&](PlanOp& op) { op.out_col[o] = 16; });
        expect_refused(p, {"op " + std::to_string(i) + " 'kv_store-4'",
                           std::string(o ? "v" : "k") + " cache column 16+32 exceeds the row of 32"});
    }
}

TEST_F(PlanIntegrity, AttentionCacheColumnOutsideTheRow) {
    const size_t i = op_index("attn-4");
    for (int k = 1; k < 3; ++k) {
        std::string p = patched<PlanOp>("attn_col" + std::to_string(k), SectionKind::Ops, i,
                                        [&](PlanOp& op) { op.in_col[k] = 8; });
        expect_refused(p,
                       {"op " + std::to_string(i) + " 'attn-4'", "cache column 8+32 exceeds the row of 32"});
    }
}

TEST_F(PlanIntegrity, IdsInputOverActivations) {
    const size_t ids = tensor_index("ids"), act = tensor_index("inp_embd");
    g4::plan::Plan good;
    std::string err;
    ASSERT_EQ(good.load(plan_, false, &err), G4_OK) << err;
    const uint64_t at = good.tensor(act).offset;
    std::string p =
        patched<PlanTensor>("ids_over", SectionKind::Tensors, ids, [&](PlanTensor& t) { t.offset = at; });
    expect_refused(p, {"input 'ids'", "overlaps activation"});
}

TEST_F(PlanIntegrity, WeightViewedFromAColumnAndOpLayerOutOfRange) {
    const size_t i = op_index("q-0");
    expect_refused(patched<PlanOp>("w_col", SectionKind::Ops, i, [](PlanOp& op) { op.in_col[1] = 4; }),
                   {"'q-0'", "viewed from column 4"});
    expect_refused(patched<PlanOp>("layer", SectionKind::Ops, i, [](PlanOp& op) { op.layer = 77; }),
                   {"layer 77"});
}

TEST_F(PlanIntegrity, EmbedReadingAnotherTensor) {
    const size_t i = op_index("inp_embd"), other = tensor_index("q-0");
    expect_refused(
        patched<PlanOp>("embed_in", SectionKind::Ops, i, [&](PlanOp& op) { op.in[0] = (int32_t)other; }),
        {"'inp_embd'", "ids input"});
}

TEST_F(PlanIntegrity, MetadataSizesAndGenerationDefaults) {
    // META is JSON: patched in place with same-length values.
    auto with_meta = [&](const std::string& name, const std::string& from, const std::string& to) {
        std::string b          = read_file(plan_);
        const auto [off, size] = plan_section(b, (uint32_t)SectionKind::Meta);
        std::string meta       = b.substr(off, size);
        const size_t at        = meta.find(from);
        EXPECT_NE(at, std::string::npos) << from;
        EXPECT_EQ(from.size(), to.size());
        if (at == std::string::npos || from.size() != to.size()) return plan_;
        b.replace(off + at, from.size(), to);
        reseal_plan(&b);
        const std::string path = dir_->file(name + ".g4plan");
        write_file(path, b);
        return path;
    };
    expect_refused(with_meta("arena", "\"act_arena_bytes\": 1344512", "\"act_arena_bytes\": 9.9e+15"),
                   {"META field act_arena_bytes: expected an integer", "9.9e+15"});
    expect_refused(with_meta("topp", "\"top_p\": 0.9", "\"top_p\": 9.9"), {"generation defaults", "top_p"});
    expect_refused(with_meta("eos", "   106\n", "   906\n"), {"outside the vocabulary"});
}

TEST_F(PlanIntegrity, DamagedSectionIsNamed) {
    const std::string b = read_file(plan_);
    auto damaged        = [&](const std::string& name, SectionKind kind, size_t delta) {
        std::string c          = b;
        const auto [off, size] = plan_section(c, (uint32_t)kind);
        EXPECT_GT(size, delta);
        c[off + delta] ^= 0x20;
        const std::string path = dir_->file(name + ".g4plan");
        write_file(path, c);
        return path;
    };
    const std::pair<SectionKind, const char*> cases[] = {
        {SectionKind::Meta, "metadata (META) section"},
        {SectionKind::Strings, "string table (STRINGS) section"},
        {SectionKind::Tensors, "tensor table (TENSORS) section"},
        {SectionKind::Ops, "op table (OPS) section"},
        {SectionKind::Tokenizer, "tokenizer (TOKENIZER) section"}};
    for (const auto& [kind, want] : cases) {
        const std::string p = damaged(want, kind, 5);
        CmdResult r         = run_g4("inspect '" + p + "' --verify");
        EXPECT_EQ(r.exit_code, 1);
        EXPECT_NE(r.err.find(std::string("checksum mismatch in the ") + want), std::string::npos) << r.err;
        EXPECT_EQ(run_g4("run '" + p + "' --tokens 2,3 -n 1").exit_code, 1);
    }
    // WEIGHTS: found by --verify only (a run uses them in place).
    const std::string w = damaged("weights", SectionKind::Weights, 100);
    CmdResult r         = run_g4("inspect '" + w + "' --verify");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("checksum mismatch in the weights (WEIGHTS) section"), std::string::npos) << r.err;
    // The section table: a byte no section's checksum covers (a record's reserved field).
    std::string c = b;
    g4::plan::PlanHeader h;
    std::memcpy(&h, c.data(), sizeof h);
    c[h.section_table_offset + offsetof(g4::plan::PlanSection, reserved)] ^= 1;
    write_file(dir_->file("table.g4plan"), c);
    r = run_g4("inspect '" + dir_->file("table.g4plan") + "'");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("checksum mismatch in the section table"), std::string::npos) << r.err;
    EXPECT_EQ(run_g4("inspect '" + plan_ + "' --verify").exit_code, 0);
}

// The plan as a writer of an earlier minor left it: that minor in the header, the schema hash it wrote (the
// 1.0 and 1.1 writers: the hand-typed schema's, kReadableSchemas) and, for 1.0, no section-table checksum.
std::string as_minor(const std::string& plan, uint16_t minor) {
    std::string b = read_file(plan);
    g4::plan::PlanHeader h;
    std::memcpy(&h, b.data(), sizeof h);
    EXPECT_EQ(h.format_minor, g4::plan::kFormatMinor);
    EXPECT_EQ(h.schema_hash, g4::plan::schema_hash());
    h.format_minor = minor;
    h.schema_hash  = g4::plan::kReadableSchemas.at(minor).hash; // the first hash that minor wrote
    if (minor == 0) h.reserved0 = 0;
    h.header_checksum = 0;
    h.header_checksum = (uint32_t)g4::plan::fnv1a64(&h, sizeof h);
    std::memcpy(b.data(), &h, sizeof h);
    return b;
}

TEST_F(PlanIntegrity, PlansOfEarlierMinorsStillLoad) {
    CmdResult n = run_g4("run '" + plan_ + "' --tokens 2,17,99 -n 3 --print-ids");
    ASSERT_EQ(n.exit_code, 0) << n.err;
    for (uint16_t minor : {0, 1}) {
        ASSERT_EQ(g4::plan::kReadableSchemas.at(minor).minor, minor);
        const std::string old = dir_->file("v1" + std::to_string(minor) + ".g4plan");
        write_file(old, as_minor(plan_, minor));
        CmdResult a = run_g4("run '" + old + "' --tokens 2,17,99 -n 3 --print-ids");
        ASSERT_EQ(a.exit_code, 0) << a.err;
        EXPECT_EQ(a.out, n.out) << "format 1." << minor;
    }
    // A CUDA plan of an earlier schema is refused: its kernels are those of the g4 that compiled it.
    {
        std::string c          = read_file(plan_);
        const auto [off, size] = plan_section(c, (uint32_t)g4::plan::SectionKind::Meta);
        const std::string cpu  = "\n \"device\": \"cpu\",";
        const size_t k         = c.find(cpu, off);
        ASSERT_TRUE(k != std::string::npos && k < off + size);
        c.replace(k, cpu.size(), "\n \"device\":\"cuda\",");
        reseal_plan(&c);
        write_file(dir_->file("cuda_now.g4plan"), c);
        write_file(dir_->file("cuda_old.g4plan"), as_minor(dir_->file("cuda_now.g4plan"), 1));
        g4_engine* e = nullptr;
        EXPECT_EQ(g4_engine_open(dir_->file("cuda_old.g4plan").c_str(), nullptr, &e), G4_ERR_PLAN_VERSION);
        EXPECT_NE(
            std::string(g4_last_error_message()).find("CUDA plan of format 1.1: its kernels are those of"),
            std::string::npos)
            << g4_last_error_message();
    }
    // An earlier schema's hash is read only with the minor that wrote it.
    std::string b = as_minor(plan_, 1);
    g4::plan::PlanHeader h;
    std::memcpy(&h, b.data(), sizeof h);
    h.format_minor    = g4::plan::kFormatMinor;
    h.header_checksum = 0;
    h.header_checksum = (uint32_t)g4::plan::fnv1a64(&h, sizeof h);
    std::memcpy(b.data(), &h, sizeof h);
    write_file(dir_->file("mixed.g4plan"), b);
    g4_engine* e = nullptr;
    EXPECT_EQ(g4_engine_open(dir_->file("mixed.g4plan").c_str(), nullptr, &e), G4_ERR_PLAN_VERSION);
}

// Compatibility (docs/plan-format.md): a newer minor of this major, or a schema hash the runtime does not
// know, is refused with one line saying what to do; the C API reports G4_ERR_PLAN_VERSION.
TEST_F(PlanIntegrity, NewerMinorsAndUnknownSchemasAreRefused) {
    const std::string b = read_file(plan_);
    auto patched        = [&](const char* name, auto&& edit) {
        std::string c = b;
        g4::plan::PlanHeader h;
        std::memcpy(&h, c.data(), sizeof h);
        edit(h);
        h.header_checksum = 0;
        h.header_checksum = (uint32_t)g4::plan::fnv1a64(&h, sizeof h);
        std::memcpy(c.data(), &h, sizeof h);
        write_file(dir_->file(name), c);
        return dir_->file(name);
    };
    const std::string newer =
        patched("v13.g4plan", [](g4::plan::PlanHeader& h) { h.format_minor = g4::plan::kFormatMinor + 1; });
    CmdResult r = run_g4("run '" + newer + "' --tokens 2,17 -n 1");
    EXPECT_EQ(r.exit_code, 1);
    const std::string minor = std::to_string(g4::plan::kFormatMinor);
    EXPECT_NE(r.err.find("plan format 1." + std::to_string(g4::plan::kFormatMinor + 1) +
                         " is newer than this runtime reads (1.0 to 1." + minor + "); update g4"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    g4_engine* e = nullptr;
    EXPECT_EQ(g4_engine_open(newer.c_str(), nullptr, &e), G4_ERR_PLAN_VERSION);
    const std::string other = patched("schema.g4plan", [](g4::plan::PlanHeader& h) { h.schema_hash ^= 1; });
    EXPECT_EQ(g4_engine_open(other.c_str(), nullptr, &e), G4_ERR_PLAN_VERSION);
    EXPECT_NE(std::string(g4_last_error_message()).find("plan schema differs"), std::string::npos);
}

// --- outputs ---

TEST_F(PlanIntegrity, OutputsThatAreNotRegularFilesAreRefused) {
    TempDir td;
    const std::string fifo = td.file("fifo");
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    const std::string model = fixture("e2b_tiny");
    for (const std::string target : {fifo, std::string("/dev/null"), td.path}) {
        CmdResult r = run_g4("compile --model '" + model + "' --no-fidelity -o '" + target + "'");
        EXPECT_EQ(r.exit_code, 1) << target;
        EXPECT_NE(r.err.find("g4 writes only regular files"), std::string::npos) << r.err;
        for (const char* opt : {"--dump-logits", "--dump-decode-logits"}) {
            r = run_g4("run '" + plan_ + "' --tokens 2,3 -n 1 " + opt + " '" + target + "'");
            EXPECT_EQ(r.exit_code, 2) << r.err;
            EXPECT_NE(r.err.find(std::string(opt) + " " + target), std::string::npos) << r.err;
            EXPECT_TRUE(r.out.empty()) << r.out;
        }
    }
    struct stat st {};
    ASSERT_EQ(::stat(fifo.c_str(), &st), 0);
    EXPECT_TRUE(S_ISFIFO(st.st_mode));
    ASSERT_EQ(::stat("/dev/null", &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode));
    // Nothing but the FIFO was left in the folder.
    size_t n = 0;
    for (auto& e : fs::directory_iterator(td.path))
        n += e.path() != fifo;
    EXPECT_EQ(n, 0u);
}

TEST_F(PlanIntegrity, SymlinkOutputsReplaceTheirTargetAtomically) {
    TempDir td;
    fs::create_directory(td.file("real"));
    const std::string target = td.file("real/p.g4plan"), link = td.file("link.g4plan"),
                      logits = td.file("real/l.f32");
    write_file(target, "old");
    fs::create_symlink("real/p.g4plan", link);
    CmdResult r = run_g4("compile --model '" + fixture("e2b_tiny") + "' --no-fidelity -o '" + link + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(fs::is_symlink(link));
    EXPECT_EQ(read_file(target), read_file(plan_));
    // A dangling link: the file it names is created.
    fs::create_symlink("real/l.f32", td.file("l.f32"));
    r = run_g4("run '" + plan_ + "' --tokens 2,17,99 -n 0 --dump-logits '" + td.file("l.f32") + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(fs::is_symlink(td.file("l.f32")));
    EXPECT_EQ(fs::file_size(logits), 3u * 512 * 4);
    // No temporary file anywhere.
    for (const auto& d : {td.path, td.file("real")})
        for (auto& e : fs::directory_iterator(d))
            EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

// A writable copy of a fixture checkpoint (or adapter) folder.
std::string copy_dir(const TempDir& td, const std::string& from, const std::string& name) {
    const std::string dir = td.file(name);
    fs::create_directory(dir);
    for (auto& e : fs::directory_iterator(from))
        if (e.is_regular_file()) fs::copy_file(e.path(), dir + "/" + e.path().filename().string());
    return dir;
}

TEST_F(PlanIntegrity, FailingCompileLeavesThePreviousPlanUntouched) {
    TempDir td;
    const std::string out = td.file("out"), plan = out + "/p.g4plan";
    fs::create_directory(out);
    const std::string good = fixture("e2b_tiny");
    // bad config
    const std::string bad_cfg = copy_dir(td, good, "bad_cfg");
    write_file(bad_cfg + "/config.json", "{ not json");
    // bad weights
    const std::string bad_w = copy_dir(td, good, "bad_w");
    {
        std::string b = read_file(bad_w + "/model.safetensors");
        write_file(bad_w + "/model.safetensors", b.substr(0, b.size() / 2));
    }
    // an adapter naming a module the model lacks (one tensor renamed: same length, header only)
    const std::string bad_a = copy_dir(td, fixture("adapters/e2b_lora"), "bad_a");
    {
        std::string b         = read_file(bad_a + "/adapter_model.safetensors");
        const std::string key = "language_model.layers.0.mlp.down_proj",
                          to  = "language_model.layers.0.mlp.zzzz_proj";
        for (size_t at = b.find(key); at != std::string::npos; at = b.find(key, at))
            b.replace(at, key.size(), to);
        write_file(bad_a + "/adapter_model.safetensors", b);
    }
    // bad generation_config.json
    const std::string bad_g = copy_dir(td, good, "bad_g");
    write_file(bad_g + "/generation_config.json",
               R"({"do_sample": true, "temperature": -0.5, "top_p": 0.9})");
    struct Case {
        std::string args, want;
    };
    const std::vector<Case> cases = {
        {"--model '" + bad_cfg + "'", "config.json"},
        {"--model '" + bad_w + "'", "model.safetensors"},
        {"--model '" + good + "' --adapter '" + bad_a + "'", "zzzz_proj"},
        {"--model '" + good + "' --adapter '" + bad_a + "' --no-fidelity", "zzzz_proj"},
        {"--model '" + bad_g + "'", "generation_config.json: field 'temperature' = -0.5 is out of range"},
        {"--model '" + good + "' --cpu-mem 1KiB", "--cpu-mem"},
        {"--model '" + good + "' --kv-dtype f8", "--kv-dtype"},
        {"--model '" + good + "' --chunk 0", "--chunk"},
        {"--model '" + good + "' --bogus", "--bogus"},
    };
    for (const Case& c : cases) {
        write_file(plan, "previous plan");
        CmdResult r = run_g4("compile " + c.args + " -o '" + plan + "'");
        EXPECT_NE(r.exit_code, 0) << c.args;
        EXPECT_NE(r.err.find(c.want), std::string::npos) << c.args << ": " << r.err;
        EXPECT_EQ(read_file(plan), "previous plan") << c.args;
        size_t n = 0;
        for (auto& e : fs::directory_iterator(out)) {
            ++n;
            EXPECT_EQ(e.path(), plan) << c.args;
        }
        EXPECT_EQ(n, 1u) << c.args;
    }
}

// --- plans that compile but could never run ---

TEST_F(PlanIntegrity, SlidingWindowAboveTheContextIsClamped) {
    // e2b_tiny's sliding window is 8: at --max-context 6 it hides no key, as HF's mask then masks none.
    TempDir td;
    const std::string small = td.file("ctx6.g4plan"), ref = td.file("ref.g4plan");
    CmdResult r = run_g4("compile --model '" + fixture("e2b_tiny") +
                         "' --weights bf16 --no-fidelity --max-context 6 -o '" + small + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = run_g4("compile --model '" + fixture("e2b_tiny") + "' --weights bf16 --no-fidelity -o '" + ref + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string la = td.file("a.f32"), lb = td.file("b.f32");
    r = run_g4("run '" + small + "' --tokens 2,17,99,5,250 -n 0 --dump-logits '" + la + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = run_g4("run '" + ref + "' --tokens 2,17,99,5,250 -n 0 --dump-logits '" + lb + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<float> a = read_f32(la), b = read_f32(lb);
    ASSERT_EQ(a.size(), 5u * 512);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_LT(rel_l2(a.data(), b.data(), a.size()), 1e-6);
    // The same through config.json: a sliding_window above the context.
    const std::string m                  = copy_dir(td, fixture("e2b_tiny"), "wide");
    nlohmann::json cfg                   = nlohmann::json::parse(read_file(m + "/config.json"));
    cfg["text_config"]["sliding_window"] = 100000;
    write_file(m + "/config.json", cfg.dump());
    r = run_g4("compile --model '" + m + "' --weights bf16 --no-fidelity --max-context 64 -o '" +
               td.file("wide.g4plan") + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = run_g4("run '" + td.file("wide.g4plan") + "' --tokens 2,17,99 -n 3 --print-ids");
    EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(PlanIntegrity, GenerationConfigOutOfRangeIsRefusedAtCompile) {
    TempDir td;
    const std::string m                                          = copy_dir(td, fixture("e2b_tiny"), "m");
    const std::vector<std::pair<std::string, std::string>> cases = {
        {R"({"temperature": -1})", "'temperature' = -1"},
        {R"({"top_p": 0})", "'top_p' = 0"},
        {R"({"top_p": 1.5})", "'top_p' = 1.5"},
        {R"({"top_k": -3})", "'top_k' = -3"},
        {R"({"min_p": 2})", "'min_p' = 2"},
        {R"({"repetition_penalty": 0})", "'repetition_penalty' = 0"},
    };
    for (const auto& [gen, want] : cases) {
        write_file(m + "/generation_config.json", gen);
        const std::string out = td.file("p.g4plan");
        CmdResult r           = run_g4("compile --model '" + m + "' --no-fidelity -o '" + out + "'");
        EXPECT_EQ(r.exit_code, 1) << gen;
        EXPECT_NE(r.err.find("generation_config.json"), std::string::npos) << r.err;
        EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
        EXPECT_FALSE(fs::exists(out));
    }
}

// --- sampling values checked before any work ---

TEST_F(PlanIntegrity, BadSamplingOptionsWriteNothing) {
    TempDir td;
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"--repeat-penalty 0", "--repeat-penalty 0: repeat_penalty"},
        {"--temp -1", "--temp -1: temperature"},
        {"--top-p 0", "--top-p 0: top_p"},
        {"--min-p 1.5", "--min-p 1.5: min_p"},
        {"--temp nan", "--temp nan: temperature"},
    };
    for (const auto& [opt, want] : cases) {
        const std::string out = td.file("out.bin"), dec = td.file("dec.bin");
        CmdResult r = run_g4("run '" + plan_ + "' --tokens 2,17,99 -n 2 " + opt + " --dump-logits '" + out +
                             "' --dump-decode-logits '" + dec + "'");
        EXPECT_EQ(r.exit_code, 2) << opt;
        EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
        EXPECT_TRUE(r.out.empty()) << r.out;
        EXPECT_FALSE(fs::exists(out)) << opt;
        EXPECT_FALSE(fs::exists(dec)) << opt;
        EXPECT_TRUE(fs::is_empty(td.path)) << opt;
    }
}

TEST_F(PlanIntegrity, CApiChecksSamplingBeforeAnyWork) {
    g4_engine* e = nullptr;
    ASSERT_EQ(g4_engine_open(plan_.c_str(), nullptr, &e), G4_OK) << g4_last_error_message();
    g4_session* s = nullptr;
    ASSERT_EQ(g4_session_create(e, nullptr, &s), G4_OK) << g4_last_error_message();
    const int32_t ids[] = {2, 17, 99};
    ASSERT_EQ(g4_session_append_tokens(s, ids, 3, nullptr, 0), G4_OK);
    g4_sampling_params bad = g4_sampling_params_default();
    bad.repeat_penalty     = 0;
    EXPECT_EQ(g4_sampling_params_check(&bad), G4_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(g4_last_error_message()).find("repeat_penalty"), std::string::npos);
    g4_generate_params gp = g4_generate_params_default();
    for (int32_t max : {0, 4}) {
        gp.max_tokens = max;
        int32_t n     = -1;
        EXPECT_EQ(g4_session_generate(s, &bad, &gp, nullptr, nullptr, &n), G4_ERR_INVALID_ARGUMENT);
        EXPECT_EQ(n, 0);
        EXPECT_EQ(g4_session_position(s), 3);
    }
    g4_sampling_params good = g4_sampling_params_default();
    EXPECT_EQ(g4_sampling_params_check(&good), G4_OK);
    EXPECT_EQ(g4_sampling_params_check(nullptr), G4_ERR_INVALID_ARGUMENT);
    g4_session_destroy(s);
    g4_engine_close(e);
}

// The ops of P's code in plan `bytes` (the first of each program), each parameter set just outside the values
// OpTable<P> declares (an int below lo and above hi, a positive float at 0 and NaN): the plan is refused at
// load, naming the op and the parameter. New ops get this coverage from their definition alone.
template <class P>
void expect_ranges_enforced(const std::string& bytes, const std::string& path, std::set<int>* covered) {
    using g4::plan::OpTable;
    const auto [off, size] = plan_section(bytes, (uint32_t)SectionKind::Ops);
    g4::plan::Plan good;
    std::string err;
    ASSERT_EQ(good.load(path + ".good", false, &err), G4_OK) << err;
    std::set<size_t> programs_seen;
    for (size_t i = 0; i < size / sizeof(PlanOp); ++i) {
        PlanOp op;
        std::memcpy(&op, bytes.data() + off + i * sizeof op, sizeof op);
        size_t prog = 0;
        while (i >= good.program(prog).op_end)
            ++prog;
        if (op.code != (uint16_t)OpTable<P>::code || !programs_seen.insert(prog).second) continue;
        covered->insert(op.code);
        for (const auto& f : OpTable<P>::fields) {
            std::vector<PlanOp> edits;
            auto edited = [&](auto set) {
                PlanOp e = op;
                set(e);
                edits.push_back(e);
            };
            if (f.i && f.lo > std::numeric_limits<int32_t>::min())
                edited([&](PlanOp& e) { e.ip[f.slot] = f.lo - 1; });
            if (f.i && f.hi < std::numeric_limits<int32_t>::max())
                edited([&](PlanOp& e) { e.ip[f.slot] = f.hi + 1; });
            if (f.f && f.positive) {
                edited([&](PlanOp& e) { e.fp[f.slot] = 0.0f; });
                edited([&](PlanOp& e) { e.fp[f.slot] = NAN; });
            }
            for (const PlanOp& e : edits) {
                std::string b = bytes;
                std::memcpy(b.data() + off + i * sizeof e, &e, sizeof e);
                reseal_plan(&b);
                write_file(path, b);
                g4::plan::Plan p;
                EXPECT_EQ(p.load(path, false, &err), G4_ERR_PLAN_CORRUPT)
                    << g4::op_name(OpTable<P>::code) << " " << f.name;
                EXPECT_NE(err.find("op " + std::to_string(i) + " '"), std::string::npos) << err;
                EXPECT_NE(err.find(std::string("parameter ") + f.name), std::string::npos) << err;
            }
        }
    }
}
template <class... P>
void expect_all_ranges_enforced(const std::string& bytes, const std::string& path, std::set<int>* covered,
                                std::tuple<P...>*) {
    (expect_ranges_enforced<P>(bytes, path, covered), ...);
}

TEST_F(PlanIntegrity, EveryOpParameterOutsideItsDeclaredRangeIsRefused) {
    const std::string bytes = read_file(plan_);
    const std::string path  = dir_->file("range.g4plan");
    write_file(path + ".good", bytes);
    std::set<int> covered;
    expect_all_ranges_enforced(bytes, path, &covered, (g4::plan::AllOpParams*)nullptr);
    // The fixture's text, vision and audio programs hold every op but the cross-device copy step.
    for (const g4::OpName& n : g4::kOpNames)
        if (n.code != g4::OpCode::Copy) EXPECT_TRUE(covered.count((int)n.code)) << n.name;
}

} // namespace
