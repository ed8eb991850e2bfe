// g4 serve: OpenAI tools in the chat template's tool syntax (ChatTemplate::Tools, recorded by the compiler in
// META "chat"): the declarations and earlier calls and results written into the messages the renderer gets,
// and the calls the model writes parsed out of its reply into OpenAI's tool_calls.
#pragma once
#include "runtime/src/chat_template.h"

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace g4::serve {

using OJson = nlohmann::ordered_json; // keeps the order of object keys, as the template's dict iteration does

// `v` in the template's argument syntax: strings quote-wrapped, numbers, booleans and null as JSON writes
// them, lists [a,b], objects {key:value,...} with bare keys in their order. With upper_types, the string
// values of "type" keys are upper-cased (a JSON schema's types, as the declarations write them).
std::string format_argument(const OJson& v, const ChatTemplate::Tools& t, bool upper_types = false);

// Parses one value in that syntax at the start of `s`; *used receives its length. False when it is malformed.
// Bare words other than numbers, true, false and null are read as strings.
bool parse_argument(std::string_view s, const ChatTemplate::Tools& t, OJson* out, size_t* used);

// Every tool's declaration ({declaration_start}NAME{description:...,parameters:...}{declaration_end}).
std::string tool_declarations(const OJson& tools, const ChatTemplate::Tools& t);
// One call ({call_start}NAME{ARGS}{call_end}) and one result ({response_start}NAME{RESULT}{response_end}); a
// result that is not a JSON object is written {value:"..."}.
std::string tool_call_text(const std::string& name, const OJson& arguments, const ChatTemplate::Tools& t);
std::string tool_result_text(const std::string& name, const std::string& content,
                             const ChatTemplate::Tools& t);

struct ToolCall {
    std::string name;
    OJson arguments; // an object
};

struct Reply {
    std::string content; // the text outside the calls
    std::vector<ToolCall> calls;
};

// Splits a generated reply into its text and its calls: every complete {call_start}NAME{ARGS}{call_end} whose
// ARGS parse as an object. Anything else (an unfinished call included) stays text.
Reply parse_reply(const std::string& text, const ChatTemplate::Tools& t);

// How much of a reply being generated may be streamed as text: up to the first call_start, or up to a suffix
// that could be the beginning of one.
size_t streamable_prefix(const std::string& text, const ChatTemplate::Tools& t);

} // namespace g4::serve
