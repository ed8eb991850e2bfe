// dlopen-based cuBLAS loader (see cublas.h).
#include "runtime/src/cuda/cublas.h"
#include "runtime/src/env.h"

#include <cstdlib>
#include <dlfcn.h>
#include <mutex>
#include <vector>

namespace g4::cublas {

namespace {
Lib g_lib;
const Lib* g_loaded = nullptr;
std::string g_why;
std::once_flag g_once;

void load() {
    const char* env = rt::env::cublas();
    if (env && std::string(env) == "off") {
        g_why = "disabled by G4_CUBLAS=off";
        return;
    }
    std::vector<std::string> names;
    if (env) names.push_back(env);
    for (const char* n : {"libcublas.so.13", "libcublas.so.12", "/usr/local/cuda/lib64/libcublas.so.13",
                          "/usr/local/cuda/lib64/libcublas.so.12", "libcublas.so"})
        names.push_back(n);
    for (const auto& n : names) {
        void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!h) continue;
        Lib& l  = g_lib;
        bool ok = cu::dl_symbol(h, "cublasCreate_v2", &l.create) &&
                  cu::dl_symbol(h, "cublasDestroy_v2", &l.destroy) &&
                  cu::dl_symbol(h, "cublasSetStream_v2", &l.set_stream) &&
                  cu::dl_symbol(h, "cublasSetWorkspace_v2", &l.set_workspace) &&
                  cu::dl_symbol(h, "cublasGemmEx", &l.gemm_ex);
        if (!ok) {
            dlclose(h);
            continue;
        }
        l.path   = n;
        g_loaded = &g_lib;
        return;
    }
    g_why = "libcublas.so.13/.12 not found (set G4_CUBLAS=/path/to/libcublas.so)";
}
} // namespace

const Lib* lib(std::string* why) {
    std::call_once(g_once, load);
    if (!g_loaded && why) *why = g_why;
    return g_loaded;
}

} // namespace g4::cublas
