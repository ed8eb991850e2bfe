// g4 serve: batched decode steps of the generating slots (see batcher.h).
#include "tools/serve/batcher.h"

#include "runtime/src/engine.h"
#include "runtime/src/text_stream.h"

#include <algorithm>
#include <vector>

namespace g4::serve {

DecodeBatcher::DecodeBatcher(g4_engine* engine) : engine_(engine) {
    g4_engine_info info{};
    g4_engine_get_info(engine, &info);
    max_batch_ = (size_t)std::max(1, g4_engine_max_batch(engine));
    max_chunk_ = (size_t)std::max(1, info.max_chunk);
}

void DecodeBatcher::join() {
    std::lock_guard<std::mutex> l(m_);
    ++active_;
}

void DecodeBatcher::leave() {
    std::unique_lock<std::mutex> l(m_);
    --active_;
    run_ready(l); // the others may all be waiting for this slot's token
}

void DecodeBatcher::run_ready(std::unique_lock<std::mutex>& l) {
    while (!busy_ && !pending_.empty() && (int)pending_.size() >= active_) {
        const size_t n = std::min(max_batch_, pending_.size());
        std::vector<Entry*> batch(pending_.begin(), pending_.begin() + (ptrdiff_t)n);
        pending_.erase(pending_.begin(), pending_.begin() + (ptrdiff_t)n);
        busy_ = true;
        l.unlock();
        std::vector<g4_session*> ss(n);
        std::vector<int32_t> toks(n);
        for (size_t i = 0; i < n; ++i)
            ss[i] = batch[i]->s, toks[i] = batch[i]->token;
        g4_status st = g4_sessions_decode(ss.data(), n, toks.data());
        if (st == G4_OK) {
            for (Entry* e : batch)
                e->st = G4_OK;
        } else { // one session's cancel or full context: each session gets its own answer
            for (Entry* e : batch)
                if ((e->st = g4_session_append_tokens(e->s, &e->token, 1, nullptr, 0)) != G4_OK)
                    e->err = g4_last_error_message();
        }
        l.lock();
        ++steps_;
        tokens_ += (int64_t)n;
        for (Entry* e : batch)
            e->done = true;
        busy_ = false;
        cv_.notify_all();
    }
}

g4_status DecodeBatcher::decode(g4_session* s, int32_t token, std::string* err) {
    Entry e{s, token};
    std::unique_lock<std::mutex> l(m_);
    pending_.push_back(&e);
    run_ready(l);
    while (!e.done) {
        if (!busy_ && !pending_.empty() && (int)pending_.size() >= active_)
            run_ready(l); // the tokens left over from a full batch, once the others are in again
        else
            cv_.wait(l);
    }
    if (e.st != G4_OK) *err = e.err;
    return e.st;
}

g4_status DecodeBatcher::prefill(g4_session* s, const int32_t* ids, size_t n,
                                 const std::function<bool()>& stop, std::string* err) {
    for (size_t done = 0; done < n;) {
        const size_t k = std::min(max_chunk_, n - done);
        if (stop()) {
            *err = "cancelled";
            return G4_ERR_CANCELLED;
        }
        {
            std::unique_lock<std::mutex> l(m_);
            cv_.wait(l, [&] { return !busy_; });
            busy_ = true;
        }
        const g4_status st = g4_session_append_tokens(s, ids + done, k, nullptr, 0);
        if (st != G4_OK) *err = g4_last_error_message();
        std::unique_lock<std::mutex> l(m_);
        busy_ = false;
        run_ready(l);
        cv_.notify_all();
        if (st != G4_OK) return st;
        done += k;
    }
    return G4_OK;
}

int64_t DecodeBatcher::steps() const {
    std::lock_guard<std::mutex> l(m_);
    return steps_;
}

int64_t DecodeBatcher::stepped_tokens() const {
    std::lock_guard<std::mutex> l(m_);
    return tokens_;
}

g4_status generate_batched(DecodeBatcher& b, g4_session* s, const g4_sampling_params* sampling,
                           const g4_generate_params& gp, g4_token_callback cb, void* user, int32_t* out_n,
                           std::string* err) {
    *out_n = 0;
    if (sampling && g4_sampling_params_check(sampling) != G4_OK) {
        *err = g4_last_error_message();
        return G4_ERR_INVALID_ARGUMENT;
    }
    std::vector<std::string> stops(gp.stop, gp.stop + gp.n_stop);
    const g4_engine* e = s->engine;
    g4::TextStream stream(e->tokenizer ? e->tokenizer.get() : nullptr, stops);
    const int32_t ctx = e->plan.info().max_context;
    g4_status st      = G4_OK;
    b.join();
    for (int32_t i = 0; i < gp.max_tokens; ++i) {
        int32_t tok = -1;
        if ((st = g4_session_sample(s, sampling, &tok)) != G4_OK) {
            *err = g4_last_error_message();
            break;
        }
        if (!gp.ignore_eos && g4_engine_is_eos(e, tok)) break;
        if (g4_session_position(s) >= ctx) {
            st   = G4_ERR_CONTEXT_FULL;
            *err = "context full: the plan's max context is " + std::to_string(ctx) + " tokens";
            break;
        }
        if ((st = b.decode(s, tok, err)) != G4_OK) break;
        ++*out_n;
        bool stop              = false;
        std::string_view piece = stream.push(tok, &stop);
        if (cb && cb(user, tok, piece.data(), piece.size())) break;
        if (stop) break;
    }
    b.leave();
    if (st == G4_OK && cb) {
        std::string_view rest = stream.flush();
        if (!rest.empty()) cb(user, -1, rest.data(), rest.size());
    }
    return st;
}

} // namespace g4::serve
