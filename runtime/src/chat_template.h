// Gemma 4 (E2B/E4B) chat prompt renderer: a fixed C++ port of the text-only chat template
// (tests/fixtures/tokenizer/tiny/chat_template.jinja), no Jinja engine.
//
//   <bos>
//   [<|turn>system\n{first system/developer message, trimmed}<turn|>\n]
//   <|turn>{role}\n{content, trimmed}<turn|>\n      for every other message ("assistant" -> "model";
//                                                   model text has <|channel>…<channel|> removed)
//   [<|turn>model\n]                                generation prompt
//
// "Trimmed" is Python's str.strip() (Jinja's trim filter): Unicode whitespace at both ends.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace g4 {

struct ChatMessage {
    std::string role; // "system", "developer", "user", "assistant"/"model", or any other role name
    std::string content;
};

struct ChatOptions {
    bool add_generation_prompt = true;
    std::string bos_token      = "<bos>";
};

// Renders `messages` into *out. Returns false (with *err) for an empty conversation.
bool render_chat(const std::vector<ChatMessage>& messages, const ChatOptions& opts, std::string* out,
                 std::string* err = nullptr);

// Python str.strip() on UTF-8 text (invalid bytes are kept as non-space).
std::string_view strip_python_whitespace(std::string_view s);

} // namespace g4
