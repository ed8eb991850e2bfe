// The compiler's worker pool (workers.h).
#include "compiler/workers.h"

#include <memory>
#include <mutex>

#include "kernels/cpu/thread_pool.h"

namespace g4::compiler {

void run_parallel(int64_t n, WorkFn fn, void* ctx) {
    static std::mutex mu;
    static std::unique_ptr<cpu::ThreadPool> pool;
    std::unique_lock<std::mutex> lk(mu, std::try_to_lock);
    if (n <= 1 || !lk.owns_lock()) {
        for (int64_t i = 0; i < n; ++i)
            fn(ctx, i, 0);
        return;
    }
    if (!pool) pool = std::make_unique<cpu::ThreadPool>(cpu::default_thread_count());
    pool->run(n, fn, ctx);
}

} // namespace g4::compiler
