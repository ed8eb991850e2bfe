// The CUDA driver API, loaded at run time with dlopen("libcuda.so.1"): g4 binaries have no link-time
// dependency on CUDA and start on machines without an NVIDIA driver; CUDA plans then fail to open
// with a clear message. Only the handful of entry points the runtime uses are declared.
#pragma once
#include <cstddef>
#include <string>

namespace g4::cu {

using CUresult    = int;
using CUdevice    = int;
using CUdeviceptr = unsigned long long;
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;
typedef struct CUgraph_st* CUgraph;
typedef struct CUgraphExec_st* CUgraphExec;
typedef struct CUevent_st* CUevent;

// cuLaunchKernelEx's configuration (cuda.h layout), used for programmatic dependent launch.
struct LaunchAttr {
    int id;
    char pad[4];
    union {
        char bytes[64];
        int value;
    } v;
};
struct LaunchConfig {
    unsigned grid[3], block[3], smem;
    CUstream stream;
    LaunchAttr* attrs;
    unsigned n_attrs;
};
constexpr int kLaunchAttrProgrammaticStreamSerialization = 6;
static_assert(sizeof(LaunchAttr) == 72 && sizeof(LaunchConfig) == 56, "cuda.h launch structs");

// cuMemcpy2DAsync's description (cuda.h CUDA_MEMCPY2D); memory types 1 host, 2 device.
struct Memcpy2D {
    size_t src_x_bytes, src_y;
    int src_type;
    const void* src_host;
    unsigned long long src_device;
    void* src_array;
    size_t src_pitch;
    size_t dst_x_bytes, dst_y;
    int dst_type;
    void* dst_host;
    unsigned long long dst_device;
    void* dst_array;
    size_t dst_pitch;
    size_t width_bytes, height;
};
static_assert(sizeof(Memcpy2D) == 128, "cuda.h CUDA_MEMCPY2D");
constexpr int kMemHost = 1, kMemDevice = 2, kMemUnified = 4;
constexpr unsigned kEventDisableTiming = 2;
using HostFn                           = void (*)(void*);

constexpr int kFuncAttrMaxDynamicSmem = 8;
constexpr int kAttrComputeMajor = 75, kAttrComputeMinor = 76, kAttrSmCount = 16;
constexpr unsigned kHostAllocPortable = 0x01, kHostAllocDeviceMap = 0x02;

struct Driver {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGetCount)(int*);
    CUresult (*cuDeviceGet)(CUdevice*, int);
    CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
    CUresult (*cuDeviceGetName)(char*, int, CUdevice);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuMemGetInfo)(size_t*, size_t*);
    CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemAllocHost)(void**, size_t);
    CUresult (*cuMemFreeHost)(void*);
    CUresult (*cuMemHostAlloc)(void**, size_t, unsigned); // flags: kHostAllocDeviceMap
    CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr*, void*, unsigned);
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
    CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
    CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*cuModuleLoadData)(CUmodule*, const void*);
    CUresult (*cuModuleUnload)(CUmodule);
    CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
    CUresult (*cuFuncSetAttribute)(CUfunction, int, int); // kFuncAttrMaxDynamicSmem
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, CUstream, void**, void**);
    CUresult (*cuStreamCreate)(CUstream*, unsigned);
    CUresult (*cuStreamDestroy)(CUstream);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuStreamBeginCapture)(CUstream, int);
    CUresult (*cuStreamEndCapture)(CUstream, CUgraph*);
    CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long);
    CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
    CUresult (*cuGraphExecDestroy)(CUgraphExec);
    CUresult (*cuGraphDestroy)(CUgraph);
    CUresult (*cuGetErrorName)(CUresult, const char**);
    // Optional (null when the driver lacks them): programmatic dependent launch and event timing
    // (G4_CUDA_PROFILE=1).
    CUresult (*cuLaunchKernelEx)(const LaunchConfig*, CUfunction, void**, void**);
    CUresult (*cuEventCreate)(CUevent*, unsigned);
    CUresult (*cuEventDestroy)(CUevent);
    CUresult (*cuEventRecordWithFlags)(CUevent, CUstream,
                                       unsigned); // 1 = external: a timing node in a captured graph
    CUresult (*cuEventSynchronize)(CUevent);
    CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
    // Optional: cross-device steps of plans with CPU-placed layers (a host function in the stream, 2-D
    // copies).
    CUresult (*cuLaunchHostFunc)(CUstream, HostFn, void*);
    CUresult (*cuMemcpy2DAsync)(const Memcpy2D*, CUstream);
    // Optional: plans on several GPUs (one stream each, joined by events; direct peer copies where the
    // GPUs allow them).
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned);
    CUresult (*cuDeviceCanAccessPeer)(int*, CUdevice, CUdevice);
    CUresult (*cuCtxEnablePeerAccess)(CUcontext, unsigned);
    // Optional: the timeline lab (G4_TRACE_OUT) reads its records from a module global.
    CUresult (*cuModuleGetGlobal)(CUdeviceptr*, size_t*, CUmodule, const char*);
    CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
    // Optional: g4_session_fork of a CUDA session copies KV rows device to device.
    CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
};

// dlsym into a typed function pointer; false if the library lacks the symbol. Shared by the driver
// and cuBLAS loaders.
void* dl_symbol(void* lib, const char* name);
template <class F> bool dl_symbol(void* lib, const char* name, F* out) {
    *out = reinterpret_cast<F>(dl_symbol(lib, name));
    return *out != nullptr;
}

// The loaded driver, or nullptr with *why set (no libcuda.so.1, missing symbol, cuInit failure).
// Thread-safe; loads once.
const Driver* driver(std::string* why);
std::string error_name(CUresult r);

} // namespace g4::cu
