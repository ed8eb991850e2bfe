// The CPU kernels' worker pool (kernels/cpu/thread_pool.h): every index of every job runs exactly once on a
// thread of the pool, with workers that spin between jobs and with workers that sleep at once (spin 0);
// nested calls run inline on the calling thread; a pool is destroyed cleanly while its workers spin or sleep;
// G4_SPIN_US sets the spin bound. Run under ThreadSanitizer by tools/sanitize.sh tsan.
#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

using g4::cpu::ThreadPool;

// Runs `jobs` jobs of 0..40 items each and checks that every index ran once, on a thread index of the pool.
void many_small_jobs(ThreadPool& pool, int jobs) {
    std::vector<std::atomic<int>> hits(64);
    std::atomic<int> bad_thread{0};
    for (int j = 0; j < jobs; ++j) {
        const int64_t n = j % 41;
        for (auto& h : hits)
            h.store(0, std::memory_order_relaxed);
        pool.parallel_for(n, [&](int64_t i, int th) {
            hits[i].fetch_add(1, std::memory_order_relaxed);
            if (th < 0 || th >= pool.size()) bad_thread.fetch_add(1);
        });
        for (int64_t i = 0; i < (int64_t)hits.size(); ++i)
            ASSERT_EQ(hits[i].load(), i < n ? 1 : 0) << "job " << j << " of " << n << " items, index " << i;
    }
    EXPECT_EQ(bad_thread.load(), 0);
}

TEST(ThreadPool, ManySmallJobsRunEveryIndexOnce) {
    for (int spin : {0, 20, 1000})
        for (int threads : {1, 2, 3, 4}) {
            SCOPED_TRACE("spin " + std::to_string(spin) + " threads " + std::to_string(threads));
            ThreadPool pool(threads, spin);
            EXPECT_EQ(pool.size(), threads);
            EXPECT_EQ(pool.spin_us(), spin);
            many_small_jobs(pool, 500);
        }
}

TEST(ThreadPool, JobsAfterTheWorkersFellAsleep) {
    // A spin bound far shorter than the pause between jobs: each job wakes sleeping workers.
    for (int spin : {0, 5}) {
        ThreadPool pool(3, spin);
        for (int j = 0; j < 20; ++j) {
            std::this_thread::sleep_for(std::chrono::microseconds(300));
            std::vector<int> out(100, 0);
            pool.parallel_for((int64_t)out.size(), [&](int64_t i, int) { out[i] = (int)i * 3; });
            for (int i = 0; i < (int)out.size(); ++i)
                ASSERT_EQ(out[i], i * 3);
        }
    }
}

TEST(ThreadPool, LongItemsPutTheCallerToSleepAndWakeIt) {
    // Items longer than the spin bound: the caller sleeps waiting for the workers' last item.
    ThreadPool pool(2, 1);
    std::atomic<int> ran{0};
    for (int j = 0; j < 5; ++j)
        pool.parallel_for(4, [&](int64_t, int) {
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
            ran.fetch_add(1);
        });
    EXPECT_EQ(ran.load(), 20);
}

TEST(ThreadPool, NestedCallsRunInlineOnTheCallingThread) {
    ThreadPool pool(3, 50);
    std::vector<std::atomic<int>> inner(8 * 5);
    std::atomic<int> wrong_thread{0};
    pool.parallel_for(8, [&](int64_t i, int th) {
        pool.parallel_for(5, [&](int64_t k, int th2) {
            if (th2 != th) wrong_thread.fetch_add(1);
            inner[i * 5 + k].fetch_add(1);
        });
    });
    EXPECT_EQ(wrong_thread.load(), 0);
    for (auto& h : inner)
        EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, DestroyedWhileIdle) {
    { ThreadPool never_used(4, 100000); } // workers spinning their first wait
    for (int spin : {0, 100000}) {
        ThreadPool pool(4, spin);
        std::atomic<int> ran{0};
        pool.parallel_for(16, [&](int64_t, int) { ran.fetch_add(1); });
        EXPECT_EQ(ran.load(), 16);
        if (spin == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2)); // asleep by now
    }
}

TEST(ThreadPool, SpinBoundFromTheEnvironment) {
    const char* old         = std::getenv("G4_SPIN_US");
    const std::string saved = old ? old : "";
    const int def           = g4::cpu::kDefaultSpinUs;
    struct Case {
        const char* value;
        int want; // -1: ignored, the default
    } cases[] = {{"0", 0},   {"250", 250}, {"5000000", g4::cpu::kMaxSpinUs},
                 {"-3", -1}, {"fast", -1}, {"12us", -1}};
    for (const Case& c : cases) {
        setenv("G4_SPIN_US", c.value, 1);
        EXPECT_EQ(g4::cpu::default_spin_us(1), c.want < 0 ? def : c.want) << c.value;
        EXPECT_EQ(g4::cpu::default_spin_us(100000), c.want < 0 ? 0 : c.want) << c.value;
        ThreadPool pool(1);
        EXPECT_EQ(pool.spin_us(), c.want < 0 ? def : c.want) << c.value;
    }
    unsetenv("G4_SPIN_US");
    EXPECT_EQ(g4::cpu::default_spin_us(1), def);
    EXPECT_EQ(g4::cpu::default_spin_us(100000), 0) << "more threads than the hardware has: no spinning";
    if (old) setenv("G4_SPIN_US", saved.c_str(), 1);
}

} // namespace
