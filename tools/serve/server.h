// g4 serve: the HTTP server (cpp-httplib) in front of the scheduler: the OpenAI endpoints, /health, /metrics,
// the API key, request limits and the OpenAI-style error bodies.
#pragma once
#include "g4/g4.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace g4::serve {

struct ServeOptions {
    std::string plan, model; // model: the id /v1/models lists and requests name
    std::string host = "127.0.0.1";
    int port         = 8080;
    int sessions     = 1;
    int threads      = 0; // per session; 0: the cores shared evenly
    int max_queue    = 16;
    std::string api_key;
    size_t max_body    = 32u << 20;
    double timeout_s   = 600;
    int32_t max_tokens = 0;   // per request; 0: the context
    std::string media_dir;    // file:// URLs allowed under it ("" none)
    bool prefix_reuse = true; // a request reuses the prompt prefix a free session holds
    bool batch        = true; // the generating sessions' decode steps batched into one step
};

// Serves until `stop` becomes non-zero (checked every 100 ms), then stops taking connections, lets running
// requests finish, fails queued ones with 503 and returns 0. Prints "listening on http://HOST:PORT" on stderr
// once the socket is bound; throws std::runtime_error (one line) when it cannot bind or create the sessions.
int serve(g4_engine* engine, const ServeOptions& opts, const std::atomic<int>& stop);

} // namespace g4::serve
