// g4 serve: OpenAI response bodies: completions and chat completions, their streaming chunks, tool_calls,
// usage and error bodies (the HTTP layer, server.cpp, only sends them).
#pragma once
#include "tools/serve/tool_calls.h"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace g4::serve {

// {"error": {"message", "type", "param" (null when empty), "code"}}.
nlohmann::json error_body(const std::string& type, const std::string& param, const std::string& msg,
                          int code);

// A unique id "PREFIX-..." (chatcmpl, cmpl, call).
std::string response_id(const char* prefix);

// usage: the token counts, with OpenAI's prompt_tokens_details.cached_tokens (the prompt's tokens reused from
// the slot's session, not fed again).
nlohmann::json usage_json(int prompt_tokens, int completion_tokens, int cached_tokens = 0);

// OpenAI's tool_calls list for the calls of a reply (`index`: streaming's field).
nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, bool stream);

// The envelope of one response: chat or completion, its id, model and creation time.
struct Shape {
    bool chat = true;
    std::string id, model;
    long created = 0;

    nlohmann::json base(bool chunk) const;
    // One choice: a chat message (a delta when chunk; `first` adds the role), or a completion's text.
    nlohmann::json choice(const std::string& text, const nlohmann::json& finish, bool chunk,
                          bool first) const;
    // The whole non-streaming response for a finished reply. With tools (chat only) the reply's calls become
    // message.tool_calls and finish_reason "tool_calls", content the text around them (null when empty).
    nlohmann::json final_response(const std::string& text, const std::string& finish, int prompt_tokens,
                                  int completion_tokens, const ChatTemplate::Tools* tools,
                                  int cached_tokens = 0) const;
    // A stream's last chunk: the finish reason, the calls (if any) and the usage.
    nlohmann::json final_chunk(const std::vector<ToolCall>& calls, const std::string& finish,
                               int prompt_tokens, int completion_tokens, int cached_tokens = 0) const;
};

// JSON text with invalid UTF-8 replaced (U+FFFD) rather than refused.
std::string dump(const nlohmann::json& j);

} // namespace g4::serve
