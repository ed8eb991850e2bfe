// Token sampling over a logits row: repetition penalty, temperature, top-k, top-p, min-p, then a
// draw from the session's RNG (HF's warper order). Works in caller-provided buffers: no allocation.
#pragma once
#include "g4/g4.h"

#include <cstdint>
#include <random>
#include <string>

namespace g4::rt {

// Returns an empty string if |p| is valid, else what is wrong.
std::string check_sampling(const g4_sampling_params& p);

// How many of the last n_history fed tokens the repetition penalty applies to (0: penalty off).
int32_t penalty_window(const g4_sampling_params& p, int32_t n_history);

// logits: [vocab] (not modified). buf: [vocab] floats, idx and tmp: [vocab] ints of scratch.
// history: the last n_history fed tokens (for the repetition penalty).
int32_t sample_token(const float* logits, int32_t vocab, const g4_sampling_params& p, const int32_t* history,
                     int32_t n_history, float* buf, int32_t* idx, int32_t* tmp, std::mt19937_64& rng);

// Sorts token ids first[0, n) by buf[id] descending, ties to the lower id (sample_token's order), in
// a few passes over them rather than by comparisons. Ids are in [0, vocab); tmp: [n] ints of scratch.
void radix_sort_by_logit(int32_t* first, int32_t n, const float* buf, int32_t* tmp, int32_t vocab);

// The same draw from candidates already penalised, divided by the temperature and cut to top-k:
// values [n] sorted descending with ties to the lower token, tokens [n] (the GPU top-k path, which
// gives exactly the candidates and order sample_token's partial sort does).
int32_t sample_sorted(const float* values, const int32_t* tokens, int32_t n, const g4_sampling_params& p,
                      std::mt19937_64& rng);

// What sample_token draws when top-k is off and top-p and/or min-p apply, from the row's best n tokens
// (values [n] penalised, divided by the temperature, sorted descending with ties to the lower token;
// tokens [n]) and the whole row's softmax normalizer (its maximum mx and the sum of exp(v - mx)): the
// GPU path, which sends only those across. Returns -1 with rng untouched when the cut may reach past
// the n tokens (their mass is below top_p and the n-th still passes min-p) or these settings are not
// that case; the caller then samples the whole row.
int32_t sample_prefix(const float* values, const int32_t* tokens, int32_t n, int32_t vocab, float mx,
                      double sum, const g4_sampling_params& p, std::mt19937_64& rng);

} // namespace g4::rt
