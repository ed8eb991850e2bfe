// The plan contract module: the META codec (one struct, one write/read pair), the typed op parameters and
// the schema derived from the layouts.
#include "runtime/plan/meta.h"
#include "runtime/plan/op_params.h"
#include "runtime/plan/plan_reader.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <string>
#include <tuple>

namespace {

using namespace g4::plan;
using namespace g4test;

// A Meta with every optional part present, so that every key is written.
Meta full_meta() {
    Meta m;
    m.g4_version                = "0.0.0";
    m.architecture              = "arch";
    m.device                    = "cuda";
    m.cuda                      = MetaCuda{"sm_90", 1, 4, "decode"};
    m.weights_dtype             = "nf4";
    m.policy.weights            = "nf4";
    m.policy.double_quant       = true;
    m.policy.nf4_blocksize      = 64;
    m.policy.deterministic      = false;
    m.policy.prefill_precision  = "bf16";
    m.policy.mlp_precision      = "f16";
    m.policy.mlp_replicas       = 2;
    m.policy.ple_fold           = "off";
    m.policy.mlp_fold           = "off";
    m.hparams.num_hidden_layers = 2;
    m.hparams.hidden_size       = 64;
    m.hparams.model             = {{"rms_norm_eps", 1e-6f}, {"layer_types", {"a", "b"}}};
    m.program.max_rows          = 8;
    m.program.act_arena_bytes   = 1ull << 40;
    m.program.layer_devices     = {1, -1};
    m.program.gpus              = {MetaGpuPart{1, {{0, 10}, {20, 30}}, {0, 5}}};
    m.program.kv_host_begin     = 5;
    m.generation.eos_token_ids  = {1, 106};
    m.generation.temperature    = 0.7f;
    m.provenance.base_dir       = "model";
    m.provenance.base_files     = {{"config.json", "ab"}};
    m.provenance.has_adapter    = true;
    m.provenance.adapter_dir    = "lora";
    m.provenance.merges         = {{"m.q_proj", 8, 16.0f, 2.0f, true}};
    m.provenance.g4_version     = "0.0.0";
    m.tokenizer                 = {true, 262144, true, "gemma4", "cd"};
    m.placement                 = MetaPlacement{
        "cuda:1", {{0, 0, "cuda:1"}, {1, 1, "cpu"}}, "cuda:1", "cuda:1", "host", true, "cuda:1", "cpu"};
    m.memory = {MetaDeviceMemory{"cuda:1", {{"weights", 100}, {"kv", 7}}, 0, 1000},
                MetaDeviceMemory{"host", {{"ple", 3}}, 64, std::nullopt}};
    MetaTowers t;
    t.weights          = {30, 50};
    t.max_media_tokens = 256;
    t.precision        = "bf16";
    t.vision           = MetaVision{
        R"({"hidden_size":32})", 16, 64, 4096, 5, 6, 7, 8, "vision", 16, 3, 10, 0.5f, 0.25f, "cuda:1", 99,
        ByteRange{30, 40}};
    t.vision->video = MetaVideo{16, 60.5, 1000, 2048, 1 << 20};
    t.audio         = MetaAudio{R"({"hidden_size":16})",
                        16000,
                        16000,
                        9,
                        10,
                        11,
                        "audio",
                        320,
                        160,
                        512,
                        128,
                        0.0,
                        8000.0,
                        1e-3,
                        "",
                        0,
                        ByteRange{40, 50}};
    m.towers        = t;
    return m;
}

TEST(PlanMeta, WriteReadWriteIsTheSameText) {
    const std::string text = write_meta(full_meta());
    Meta back;
    std::string err;
    ASSERT_TRUE(read_meta(text, kFormatMinor, &back, &err)) << err;
    EXPECT_EQ(write_meta(back), text);
    EXPECT_EQ(back.program.gpus.at(0).weights.at(1)[1], 30u);
    EXPECT_EQ(back.towers->vision->device, "cuda:1");
    ASSERT_TRUE(back.towers->vision->video.has_value());
    EXPECT_EQ(back.towers->vision->video->max_seconds, 60.5);
    EXPECT_EQ(back.towers->vision->video->max_file_bytes, 1 << 20);
    EXPECT_TRUE(back.towers->audio->device.empty());
    EXPECT_EQ(back.towers->audio->program, "audio");
    EXPECT_EQ(back.towers->audio->fft_length, 512);
    EXPECT_EQ(back.towers->audio->mel_floor, 1e-3);
    EXPECT_EQ(back.memory.at(1).total(), 3u);
}

// The compiler's META, read by the codec and written again, is the same bytes: the codec spells what the
// compiler writes (towers included: e2b_tiny has both, e2b_tiny_text none).
TEST(PlanMeta, CompiledPlansRoundTripThroughTheCodec) {
    TempDir td;
    for (const char* model : {"e2b_tiny", "e2b_tiny_text"}) {
        const std::string plan = td.file(std::string(model) + ".g4plan");
        CmdResult c = run_g4("compile --model '" + fixture(model) + "' --no-fidelity -o '" + plan + "'");
        ASSERT_EQ(c.exit_code, 0) << c.err;
        Plan p;
        std::string err;
        ASSERT_EQ(p.load(plan, false, &err), G4_OK) << err;
        EXPECT_EQ(write_meta(p.meta()), p.meta_json()) << model;
        EXPECT_EQ(p.meta().towers.has_value(), std::string(model) == "e2b_tiny");
    }
}

// placement.sessions (1.5): absent in older plans (1), checked when present.
TEST(PlanMeta, PlannedSessionsDefaultAndRange) {
    nlohmann::json j = to_json(full_meta());
    Meta back;
    std::string err;
    j["placement"]["sessions"] = 3;
    ASSERT_TRUE(read_meta(j.dump(), kFormatMinor, &back, &err)) << err;
    EXPECT_EQ(back.placement->sessions, 3);
    j["placement"].erase("sessions");
    ASSERT_TRUE(read_meta(j.dump(), 4, &back, &err)) << err;
    EXPECT_EQ(back.placement->sessions, 1);
    j["placement"]["sessions"] = 0;
    EXPECT_FALSE(read_meta(j.dump(), kFormatMinor, &back, &err));
    EXPECT_NE(err.find("placement.sessions"), std::string::npos) << err;
}

TEST(PlanMeta, FieldsAddedIn12AreRequiredFrom12) {
    Meta m           = full_meta();
    nlohmann::json j = to_json(m);
    j["towers"].erase("precision");
    Meta back;
    std::string err;
    EXPECT_TRUE(read_meta(j.dump(), 1, &back, &err)) << err;
    EXPECT_EQ(back.towers->precision, "fp32");
    EXPECT_FALSE(read_meta(j.dump(), 2, &back, &err));
    EXPECT_EQ(err, "META field precision is missing");
}

// The video limits are optional (absent in plans compiled before them) and checked when present.
TEST(PlanMeta, VideoLimitsOptionalAndChecked) {
    nlohmann::json j = to_json(full_meta());
    Meta back;
    std::string err;
    j["towers"]["vision"]["video"]["max_pixels"] = 4097; // over max_image_pixels
    EXPECT_FALSE(read_meta(j.dump(), kFormatMinor, &back, &err));
    EXPECT_NE(err.find("META field video"), std::string::npos) << err;
    j["towers"]["vision"].erase("video");
    ASSERT_TRUE(read_meta(j.dump(), kFormatMinor, &back, &err)) << err;
    EXPECT_FALSE(back.towers->vision->video.has_value());
}

TEST(PlanMeta, WrongTypesNameTheField) {
    nlohmann::json j         = to_json(full_meta());
    j["program"]["max_rows"] = "8";
    Meta back;
    std::string err;
    EXPECT_FALSE(read_meta(j.dump(), kFormatMinor, &back, &err));
    EXPECT_NE(err.find("META field max_rows: expected an integer"), std::string::npos) << err;
    EXPECT_FALSE(read_meta("[1]", kFormatMinor, &back, &err));
    EXPECT_EQ(err, "META: not a JSON object");
}

// docs/plan-format.md documents every key the codec writes, by its path.
TEST(PlanMeta, DocumentsEveryKey) {
    const std::string doc = read_file(std::string(G4_SOURCE_DIR) + "/docs/plan-format.md");
    const auto keys       = meta_keys();
    EXPECT_GT(keys.size(), 80u);
    for (const std::string& k : keys)
        EXPECT_NE(doc.find("`" + k + "`"), std::string::npos)
            << "docs/plan-format.md lacks META key `" << k << "`";
}

template <class P> void expect_round_trip() {
    P p;
    int32_t v = 3;
    float f   = 0.5f;
    for (const auto& fd : OpTable<P>::fields) {
        if (fd.i) p.*fd.i = v++;
        if (fd.f) p.*fd.f = f += 0.25f;
    }
    PlanOp op{};
    set_params(op, p);
    EXPECT_EQ(op.code, (uint16_t)OpTable<P>::code);
    const P q = params<P>(op);
    for (const auto& fd : OpTable<P>::fields) {
        if (fd.i) {
            EXPECT_EQ(q.*fd.i, p.*fd.i) << fd.name;
        }
        if (fd.f) {
            EXPECT_EQ(q.*fd.f, p.*fd.f) << fd.name;
        }
    }
}
template <class... P> void round_trip_all(std::tuple<P...>*) {
    (expect_round_trip<P>(), ...);
}

TEST(PlanOpParams, EveryOpsParametersRoundTrip) {
    round_trip_all((AllOpParams*)nullptr);
}

template <class P> void expect_row(const std::string& doc) {
    const std::string row = op_doc_row<P>(g4::op_name(OpTable<P>::code));
    EXPECT_NE(doc.find(row), std::string::npos)
        << "docs/plan-format.md's op table lacks this row (paste it in, replacing the op's old row):\n"
        << row;
}
template <class... P> void expect_documented(const std::string& doc, std::tuple<P...>*) {
    (expect_row<P>(doc), ...);
}

// docs/plan-format.md's op table is the parameter tables' rows, as op_doc_row writes them.
TEST(PlanOpParams, DocumentedAsTheTablesSay) {
    expect_documented(read_file(std::string(G4_SOURCE_DIR) + "/docs/plan-format.md"), (AllOpParams*)nullptr);
}

TEST(PlanOpParams, AttentionParametersSitInTheirDocumentedSlots) {
    AttentionParams a;
    a.heads         = 8;
    a.decode_splits = 32;
    a.scale         = 0.125f;
    PlanOp op{};
    set_params(op, a);
    EXPECT_EQ(op.ip[0], 8);
    EXPECT_EQ(op.ip[6], 32);
    EXPECT_EQ(op.fp[0], 0.125f);
}

TEST(PlanSchema, HashIsDerivedFromTheLayoutsAndTables) {
    const std::string& s = schema_text();
    EXPECT_EQ(schema_hash(), fnv1a64(s.data(), s.size()));
    EXPECT_NE(s.find("op104(code@0:2,layer@2:2,"), std::string::npos) << s;
    EXPECT_NE(s.find("attention8(in:q,kc,vc;heads:ip0,kv_heads:ip1,dim:ip2,"), std::string::npos) << s;
    for (const ReadableSchema& r : kReadableSchemas) {
        EXPECT_LT(r.minor, kFormatMinor);
        EXPECT_NE(r.hash, schema_hash());
    }
}

} // namespace
