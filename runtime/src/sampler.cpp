// Sampler implementation (see sampler.h).
#include "runtime/src/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace g4::rt {

namespace {

// The softmax's maximum and denominator over values 0..n-1, summed in that order; prob(v) is a value's
// probability, the one expression behind every cut and the draw.
struct Norm {
    float mx;
    double sum;
    double prob(float v) const { return std::exp((double)v - mx) / sum; }
};
template <class Value> Norm normalizer(int32_t n, Value value) {
    Norm z{-INFINITY, 0.0};
    for (int32_t i = 0; i < n; ++i)
        z.mx = std::max(z.mx, value(i));
    for (int32_t i = 0; i < n; ++i)
        z.sum += std::exp((double)value(i) - z.mx);
    return z;
}

// Softmax over candidates 0..n-1 (sorted by value, descending, ties to the lower token, when top-k,
// top-p or min-p apply), then top-p, min-p and the draw. value(i): the candidate's logit after the
// penalty and temperature; token(i): its id. z: the softmax's normalizer; by default over the n
// candidates (after top-k), given when the candidates are a prefix of a longer row.
template <class Value, class Token>
int32_t draw(int32_t n, Value value, Token token, const g4_sampling_params& p, std::mt19937_64& rng,
             const Norm* z = nullptr) {
    const Norm zn = z ? *z : normalizer(n, value);
    auto prob     = [&](int32_t i) { return zn.prob(value(i)); };
    double total  = -1; // the mass of candidates 0..n-1 once known: top-p's sum is that very sum
    if (p.top_p < 1.0f) {
        double cum   = 0;
        int32_t keep = n;
        for (int32_t i = 0; i < n; ++i) {
            cum += prob(i);
            if (cum >= p.top_p) {
                keep = i + 1;
                break;
            }
        }
        if (keep >= 1) total = cum;
        n = std::max<int32_t>(1, keep);
    }
    if (p.min_p > 0.0f) {
        double top   = prob(0);
        int32_t keep = 1;
        while (keep < n && prob(keep) >= p.min_p * top)
            ++keep;
        if (keep != n) total = -1;
        n = keep;
    }
    if (total < 0) {
        total = 0;
        for (int32_t i = 0; i < n; ++i)
            total += prob(i);
    }
    double r = std::uniform_real_distribution<double>(0.0, total)(rng);
    for (int32_t i = 0; i < n; ++i) {
        r -= prob(i);
        if (r <= 0) return token(i);
    }
    return token(n - 1);
}

// Ranges longer than this are sorted by radix passes (radix_sort_by_logit), shorter ones by std::sort.
constexpr int32_t kRadixMin = 16384;

} // namespace

// Stable least-significant-digit radix passes: over the ids' bits, then over an order key of their
// values, so equal values keep ascending ids. -0.0 and 0.0 get one key, as the comparison sees them.
void radix_sort_by_logit(int32_t* first, int32_t n, const float* buf, int32_t* tmp, int32_t vocab) {
    constexpr int kBits = 11, kBuckets = 1 << kBits;
    uint32_t count[kBuckets];
    int32_t *src = first, *dst = tmp;
    auto pass = [&](auto digit) {
        std::memset(count, 0, sizeof count);
        for (int32_t i = 0; i < n; ++i)
            ++count[digit(src[i])];
        uint32_t sum = 0;
        for (uint32_t& c : count) {
            const uint32_t t = c;
            c                = sum, sum += t;
        }
        for (int32_t i = 0; i < n; ++i)
            dst[count[digit(src[i])]++] = src[i];
        std::swap(src, dst);
    };
    int id_bits = 1;
    while (id_bits < 31 && (int64_t(1) << id_bits) < vocab)
        ++id_bits;
    for (int shift = 0; shift < id_bits; shift += kBits)
        pass([shift](int32_t t) { return ((uint32_t)t >> shift) & (kBuckets - 1); });
    auto key = [buf](int32_t t) { // descending value order as an ascending unsigned key
        uint32_t u;
        std::memcpy(&u, &buf[t], 4);
        if (u == 0x80000000u) u = 0; // -0.0 == 0.0
        const uint32_t asc = u & 0x80000000u ? ~u : u | 0x80000000u;
        return ~asc;
    };
    for (int shift = 0; shift < 32; shift += kBits)
        pass([&key, shift](int32_t t) { return (key(t) >> shift) & (kBuckets - 1); });
    if (src != first) std::memcpy(first, src, sizeof(int32_t) * n);
}

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
                     int32_t n_history, float* buf, int32_t* idx, int32_t* tmp, std::mt19937_64& rng) {
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
    for (int32_t i = 0; i < vocab; ++i)
        buf[i] /= p.temperature;
    for (int32_t i = 0; i < vocab; ++i)
        idx[i] = i;
    int32_t n     = vocab;
    auto by_logit = [&](int32_t a, int32_t b) { return buf[a] > buf[b] || (buf[a] == buf[b] && a < b); };
    auto value    = [&](int32_t i) { return buf[idx[i]]; };
    auto token    = [&](int32_t i) { return idx[i]; };
    if (p.top_k > 0 && p.top_k < n) {
        std::partial_sort(idx, idx + p.top_k, idx + n, by_logit);
        return draw(p.top_k, value, token, p, rng);
    }
    if (p.top_p >= 1.0f && p.min_p <= 0.0f) return draw(n, value, token, p, rng);
    // Top-p and/or min-p over the whole row. What they keep is a prefix of the row sorted by value,
    // found without sorting the row: the softmax's normalizer over the row in token order; min-p keeps
    // the tokens whose probability reaches min_p times the top one's (moved to the front); top-p selects
    // and sorts the next best 1024 tokens, then 8x more each time, until the sorted prefix's mass
    // reaches top_p; once a step would sort more than kRadixMin tokens, or the best 1024 hold less than a
    // quarter of top_p, it sorts all the rest with radix passes instead (a nucleus of most of the row: a
    // few passes over it, not a comparison sort).
    // draw() then sees the prefix with the row's normalizer and cuts it exactly where a whole-row sort
    // would have.
    const Norm z = normalizer(n, value);
    if (p.min_p > 0.0f) {
        const double floor = p.min_p * (1.0 / z.sum); // min_p * prob(top), prob(top) = exp(0) / sum
        n = (int32_t)(std::partition(idx, idx + n, [&](int32_t t) { return z.prob(buf[t]) >= floor; }) - idx);
    }
    int32_t keep = n;
    if (p.top_p < 1.0f) {
        // idx[0, done) is sorted and holds the done best tokens; their mass is cum.
        int32_t done = 0;
        double cum   = 0;
        for (int32_t k = std::min(n, 1024);; k = k >= n / 8 ? n : k * 8) {
            if (k - done > kRadixMin || (done > 0 && cum < p.top_p / 4)) { // a long nucleus ahead
                radix_sort_by_logit(idx + done, n - done, buf, tmp, vocab);
                k = n;
            } else {
                if (k < n) std::nth_element(idx + done, idx + k, idx + n, by_logit);
                std::sort(idx + done, idx + k, by_logit);
            }
            while (done < k && cum < p.top_p)
                cum += z.prob(buf[idx[done++]]);
            if (cum >= p.top_p || k == n) {
                keep = done;
                break;
            }
        }
    } else if (n > kRadixMin) {
        radix_sort_by_logit(idx, n, buf, tmp, vocab);
    } else {
        std::sort(idx, idx + n, by_logit);
    }
    return draw(std::max<int32_t>(1, keep), value, token, p, rng, &z);
}

int32_t sample_sorted(const float* values, const int32_t* tokens, int32_t n, const g4_sampling_params& p,
                      std::mt19937_64& rng) {
    return draw(
        n, [&](int32_t i) { return values[i]; }, [&](int32_t i) { return tokens[i]; }, p, rng);
}

int32_t sample_prefix(const float* values, const int32_t* tokens, int32_t n, int32_t vocab, float mx,
                      double sum, const g4_sampling_params& p, std::mt19937_64& rng) {
    if (p.temperature == 0.0f || (p.top_k > 0 && p.top_k < vocab) || (p.top_p >= 1.0f && p.min_p <= 0.0f) ||
        n < 1 || !(sum > 0) || values[0] != mx)
        return -1;
    const Norm z{mx, sum};
    bool covered = n >= vocab;
    if (!covered && p.top_p < 1.0f) { // the nucleus ends within the n tokens
        double cum = 0;
        for (int32_t i = 0; i < n && !covered; ++i)
            covered = (cum += z.prob(values[i])) >= p.top_p;
    }
    if (!covered && p.min_p > 0.0f)
        covered = z.prob(values[n - 1]) < p.min_p * z.prob(values[0]); // min-p ends within them
    if (!covered) return -1;
    return draw(
        n, [&](int32_t i) { return values[i]; }, [&](int32_t i) { return tokens[i]; }, p, rng, &z);
}

} // namespace g4::rt
