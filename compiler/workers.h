// The compiler's worker pool: one per process, shared by the LoRA merge and the NF4 quantizer.
#pragma once
#include <cstdint>

namespace g4::compiler {

using WorkFn = void (*)(void* ctx, int64_t index, int thread);

// Calls fn(ctx, i, thread) for every i in [0, n) and returns when all are done: on a pool of
// cpu::default_thread_count() threads (G4_THREADS, else the hardware's), made at the first call with more
// than one item, or on the caller's thread alone (thread 0) while another caller holds the pool or n <= 1.
// Thread-safe; fn must not call parallel_for itself (it would run serially, not deadlock).
void run_parallel(int64_t n, WorkFn fn, void* ctx);

template <class F> void parallel_for(int64_t n, F& f) {
    run_parallel(
        n, [](void* c, int64_t i, int th) { (*static_cast<F*>(c))(i, th); }, &f);
}

} // namespace g4::compiler
