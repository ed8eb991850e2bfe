// Fixed-size worker pool for the CPU kernels. Threads are created once (at session creation) and
// parallel_for hands them work through a function pointer and a context pointer: no allocation per
// call. Thread-compatible: one caller at a time.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace g4::cpu {

class ThreadPool {
public:
    using Fn = void (*)(void* ctx, int64_t index, int thread);
    explicit ThreadPool(int threads); // threads >= 1; the caller's thread is worker 0
    ~ThreadPool();
    ThreadPool(const ThreadPool&)            = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;
    int size() const { return n_threads_; }

    // Calls fn(ctx, i, thread) for every i in [0, n), spread over the pool; returns when all are done.
    void run(int64_t n, Fn fn, void* ctx);

    template <class F> void parallel_for(int64_t n, F&& f) {
        auto thunk = [](void* c, int64_t i, int th) { (*static_cast<F*>(c))(i, th); };
        run(n, thunk, (void*)&f);
    }

private:
    void worker(int id);
    void work(int id);
    int n_threads_;
    std::vector<std::thread> threads_;
    std::mutex mu_;
    std::condition_variable cv_start_, cv_done_;
    uint64_t generation_ = 0;
    int pending_         = 0;
    bool stop_           = false;
    Fn fn_               = nullptr;
    void* ctx_           = nullptr;
    int64_t n_           = 0;
    std::atomic<int64_t> next_{0};
};

int default_thread_count(); // G4_THREADS env var, else hardware concurrency

} // namespace g4::cpu
