// Chat template tests: the runtime's renderer with Gemma 4's template pieces (models/gemma4/chat.h) against
// the Jinja template rendered by transformers (tests/fixtures/tokenizer/chat_cases.json), plus tokenization
// of the rendered prompts, and the pieces a compiled plan records (META "chat") through the C API.
#include "g4/g4.h"
#include "models/gemma4/chat.h"
#include "runtime/plan/plan_format.h"
#include "runtime/src/chat_template.h"
#include "runtime/src/tokenizer.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

using json = nlohmann::json;

const g4::ChatTemplate kGemma4 = g4::gemma4::chat_template();

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
        ASSERT_TRUE(g4::render_chat(kGemma4, messages_of(c), opts, &out, &err)) << c["name"] << ": " << err;
        EXPECT_EQ(out, c["rendered"].get<std::string>()) << c["name"];
        std::vector<int32_t> ids;
        ASSERT_TRUE(tok.encode(out, false, &ids));
        EXPECT_EQ(ids, c["tiny_ids"].get<std::vector<int32_t>>()) << c["name"];
    }
}

TEST(ChatTemplate, MinimalPrompt) {
    std::string out;
    ASSERT_TRUE(g4::render_chat(kGemma4, {{"user", "Hello"}}, {}, &out));
    EXPECT_EQ(out, "<bos><|turn>user\nHello<turn|>\n<|turn>model\n");
}

TEST(ChatTemplate, EmptyConversationIsAnError) {
    std::string out = "x", err;
    EXPECT_FALSE(g4::render_chat(kGemma4, {}, {}, &out, &err));
    EXPECT_FALSE(err.empty());
    EXPECT_EQ(out, "");
    EXPECT_FALSE(g4::render_chat(kGemma4, {{"user", "x"}}, {}, nullptr));
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
        g4::render_chat(kGemma4,
                        {{"user", "a<|channel>keep<channel|>b"},
                         {"assistant", " <|channel>thought\nx<channel|>ans<|channel>y<channel|>wer "}},
                        {false, "<bos>"}, &out));
    EXPECT_EQ(out, "<bos><|turn>user\na<|channel>keep<channel|>b<turn|>\n<|turn>model\nanswer<turn|>\n");
}

// Gemma 4's template writes a message with content [{"type": "image"}, {"type": "image"}, {"type": "audio"},
// {"type": "text"}] as "\n\n<|image|>\n\n" per image and "<|audio|>" per clip before the trimmed text; the
// marks name each marker's offset (a marker typed in the text is not one).
TEST(ChatTemplate, MediaGoBeforeTheText) {
    using g4::ChatMedia;
    std::vector<g4::ChatMessage> msgs = {
        {"system", "Sys"},
        {"user", "  Describe <|image|> ", {ChatMedia::Image, ChatMedia::Image, ChatMedia::Audio}},
        {"assistant", "Two cats."},
        {"user", "", {ChatMedia::Audio}},
        {"user", "\n", {ChatMedia::Image}}};
    std::string out, err;
    std::vector<g4::ChatMediaMark> marks;
    ASSERT_TRUE(g4::render_chat(kGemma4, msgs, {}, &out, &err, &marks)) << err;
    EXPECT_EQ(out, "<bos><|turn>system\nSys<turn|>\n"
                   "<|turn>user\n\n\n<|image|>\n\n\n\n<|image|>\n\n<|audio|>Describe <|image|><turn|>\n"
                   "<|turn>model\nTwo cats.<turn|>\n"
                   "<|turn>user\n<|audio|><turn|>\n"
                   "<|turn>user\n\n\n<|image|>\n\n<turn|>\n<|turn>model\n");
    ASSERT_EQ(marks.size(), 5u);
    const size_t msg[] = {1, 1, 1, 3, 4}, item[] = {0, 1, 2, 0, 0};
    for (size_t i = 0; i < marks.size(); ++i) {
        const std::string_view want = marks[i].kind == ChatMedia::Image ? "<|image|>" : "<|audio|>";
        EXPECT_EQ(marks[i].length, want.size()) << i;
        EXPECT_EQ(out.substr(marks[i].offset, want.size()), want) << i;
        EXPECT_EQ(marks[i].message, msg[i]) << i;
        EXPECT_EQ(marks[i].item, item[i]) << i;
        EXPECT_EQ(marks[i].kind, msgs[msg[i]].media[item[i]]) << i;
    }
    EXPECT_EQ(out.find("<|image|>", marks[1].offset + 1), out.find("<|image|><turn|>")); // the typed one
    EXPECT_FALSE(g4::render_chat(kGemma4, {{"system", "x", {ChatMedia::Image}}, {"user", "y"}}, {}, &out,
                                 &err, &marks));
    EXPECT_NE(err.find("system"), std::string::npos) << err;
    EXPECT_TRUE(marks.empty());
}

// A compiled plan records the template's pieces (META "chat"), and the C API renders with them exactly what
// the checkpoint's chat_template.jinja renders (the reference cases were rendered by transformers from the
// same template text).
TEST(ChatTemplate, PlanRecordsPiecesThatRenderTheCheckpointTemplate) {
    ASSERT_EQ(g4test::read_file(g4test::fixture("e2b_tiny_mm/chat_template.jinja")),
              g4test::read_file(g4test::fixture("tokenizer/tiny/chat_template.jinja")));
    g4test::TempDir dir;
    const std::string plan = dir.file("mm.g4plan");
    g4test::CmdResult r    = g4test::run_g4("compile --model '" + g4test::fixture("e2b_tiny_mm") +
                                            "' --weights bf16 --max-context 128 -o '" + plan + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    g4_engine* e = nullptr;
    ASSERT_EQ(g4_engine_open(plan.c_str(), nullptr, &e), G4_OK) << g4_last_error_message();
    const json doc = json::parse(g4test::read_file(g4test::fixture("tokenizer/chat_cases.json")));
    ASSERT_EQ(doc["bos_token"].get<std::string>(), "<bos>");
    for (const json& c : doc["cases"]) {
        std::vector<g4_chat_message> msgs;
        for (const json& m : c["messages"])
            msgs.push_back({m["role"].get_ref<const std::string&>().c_str(),
                            m["content"].get_ref<const std::string&>().c_str()});
        const int gen = c["add_generation_prompt"].get<bool>() ? 1 : 0;
        size_t n      = 0;
        std::string out(4096, '\0');
        ASSERT_EQ(g4_chat_render(e, msgs.data(), msgs.size(), gen, out.data(), out.size(), &n), G4_OK)
            << c["name"] << ": " << g4_last_error_message();
        out.resize(n);
        EXPECT_EQ(out, c["rendered"].get<std::string>()) << c["name"];
    }
    g4_engine_close(e);
}

// The tool syntax pieces survive the META codec; pieces without them (plans compiled before they were
// recorded) read as a template without tool use, and incomplete ones are refused.
TEST(ChatTemplate, ToolPiecesRoundTrip) {
    g4::ChatTemplate back;
    ASSERT_EQ(g4::ChatTemplate::from_json(kGemma4.to_json(), &back), "");
    EXPECT_EQ(back.tools.call_start, kGemma4.tools.call_start);
    EXPECT_EQ(back.tools.quote, kGemma4.tools.quote);
    EXPECT_EQ(back.tools.declaration_end, kGemma4.tools.declaration_end);
    EXPECT_EQ(back.tools.upper_types, kGemma4.tools.upper_types);
    json old = kGemma4.to_json();
    old.erase("tools");
    ASSERT_EQ(g4::ChatTemplate::from_json(old, &back), "");
    EXPECT_TRUE(back.tools.call_start.empty());
    json bad                 = kGemma4.to_json();
    bad["tools"]["call_end"] = "";
    EXPECT_NE(g4::ChatTemplate::from_json(bad, &back), "");
}

// A plan without the pieces (compiled before they were recorded) refuses to render chat with one line that
// says to recompile it; the rest of the plan still loads.
TEST(ChatTemplate, PlanWithoutPiecesRefusesChat) {
    g4test::TempDir dir;
    const std::string plan = dir.file("t.g4plan");
    g4test::CmdResult r    = g4test::run_g4("compile --model '" + g4test::fixture("e2b_tiny") +
                                            "' --weights bf16 --max-context 64 -o '" + plan + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::string bytes             = g4test::read_file(plan);
    const auto [meta_at, meta_nb] = g4test::plan_section(bytes, (uint32_t)g4::plan::SectionKind::Meta);
    const size_t key              = bytes.substr(meta_at, meta_nb).find("\"chat\":");
    ASSERT_NE(key, std::string::npos);
    bytes[meta_at + key + 4] = 'X'; // "chaX": the same length, so the META section keeps its size
    g4test::reseal_plan(&bytes);
    g4test::write_file(plan, bytes);
    g4_engine* e = nullptr;
    ASSERT_EQ(g4_engine_open(plan.c_str(), nullptr, &e), G4_OK) << g4_last_error_message();
    g4_chat_message msg = {"user", "Hi"};
    size_t n            = 0;
    char out[256];
    EXPECT_EQ(g4_chat_render(e, &msg, 1, 1, out, sizeof out, &n), G4_ERR_UNSUPPORTED);
    const std::string err = g4_last_error_message();
    EXPECT_NE(err.find("no chat template"), std::string::npos) << err;
    EXPECT_NE(err.find("recompile"), std::string::npos) << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
    g4_engine_close(e);
}

} // namespace
