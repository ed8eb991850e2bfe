// The sampler's two entry points: sample_token over a whole logits row (the CPU path) and
// sample_sorted over top-k candidates prepared elsewhere (the GPU path gives them penalised, divided by
// the temperature and sorted). Given the same candidates and seed they must draw the same tokens.
#include "runtime/src/sampler.h"
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <gtest/gtest.h>
#include <random>
#include <vector>

namespace {

// What the GPU's device_topk computes, written plainly: penalty, temperature, the k best by value with
// ties to the lower token.
void candidates(const std::vector<float>& logits, const g4_sampling_params& p,
                const std::vector<int32_t>& history, int k, std::vector<float>* values,
                std::vector<int32_t>* tokens) {
    std::vector<float> v = logits;
    const size_t n       = (size_t)g4::rt::penalty_window(p, (int32_t)history.size());
    for (size_t i = history.size() - n; i < history.size(); ++i) {
        const float l = logits[history[i]];
        v[history[i]] = l < 0 ? l * p.repeat_penalty : l / p.repeat_penalty;
    }
    if (p.temperature > 0)
        for (float& x : v)
            x /= p.temperature;
    std::vector<int32_t> idx(v.size());
    for (size_t i = 0; i < v.size(); ++i)
        idx[i] = (int32_t)i;
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
    values->clear(), tokens->clear();
    for (int i = 0; i < k; ++i)
        values->push_back(v[idx[i]]), tokens->push_back(idx[i]);
}

TEST(Sampler, SortedCandidatesDrawTheSameTokensAsTheFullRow) {
    const int vocab = 20000;
    std::vector<g4_sampling_params> sets(4, g4_sampling_params{});
    sets[0] = {0.8f, 40, 0.9f, 0.02f, 1.3f, 16, 11};
    sets[1] = {1.0f, 64, 0.95f, 0.0f, 1.0f, 64, 3};
    sets[2] = {1.5f, 1000, 1.0f, 0.0f, 1.1f, -1, 7};
    sets[3] = {0.7f, 5, 1.0f, 0.3f, 1.0f, 0, 1};
    for (const g4_sampling_params& p : sets) {
        std::mt19937_64 a(p.seed), b(p.seed);
        std::vector<int32_t> history = {3, 17, 17, 19999, 0};
        std::vector<float> buf(vocab), vals;
        std::vector<int32_t> idx(vocab), tmp(vocab), toks;
        int differ = 0;
        for (int step = 0; step < 50; ++step) {
            std::vector<float> logits = g4test::randn(vocab, 100 + step, 2.0f);
            logits[step * 37]         = logits[step * 37 + 1]; // a tie
            const int32_t want =
                g4::rt::sample_token(logits.data(), vocab, p, history.data(), (int32_t)history.size(),
                                     buf.data(), idx.data(), tmp.data(), a);
            candidates(logits, p, history, p.top_k, &vals, &toks);
            const int32_t got = g4::rt::sample_sorted(vals.data(), toks.data(), p.top_k, p, b);
            differ += got != want;
            history.push_back(want);
        }
        EXPECT_EQ(differ, 0) << "top_k " << p.top_k << ", temperature " << p.temperature;
    }
}

// Top-p / min-p over a whole row, written plainly: sort every token, softmax with the denominator
// summed in token order, top-p then min-p on the sorted row, then the draw.
int32_t plain_nucleus(const std::vector<float>& logits, const g4_sampling_params& p, std::mt19937_64& rng) {
    std::vector<float> v = logits;
    for (float& x : v)
        x /= p.temperature;
    std::vector<int32_t> idx(v.size());
    for (size_t i = 0; i < v.size(); ++i)
        idx[i] = (int32_t)i;
    std::sort(idx.begin(), idx.end(),
              [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
    const float mx = v[idx[0]];
    double sum     = 0;
    for (float x : v)
        sum += std::exp((double)x - mx);
    auto prob  = [&](size_t i) { return std::exp((double)v[idx[i]] - mx) / sum; };
    size_t n   = v.size();
    double cum = 0;
    for (size_t i = 0; i < n && p.top_p < 1.0f; ++i)
        if ((cum += prob(i)) >= p.top_p) n = i + 1;
    size_t keep = 1;
    while (p.min_p > 0.0f && keep < n && prob(keep) >= p.min_p * prob(0))
        ++keep;
    if (p.min_p > 0.0f) n = keep;
    double total = 0;
    for (size_t i = 0; i < n; ++i)
        total += prob(i);
    double r = std::uniform_real_distribution<double>(0.0, total)(rng);
    for (size_t i = 0; i < n; ++i)
        if ((r -= prob(i)) <= 0) return idx[i];
    return idx[n - 1];
}

// sample_token finds the nucleus without a whole-row comparison sort (prefixes of 1024, then 8x longer,
// then radix passes over the rest):
// the same tokens as the plain whole-row sort, including nuclei far past 1024 tokens (flat rows).
TEST(Sampler, NucleusWithoutTopKMatchesAWholeRowSort) {
    struct Case {
        int vocab;
        float spread; // logit scale: 3 peaked, 0.05 nearly flat (nucleus of most of the row)
        g4_sampling_params p;
    };
    const std::vector<Case> cases = {
        {262144, 3.0f, {1.0f, 0, 0.95f, 0.0f, 1.0f, 0, 5}},
        {262144, 0.05f, {1.0f, 0, 0.9f, 0.0f, 1.0f, 0, 6}},
        {20000, 3.0f, {0.7f, 0, 1.0f, 0.05f, 1.0f, 0, 7}},
        {20000, 1.0f, {1.3f, 0, 0.8f, 0.1f, 1.0f, 0, 8}},
        {20000, 0.2f, {1.0f, 0, 0.999f, 0.0f, 1.0f, 0, 9}},
        {20000, 0.5f, {0.9f, 0, 1.0f, 0.9f, 1.0f, 0, 10}},
        {262144, 0.05f, {1.0f, 0, 1.0f, 0.5f, 1.0f, 0, 11}}, // min-p alone keeping most of the row
    };
    for (const Case& c : cases) {
        std::mt19937_64 a(c.p.seed), b(c.p.seed);
        std::vector<float> buf(c.vocab);
        std::vector<int32_t> idx(c.vocab), tmp(c.vocab);
        const int steps = c.vocab > 100000 ? 4 : 40;
        int differ      = 0;
        for (int step = 0; step < steps; ++step) {
            std::vector<float> logits = g4test::randn(c.vocab, 300 + step, c.spread);
            logits[step * 11]         = logits[step * 11 + 5]; // a tie
            const int32_t got = g4::rt::sample_token(logits.data(), c.vocab, c.p, nullptr, 0, buf.data(),
                                                     idx.data(), tmp.data(), a);
            differ += got != plain_nucleus(logits, c.p, b);
        }
        EXPECT_EQ(differ, 0) << "vocab " << c.vocab << ", spread " << c.spread << ", top_p " << c.p.top_p
                             << ", min_p " << c.p.min_p;
    }
}

// The radix passes that sort long nuclei give exactly the comparison sort's order: value descending,
// ties (many here, and -0.0 against 0.0, and -inf) to the lower token, for any subset of ids.
TEST(Sampler, RadixSortGivesTheComparisonOrder) {
    const int vocab        = 262144;
    std::vector<float> buf = g4test::randn(vocab, 77, 2.0f);
    for (int i = 0; i < vocab; i += 7)
        buf[i] = std::round(buf[i] * 4.0f) / 4.0f; // many exact ties
    for (int i = 3; i < vocab; i += 1001)
        buf[i] = (i / 1001) % 2 ? -0.0f : 0.0f;
    for (int i = 5; i < vocab; i += 4099)
        buf[i] = -INFINITY;
    buf[vocab - 1] = 1e30f, buf[0] = -1e30f, buf[1] = 1e-40f; // extremes and a denormal
    auto by_logit = [&](int32_t a, int32_t b) { return buf[a] > buf[b] || (buf[a] == buf[b] && a < b); };
    for (int n : {vocab, 70000, 20001}) {
        std::vector<int32_t> ids(vocab), tmp(n);
        for (int i = 0; i < vocab; ++i)
            ids[i] = i;
        std::shuffle(ids.begin(), ids.end(), std::mt19937(n));
        ids.resize(n);
        std::vector<int32_t> want = ids;
        std::sort(want.begin(), want.end(), by_logit);
        g4::rt::radix_sort_by_logit(ids.data(), n, buf.data(), tmp.data(), vocab);
        EXPECT_EQ(ids, want) << "n " << n;
    }
}

// The GPU's top-p / min-p path: the best 1024 tokens and the row's softmax normalizer (its sum taken
// in another order, as the GPU's blocks do). Where the nucleus ends among them, sample_prefix draws
// what sample_token draws with the same seed; where it may not (flat rows), it returns -1 and leaves
// the RNG untouched, and the caller's sample_token draws as if it had not been called.
TEST(Sampler, PrefixWithTheRowNormalizerDrawsTheSameTokensAsTheFullRow) {
    struct Case {
        float spread; // 2-6: peaked rows (the nucleus ends among the best 1024); 0.05: nearly flat (it does
                      // not)
        g4_sampling_params p;
        bool covered;
    };
    const std::vector<Case> cases = {
        {6.0f, {1.0f, 0, 0.95f, 0.0f, 1.0f, 0, 5}, true},
        {3.0f, {0.7f, 0, 1.0f, 0.05f, 1.3f, 16, 7}, true},
        {2.0f, {1.3f, 0, 0.8f, 0.1f, 1.1f, -1, 8}, true},
        {0.05f, {1.0f, 0, 0.9f, 0.0f, 1.0f, 0, 6}, false},
        {0.05f, {1.0f, 0, 1.0f, 0.001f, 1.0f, 0, 9}, false},
    };
    const int vocab = 262144, k = 1024;
    for (const Case& c : cases) {
        std::mt19937_64 a(c.p.seed), b(c.p.seed);
        std::vector<int32_t> history = {3, 17, 17, 262143, 0};
        std::vector<float> buf(vocab), vals;
        std::vector<int32_t> idx(vocab), tmp(vocab), toks;
        int differ = 0, fell_back = 0;
        for (int step = 0; step < 6; ++step) {
            std::vector<float> logits = g4test::randn(vocab, 500 + step, c.spread);
            candidates(logits, c.p, history, k, &vals, &toks);
            // The whole row's normalizer, summed in reverse token order.
            std::vector<float> row = logits;
            for (size_t i = history.size() - (size_t)g4::rt::penalty_window(c.p, (int32_t)history.size());
                 i < history.size(); ++i) {
                const float l   = logits[history[i]];
                row[history[i]] = l < 0 ? l * c.p.repeat_penalty : l / c.p.repeat_penalty;
            }
            double sum = 0;
            for (int i = vocab - 1; i >= 0; --i)
                sum += std::exp((double)(row[i] / c.p.temperature) - vals[0]);
            int32_t got = g4::rt::sample_prefix(vals.data(), toks.data(), k, vocab, vals[0], sum, c.p, b);
            if (got < 0)
                ++fell_back, got = g4::rt::sample_token(logits.data(), vocab, c.p, history.data(),
                                                        (int32_t)history.size(), buf.data(), idx.data(),
                                                        tmp.data(), b);
            const int32_t want =
                g4::rt::sample_token(logits.data(), vocab, c.p, history.data(), (int32_t)history.size(),
                                     buf.data(), idx.data(), tmp.data(), a);
            differ += got != want;
            history.push_back(want);
        }
        EXPECT_EQ(differ, 0) << "spread " << c.spread << ", top_p " << c.p.top_p << ", min_p " << c.p.min_p;
        EXPECT_EQ(fell_back, c.covered ? 0 : 6)
            << "spread " << c.spread << ", top_p " << c.p.top_p << ", min_p " << c.p.min_p;
    }
    // Settings that are not this case: greedy, top-k, neither top-p nor min-p.
    std::mt19937_64 r(1);
    const float v[2]   = {1.0f, 0.5f};
    const int32_t t[2] = {4, 9};
    for (g4_sampling_params p : {g4_sampling_params{0.0f, 0, 0.9f, 0.0f, 1.0f, 0, 1},
                                 g4_sampling_params{1.0f, 40, 0.9f, 0.0f, 1.0f, 0, 1},
                                 g4_sampling_params{1.0f, 0, 1.0f, 0.0f, 1.0f, 0, 1}})
        EXPECT_EQ(g4::rt::sample_prefix(v, t, 2, 512, 1.0f, 1.6, p, r), -1);
}

} // namespace
