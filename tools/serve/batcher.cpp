// g4 serve: batched decode steps of the generating slots (see batcher.h).
#include "tools/serve/batcher.h"

#include "runtime/src/generate.h"

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
    b.join();
    const g4_status st = g4::rt::generate_loop(s, sampling, gp, stops, cb, user, out_n,
                                               [&](int32_t tok) { return b.decode(s, tok, err); });
    b.leave();
    if (st != G4_OK && err->empty()) *err = g4_last_error_message();
    return st;
}

} // namespace g4::serve
