// Worker pool implementation (see thread_pool.h).
#include "kernels/cpu/thread_pool.h"

#include <cstdlib>

namespace g4::cpu {

ThreadPool::ThreadPool(int threads) : n_threads_(threads < 1 ? 1 : threads) {
    threads_.reserve(n_threads_ - 1);
    for (int i = 1; i < n_threads_; ++i)
        threads_.emplace_back(&ThreadPool::worker, this, i);
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
        ++generation_;
    }
    cv_start_.notify_all();
    for (auto& t : threads_)
        t.join();
}

void ThreadPool::work(int id) {
    for (int64_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < n_;)
        fn_(ctx_, i, id);
}

void ThreadPool::worker(int id) {
    uint64_t seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_start_.wait(lk, [&] { return generation_ != seen; });
            seen = generation_;
            if (stop_) return;
        }
        work(id);
        std::lock_guard<std::mutex> lk(mu_);
        if (--pending_ == 0) cv_done_.notify_one();
    }
}

void ThreadPool::run(int64_t n, Fn fn, void* ctx) {
    if (n <= 0) return;
    if (n_threads_ == 1 || n == 1) {
        for (int64_t i = 0; i < n; ++i)
            fn(ctx, i, 0);
        return;
    }
    {
        std::lock_guard<std::mutex> lk(mu_);
        fn_  = fn;
        ctx_ = ctx;
        n_   = n;
        next_.store(0);
        pending_ = n_threads_ - 1;
        ++generation_;
    }
    cv_start_.notify_all();
    work(0);
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, [&] { return pending_ == 0; });
}

int default_thread_count() {
    if (const char* e = std::getenv("G4_THREADS")) {
        int v = std::atoi(e);
        if (v > 0) return v;
    }
    unsigned h = std::thread::hardware_concurrency();
    return h ? (int)h : 1;
}

} // namespace g4::cpu
