// The CPU worker pool's hand-off cost (kernels/cpu/thread_pool.h): microseconds per parallel_for of a few
// trivial items, as a decode step's hundreds of small parallel ops pay it, with the workers sleeping at once
// (spin 0, a condition-variable wake per call) and spinning (the default bound), alternated block by block
// in one process; prints the median block per cell.
// Usage: thread_pool_bench [max threads, default: hardware threads] [calls per block, default 2000]
// (built with the project: build/bench/micro/thread_pool_bench).
#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
    using g4::cpu::ThreadPool;
    const int max_threads = argc > 1 ? std::atoi(argv[1]) : g4::cpu::default_thread_count();
    const int calls       = argc > 2 ? std::atoi(argv[2]) : 2000;
    if (max_threads < 1 || calls < 1) {
        std::fprintf(stderr, "usage: thread_pool_bench [max threads >= 1] [calls per block >= 1]\n");
        return 2;
    }
    constexpr int kBlocks = 7;
    std::printf("threads  items  spin 0 us/call  spin %d us/call\n", g4::cpu::kDefaultSpinUs);
    for (int threads = 2; threads <= max_threads; threads *= 2)
        for (int items : {1 + threads, 64}) {
            ThreadPool sleepy(threads, 0), spinning(threads, g4::cpu::kDefaultSpinUs);
            std::vector<double> us[2];
            std::atomic<int64_t> sink{0};
            for (int b = 0; b < 2 * kBlocks; ++b) {
                ThreadPool& pool = b % 2 ? spinning : sleepy;
                const auto t0    = std::chrono::steady_clock::now();
                for (int i = 0; i < calls; ++i)
                    pool.parallel_for(items,
                                      [&](int64_t k, int) { sink.fetch_add(k, std::memory_order_relaxed); });
                us[b % 2].push_back(
                    std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                    calls);
            }
            for (auto& v : us)
                std::sort(v.begin(), v.end());
            std::printf("%7d  %5d  %14.2f  %15.2f\n", threads, items, us[0][kBlocks / 2], us[1][kBlocks / 2]);
        }
    return 0;
}
