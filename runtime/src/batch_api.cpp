// The C API's batched decode (g4.h "batched decode"): validates the call, runs the backend's batched step
// (batch.h), and advances each session as g4_session_append_tokens does for one token.
#include "g4/g4.h"
#include "runtime/src/api_util.h"
#include "runtime/src/batch.h"
#include "runtime/src/engine.h"
#include "runtime/src/frontend/media.h"

#include <algorithm>
#include <chrono>
#include <new>
#include <string>

namespace {

using g4::rt::api_error;

// The checks of g4_sessions_decode, in the order its documentation lists them; "" when the call is valid.
g4_status check_call(g4_session* const* ss, size_t n, const int32_t* tokens) {
    if (!ss || !tokens)
        return api_error(G4_ERR_INVALID_ARGUMENT, "g4_sessions_decode: sessions or tokens is NULL");
    for (size_t i = 0; i < n; ++i)
        if (!g4::rt::api_session_ok(ss[i]))
            return api_error(G4_ERR_INVALID_ARGUMENT, "g4_sessions_decode: sessions[" + std::to_string(i) +
                                                          "] is invalid or destroyed");
    const g4_engine* e = ss[0]->engine;
    const int32_t lim  = g4::rt::batch_limit(e);
    if (n > (size_t)lim)
        return api_error(G4_ERR_INVALID_ARGUMENT,
                         "g4_sessions_decode: " + std::to_string(n) +
                             " sessions, but this plan's steps take at most " + std::to_string(lim) +
                             (lim == 1 ? " (its backend has no batched steps; g4_engine_max_batch)"
                                       : " (g4_engine_max_batch; recompile with a larger --logits-rows)"));
    const auto& in = e->plan.info();
    for (size_t i = 0; i < n; ++i) {
        auto at = [i] { return "g4_sessions_decode: sessions[" + std::to_string(i) + "]"; }; // errors only
        if (ss[i]->engine != e)
            return api_error(G4_ERR_INVALID_ARGUMENT, at() + " belongs to another engine than sessions[0]");
        for (size_t k = 0; k < i; ++k)
            if (ss[k] == ss[i])
                return api_error(G4_ERR_INVALID_ARGUMENT,
                                 at() + " is sessions[" + std::to_string(k) + "] again");
        if (tokens[i] < 0 || tokens[i] >= in.embed_vocab_limit)
            return api_error(G4_ERR_INVALID_ARGUMENT,
                             "g4_sessions_decode: token id " + std::to_string(tokens[i]) + " at index " +
                                 std::to_string(i) + " is outside the vocabulary (0.." +
                                 std::to_string(in.embed_vocab_limit - 1) + ")");
        if (g4::rt::media_is_placeholder(ss[i], tokens[i]))
            return api_error(G4_ERR_INVALID_ARGUMENT,
                             "g4_sessions_decode: token " + std::to_string(i) +
                                 " is a media placeholder; feed media prompts with g4_session_append_tokens");
        if (ss[i]->position >= in.max_context)
            return api_error(G4_ERR_CONTEXT_FULL, at() + " holds the plan's max context of " +
                                                      std::to_string(in.max_context) + " tokens");
    }
    return G4_OK;
}

// One batched step of sessions ss[0..n) and the positions, histories and statistics it advances.
g4_status run_group(g4_session* const* ss, const int32_t* tokens, size_t n) {
    const auto t0 = std::chrono::steady_clock::now();
    std::string err;
    for (size_t i = 0; i < n; ++i)
        ss[i]->logits_on_device = false; // the backend sets it where it leaves a row on the device
    g4_status st = ss[0]->backend->run_batch(ss, tokens, (int32_t)n, &err);
    if (st == G4_ERR_CANCELLED)
        for (size_t i = 0; i < n; ++i)
            ss[i]->cancel.store(false);
    if (st != G4_OK) return api_error(st, "g4_sessions_decode: " + err);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const int32_t V = ss[0]->engine->plan.info().vocab_size;
    for (size_t i = 0; i < n; ++i) {
        g4_session* s           = ss[i];
        s->history[s->position] = tokens[i] < V ? tokens[i] : s->engine->plan.info().pad_token_id;
        s->position++;
        s->have_logits = true;
        s->stats.decode_ms += ms;
        s->stats.decode_tokens++;
    }
    return G4_OK;
}

} // namespace

extern "C" {

int32_t g4_engine_max_batch(const g4_engine* e) {
    return g4::rt::api_engine_ok(e) ? g4::rt::batch_limit(e) : 0;
}

g4_status g4_sessions_decode(g4_session* const* ss, size_t n, const int32_t* tokens) {
    try {
        if (n == 0) return G4_OK;
        if (g4_status st = check_call(ss, n, tokens); st != G4_OK) return st;
        for (size_t i = 0; i < n; ++i)
            if (ss[i]->cancel.exchange(false))
                return api_error(G4_ERR_CANCELLED, "g4_sessions_decode: sessions[" + std::to_string(i) +
                                                       "] was cancelled; nothing fed");
        // Groups of the backend's batched step; a group too small to gain from it runs as each session's own
        // decode step (backend.h batch_min_rows), n == 1 always.
        const g4::rt::EngineBackend& eb = *ss[0]->engine->backend;
        const size_t G                  = (size_t)std::max(1, eb.batch_group_rows()),
                     M                  = (size_t)std::max(2, eb.batch_min_rows());
        for (size_t j0 = 0; j0 < n; j0 += G) {
            const size_t m = std::min(G, n - j0);
            if (m < M) {
                for (size_t i = j0; i < j0 + m; ++i)
                    if (g4_status st = g4_session_append_tokens(ss[i], tokens + i, 1, nullptr, 0);
                        st != G4_OK)
                        return st;
                continue;
            }
            if (g4_status st = run_group(ss + j0, tokens + j0, m); st != G4_OK) return st;
        }
        return G4_OK;
    } catch (const std::bad_alloc&) {
        return api_error(G4_ERR_OUT_OF_MEMORY, "out of memory");
    } catch (const std::exception& ex) {
        return api_error(G4_ERR_INTERNAL, std::string("internal error: ") + ex.what());
    } catch (...) {
        return api_error(G4_ERR_INTERNAL, "internal error");
    }
}

} // extern "C"
