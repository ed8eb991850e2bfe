// CPU NF4 matmul microbenchmark at Gemma 4 decode shapes: the fused GEMV (cpu::matmul_nf4_gemv, what
// cpu::matmul runs for 1..8 rows) against the dequantize-to-fp32-tile + Eigen GEMM path
// (cpu::matmul_tiled), side by side in one process, on 1- and 2-thread pools. Each call reads the next of
// several copies of the weight blob (>= 128 MiB in all, past the last-level cache), as decode streams a
// model from memory. Prints the median over the calls, in microseconds, and GB/s of NF4 blob read.
// Usage: cpu_gemv_bench [calls per cell, default 41] [--dq] [--rows] [--hot] [--int16]   (--dq:
// double-quantized absmax; --rows: the row sweep 1..16 at two shapes instead of the decode table; --hot: one
// copy, so weights that fit stay in cache; --int16: old = the fp32 GEMV, new = the NF4 x int16 GEMV
// cpu::matmul_nf4_int16, what `--cpu-precision fast` plans run; --threads N: the second pool's size, default
// 2). Built with the project
// (build/bench/micro/cpu_gemv_bench).
#include "compiler/nf4_quant.h"
#include "kernels/cpu/cpu.h"
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

struct Weights {
    std::vector<std::vector<uint8_t>> copies;
    uint64_t bytes = 0;
    Weights(int64_t n, int64_t k, bool dq, bool hot) {
        std::mt19937 gen(1);
        std::normal_distribution<float> nd(0.0f, 0.02f);
        std::vector<float> w((size_t)(n * k));
        for (float& v : w)
            v = nd(gen);
        std::vector<uint8_t> blob = nf4::quantize(w.data(), n * k, dq);
        bytes                     = blob.size();
        size_t count              = hot ? 1 : std::max<size_t>(2, ((size_t)128 << 20) / blob.size() + 1);
        copies.assign(count, blob);
    }
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

struct Cell {
    double old_us, new_us;
};

// Alternates the two paths call by call so both see the same machine state.
Cell time_both(const Shape& s, int rows, bool dq, bool int16, const Weights& w, cpu::Context& ctx,
               int calls) {
    std::mt19937 gen(2);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x((size_t)rows * s.k), y((size_t)rows * s.n);
    for (float& v : x)
        v = nd(gen);
    MatmulArgs a{x.data(), s.k, nullptr, DType::NF4, s.n, s.k, y.data(), s.n, rows};
    a.nf4_double_quant = dq;
    std::vector<double> t_old, t_new;
    size_t next = 0;
    auto timed  = [&](auto&& f) {
        a.w     = w.copies[next++ % w.copies.size()].data();
        auto t0 = std::chrono::steady_clock::now();
        f();
        return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    };
    auto run_old = [&] {
        if (int16)
            cpu::matmul_nf4_gemv(ctx, a);
        else
            cpu::matmul_tiled(ctx, a);
    };
    auto run_new = [&] {
        if (int16) {
            MatmulArgs b = a;
            b.int16_x    = true;
            cpu::matmul_nf4_int16(ctx, b);
        } else {
            cpu::matmul_nf4_gemv(ctx, a);
        }
    };
    const bool has_new = rows <= cpu::kNf4GemvMaxRows;
    for (int i = 0; i < 3; ++i) { // warm-up
        timed(run_old);
        if (has_new) timed(run_new);
    }
    for (int i = 0; i < calls; ++i) {
        t_old.push_back(timed(run_old));
        if (has_new) t_new.push_back(timed(run_new));
    }
    return {median(t_old), t_new.empty() ? 0.0 : median(t_new)};
}

} // namespace

int main(int argc, char** argv) {
    int calls   = 41;
    int threads = 2;
    bool dq = false, row_sweep = false, hot = false, int16 = false;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = std::max(1, std::atoi(argv[++i]));
        else if (!std::strcmp(argv[i], "--dq"))
            dq = true;
        else if (!std::strcmp(argv[i], "--rows"))
            row_sweep = true;
        else if (!std::strcmp(argv[i], "--hot"))
            hot = true;
        else if (!std::strcmp(argv[i], "--int16"))
            int16 = true;
        else
            calls = std::max(1, std::atoi(argv[i]));
    }
    const Shape decode[] = {
        {"E2B q      2048x1536", 2048, 1536},   {"E2B kv      256x1536", 256, 1536},
        {"E2B o      1536x2048", 1536, 2048},   {"E2B up     6144x1536", 6144, 1536},
        {"E2B down   1536x6144", 1536, 6144},   {"E2B up2x  12288x1536", 12288, 1536},
        {"E2B down2x 1536x12288", 1536, 12288}, {"E4B q      2048x2560", 2048, 2560},
        {"E4B kv      512x2560", 512, 2560},    {"E4B o      2560x2048", 2560, 2048},
        {"E4B up    10240x2560", 10240, 2560},  {"E4B down  2560x10240", 2560, 10240},
    };
    const Shape sweep[]    = {{"E2B up     6144x1536", 6144, 1536}, {"E2B down   1536x6144", 1536, 6144}};
    const int sweep_rows[] = {1, 2, 3, 4, 5, 8, 16};

    int64_t max_k = 0;
    for (const Shape& s : decode)
        max_k = std::max(max_k, s.k);
    cpu::ThreadPool pools[2] = {cpu::ThreadPool(1), cpu::ThreadPool(threads)};
    std::vector<float> scratch[2];
    cpu::Context ctx[2];
    for (int p = 0; p < 2; ++p) {
        size_t stride = cpu::scratch_floats_per_thread(max_k, 16);
        scratch[p].assign(stride * pools[p].size(), 0.0f);
        ctx[p] = {&pools[p], scratch[p].data(), stride};
    }

    std::printf("NF4 %s quant, %s, median of %d calls; %s\n", dq ? "double" : "single",
                hot ? "one weight copy" : "weights rotated over >= 128 MiB", calls,
                int16 ? "old = fp32 GEMV, new = NF4 x int16 GEMV"
                      : "old = dequantize tile + Eigen GEMM, new = fused GEMV");
    char second[64];
    std::snprintf(second, sizeof second, "%d threads: old / new us (GB/s), speed-up", threads);
    std::printf("%-22s %4s | %-40s | %-40s\n", "shape (N x K)", "rows",
                "1 thread: old / new us (GB/s), speed-up", second);
    auto row = [&](const Shape& s, int rows) {
        Weights w(s.n, s.k, dq, hot);
        std::printf("%-22s %4d", s.name, rows);
        for (int p = 0; p < 2; ++p) {
            Cell c = time_both(s, rows, dq, int16, w, ctx[p], calls);
            if (c.new_us > 0)
                std::printf(" | %6.0f (%5.1f) / %6.0f (%5.1f) x%4.2f", c.old_us, w.bytes / c.old_us / 1e3,
                            c.new_us, w.bytes / c.new_us / 1e3, c.old_us / c.new_us);
            else
                std::printf(" | %6.0f (%5.1f) / %15s      ", c.old_us, w.bytes / c.old_us / 1e3, "-");
        }
        std::printf("\n");
        std::fflush(stdout);
    };
    if (row_sweep) {
        for (const Shape& s : sweep)
            for (int r : sweep_rows)
                row(s, r);
    } else {
        for (const Shape& s : decode)
            row(s, 1);
    }
    return 0;
}
