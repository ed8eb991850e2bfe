// g4 serve: OpenAI response bodies (see response.h).
#include "tools/serve/response.h"

#include <atomic>
#include <cstdio>
#include <random>

namespace g4::serve {

using nlohmann::json;

json error_body(const std::string& type, const std::string& param, const std::string& msg, int code) {
    return {{"error",
             {{"message", msg},
              {"type", type},
              {"param", param.empty() ? json() : json(param)},
              {"code", code}}}};
}

std::string response_id(const char* prefix) {
    static std::atomic<uint64_t> counter{0};
    static const uint64_t salt = ((uint64_t)std::random_device{}() << 32) ^ std::random_device{}();
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s-%016llx%08llx", prefix, (unsigned long long)salt,
                  (unsigned long long)(counter++ & 0xffffffffu));
    return buf;
}

json usage_json(int prompt_tokens, int completion_tokens, int cached_tokens) {
    return {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

std::string dump(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json tool_calls_json(const std::vector<ToolCall>& calls, bool stream) {
    json out = json::array();
    for (size_t k = 0; k < calls.size(); ++k) {
        json c = {{"id", response_id("call")},
                  {"type", "function"},
                  {"function",
                   {{"name", calls[k].name},
                    {"arguments", calls[k].arguments.dump(-1, ' ', false, json::error_handler_t::replace)}}}};
        if (stream) c["index"] = k;
        out.push_back(std::move(c));
    }
    return out;
}

json Shape::base(bool chunk) const {
    return {{"id", id},
            {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
            {"created", created},
            {"model", model}};
}

json Shape::choice(const std::string& text, const json& finish, bool chunk, bool first) const {
    json c = {{"index", 0}, {"finish_reason", finish}};
    if (!chat) {
        c["text"]     = text;
        c["logprobs"] = nullptr;
    } else if (chunk) {
        c["delta"] = first ? json{{"role", "assistant"}, {"content", text}} : json{{"content", text}};
    } else {
        c["message"] = {{"role", "assistant"}, {"content", text}};
    }
    return c;
}

json Shape::final_response(const std::string& text, const std::string& finish, int prompt_tokens,
                           int completion_tokens, const ChatTemplate::Tools* tools, int cached_tokens) const {
    json out = base(false);
    json c;
    if (chat && tools) {
        const Reply r = parse_reply(text, *tools);
        c             = choice(r.content, r.calls.empty() ? finish : "tool_calls", false, false);
        if (!r.calls.empty()) {
            c["message"]["tool_calls"] = tool_calls_json(r.calls, false);
            if (r.content.empty()) c["message"]["content"] = nullptr;
        }
    } else {
        c = choice(text, finish, false, false);
    }
    out["choices"] = json::array({c});
    out["usage"]   = usage_json(prompt_tokens, completion_tokens, cached_tokens);
    return out;
}

json Shape::final_chunk(const std::vector<ToolCall>& calls, const std::string& finish, int prompt_tokens,
                        int completion_tokens, int cached_tokens) const {
    json fin       = base(true);
    fin["choices"] = json::array({choice("", calls.empty() ? finish : "tool_calls", true, false)});
    if (!calls.empty()) fin["choices"][0]["delta"] = {{"tool_calls", tool_calls_json(calls, true)}};
    fin["usage"] = usage_json(prompt_tokens, completion_tokens, cached_tokens);
    return fin;
}

} // namespace g4::serve
