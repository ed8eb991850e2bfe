// g4 serve's request layer without HTTP (tools/serve/request.*, tool_calls.*): OpenAI bodies checked into
// generation requests, tools and tool messages written in the template's tool syntax (Gemma 4's pieces,
// models/gemma4/chat.h), the model's calls parsed back, base64 and the API key comparison.
#include "models/gemma4/chat.h"
#include "tools/serve/request.h"
#include "tools/serve/response.h"
#include "tools/serve/tool_calls.h"

#include <gtest/gtest.h>

namespace {

using g4::serve::OJson;

const g4::ChatTemplate kTpl = g4::gemma4::chat_template();

g4::serve::RequestLimits limits() {
    g4::serve::RequestLimits l;
    l.tools = kTpl.tools;
    return l;
}

g4::serve::GenRequest chat(const char* body, const g4::serve::RequestLimits& l = limits()) {
    return g4::serve::parse_chat_request(OJson::parse(body), g4_sampling_params_default(), l);
}

int status_of(const char* body, const g4::serve::RequestLimits& l = limits()) {
    try {
        chat(body, l);
    } catch (const g4::serve::ApiError& e) {
        EXPECT_FALSE(std::string(e.what()).empty());
        return e.status;
    }
    return 200;
}

const char* kWeather =
    R"({"type": "function", "function": {"name": "get_weather", "description": " Weather. ",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}})";

TEST(ServeToolSyntax, ArgumentsRoundTrip) {
    const OJson cases[] = {
        OJson::parse(R"({"city": "Paris", "days": 2, "metric": true, "note": null})"),
        OJson::parse(R"({"z": [1, 2.5, "a,b", {"k": "v:w"}], "a": {}, "b": [], "s": "}] quotes \" inside"})"),
        OJson::parse(R"({"nested": {"deeper": {"list": [[1], [2, [3]]]}}, "neg": -4, "exp": 1e-07})"),
    };
    for (const OJson& v : cases) {
        const std::string s = g4::serve::format_argument(v, kTpl.tools);
        OJson back;
        size_t used = 0;
        ASSERT_TRUE(g4::serve::parse_argument(s, kTpl.tools, &back, &used)) << s;
        EXPECT_EQ(used, s.size());
        EXPECT_EQ(back, v) << s;
        EXPECT_EQ(s.find('"' + std::string("city\"")), std::string::npos) << "keys are bare: " << s;
    }
    // Strings are wrapped in the template's quote; object keys keep their order.
    EXPECT_EQ(g4::serve::format_argument(OJson::parse(R"({"b": "x", "a": 1})"), kTpl.tools),
              "{b:" + kTpl.tools.quote + "x" + kTpl.tools.quote + ",a:1}");
}

TEST(ServeToolSyntax, ParsesCallsOutOfAReply) {
    const auto& t         = kTpl.tools;
    const std::string c1  = g4::serve::tool_call_text("get_weather", OJson::parse(R"({"city": "Paris"})"), t);
    const std::string c2  = g4::serve::tool_call_text("add", OJson::parse(R"({"a": 1, "b": [2, 3]})"), t);
    const std::string bad = t.call_start + "broken{city:" + t.call_end;
    const g4::serve::Reply r = g4::serve::parse_reply("Let me check. " + c1 + c2 + " " + bad + " done", t);
    ASSERT_EQ(r.calls.size(), 2u);
    EXPECT_EQ(r.calls[0].name, "get_weather");
    EXPECT_EQ(r.calls[0].arguments, OJson::parse(R"({"city": "Paris"})"));
    EXPECT_EQ(r.calls[1].name, "add");
    EXPECT_EQ(r.calls[1].arguments, OJson::parse(R"({"a": 1, "b": [2, 3]})"));
    EXPECT_EQ(r.content, "Let me check.  " + bad + " done"); // a call that does not parse stays text
    // Unfinished: all text.
    const std::string half = "x " + c1.substr(0, c1.size() - 3);
    EXPECT_TRUE(g4::serve::parse_reply(half, t).calls.empty());
    EXPECT_EQ(g4::serve::parse_reply(half, t).content, half);
    // Streaming holds back a call and anything that may begin one.
    EXPECT_EQ(g4::serve::streamable_prefix("abc " + c1 + " tail", t), 4u);
    EXPECT_EQ(g4::serve::streamable_prefix("abc " + t.call_start.substr(0, 3), t), 4u);
    EXPECT_EQ(g4::serve::streamable_prefix("abc <", t), 4u);
    EXPECT_EQ(g4::serve::streamable_prefix("abc", t), 3u);
}

TEST(ServeRequest, ToolsGoIntoTheSystemTurnAndResultsAfterTheirCall) {
    const std::string body = std::string(R"({"tools": [)") + kWeather + R"(], "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"},
        {"role": "tool", "name": "get_weather", "content": "sunny"}]})";
    const auto r           = chat(body.c_str());
    EXPECT_TRUE(r.tools);
    ASSERT_EQ(r.messages.size(), 3u); // the tool results joined the assistant message
    const auto& t = kTpl.tools;
    EXPECT_EQ(r.messages[0].content.rfind("Be brief." + t.declaration_start + "get_weather{", 0), 0u)
        << r.messages[0].content;
    EXPECT_NE(r.messages[0].content.find("description:" + t.quote + "Weather." + t.quote), std::string::npos);
    EXPECT_NE(r.messages[0].content.find("type:" + t.quote + "OBJECT" + t.quote), std::string::npos);
    EXPECT_EQ(r.messages[2].role, "assistant");
    EXPECT_EQ(r.messages[2].content,
              g4::serve::tool_call_text("get_weather", OJson::parse(R"({"city": "Paris"})"), t) +
                  g4::serve::tool_result_text("get_weather", R"({"temp": 21})", t) +
                  g4::serve::tool_result_text("get_weather", "sunny", t));
    EXPECT_EQ(g4::serve::tool_result_text("f", "sunny", t),
              t.response_start + "f{value:" + t.quote + "sunny" + t.quote + "}" + t.response_end);
    // The rendered prompt holds the declaration inside the system turn.
    std::vector<g4::ChatMessage> msgs;
    for (const auto& m : r.messages)
        msgs.push_back({m.role, m.content});
    std::string out, err;
    ASSERT_TRUE(g4::render_chat(kTpl, msgs, {}, &out, &err)) << err;
    EXPECT_LT(out.find(t.declaration_start), out.find(kTpl.system_end));
}

TEST(ServeRequest, ToolsWithoutASystemMessageOpenOne) {
    const std::string body =
        std::string(R"({"tools": [)") + kWeather + R"(], "messages": [{"role": "user", "content": "hi"}]})";
    const auto r = chat(body.c_str());
    ASSERT_EQ(r.messages.size(), 2u);
    EXPECT_EQ(r.messages[0].role, "system");
    EXPECT_EQ(r.messages[0].content.rfind(kTpl.tools.declaration_start, 0), 0u);
    const std::string none = std::string(R"({"tool_choice": "none", "tools": [)") + kWeather +
                             R"(], "messages": [{"role": "user", "content": "hi"}]})";
    EXPECT_FALSE(chat(none.c_str()).tools);
    EXPECT_EQ(chat(none.c_str()).messages.size(), 1u);
}

TEST(ServeRequest, RefusesWhatItCannotDo) {
    // A tool result with nothing to answer, a tool message first, a forced call, a plan without tool syntax.
    EXPECT_EQ(status_of(R"({"messages": [{"role": "user", "content": "x"},
                                         {"role": "tool", "tool_call_id": "nope", "content": "1"}]})"),
              400);
    EXPECT_EQ(status_of(R"({"messages": [{"role": "tool", "name": "f", "content": "1"}]})"), 400);
    const std::string forced = std::string(R"({"tool_choice": "required", "tools": [)") + kWeather +
                               R"(], "messages": [{"role": "user", "content": "hi"}]})";
    EXPECT_EQ(status_of(forced.c_str()), 400);
    const std::string tools =
        std::string(R"({"tools": [)") + kWeather + R"(], "messages": [{"role": "user", "content": "hi"}]})";
    EXPECT_EQ(status_of(tools.c_str(), g4::serve::RequestLimits{}), 400);
    EXPECT_EQ(status_of(R"({"messages": [{"role": "user", "content": "x"}], "temperature": -1})"), 400);
    EXPECT_EQ(status_of(R"({"messages": [{"role": "user", "content": "x"}], "seed": 1.5})"), 400);
    EXPECT_EQ(status_of(R"({"messages": [{"role": "user", "content": [{"type": "image_url",
                            "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})"),
              400); // no vision tower in these limits
    EXPECT_EQ(status_of(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "stop": "END",
                            "top_k": -1, "repetition_penalty": 1.2})"),
              200);
}

// Fields that change nothing for g4 are accepted; the forms it cannot honour, and unknown fields, are
// refused.
TEST(ServeRequest, UnknownFieldsAndFieldsThatChangeNothing) {
    EXPECT_EQ(
        status_of(R"({"messages": [{"role": "user", "content": "x"}], "store": false, "metadata": {"a": "b"},
                            "service_tier": "auto", "response_format": {"type": "text"}, "logit_bias": {},
                            "user": "u", "n": 1, "logprobs": false, "parallel_tool_calls": true})"),
        200);
    EXPECT_EQ(status_of(R"({"messages": [{"role": "user", "content": "x"}],
                            "response_format": {"type": "json_object"}})"),
              400);
    EXPECT_EQ(status_of(R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 10}})"), 400);
    EXPECT_EQ(status_of(R"({"messages": [{"role": "user", "content": "x"}], "store": "yes"})"), 400);
    EXPECT_EQ(status_of(R"({"messages": [{"role": "user", "content": "x"}], "temprature": 0})"), 400);
}

TEST(ServeRequest, SamplingFieldsAndDefaults) {
    g4_sampling_params def = g4_sampling_params_default();
    def.temperature        = 0.7f;
    def.top_k              = 64;
    const auto r           = g4::serve::parse_chat_request(
                  OJson::parse(R"({"messages": [{"role": "user", "content": "x"}], "top_p": 0.5, "seed": 9,
                         "max_completion_tokens": 7, "stop": ["a", "b"]})"),
                  def, limits());
    EXPECT_FLOAT_EQ(r.sampling.temperature, 0.7f); // the plan's default where the request says nothing
    EXPECT_EQ(r.sampling.top_k, 64);
    EXPECT_FLOAT_EQ(r.sampling.top_p, 0.5f);
    EXPECT_EQ(r.sampling.seed, 9u);
    EXPECT_EQ(r.max_tokens, 7);
    EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
    const auto c = g4::serve::parse_completion_request(OJson::parse(R"({"prompt": ["one"], "stream": true})"),
                                                       def, limits());
    EXPECT_EQ(c.prompt, "one");
    EXPECT_TRUE(c.stream);
}

// OpenAI's shapes for a reply that calls tools, streaming or not, and for one that does not.
TEST(ServeResponse, ToolCallsInTheOpenAIShape) {
    const auto& t = kTpl.tools;
    const std::string text =
        g4::serve::tool_call_text("get_weather", OJson::parse(R"({"city": "Paris"})"), t);
    const g4::serve::Shape chat{true, "chatcmpl-1", "tiny", 5};
    const nlohmann::json r = chat.final_response(text, "stop", 11, 7, &t);
    EXPECT_EQ(r["object"], "chat.completion");
    const auto& c = r["choices"][0];
    EXPECT_EQ(c["finish_reason"], "tool_calls");
    EXPECT_TRUE(c["message"]["content"].is_null());
    ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
    const auto& call = c["message"]["tool_calls"][0];
    EXPECT_EQ(call["type"], "function");
    EXPECT_EQ(call["id"].get<std::string>().rfind("call-", 0), 0u);
    EXPECT_EQ(call["function"]["name"], "get_weather");
    EXPECT_EQ(nlohmann::json::parse(call["function"]["arguments"].get<std::string>()),
              nlohmann::json::parse(R"({"city": "Paris"})"));
    EXPECT_EQ(r["usage"],
              nlohmann::json::parse(R"({"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18,
                                                   "prompt_tokens_details": {"cached_tokens": 0}})"));
    EXPECT_EQ(chat.final_response("x", "stop", 11, 7, nullptr,
                                  5)["usage"]["prompt_tokens_details"]["cached_tokens"],
              5);
    // Without tools declared the same text is content; a completion is text whatever it holds.
    EXPECT_EQ(chat.final_response(text, "stop", 1, 1, nullptr)["choices"][0]["message"]["content"], text);
    const g4::serve::Shape cmpl{false, "cmpl-1", "tiny", 5};
    const nlohmann::json cr = cmpl.final_response("abc", "length", 1, 1, &t);
    EXPECT_EQ(cr["object"], "text_completion");
    EXPECT_EQ(cr["choices"][0]["text"], "abc");
    EXPECT_EQ(cr["choices"][0]["finish_reason"], "length");
    // The stream's last chunk carries the calls with their index.
    const g4::serve::Reply rep = g4::serve::parse_reply("hi " + text, t);
    const nlohmann::json fin   = chat.final_chunk(rep.calls, "stop", 11, 7);
    EXPECT_EQ(fin["object"], "chat.completion.chunk");
    EXPECT_EQ(fin["choices"][0]["finish_reason"], "tool_calls");
    EXPECT_EQ(fin["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
    EXPECT_EQ(fin["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(chat.final_chunk({}, "length", 1, 2)["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(g4::serve::error_body("invalid_request_error", "", "bad", 400)["error"]["param"], nullptr);
}

TEST(ServeRequest, Base64AndKeyComparison) {
    std::vector<uint8_t> out;
    ASSERT_TRUE(g4::serve::base64_decode("aGVsbG8gd29ybGQ=", &out));
    EXPECT_EQ(std::string(out.begin(), out.end()), "hello world");
    ASSERT_TRUE(g4::serve::base64_decode("aGk", &out)); // unpadded
    EXPECT_EQ(std::string(out.begin(), out.end()), "hi");
    EXPECT_FALSE(g4::serve::base64_decode("a$==", &out));
    EXPECT_FALSE(g4::serve::base64_decode("a", &out));
    EXPECT_TRUE(g4::serve::constant_time_equal("Bearer k", "Bearer k"));
    EXPECT_FALSE(g4::serve::constant_time_equal("Bearer k", "Bearer K"));
    EXPECT_FALSE(g4::serve::constant_time_equal("Bearer k", "Bearer k2"));
    EXPECT_FALSE(g4::serve::constant_time_equal("", "x"));
}

} // namespace
