// Worker pool implementation (see thread_pool.h).
//
// Hand-off: the caller writes the job (fn_, ctx_, n_, next_ = 0, pending_ = workers) and bumps generation_;
// each worker, spinning or asleep, sees the new generation, takes indices from next_ until they run out and
// decrements pending_; the caller takes indices too, then waits for pending_ to reach 0. A thread that waits
// spins for spin_us_ before it sleeps. Lost wake-ups are excluded by the sequentially consistent pairs
// (generation_ bump, sleepers_ read) on the caller's side and (sleepers_ increment, generation_ read) on the
// sleeper's, the sleeper making both under mu_; likewise pending_ and caller_asleep_ for the caller's sleep.
#include "kernels/cpu/thread_pool.h"

#include <chrono>
#include <cstdlib>

namespace g4::cpu {

namespace {
thread_local const ThreadPool* tl_pool = nullptr; // the pool whose job this thread is running, if any
thread_local int tl_thread             = 0;

inline void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

// Spins until done() or spin_us have passed; true if done() held.
template <class Done> bool spin_until(int spin_us, Done done) {
    if (spin_us <= 0) return done();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
    for (unsigned k = 1;; ++k) {
        if (done()) return true;
        cpu_pause();
        if ((k & 63) == 0) {
            if (std::chrono::steady_clock::now() >= deadline) return done();
            // A thread the waiter waits for may be off its core (more threads than free cores): let it run.
            std::this_thread::yield();
        }
    }
}
} // namespace

ThreadPool::ThreadPool(int threads, int spin_us)
    : n_threads_(threads < 1 ? 1 : threads), spin_us_(spin_us < 0 ? default_spin_us(n_threads_) : spin_us) {
    threads_.reserve(n_threads_ - 1);
    for (int i = 1; i < n_threads_; ++i)
        threads_.emplace_back(&ThreadPool::worker, this, i);
}

ThreadPool::~ThreadPool() {
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    { std::lock_guard<std::mutex> lk(mu_); }
    cv_start_.notify_all();
    for (auto& t : threads_)
        t.join();
}

void ThreadPool::work(int id) {
    for (int64_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < n_;)
        fn_(ctx_, i, id);
}

bool ThreadPool::wait_job(uint64_t seen) {
    auto moved = [&] { return generation_.load(std::memory_order_seq_cst) != seen; };
    if (!spin_until(spin_us_, moved)) {
        std::unique_lock<std::mutex> lk(mu_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        cv_start_.wait(lk, moved);
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    return !stop_.load(std::memory_order_relaxed);
}

void ThreadPool::worker(int id) {
    tl_pool       = this;
    tl_thread     = id;
    uint64_t seen = 0;
    while (wait_job(seen)) {
        seen = generation_.load(std::memory_order_acquire);
        work(id);
        if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
            caller_asleep_.load(std::memory_order_seq_cst)) {
            std::lock_guard<std::mutex> lk(mu_);
            cv_done_.notify_one();
        }
    }
}

void ThreadPool::wait_workers() {
    auto done = [&] { return pending_.load(std::memory_order_seq_cst) == 0; };
    if (spin_until(spin_us_, done)) return;
    std::unique_lock<std::mutex> lk(mu_);
    caller_asleep_.store(true, std::memory_order_seq_cst);
    cv_done_.wait(lk, done);
    caller_asleep_.store(false, std::memory_order_relaxed);
}

void ThreadPool::run(int64_t n, Fn fn, void* ctx) {
    if (n <= 0) return;
    if (n_threads_ == 1 || n == 1 || tl_pool == this) {
        const int th = tl_pool == this ? tl_thread : 0;
        for (int64_t i = 0; i < n; ++i)
            fn(ctx, i, th);
        return;
    }
    fn_  = fn;
    ctx_ = ctx;
    n_   = n;
    next_.store(0, std::memory_order_relaxed);
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
        { std::lock_guard<std::mutex> lk(mu_); }
        cv_start_.notify_all();
    }
    const ThreadPool* outer = tl_pool;
    tl_pool                 = this;
    tl_thread               = 0;
    work(0);
    tl_pool = outer;
    wait_workers();
}

int default_thread_count() {
    if (const char* e = std::getenv("G4_THREADS")) {
        int v = std::atoi(e);
        if (v > 0) return v;
    }
    unsigned h = std::thread::hardware_concurrency();
    return h ? (int)h : 1;
}

int default_spin_us(int threads) {
    if (const char* e = std::getenv("G4_SPIN_US")) {
        char* end = nullptr;
        long v    = std::strtol(e, &end, 10);
        if (end != e && *end == '\0' && v >= 0) return v > kMaxSpinUs ? kMaxSpinUs : (int)v;
    }
    const unsigned h = std::thread::hardware_concurrency();
    return h && (unsigned)threads > h ? 0 : kDefaultSpinUs;
}

} // namespace g4::cpu
