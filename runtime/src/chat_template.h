// Gemma 4 (E2B/E4B) chat prompt renderer: a fixed C++ port of the chat template's text and media
// parts (tests/fixtures/tokenizer/tiny/chat_template.jinja is the text-only subset), no Jinja engine.
//
//   <bos>
//   [<|turn>system\n{first system/developer message, trimmed}<turn|>\n]
//   <|turn>{role}\n{media}{content, trimmed}<turn|>\n   for every other message ("assistant" -> "model";
//                                                   model text has <|channel>…<channel|> removed)
//   [<|turn>model\n]                                generation prompt
//
// "Trimmed" is Python's str.strip() (Jinja's trim filter): Unicode whitespace at both ends. {media} is
// what Gemma 4's template writes for a message whose content is [{"type": "image"}, ...,
// {"type": "text"}]: "\n\n<|image|>\n\n" for each image and "<|audio|>" for each clip, in order; the
// processor then replaces each marker with <boi>/<boa>, the soft-token placeholders and <eoi>/<eoa>.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace g4 {

enum class ChatMedia { Image, Audio };

inline constexpr std::string_view kChatImageMarker = "<|image|>", kChatAudioMarker = "<|audio|>";

struct ChatMessage {
    std::string role; // "system", "developer", "user", "assistant"/"model", or any other role name
    std::string content;
    std::vector<ChatMedia> media = {}; // rendered before the content; not in the system preamble
};

// Where render_chat wrote a media marker: its byte offset in the output, and messages[message].media[item].
struct ChatMediaMark {
    size_t offset;
    size_t message, item;
    ChatMedia kind;
};

struct ChatOptions {
    bool add_generation_prompt = true;
    std::string bos_token      = "<bos>";
};

// Renders `messages` into *out, and the media markers' places into *marks when given (a marker in the
// text of a message is not listed). Returns false (with *err) for an empty conversation or media in the
// system preamble.
bool render_chat(const std::vector<ChatMessage>& messages, const ChatOptions& opts, std::string* out,
                 std::string* err = nullptr, std::vector<ChatMediaMark>* marks = nullptr);

// Python str.strip() on UTF-8 text (invalid bytes are kept as non-space).
std::string_view strip_python_whitespace(std::string_view s);

} // namespace g4
