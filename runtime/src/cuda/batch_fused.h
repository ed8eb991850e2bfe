// The batched decode step's launches of decode-schedule records over several rows (batch_fused.cpp; the
// kernels in kernels/cuda/decode_rows.cu): each returns *done false where it has no such launch (an older
// plan's module, a shape or layout it does not take) and the caller runs the record's ops one by one.
#pragma once
#include "runtime/src/cuda/launch.h"
#include "runtime/src/cuda/state.h"

#include <string>
#include <vector>

namespace g4::cuda_rt {

// Looks up the kernels above in the plan's module (null where it lacks them).
g4_status bind_batch_fused_kernels(const ModuleKernels& m, Kernels& k, std::string* err);

// A Gemv record (q/k/v, a gate/up pair with its GeluMul, a matmul with its GeluMul or softcap) over the n
// rows of the step in st's activation arena: each weight read once for all rows.
g4_status launch_gemv_rows(SessionState* st, const plan::Plan& p, const plan::CudaLaunch& l, int32_t n,
                           bool* done, std::string* label, std::string* err);
// A GatedProj record (a matmul, GeluMul by a multiplier, a matmul) as two GEMVs of n rows.
g4_status launch_gated_proj_rows(SessionState* st, const plan::Plan& p, const plan::CudaLaunch& l, int32_t n,
                                 bool* done, std::string* label, std::string* err);
// A ResNorm record (residual add and norms) over the n rows, one block a row.
g4_status launch_resnorm_rows(SessionState* st, const plan::Plan& p, const plan::CudaLaunch& l, int32_t n,
                              bool* done, std::string* err);
// Sets st->sum_epi where the K splits' sum of matmul op i on the tensor-core row matmuls can run the ops
// after it in a batched step: the ResNorm record `next` (the record after i's, or null) whose d is i's
// output, i being its record's last op; else the per-head RmsNorm in place on i's output, its first reader,
// and the Rope in place after that, its next one, where op_by_op marks both as run one by one (*ran0, *ran1:
// those ops, SIZE_MAX where none). False: it cannot (sum_epi cleared).
bool sum_epilogue(SessionState* st, const plan::Plan& p, size_t i, const plan::CudaLaunch* next,
                  const std::vector<uint8_t>& op_by_op, size_t* ran0, size_t* ran1);
// Whether Mlp record l begins with a gate and an up matmul of the same input and the GeluMul of their
// outputs, which no later op of the record reads.
bool mlp_gate_up(const plan::Plan& p, const plan::CudaLaunch& l);
// Whether GatedProj record l is a matmul, the GeluMul of its output by another tensor, and a matmul of that
// (from column 0), the first matmul's output read by the GeluMul only.
bool gated_proj_gate(const plan::Plan& p, const plan::CudaLaunch& l);
// The gate, up and GeluMul ops of an Mlp record (its first three) as one gate/up GEMV of n rows; the caller
// runs the record's other ops.
g4_status launch_mlp_gate_up_rows(SessionState* st, const plan::Plan& p, const plan::CudaLaunch& l, int32_t n,
                                  bool* done, std::string* label, std::string* err);

} // namespace g4::cuda_rt
