// g4 serve: an OpenAI request body (POST /v1/chat/completions, /v1/completions) checked and turned into a
// generation request: messages with their images and audio decoded, sampling parameters, limits. Everything
// that can be refused without running the model is refused here, as an ApiError the HTTP layer turns into an
// OpenAI-style error body.
#pragma once
#include "g4/g4.h"
#include "runtime/src/media/audio_io.h"
#include "runtime/src/media/image_io.h"
#include "tools/serve/tool_calls.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace g4::serve {

// A request the server refuses: HTTP status, OpenAI error type ("invalid_request_error", ...), the offending
// field ("messages[1].content", may be empty) and one line saying what is wrong.
struct ApiError : std::runtime_error {
    int status;
    std::string type, param;
    ApiError(int status_, std::string type_, std::string param_, const std::string& msg)
        : std::runtime_error(msg), status(status_), type(std::move(type_)), param(std::move(param_)) {}
};
ApiError bad_request(const std::string& param, const std::string& msg);

struct MediaItem {
    g4_media_kind kind = G4_MEDIA_IMAGE;
    g4::media::ImageRGB8 image;
    g4::media::AudioPcm audio;
};

struct Message {
    std::string role, content;
    std::vector<MediaItem> media; // rendered before the content, in order
};

// What the server allows a request (g4 serve's options and the plan's figures).
struct RequestLimits {
    g4_media_info media{};
    std::string media_dir;     // "": file:// URLs refused; else files under this directory (a real path)
    int32_t max_tokens = 0;    // a request's max_tokens at most (0: the context)
    ChatTemplate::Tools tools; // the plan's tool syntax (empty call_start: requests with tools are refused)
};

struct GenRequest {
    bool chat = true;
    std::string model;
    std::vector<Message> messages; // chat
    std::string prompt;            // completions
    bool stream = false, include_usage = false;
    g4_sampling_params sampling{};
    int32_t max_tokens         = -1; // -1: what the context leaves, at most default_max_tokens
    int32_t default_max_tokens = 0;  // --max-tokens (0: none)
    bool ignore_eos            = false;
    std::vector<std::string> stop;
    bool tools = false; // tools were declared: the reply's calls are parsed into tool_calls
};

// Parses and checks a body; `defaults` are the plan's sampling defaults. Throws ApiError. A chat's tools, the
// calls of its assistant messages and its tool results are written into the messages' text in the template's
// tool syntax (tool_calls.h): the declarations at the end of the system message (one is added if there is
// none), each result in the assistant message whose call it answers, after the calls.
GenRequest parse_chat_request(const OJson& body, const g4_sampling_params& defaults,
                              const RequestLimits& limits);
GenRequest parse_completion_request(const OJson& body, const g4_sampling_params& defaults,
                                    const RequestLimits& limits);

// Compares in time independent of where the strings differ (the API key check).
bool constant_time_equal(const std::string& a, const std::string& b);

// RFC 4648 base64 (padding optional, no whitespace); false on any other byte.
bool base64_decode(const std::string& in, std::vector<uint8_t>* out);

} // namespace g4::serve
