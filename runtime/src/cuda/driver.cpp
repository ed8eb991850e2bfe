// dlopen-based CUDA driver loader (see driver.h).
#include "runtime/src/cuda/driver.h"

#include <dlfcn.h>
#include <mutex>

namespace g4::cu {

namespace {
Driver g_driver;
const Driver* g_loaded = nullptr;
std::string g_why;
std::once_flag g_once;

template <class F> bool sym(void* lib, const char* name, F* out) {
    *out = reinterpret_cast<F>(dlsym(lib, name));
    return *out != nullptr;
}

void load() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        g_why = "no NVIDIA driver found (libcuda.so.1 could not be loaded)";
        return;
    }
    Driver& d = g_driver;
    bool ok = sym(lib, "cuInit", &d.cuInit) && sym(lib, "cuDeviceGetCount", &d.cuDeviceGetCount) &&
              sym(lib, "cuDeviceGet", &d.cuDeviceGet) && sym(lib, "cuDeviceGetAttribute", &d.cuDeviceGetAttribute) &&
              sym(lib, "cuDeviceGetName", &d.cuDeviceGetName) && sym(lib, "cuDevicePrimaryCtxRetain", &d.cuDevicePrimaryCtxRetain) &&
              sym(lib, "cuDevicePrimaryCtxRelease_v2", &d.cuDevicePrimaryCtxRelease) && sym(lib, "cuCtxSetCurrent", &d.cuCtxSetCurrent) &&
              sym(lib, "cuMemGetInfo_v2", &d.cuMemGetInfo) && sym(lib, "cuMemAlloc_v2", &d.cuMemAlloc) &&
              sym(lib, "cuMemFree_v2", &d.cuMemFree) && sym(lib, "cuMemAllocHost_v2", &d.cuMemAllocHost) &&
              sym(lib, "cuMemFreeHost", &d.cuMemFreeHost) && sym(lib, "cuMemHostAlloc", &d.cuMemHostAlloc) &&
              sym(lib, "cuMemHostGetDevicePointer_v2", &d.cuMemHostGetDevicePointer) && sym(lib, "cuMemcpyHtoD_v2", &d.cuMemcpyHtoD) &&
              sym(lib, "cuMemcpyHtoDAsync_v2", &d.cuMemcpyHtoDAsync) && sym(lib, "cuMemcpyDtoHAsync_v2", &d.cuMemcpyDtoHAsync) &&
              sym(lib, "cuMemsetD8_v2", &d.cuMemsetD8) && sym(lib, "cuModuleLoadData", &d.cuModuleLoadData) &&
              sym(lib, "cuModuleUnload", &d.cuModuleUnload) && sym(lib, "cuModuleGetFunction", &d.cuModuleGetFunction) &&
              sym(lib, "cuLaunchKernel", &d.cuLaunchKernel) && sym(lib, "cuStreamCreate", &d.cuStreamCreate) &&
              sym(lib, "cuStreamDestroy_v2", &d.cuStreamDestroy) && sym(lib, "cuStreamSynchronize", &d.cuStreamSynchronize) &&
              sym(lib, "cuStreamBeginCapture_v2", &d.cuStreamBeginCapture) && sym(lib, "cuStreamEndCapture", &d.cuStreamEndCapture) &&
              sym(lib, "cuGraphInstantiateWithFlags", &d.cuGraphInstantiateWithFlags) && sym(lib, "cuGraphLaunch", &d.cuGraphLaunch) &&
              sym(lib, "cuGraphExecDestroy", &d.cuGraphExecDestroy) && sym(lib, "cuGraphDestroy", &d.cuGraphDestroy) &&
              sym(lib, "cuGetErrorName", &d.cuGetErrorName);
    if (!ok) {
        g_why = "the NVIDIA driver (libcuda.so.1) is too old: a required entry point is missing";
        return;
    }
    CUresult r = d.cuInit(0);
    if (r != 0) {
        g_why = "the NVIDIA driver failed to initialise (cuInit: " + error_name(r) + ")";
        return;
    }
    g_loaded = &g_driver;
}
} // namespace

const Driver* driver(std::string* why) {
    std::call_once(g_once, load);
    if (!g_loaded && why) *why = g_why;
    return g_loaded;
}

std::string error_name(CUresult r) {
    const char* s = nullptr;
    if (g_driver.cuGetErrorName && g_driver.cuGetErrorName(r, &s) == 0 && s) return s;
    return "CUDA error " + std::to_string(r);
}

} // namespace g4::cu
