// Chat prompt renderer driven by the pieces a plan records (META "chat", written by the compiler from the
// model's definition under models/): no Jinja engine and no model knowledge here.
//
//   {bos}
//   [{system_start}{first message if its role is in system_roles, trimmed}{system_end}]
//   {turn_start}{role, renamed by role_names}{role_end}{media}{content, trimmed}{turn_end}   every other
//   message
//   [{generation_prompt}]
//
// "Trimmed" (when the template says so) is Python's str.strip() (Jinja's trim filter): Unicode whitespace at
// both ends. In the turns of
// reasoning.role, every span from reasoning.open up to the next reasoning.close (or the end) is removed
// before trimming, as a template's "strip thinking" macro does. {media} is, for each image or clip of the
// message in order, {before}{marker}{after} of that kind; a caller replaces each marker with the model's
// media tokens (the marks say where they are).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

struct g4_engine;

namespace g4 {

enum class ChatMedia { Image, Audio };

struct ChatTemplate {
    std::string bos;
    std::vector<std::string> system_roles; // a first message with one of these roles is the preamble
    std::string system_start, system_end;
    std::string turn_start, role_end, turn_end;
    std::map<std::string, std::string> role_names; // role as given -> role as written
    std::string generation_prompt;
    bool trim = true; // contents trimmed as Python's str.strip() (Jinja's trim filter)
    struct Reasoning {
        std::string role, open, close; // role "": nothing removed
    } reasoning;
    struct Media {
        std::string before, marker, after;
    } image, audio;

    // META "chat" (one codec for the compiler that writes it and the runtime that reads it).
    nlohmann::json to_json() const;
    // "" when `j` is a complete template, else what is wrong with it.
    static std::string from_json(const nlohmann::json& j, ChatTemplate* out);
};

struct ChatMessage {
    std::string role; // "system", "developer", "user", "assistant"/"model", or any other role name
    std::string content;
    std::vector<ChatMedia> media = {}; // rendered before the content; not in the system preamble
};

// Where render_chat wrote a media marker: its byte offset and length in the output, and
// messages[message].media[item].
struct ChatMediaMark {
    size_t offset;
    size_t message, item;
    ChatMedia kind;
    size_t length = 0;
};

struct ChatOptions {
    bool add_generation_prompt = true;
    std::string bos_token; // "" = the template's
};

// Renders `messages` into *out, and the media markers' places into *marks when given (a marker in the
// text of a message is not listed). Returns false (with *err) for an empty conversation or media in the
// system preamble.
bool render_chat(const ChatTemplate& tpl, const std::vector<ChatMessage>& messages, const ChatOptions& opts,
                 std::string* out, std::string* err = nullptr, std::vector<ChatMediaMark>* marks = nullptr);

// The chat template a plan records (META "chat"); false with a one-line *err when the plan has none (a plan
// compiled before templates were recorded: recompile it) or a malformed one.
bool plan_chat_template(const std::string& meta_json, ChatTemplate* out, std::string* err);
bool engine_chat_template(const g4_engine* e, ChatTemplate* out, std::string* err);

// Python str.strip() on UTF-8 text (invalid bytes are kept as non-space).
std::string_view strip_python_whitespace(std::string_view s);

} // namespace g4
