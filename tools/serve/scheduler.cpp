// g4 serve: session slots, the bounded queue and the worker threads (see scheduler.h).
#include "tools/serve/scheduler.h"

#include <algorithm>
#include <stdexcept>

namespace g4::serve {

namespace {

// A reused prefix leaves at least this many prompt tokens to feed. A remainder of a few tokens would run
// through the runtime's few-row kernels (the CPU's NF4 matrix-vector product up to 8 rows), whose sums are
// ordered differently from the prefill kernels a fresh session runs the prompt's rows through: logits 1e-5
// apart on the tiny fixture (1 and 8 rows), which can flip a greedy choice; 100 rows were bit-identical.
constexpr size_t kMinFed = 16;

} // namespace

void Job::cancel(const char* why) {
    std::lock_guard<std::mutex> l(m);
    if (!cancel_flag.exchange(true)) cancel_why = why;
    // The session pointer is cleared (under m) before the slot takes another job, so this cancel cannot
    // reach the next request; a request still pending when the job ends is cleared by the next reset.
    if (session) g4_session_cancel(session);
    cv.notify_all();
}

Scheduler::Scheduler(g4_engine* engine, const SchedulerOptions& opts, Metrics* metrics)
    : engine_(engine), metrics_(metrics), max_queue_(opts.max_queue), prefix_reuse_(opts.prefix_reuse) {
    if (g4_engine_get_info(engine, &info_) != G4_OK) throw std::runtime_error(g4_last_error_message());
    g4_media_info mi{};
    if (g4_engine_get_media_info(engine, &mi) != G4_OK) throw std::runtime_error(g4_last_error_message());
    marks_ = {mi.boi_token_id, mi.eoi_token_id, mi.image_token_id,
              mi.boa_token_id, mi.eoa_token_id, mi.audio_token_id};
    // On the CPU every session has its own worker threads. Batched, the decode steps and prompt chunks run
    // one at a time, each on the threads of one session: every session gets all the cores. Else the slots
    // share them evenly.
    const bool batched = opts.batch && opts.sessions > 1 && g4_engine_max_batch(engine) > 1;
    const int hw       = (int)std::max(1u, std::thread::hardware_concurrency());
    threads_ = opts.threads > 0 ? opts.threads : batched ? hw : std::max(1, hw / std::max(1, opts.sessions));
    if (batched) batcher_ = std::make_unique<DecodeBatcher>(engine);
    g4_session_params sp = g4_session_params_default();
    sp.n_threads         = threads_;
    slots_.resize((size_t)std::max(0, opts.sessions));
    for (int i = 0; i < opts.sessions; ++i) {
        if (g4_session_create(engine, &sp, &slots_[i].session) != G4_OK) {
            const std::string msg = g4_last_error_message();
            for (Slot& x : slots_)
                g4_session_destroy(x.session);
            throw std::runtime_error("session " + std::to_string(i + 1) + " of " +
                                     std::to_string(opts.sessions) + ": " + msg);
        }
    }
    for (size_t i = 0; i < slots_.size(); ++i)
        workers_.emplace_back([this, i] { worker(i); });
}

Scheduler::~Scheduler() {
    stop();
    for (Slot& x : slots_)
        g4_session_destroy(x.session);
}

bool Scheduler::submit(const std::shared_ptr<Job>& job) {
    std::lock_guard<std::mutex> l(m_);
    // Requests beyond the free slots wait; at most max_queue_ of them.
    const bool free_slot = running_.load() < (int)slots_.size();
    if (stopping_ || (!free_slot && (int)queue_.size() >= max_queue_)) return false;
    queue_.push_back(job);
    dispatch();
    return true;
}

bool Scheduler::withdraw(const std::shared_ptr<Job>& job) {
    std::lock_guard<std::mutex> l(m_);
    const auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it == queue_.end()) return false;
    queue_.erase(it);
    return true;
}

void Scheduler::dispatch() {
    bool assigned = false;
    while (!queue_.empty()) {
        const std::shared_ptr<Job>& job = queue_.front();
        Slot* best                      = nullptr;
        int32_t best_len                = -1;
        for (Slot& x : slots_) {
            if (x.job) continue;
            int32_t len = prefix_reuse_
                              ? match_prefix(x.held, job->probe, job->probe_media, marks_, kMinFed).tokens
                              : 0;
            // A prefix counts when it covers half the prompt (llama-server's default slot similarity):
            // otherwise any two chats share the template's first tokens, and a new conversation would take
            // the slot of another rather than the least recently used one.
            if ((size_t)len * 2 < job->probe.size()) len = 0;
            if (!best || len > best_len || (len == best_len && x.last_used < best->last_used)) {
                best     = &x;
                best_len = len;
            }
        }
        if (!best) break;
        best->job = job;
        ++running_;
        queue_.pop_front();
        assigned = true;
    }
    if (assigned) cv_.notify_all();
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

void Scheduler::worker(size_t i) {
    Slot& slot = slots_[i];
    for (;;) {
        std::shared_ptr<Job> job;
        {
            std::unique_lock<std::mutex> l(m_);
            cv_.wait(l, [&] { return slot.job || stopping_; });
            if (!slot.job) return;
            job = slot.job;
        }
        run(*job, slot);
        std::lock_guard<std::mutex> l(m_);
        slot.job       = nullptr;
        slot.last_used = ++tick_;
        --running_;
        dispatch();
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
    std::vector<int32_t> tokens; // generated and fed
};

int32_t on_token(void* user, int32_t token, const char* text, size_t len) {
    auto* st = static_cast<GenState*>(user);
    Job& job = *st->job;
    if (token >= 0 && !st->have_first) {
        st->have_first = true;
        st->first      = Clock::now();
    }
    if (token >= 0) st->tokens.push_back(token);
    std::lock_guard<std::mutex> l(job.m);
    if (token >= 0) ++job.completion_tokens;
    job.text.append(text, len);
    // A stream's reader sends each piece as it comes; a whole reply's waits for the end (woken then).
    if (job.req.stream) job.cv.notify_all();
    return job.cancelled() || Clock::now() > job.deadline ? 1 : 0;
}

int32_t on_progress(void* user, int64_t, int64_t) {
    const Job* job = static_cast<const Job*>(user);
    return job && (job->cancelled() || Clock::now() > job->deadline) ? 1 : 0;
}

} // namespace

namespace {

std::vector<int32_t> tokenize(g4_engine* e, const std::string& text) {
    std::vector<int32_t> ids;
    size_t n     = 0;
    g4_status st = g4_tokenize(e, text.data(), text.size(), 1, nullptr, 0, &n);
    ids.resize(n);
    if (st == G4_ERR_BUFFER_TOO_SMALL) st = g4_tokenize(e, text.data(), text.size(), 1, ids.data(), n, &n);
    if (st != G4_OK) throw bad_request("prompt", g4_last_error_message());
    return ids;
}

} // namespace

// A chat's ids are rendered by the plan's chat template with each media item at `media`'s soft tokens (in
// the order they appear: message by message, each message's items in order).
std::vector<int32_t> Scheduler::render(const Job& job, const std::vector<MediaKey>& media) const {
    const GenRequest& r = job.req;
    std::vector<std::vector<g4_chat_media>> parts(r.messages.size());
    std::vector<g4_chat_media_message> msgs(r.messages.size());
    size_t g = 0;
    for (size_t i = 0; i < r.messages.size(); ++i) {
        const Message& m = r.messages[i];
        for (const MediaItem& it : m.media)
            parts[i].push_back({it.kind, g < media.size() ? media[g++].n_tokens : 0});
        msgs[i] = {m.role.c_str(), m.content.c_str(), parts[i].data(), parts[i].size()};
    }
    std::vector<int32_t> ids;
    size_t n     = 0;
    g4_status st = g4_chat_render_ids(engine_, msgs.data(), msgs.size(), 1, nullptr, 0, &n);
    ids.resize(n);
    if (st == G4_ERR_BUFFER_TOO_SMALL)
        st = g4_chat_render_ids(engine_, msgs.data(), msgs.size(), 1, ids.data(), n, &n);
    if (st != G4_OK) throw bad_request("messages", g4_last_error_message());
    return ids;
}

void Scheduler::probe(Job& job) const {
    const GenRequest& r = job.req;
    job.probe_media.clear();
    if (!r.chat) {
        job.probe = tokenize(engine_, r.prompt);
        return;
    }
    for (const Message& m : r.messages)
        for (const MediaItem& it : m.media)
            job.probe_media.push_back(
                {it.kind,
                 it.kind == G4_MEDIA_IMAGE
                     ? image_digest(it.image.rgb.data(), it.image.width, it.image.height)
                     : audio_digest(it.audio.samples.data(), (int64_t)it.audio.samples.size()),
                 0});
    job.probe = render(job, job.probe_media);
}

// Queues the media items from index `from` on in the session (their soft tokens into `media`).
void Scheduler::add_media(Job& job, g4_session* s, size_t from, std::vector<MediaKey>* media) {
    const GenRequest& r = job.req;
    size_t g            = 0;
    for (size_t i = 0; i < r.messages.size(); ++i)
        for (const MediaItem& it : r.messages[i].media) {
            if (g++ < from) continue;
            int32_t nt = 0;
            const g4_status st =
                it.kind == G4_MEDIA_IMAGE
                    ? g4_session_add_image(s, it.image.rgb.data(), it.image.width, it.image.height, &nt)
                    : g4_session_add_audio(s, it.audio.samples.data(), (int64_t)it.audio.samples.size(), &nt);
            if (st != G4_OK)
                throw bad_request("messages[" + std::to_string(i) + "].content", g4_last_error_message());
            (*media)[g - 1].n_tokens = nt;
        }
}

// The session is rewound to the prefix of the prompt it holds (prefix.h) or reset, the media after that
// prefix are run through their towers, and the rest of the prompt is fed. `ids` receives the prompt's ids
// (before anything is fed), `media` its media with their soft tokens.
void Scheduler::feed_prompt(Job& job, Slot& slot, std::vector<int32_t>* ids, std::vector<MediaKey>* media) {
    g4_session* s       = slot.session;
    const GenRequest& r = job.req;
    PrefixMatch m;
    if (prefix_reuse_) m = match_prefix(slot.held, job.probe, job.probe_media, marks_, kMinFed);
    // A rewind past what the sliding-window rings still hold is refused: the prompt is then fed whole.
    if (m.tokens > 0 && (g4_session_rewind(s, m.tokens) != G4_OK || g4_session_reseed(s) != G4_OK)) m = {};
    if (m.tokens == 0) g4_session_reset(s);
    *media = job.probe_media;
    for (size_t k = 0; k < m.media; ++k)
        (*media)[k].n_tokens = slot.held.media[k].n_tokens;
    add_media(job, s, m.media, media);
    *ids = r.chat ? render(job, *media) : job.probe;
    if (m.tokens > 0 && common_prefix(*ids, slot.held.tokens) < (size_t)m.tokens) {
        // The rendering with the soft tokens differs from the probe inside the prefix (a prompt whose text
        // holds media markers): fed whole.
        g4_session_reset(s);
        m = {};
        add_media(job, s, 0, media);
        *ids = render(job, *media);
    }
    const int np  = (int)ids->size();
    const int ctx = info_.max_context;
    if (np >= ctx)
        throw bad_request(r.chat ? "messages" : "prompt",
                          "the prompt has " + std::to_string(np) + " tokens; the plan's context holds " +
                              std::to_string(ctx) + " (prompt and reply together)");
    if (r.max_tokens > 0 && np + r.max_tokens > ctx)
        throw bad_request("max_tokens", "the prompt's " + std::to_string(np) + " tokens plus max_tokens " +
                                            std::to_string(r.max_tokens) + " exceed the plan's context of " +
                                            std::to_string(ctx) + " tokens");
    std::string err;
    const size_t n_feed = ids->size() - (size_t)m.tokens;
    const g4_status st  = batcher_ ? batcher_->prefill(
                                         s, ids->data() + m.tokens, n_feed,
                                         [&] { return job.cancelled() || Clock::now() > job.deadline; }, &err)
                                   : g4_session_append_tokens(s, ids->data() + m.tokens, n_feed, nullptr, 0);
    if (st != G4_OK) {
        if (st == G4_ERR_CANCELLED)
            throw ApiError(499, "cancelled", "", "cancelled while the prompt was fed");
        throw ApiError(st == G4_ERR_INVALID_ARGUMENT ? 400 : 500, "server_error", "",
                       batcher_ ? err : std::string(g4_last_error_message()));
    }
    job.cached_tokens = m.tokens;
}

void Scheduler::run(Job& job, Slot& slot) {
    g4_session* s = slot.session;
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
    g4_session_set_progress_callback(s, on_progress, &job);
    const GenRequest& r = job.req;
    std::vector<int32_t> ids;
    std::vector<MediaKey> media;
    GenState gs{&job, {}, false, {}};
    try {
        feed_prompt(job, slot, &ids, &media);
        const int np = (int)ids.size();
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
        gp.max_tokens         = r.max_tokens > 0 ? r.max_tokens : info_.max_context - np;
        if (r.max_tokens <= 0 && r.default_max_tokens > 0)
            gp.max_tokens = std::min(gp.max_tokens, r.default_max_tokens);
        gp.ignore_eos = r.ignore_eos ? 1 : 0;
        gp.stop       = stops.data();
        gp.n_stop     = stops.size();
        int32_t n_gen = 0;
        std::string gen_err;
        g4_status st                = batcher_
                                          ? generate_batched(*batcher_, s, &r.sampling, gp, on_token, &gs, &n_gen, &gen_err)
                                          : g4_session_generate(s, &r.sampling, &gp, on_token, &gs, &n_gen);
        const Clock::time_point end = Clock::now();
        if (st != G4_OK && st != G4_ERR_CANCELLED && st != G4_ERR_CONTEXT_FULL)
            throw ApiError(500, "server_error", "",
                           batcher_ ? gen_err : std::string(g4_last_error_message()));
        const double ttft =
            gs.have_first ? std::chrono::duration<double>(gs.first - job.submitted).count() : 0;
        const double dec = gs.have_first ? std::chrono::duration<double>(end - gs.first).count() : 0;
        metrics_->generation(np, n_gen, job.cached_tokens, ttft, dec);
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
    // What the session holds now: the prompt and the generated tokens fed, as far as its position goes (a
    // request that failed before its prompt was rendered leaves nothing to reuse).
    ids.insert(ids.end(), gs.tokens.begin(), gs.tokens.end());
    const int32_t pos = g4_session_position(s);
    if (pos < 0 || (size_t)pos > ids.size())
        ids.clear();
    else
        ids.resize((size_t)pos);
    slot.held.tokens = std::move(ids);
    slot.held.media  = std::move(media);
}

} // namespace g4::serve
