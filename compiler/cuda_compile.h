// Ahead-of-time compilation of g4's CUDA kernels (kernels/cuda/*.cu) with NVRTC for one
// target architecture: a cubin for that exact architecture and PTX for newer ones. Runs at
// `g4 compile --device cuda` time, needs no GPU; the runtime loads the result and compiles nothing.
#pragma once
#include <string>
#include <vector>

namespace g4::cuda {

struct KernelBinary {
    std::string target; // "sm_90"
    std::vector<char> cubin;
    std::string ptx;
    std::string log;     // NVRTC log (warnings; empty when the kernels came from the cache)
    bool cached = false; // every part came from the kernel cache
};

bool nvrtc_available(); // false when g4 was built without the CUDA toolkit
// The model's constants the kernels are specialised for (0 = not specialised: the generic kernel).
// attn_hpg: query heads per KV head of every decode attention layer (a power of two <= 16), compiled in
// as G4_AD_HPG; recorded in the plan's META (cuda.attn_hpg) so the runtime can check its layers match.
// trace: the timeline lab's kernels (g4 compile --kernel-trace): 0 none, 1 the first and last block of each
// decode launch record timers (G4_TRACE), 2 every block does (G4_TRACE_ALL); recorded as cuda.kernel_trace.
struct KernelSpec {
    int attn_hpg = 0;
    int trace    = 0;
};
// The KernelSpec for a model whose attention layers have these heads per KV group: one value that is a
// power of two <= 16, else not specialised.
KernelSpec kernel_spec(const std::vector<int>& heads_per_group);

// Targets g4 supports: sm_80, sm_86, sm_89, sm_90. Throws g4::CompileError on a bad target or a
// compile failure (with NVRTC's log). with_ptx = false leaves ptx empty (tests that load the cubin).
// One NVRTC run gives both outputs (NVVM's optimizer on 8 threads). Kernel cache: each output is kept in a
// folder (G4_KERNEL_CACHE; default $XDG_CACHE_HOME/g4/kernels or ~/.cache/g4/kernels; G4_KERNEL_CACHE=off:
// none) under a key of NVRTC's version, the options and the kernel source, and reused when all of them match
// (checked in full, with a checksum), so compiling plans again for the same target and model shape skips
// NVRTC. Processes that compile the same kernels at once wait on a lock file beside the entry and run NVRTC
// once. A cache that cannot be written is skipped; it keeps the 32 most recently used outputs.
// Thread-safe.
KernelBinary compile_kernels(const std::string& target, const KernelSpec& spec = {}, bool with_ptx = true);
const std::vector<std::string>& supported_targets();
// The kernel cache's folder from the environment ("" = no cache); the folder is made on first use.
std::string kernel_cache_dir();

} // namespace g4::cuda
