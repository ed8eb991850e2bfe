// Implementation of the Gemma 4 chat prompt renderer (see chat_template.h).
#include "runtime/src/chat_template.h"

#include <cstdint>

namespace g4 {
namespace {

// Python's str.isspace() set.
bool is_py_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

// Decodes a well-formed code point of at most 3 bytes (every whitespace character fits) starting
// at s[i]; returns its length, or 0 if there is none (then it is not whitespace).
size_t space_len_at(std::string_view s, size_t i) {
    auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k])); };
    uint32_t cp;
    size_t len;
    if (b(0) < 0x80)
        cp = b(0), len = 1;
    else if (b(0) >= 0xC2 && b(0) <= 0xDF && i + 1 < s.size() && (b(1) & 0xC0) == 0x80)
        cp = ((b(0) & 0x1F) << 6) | (b(1) & 0x3F), len = 2;
    else if ((b(0) & 0xF0) == 0xE0 && i + 2 < s.size() && (b(1) & 0xC0) == 0x80 && (b(2) & 0xC0) == 0x80)
        cp = ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F), len = 3;
    else
        return 0;
    if (len == 3 && cp < 0x800) return 0; // overlong encoding
    return is_py_space(cp) ? len : 0;
}

void append_model_text(std::string_view text, std::string* out) {
    // Jinja strip_thinking: split on "<channel|>", keep what precedes "<|channel>" in each part.
    constexpr std::string_view kOpen = "<|channel>", kClose = "<channel|>";
    std::string kept;
    size_t i = 0;
    while (true) {
        size_t close = text.find(kClose, i);
        std::string_view part =
            text.substr(i, close == std::string_view::npos ? std::string_view::npos : close - i);
        size_t open = part.find(kOpen);
        kept.append(open == std::string_view::npos ? part : part.substr(0, open));
        if (close == std::string_view::npos) break;
        i = close + kClose.size();
    }
    out->append(strip_python_whitespace(kept));
}

} // namespace

std::string_view strip_python_whitespace(std::string_view s) {
    size_t b = 0;
    while (b < s.size()) {
        size_t len = space_len_at(s, b);
        if (len == 0) break;
        b += len;
    }
    size_t e = s.size();
    while (e > b) {
        size_t start = e - 1;
        while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80 && e - start < 3)
            --start;
        size_t len = space_len_at(s, start);
        if (len == 0 || start + len != e) break;
        e = start;
    }
    return s.substr(b, e - b);
}

bool render_chat(const std::vector<ChatMessage>& messages, const ChatOptions& opts, std::string* out,
                 std::string* err, std::vector<ChatMediaMark>* marks) {
    if (!out) return false;
    out->clear();
    if (marks) marks->clear();
    if (messages.empty()) {
        if (err) *err = "chat template: no messages";
        return false;
    }
    try {
        out->append(opts.bos_token);
        size_t first = 0;
        if (messages[0].role == "system" || messages[0].role == "developer") {
            if (!messages[0].media.empty()) {
                out->clear();
                if (err)
                    *err = "chat template: the " + messages[0].role + " message cannot hold images or audio";
                return false;
            }
            out->append("<|turn>system\n");
            out->append(strip_python_whitespace(messages[0].content));
            out->append("<turn|>\n");
            first = 1;
        }
        for (size_t i = first; i < messages.size(); ++i) {
            const ChatMessage& m    = messages[i];
            const std::string& role = m.role == "assistant" ? std::string("model") : m.role;
            out->append("<|turn>").append(role).append("\n");
            for (size_t k = 0; k < m.media.size(); ++k) {
                const bool image = m.media[k] == ChatMedia::Image;
                if (image) out->append("\n\n");
                if (marks) marks->push_back({out->size(), i, k, m.media[k]});
                out->append(image ? kChatImageMarker : kChatAudioMarker);
                if (image) out->append("\n\n");
            }
            if (role == "model")
                append_model_text(m.content, out);
            else
                out->append(strip_python_whitespace(m.content));
            out->append("<turn|>\n");
        }
        if (opts.add_generation_prompt) out->append("<|turn>model\n");
        return true;
    } catch (...) {
        out->clear();
        if (marks) marks->clear();
        if (err) *err = "chat template: out of memory";
        return false;
    }
}

} // namespace g4
