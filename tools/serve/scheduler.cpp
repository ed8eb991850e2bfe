// g4 serve: session slots, the bounded queue and the worker threads (see scheduler.h).
#include "tools/serve/scheduler.h"

#include <algorithm>
#include <stdexcept>

namespace g4::serve {

void Job::cancel(const char* why) {
    std::lock_guard<std::mutex> l(m);
    if (!cancel_flag.exchange(true)) cancel_why = why;
    // The session pointer is cleared (under m) before the slot takes another job, so this cancel cannot
    // reach the next request; a request still pending when the job ends is cleared by the next reset.
    if (session) g4_session_cancel(session);
    cv.notify_all();
}

Scheduler::Scheduler(g4_engine* engine, const SchedulerOptions& opts, Metrics* metrics)
    : engine_(engine), metrics_(metrics), max_queue_(opts.max_queue) {
    if (g4_engine_get_info(engine, &info_) != G4_OK) throw std::runtime_error(g4_last_error_message());
    // On the CPU every session has its own worker threads; the slots share the cores evenly.
    const int hw         = (int)std::max(1u, std::thread::hardware_concurrency());
    threads_             = opts.threads > 0 ? opts.threads : std::max(1, hw / std::max(1, opts.sessions));
    g4_session_params sp = g4_session_params_default();
    sp.n_threads         = threads_;
    for (int i = 0; i < opts.sessions; ++i) {
        g4_session* s = nullptr;
        if (g4_session_create(engine, &sp, &s) != G4_OK) {
            const std::string msg = g4_last_error_message();
            for (g4_session* x : sessions_)
                g4_session_destroy(x);
            throw std::runtime_error("session " + std::to_string(i + 1) + " of " +
                                     std::to_string(opts.sessions) + ": " + msg);
        }
        sessions_.push_back(s);
    }
    for (size_t i = 0; i < sessions_.size(); ++i)
        workers_.emplace_back([this, i] { worker(i); });
}

Scheduler::~Scheduler() {
    stop();
    for (g4_session* s : sessions_)
        g4_session_destroy(s);
}

bool Scheduler::submit(const std::shared_ptr<Job>& job) {
    std::lock_guard<std::mutex> l(m_);
    // Requests beyond the idle slots wait; at most max_queue_ of them.
    const int idle = (int)sessions_.size() - running_.load();
    if (stopping_ || (int)queue_.size() >= max_queue_ + std::max(0, idle)) return false;
    queue_.push_back(job);
    cv_.notify_one();
    return true;
}

int Scheduler::queued() const {
    std::lock_guard<std::mutex> l(m_);
    return (int)queue_.size();
}

void Scheduler::stop() {
    std::deque<std::shared_ptr<Job>> left;
    {
        std::lock_guard<std::mutex> l(m_);
        stopping_ = true;
        left.swap(queue_);
        cv_.notify_all();
    }
    for (auto& j : left) {
        std::lock_guard<std::mutex> l(j->m);
        j->err_status = 503;
        j->err_type   = "server_error";
        j->err_msg    = "the server is shutting down";
        j->finished   = true;
        j->cv.notify_all();
    }
    for (std::thread& t : workers_)
        if (t.joinable()) t.join();
}

void Scheduler::worker(size_t slot) {
    g4_session* s = sessions_[slot];
    for (;;) {
        std::shared_ptr<Job> job;
        {
            std::unique_lock<std::mutex> l(m_);
            cv_.wait(l, [&] { return stopping_ || !queue_.empty(); });
            if (queue_.empty()) return;
            job = queue_.front();
            queue_.pop_front();
            ++running_; // under m_: submit counts the idle slots
        }
        run(*job, s);
        std::lock_guard<std::mutex> l(m_);
        --running_;
    }
}

namespace {

void fail(Job& job, int status, const char* type, const std::string& msg) {
    std::lock_guard<std::mutex> l(job.m);
    job.err_status = status;
    job.err_type   = type;
    job.err_msg    = msg;
    job.finished   = true;
    job.cv.notify_all();
}

struct GenState {
    Job* job;
    Clock::time_point first;
    bool have_first = false;
};

int32_t on_token(void* user, int32_t token, const char* text, size_t len) {
    auto* st = static_cast<GenState*>(user);
    Job& job = *st->job;
    if (token >= 0 && !st->have_first) {
        st->have_first = true;
        st->first      = Clock::now();
    }
    std::lock_guard<std::mutex> l(job.m);
    if (token >= 0) ++job.completion_tokens;
    job.text.append(text, len);
    job.cv.notify_all();
    return job.cancelled() || Clock::now() > job.deadline ? 1 : 0;
}

int32_t on_progress(void* user, int64_t, int64_t) {
    const Job* job = static_cast<const Job*>(user);
    return job && (job->cancelled() || Clock::now() > job->deadline) ? 1 : 0;
}

} // namespace

// The prompt's token ids: a chat rendered by the plan's chat template (its images and audio queued in the
// session first, in order), or a completion prompt tokenized with the tokenizer's specials (<bos>).
std::vector<int32_t> Scheduler::prompt_ids(Job& job, g4_session* s) {
    const GenRequest& r = job.req;
    std::vector<int32_t> ids;
    size_t n = 0;
    if (!r.chat) {
        g4_status st = g4_tokenize(engine_, r.prompt.data(), r.prompt.size(), 1, nullptr, 0, &n);
        ids.resize(n);
        if (st == G4_ERR_BUFFER_TOO_SMALL)
            st = g4_tokenize(engine_, r.prompt.data(), r.prompt.size(), 1, ids.data(), n, &n);
        if (st != G4_OK) throw bad_request("prompt", g4_last_error_message());
        return ids;
    }
    std::vector<std::vector<g4_chat_media>> media(r.messages.size());
    std::vector<g4_chat_media_message> msgs(r.messages.size());
    for (size_t i = 0; i < r.messages.size(); ++i) {
        const Message& m = r.messages[i];
        for (size_t k = 0; k < m.media.size(); ++k) {
            const MediaItem& it = m.media[k];
            int32_t nt          = 0;
            const g4_status st =
                it.kind == G4_MEDIA_IMAGE
                    ? g4_session_add_image(s, it.image.rgb.data(), it.image.width, it.image.height, &nt)
                    : g4_session_add_audio(s, it.audio.samples.data(), (int64_t)it.audio.samples.size(), &nt);
            if (st != G4_OK)
                throw bad_request("messages[" + std::to_string(i) + "].content", g4_last_error_message());
            media[i].push_back({it.kind, nt});
        }
        msgs[i] = {m.role.c_str(), m.content.c_str(), media[i].data(), media[i].size()};
    }
    g4_status st = g4_chat_render_ids(engine_, msgs.data(), msgs.size(), 1, nullptr, 0, &n);
    ids.resize(n);
    if (st == G4_ERR_BUFFER_TOO_SMALL)
        st = g4_chat_render_ids(engine_, msgs.data(), msgs.size(), 1, ids.data(), n, &n);
    if (st != G4_OK) throw bad_request("messages", g4_last_error_message());
    return ids;
}

void Scheduler::run(Job& job, g4_session* s) {
    {
        std::lock_guard<std::mutex> l(job.m);
        if (job.cancelled() || Clock::now() > job.deadline) {
            job.err_status = job.cancelled() ? 499 : 504;
            job.err_type   = "timeout";
            job.err_msg =
                job.cancelled() ? "cancelled before it started" : "the request timed out in the queue";
            job.finished = true;
            job.cv.notify_all();
            return;
        }
        job.session = s;
    }
    g4_session_reset(s);
    g4_session_set_progress_callback(s, on_progress, &job);
    const GenRequest& r = job.req;
    const int ctx       = info_.max_context;
    try {
        const std::vector<int32_t> ids = prompt_ids(job, s);
        const int np                   = (int)ids.size();
        if (np >= ctx)
            throw bad_request(r.chat ? "messages" : "prompt",
                              "the prompt has " + std::to_string(np) + " tokens; the plan's context holds " +
                                  std::to_string(ctx) + " (prompt and reply together)");
        if (r.max_tokens > 0 && np + r.max_tokens > ctx)
            throw bad_request("max_tokens", "the prompt's " + std::to_string(np) +
                                                " tokens plus max_tokens " + std::to_string(r.max_tokens) +
                                                " exceed the plan's context of " + std::to_string(ctx) +
                                                " tokens");
        g4_status st = g4_session_append_tokens(s, ids.data(), ids.size(), nullptr, 0);
        if (st != G4_OK) {
            if (st == G4_ERR_CANCELLED)
                throw ApiError(499, "cancelled", "", "cancelled while the prompt was fed");
            throw ApiError(st == G4_ERR_INVALID_ARGUMENT ? 400 : 500, "server_error", "",
                           g4_last_error_message());
        }
        {
            std::lock_guard<std::mutex> l(job.m);
            job.prompt_tokens = np;
            job.started       = true;
            job.cv.notify_all();
        }
        std::vector<const char*> stops;
        for (const std::string& x : r.stop)
            stops.push_back(x.c_str());
        g4_generate_params gp = g4_generate_params_default();
        gp.max_tokens         = r.max_tokens > 0 ? r.max_tokens : ctx - np;
        if (r.max_tokens <= 0 && r.default_max_tokens > 0)
            gp.max_tokens = std::min(gp.max_tokens, r.default_max_tokens);
        gp.ignore_eos = r.ignore_eos ? 1 : 0;
        gp.stop       = stops.data();
        gp.n_stop     = stops.size();
        GenState gs{&job, {}, false};
        int32_t n_gen               = 0;
        st                          = g4_session_generate(s, &r.sampling, &gp, on_token, &gs, &n_gen);
        const Clock::time_point end = Clock::now();
        if (st != G4_OK && st != G4_ERR_CANCELLED && st != G4_ERR_CONTEXT_FULL)
            throw ApiError(500, "server_error", "", g4_last_error_message());
        const double ttft =
            gs.have_first ? std::chrono::duration<double>(gs.first - job.submitted).count() : 0;
        const double dec = gs.have_first ? std::chrono::duration<double>(end - gs.first).count() : 0;
        metrics_->generation(np, n_gen, ttft, dec);
        const bool cancelled = job.cancelled() || st == G4_ERR_CANCELLED || Clock::now() > job.deadline;
        if (cancelled) metrics_->cancelled();
        std::lock_guard<std::mutex> l(job.m);
        job.session = nullptr;
        job.ttft_ms = ttft * 1e3;
        // A timeout ends the reply as a limit does ("length"); a client that went away gets nothing.
        job.finish_reason =
            (n_gen >= gp.max_tokens || st == G4_ERR_CONTEXT_FULL || cancelled) ? "length" : "stop";
        if (cancelled && !job.cancelled()) {
            job.err_status = 504;
            job.err_type   = "timeout";
            job.err_msg = "the request timed out after " + std::to_string(job.completion_tokens) + " tokens";
        }
        job.finished = true;
        job.cv.notify_all();
    } catch (const ApiError& e) {
        {
            std::lock_guard<std::mutex> l(job.m);
            job.session = nullptr;
        }
        fail(job, e.status, e.type.c_str(), e.what());
    } catch (const std::exception& e) { // out of memory in a request's own buffers: that request fails
        {
            std::lock_guard<std::mutex> l(job.m);
            job.session = nullptr;
        }
        fail(job, 500, "server_error", e.what());
    }
    g4_session_set_progress_callback(s, nullptr, nullptr);
}

} // namespace g4::serve
