// `g4 serve`: an OpenAI-compatible HTTP server on one plan (tools/serve/: the request parser, the session
// scheduler, the HTTP endpoints). SIGTERM or SIGINT stops it gracefully.
#include "tools/cli_common.h"
#ifdef G4_HAVE_HTTPLIB
#include "runtime/src/engine.h"
#include "tools/serve/server.h"
#endif

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <pthread.h>
#include <thread>

namespace g4::cli {

const Command kServe = {
    "serve",
    "PLAN [options]",
    "Serves the plan over HTTP with OpenAI's API: POST /v1/chat/completions and /v1/completions (streaming "
    "with server-sent events or not), GET /v1/models, /health and /metrics (Prometheus). Stops gracefully on "
    "SIGTERM or Ctrl-C: running requests finish, new ones get 503.",
    {{"--host", "ADDR",
      "address to listen on. Default: 127.0.0.1 (this machine only; 0.0.0.0: every interface)"},
     {"--port", "N", "TCP port. Default: 8080"},
     {"--max-sessions", "N",
      "requests run at once, each in its own session (KV cache) on the plan's shared weights. Default: the "
      "sessions the plan's memory figures count (g4 compile --max-sessions; 1 unless given there)"},
     {"--threads", "N",
      "CPU worker threads of each session. Default: the hardware threads (batched decode steps), else the "
      "hardware threads / --max-sessions"},
     {"--max-queue", "N",
      "requests waiting for a session at most; more get 429 with Retry-After. Default: 16"},
     {"--api-key-file", "FILE",
      "require 'Authorization: Bearer KEY' on every endpoint but /health, KEY being the file's first line"},
     {"--api-key", "KEY", "the same with the key on the command line (visible to other local users)"},
     {"--model-name", "NAME",
      "the model id /v1/models lists and requests may name. Default: the plan's file name"},
     {"--max-body", "BYTES", "largest request body (images and audio are in it, base64). Default: 33554432"},
     {"--timeout", "S", "seconds a request may take, queue included; then it is cancelled. Default: 600"},
     {"--max-tokens", "N",
      "max_tokens a request may ask for at most, and the default of one that asks for none. Default: the "
      "plan's context"},
     {"--no-prefix-reuse", nullptr,
      "start every request from an empty session. Default: a request goes to the free session holding the "
      "longest prefix of its prompt and feeds only the rest"},
     {"--no-batch", nullptr,
      "each session runs its own decode steps. Default: the decode steps of all sessions generating at once "
      "run as one step (one read of the weights for all of them) where the plan's device has batched steps "
      "(CPU plans), and each session then gets all the CPU threads"},
     {"--media-dir", "DIR",
      "allow image URLs file:///PATH for files under DIR (after resolving links). Default: files refused"}}};

#ifdef G4_HAVE_HTTPLIB
namespace {

std::string read_key_file(const std::string& path) {
    std::string s   = read_whole_file(path, "API key file");
    const size_t nl = s.find_first_of("\r\n");
    if (nl != std::string::npos) s.resize(nl);
    if (s.empty()) throw RunError("API key file " + path + ": the first line is empty");
    return s;
}

std::string plan_stem(const std::string& path) {
    std::string s = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
    const size_t dot = s.rfind(".g4plan");
    if (dot != std::string::npos && dot > 0) s.resize(dot);
    return s;
}

} // namespace
#endif

#ifndef G4_HAVE_HTTPLIB
int cmd_serve(int argc, char** argv) {
    Args a(argc, argv, 2, kServe);
    throw RunError(
        "this g4 was built without cpp-httplib: install libcpp-httplib-dev (bash tools/setup.sh) and "
        "build again");
}
#else
int cmd_serve(int argc, char** argv) {
    Args a(argc, argv, 2, kServe);
    if (a.pos.size() != 1) throw UsageError("expected exactly one PLAN argument");
    g4::serve::ServeOptions o;
    o.plan  = a.pos[0];
    o.model = a.get("--model-name", plan_stem(o.plan));
    o.host  = a.get("--host", "127.0.0.1");
    o.port  = (int)parse_int("--port", a.get("--port", "8080"), 0, 65535);
    o.sessions =
        a.has("--max-sessions") ? (int)parse_int("--max-sessions", a.get("--max-sessions"), 1, 256) : 0;
    o.threads   = parse_threads(a);
    o.max_queue = (int)parse_int("--max-queue", a.get("--max-queue", "16"), 0, 4096);
    o.max_body  = (size_t)parse_int("--max-body", a.get("--max-body", "33554432"), 1024, 1ll << 32);
    o.timeout_s = parse_float("--timeout", a.get("--timeout", "600"));
    o.max_tokens =
        a.has("--max-tokens") ? (int32_t)parse_int("--max-tokens", a.get("--max-tokens"), 1, 1 << 30) : 0;
    o.prefix_reuse = !a.on("--no-prefix-reuse");
    o.batch        = !a.on("--no-batch");
    if (!(o.timeout_s > 0)) throw UsageError("--timeout must be more than 0 seconds");
    if (a.has("--api-key") && a.has("--api-key-file"))
        throw UsageError("give --api-key or --api-key-file, not both");
    if (a.has("--api-key")) o.api_key = a.get("--api-key");
    if (a.has("--api-key-file")) o.api_key = read_key_file(a.get("--api-key-file"));
    if (a.has("--api-key") && o.api_key.empty()) throw UsageError("--api-key must not be empty");
    if (a.has("--media-dir")) {
        char* real = ::realpath(a.get("--media-dir").c_str(), nullptr);
        if (!real) throw RunError("--media-dir " + a.get("--media-dir") + ": no such directory");
        o.media_dir = real;
        std::free(real);
    }

    // SIGTERM / SIGINT are taken by a thread of their own (blocked everywhere else, before any thread
    // starts).
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    std::signal(SIGPIPE, SIG_IGN); // a client gone mid-write is an error return, not the end of the server
    std::atomic<int> stop{0};
    std::atomic<bool> done{false};
    std::thread sig_thread([&] {
        const timespec tick = {0, 100 * 1000 * 1000};
        while (!done.load()) {
            const int sig = sigtimedwait(&sigs, nullptr, &tick);
            if (sig == SIGTERM || sig == SIGINT) {
                if (stop.load()) std::_Exit(1); // a second signal: stop now
                std::fprintf(stderr, "g4 serve: %s: finishing the running requests\n",
                             sig == SIGTERM ? "SIGTERM" : "SIGINT");
                stop = 1;
            }
        }
    });
    struct Join {
        std::atomic<bool>& d;
        std::thread& t;
        ~Join() {
            d = true;
            t.join();
        }
    } join{done, sig_thread};

    Engine e;
    open_engine(o.plan, &e);
    if (!e.info.has_tokenizer) require_tokenizer(e.info, o.plan, "serve");
    const auto& placed = e.e->plan.meta().placement;
    const int planned  = placed ? placed->sessions : 1;
    if (o.sessions == 0) o.sessions = planned;
    if (o.sessions > planned)
        std::fprintf(
            stderr,
            "g4 serve: note: --max-sessions %d is more than the %d session(s) the plan's memory figures "
            "count; each further session takes session_bytes more (g4 compile --max-sessions %d "
            "plans them)\n",
            o.sessions, planned, o.sessions);
    try {
        return g4::serve::serve(e.e, o, stop);
    } catch (const std::runtime_error& err) {
        throw RunError(err.what());
    }
}

#endif

} // namespace g4::cli
