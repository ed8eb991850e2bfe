// Generic CPU replay of plan ops for the executor (runtime/src/executor.cpp): an op's bound operands become
// its definition's argument struct (runtime/plan/op_params.h OpTable<P>::args), run by its CPU kernel
// (kernels/cpu/cpu.h OpKernel), so an op with both needs no case of its own here or in the executor.
#pragma once
#include "kernels/cpu/cpu.h"
#include "runtime/src/engine.h"

namespace g4::rt {

// An op's operands for one run: row 0 of each view (the run's first row applied to activations and inputs),
// its leading dimension, dtype and tensor record; the rows the op runs over, the step's first position (text
// program) and the run's row counts (encoder programs).
struct OpIo {
    void* in[4]{};
    int64_t in_ld[4]{};
    DType in_dt[4]{};
    const plan::PlanTensor* in_t[4]{};
    void* out[2]{};
    int64_t out_ld[2]{};
    DType out_dt[2]{};
    int32_t rows = 0, pos0 = 0;
    const int32_t* counts = nullptr;

    const float* x(int k) const { return (const float*)in[k]; }
    float* xm(int k) const { return (float*)in[k]; } // an input updated in place
    float* y(int k) const { return (float*)out[k]; }
};

// b's operands for a run over n rows whose activation and input views start at row row0.
OpIo op_io(const plan::Plan& p, const BoundOp& b, int32_t n, int64_t row0, int32_t pos0,
           const int32_t* counts);

// Runs op with its CPU kernel on io. Returns false, running nothing, for an op without a generic replay.
bool run_op(const plan::PlanOp& op, const cpu::Context& ctx, const OpIo& io);

} // namespace g4::rt
