// g4 serve: parsing and checking OpenAI request bodies (see request.h).
#include "tools/serve/request.h"

#include "runtime/src/media/media_decode.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <unistd.h>

namespace g4::serve {

using json = OJson;

ApiError bad_request(const std::string& param, const std::string& msg) {
    return ApiError(400, "invalid_request_error", param, msg);
}

bool constant_time_equal(const std::string& a, const std::string& b) {
    // Every byte of the longer string is read whatever the contents; the length difference is folded in.
    const size_t n     = std::max(a.size(), b.size());
    unsigned char diff = a.size() == b.size() ? 0 : 1;
    for (size_t i = 0; i < n; ++i) {
        const unsigned char x = i < a.size() ? (unsigned char)a[i] : 0;
        const unsigned char y = i < b.size() ? (unsigned char)b[i] : 0;
        diff |= (unsigned char)(x ^ y);
    }
    return diff == 0;
}

bool base64_decode(const std::string& in, std::vector<uint8_t>* out) {
    auto val = [](char c) -> int {
        if (c >= 'A' && c <= 'Z') return c - 'A';
        if (c >= 'a' && c <= 'z') return c - 'a' + 26;
        if (c >= '0' && c <= '9') return c - '0' + 52;
        if (c == '+' || c == '-') return 62;
        if (c == '/' || c == '_') return 63;
        return -1;
    };
    size_t n = in.size();
    while (n > 0 && in[n - 1] == '=')
        --n;
    if (in.size() - n > 2 || n % 4 == 1) return false;
    out->clear();
    out->reserve(n / 4 * 3 + 2);
    uint32_t acc = 0;
    int bits     = 0;
    for (size_t i = 0; i < n; ++i) {
        const int v = val(in[i]);
        if (v < 0) return false;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out->push_back((uint8_t)((acc >> bits) & 0xff));
        }
    }
    return true;
}

namespace {

// The fields a request may carry; any other is refused (a typo would otherwise be silently ignored).
const std::set<std::string> kCommonFields     = {"model",
                                                 "stream",
                                                 "stream_options",
                                                 "temperature",
                                                 "top_p",
                                                 "top_k",
                                                 "min_p",
                                                 "max_tokens",
                                                 "stop",
                                                 "seed",
                                                 "repetition_penalty",
                                                 "frequency_penalty",
                                                 "presence_penalty",
                                                 "n",
                                                 "user",
                                                 "ignore_eos",
                                                 "logprobs",
                                                 "store",
                                                 "metadata",
                                                 "service_tier",
                                                 "response_format",
                                                 "logit_bias"};
const std::set<std::string> kChatFields       = {"messages", "max_completion_tokens", "top_logprobs",
                                                 "tools",    "tool_choice",           "parallel_tool_calls"};
const std::set<std::string> kCompletionFields = {"prompt", "echo", "suffix", "best_of"};

std::string type_name(const json& v) {
    return std::string(v.type_name());
}

double number(const json& body, const char* key, double lo, double hi) {
    const json& v = body.at(key);
    if (!v.is_number())
        throw bad_request(key, std::string("'") + key + "' must be a number, not " + type_name(v));
    const double d = v.get<double>();
    if (!std::isfinite(d) || d < lo || d > hi)
        throw bad_request(key, std::string("'") + key + "' is " + v.dump() + "; it must be in [" +
                                   json(lo).dump() + ", " + json(hi).dump() + "]");
    return d;
}

long long integer(const json& body, const char* key, long long lo, long long hi) {
    const json& v = body.at(key);
    if (!v.is_number_integer() && !v.is_number_unsigned())
        throw bad_request(key, std::string("'") + key + "' must be an integer, not " + type_name(v));
    if (v.is_number_unsigned() && v.get<unsigned long long>() > (unsigned long long)LLONG_MAX)
        throw bad_request(key, std::string("'") + key + "' is out of range");
    const long long x = v.get<long long>();
    if (x < lo || x > hi)
        throw bad_request(key, std::string("'") + key + "' is " + std::to_string(x) + "; it must be in [" +
                                   std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return x;
}

bool boolean(const json& body, const char* key) {
    const json& v = body.at(key);
    if (!v.is_boolean())
        throw bad_request(key, std::string("'") + key + "' must be a boolean, not " + type_name(v));
    return v.get<bool>();
}

// The fields both endpoints share: sampling, limits, stop strings, streaming.
void parse_common(const json& body, const std::set<std::string>& extra, const g4_sampling_params& defaults,
                  const RequestLimits& limits, GenRequest* r) {
    if (!body.is_object()) throw bad_request("", "the request body must be a JSON object");
    for (const auto& [k, v] : body.items())
        if (!kCommonFields.count(k) && !extra.count(k)) throw bad_request(k, "unknown field '" + k + "'");
    if (body.contains("model")) {
        if (!body["model"].is_string()) throw bad_request("model", "'model' must be a string");
        r->model = body["model"].get<std::string>();
    }
    if (body.contains("stream")) r->stream = boolean(body, "stream");
    if (body.contains("stream_options") && !body["stream_options"].is_null()) {
        const json& so = body["stream_options"];
        if (!so.is_object()) throw bad_request("stream_options", "'stream_options' must be an object");
        for (const auto& [k, v] : so.items()) {
            if (k != "include_usage")
                throw bad_request("stream_options." + k, "unknown field 'stream_options." + k + "'");
            r->include_usage = boolean(so, "include_usage");
        }
    }
    r->sampling = defaults;
    if (body.contains("temperature")) r->sampling.temperature = (float)number(body, "temperature", 0, 100);
    if (body.contains("top_p")) r->sampling.top_p = (float)number(body, "top_p", 0, 1);
    if (r->sampling.top_p <= 0) throw bad_request("top_p", "'top_p' must be greater than 0");
    if (body.contains("top_k")) {
        const long long k = integer(body, "top_k", -1, 1 << 30);
        r->sampling.top_k = (int32_t)(k < 0 ? 0 : k); // -1: off, as vLLM takes it
    }
    if (body.contains("min_p")) r->sampling.min_p = (float)number(body, "min_p", 0, 1);
    if (body.contains("seed")) r->sampling.seed = (uint64_t)integer(body, "seed", 0, LLONG_MAX);
    if (body.contains("repetition_penalty"))
        r->sampling.repeat_penalty = (float)number(body, "repetition_penalty", 1e-6, 100);
    for (const char* k : {"frequency_penalty", "presence_penalty"})
        if (body.contains(k) && number(body, k, -2, 2) != 0)
            throw bad_request(k,
                              std::string("'") + k +
                                  "' is not supported; use 'repetition_penalty' (a multiplicative penalty)");
    if (body.contains("n") && integer(body, "n", 1, 1) != 1) throw bad_request("n", "'n' must be 1");
    if (body.contains("user") && !body["user"].is_string())
        throw bad_request("user", "'user' must be a string");
    if (body.contains("logprobs") && !body["logprobs"].is_null()) {
        const json& lp = body["logprobs"];
        if (!(lp.is_boolean() && !lp.get<bool>()))
            throw bad_request("logprobs", "'logprobs' is not supported");
    }
    // Fields that change nothing here are accepted (clients send them by default); the forms of the rest
    // that g4 cannot honour are refused rather than ignored.
    if (body.contains("store") && !body["store"].is_null()) boolean(body, "store");
    if (body.contains("metadata") && !body["metadata"].is_null() && !body["metadata"].is_object())
        throw bad_request("metadata", "'metadata' must be an object");
    if (body.contains("service_tier") && !body["service_tier"].is_null() && !body["service_tier"].is_string())
        throw bad_request("service_tier", "'service_tier' must be a string");
    if (body.contains("response_format") && !body["response_format"].is_null()) {
        const json& rf = body["response_format"];
        if (!rf.is_object() || !rf.contains("type") || rf["type"] != "text")
            throw bad_request("response_format",
                              "only 'response_format' {\"type\": \"text\"} is supported (g4 "
                              "does not constrain decoding to JSON)");
    }
    if (body.contains("logit_bias") && !body["logit_bias"].is_null() &&
        !(body["logit_bias"].is_object() && body["logit_bias"].empty()))
        throw bad_request("logit_bias", "'logit_bias' is not supported (only an empty object)");
    if (body.contains("ignore_eos")) r->ignore_eos = boolean(body, "ignore_eos");
    const long long cap   = limits.max_tokens > 0 ? limits.max_tokens : INT32_MAX;
    r->default_max_tokens = limits.max_tokens;
    for (const char* k : {"max_tokens", "max_completion_tokens"})
        if (body.contains(k) && !body[k].is_null()) r->max_tokens = (int32_t)integer(body, k, 1, cap);
    if (body.contains("stop") && !body["stop"].is_null()) {
        const json& s = body["stop"];
        if (s.is_string()) {
            r->stop.push_back(s.get<std::string>());
        } else if (s.is_array() && s.size() <= 4) {
            for (const json& x : s) {
                if (!x.is_string()) throw bad_request("stop", "'stop' must be a string or a list of strings");
                r->stop.push_back(x.get<std::string>());
            }
        } else {
            throw bad_request("stop", "'stop' must be a string or a list of at most 4 strings");
        }
        for (const std::string& x : r->stop)
            if (x.empty()) throw bad_request("stop", "a stop string must not be empty");
    }
    if (g4_sampling_params_check(&r->sampling) != G4_OK) throw bad_request("", g4_last_error_message());
}

// data:[<mime>][;base64],<data> -> bytes.
std::vector<uint8_t> data_url_bytes(const std::string& url, const std::string& param) {
    const size_t comma = url.find(',');
    if (comma == std::string::npos || url.compare(0, 5, "data:") != 0)
        throw bad_request(param, "a data URL must look like data:image/png;base64,...");
    const std::string head = url.substr(5, comma - 5);
    if (head.size() < 7 || head.compare(head.size() - 7, 7, ";base64") != 0)
        throw bad_request(param, "only base64 data URLs are supported (data:...;base64,...)");
    std::vector<uint8_t> bytes;
    if (!base64_decode(url.substr(comma + 1), &bytes))
        throw bad_request(param, "the data URL is not valid base64");
    return bytes;
}

// file:///abs/path, allowed only under limits.media_dir (compared after resolving links and "..").
std::string allowed_file(const std::string& url, const RequestLimits& limits, const std::string& param) {
    if (limits.media_dir.empty())
        throw bad_request(param, "file URLs are refused (start g4 serve with --media-dir DIR to allow files "
                                 "under DIR)");
    const std::string path = url.substr(7);
    char* real             = ::realpath(path.c_str(), nullptr);
    if (!real) throw bad_request(param, "file " + path + " does not exist or cannot be read");
    const std::string rp = real;
    std::free(real);
    const std::string& dir = limits.media_dir;
    if (rp.compare(0, dir.size(), dir) != 0 ||
        (rp.size() > dir.size() && rp[dir.size()] != '/' && dir != "/"))
        throw bad_request(param, "file " + path + " is outside the --media-dir " + dir);
    return rp;
}

MediaItem image_part(const json& part, const RequestLimits& limits, const std::string& param) {
    if (!limits.media.has_vision)
        throw bad_request(param, "this plan has no vision tower: images are not supported");
    const json& iu = part.contains("image_url") ? part["image_url"] : json();
    std::string url;
    if (iu.is_string())
        url = iu.get<std::string>();
    else if (iu.is_object() && iu.contains("url") && iu["url"].is_string())
        url = iu["url"].get<std::string>();
    else
        throw bad_request(param, "an image_url part needs \"image_url\": {\"url\": \"data:...\"}");
    MediaItem m;
    m.kind = G4_MEDIA_IMAGE;
    std::string err;
    if (url.compare(0, 7, "file://") == 0) {
        err =
            g4::media::load_image(allowed_file(url, limits, param), &m.image, limits.media.max_image_pixels);
    } else {
        const std::vector<uint8_t> bytes = data_url_bytes(url, param);
        err                              = g4::media::decode_image(bytes.data(), bytes.size(),
                                                                   "image (" + std::to_string(bytes.size()) + " bytes)", &m.image,
                                                                   limits.media.max_image_pixels);
    }
    if (!err.empty()) throw bad_request(param, err);
    return m;
}

// A temporary file holding `bytes`, removed when it goes out of scope (FFmpeg reads files).
struct TempFile {
    std::string path;
    explicit TempFile(const std::vector<uint8_t>& bytes, const std::string& param) {
        char name[]  = "/tmp/g4-serve-audio-XXXXXX";
        const int fd = ::mkstemp(name);
        if (fd < 0)
            throw ApiError(500, "server_error", param, "cannot create a temporary file for the audio");
        path       = name;
        size_t off = 0;
        while (off < bytes.size()) {
            const ssize_t w = ::write(fd, bytes.data() + off, bytes.size() - off);
            if (w <= 0) break;
            off += (size_t)w;
        }
        ::close(fd);
        if (off != bytes.size())
            throw ApiError(500, "server_error", param, "cannot write the audio to a temporary file");
    }
    ~TempFile() { ::unlink(path.c_str()); }
};

MediaItem audio_part(const json& part, const RequestLimits& limits, const std::string& param) {
    if (!limits.media.has_audio)
        throw bad_request(param, "this plan has no audio tower: audio is not supported");
    const json& ia = part.contains("input_audio") ? part["input_audio"] : json();
    if (!ia.is_object() || !ia.contains("data") || !ia["data"].is_string())
        throw bad_request(
            param, "an input_audio part needs \"input_audio\": {\"data\": BASE64, \"format\": \"wav\"}");
    std::vector<uint8_t> bytes;
    if (!base64_decode(ia["data"].get<std::string>(), &bytes))
        throw bad_request(param, "input_audio.data is not valid base64");
    const std::string fmt =
        ia.contains("format") && ia["format"].is_string() ? ia["format"].get<std::string>() : "wav";
    MediaItem m;
    m.kind                 = G4_MEDIA_AUDIO;
    const int rate         = limits.media.audio_sample_rate;
    const int64_t max_samp = limits.media.max_audio_samples;
    const std::string what = "audio (" + std::to_string(bytes.size()) + " bytes, " + fmt + ")";
    std::string err;
    if (fmt == "wav") err = g4::media::decode_wav(bytes.data(), bytes.size(), what, &m.audio, max_samp);
    if (fmt != "wav" || (!err.empty() && g4::media::have_ffmpeg())) {
        if (!g4::media::have_ffmpeg())
            throw bad_request(param, what + ": this build reads WAV only (built without FFmpeg)");
        TempFile tmp(bytes, param);
        err = g4::media::load_audio(tmp.path, rate, max_samp, &m.audio);
        if (!err.empty()) err = what + ": " + err;
    }
    if (!err.empty()) throw bad_request(param, err);
    if (m.audio.sample_rate != rate)
        throw bad_request(param, what + ": sample rate " + std::to_string(m.audio.sample_rate) +
                                     " Hz; the plan takes " + std::to_string(rate) + " Hz");
    return m;
}

std::string need_tool_syntax(const RequestLimits& limits, const std::string& param) {
    if (limits.tools.call_start.empty())
        throw bad_request(param,
                          "this plan's chat template records no tool syntax (a plan compiled before g4 "
                          "recorded it, or a model without tool use): recompile the plan with this g4");
    return "";
}

// The text of a content that may only hold text (a string, or a list of text parts).
std::string text_content(const json& c, const std::string& p) {
    if (c.is_string()) return c.get<std::string>();
    if (c.is_null()) return "";
    std::string out;
    if (c.is_array()) {
        for (const json& part : c) {
            if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
                !part["text"].is_string())
                throw bad_request(p, p + " may hold only text parts");
            out += part["text"].get<std::string>();
        }
        return out;
    }
    throw bad_request(p, p + " must be a string or a list of text parts");
}

// An assistant message's tool_calls, written in the template's call syntax; their ids are remembered for
// the tool results that answer them.
std::string calls_text(const json& calls, const std::string& p, const RequestLimits& limits,
                       std::map<std::string, std::string>* names) {
    need_tool_syntax(limits, p);
    if (!calls.is_array()) throw bad_request(p, p + " must be a list");
    std::string out;
    for (size_t k = 0; k < calls.size(); ++k) {
        const std::string pk = p + "[" + std::to_string(k) + "]";
        const json& c        = calls[k];
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object() ||
            !c["function"].contains("name") || !c["function"]["name"].is_string())
            throw bad_request(pk, pk + " must be {\"id\", \"type\": \"function\", \"function\": {\"name\", "
                                       "\"arguments\"}}");
        const std::string name = c["function"]["name"].get<std::string>();
        json args              = json::object();
        if (c["function"].contains("arguments")) {
            const json& a = c["function"]["arguments"];
            args          = a.is_string() ? json::parse(a.get<std::string>(), nullptr, false) : a;
            if (args.is_discarded() || !args.is_object())
                throw bad_request(pk + ".function.arguments",
                                  "the arguments must be a JSON object (as a string)");
        }
        if (c.contains("id") && c["id"].is_string()) (*names)[c["id"].get<std::string>()] = name;
        out += tool_call_text(name, args, limits.tools);
    }
    return out;
}

Message parse_message(const json& m, size_t i, const RequestLimits& limits) {
    const std::string p = "messages[" + std::to_string(i) + "]";
    Message out;
    out.role      = m["role"].get<std::string>();
    const json& c = m.contains("content") ? m["content"] : json();
    if (c.is_string()) {
        out.content = c.get<std::string>();
    } else if (c.is_array()) {
        for (size_t j = 0; j < c.size(); ++j) {
            const std::string pp = p + ".content[" + std::to_string(j) + "]";
            const json& part     = c[j];
            if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
                throw bad_request(pp, pp + " must be an object with a string 'type'");
            const std::string type = part["type"].get<std::string>();
            if (type == "text") {
                if (!part.contains("text") || !part["text"].is_string())
                    throw bad_request(pp, pp + " (text) needs a string 'text'");
                out.content += part["text"].get<std::string>();
            } else if (type == "image_url") {
                out.media.push_back(image_part(part, limits, pp));
            } else if (type == "input_audio") {
                out.media.push_back(audio_part(part, limits, pp));
            } else {
                throw bad_request(pp, "content part type '" + type +
                                          "' is not one of text, image_url, input_audio");
            }
        }
    } else if (!(c.is_null() && out.role == "assistant" && m.contains("tool_calls"))) {
        throw bad_request(p + ".content", p + ".content must be a string or a list of content parts");
    }
    if (!out.media.empty() && out.role != "user")
        throw bad_request(p + ".content", "images and audio belong in user messages");
    return out;
}

// The messages, with tool calls and results in the template's syntax (see parse_chat_request).
std::vector<Message> parse_messages(const json& ms, const RequestLimits& limits) {
    std::vector<Message> out;
    std::map<std::string, std::string> call_names; // tool_call_id -> function name
    for (size_t i = 0; i < ms.size(); ++i) {
        const std::string p = "messages[" + std::to_string(i) + "]";
        const json& m       = ms[i];
        if (!m.is_object()) throw bad_request(p, p + " must be an object");
        for (const auto& [k, v] : m.items())
            if (k != "role" && k != "content" && k != "name" && k != "tool_calls" && k != "tool_call_id")
                throw bad_request(p + "." + k, "unknown field '" + k + "' in " + p);
        if (!m.contains("role") || !m["role"].is_string())
            throw bad_request(p + ".role", p + " needs a string 'role'");
        const std::string role = m["role"].get<std::string>();
        if (role != "system" && role != "developer" && role != "user" && role != "assistant" &&
            role != "tool")
            throw bad_request(p + ".role",
                              "role '" + role + "' is not one of system, developer, user, assistant, tool");
        if (m.contains("tool_calls") && role != "assistant")
            throw bad_request(p + ".tool_calls", "only assistant messages hold tool_calls");
        if (role != "tool") {
            out.push_back(parse_message(m, i, limits));
            if (m.contains("tool_calls") && !m["tool_calls"].is_null())
                out.back().content += calls_text(m["tool_calls"], p + ".tool_calls", limits, &call_names);
            continue;
        }
        need_tool_syntax(limits, p);
        std::string name = m.contains("name") && m["name"].is_string() ? m["name"].get<std::string>() : "";
        if (name.empty() && m.contains("tool_call_id") && m["tool_call_id"].is_string() &&
            call_names.count(m["tool_call_id"].get<std::string>()))
            name = call_names[m["tool_call_id"].get<std::string>()];
        if (name.empty())
            throw bad_request(p + ".tool_call_id",
                              p + ": the tool_call_id names no call of an earlier assistant "
                                  "message (or give 'name')");
        if (out.empty() || out.back().role != "assistant")
            throw bad_request(p,
                              p + ": a tool result must follow the assistant message whose call it answers");
        out.back().content += tool_result_text(
            name, text_content(m.contains("content") ? m["content"] : json(), p + ".content"), limits.tools);
    }
    return out;
}

// Declared tools, written into the system message (true), or nothing to do (false: none, or tool_choice
// none).
bool add_tools(const json& body, const RequestLimits& limits, std::vector<Message>* msgs) {
    if (body.contains("parallel_tool_calls") && !body["parallel_tool_calls"].is_boolean())
        throw bad_request("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    const json tools = body.contains("tools") ? body["tools"] : json();
    if (tools.is_null() || (tools.is_array() && tools.empty())) return false;
    if (!tools.is_array()) throw bad_request("tools", "'tools' must be a list");
    if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
        const json& tc = body["tool_choice"];
        if (tc == "none") return false;
        if (tc != "auto")
            throw bad_request("tool_choice",
                              "'tool_choice' may be \"auto\" or \"none\" (g4 does not constrain "
                              "decoding to force a call)");
    }
    need_tool_syntax(limits, "tools");
    for (size_t k = 0; k < tools.size(); ++k) {
        const std::string p = "tools[" + std::to_string(k) + "]";
        const json& t       = tools[k];
        if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") ||
            !t["function"].is_object() || !t["function"].contains("name") ||
            !t["function"]["name"].is_string() || t["function"]["name"].get<std::string>().empty())
            throw bad_request(p, p + " must be {\"type\": \"function\", \"function\": {\"name\", ...}}");
        const json& f = t["function"];
        if (f.contains("description") && !f["description"].is_string())
            throw bad_request(p + ".function.description", "a tool's description must be a string");
        if (f.contains("parameters") && !f["parameters"].is_object())
            throw bad_request(p + ".function.parameters", "a tool's parameters must be a JSON schema object");
    }
    const std::string decl = tool_declarations(tools, limits.tools);
    if (!msgs->empty() && (msgs->front().role == "system" || msgs->front().role == "developer"))
        msgs->front().content += decl;
    else
        msgs->insert(msgs->begin(), Message{"system", decl, {}});
    return true;
}

} // namespace

GenRequest parse_chat_request(const json& body, const g4_sampling_params& defaults,
                              const RequestLimits& limits) {
    GenRequest r;
    r.chat = true;
    parse_common(body, kChatFields, defaults, limits, &r);
    if (body.contains("top_logprobs") && !body["top_logprobs"].is_null())
        throw bad_request("top_logprobs", "'top_logprobs' is not supported");
    if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
        throw bad_request("messages", "'messages' must be a non-empty list");
    r.messages = parse_messages(body["messages"], limits);
    r.tools    = add_tools(body, limits, &r.messages);
    return r;
}

GenRequest parse_completion_request(const json& body, const g4_sampling_params& defaults,
                                    const RequestLimits& limits) {
    GenRequest r;
    r.chat = false;
    parse_common(body, kCompletionFields, defaults, limits, &r);
    if (body.contains("echo") && boolean(body, "echo")) throw bad_request("echo", "'echo' is not supported");
    if (body.contains("suffix") && !body["suffix"].is_null())
        throw bad_request("suffix", "'suffix' is not supported");
    if (body.contains("best_of") && integer(body, "best_of", 1, 1) != 1)
        throw bad_request("best_of", "'best_of' must be 1");
    const json& p = body.contains("prompt") ? body["prompt"] : json();
    if (p.is_string())
        r.prompt = p.get<std::string>();
    else if (p.is_array() && p.size() == 1 && p[0].is_string())
        r.prompt = p[0].get<std::string>();
    else
        throw bad_request("prompt", "'prompt' must be a string (or a list of one string)");
    return r;
}

} // namespace g4::serve
