// g4 serve: tool declarations, calls and results in the chat template's syntax (see tool_calls.h).
#include "tools/serve/tool_calls.h"

#include <cctype>
#include <cstdlib>

namespace g4::serve {

namespace {

std::string upper(std::string s) {
    for (char& c : s)
        c = (char)std::toupper((unsigned char)c);
    return s;
}

void format_to(const OJson& v, const ChatTemplate::Tools& t, bool upper_types, std::string* o) {
    if (v.is_string()) {
        *o += t.quote + v.get<std::string>() + t.quote;
    } else if (v.is_array()) {
        *o += '[';
        for (size_t i = 0; i < v.size(); ++i) {
            if (i) *o += ',';
            format_to(v[i], t, upper_types, o);
        }
        *o += ']';
    } else if (v.is_object()) {
        *o += '{';
        bool first = true;
        for (auto it = v.begin(); it != v.end(); ++it) {
            if (!first) *o += ',';
            first = false;
            *o += it.key() + ":";
            if (upper_types && it.key() == "type" && it.value().is_string())
                *o += t.quote + upper(it.value().get<std::string>()) + t.quote;
            else
                format_to(it.value(), t, upper_types, o);
        }
        *o += '}';
    } else {
        *o += v.dump();
    }
}

struct Parser {
    std::string_view s;
    const ChatTemplate::Tools& t;
    size_t i  = 0;
    int depth = 0;

    void skip_space() {
        while (i < s.size() && std::isspace((unsigned char)s[i]))
            ++i;
    }
    bool quoted(std::string* out) {
        if (s.compare(i, t.quote.size(), t.quote) != 0) return false;
        const size_t end = s.find(t.quote, i + t.quote.size());
        if (end == std::string_view::npos) return false;
        *out = std::string(s.substr(i + t.quote.size(), end - i - t.quote.size()));
        i    = end + t.quote.size();
        return true;
    }
    // A bare word: up to the next , : } ] (keys stop at ':', values at the rest).
    std::string bare(bool key) {
        const size_t b = i;
        while (i < s.size() && s[i] != ',' && s[i] != '}' && s[i] != ']' && (!key || s[i] != ':') &&
               s.compare(i, t.quote.size(), t.quote) != 0)
            ++i;
        std::string w(s.substr(b, i - b));
        while (!w.empty() && std::isspace((unsigned char)w.back()))
            w.pop_back();
        return w;
    }
    bool value(OJson* out) {
        if (++depth > 64) return false;
        skip_space();
        if (i >= s.size()) return false;
        bool ok = true;
        std::string str;
        if (quoted(&str)) {
            *out = str;
        } else if (s[i] == '{') {
            ++i;
            *out = OJson::object();
            skip_space();
            if (i < s.size() && s[i] == '}') {
                ++i;
            } else {
                for (;;) {
                    skip_space();
                    std::string k;
                    if (!quoted(&k)) k = bare(true);
                    skip_space();
                    if (k.empty() || i >= s.size() || s[i] != ':') return false;
                    ++i;
                    OJson v;
                    if (!value(&v)) return false;
                    (*out)[k] = std::move(v);
                    skip_space();
                    if (i < s.size() && s[i] == ',') {
                        ++i;
                        continue;
                    }
                    if (i < s.size() && s[i] == '}') {
                        ++i;
                        break;
                    }
                    return false;
                }
            }
        } else if (s[i] == '[') {
            ++i;
            *out = OJson::array();
            skip_space();
            if (i < s.size() && s[i] == ']') {
                ++i;
            } else {
                for (;;) {
                    OJson v;
                    if (!value(&v)) return false;
                    out->push_back(std::move(v));
                    skip_space();
                    if (i < s.size() && s[i] == ',') {
                        ++i;
                        continue;
                    }
                    if (i < s.size() && s[i] == ']') {
                        ++i;
                        break;
                    }
                    return false;
                }
            }
        } else {
            const std::string w = bare(false);
            if (w.empty()) return false;
            const OJson num = OJson::parse(w, nullptr, false);
            if (w == "true" || w == "false" || w == "null" || (!num.is_discarded() && num.is_number()))
                *out = num;
            else
                *out = w;
        }
        --depth;
        return ok;
    }
};

} // namespace

std::string format_argument(const OJson& v, const ChatTemplate::Tools& t, bool upper_types) {
    std::string o;
    format_to(v, t, upper_types, &o);
    return o;
}

bool parse_argument(std::string_view s, const ChatTemplate::Tools& t, OJson* out, size_t* used) {
    Parser p{s, t};
    if (!p.value(out)) return false;
    if (used) *used = p.i;
    return true;
}

std::string tool_declarations(const OJson& tools, const ChatTemplate::Tools& t) {
    std::string o;
    for (const OJson& tool : tools) {
        const OJson& f = tool["function"];
        o += t.declaration_start + f["name"].get<std::string>() + "{";
        bool any = false;
        if (f.contains("description") && f["description"].is_string() &&
            !f["description"].get<std::string>().empty()) {
            o += "description:" + t.quote +
                 std::string(strip_python_whitespace(f["description"].get<std::string>())) + t.quote;
            any = true;
        }
        if (f.contains("parameters") && f["parameters"].is_object()) {
            o += std::string(any ? "," : "") +
                 "parameters:" + format_argument(f["parameters"], t, t.upper_types);
        }
        o += "}" + t.declaration_end;
    }
    return o;
}

std::string tool_call_text(const std::string& name, const OJson& arguments, const ChatTemplate::Tools& t) {
    return t.call_start + name + format_argument(arguments.is_object() ? arguments : OJson::object(), t) +
           t.call_end;
}

std::string tool_result_text(const std::string& name, const std::string& content,
                             const ChatTemplate::Tools& t) {
    OJson r = OJson::parse(content, nullptr, false);
    if (r.is_discarded() || !r.is_object()) r = OJson{{"value", content}};
    return t.response_start + name + format_argument(r, t) + t.response_end;
}

Reply parse_reply(const std::string& text, const ChatTemplate::Tools& t) {
    Reply r;
    if (t.call_start.empty()) {
        r.content = text;
        return r;
    }
    size_t at = 0;
    while (at < text.size()) {
        const size_t b = text.find(t.call_start, at);
        if (b == std::string::npos) break;
        const size_t e = text.find(t.call_end, b + t.call_start.size());
        if (e == std::string::npos) break;
        const std::string body = text.substr(b + t.call_start.size(), e - b - t.call_start.size());
        const size_t brace     = body.find('{');
        OJson args;
        size_t used = 0;
        if (brace != std::string::npos && brace > 0 &&
            parse_argument(std::string_view(body).substr(brace), t, &args, &used) && args.is_object() &&
            body.find_first_not_of(" \t\r\n", brace + used) == std::string::npos) {
            std::string name = body.substr(0, brace);
            while (!name.empty() && std::isspace((unsigned char)name.back()))
                name.pop_back();
            r.content += text.substr(at, b - at);
            r.calls.push_back({name, std::move(args)});
        } else {
            r.content += text.substr(at, e + t.call_end.size() - at);
        }
        at = e + t.call_end.size();
    }
    r.content += text.substr(std::min(at, text.size()));
    return r;
}

size_t streamable_prefix(const std::string& text, const ChatTemplate::Tools& t) {
    if (t.call_start.empty()) return text.size();
    const size_t b = text.find(t.call_start);
    if (b != std::string::npos) return b;
    for (size_t k = std::min(text.size(), t.call_start.size() - 1); k > 0; --k)
        if (text.compare(text.size() - k, k, t.call_start, 0, k) == 0) return text.size() - k;
    return text.size();
}

} // namespace g4::serve
