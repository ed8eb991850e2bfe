// NVRTC compilation of the embedded kernel source (see cuda_compile.h).
#include "compiler/cuda_compile.h"
#include "compiler/error.h"

#include <algorithm>
#include <cstdlib>

#ifdef G4_HAVE_NVRTC
#include <nvrtc.h>
#endif

namespace g4::cuda {

extern const char* const kKernelSource;   // generated from kernels/cuda/kernels.cu

KernelSpec kernel_spec(const std::vector<int>& heads_per_group) {
    KernelSpec s;
    if (heads_per_group.empty()) return s;
    const int h = heads_per_group[0];
    for (int x : heads_per_group)
        if (x != h) return s;
    if (h >= 1 && h <= 16 && (h & (h - 1)) == 0) s.attn_hpg = h;
    return s;
}

const std::vector<std::string>& supported_targets() {
    static const std::vector<std::string> t = {"sm_80", "sm_86", "sm_89", "sm_90"};
    return t;
}

#ifdef G4_HAVE_NVRTC
bool nvrtc_available() { return true; }

static std::string compile_one(const std::string& arch, const KernelSpec& spec, bool cubin, std::vector<char>* bin, std::string* log) {
    nvrtcProgram prog;
    if (nvrtcCreateProgram(&prog, kKernelSource, "g4_kernels.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS)
        throw CompileError("NVRTC: cannot create program");
    std::string a = (cubin ? "--gpu-architecture=sm_" : "--gpu-architecture=compute_") + arch.substr(3);
    // G4_KERNEL_TRACE=1: the timeline lab's kernels (kernels.cu G4_TRACE; bench/trace_lab.sh), never for
    // plans that are meant to be used.
    const char* trace = std::getenv("G4_KERNEL_TRACE");
    const std::string hpg = "-DG4_AD_HPG=" + std::to_string(spec.attn_hpg);
    std::vector<const char*> opts = {a.c_str(), "--std=c++17", "-default-device", "-lineinfo"};
    if (spec.attn_hpg > 0) opts.push_back(hpg.c_str());
    if (trace && *trace == '1') opts.push_back("-DG4_TRACE");
    nvrtcResult r = nvrtcCompileProgram(prog, (int)opts.size(), opts.data());
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string l(n, '\0');
    if (n) nvrtcGetProgramLog(prog, l.data());
    while (!l.empty() && (l.back() == '\0' || l.back() == '\n')) l.pop_back();
    if (r != NVRTC_SUCCESS) {
        nvrtcDestroyProgram(&prog);
        throw CompileError("NVRTC failed to compile the CUDA kernels for " + arch + ": " + l);
    }
    *log += l;
    std::string ptx;
    if (cubin) {
        nvrtcGetCUBINSize(prog, &n);
        bin->resize(n);
        nvrtcGetCUBIN(prog, bin->data());
    } else {
        nvrtcGetPTXSize(prog, &n);
        ptx.resize(n);
        nvrtcGetPTX(prog, ptx.data());
        while (!ptx.empty() && ptx.back() == '\0') ptx.pop_back();
    }
    nvrtcDestroyProgram(&prog);
    return ptx;
}

KernelBinary compile_kernels(const std::string& target, const KernelSpec& spec, bool with_ptx) {
    const auto& ts = supported_targets();
    if (std::find(ts.begin(), ts.end(), target) == ts.end())
        throw CompileError("unsupported --target '" + target + "': expected sm_80, sm_86, sm_89 or sm_90");
    KernelBinary kb;
    kb.target = target;
    if (spec.attn_hpg != 0 && kernel_spec({spec.attn_hpg}).attn_hpg != spec.attn_hpg)
        throw CompileError("kernel specialisation: " + std::to_string(spec.attn_hpg) + " heads per KV group is not a power of two <= 16");
    compile_one(target, spec, true, &kb.cubin, &kb.log);
    if (with_ptx) kb.ptx = compile_one(target, spec, false, nullptr, &kb.log);
    return kb;
}
#else
bool nvrtc_available() { return false; }
KernelBinary compile_kernels(const std::string& target, const KernelSpec&, bool) {
    throw CompileError("this g4 was built without the CUDA toolkit (NVRTC), so it cannot compile --device cuda plans; "
                       "install nvidia-cuda-toolkit and rebuild");
}
#endif

} // namespace g4::cuda
