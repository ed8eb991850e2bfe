// gemma4::parse_vision_config (models/gemma4/vision_graph.h), the compiler's reading of config.json's
// "vision_config": the tiny e2b fixture's values, HF defaults, and the settings it refuses.
#include "models/gemma4/vision_graph.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

using namespace g4;

namespace {

nlohmann::json fixture_vision_config() {
    auto cfg = nlohmann::json::parse(g4test::read_file(g4test::fixture("e2b_tiny/config.json")));
    return cfg["vision_config"];
}

} // namespace

TEST(VisionConfig, ParsesTheFixtureConfig) {
    gemma4::VisionHParams hp;
    ASSERT_EQ(gemma4::parse_vision_config(fixture_vision_config().dump(), 64, &hp), "");
    EXPECT_EQ(hp.hidden_size, 32);
    EXPECT_EQ(hp.num_hidden_layers, 2);
    EXPECT_EQ(hp.num_attention_heads, 2);
    EXPECT_EQ(hp.num_key_value_heads, 2);
    EXPECT_EQ(hp.head_dim, 16);
    EXPECT_EQ(hp.intermediate_size, 64);
    EXPECT_EQ(hp.patch_size, 16);
    EXPECT_EQ(hp.pooling_kernel_size, 3);
    EXPECT_EQ(hp.position_embedding_size, 64);
    EXPECT_FLOAT_EQ(hp.rms_norm_eps, 1e-6f);
    EXPECT_FLOAT_EQ(hp.rope_theta, 100.0f);
    EXPECT_TRUE(hp.use_clipped_linears);
    EXPECT_EQ(hp.text_hidden_size, 64);
}

TEST(VisionConfig, DefaultsAsHuggingFace) {
    auto c = fixture_vision_config();
    for (const char* k : {"rms_norm_eps", "rope_parameters", "rope_theta", "use_clipped_linears"})
        c.erase(k);
    gemma4::VisionHParams hp;
    ASSERT_EQ(gemma4::parse_vision_config(c.dump(), 64, &hp), "");
    EXPECT_FLOAT_EQ(hp.rms_norm_eps, 1e-6f);
    EXPECT_FLOAT_EQ(hp.rope_theta, 100.0f);
    EXPECT_FALSE(hp.use_clipped_linears);
}

TEST(VisionConfig, RejectsUnsupportedConfigs) {
    const auto cfg = fixture_vision_config();
    gemma4::VisionHParams hp;
    auto with = [&](const char* key, nlohmann::json v) {
        auto c = cfg;
        if (v.is_null())
            c.erase(key);
        else
            c[key] = v;
        return gemma4::parse_vision_config(c.dump(), 64, &hp);
    };
    EXPECT_NE(with("standardize", true).find("standardize"), std::string::npos);
    EXPECT_NE(with("attention_bias", true).find("attention_bias"), std::string::npos);
    EXPECT_NE(with("hidden_activation", "gelu").find("hidden_activation"), std::string::npos);
    EXPECT_NE(with("head_dim", nullptr).find("missing key \"head_dim\""), std::string::npos);
    EXPECT_NE(with("head_dim", 18).find("multiple of 4"), std::string::npos);
    EXPECT_NE(with("num_key_value_heads", 3).find("num_key_value_heads"), std::string::npos);
    EXPECT_NE(with("patch_size", "16").find("patch_size"), std::string::npos);
    EXPECT_NE(with("rope_parameters", {{"rope_type", "default"}}).find("rope_type"), std::string::npos);
    EXPECT_NE(gemma4::parse_vision_config("{not json", 64, &hp).find("JSON"), std::string::npos);
    EXPECT_NE(gemma4::parse_vision_config("[1]", 64, &hp).find("object"), std::string::npos);
    EXPECT_NE(gemma4::parse_vision_config(cfg.dump(), 0, &hp).find("hidden size"), std::string::npos);
    EXPECT_EQ(with("standardize", false), "");
}
