// Batched decode steps: one token for each of several sessions of one engine run as one step of the text
// program, its rows the sessions' tokens. Ops that read the step's position or a session's KV cache
// (plan::OpTable<P>::per_sequence: rope, KV store, attention) run once per session on its row, bound to its
// cache and position; every other op runs once over all the rows, so a weight is read once a step.
#pragma once
#include "runtime/src/engine.h"

#include <string>

namespace g4::rt {

// True for the op codes a batched step runs once per session.
bool op_per_sequence(uint16_t code);

// The most sessions one batched step takes on this engine's plan: the rows of logits a step produces, or 1
// where its backend has no batched steps.
int32_t batch_limit(const g4_engine* e);

// The CPU executor's batched step (SessionBackend::run_batch of CPU plans): the first session of each
// group's arenas hold the step's activations, each session's KV arena its cache. Groups are of at most the
// NF4 GEMV's row limit. Leaves each session's logits row in its last_logits; positions and histories are
// unchanged.
g4_status run_batch_cpu(g4_session* const* sessions, const int32_t* tokens, int32_t n, std::string* err);

} // namespace g4::rt
