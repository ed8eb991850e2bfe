// Validation of the ops over frame sequences (kernels/ops.h Conv2dNormRelu .. AddScaled) in an encoder
// program: operands, views, row capacities, parameters and the per-thread scratch their CPU kernels take, as
// runtime/src/sequence_exec.cpp and runtime/src/cuda/sequence_ops.cpp read them.
#pragma once
#include "runtime/plan/plan_reader.h"

#include <cstdint>
#include <string>

namespace g4::plan {

// Whether op's code is one of these ops.
bool is_sequence_op(uint16_t code);
// "" or what is wrong with op. rows: the row count it runs over at most; max_rows: the program's bounds of
// each row count (kMaxRowCounts of them); thread_floats: the program's per-thread CPU scratch.
std::string check_sequence_op(const Plan& p, const PlanOp& op, int64_t rows, const int32_t* max_rows,
                              uint64_t thread_floats);

} // namespace g4::plan
