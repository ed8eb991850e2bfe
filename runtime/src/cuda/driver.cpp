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

void load() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        g_why = "no NVIDIA driver found (libcuda.so.1 could not be loaded)";
        return;
    }
    Driver& d = g_driver;
    bool ok =
        dl_symbol(lib, "cuInit", &d.cuInit) && dl_symbol(lib, "cuDeviceGetCount", &d.cuDeviceGetCount) &&
        dl_symbol(lib, "cuDeviceGet", &d.cuDeviceGet) &&
        dl_symbol(lib, "cuDeviceGetAttribute", &d.cuDeviceGetAttribute) &&
        dl_symbol(lib, "cuDeviceGetName", &d.cuDeviceGetName) &&
        dl_symbol(lib, "cuDevicePrimaryCtxRetain", &d.cuDevicePrimaryCtxRetain) &&
        dl_symbol(lib, "cuDevicePrimaryCtxRelease_v2", &d.cuDevicePrimaryCtxRelease) &&
        dl_symbol(lib, "cuCtxSetCurrent", &d.cuCtxSetCurrent) &&
        dl_symbol(lib, "cuMemGetInfo_v2", &d.cuMemGetInfo) &&
        dl_symbol(lib, "cuMemAlloc_v2", &d.cuMemAlloc) && dl_symbol(lib, "cuMemFree_v2", &d.cuMemFree) &&
        dl_symbol(lib, "cuMemAllocHost_v2", &d.cuMemAllocHost) &&
        dl_symbol(lib, "cuMemFreeHost", &d.cuMemFreeHost) &&
        dl_symbol(lib, "cuMemHostAlloc", &d.cuMemHostAlloc) &&
        dl_symbol(lib, "cuMemHostGetDevicePointer_v2", &d.cuMemHostGetDevicePointer) &&
        dl_symbol(lib, "cuMemcpyHtoD_v2", &d.cuMemcpyHtoD) &&
        dl_symbol(lib, "cuMemcpyHtoDAsync_v2", &d.cuMemcpyHtoDAsync) &&
        dl_symbol(lib, "cuMemcpyDtoHAsync_v2", &d.cuMemcpyDtoHAsync) &&
        dl_symbol(lib, "cuMemsetD8_v2", &d.cuMemsetD8) &&
        dl_symbol(lib, "cuModuleLoadData", &d.cuModuleLoadData) &&
        dl_symbol(lib, "cuModuleUnload", &d.cuModuleUnload) &&
        dl_symbol(lib, "cuModuleGetFunction", &d.cuModuleGetFunction) &&
        dl_symbol(lib, "cuFuncSetAttribute", &d.cuFuncSetAttribute) &&
        dl_symbol(lib, "cuLaunchKernel", &d.cuLaunchKernel) &&
        dl_symbol(lib, "cuStreamCreate", &d.cuStreamCreate) &&
        dl_symbol(lib, "cuStreamDestroy_v2", &d.cuStreamDestroy) &&
        dl_symbol(lib, "cuStreamSynchronize", &d.cuStreamSynchronize) &&
        dl_symbol(lib, "cuStreamBeginCapture_v2", &d.cuStreamBeginCapture) &&
        dl_symbol(lib, "cuStreamEndCapture", &d.cuStreamEndCapture) &&
        dl_symbol(lib, "cuGraphInstantiateWithFlags", &d.cuGraphInstantiateWithFlags) &&
        dl_symbol(lib, "cuGraphLaunch", &d.cuGraphLaunch) &&
        dl_symbol(lib, "cuGraphExecDestroy", &d.cuGraphExecDestroy) &&
        dl_symbol(lib, "cuGraphDestroy", &d.cuGraphDestroy) &&
        dl_symbol(lib, "cuGetErrorName", &d.cuGetErrorName);
    dl_symbol(lib, "cuLaunchKernelEx", &d.cuLaunchKernelEx);
    if (!dl_symbol(lib, "cuLaunchHostFunc", &d.cuLaunchHostFunc) ||
        !dl_symbol(lib, "cuMemcpy2DAsync_v2", &d.cuMemcpy2DAsync))
        d.cuLaunchHostFunc = nullptr;
    if (!dl_symbol(lib, "cuEventRecord", &d.cuEventRecord) ||
        !dl_symbol(lib, "cuStreamWaitEvent", &d.cuStreamWaitEvent) ||
        !dl_symbol(lib, "cuDeviceCanAccessPeer", &d.cuDeviceCanAccessPeer) ||
        !dl_symbol(lib, "cuCtxEnablePeerAccess", &d.cuCtxEnablePeerAccess))
        d.cuStreamWaitEvent = nullptr;
    if (!dl_symbol(lib, "cuEventCreate", &d.cuEventCreate) ||
        !dl_symbol(lib, "cuEventDestroy_v2", &d.cuEventDestroy) ||
        !dl_symbol(lib, "cuEventRecordWithFlags", &d.cuEventRecordWithFlags) ||
        !dl_symbol(lib, "cuEventSynchronize", &d.cuEventSynchronize) ||
        (!dl_symbol(lib, "cuEventElapsedTime_v2", &d.cuEventElapsedTime) &&
         !dl_symbol(lib, "cuEventElapsedTime", &d.cuEventElapsedTime)))
        d.cuEventCreate = nullptr;
    if (!dl_symbol(lib, "cuModuleGetGlobal_v2", &d.cuModuleGetGlobal) ||
        !dl_symbol(lib, "cuMemcpyDtoH_v2", &d.cuMemcpyDtoH))
        d.cuModuleGetGlobal = nullptr;
    dl_symbol(lib, "cuMemcpyDtoDAsync_v2", &d.cuMemcpyDtoDAsync);
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

void* dl_symbol(void* lib, const char* name) {
    return dlsym(lib, name);
}

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
