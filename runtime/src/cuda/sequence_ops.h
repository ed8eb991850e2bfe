// Host launch code of the CUDA kernels of the ops over frame sequences (kernels/cuda/sequence_ops.cu):
// Conv2dNormRelu, Silu, SigmoidMul, CausalConv1d, LocalAttention, SoftplusScale, AddScaled. The argument
// structs are kernels/ops.h's, with device addresses in their pointers.
#pragma once
#include "kernels/ops.h"
#include "runtime/src/cuda/driver.h"
#include "runtime/src/engine.h"

#include <string>

namespace g4::cuda_rt {

struct SequenceKernels {
    cu::CUfunction conv2d_norm_relu = nullptr, silu = nullptr, sigmoid_mul = nullptr, causal_conv1d = nullptr,
                   local_attention = nullptr, softplus_scale = nullptr, add_scaled = nullptr;
};

// Looks the kernels up in a plan's module. Returns "" or the name of the kernel the module lacks.
std::string load_sequence_kernels(const cu::Driver& d, cu::CUmodule m, SequenceKernels* k);

// Each launches one op on stream s and returns the launch's status (0 = success). Rows of 0 launch nothing.
cu::CUresult launch_conv2d_norm_relu(const cu::Driver& d, const SequenceKernels& k, cu::CUstream s,
                                     const Conv2dArgs& a);
cu::CUresult launch_silu(const cu::Driver& d, const SequenceKernels& k, cu::CUstream s, const UnaryArgs& a);
cu::CUresult launch_sigmoid_mul(const cu::Driver& d, const SequenceKernels& k, cu::CUstream s,
                                const BinaryArgs& a);
cu::CUresult launch_causal_conv1d(const cu::Driver& d, const SequenceKernels& k, cu::CUstream s,
                                  const CausalConv1dArgs& a);
cu::CUresult launch_local_attention(const cu::Driver& d, const SequenceKernels& k, cu::CUstream s,
                                    const LocalAttentionArgs& a);
cu::CUresult launch_softplus_scale(const cu::Driver& d, const SequenceKernels& k, cu::CUstream s,
                                   const DimScaleArgs& a);
cu::CUresult launch_add_scaled(const cu::Driver& d, const SequenceKernels& k, cu::CUstream s,
                               const AddScaledArgs& a);

// Launches b's op (an op of an encoder program bound to device addresses) over n rows; counts are the
// program's row counts. Returns false, launching nothing, when the op is not one of these; *r is the launch's
// status otherwise.
bool launch_sequence_op(const cu::Driver& d, const SequenceKernels& k, cu::CUstream s, const rt::BoundOp& b,
                        int32_t n, const int32_t* counts, cu::CUresult* r);

} // namespace g4::cuda_rt
