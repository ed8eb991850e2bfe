// CPU NF4 prefill matmul microbenchmark at Gemma 4 E2B/E4B projection shapes: the dequantize-to-fp32-tile +
// Eigen GEMM (cpu::matmul_tiled, what `--cpu-precision f32` plans run for more than 8 rows) against the
// NF4 x int16 GEMM (cpu::matmul_nf4_gemm_int16, what `--cpu-precision fast` plans run), alternated call by
// call in one process, on 1- and 2-thread pools. Prints the median over the calls in milliseconds and the
// multiply-adds per second (rows * N * K / time).
// Usage: cpu_gemm_bench [calls per cell, default 9] [--rows R] (default: 64, a CPU plan's prefill chunk).
// Built with the project (build/bench/micro/cpu_gemm_bench); G4_CPU_LEVEL picks the kernels' level.
#include "compiler/nf4_quant.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/nf4.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

using namespace g4;

struct Shape {
    const char* name;
    int64_t n, k;
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
    int calls = 9, rows = 64;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--rows") && i + 1 < argc)
            rows = std::max(9, std::atoi(argv[++i]));
        else
            calls = std::max(1, std::atoi(argv[i]));
    }
    const Shape shapes[] = {
        {"E2B q (2048x1536)", 2048, 1536},         {"E2B k/v (256x1536)", 256, 1536},
        {"E2B o (1536x2048)", 1536, 2048},         {"E2B gate/up (6144x1536)", 6144, 1536},
        {"E2B down (1536x6144)", 1536, 6144},      {"E2B up x2 (12288x1536)", 12288, 1536},
        {"E2B down x2 (1536x12288)", 1536, 12288}, {"E4B o (2560x2048)", 2560, 2048}};
    std::printf("CPU kernels: %s, %d rows, medians of %d calls\n", cpu::level_name(cpu::active_level()), rows,
                calls);
    std::printf("%-26s %3s | %20s | %20s | %6s\n", "shape (N x K)", "thr", "fp32 tiled ms GMAC/s",
                "int16 GEMM ms GMAC/s", "ratio");
    for (const Shape& s : shapes) {
        std::mt19937 gen(1);
        std::normal_distribution<float> nd(0.0f, 0.02f), nx(0.0f, 1.0f);
        std::vector<float> w((size_t)(s.n * s.k)), x((size_t)rows * s.k), y((size_t)rows * s.n);
        for (float& v : w)
            v = nd(gen);
        for (float& v : x)
            v = nx(gen);
        const std::vector<uint8_t> blob = nf4::quantize(w.data(), s.n * s.k, false);
        for (int threads : {1, 2}) {
            cpu::ThreadPool pool(threads);
            std::vector<float> scratch(cpu::scratch_floats_per_thread(s.k, 16) * threads);
            cpu::Context ctx{&pool, scratch.data(), cpu::scratch_floats_per_thread(s.k, 16)};
            MatmulArgs a{x.data(), s.k, blob.data(), DType::NF4, s.n, s.k, y.data(), s.n, rows};
            MatmulArgs b = a;
            b.int16_x    = true;
            auto timed   = [&](auto&& f) {
                auto t0 = std::chrono::steady_clock::now();
                f();
                return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count();
            };
            std::vector<double> t_old, t_new;
            for (int i = 0; i < calls + 1; ++i) { // the first round warms up
                const double o = timed([&] { cpu::matmul_tiled(ctx, a); });
                const double n = timed([&] { cpu::matmul_nf4_gemm_int16(ctx, b); });
                if (i) t_old.push_back(o), t_new.push_back(n);
            }
            const double mo = median(t_old), mn = median(t_new), macs = (double)rows * s.n * s.k;
            std::printf("%-26s %3d | %9.2f %10.1f | %9.2f %10.1f | %5.2fx\n", s.name, threads, mo,
                        macs / mo * 1e-6, mn, macs / mn * 1e-6, mo / mn);
        }
    }
    return 0;
}
