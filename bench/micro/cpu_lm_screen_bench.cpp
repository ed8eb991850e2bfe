// CPU LM-head screening microbenchmark at a Gemma 4 head shape (default E2B: 262144 x 1536 bf16, random
// weights, x Gaussian): the full bf16 GEMV of a greedy decode step (cpu::matmul, the fast precision's
// matmul_bf16_gemv) against the screened head (rt::lm_screen_argmax: the int8 pass, the exact rows it keeps,
// the argmax), alternated call by call on 1- and 2-thread pools, plus the int8 pass alone and the copy's
// build time. Checks that both give the same token. Prints medians in ms and GB/s of weights read.
// Usage: cpu_lm_screen_bench [calls, default 9] [n k]. Built with the project
// (build/bench/micro/cpu_lm_screen_bench).
#include "kernels/cpu/cpu.h"
#include "runtime/src/cpu_lm_screen.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

using namespace g4;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}
uint16_t to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

} // namespace

int main(int argc, char** argv) {
    const int calls = argc > 1 ? std::max(1, std::atoi(argv[1])) : 9;
    const int64_t n = argc > 3 ? std::atoll(argv[2]) : 262144, k = argc > 3 ? std::atoll(argv[3]) : 1536;
    std::mt19937 gen(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> w((size_t)(n * k));
    for (auto& v : w)
        v = to_bf16(0.02f * nd(gen));
    std::vector<int8_t> q((size_t)(n * k));
    std::vector<float> scale(n), bound(n), qnorm(n), y(n), x(k);
    std::vector<int32_t> qsum(n);
    const cpu::LmScreenCopy copy{q.data(), scale.data(), bound.data(), qnorm.data(), qsum.data()};
    const auto tb = Clock::now();
    cpu::lm_screen_build(w.data(), k, 0, n, copy);
    std::printf("head %lld x %lld: int8 copy built in %.0f ms on one thread\n", (long long)n, (long long)k,
                ms_since(tb));
    for (int threads : {1, 2}) {
        cpu::ThreadPool pool(threads);
        std::vector<float> scratch(cpu::scratch_floats_per_thread(k, 64) * threads);
        cpu::Context ctx{&pool, scratch.data(), scratch.size() / threads};
        std::vector<double> full, screened, pass;
        int64_t rows = 0;
        for (int c = 0; c < calls + 1; ++c) {
            for (auto& v : x)
                v = nd(gen);
            MatmulArgs a{x.data(), k, w.data(), DType::BF16, n, k, y.data(), n, 1};
            a.int16_x = true;
            auto t0   = Clock::now();
            cpu::matmul(ctx, a);
            const double tf   = ms_since(t0);
            const int64_t ref = std::max_element(y.begin(), y.end()) - y.begin();
            t0                = Clock::now();
            const int32_t tok =
                rt::lm_screen_argmax(ctx, copy, {x.data(), w.data(), nullptr, n, k, 0, y.data()}, &rows);
            const double ts = ms_since(t0);
            t0              = Clock::now();
            cpu::lm_screen(ctx, {x.data(), q.data(), scale.data(), bound.data(), qnorm.data(), qsum.data(),
                                 nullptr, n, k, y.data()});
            const double tp = ms_since(t0);
            if (tok != ref) {
                std::fprintf(stderr, "cpu_lm_screen_bench: screened token %d, full head %lld\n", tok,
                             (long long)ref);
                return 1;
            }
            if (c == 0) continue; // warm-up
            full.push_back(tf), screened.push_back(ts), pass.push_back(tp);
        }
        const double fb = (double)n * k * 2, qb = (double)n * k;
        std::printf(
            "%d thread(s): full head %.1f ms (%.1f GB/s), screened %.1f ms (%.2fx; last call %lld rows "
            "exact), int8 pass %.1f ms (%.1f GB/s)\n",
            threads, median(full), fb / median(full) / 1e6, median(screened), median(full) / median(screened),
            (long long)rows, median(pass), qb / median(pass) / 1e6);
    }
    return 0;
}
