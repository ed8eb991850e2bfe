// The LM head a CPU plan can screen (runtime/src/cpu_lm_screen.h), found the same way by the compiler (the
// screening copy's bytes in the plan's CPU memory) and the runtime (which builds it): the bf16 Matmul writing
// the logits tensor of the text program (RowMode::OutRows), every op after it a Softcap of the logits in
// place.
#pragma once
#include "runtime/plan/op_params.h"

#include <cstddef>
#include <cstdint>

namespace g4::rt {

struct CpuLmHead {
    size_t op     = 0;
    float softcap = 0; // 0: none
    int64_t n = 0, k = 0;
    // The int8 copy, the per-row scale, bound, norm (floats) and sum (int32) of lm_screen.cpp.
    uint64_t copy_bytes() const { return ((uint64_t)n * k + 63) / 64 * 64 + (uint64_t)n * 16; }
};

// ops [0, n_ops) of the text program; false: no head the CPU screens.
inline bool find_cpu_lm_head(const plan::PlanOp* ops, size_t n_ops, const plan::PlanTensor* tensors,
                             int32_t logits, CpuLmHead* out) {
    size_t head = n_ops;
    for (size_t i = 0; i < n_ops; ++i)
        if (ops[i].code == (uint16_t)OpCode::Matmul && ops[i].out[0] == logits) head = i;
    if (head == n_ops) return false;
    CpuLmHead h;
    h.op = head;
    for (size_t i = head + 1; i < n_ops; ++i) {
        const plan::PlanOp& op = ops[i];
        if (op.code != (uint16_t)OpCode::Softcap || op.in[0] != logits || op.out[0] != logits ||
            h.softcap > 0)
            return false;
        h.softcap = plan::params<plan::SoftcapParams>(op).cap;
    }
    const plan::PlanOp& op    = ops[head];
    const plan::PlanTensor& w = tensors[op.in[1]];
    if (w.dtype != (uint8_t)DType::BF16 || op.row_mode != (int32_t)plan::RowMode::OutRows ||
        w.dims[1] > 65536)
        return false;
    h.n = w.dims[0], h.k = w.dims[1];
    *out = h;
    return true;
}

} // namespace g4::rt
