// CPU executor: binds the plan's ops to a session's arenas and replays them one step at a time.
#pragma once
#include "runtime/src/engine.h"

namespace g4::rt {

// Resolves every op's tensors to addresses in `s` (called once, at session creation).
void bind_ops(g4_session* s);
// Runs the program for `rows` tokens (already in s->ids) at positions pos0.., producing logits for
// the last `out_rows` of them. Checks the cancel flag between ops.
g4_status run_step(g4_session* s, int32_t rows, int32_t pos0, int32_t out_rows, std::string* err);

} // namespace g4::rt
