// CPU dispatch of the ops over frame sequences (kernels/ops.h Conv2dNormRelu .. AddScaled) in an encoder
// program, for the executor's run_program.
#pragma once
#include "kernels/cpu/cpu.h"
#include "runtime/src/engine.h"

namespace g4::rt {

// Runs b's op over n rows (counts: the program's row counts, for ops that read rows of another count).
// Returns false, running nothing, when the op is not one of these.
bool run_sequence_op(const BoundOp& b, const cpu::Context& ctx, int32_t n, const int32_t* counts);

} // namespace g4::rt
