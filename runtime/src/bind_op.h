// One op's operands bound to addresses (engine.h BoundOp), shared by the CPU executor
// (runtime/src/executor.cpp) and the CUDA encoder-program runner (runtime/src/cuda/encoder_launch.cpp), which
// differ only in where a tensor lives.
#pragma once
#include "runtime/src/engine.h"

#include <cstdint>
#include <cstring>

namespace g4::rt {

// Binds op's views: base(t) gives row 0, column 0 of tensor t in this binding (null: not addressable here,
// the view stays null); the view's column offset is applied in the tensor's dtype; the leading dimension is
// a 2-D tensor's columns (else 0); each input's dtype is recorded.
template <class Base> BoundOp bind_op(const plan::Plan& p, const plan::PlanOp& op, Base&& base) {
    BoundOp b;
    std::memset(&b, 0, sizeof b);
    b.op      = &op;
    auto view = [&](int32_t idx, int32_t col, int64_t* ld) -> void* {
        if (idx < 0) return nullptr;
        const plan::PlanTensor& t = p.tensor(idx);
        *ld                       = t.ndim == 2 ? t.dims[1] : 0;
        uint8_t* at               = (uint8_t*)base(t);
        return at ? at + dtype_bytes((DType)t.dtype, col) : nullptr;
    };
    for (int k = 0; k < 4; ++k) {
        b.in[k] = view(op.in[k], op.in_col[k], &b.in_ld[k]);
        if (op.in[k] >= 0) b.in_dt[k] = (DType)p.tensor(op.in[k]).dtype;
    }
    for (int k = 0; k < 2; ++k)
        b.out[k] = view(op.out[k], op.out_col[k], &b.out_ld[k]);
    return b;
}

} // namespace g4::rt
