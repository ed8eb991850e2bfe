// g4 serve: the sessions of one engine and the requests waiting for them. N session slots share the engine's
// weights (created once at start); a bounded queue holds the requests waiting for a slot. The request at the
// head of the queue goes to the free slot whose session holds the longest prefix of its prompt (one covering
// half of it at least; ties: the least recently used), which is rewound to that prefix so that only the rest
// of the prompt is fed (prefix.h); one worker thread per slot feeds the prompt and generates. The HTTP
// threads submit jobs and read their text as it comes (Job), and cancel them when the client goes away or the
// request times out.
#pragma once
#include "g4/g4.h"
#include "tools/serve/batcher.h"
#include "tools/serve/metrics.h"
#include "tools/serve/prefix.h"
#include "tools/serve/request.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace g4::serve {

using Clock = std::chrono::steady_clock;

// One request's life: queued, then running (the prompt fed: `started`), then done or failed. The worker
// appends the generated text to `text` as it comes; readers wait on `cv`.
struct Job {
    GenRequest req;
    Clock::time_point submitted, deadline;
    // The prompt with its media at 0 soft tokens, and its media's keys (Scheduler::probe): what the slot
    // choice and the prefix reuse compare.
    std::vector<int32_t> probe;
    std::vector<MediaKey> probe_media;

    std::mutex m;
    std::condition_variable cv;
    bool started = false, finished = false;
    int err_status = 0; // != 0: failed with this HTTP status (err_type, err_msg)
    std::string err_type, err_msg;
    std::string text;      // generated so far
    size_t text_sent  = 0; // of it, already streamed (the reader's)
    int prompt_tokens = 0, completion_tokens = 0;
    int cached_tokens = 0;     // of the prompt's tokens, those reused from the slot's session
    std::string finish_reason; // "stop" or "length"
    double ttft_ms = 0;

    // Stops the job as soon as possible (client gone, timeout); safe from any thread, any number of times.
    void cancel(const char* why);
    bool cancelled() const { return cancel_flag.load(); }

private:
    friend class Scheduler;
    std::atomic<bool> cancel_flag{false};
    std::string cancel_why;
    g4_session* session = nullptr; // while running (under m)
};

struct SchedulerOptions {
    int sessions      = 1;
    int threads       = 0; // worker threads per session (0: the hardware's share)
    int max_queue     = 16;
    bool prefix_reuse = true; // false: every request starts from an empty session
    bool batch        = true; // decode steps of the generating slots as one step (g4 serve --no-batch: false)
};

class Scheduler {
public:
    // Creates the sessions (all their memory) and the workers; throws std::runtime_error with g4's message.
    Scheduler(g4_engine* engine, const SchedulerOptions& opts, Metrics* metrics);
    ~Scheduler(); // stop() then join
    Scheduler(const Scheduler&) = delete;

    // Fills job.probe and job.probe_media from its request (any thread; throws ApiError as the request's
    // rendering would).
    void probe(Job& job) const;
    // Queues a job; false when the queue is full (the caller answers 429).
    bool submit(const std::shared_ptr<Job>& job);
    // Takes a job out of the queue if it is still there (its client went away, or it timed out waiting);
    // true if it was. Its place is free at once.
    bool withdraw(const std::shared_ptr<Job>& job);
    // Stops taking jobs; queued ones fail with 503, running ones finish. Returns when the workers are done.
    void stop();

    int queued() const;
    int running() const { return running_.load(); }
    int sessions() const { return (int)slots_.size(); }
    int threads_per_session() const { return threads_; }
    // The batcher of the decode steps; null when they are not batched (--no-batch, one slot, or a plan whose
    // backend steps one session at a time).
    const DecodeBatcher* batcher() const { return batcher_.get(); }

private:
    // A session and what it holds; `job` and `last_used` under m_; `held` written by its worker while the
    // slot runs a job and read by dispatch() only while the slot is free.
    struct Slot {
        g4_session* session = nullptr;
        SlotHistory held;
        std::shared_ptr<Job> job;
        uint64_t last_used = 0;
    };

    void worker(size_t slot);
    void dispatch(); // under m_: queued jobs to free slots
    void run(Job& job, Slot& slot);
    void feed_prompt(Job& job, Slot& slot, std::vector<int32_t>* ids, std::vector<MediaKey>* media);
    void add_media(Job& job, g4_session* s, size_t from, std::vector<MediaKey>* media);
    std::vector<int32_t> render(const Job& job, const std::vector<MediaKey>& media) const;

    g4_engine* engine_;
    g4_engine_info info_{};
    MediaTokens marks_;
    Metrics* metrics_;
    int max_queue_, threads_ = 0;
    bool prefix_reuse_ = true;
    std::vector<Slot> slots_;
    std::unique_ptr<DecodeBatcher> batcher_;
    std::vector<std::thread> workers_;
    mutable std::mutex m_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Job>> queue_;
    bool stopping_ = false;
    uint64_t tick_ = 0;
    std::atomic<int> running_{0};
};

} // namespace g4::serve
