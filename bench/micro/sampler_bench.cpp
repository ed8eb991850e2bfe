// Sampler microbenchmark: time a sampled token over Gemma's 262144-entry logits row on the CPU
// (sample_token, which the CUDA path also uses for top-p / min-p without top-k), against a whole-row
// sort, side by side in one run, for top-k + top-p, top-p over peaked / normal / nearly flat rows and min-p.
// Medians of 15 draws. CPU only; built with the project (build/bench/micro/sampler_bench).
// Usage: sampler_bench
#include "runtime/src/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

double ms_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// The whole-row sort: temperature, sort every token, then the same cut and draw work.
int32_t whole_row_sort(const std::vector<float>& logits, const g4_sampling_params& p, std::vector<float>& v,
                       std::vector<int32_t>& idx, std::mt19937_64& rng) {
    for (size_t i = 0; i < v.size(); ++i)
        v[i] = logits[i] / p.temperature, idx[i] = (int32_t)i;
    std::sort(idx.begin(), idx.end(),
              [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
    const double mx = v[idx[0]];
    double sum      = 0;
    for (int32_t t : idx)
        sum += std::exp(v[t] - mx);
    double cum = 0, r = std::uniform_real_distribution<double>(0.0, p.top_p)(rng);
    for (int32_t t : idx)
        if ((cum += std::exp(v[t] - mx) / sum) >= r) return t;
    return idx.back();
}

} // namespace

int main() {
    const int vocab = 262144;
    struct Setting {
        const char* name;
        float spread; // logits ~ N(0, spread); peaked: 32 tokens raised by 12 (a nucleus of tens of tokens)
        bool peaked;
        g4_sampling_params p;
    };
    const Setting settings[] = {
        {"top-k 64, top-p 0.95", 3.0f, false, {1.0f, 64, 0.95f, 0.0f, 1.0f, 0, 1}},
        {"top-p 0.95, peaked", 2.0f, true, {1.0f, 0, 0.95f, 0.0f, 1.0f, 0, 1}},
        {"top-p 0.95, N(0, 3)", 3.0f, false, {1.0f, 0, 0.95f, 0.0f, 1.0f, 0, 1}},
        {"min-p 0.05, N(0, 3)", 3.0f, false, {1.0f, 0, 1.0f, 0.05f, 1.0f, 0, 1}},
        {"top-p 0.9, flat N(0, .05)", 0.05f, false, {1.0f, 0, 0.9f, 0.0f, 1.0f, 0, 1}},
    };
    std::printf("%-26s %14s %18s\n", "sampler (vocab 262144)", "sample_token", "whole-row sort");
    for (const Setting& s : settings) {
        std::mt19937 gen(7);
        std::normal_distribution<float> nd(0.0f, s.spread);
        std::vector<float> logits(vocab), buf(vocab), v(vocab);
        std::vector<int32_t> idx(vocab), idx2(vocab), tmp(vocab);
        for (float& x : logits)
            x = nd(gen);
        if (s.peaked)
            for (int i = 0; i < 32; ++i)
                logits[(size_t)i * 8191] += 12.0f;
        std::mt19937_64 rng(1), rng2(1);
        std::vector<double> a, b;
        for (int r = 0; r < 15; ++r) {
            auto t = std::chrono::steady_clock::now();
            g4::rt::sample_token(logits.data(), vocab, s.p, nullptr, 0, buf.data(), idx.data(), tmp.data(),
                                 rng);
            a.push_back(ms_since(t));
            t = std::chrono::steady_clock::now();
            whole_row_sort(logits, s.p, v, idx2, rng2);
            b.push_back(ms_since(t));
        }
        std::sort(a.begin(), a.end()), std::sort(b.begin(), b.end());
        std::printf("%-26s %11.2f ms %15.2f ms\n", s.name, a[7], b[7]);
    }
    return 0;
}
