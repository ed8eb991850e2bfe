// Long context on the CPU: an 8200-token prompt (16x the sliding window of e2b_tiny, 8 ring
// wrap-arounds of the chunked prefill) against Hugging Face float32 (tests/fixtures/e2b_tiny/
// reference/long_context.json, made by tools/make_long_context_fixture.py): logits of the last
// positions and greedy decoding past 8K positions.
#include "test_util.h"

#include <filesystem>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

using json = nlohmann::json;
using namespace g4test;
namespace fs = std::filesystem;

TEST(LongContext, Prompt8200TokensMatchesHF) {
    json ref = json::parse(read_file(fixture("e2b_tiny/reference/long_context.json")));
    TempDir td;
    // The tiny checkpoint's config allows 4096 positions; RoPE does not depend on that limit.
    std::string model = td.file("model");
    fs::create_directory(model);
    for (auto& e : fs::directory_iterator(fixture("e2b_tiny")))
        if (e.is_regular_file()) fs::copy_file(e.path(), model + "/" + e.path().filename().string());
    json cfg                                      = json::parse(read_file(model + "/config.json"));
    cfg["text_config"]["max_position_embeddings"] = 16384;
    write_file(model + "/config.json", cfg.dump());

    std::string plan = td.file("long.g4plan");
    CmdResult c = run_g4("compile --model '" + model + "' --weights f32 --max-context 8300 --chunk 64 -o '" +
                         plan + "'");
    ASSERT_EQ(c.exit_code, 0) << c.err;
    auto ids = ref.at("prompt").get<std::vector<int32_t>>();
    std::string csv;
    for (size_t i = 0; i < ids.size(); ++i)
        csv += (i ? "," : "") + std::to_string(ids[i]);
    write_file(td.file("prompt.txt"), csv);
    CmdResult r = run_g4("run '" + plan + "' --tokens @'" + td.file("prompt.txt") +
                         "' -n 8 --temp 0 --ignore-eos --print-ids --dump-logits '" + td.file("l.f32") + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto got       = read_f32(td.file("l.f32"));
    const size_t V = 512, T = ids.size();
    ASSERT_EQ(got.size(), T * V);
    std::vector<float> want;
    for (auto& row : ref.at("last_logits"))
        for (auto& v : row)
            want.push_back(v.get<float>());
    double err = rel_l2(got.data() + (T - 8) * V, want.data(), want.size());
    std::printf("LONGCTX tokens=%zu last8 rel_l2=%.3e\n", T, err);
    EXPECT_LE(err, 1e-4);
    EXPECT_EQ(parse_ids(r.out), ref.at("greedy").get<std::vector<int32_t>>());
}

} // namespace
