// Ahead-of-time compilation of g4's CUDA kernels (kernels/cuda/kernels.cu) with NVRTC for one
// target architecture: a cubin for that exact architecture and PTX for newer ones. Runs at
// `g4 compile --device cuda` time, needs no GPU; the runtime loads the result and compiles nothing.
#pragma once
#include <string>
#include <vector>

namespace g4::cuda {

struct KernelBinary {
    std::string target;            // "sm_90"
    std::vector<char> cubin;
    std::string ptx;
    std::string log;               // NVRTC log (warnings)
};

bool nvrtc_available();            // false when g4 was built without the CUDA toolkit
// Targets g4 supports: sm_80, sm_86, sm_89, sm_90. Throws g4::CompileError on a bad target or a
// compile failure (with NVRTC's log).
KernelBinary compile_kernels(const std::string& target);
const std::vector<std::string>& supported_targets();

} // namespace g4::cuda
