// Sampler implementation (see sampler.h).
#include "runtime/src/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace g4::rt {

namespace {

// Softmax over candidates 0..n-1 (sorted by value, descending, ties to the lower token, when top-k,
// top-p or min-p apply), then top-p, min-p and the draw. value(i): the candidate's logit after the
// penalty and temperature; token(i): its id.
template <class Value, class Token>
int32_t draw(int32_t n, Value value, Token token, const g4_sampling_params& p, std::mt19937_64& rng) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; ++i) mx = std::max(mx, value(i));
    double sum = 0;
    for (int32_t i = 0; i < n; ++i) sum += std::exp((double)value(i) - mx);
    auto prob = [&](int32_t i) { return std::exp((double)value(i) - mx) / sum; };
    if (p.top_p < 1.0f) {
        double cum = 0;
        int32_t keep = n;
        for (int32_t i = 0; i < n; ++i) {
            cum += prob(i);
            if (cum >= p.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = std::max<int32_t>(1, keep);
    }
    if (p.min_p > 0.0f) {
        double top = prob(0);
        int32_t keep = 1;
        while (keep < n && prob(keep) >= p.min_p * top) ++keep;
        n = keep;
    }
    double total = 0;
    for (int32_t i = 0; i < n; ++i) total += prob(i);
    double r = std::uniform_real_distribution<double>(0.0, total)(rng);
    for (int32_t i = 0; i < n; ++i) {
        r -= prob(i);
        if (r <= 0) return token(i);
    }
    return token(n - 1);
}

} // namespace

std::string check_sampling(const g4_sampling_params& p) {
    if (!(p.temperature >= 0) || !std::isfinite(p.temperature)) return "temperature must be >= 0";
    if (p.top_k < 0) return "top_k must be >= 0";
    if (!(p.top_p > 0 && p.top_p <= 1)) return "top_p must be in (0, 1]";
    if (!(p.min_p >= 0 && p.min_p <= 1)) return "min_p must be in [0, 1]";
    if (!(p.repeat_penalty > 0) || !std::isfinite(p.repeat_penalty)) return "repeat_penalty must be > 0";
    if (p.repeat_last_n < -1) return "repeat_last_n must be >= -1 (-1: whole context, 0: off)";
    return "";
}

int32_t penalty_window(const g4_sampling_params& p, int32_t n_history) {
    if (p.repeat_penalty == 1.0f || p.repeat_last_n == 0) return 0;
    return p.repeat_last_n < 0 ? n_history : std::min(n_history, p.repeat_last_n);
}

int32_t sample_token(const float* logits, int32_t vocab, const g4_sampling_params& p, const int32_t* history,
                     int32_t n_history, float* buf, int32_t* idx, std::mt19937_64& rng) {
    std::memcpy(buf, logits, sizeof(float) * vocab);
    for (int32_t i = n_history - penalty_window(p, n_history); i < n_history; ++i) {
        int32_t t = history[i];
        if (t < 0 || t >= vocab) continue;
        // Penalise each distinct token once: recompute from the original logit.
        float l = logits[t];
        buf[t]  = l < 0 ? l * p.repeat_penalty : l / p.repeat_penalty;
    }
    if (p.temperature == 0.0f) {
        int32_t best = 0;
        for (int32_t i = 1; i < vocab; ++i)
            if (buf[i] > buf[best]) best = i;
        return best;
    }
    for (int32_t i = 0; i < vocab; ++i) buf[i] /= p.temperature;
    for (int32_t i = 0; i < vocab; ++i) idx[i] = i;
    int32_t n   = vocab;
    auto by_logit = [&](int32_t a, int32_t b) { return buf[a] > buf[b] || (buf[a] == buf[b] && a < b); };
    if (p.top_k > 0 && p.top_k < n) {
        std::partial_sort(idx, idx + p.top_k, idx + n, by_logit);
        n = p.top_k;
    } else if (p.top_p < 1.0f || p.min_p > 0.0f) {
        std::sort(idx, idx + n, by_logit);
    }
    return draw(n, [&](int32_t i) { return buf[idx[i]]; }, [&](int32_t i) { return idx[i]; }, p, rng);
}

int32_t sample_sorted(const float* values, const int32_t* tokens, int32_t n, const g4_sampling_params& p, std::mt19937_64& rng) {
    return draw(n, [&](int32_t i) { return values[i]; }, [&](int32_t i) { return tokens[i]; }, p, rng);
}

} // namespace g4::rt
