// Shared helpers of the CUDA kernel tests (tests/cuda/*_test.cpp): the GPU and its NVRTC-compiled module,
// device buffers, launches, reference weights. Included by one test file per executable.
#pragma once
#include "compiler/cuda_compile.h"
#include "compiler/cuda_schedule.h"
#include "compiler/nf4_quant.h"
#include "g4/g4.h"
#include "kernels/nf4.h"
#include "kernels/ref/ref.h"
#include "runtime/plan/plan_reader.h"
#include "runtime/src/cuda/cublas.h"
#include "runtime/src/cuda/driver.h"
#include "runtime/src/cuda/kernel_args.h"
#include "runtime/src/cuda/workspace.h"
#include "runtime/src/sampler.h"
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <gtest/gtest.h>
#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

namespace g4test_cuda {

using namespace g4;
using cu::CUdeviceptr;
using g4test::randn;
using g4test::to_bf16;

struct Gpu {
    const cu::Driver* d = nullptr;
    cu::CUdevice dev    = 0;
    cu::CUcontext ctx   = nullptr;
    cu::CUmodule mod    = nullptr;
    int sm              = 0; // the target the kernels were compiled for
    std::string why;
};

Gpu& gpu() {
    static Gpu g;
    static bool tried = false;
    if (tried) return g;
    tried = true;
    if (!cuda::nvrtc_available()) { // a build without the CUDA toolkit on a machine with a GPU
        g.why = "this build has no CUDA toolkit (NVRTC)";
        return g;
    }
    g.d       = cu::driver(&g.why);
    int count = 0;
    if (!g.d || g.d->cuDeviceGetCount(&count) != 0 || count == 0) {
        if (g.d) g.why = "no CUDA device";
        g.d = nullptr;
        return g;
    }
    g.d->cuDeviceGet(&g.dev, 0);
    g.d->cuDevicePrimaryCtxRetain(&g.ctx, g.dev);
    g.d->cuCtxSetCurrent(g.ctx);
    int major = 0, minor = 0;
    g.d->cuDeviceGetAttribute(&major, cu::kAttrComputeMajor, g.dev);
    g.d->cuDeviceGetAttribute(&minor, cu::kAttrComputeMinor, g.dev);
    int sm = g.sm         = std::min(90, major * 10 + minor);
    cuda::KernelBinary kb = cuda::compile_kernels("sm_" + std::to_string(sm));
    std::string ptx       = kb.ptx;
    if (g.d->cuModuleLoadData(&g.mod, major * 10 + minor == sm ? (const void*)kb.cubin.data()
                                                               : (const void*)ptx.c_str()) != 0) {
        g.why = "module load failed";
        g.d   = nullptr;
    }
    return g;
}

#define NEED_GPU()                                                                                           \
    do {                                                                                                     \
        if (!gpu().d) GTEST_SKIP() << "no NVIDIA GPU here: " << gpu().why;                                   \
    } while (0)

// Device buffers freed at scope end.
struct Dev {
    std::vector<CUdeviceptr> owned;
    ~Dev() {
        for (CUdeviceptr p : owned)
            gpu().d->cuMemFree(p);
    }
    CUdeviceptr alloc(size_t bytes) {
        CUdeviceptr p = 0;
        EXPECT_EQ(gpu().d->cuMemAlloc(&p, std::max<size_t>(bytes, 16)), 0);
        gpu().d->cuMemsetD8(p, 0, std::max<size_t>(bytes, 16));
        owned.push_back(p);
        return p;
    }
    template <class T> CUdeviceptr up(const std::vector<T>& v) {
        CUdeviceptr p = alloc(v.size() * sizeof(T));
        gpu().d->cuMemcpyHtoD(p, v.data(), v.size() * sizeof(T));
        return p;
    }
    template <class T> std::vector<T> down(CUdeviceptr p, size_t n) {
        std::vector<T> v(n);
        EXPECT_EQ(gpu().d->cuMemcpyDtoHAsync(v.data(), p, n * sizeof(T), nullptr), 0);
        EXPECT_EQ(gpu().d->cuStreamSynchronize(nullptr), 0);
        return v;
    }
    CUdeviceptr step(int rows, int pos0, int out_rows) {
        return up(std::vector<int>{rows, pos0, out_rows, 0});
    }
};

// A kernel that takes `smem` bytes of dynamic shared memory (its attribute already raised where needed).
void launch_smem(const char* name, unsigned gx, unsigned gy, unsigned block, unsigned smem,
                 std::initializer_list<void*> args) {
    cu::CUfunction f = nullptr;
    ASSERT_EQ(gpu().d->cuModuleGetFunction(&f, gpu().mod, name), 0) << name;
    ASSERT_EQ(gpu().d->cuLaunchKernel(f, gx, gy, 1, block, 1, 1, smem, nullptr,
                                      const_cast<void**>(args.begin()), nullptr),
              0)
        << name;
    ASSERT_EQ(gpu().d->cuStreamSynchronize(nullptr), 0) << name;
}
void launch(const char* name, unsigned gx, unsigned gy, unsigned block, std::initializer_list<void*> args) {
    launch_smem(name, gx, gy, block, 0, args);
}
// The kernels as a plan for a model with `hpg` heads per KV group compiles them (KernelSpec.attn_hpg:
// G4_AD_HPG), or null where that is not a specialised size or the GPU needs PTX. Compiled once per size.
cu::CUmodule spec_module(int hpg) {
    static std::map<int, cu::CUmodule> mods;
    if (cuda::kernel_spec({hpg}).attn_hpg != hpg) return nullptr;
    auto it = mods.find(hpg);
    if (it != mods.end()) return it->second;
    int major = 0, minor = 0;
    gpu().d->cuDeviceGetAttribute(&major, cu::kAttrComputeMajor, gpu().dev);
    gpu().d->cuDeviceGetAttribute(&minor, cu::kAttrComputeMinor, gpu().dev);
    cu::CUmodule m = nullptr;
    if (major * 10 + minor == gpu().sm) {
        cuda::KernelSpec spec;
        spec.attn_hpg               = hpg;
        const cuda::KernelBinary kb = cuda::compile_kernels("sm_" + std::to_string(gpu().sm), spec, false);
        EXPECT_EQ(gpu().d->cuModuleLoadData(&m, kb.cubin.data()), 0);
    }
    return mods[hpg] = m;
}
// launch() from module `mod`.
void launch_in(cu::CUmodule mod, const char* name, unsigned gx, unsigned gy, unsigned block,
               std::initializer_list<void*> args) {
    cu::CUfunction f = nullptr;
    ASSERT_EQ(gpu().d->cuModuleGetFunction(&f, mod, name), 0) << name;
    ASSERT_EQ(gpu().d->cuLaunchKernel(f, gx, gy, 1, block, 1, 1, 0, nullptr, const_cast<void**>(args.begin()),
                                      nullptr),
              0)
        << name;
    ASSERT_EQ(gpu().d->cuStreamSynchronize(nullptr), 0) << name;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
    return g4test::rel_l2(a.data(), b.data(), b.size());
}

// A weight matrix in a plan dtype: host blob for the reference, device copy for the kernels.
struct Weight {
    DType dt;
    int64_t n, k;
    bool dq = false;
    std::vector<uint8_t> blob;
    CUdeviceptr dev = 0;
    cuda_rt::GemvMatH mat(CUdeviceptr y, CUdeviceptr bias = 0) const {
        cuda_rt::GemvMatH m{};
        m.n = (int)n, m.y = y, m.bias = bias;
        if (dt == DType::NF4) {
            nf4::Layout l = nf4::layout(n * k, dq);
            m.w = dev + l.codes_off, m.absmax = dev + l.absmax_off;
            if (dq)
                m.absmax2 = dev + l.absmax2_off, m.offset = dev + l.offset_off, m.code2 = dev + l.code2_off;
        } else {
            m.w = dev;
        }
        return m;
    }
    std::vector<float> ref(const std::vector<float>& x, int rows = 1) const {
        std::vector<float> y((size_t)rows * n);
        MatmulArgs a{x.data(), k, blob.data(), dt, n, k, y.data(), n, rows, dq};
        ref::matmul(a);
        return y;
    }
};
Weight make_weight(Dev& dev, DType dt, int64_t n, int64_t k, uint32_t seed, bool dq = false) {
    Weight w;
    w.dt = dt, w.n = n, w.k = k, w.dq = dq;
    std::vector<float> f = randn((size_t)(n * k), seed, 0.05f);
    if (dt == DType::NF4) {
        w.blob = nf4::quantize(f.data(), n * k, dq);
    } else {
        auto b = to_bf16(f);
        w.blob.assign((const uint8_t*)b.data(), (const uint8_t*)b.data() + b.size() * 2);
    }
    w.dev = dev.up(w.blob);
    return w;
}

void run_gemv(cuda_rt::GemvArgsH& a, bool nf4, int lanes, bool pairs, int n_out) {
    long threads           = cuda_rt::gemv_threads(n_out, lanes, pairs);
    const std::string name = cuda_rt::gemv_kernel_name(nf4, lanes, pairs);
    const unsigned smem    = cuda_rt::gemv_smem(nf4, gpu().sm, a.k);
    if (smem) {
        cu::CUfunction f = nullptr;
        ASSERT_EQ(gpu().d->cuModuleGetFunction(&f, gpu().mod, name.c_str()), 0) << name;
        ASSERT_EQ(gpu().d->cuFuncSetAttribute(f, cu::kFuncAttrMaxDynamicSmem, (int)cuda_rt::kGemvSmemMax), 0)
            << name;
    }
    launch_smem(name.c_str(), (unsigned)((threads + 127) / 128), 1, 128, smem, {&a});
}

// A KV cache in a plan dtype: its elements (f32, or bf16 bits) and, for make_cache, the values as the
// reference reads them (bf16 widened) in f32.
struct Cache {
    DType dt;
    std::vector<float> f32;
    std::vector<uint16_t> bf16;
    const void* data() const {
        return dt == DType::BF16 ? (const void*)bf16.data() : (const void*)f32.data();
    }
    void* data() { return dt == DType::BF16 ? (void*)bf16.data() : (void*)f32.data(); }
    std::vector<float> values() const {
        if (dt == DType::F32) return f32;
        std::vector<float> f(bf16.size());
        for (size_t i = 0; i < bf16.size(); ++i)
            f[i] = bf16_to_f32(bf16[i]);
        return f;
    }
    size_t bytes() const { return dt == DType::BF16 ? bf16.size() * 2 : f32.size() * 4; }
    CUdeviceptr up(Dev& dev) const { return dt == DType::BF16 ? dev.up(bf16) : dev.up(f32); }
    // The device copy at p, widened to float32.
    std::vector<float> down(Dev& dev, CUdeviceptr p) const {
        if (dt == DType::F32) return dev.down<float>(p, f32.size());
        return Cache{dt, {}, dev.down<uint16_t>(p, bf16.size())}.values();
    }
};
Cache make_cache(DType dt, std::vector<float> v) {
    Cache c{dt, std::move(v), {}};
    if (dt == DType::BF16) {
        c.bf16 = to_bf16(c.f32);
        for (size_t i = 0; i < c.f32.size(); ++i)
            c.f32[i] = bf16_to_f32(c.bf16[i]);
    }
    return c;
}
int kvdt_arg(DType dt) {
    return dt == DType::BF16 ? 1 : 0;
}
const char* dt_name(DType dt) {
    return dt == DType::BF16 ? "bf16" : "f32";
}
// Elements whose bits differ between two bf16 caches (the kernels round as f32_to_bf16 does).
size_t bf16_mismatches(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
    size_t n = 0;
    for (size_t i = 0; i < a.size(); ++i)
        n += a[i] != b[i];
    return n;
}

} // namespace g4test_cuda
