// The chat prompt renderer and the META "chat" codec (see chat_template.h).
#include "runtime/src/chat_template.h"
#include "runtime/src/engine.h"

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

// Removes every span from `open` up to the next `close` (or the end), as a Jinja "strip thinking" macro
// does: split on close, keep what precedes open in each part.
std::string without_spans(std::string_view text, std::string_view open, std::string_view close) {
    std::string kept;
    size_t i = 0;
    while (true) {
        size_t c              = text.find(close, i);
        std::string_view part = text.substr(i, c == std::string_view::npos ? std::string_view::npos : c - i);
        size_t o              = part.find(open);
        kept.append(o == std::string_view::npos ? part : part.substr(0, o));
        if (c == std::string_view::npos) break;
        i = c + close.size();
    }
    return kept;
}

using json = nlohmann::json;

json media_json(const ChatTemplate::Media& m) {
    return {{"before", m.before}, {"marker", m.marker}, {"after", m.after}};
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

json ChatTemplate::to_json() const {
    json j = {{"bos", bos},
              {"system_roles", system_roles},
              {"system_start", system_start},
              {"system_end", system_end},
              {"turn_start", turn_start},
              {"role_end", role_end},
              {"turn_end", turn_end},
              {"role_names", role_names},
              {"generation_prompt", generation_prompt},
              {"trim", trim},
              {"reasoning", {{"role", reasoning.role}, {"open", reasoning.open}, {"close", reasoning.close}}},
              {"image", media_json(image)},
              {"audio", media_json(audio)}};
    if (!tools.call_start.empty())
        j["tools"] = {{"declaration_start", tools.declaration_start},
                      {"declaration_end", tools.declaration_end},
                      {"call_start", tools.call_start},
                      {"call_end", tools.call_end},
                      {"response_start", tools.response_start},
                      {"response_end", tools.response_end},
                      {"quote", tools.quote},
                      {"upper_types", tools.upper_types}};
    return j;
}

std::string ChatTemplate::from_json(const json& j, ChatTemplate* out) {
    if (!j.is_object()) return "not an object";
    ChatTemplate t;
    auto text = [&](const json& o, const char* k, std::string* v) {
        if (!o.is_object() || !o.contains(k) || !o[k].is_string())
            return std::string("no string '") + k + "'";
        *v = o[k].get<std::string>();
        return std::string();
    };
    std::string e;
    for (auto [k, v] : {std::pair{"bos", &t.bos},
                        {"system_start", &t.system_start},
                        {"system_end", &t.system_end},
                        {"turn_start", &t.turn_start},
                        {"role_end", &t.role_end},
                        {"turn_end", &t.turn_end},
                        {"generation_prompt", &t.generation_prompt}})
        if (!(e = text(j, k, v)).empty()) return e;
    for (auto [k, m] : {std::pair{"image", &t.image}, {"audio", &t.audio}})
        for (auto [f, v] : {std::pair{"before", &m->before}, {"marker", &m->marker}, {"after", &m->after}})
            if (!(e = text(j.contains(k) ? j[k] : json(), f, v)).empty()) return std::string(k) + ": " + e;
    for (auto [f, v] :
         {std::pair{"role", &t.reasoning.role}, {"open", &t.reasoning.open}, {"close", &t.reasoning.close}})
        if (!(e = text(j.contains("reasoning") ? j["reasoning"] : json(), f, v)).empty())
            return "reasoning: " + e;
    if (!j.contains("trim") || !j["trim"].is_boolean()) return "no boolean 'trim'";
    t.trim = j["trim"].get<bool>();
    if (!j.contains("system_roles") || !j["system_roles"].is_array()) return "no list 'system_roles'";
    for (const json& r : j["system_roles"]) {
        if (!r.is_string()) return "'system_roles' holds a non-string";
        t.system_roles.push_back(r.get<std::string>());
    }
    if (!j.contains("role_names") || !j["role_names"].is_object()) return "no object 'role_names'";
    for (auto it = j["role_names"].begin(); it != j["role_names"].end(); ++it) {
        if (!it.value().is_string()) return "'role_names' holds a non-string";
        t.role_names[it.key()] = it.value().get<std::string>();
    }
    if (!t.reasoning.role.empty() && (t.reasoning.open.empty() || t.reasoning.close.empty()))
        return "reasoning: empty open or close";
    if (t.image.marker.empty() || t.audio.marker.empty()) return "an empty media marker";
    if (j.contains("tools")) { // absent in plans compiled before tool pieces were recorded: no tool use
        const json& tj = j["tools"];
        for (auto [f, v] : {std::pair{"declaration_start", &t.tools.declaration_start},
                            {"declaration_end", &t.tools.declaration_end},
                            {"call_start", &t.tools.call_start},
                            {"call_end", &t.tools.call_end},
                            {"response_start", &t.tools.response_start},
                            {"response_end", &t.tools.response_end},
                            {"quote", &t.tools.quote}})
            if (!(e = text(tj, f, v)).empty()) return "tools: " + e;
        if (!tj.contains("upper_types") || !tj["upper_types"].is_boolean())
            return "tools: no boolean 'upper_types'";
        t.tools.upper_types = tj["upper_types"].get<bool>();
        if (t.tools.call_start.empty() || t.tools.call_end.empty() || t.tools.quote.empty())
            return "tools: an empty call_start, call_end or quote";
    }
    *out = std::move(t);
    return "";
}

bool plan_chat_template(const std::string& meta_json, ChatTemplate* out, std::string* err) {
    json meta = json::parse(meta_json, nullptr, false);
    if (meta.is_discarded() || !meta.is_object() || !meta.contains("chat")) {
        if (err)
            *err = "the plan records no chat template (META \"chat\"; plans compiled by an earlier g4 have "
                   "none): recompile it with g4 compile";
        return false;
    }
    if (std::string e = ChatTemplate::from_json(meta["chat"], out); !e.empty()) {
        if (err) *err = "the plan's chat template (META \"chat\") is malformed: " + e;
        return false;
    }
    return true;
}

bool render_chat(const ChatTemplate& tpl, const std::vector<ChatMessage>& messages, const ChatOptions& opts,
                 std::string* out, std::string* err, std::vector<ChatMediaMark>* marks) {
    if (!out) return false;
    out->clear();
    if (marks) marks->clear();
    if (messages.empty()) {
        if (err) *err = "chat template: no messages";
        return false;
    }
    auto content = [&](std::string_view text) {
        out->append(tpl.trim ? strip_python_whitespace(text) : text);
    };
    auto is_system = [&](const std::string& role) {
        for (const std::string& r : tpl.system_roles)
            if (r == role) return true;
        return false;
    };
    try {
        out->append(opts.bos_token.empty() ? tpl.bos : opts.bos_token);
        size_t first = 0;
        if (is_system(messages[0].role)) {
            if (!messages[0].media.empty()) {
                out->clear();
                if (err)
                    *err = "chat template: the " + messages[0].role + " message cannot hold images or audio";
                return false;
            }
            out->append(tpl.system_start);
            content(messages[0].content);
            out->append(tpl.system_end);
            first = 1;
        }
        for (size_t i = first; i < messages.size(); ++i) {
            const ChatMessage& m    = messages[i];
            const auto renamed      = tpl.role_names.find(m.role);
            const std::string& role = renamed != tpl.role_names.end() ? renamed->second : m.role;
            out->append(tpl.turn_start).append(role).append(tpl.role_end);
            for (size_t k = 0; k < m.media.size(); ++k) {
                const ChatTemplate::Media& md = m.media[k] == ChatMedia::Image ? tpl.image : tpl.audio;
                out->append(md.before);
                if (marks) marks->push_back({out->size(), i, k, m.media[k], md.marker.size()});
                out->append(md.marker).append(md.after);
            }
            if (!tpl.reasoning.role.empty() && role == tpl.reasoning.role)
                content(without_spans(m.content, tpl.reasoning.open, tpl.reasoning.close));
            else
                content(m.content);
            out->append(tpl.turn_end);
        }
        if (opts.add_generation_prompt) out->append(tpl.generation_prompt);
        return true;
    } catch (...) {
        out->clear();
        if (marks) marks->clear();
        if (err) *err = "chat template: out of memory";
        return false;
    }
}

bool engine_chat_template(const g4_engine* e, ChatTemplate* out, std::string* err) {
    return plan_chat_template(e->plan.meta_json(), out, err);
}

} // namespace g4
