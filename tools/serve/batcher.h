// g4 serve: the decode steps of every slot that is generating, batched (g4_sessions_decode). Each slot's
// worker thread samples its own session's token, then hands it to decode(), which returns once a step holding
// it has run. A step runs as soon as every generating slot has handed in its token (the last one to arrive
// runs it on its own thread, up to g4_engine_max_batch sessions; the others wait for the next step), so slots
// join and leave between steps. Prompt chunks (prefill) take the same turn: one chunk between two steps.
#pragma once
#include "g4/g4.h"

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>

namespace g4::serve {

class DecodeBatcher {
public:
    explicit DecodeBatcher(g4_engine* engine);

    // A slot starts / stops generating (every decode() call is between its join() and leave()).
    void join();
    void leave();
    // Feeds `token` to session `s` in the next batched step; returns that step's status (G4_OK, or the
    // session's own g4_session_append_tokens status when the batched call failed and the step was retried
    // one session at a time). *err: the failure's message.
    g4_status decode(g4_session* s, int32_t token, std::string* err);
    // Feeds a prompt: chunks of at most the plan's max_chunk tokens (the chunks g4_session_append_tokens
    // would run), each between two steps; G4_ERR_CANCELLED when stop() says so before a chunk.
    g4_status prefill(g4_session* s, const int32_t* ids, size_t n, const std::function<bool()>& stop,
                      std::string* err);

    int64_t steps() const;          // batched steps run
    int64_t stepped_tokens() const; // tokens they fed

private:
    struct Entry {
        g4_session* s;
        int32_t token;
        g4_status st = G4_OK;
        bool done    = false;
        std::string err;
    };
    void run_ready(std::unique_lock<std::mutex>& l); // under m_: runs steps while every slot has its token in

    g4_engine* engine_;
    size_t max_batch_, max_chunk_;
    mutable std::mutex m_;
    std::condition_variable cv_;
    std::deque<Entry*> pending_;
    int active_    = 0;
    bool busy_     = false; // a step or a prompt chunk runs
    int64_t steps_ = 0, tokens_ = 0;
};

// g4_session_generate with its decode steps batched by `b` (between b.join() and b.leave()): the same
// samples, stops, text pieces (the runtime's streaming detokenizer) and statuses. *err: a failure's message.
g4_status generate_batched(DecodeBatcher& b, g4_session* s, const g4_sampling_params* sampling,
                           const g4_generate_params& params, g4_token_callback cb, void* user, int32_t* out_n,
                           std::string* err);

} // namespace g4::serve
