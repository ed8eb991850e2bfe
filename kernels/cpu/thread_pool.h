// Fixed-size worker pool for the CPU kernels. Threads are created once (at session creation) and
// parallel_for hands them work through a function pointer and a context pointer: no allocation per
// call. A job is published through atomics (a generation counter); the caller's thread is worker 0 and
// works too. After a job each worker spins (with a pause instruction) for a bounded time waiting for the
// next one before it sleeps on a condition variable, so the op-after-op parallel_fors of a step hand out
// work without a system call; the caller waits for the workers' end the same way.
// Thread-compatible: one caller at a time. A nested call (fn calling run on the same pool) runs its items
// on the calling thread, with that thread's index.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace g4::cpu {

class ThreadPool {
public:
    using Fn = void (*)(void* ctx, int64_t index, int thread);
    // threads >= 1 (fewer: 1); the caller's thread is worker 0. spin_us: how long a waiting thread spins
    // before it sleeps (0: sleeps at once; negative: default_spin_us(threads)).
    explicit ThreadPool(int threads, int spin_us = -1);
    ~ThreadPool();
    ThreadPool(const ThreadPool&)            = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;
    int size() const { return n_threads_; }
    int spin_us() const { return spin_us_; }

    // Calls fn(ctx, i, thread) for every i in [0, n), spread over the pool; returns when all are done.
    // Which thread runs which index is not fixed: a kernel's result must not depend on it.
    void run(int64_t n, Fn fn, void* ctx);

    template <class F> void parallel_for(int64_t n, F&& f) {
        auto thunk = [](void* c, int64_t i, int th) {
            (*static_cast<std::remove_reference_t<F>*>(c))(i, th);
        };
        run(n, thunk, (void*)&f);
    }

private:
    void worker(int id);
    void work(int id);
    bool wait_job(uint64_t seen); // worker: until the generation moves past seen; false: stop
    void wait_workers();          // caller: until every worker finished the current job
    int n_threads_;
    int spin_us_;
    std::vector<std::thread> threads_;
    // The job, written by the caller before the generation is bumped and read by the workers after they
    // see the new generation.
    Fn fn_     = nullptr;
    void* ctx_ = nullptr;
    int64_t n_ = 0;
    alignas(64) std::atomic<uint64_t> generation_{0};
    alignas(64) std::atomic<int64_t> next_{0};
    alignas(64) std::atomic<int> pending_{0};  // workers that have not finished the current job
    alignas(64) std::atomic<int> sleepers_{0}; // workers asleep (or about to sleep) on cv_start_
    std::atomic<bool> caller_asleep_{false};
    std::atomic<bool> stop_{false};
    std::mutex mu_;
    std::condition_variable cv_start_, cv_done_;
};

int default_thread_count(); // G4_THREADS env var, else hardware concurrency

// How long a pool's waiting threads spin before they sleep, in microseconds: G4_SPIN_US (0..kMaxSpinUs;
// larger: kMaxSpinUs; not a non-negative integer: ignored), else kDefaultSpinUs, or 0 for a pool of more
// threads than the hardware has (there a spinning thread holds a core that a thread it waits for needs).
// Spinning costs CPU time between jobs (the gaps inside a step are microseconds; between steps a worker
// sleeps after the bound); 0 suits machines whose cores other processes need.
constexpr int kDefaultSpinUs = 100;
constexpr int kMaxSpinUs     = 1000000;
int default_spin_us(int threads);

} // namespace g4::cpu
