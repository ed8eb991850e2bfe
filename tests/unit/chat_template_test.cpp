// Chat template tests: the C++ Gemma 4 renderer against the Jinja template rendered by transformers
// (tests/fixtures/tokenizer/chat_cases.json), plus tokenization of the rendered prompts.
#include "runtime/src/chat_template.h"
#include "runtime/src/tokenizer.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

using json = nlohmann::json;

std::vector<g4::ChatMessage> messages_of(const json& c) {
    std::vector<g4::ChatMessage> msgs;
    for (const json& m : c["messages"])
        msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    return msgs;
}

TEST(ChatTemplate, MatchesJinjaReference) {
    const json doc = json::parse(g4test::read_file(g4test::fixture("tokenizer/chat_cases.json")));
    g4::Tokenizer tok;
    std::string err;
    ASSERT_TRUE(g4::Tokenizer::load_from_json(
        g4test::read_file(g4test::fixture("tokenizer/tiny/tokenizer.json")), &tok, &err))
        << err;
    ASSERT_GE(doc["cases"].size(), 4u);
    for (const json& c : doc["cases"]) {
        g4::ChatOptions opts;
        opts.add_generation_prompt = c["add_generation_prompt"].get<bool>();
        opts.bos_token             = doc["bos_token"].get<std::string>();
        std::string out;
        ASSERT_TRUE(g4::render_chat(messages_of(c), opts, &out, &err)) << c["name"] << ": " << err;
        EXPECT_EQ(out, c["rendered"].get<std::string>()) << c["name"];
        std::vector<int32_t> ids;
        ASSERT_TRUE(tok.encode(out, false, &ids));
        EXPECT_EQ(ids, c["tiny_ids"].get<std::vector<int32_t>>()) << c["name"];
    }
}

TEST(ChatTemplate, MinimalPrompt) {
    std::string out;
    ASSERT_TRUE(g4::render_chat({{"user", "Hello"}}, {}, &out));
    EXPECT_EQ(out, "<bos><|turn>user\nHello<turn|>\n<|turn>model\n");
}

TEST(ChatTemplate, EmptyConversationIsAnError) {
    std::string out = "x", err;
    EXPECT_FALSE(g4::render_chat({}, {}, &out, &err));
    EXPECT_FALSE(err.empty());
    EXPECT_EQ(out, "");
    EXPECT_FALSE(g4::render_chat({{"user", "x"}}, {}, nullptr));
}

TEST(ChatTemplate, StripsPythonWhitespace) {
    EXPECT_EQ(g4::strip_python_whitespace(" \t\n\v\f\r\x1c\x1f x y \xC2\xA0\xE3\x80\x80\xE2\x80\xA8"), "x y");
    EXPECT_EQ(g4::strip_python_whitespace("\xC2\x85z\xE2\x80\x8B"), "z\xE2\x80\x8B"); // U+200B is not space
    EXPECT_EQ(g4::strip_python_whitespace("   "), "");
    EXPECT_EQ(g4::strip_python_whitespace(""), "");
    EXPECT_EQ(g4::strip_python_whitespace("\xFF \xE3\x80"), "\xFF \xE3\x80");
    EXPECT_EQ(g4::strip_python_whitespace("\xC0\xA0x\xE0\x80\xA0"), "\xC0\xA0x\xE0\x80\xA0"); // overlong
}

TEST(ChatTemplate, ThinkingIsStrippedFromModelTurnsOnly) {
    std::string out;
    ASSERT_TRUE(
        g4::render_chat({{"user", "a<|channel>keep<channel|>b"},
                         {"assistant", " <|channel>thought\nx<channel|>ans<|channel>y<channel|>wer "}},
                        {false, "<bos>"}, &out));
    EXPECT_EQ(out, "<bos><|turn>user\na<|channel>keep<channel|>b<turn|>\n<|turn>model\nanswer<turn|>\n");
}

} // namespace
