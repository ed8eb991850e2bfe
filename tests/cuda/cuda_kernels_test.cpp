// Every CUDA kernel of the decode schedule and the prefill tiers against the scalar reference
// (kernels/ref) at Gemma 4's real E2B/E4B shapes. Needs an NVIDIA GPU: each test is skipped where no
// driver or GPU is present (CI); with a GPU they run in full. Kernels are compiled with NVRTC for
// the GPU present, exactly as `g4 compile --device cuda` does.
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

namespace {

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
    tried     = true;
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

// ---- GEMV family: q/k/v groups, gate/up pairs, the PLE gate (gelu * aux), the LM head (softcap).
struct GemvCase {
    const char* name;
    DType dt;
    std::vector<int64_t> n; // one to three matrices
    int64_t k;
    int epi;   // 0 store, 1 pairs, 2 gelu*aux, 3 softcap
    int lanes; // 0: as the compiler chooses
    bool dq, bias;
};
class Gemv : public ::testing::TestWithParam<GemvCase> {};

TEST_P(Gemv, MatchesReference) {
    NEED_GPU();
    const GemvCase& c = GetParam();
    Dev dev;
    std::vector<float> x = randn((size_t)c.k, 7);
    std::vector<Weight> ws;
    std::vector<CUdeviceptr> ys, bs;
    std::vector<std::vector<float>> biases;
    cuda_rt::GemvArgsH a{};
    for (size_t m = 0; m < c.n.size(); ++m) {
        ws.push_back(make_weight(dev, c.dt, c.n[m], c.k, 100 + (uint32_t)m, c.dq));
        ys.push_back(dev.alloc(c.n[m] * 4));
        biases.push_back(c.bias ? randn(c.n[m], 50 + (uint32_t)m) : std::vector<float>(c.n[m], 0.0f));
        a.m[m] = ws[m].mat(ys[m], c.bias ? dev.up(biases[m]) : 0);
    }
    const bool pairs = c.epi == 1, nf4 = c.dt == DType::NF4;
    int n_out = pairs ? (int)c.n[0] : 0;
    if (!pairs)
        for (int64_t n : c.n)
            n_out += (int)n;
    std::vector<float> aux = randn(n_out, 9);
    a.x = dev.up(x), a.out = dev.alloc(n_out * 4), a.aux = dev.up(aux);
    a.nmat = (int)c.n.size(), a.k = (int)c.k, a.epi = c.epi, a.cap = 30.0f;
    int lanes = c.lanes ? c.lanes : cuda::gemv_lanes(c.k, nf4, pairs ? (n_out + 1) / 2 : (n_out + 3) / 4);
    run_gemv(a, nf4, lanes, pairs, n_out);

    std::vector<std::vector<float>> ref;
    for (size_t m = 0; m < c.n.size(); ++m) {
        ref.push_back(ws[m].ref(x));
        for (int64_t i = 0; i < c.n[m]; ++i)
            ref[m][i] += biases[m][i];
    }
    if (c.epi == 1 || c.epi == 2) {
        std::vector<float> want(n_out);
        for (int i = 0; i < n_out; ++i)
            want[i] = ref::gelu_tanh(ref[0][i]) * (c.epi == 1 ? ref[1][i] : aux[i]);
        double e = rel(dev.down<float>(a.out, n_out), want);
        std::printf("GEMV %s lanes %d: rel %.2e\n", c.name, lanes, e);
        EXPECT_LT(e, 2e-5) << c.name;
        return;
    }
    for (size_t m = 0; m < c.n.size(); ++m) {
        if (c.epi == 3)
            for (auto& v : ref[m])
                v = 30.0f * std::tanh(v / 30.0f);
        double e = rel(dev.down<float>(ys[m], c.n[m]), ref[m]);
        std::printf("GEMV %s matrix %zu lanes %d: rel %.2e\n", c.name, m, lanes, e);
        EXPECT_LT(e, 2e-5) << c.name << " matrix " << m;
    }
}

const DType NF = DType::NF4, BF = DType::BF16;
INSTANTIATE_TEST_SUITE_P(
    RealShapes, Gemv,
    ::testing::Values(GemvCase{"e2b_qkv_sliding", NF, {2048, 256, 256}, 1536, 0, 0, false, false},
                      GemvCase{"e2b_qkv_full", NF, {4096, 512, 512}, 1536, 0, 0, false, false},
                      GemvCase{"e4b_qkv", NF, {2048, 512, 512}, 2560, 0, 0, false, false},
                      GemvCase{"e2b_gate_up", NF, {6144, 6144}, 1536, 1, 0, false, false},
                      GemvCase{"e2b_gate_up_wide", NF, {12288, 12288}, 1536, 1, 0, false, true},
                      GemvCase{"e4b_gate_up", NF, {10240, 10240}, 2560, 1, 0, false, false},
                      GemvCase{"e2b_down", NF, {1536}, 6144, 0, 0, false, false},
                      GemvCase{"e2b_down_wide_dq", NF, {1536}, 12288, 0, 0, true, false},
                      GemvCase{"e4b_down", NF, {2560}, 10240, 0, 0, false, false},
                      GemvCase{"e4b_down_l16_dq", NF, {2560}, 10240, 0, 16, true, true},
                      GemvCase{"k8256_l32_nf4", NF, {100}, 8256, 0, 32, false, false},
                      GemvCase{"k10304_l64_nf4", NF, {64}, 10304, 0, 64, false, false},
                      GemvCase{"e2b_o_full", NF, {1536}, 4096, 0, 0, false, false},
                      GemvCase{"e2b_ple_gate_nf4", NF, {256}, 1536, 2, 0, false, false},
                      GemvCase{"e2b_ple_gate_bf16", BF, {256}, 1536, 2, 0, false, false},
                      GemvCase{"e2b_ple_proj_nf4", NF, {1536}, 256, 0, 0, false, false},
                      GemvCase{"e4b_ple_proj_bf16", BF, {2560}, 256, 0, 0, false, true},
                      GemvCase{"e2b_ple_ctx_bf16", BF, {8960}, 1536, 0, 0, false, false},
                      GemvCase{"e2b_lm_head_softcap", BF, {262144}, 1536, 3, 0, false, false},
                      GemvCase{"e4b_lm_head_softcap", BF, {262144}, 2560, 3, 0, false, false},
                      GemvCase{"lanes8_nf4", NF, {512, 64}, 1536, 0, 8, false, false},
                      GemvCase{"lanes16_nf4_pairs", NF, {512, 512}, 1536, 1, 16, true, false},
                      GemvCase{"lanes32_nf4", NF, {300}, 1536, 0, 32, false, true},
                      GemvCase{"lanes8_bf16_pairs", BF, {512, 512}, 2560, 1, 8, false, false},
                      GemvCase{"lanes16_bf16", BF, {700, 2}, 2560, 0, 16, false, false},
                      GemvCase{"lanes32_bf16_pairs", BF, {1000, 1000}, 1536, 1, 32, false, true},
                      GemvCase{"lanes64_nf4", NF, {900, 100}, 2560, 0, 64, true, true},
                      GemvCase{"lanes128_bf16_pairs", BF, {600, 600}, 2560, 1, 128, false, false},
                      GemvCase{"lanes128_nf4_aux", NF, {333}, 1536, 2, 128, false, true},
                      GemvCase{"lanes32_bf16_aux", BF, {333}, 1536, 2, 32, false, true}),
    [](const ::testing::TestParamInfo<GemvCase>& i) { return std::string(i.param.name); });

// ---- the decode MLP in one kernel (g4_mlp_nf4[_b256][_dq][_h2], sm_90): gate/up pairs, GeluMul and the down
// projection (its weight tiled, kQuantTiled32) adding into a zeroed y, against the unfused reference. The
// packed-f16 kernels (_h2, f32 scales only) within 3e-3 (bf16's rounding is 3.9e-3; measured ~1e-3), also
// with x 8192 times larger (its chunks' powers of two keep the half products in range).
struct MlpCase {
    const char* name;
    int64_t H, I;
    bool dq, bias;
};
class Mlp : public ::testing::TestWithParam<MlpCase> {};
TEST_P(Mlp, MatchesUnfusedReference) {
    NEED_GPU();
    if (gpu().sm < 90) GTEST_SKIP() << "g4_mlp_nf4 is scheduled on sm_90 plans only";
    const MlpCase& c = GetParam();
    Dev dev;
    Weight g              = make_weight(dev, DType::NF4, c.I, c.H, 31, c.dq),
           u              = make_weight(dev, DType::NF4, c.I, c.H, 32, c.dq);
    Weight d              = make_weight(dev, DType::NF4, c.H, c.I, 33, c.dq);
    std::vector<float> bg = c.bias ? randn(c.I, 41) : std::vector<float>(c.I, 0.0f),
                       bu = c.bias ? randn(c.I, 42) : std::vector<float>(c.I, 0.0f);
    std::vector<float> bd = c.bias ? randn(c.H, 43) : std::vector<float>(c.H, 0.0f);
    nf4::Layout l         = nf4::layout(c.H * c.I, c.dq);
    CUdeviceptr t = dev.up(nf4::tile32(d.blob, c.H, c.I, c.dq)), y = dev.alloc(c.H * 4);
    cuda_rt::MlpArgsH a{};
    a.gu.m[0] = g.mat(0, c.bias ? dev.up(bg) : 0), a.gu.m[1] = u.mat(0, c.bias ? dev.up(bu) : 0);
    a.gu.nmat = 2, a.gu.k = (int)c.H, a.gu.epi = 1;
    a.codes = t + l.codes_off, a.absmax = t + l.absmax_off;
    if (c.dq) a.absmax2 = t + l.absmax2_off, a.offset = t + l.offset_off, a.code2 = t + l.code2_off;
    a.bias = c.bias ? dev.up(bd) : 0, a.y = y, a.H = (int)c.H, a.I = (int)c.I;
    for (float xscale : {1.0f, 8192.0f}) {
        std::vector<float> x = randn((size_t)c.H, 7);
        for (float& v : x)
            v *= xscale;
        std::vector<float> rg = g.ref(x), ru = u.ref(x), act(c.I);
        for (int64_t i = 0; i < c.I; ++i)
            act[i] = ref::gelu_tanh(rg[i] + bg[i]) * (ru[i] + bu[i]);
        std::vector<float> want = d.ref(act);
        for (int64_t i = 0; i < c.H; ++i)
            want[i] += bd[i];
        a.gu.x = dev.up(x);
        for (int h2 : {0, 1}) { // _h2: the packed-f16 kernels (a plan's ip7 = 1)
            if ((h2 && c.dq) || (!h2 && xscale != 1.0f)) continue;
            for (int threads : {128, 256}) { // g4_mlp_nf4, g4_mlp_nf4_b256 (cuda::mlp_threads picks one per
                                             // I); _dq: double quant
                // nrep 0, then 3 output replicas (a plan's ip6 = 4, the _rep kernel): block j adds into
                // replica j % 4; their sum is y. _z (256 threads, one output; before a ResNorm folded into
                // the PLE): also zeroes a.zero at its end.
                for (int v : {0, 3, -1}) {
                    const int nrep = v < 0 ? 0 : v;
                    const bool z   = v < 0;
                    if (z && threads != 256) continue;
                    const std::string kn = std::string(threads == 128 ? "g4_mlp_nf4" : "g4_mlp_nf4_b256") +
                                           (c.dq ? "_dq" : "") + (h2 ? "_h2" : "") + (nrep ? "_rep" : "") +
                                           (z ? "_z" : "");
                    const char* name = kn.c_str();
                    cu::CUfunction f = nullptr;
                    ASSERT_EQ(gpu().d->cuModuleGetFunction(&f, gpu().mod, name), 0) << name;
                    ASSERT_EQ(gpu().d->cuFuncSetAttribute(f, cu::kFuncAttrMaxDynamicSmem,
                                                          (int)cuda_rt::kGemvSmemMax),
                              0);
                    CUdeviceptr yr = nrep ? dev.alloc((size_t)nrep * c.H * 4) : 0;
                    if (nrep) gpu().d->cuMemsetD8(yr, 0, (size_t)nrep * c.H * 4);
                    a.yr = yr, a.nrep = nrep;
                    gpu().d->cuMemsetD8(y, 0, c.H * 4);
                    // a.zero (_z): the output of the g4_ple_res launch after (a folded ResNorm), zeroed by
                    // block 0 at its end.
                    CUdeviceptr zero = z ? dev.alloc(c.H * 4) : 0;
                    if (zero) gpu().d->cuMemsetD8(zero, 0x7f, c.H * 4);
                    a.zero = zero;
                    launch_smem(name, (unsigned)(c.I / 32), 1, threads,
                                cuda_rt::gemv_smem(true, gpu().sm, (int)c.H), {&a});
                    if (zero) {
                        const std::vector<float> z = dev.down<float>(zero, c.H);
                        EXPECT_EQ(std::count(z.begin(), z.end(), 0.0f), (long)c.H)
                            << kn << ": the next launch's output, zeroed";
                    }
                    a.zero                 = 0;
                    std::vector<float> got = dev.down<float>(y, c.H);
                    if (nrep) {
                        const std::vector<float> r = dev.down<float>(yr, (size_t)nrep * c.H);
                        for (int k = 0; k < nrep; ++k)
                            for (int64_t i = 0; i < c.H; ++i)
                                got[i] += r[(size_t)k * c.H + i];
                    }
                    const double e = rel(got, want);
                    std::printf("MLP %s, %s, %d threads%s, %d replicas%s, x scale %g: rel %.2e\n", c.name,
                                h2 ? "packed f16" : "f32", threads,
                                threads == (h2 ? cuda::mlp_threads_f16(c.I) : cuda::mlp_threads(c.I))
                                    ? " (the compiler's)"
                                    : "",
                                nrep + 1, z ? " (_z)" : "", (double)xscale, e);
                    EXPECT_LT(e, h2 ? 3e-3 : 2e-5) << kn << ", " << c.name << ", x scale " << xscale;
                }
                a.yr = 0, a.nrep = 0;
            }
        }
    }
}
// The packed-f16 kernels that run the ResNorm before them (_r; plan ResNorm ip1 = 2): every block makes its
// input xn = rms(x1) * prew from x1 = rx + rms(rd) * pw (gu.x is NaN: unused), block 0 writes x1. Against the
// reference RmsNorm, Add, RmsNorm and the unfused MLP, at every thread count whose registers take the width,
// with one output, 3 replicas and _z. rd is 40 times the residual's scale and the norm weights are not 1, so
// a skipped norm fails.
TEST_P(Mlp, ResNormBeforeFoldedIn) {
    NEED_GPU();
    if (gpu().sm < 90) GTEST_SKIP() << "g4_mlp_nf4*_h2*_r are scheduled on sm_90 plans only";
    const MlpCase& c = GetParam();
    if (c.dq) GTEST_SKIP() << "the packed-f16 kernels take f32 block scales only";
    Dev dev;
    const int64_t H       = c.H;
    Weight g              = make_weight(dev, DType::NF4, c.I, H, 31, false),
           u              = make_weight(dev, DType::NF4, c.I, H, 32, false);
    Weight d              = make_weight(dev, DType::NF4, H, c.I, 33, false);
    std::vector<float> bd = c.bias ? randn(H, 43) : std::vector<float>(H, 0.0f);
    nf4::Layout l         = nf4::layout(H * c.I, false);
    CUdeviceptr t = dev.up(nf4::tile32(d.blob, H, c.I, false)), y = dev.alloc(H * 4), xo = dev.alloc(H * 4);
    std::vector<float> rx = randn(H, 11), rd = randn(H, 12), pw = randn(H, 13), prew = randn(H, 14);
    for (float& v : rd)
        v *= 40.0f;
    for (float& v : pw)
        v = 1.0f + 0.5f * v;
    for (float& v : prew)
        v = 1.0f + 0.5f * v;
    const auto prewb      = to_bf16(prew);
    std::vector<float> dn = rd, x1(H), xn(H);
    const int32_t h       = (int32_t)H;
    ref::rms_norm({dn.data(), H, pw.data(), DType::F32, dn.data(), H, 1, h, h, 1e-6f});
    ref::add({rx.data(), H, dn.data(), H, x1.data(), H, 1, h});
    ref::rms_norm({x1.data(), H, prewb.data(), DType::BF16, xn.data(), H, 1, h, h, 1e-6f});
    std::vector<float> rg = g.ref(xn), ru = u.ref(xn), act(c.I);
    for (int64_t i = 0; i < c.I; ++i)
        act[i] = ref::gelu_tanh(rg[i]) * ru[i];
    std::vector<float> want = d.ref(act);
    for (int64_t i = 0; i < H; ++i)
        want[i] += bd[i];
    cuda_rt::MlpArgsH a{};
    a.gu.m[0] = g.mat(0, 0), a.gu.m[1] = u.mat(0, 0);
    a.gu.nmat = 2, a.gu.k = (int)H, a.gu.epi = 1;
    a.gu.x  = dev.up(std::vector<float>(H, std::nanf("")));
    a.codes = t + l.codes_off, a.absmax = t + l.absmax_off;
    a.bias = c.bias ? dev.up(bd) : 0, a.y = y, a.H = (int)H, a.I = (int)c.I;
    a.rx = dev.up(rx), a.rd = dev.up(rd), a.rpw = dev.up(pw), a.rpwdt = 0, a.rprew = dev.up(prewb),
    a.rprewdt = 1, a.xo = xo, a.eps = 1e-6f;
    int runs = 0;
    for (int threads : {128, 256}) {
        if (!g4::plan::mlp_res_fits(H, threads)) continue;
        for (int v : {0, 3, -1}) {
            const int nrep = v < 0 ? 0 : v;
            const bool z   = v < 0;
            if (z && threads != 256) continue;
            const std::string kn = std::string(threads == 128 ? "g4_mlp_nf4_h2" : "g4_mlp_nf4_b256_h2") +
                                   (nrep ? "_rep" : "") + (z ? "_z" : "") + "_r";
            cu::CUfunction f = nullptr;
            ASSERT_EQ(gpu().d->cuModuleGetFunction(&f, gpu().mod, kn.c_str()), 0) << kn;
            ASSERT_EQ(gpu().d->cuFuncSetAttribute(f, cu::kFuncAttrMaxDynamicSmem, (int)cuda_rt::kGemvSmemMax),
                      0);
            CUdeviceptr yr = nrep ? dev.alloc((size_t)nrep * H * 4) : 0;
            if (nrep) gpu().d->cuMemsetD8(yr, 0, (size_t)nrep * H * 4);
            CUdeviceptr zero = z ? dev.alloc(H * 4) : 0;
            if (zero) gpu().d->cuMemsetD8(zero, 0x7f, H * 4);
            a.yr = yr, a.nrep = nrep, a.zero = zero;
            gpu().d->cuMemsetD8(y, 0, H * 4);
            gpu().d->cuMemsetD8(xo, 0xff, H * 4);
            launch_smem(kn.c_str(), (unsigned)(c.I / 32), 1, threads,
                        cuda_rt::gemv_smem(true, gpu().sm, (int)H), {&a});
            std::vector<float> got = dev.down<float>(y, H);
            if (nrep) {
                const std::vector<float> r = dev.down<float>(yr, (size_t)nrep * H);
                for (int k = 0; k < nrep; ++k)
                    for (int64_t i = 0; i < H; ++i)
                        got[i] += r[(size_t)k * H + i];
            }
            if (zero) {
                const std::vector<float> zz = dev.down<float>(zero, H);
                EXPECT_EQ(std::count(zz.begin(), zz.end(), 0.0f), (long)H)
                    << kn << ": the next launch's output, zeroed";
            }
            const double ex = rel(dev.down<float>(xo, H), x1), ey = rel(got, want);
            std::printf("MLP %s, %s: x1 rel %.2e, y rel %.2e\n", c.name, kn.c_str(), ex, ey);
            EXPECT_LT(ex, 1e-6) << kn << ", " << c.name;
            EXPECT_LT(ey, 3e-3) << kn << ", " << c.name;
            ++runs;
        }
        a.yr = 0, a.nrep = 0, a.zero = 0;
    }
    EXPECT_GT(runs, 0) << c.name << ": no _r kernel takes H " << H;
}
INSTANTIATE_TEST_SUITE_P(
    RealShapes, Mlp,
    ::testing::Values(MlpCase{"e2b", 1536, 6144, false, false},
                      MlpCase{"e2b_wide_dq_bias", 1536, 12288, true, true},
                      MlpCase{"e4b", 2560, 10240, false, true}, MlpCase{"e4b_dq", 2560, 10240, true, false},
                      MlpCase{"tiny_e2b", 64, 128, true, true}, MlpCase{"tiny_e4b", 96, 192, false, false}),
    [](const ::testing::TestParamInfo<MlpCase>& i) { return std::string(i.param.name); });

// ---- the per-layer-input gate and projection in one kernel (g4_ple_bf16_g*, sm_90): gelu(W_g x + b_g) *
// aux, then the projection (its bf16 [H, P] row-major) adding into a zeroed y, against the unfused reference.
struct PleCase {
    const char* name;
    int64_t H, P;
    bool bias;
};
class PleFused : public ::testing::TestWithParam<PleCase> {};
TEST_P(PleFused, MatchesUnfusedReference) {
    NEED_GPU();
    if (gpu().sm < 90) GTEST_SKIP() << "g4_ple_bf16 is scheduled on sm_90 plans only";
    const PleCase& c = GetParam();
    Dev dev;
    std::vector<float> x = randn((size_t)c.H, 7), aux = randn((size_t)c.P, 73);
    Weight g = make_weight(dev, DType::BF16, c.P, c.H, 71), w = make_weight(dev, DType::BF16, c.H, c.P, 72);
    std::vector<float> bg = c.bias ? randn(c.P, 74) : std::vector<float>(c.P, 0.0f),
                       bp = c.bias ? randn(c.H, 75) : std::vector<float>(c.H, 0.0f);
    std::vector<float> rg = g.ref(x), act(c.P);
    for (int64_t i = 0; i < c.P; ++i)
        act[i] = ref::gelu_tanh(rg[i] + bg[i]) * aux[i];
    std::vector<float> want = w.ref(act);
    for (int64_t i = 0; i < c.H; ++i)
        want[i] += bp[i];
    CUdeviceptr y = dev.alloc(c.H * 4);
    cuda_rt::PleArgsH a{};
    a.x = dev.up(x), a.wg = g.dev, a.bg = c.bias ? dev.up(bg) : 0, a.aux = dev.up(aux), a.wp = w.dev,
    a.bp = c.bias ? dev.up(bp) : 0;
    a.y = y, a.H = (int)c.H, a.P = (int)c.P;
    const std::string name = "g4_ple_bf16_g" + std::to_string(cuda_rt::slice_row_groups(c.H));
    for (int rep = 0; rep < 2; ++rep) {
        gpu().d->cuMemsetD8(y, 0, c.H * 4);
        launch(name.c_str(), (unsigned)(c.P / 8), 1, 256, {&a});
        const double e = rel(dev.down<float>(y, c.H), want);
        std::printf("PLE %s (%s): rel %.2e\n", c.name, name.c_str(), e);
        EXPECT_LT(e, 2e-5) << c.name;
    }
}
// g4_ple_res_bf16_g*: the ResNorm before folded in (a plan's ResNorm record with ip1 = 1). Every block makes
// x = rx + rms(rd) * pw and block 0 writes it to xo; y as the unfused ResNorm then PLE.
TEST_P(PleFused, ResNormBeforeFoldedIn) {
    NEED_GPU();
    if (gpu().sm < 90) GTEST_SKIP() << "g4_ple_res_bf16 is scheduled on sm_90 plans only";
    const PleCase& c = GetParam();
    const int H      = (int)c.H;
    Dev dev;
    std::vector<float> rx = randn(H, 11), d0 = randn(H, 12), pw = randn(H, 13), aux = randn((size_t)c.P, 73);
    for (float& v : d0)
        v *= 40.0f; // rms(d) far from 1: a skipped norm cannot pass
    const auto pwb = to_bf16(pw);
    Weight g = make_weight(dev, DType::BF16, c.P, H, 71), w = make_weight(dev, DType::BF16, H, c.P, 72);
    std::vector<float> bg = c.bias ? randn(c.P, 74) : std::vector<float>(c.P, 0.0f),
                       bp = c.bias ? randn(H, 75) : std::vector<float>(H, 0.0f);
    std::vector<float> d  = d0, x(H);
    ref::rms_norm({d.data(), H, pwb.data(), DType::BF16, d.data(), H, 1, H, H, 1e-6f});
    ref::add({rx.data(), H, d.data(), H, x.data(), H, 1, H});
    std::vector<float> rg = g.ref(x), act(c.P);
    for (int64_t i = 0; i < c.P; ++i)
        act[i] = ref::gelu_tanh(rg[i] + bg[i]) * aux[i];
    std::vector<float> want = w.ref(act);
    for (int i = 0; i < H; ++i)
        want[i] += bp[i];
    CUdeviceptr y = dev.alloc(H * 4), xo = dev.alloc(H * 4);
    cuda_rt::PleArgsH a{};
    a.x = 0, a.wg = g.dev, a.bg = c.bias ? dev.up(bg) : 0, a.aux = dev.up(aux), a.wp = w.dev,
    a.bp = c.bias ? dev.up(bp) : 0;
    a.y = y, a.H = H, a.P = (int)c.P;
    a.rx = dev.up(rx), a.rd = dev.up(d0), a.rpw = dev.up(pwb), a.rpwdt = 1, a.xo = xo, a.eps = 1e-6f;
    const std::string name = "g4_ple_res_bf16_g" + std::to_string(cuda_rt::slice_row_groups(c.H));
    for (int rep = 0; rep < 2; ++rep) {
        gpu().d->cuMemsetD8(y, 0, H * 4);
        gpu().d->cuMemsetD8(xo, 0xff, H * 4);
        launch(name.c_str(), (unsigned)(c.P / 8), 1, 256, {&a});
        const double ex = rel(dev.down<float>(xo, H), x), ey = rel(dev.down<float>(y, H), want);
        std::printf("PLE + ResNorm %s (%s): xo %.2e, y %.2e\n", c.name, name.c_str(), ex, ey);
        EXPECT_LT(ex, 1e-6) << c.name;
        EXPECT_LT(ey, 2e-5) << c.name;
    }
}
INSTANTIATE_TEST_SUITE_P(
    RealShapes, PleFused,
    ::testing::Values(PleCase{"e2b", 1536, 256, false}, PleCase{"e4b_bias", 2560, 256, true},
                      PleCase{"tiny_e2b_bias", 64, 16, true}, PleCase{"tiny_e4b", 96, 16, false},
                      PleCase{"h4096_bias", 4096, 256, true}),
    [](const ::testing::TestParamInfo<PleCase>& i) { return std::string(i.param.name); });

// ---- greedy sampling: multi-block argmax, ties to the lowest index, counter reset for the next call;
// with a step, the feed of the next decode step (its id, its position, the host slot of this one)
TEST(Argmax, MatchesHostAcrossCalls) {
    NEED_GPU();
    Dev dev;
    const int vocab = 262144;
    for (int trial = 0; trial < 3; ++trial) {
        std::vector<float> l = randn(vocab, 30 + trial);
        int want             = trial == 2 ? 5 : 200000 - trial * 77777;
        l[want]              = 9.0f;
        if (trial == 1) l[want + 1000] = 9.0f; // a tie: the lower index wins
        if (trial == 2) l[vocab - 1] = 9.0f;
        CUdeviceptr gl = dev.up(l), ws = dev.alloc((2 + 2 * 128) * 4);
        CUdeviceptr none = 0;
        for (int rep = 0; rep < 2; ++rep) { // the second call reuses the counter the first one reset
            int v = vocab, limit = 0;
            launch("g4_argmax", 128, 1, 1024, {&gl, &v, &ws, &none, &none, &none, &limit});
            auto got = dev.down<int>(ws, 2);
            EXPECT_EQ(got[0], want) << "trial " << trial;
            EXPECT_EQ(got[1], 0);
        }
        // Feeding: slot pos & 1 of the (here device) token buffer, ids[0] (0 past the limit), pos + 1.
        for (int limit : {vocab, want}) {
            const int pos    = 7 + trial;
            CUdeviceptr step = dev.step(1, pos, 1), ids = dev.up(std::vector<int>{-1, -1}),
                        slots = dev.up(std::vector<int>{-1, -1});
            int v             = vocab;
            launch("g4_argmax", 128, 1, 1024, {&gl, &v, &ws, &step, &ids, &slots, &limit});
            auto st = dev.down<int>(step, 4), id = dev.down<int>(ids, 2), sl = dev.down<int>(slots, 2);
            EXPECT_EQ(sl[pos & 1], want) << "trial " << trial;
            EXPECT_EQ(sl[(pos + 1) & 1], -1);
            EXPECT_EQ(id[0], want < limit ? want : 0) << "limit " << limit;
            EXPECT_EQ(id[1], -1);
            EXPECT_EQ(st[1], pos + 1);
            EXPECT_EQ(st[0], 1);
            EXPECT_EQ(st[2], 1);
        }
    }
}

// ---- LM-head screening (g4_lm_screen_build, g4_lm_screen, g4_lm_exact_l*): every logit between its
// bounds, the rows computed bit-equal to the head GEMV's, the greedy token equal to g4_argmax's over the
// whole head (ties to the lowest index), the feed of the next step as g4_argmax makes it.
struct LmCase {
    const char* name;
    int v, k, lanes; // lanes 0: as the compiler chooses
    bool bias;       // a LoRA bias on the head
};
class LmScreen : public ::testing::TestWithParam<LmCase> {};
TEST_P(LmScreen, ExactRowsAndTokenMatchFullHead) {
    NEED_GPU();
    const LmCase c = GetParam();
    Dev dev;
    Weight w = make_weight(dev, DType::BF16, c.v, c.k, 500 + c.k);
    // Exact ties: rows copied over others, the lower index first; one of them the top row below.
    const uint16_t* wb = (const uint16_t*)w.blob.data();
    auto copy_row      = [&](int from, int to) {
        std::memcpy(w.blob.data() + (size_t)to * c.k * 2, wb + (size_t)from * c.k, (size_t)c.k * 2);
        ASSERT_EQ(
                 gpu().d->cuMemcpyHtoD(w.dev + (uint64_t)to * c.k * 2, wb + (size_t)to * c.k, (size_t)c.k * 2), 0);
    };
    auto bf16_f = [](uint16_t h) {
        const uint32_t u = (uint32_t)h << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    };
    const int lanes = c.lanes ? c.lanes : cuda::gemv_lanes(c.k, false, (c.v + 3) / 4);
    int sms         = 0;
    gpu().d->cuDeviceGetAttribute(&sms, cu::kAttrSmCount, gpu().dev);
    const unsigned nb1 = (unsigned)sms * 4;
    CUdeviceptr q = dev.alloc((size_t)c.v * c.k), sc = dev.alloc((size_t)c.v * 4),
                bd = dev.alloc((size_t)c.v * 4);
    int V = c.v, K = c.k;
    for (int trial = 0; trial < 3; ++trial) {
        std::vector<float> x = randn((size_t)c.k, 60 + trial);
        if (trial == 2) // logits past 4 x the cap: every row is computed
            for (float& v : x)
                v *= 400.0f;
        // The head as the decode step runs it: pre-softcap values (epilogue 0) and softcapped (3).
        CUdeviceptr gx = dev.up(x), pre = dev.alloc((size_t)c.v * 4), full = dev.alloc((size_t)c.v * 4);
        CUdeviceptr bias = c.bias ? dev.up(randn((size_t)c.v, 70 + trial, 2.0f)) : 0;
        cuda_rt::GemvArgsH a{};
        a.m[0] = w.mat(pre, bias), a.x = gx, a.nmat = 1, a.k = c.k, a.epi = 0, a.cap = 30.0f;
        run_gemv(a, false, lanes, false, c.v);
        std::vector<float> pre_h = dev.down<float>(pre, c.v);
        int top                  = -1;
        if (trial == 1) { // the top row tied by a copy at a lower and a higher index
            top = (int)(std::max_element(pre_h.begin(), pre_h.end()) - pre_h.begin());
            copy_row(top, top / 2);
            copy_row(top, std::min(c.v - 1, top + 3));
            run_gemv(a, false, lanes, false, c.v);
            pre_h = dev.down<float>(pre, c.v);
        }
        a.m[0].y = full, a.epi = 3;
        run_gemv(a, false, lanes, false, c.v);
        const std::vector<float> full_h = dev.down<float>(full, c.v);
        CUdeviceptr ws = dev.alloc((2 + 2 * 128) * 4), none = 0;
        int zero = 0;
        launch("g4_argmax", 128, 1, 1024, {&full, &V, &ws, &none, &none, &none, &zero});
        const int want = dev.down<int>(ws, 1)[0];

        launch("g4_lm_screen_build", (unsigned)(c.v + 7) / 8, 1, 256, {&w.dev, &V, &K, &q, &sc, &bd});
        if (trial == 0) { // the stored bound covers each row's rounding error
            const auto qh = dev.down<uint8_t>(q, (size_t)c.v * c.k);
            const auto sh = dev.down<float>(sc, c.v), bh = dev.down<float>(bd, c.v);
            for (int r = 0; r < c.v; r += 997) {
                double e2 = 0;
                for (int i = 0; i < c.k; ++i) {
                    const double d = (double)bf16_f(wb[(size_t)r * c.k + i]) -
                                     (double)sh[r] * ((int)qh[(size_t)r * c.k + i] - 128);
                    e2 += d * d;
                }
                ASSERT_GE((double)bh[r], std::sqrt(e2)) << "row " << r;
                ASSERT_LE((double)bh[r], std::sqrt(e2) * 1.001 + 1e-30) << "row " << r;
            }
        }
        CUdeviceptr lohi = dev.alloc((size_t)(c.v + 1) * 8), tmax = dev.alloc(4);
        launch("g4_lm_screen", nb1, 1, 256, {&gx, &q, &sc, &bd, &bias, &V, &K, &lohi, &tmax});
        const auto lh = dev.down<float>(lohi, (size_t)c.v * 2);
        for (int r = 0; r < c.v; ++r) {
            ASSERT_LE(lh[2 * r], pre_h[r]) << "row " << r;
            ASSERT_GE(lh[2 * r + 1], pre_h[r]) << "row " << r;
        }
        // The exact pass into a row of NaNs: computed rows bit-equal, the token and the feed.
        std::vector<float> nans(c.v, std::nanf(""));
        CUdeviceptr part = dev.up(nans);
        a.m[0].y         = part;
        const int pos    = 11 + trial;
        CUdeviceptr step = dev.step(1, pos, 1), ids = dev.up(std::vector<int>{-1, -1}),
                    slots    = dev.up(std::vector<int>{-1, -1});
        int limit            = c.v;
        const std::string ex = "g4_lm_exact_l" + std::to_string(lanes);
        launch(ex.c_str(), 128, 1, 128, {&a, &lohi, &tmax, &ws, &step, &ids, &slots, &limit});
        EXPECT_EQ(dev.down<uint32_t>(tmax, 1)[0], 0u) << "the largest lower bound is reset for the next step";
        const auto got = dev.down<float>(part, c.v);
        int computed   = 0;
        for (int r = 0; r < c.v; ++r) {
            if (std::isnan(got[r])) continue;
            ++computed;
            ASSERT_EQ(std::memcmp(&got[r], &full_h[r], 4), 0)
                << "row " << r << ": " << got[r] << " vs " << full_h[r];
        }
        const auto sl = dev.down<int>(slots, 2), id = dev.down<int>(ids, 2), st = dev.down<int>(step, 4),
                   w0 = dev.down<int>(ws, 2);
        EXPECT_EQ(w0[0], want) << c.name << " trial " << trial;
        EXPECT_EQ(w0[1], 0);
        EXPECT_EQ(sl[pos & 1], want);
        EXPECT_EQ(id[0], want);
        EXPECT_EQ(st[1], pos + 1);
        EXPECT_FALSE(std::isnan(got[want]));
        if (trial == 1 && top > 1 && !c.bias) {
            EXPECT_EQ(want, top / 2);
        } // (a bias breaks the copies' ties)
        if (trial == 2) {
            EXPECT_EQ(computed, c.v);
        }
        std::printf("LM screen %s trial %d: token %d, %d of %d rows computed\n", c.name, trial, want,
                    computed, c.v);
    }
}
INSTANTIATE_TEST_SUITE_P(
    Shapes, LmScreen,
    ::testing::Values(LmCase{"e2b", 262144, 1536, 0, false}, LmCase{"e4b", 262144, 2560, 0, false},
                      LmCase{"e2b_bias", 262144, 1536, 0, true}, LmCase{"odd_l8", 1003, 256, 8, false},
                      LmCase{"odd_l16_bias", 2051, 512, 16, true}, LmCase{"odd_l32", 4099, 640, 32, false},
                      LmCase{"k4096_l128", 3001, 4096, 128, false}),
    [](const ::testing::TestParamInfo<LmCase>& i) { return std::string(i.param.name); });

// ---- sampling on the GPU: repetition penalty and top-k rounds against the CPU sampler's arithmetic
// and order (value descending, ties to the lower index), at Gemma's vocabulary.
struct TopkCase {
    int k;
    float temp, penalty;
};
class TopK : public ::testing::TestWithParam<TopkCase> {};
TEST_P(TopK, RoundsMatchHostPartialSort) {
    NEED_GPU();
    const TopkCase c = GetParam();
    const int vocab  = 262144;
    Dev dev;
    std::vector<float> l = randn(vocab, 41);
    for (int i = 0; i < 3000; ++i)
        l[(i * 7919 + 13) % vocab] = l[(i * 104729 + 5) % vocab]; // ties
    l[262000] = l[5]      = 6.5f;                                 // a tie at the top
    std::vector<int> hist = {5, 17, 5, 262143, 100000, 17, 99};
    // Host: the CPU sampler's penalty, temperature and partial sort.
    std::vector<float> buf = l;
    if (c.penalty != 1.0f)
        for (int t : hist)
            buf[t] = l[t] < 0 ? l[t] * c.penalty : l[t] / c.penalty;
    if (c.temp > 0)
        for (float& v : buf)
            v /= c.temp;
    std::vector<int> idx(vocab);
    for (int i = 0; i < vocab; ++i)
        idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + c.k, idx.end(),
                      [&](int a, int b) { return buf[a] > buf[b] || (buf[a] == buf[b] && a < b); });

    CUdeviceptr gl = dev.up(l), src = gl;
    if (c.penalty != 1.0f) {
        CUdeviceptr pen = dev.alloc(vocab * 4), gh = dev.up(hist);
        long n = vocab;
        int nh = (int)hist.size(), v = vocab;
        float pe = c.penalty;
        launch("g4_copy_f32", vocab / 256, 1, 256, {&gl, &pen, &n});
        launch("g4_penalize", 1, 1, 256, {&gl, &pen, &gh, &nh, &v, &pe});
        src = pen;
    }
    const uint64_t cap  = cuda_ws::topk_candidates(vocab);
    CUdeviceptr bufs[2] = {dev.alloc(cap * 8), dev.alloc(cap * 8)}, vals = src, ids = 0;
    long n     = vocab;
    float temp = c.temp;
    int k = c.k, rounds = 0;
    for (;; ++rounds) {
        const unsigned blocks = (unsigned)((n + cuda_ws::kTopkBlock - 1) / cuda_ws::kTopkBlock);
        CUdeviceptr ov = bufs[rounds & 1], oi = ov + cap * 4;
        launch("g4_topk_round", blocks, 1, 1024, {&vals, &ids, &n, &temp, &k, &ov, &oi});
        vals = ov, ids = oi, n = (long)blocks * k, temp = 0.0f;
        if (blocks == 1) break;
    }
    auto gv = dev.down<float>(vals, c.k);
    auto gi = dev.down<int>(ids, c.k);
    int bad = 0;
    for (int i = 0; i < c.k; ++i)
        bad += gi[i] != idx[i] || gv[i] != buf[idx[i]];
    std::printf("top-%d temp %.2f penalty %.2f: %d rounds, %d mismatches\n", c.k, c.temp, c.penalty,
                rounds + 1, bad);
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(gi[0], c.penalty != 1.0f ? 262000 : 5); // 5 is penalised; else the tie goes to the lower index
}
INSTANTIATE_TEST_SUITE_P(GemmaVocab, TopK,
                         ::testing::Values(TopkCase{1, 0.0f, 1.3f}, TopkCase{40, 0.7f, 1.0f},
                                           TopkCase{64, 1.0f, 1.3f}, TopkCase{1024, 0.8f, 1.1f},
                                           TopkCase{777, 1.7f, 1.0f}),
                         [](const ::testing::TestParamInfo<TopkCase>& i) {
                             return "k" + std::to_string(i.param.k) +
                                    (i.param.penalty != 1.0f ? "_penalty" : "");
                         });

// Through the C API on a CUDA plan: every token g4_session_sample draws from the GPU's candidates
// equals the CPU sampler's draw from the same logits with the same seed.
TEST(GpuSampling, SameTokensAsTheCpuSampler) {
    NEED_GPU();
    g4test::TempDir td;
    const std::string plan = td.file("tiny.g4plan");
    g4test::CmdResult r    = g4test::run_g4("compile --model '" + g4test::fixture("e2b_tiny") +
                                            "' --device cuda --no-fidelity -o '" + plan + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    g4_engine* e = nullptr;
    ASSERT_EQ(g4_engine_open(plan.c_str(), nullptr, &e), G4_OK) << g4_last_error_message();
    std::vector<g4_sampling_params> sets(5, g4_sampling_params_default());
    sets[0].temperature = 0.8f, sets[0].top_k = 40, sets[0].top_p = 0.9f, sets[0].min_p = 0.02f,
    sets[0].repeat_penalty = 1.3f, sets[0].repeat_last_n = 16, sets[0].seed = 11;
    sets[1].repeat_penalty = 1.5f, sets[1].repeat_last_n = -1; // greedy with a penalty: top-1 on the GPU
    sets[2].temperature = 1.2f, sets[2].top_k = 300, sets[2].seed = 5;
    // No top-k: top-p / min-p from the GPU's best candidates with the row's normalizer (sample_prefix).
    sets[3].temperature = 1.0f, sets[3].top_k = 0, sets[3].top_p = 0.9f, sets[3].seed = 21;
    sets[4].temperature = 0.8f, sets[4].top_k = 0, sets[4].min_p = 0.05f, sets[4].repeat_penalty = 1.3f,
    sets[4].repeat_last_n = -1, sets[4].seed = 4;
    for (const g4_sampling_params& p : sets) {
        g4_session* s = nullptr;
        ASSERT_EQ(g4_session_create(e, nullptr, &s), G4_OK) << g4_last_error_message();
        std::vector<int32_t> fed = {2, 10, 11, 12, 13};
        ASSERT_EQ(g4_session_append_tokens(s, fed.data(), fed.size(), nullptr, 0), G4_OK);
        std::mt19937_64 rng(p.seed);
        std::vector<float> buf(512);
        std::vector<int32_t> idx(512), tmp(512);
        for (int step = 0; step < 24; ++step) {
            int32_t tok = -1, vocab = 0;
            ASSERT_EQ(g4_session_sample(s, &p, &tok), G4_OK) << g4_last_error_message();
            const float* logits = nullptr;
            ASSERT_EQ(g4_session_get_logits(s, &logits, &vocab), G4_OK);
            ASSERT_EQ(vocab, 512);
            const int32_t want = rt::sample_token(logits, vocab, p, fed.data(), (int32_t)fed.size(),
                                                  buf.data(), idx.data(), tmp.data(), rng);
            EXPECT_EQ(tok, want) << "step " << step << ", temperature " << p.temperature;
            fed.push_back(tok);
            ASSERT_EQ(g4_session_append_tokens(s, &tok, 1, nullptr, 0), G4_OK);
        }
        g4_session_destroy(s);
    }
    g4_engine_close(e);
}

// The softmax normalizer of a whole row at Gemma's vocabulary (top-p / min-p without top-k): the
// blocks' (max, sum) merged on the host equal the CPU sampler's normalizer to double rounding.
TEST(GpuSampling, SoftmaxPartialsGiveTheRowNormalizer) {
    NEED_GPU();
    const int vocab = 262144;
    Dev dev;
    std::vector<float> l = randn(vocab, 77, 4.0f);
    CUdeviceptr gl = dev.up(l), out = dev.alloc(cuda_ws::kSoftmaxBlocks * 16);
    for (float temp : {0.7f, 1.0f, 1.6f}) {
        long n = vocab;
        launch("g4_softmax_partial", cuda_ws::kSoftmaxBlocks, 1, 256, {&gl, &n, &temp, &out});
        auto part = dev.down<double>(out, 2 * cuda_ws::kSoftmaxBlocks);
        double mx = -INFINITY, sum = 0, want = 0;
        for (int b = 0; b < cuda_ws::kSoftmaxBlocks; ++b)
            mx = std::max(mx, part[2 * b]);
        for (int b = 0; b < cuda_ws::kSoftmaxBlocks; ++b)
            sum += part[2 * b + 1] * std::exp(part[2 * b] - mx);
        float hmx = -INFINITY;
        for (float v : l)
            hmx = std::max(hmx, v / temp);
        for (float v : l)
            want += std::exp((double)(v / temp) - hmx);
        EXPECT_EQ((float)mx, hmx) << "temperature " << temp;
        EXPECT_NEAR(sum / want, 1.0, 1e-12) << "temperature " << temp;
    }
}

// ---- a whole CUDA plan with a bf16 KV cache (the default): fp32 prefill (kv_store, attention
// partials), decode through the captured graph (QkvPost stores, g4_attn_decode), against the CPU
// plan with a bf16 cache. Both round the same K/V, so the logits agree up to values on a bf16
// rounding boundary (tests/e2e/parity_test.cpp kBf16KvFlips), and the greedy tokens equal HF's.
TEST(CudaPlan, Bf16KvCacheMatchesTheCpuPlan) {
    NEED_GPU();
    g4test::TempDir td;
    for (const std::string fx : {"e2b_tiny", "e4b_tiny"}) {
        const std::string gpu_plan = td.file(fx + "-cuda.g4plan"), cpu_plan = td.file(fx + "-cpu.g4plan");
        const std::string model = " --model '" + g4test::fixture(fx) + "' --weights bf16 --no-fidelity";
        g4test::CmdResult c     = g4test::run_g4("compile" + model +
                                                 " --device cuda --prefill-precision fp32 -o '" + gpu_plan + "'");
        ASSERT_EQ(c.exit_code, 0) << c.err;
        EXPECT_NE(c.err.find("KV cache bf16"), std::string::npos) << c.err;
        c = g4test::run_g4("compile" + model + " --kv-dtype bf16 -o '" + cpu_plan + "'");
        ASSERT_EQ(c.exit_code, 0) << c.err;
        const auto ref =
            nlohmann::json::parse(g4test::read_file(g4test::fixture(fx + "/reference/reference.json")));
        for (const auto& p : ref["prompts"]) {
            std::string ids;
            for (int32_t t : p["ids"].get<std::vector<int32_t>>())
                ids += (ids.empty() ? "" : ",") + std::to_string(t);
            std::vector<float> logits[2];
            std::vector<int32_t> greedy[2];
            for (int d = 0; d < 2; ++d) {
                const std::string dump = td.file("l" + std::to_string(d));
                g4test::CmdResult r =
                    g4test::run_g4("run '" + (d ? gpu_plan : cpu_plan) + "' --tokens " + ids +
                                   " -n 16 --temp 0 --ignore-eos --print-ids --dump-logits '" + dump + "'");
                ASSERT_EQ(r.exit_code, 0) << r.err;
                logits[d] = g4test::read_f32(dump);
                greedy[d] = g4test::parse_ids(r.out);
            }
            ASSERT_EQ(logits[0].size(), logits[1].size());
            const double e = rel(logits[1], logits[0]);
            std::printf("CUDA plan %s bf16 KV, prompt %s: prefill logits rel %.2e vs the CPU plan\n",
                        fx.c_str(), p["name"].get<std::string>().c_str(), e);
            EXPECT_LT(e, 5e-3) << fx;
            EXPECT_EQ(greedy[1], greedy[0]) << fx;
            EXPECT_EQ(greedy[1], p["greedy"].get<std::vector<int32_t>>()) << fx;
        }
        // A long decode through the captured graph: the sliding ring wraps many times.
        std::string ids;
        for (int32_t t : ref["prompts"].back()["ids"].get<std::vector<int32_t>>())
            ids += (ids.empty() ? "" : ",") + std::to_string(t);
        std::vector<int32_t> tokens[2];
        for (int d = 0; d < 2; ++d) {
            g4test::CmdResult r = g4test::run_g4("run '" + (d ? gpu_plan : cpu_plan) + "' --tokens " + ids +
                                                 " -n 200 --temp 0 --ignore-eos --print-ids");
            ASSERT_EQ(r.exit_code, 0) << r.err;
            tokens[d] = g4test::parse_ids(r.out);
        }
        size_t agree = 0;
        while (agree < tokens[0].size() && agree < tokens[1].size() && tokens[0][agree] == tokens[1][agree])
            ++agree;
        std::printf("CUDA plan %s bf16 KV: 200-token greedy decode, first %zu tokens equal the CPU plan's\n",
                    fx.c_str(), agree);
        EXPECT_GE(agree, 64u) << fx;
    }
}

// The tiny fixture fx's NF4 CUDA plan compiled with `flags` (and --mlp-replicas reps when reps > 0): its
// fused MLP records and a 24-step greedy decode of the fixture's last reference prompt (tokens and each
// step's logits).
struct MlpPlanRun {
    std::vector<g4::plan::CudaLaunch> mlps;
    std::vector<float> logits;
    std::vector<int32_t> tokens;
};
void mlp_plan_run(g4test::TempDir& td, const std::string& fx, const std::string& name,
                  const std::string& flags, int reps, MlpPlanRun* out) {
    const auto ref =
        nlohmann::json::parse(g4test::read_file(g4test::fixture(fx + "/reference/reference.json")));
    std::string ids;
    for (int32_t t : ref["prompts"].back()["ids"].get<std::vector<int32_t>>())
        ids += (ids.empty() ? "" : ",") + std::to_string(t);
    const std::string plan = td.file(fx + "-" + name + ".g4plan");
    std::string all        = flags;
    if (reps) all += " --mlp-replicas " + std::to_string(reps);
    g4test::CmdResult c =
        g4test::run_g4("compile --model '" + g4test::fixture(fx) +
                       "' --weights nf4 --no-fidelity --device cuda " + all + " -o '" + plan + "'");
    ASSERT_EQ(c.exit_code, 0) << c.err;
    g4::plan::Plan pl;
    std::string err;
    ASSERT_EQ(pl.load(plan, false, &err), G4_OK) << err;
    for (size_t li = 0; li < pl.n_launches(); ++li)
        if (pl.launch(li).kind == (uint16_t)g4::plan::LaunchKind::Mlp) out->mlps.push_back(pl.launch(li));
    ASSERT_FALSE(out->mlps.empty()) << fx;
    const std::string dump = td.file(fx + "-" + name + "-decode");
    g4test::CmdResult r =
        g4test::run_g4("run '" + plan + "' --tokens " + ids +
                       " -n 24 --temp 0 --ignore-eos --print-ids --dump-decode-logits '" + dump + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    out->logits = g4test::read_f32(dump);
    out->tokens = g4test::parse_ids(r.out);
}

// ---- the fused MLP's output replicas (CudaLaunch ip6, chosen by the compiler; g4 compile --mlp-replicas R
// forces R): each decode MLP adds into R buffers and the ResNorm after it sums them and zeroes them
// again. The tiny fixtures' MLPs get 1 by their shape; plans forced to 2 and 4 (the most) record them and,
// against the plan with 1, every decode step's logits agree to the adds' order (the fused MLP's order
// varies anyway) and the greedy tokens are equal. The activations are rounded to bf16 between kernels,
// so another fp32 order can flip one rounding (2^-8 of an element) that carries into later steps:
// measured 2.5e-5 (e2b_tiny) and 1.0e-4 (e4b_tiny) at R = 4 over 24 steps, hence 1e-3, the level of this
// file's plan-against-plan checks. The plans keep the f32 MLP arithmetic (--mlp-precision f32): the
// packed-f16 one rounds x to f16, so the adds' order flips more roundings (1.3e-3 at R = 2 on an H200;
// MlpF16MatchesF32).
TEST(CudaPlan, MlpReplicasMatchOneOutput) {
    NEED_GPU();
    if (gpu().sm < 90) GTEST_SKIP() << "the fused MLP is scheduled on sm_90 plans only";
    g4test::TempDir td;
    for (const std::string fx : {"e2b_tiny", "e4b_tiny"}) {
        MlpPlanRun runs[3];
        const int reps[3] = {0, 2, 4}; // 0: the compiler's choice
        for (int k = 0; k < 3; ++k) {
            ASSERT_NO_FATAL_FAILURE(mlp_plan_run(td, fx, "r" + std::to_string(reps[k]), "--mlp-precision f32",
                                                 reps[k], &runs[k]));
            for (const g4::plan::CudaLaunch& l : runs[k].mlps)
                EXPECT_EQ(l.ip[6], reps[k] ? reps[k] : 1) << fx;
        }
        for (int k = 1; k < 3; ++k) {
            ASSERT_EQ(runs[k].logits.size(), runs[0].logits.size());
            const double e = rel(runs[k].logits, runs[0].logits);
            std::printf("CUDA plan %s, %d MLP output replicas: decode logits rel %.2e against one\n",
                        fx.c_str(), reps[k], e);
            EXPECT_LT(e, 1e-3) << fx << ", " << reps[k] << " replicas";
            EXPECT_EQ(runs[k].tokens, runs[0].tokens) << fx << ", " << reps[k] << " replicas";
        }
    }
}

// The fused MLP's packed-f16 products (--mlp-precision, plan ip7): default plans take them; against plans
// compiled --mlp-precision f32, 24 greedy decode steps give the same tokens and logits within 1e-2 (each MLP
// output is ~1e-3 off, against bf16's 3.9e-3 rounding; measured 3.8e-3 / 3.6e-3 on an H200).
TEST(CudaPlan, MlpF16MatchesF32) {
    NEED_GPU();
    if (gpu().sm < 90) GTEST_SKIP() << "the fused MLP is scheduled on sm_90 plans only";
    g4test::TempDir td;
    for (const std::string fx : {"e2b_tiny", "e4b_tiny"}) {
        MlpPlanRun f32, f16;
        ASSERT_NO_FATAL_FAILURE(mlp_plan_run(td, fx, "mlp-f32", "--mlp-precision f32", 0, &f32));
        ASSERT_NO_FATAL_FAILURE(mlp_plan_run(td, fx, "mlp-default", "", 0, &f16));
        for (const g4::plan::CudaLaunch& l : f32.mlps)
            EXPECT_EQ(l.ip[7], 0) << fx;
        for (const g4::plan::CudaLaunch& l : f16.mlps)
            EXPECT_EQ(l.ip[7], 1) << fx;
        ASSERT_EQ(f16.logits.size(), f32.logits.size());
        const double e = rel(f16.logits, f32.logits);
        std::printf("CUDA plan %s, packed-f16 MLPs: decode logits rel %.2e against f32\n", fx.c_str(), e);
        EXPECT_LT(e, 1e-2) << fx;
        EXPECT_EQ(f16.tokens, f32.tokens) << fx;
    }
}

// The ResNorm between each MLP and PLE run by the PLE launch (ResNorm record ip1 = 1, g4_ple_res, the MLP
// before it a _z kernel; default plans) against plans compiled with --ple-fold off, with f32 MLP arithmetic:
// every layer's ResNorm folds in the tiny fixtures; 24 greedy steps give the same tokens, the logits agree to
// the adds' order (1e-3, as MlpReplicasMatchOneOutput).
TEST(CudaPlan, PleFoldMatchesUnfolded) {
    NEED_GPU();
    if (gpu().sm < 90) GTEST_SKIP() << "the fused PLE is scheduled on sm_90 plans only";
    g4test::TempDir td;
    for (const std::string fx : {"e2b_tiny", "e4b_tiny"}) {
        MlpPlanRun runs[2];
        for (int fold : {0, 1}) {
            const std::string name = "fold" + std::to_string(fold);
            ASSERT_NO_FATAL_FAILURE(mlp_plan_run(
                td, fx, name, std::string("--mlp-precision f32 --ple-fold ") + (fold ? "on" : "off"), 0,
                &runs[fold]));
            g4::plan::Plan pl;
            std::string err;
            ASSERT_EQ(pl.load(td.file(fx + "-" + name + ".g4plan"), false, &err), G4_OK) << err;
            int folded = 0, ples = 0;
            for (size_t li = 0; li < pl.n_launches(); ++li) {
                folded +=
                    pl.launch(li).kind == (uint16_t)g4::plan::LaunchKind::ResNorm && pl.launch(li).ip[1] == 1;
                ples += pl.launch(li).kind == (uint16_t)g4::plan::LaunchKind::Ple;
            }
            EXPECT_GT(ples, 0) << fx;
            EXPECT_EQ(folded, fold ? ples : 0) << fx;
        }
        ASSERT_EQ(runs[1].logits.size(), runs[0].logits.size());
        const double e = rel(runs[1].logits, runs[0].logits);
        std::printf("CUDA plan %s, ResNorm folded into the PLE: decode logits rel %.2e against unfolded\n",
                    fx.c_str(), e);
        EXPECT_LT(e, 1e-3) << fx;
        EXPECT_EQ(runs[1].tokens, runs[0].tokens) << fx;
    }
}

// The ResNorm making each packed-f16 MLP's input run by the MLP launch (ResNorm record ip1 = 2, the _r
// kernels; an earlier ResNorm zeroes the MLP's output, its ip2) against plans compiled with --mlp-fold off:
// every MLP of the tiny fixtures folds, with one output (then _z_r: the PLE's ResNorm is folded too) and with
// 4 replicas (_rep_r); 24 greedy steps give the same tokens and the logits agree within 5e-3 (the folded
// kernel takes both norms from one pass of four sums, and x is rounded to f16: one flipped rounding is
// carried by later steps, as in MlpF16MatchesF32).
TEST(CudaPlan, MlpFoldMatchesUnfolded) {
    NEED_GPU();
    if (gpu().sm < 90) GTEST_SKIP() << "the fused MLP is scheduled on sm_90 plans only";
    g4test::TempDir td;
    for (const std::string fx : {"e2b_tiny", "e4b_tiny"}) {
        for (int reps : {0, 4}) {
            MlpPlanRun runs[2];
            for (int fold : {0, 1}) {
                const std::string name = "mfold" + std::to_string(fold) + "r" + std::to_string(reps);
                ASSERT_NO_FATAL_FAILURE(mlp_plan_run(
                    td, fx, name, fold ? "--mlp-fold one-wave" : "--mlp-fold off", reps, &runs[fold]));
                g4::plan::Plan pl;
                std::string err;
                ASSERT_EQ(pl.load(td.file(fx + "-" + name + ".g4plan"), false, &err), G4_OK) << err;
                int folded = 0, zeroers = 0, mlps = 0;
                for (size_t li = 0; li < pl.n_launches(); ++li) {
                    const g4::plan::CudaLaunch& l = pl.launch(li);
                    folded += l.kind == (uint16_t)g4::plan::LaunchKind::ResNorm && l.ip[1] == 2;
                    zeroers += l.kind == (uint16_t)g4::plan::LaunchKind::ResNorm && l.ip[2] > 0;
                    mlps += l.kind == (uint16_t)g4::plan::LaunchKind::Mlp;
                }
                EXPECT_GT(mlps, 0) << fx;
                EXPECT_EQ(folded, fold ? mlps : 0) << fx << " replicas " << reps;
                EXPECT_EQ(zeroers, folded) << fx << " replicas " << reps;
            }
            ASSERT_EQ(runs[1].logits.size(), runs[0].logits.size());
            const double e = rel(runs[1].logits, runs[0].logits);
            std::printf("CUDA plan %s, %d MLP replicas, ResNorm folded into the MLP: decode logits rel %.2e "
                        "against unfolded\n",
                        fx.c_str(), reps ? reps : 1, e);
            EXPECT_LT(e, 5e-3) << fx << " replicas " << reps;
            EXPECT_EQ(runs[1].tokens, runs[0].tokens) << fx << " replicas " << reps;
        }
    }
}

// ---- decoding ahead (run_step): greedy tokens fed on the device while the host reads the last one.
// One script of calls on two sessions of one NF4 CUDA plan, G4_DECODE_AHEAD=0 on the first: greedy
// steps, logits read after a step run ahead, a token that is not the argmax, a top-k draw, a reset and
// a second prompt. Every token and logits row must be the plain session's, and the second session
// must have used steps it ran ahead, each with its LM head screened (kernels/cuda/lm_screen.cu); a third,
// on an engine opened with G4_LM_SCREEN=0, runs ahead without screening. --deterministic: on sm_90 the
// default plan's fused MLP adds in a varying order, so two runs may differ in the last bits.
TEST(CudaPlan, DecodeAheadMatchesPlainSteps) {
    NEED_GPU();
    g4test::TempDir td;
    const std::string plan = td.file("e2b-nf4-cuda.g4plan");
    g4test::CmdResult c =
        g4test::run_g4("compile --model '" + g4test::fixture("e2b_tiny") +
                       "' --weights nf4 --no-fidelity --device cuda --deterministic -o '" + plan + "'");
    ASSERT_EQ(c.exit_code, 0) << c.err;
    const auto ref =
        nlohmann::json::parse(g4test::read_file(g4test::fixture("e2b_tiny/reference/reference.json")));
    const auto prompt = ref["prompts"].back()["ids"].get<std::vector<int32_t>>();
    g4_engine *e = nullptr, *e_full = nullptr;
    ASSERT_EQ(g4_engine_open(plan.c_str(), nullptr, &e), G4_OK) << g4_last_error_message();
    setenv("G4_LM_SCREEN", "0", 1);
    ASSERT_EQ(g4_engine_open(plan.c_str(), nullptr, &e_full), G4_OK) << g4_last_error_message();
    unsetenv("G4_LM_SCREEN");
    g4_engine_info info{};
    ASSERT_EQ(g4_engine_get_info(e, &info), G4_OK);
    struct Run {
        std::vector<int32_t> tokens;
        std::vector<std::vector<float>> logits;
        std::vector<int64_t> ahead;    // stats.decode_ahead at the end of each round
        std::vector<int64_t> screened; // stats.lm_screened
    };
    auto script = [&](bool ahead, g4_engine* eng) {
        Run r;
        if (!ahead) setenv("G4_DECODE_AHEAD", "0", 1);
        g4_session* s = nullptr;
        EXPECT_EQ(g4_session_create(eng, nullptr, &s), G4_OK) << g4_last_error_message();
        unsetenv("G4_DECODE_AHEAD");
        if (!s) return r;
        auto keep_logits = [&] {
            const float* l = nullptr;
            int32_t v      = 0;
            EXPECT_EQ(g4_session_get_logits(s, &l, &v), G4_OK) << g4_last_error_message();
            if (l) r.logits.emplace_back(l, l + v);
        };
        g4_sampling_params topk = g4_sampling_params_default();
        topk.temperature = 0.8f, topk.top_k = 8, topk.seed = 5;
        for (int round = 0; round < 2; ++round) {
            EXPECT_EQ(g4_session_append_tokens(s, prompt.data(), prompt.size() - round, nullptr, 0), G4_OK)
                << g4_last_error_message();
            for (int i = 0; i < 48; ++i) {
                int32_t tok = 0;
                EXPECT_EQ(g4_session_sample(s, i == 30 ? &topk : nullptr, &tok), G4_OK)
                    << g4_last_error_message();
                if (i == 20)
                    tok = (tok + 1) % info.vocab_size; // not the argmax: the step run ahead is not this one
                r.tokens.push_back(tok);
                EXPECT_EQ(g4_session_append_tokens(s, &tok, 1, nullptr, 0), G4_OK) << g4_last_error_message();
                if (round == 1 && (i == 10 || i == 47)) keep_logits(); // after a step run ahead
            }
            g4_session_stats st{};
            EXPECT_EQ(g4_session_get_stats(s, &st), G4_OK);
            r.ahead.push_back(st.decode_ahead);
            r.screened.push_back(st.lm_screened);
            if (round == 0) {
                keep_logits();
                EXPECT_EQ(g4_session_reset(s), G4_OK);
            }
        }
        g4_session_destroy(s);
        return r;
    };
    const Run plain = script(false, e), ahead = script(true, e), unscreened = script(true, e_full);
    g4_engine_close(e);
    g4_engine_close(e_full);
    // Step i's sample (i = 0 is the prefill's row, sampled on the host) lets step i's append run step
    // i + 1 ahead. Round 0: used at steps 2-19 and 21-29 (20 fed another token, which still ran 21
    // ahead; the top-k draw at 30 needs step 29's logits: run again, no more ahead this round). Round
    // 1, after the reset: steps 2-10, then the logits read after step 10 ends it.
    EXPECT_EQ(plain.ahead, (std::vector<int64_t>{0, 0}));
    EXPECT_EQ(ahead.ahead, (std::vector<int64_t>{27, 9}));
    EXPECT_EQ(ahead.screened, (std::vector<int64_t>{27, 9}));
    EXPECT_EQ(plain.screened, (std::vector<int64_t>{0, 0}));
    EXPECT_EQ(unscreened.ahead, (std::vector<int64_t>{27, 9}));
    EXPECT_EQ(unscreened.screened, (std::vector<int64_t>{0, 0}));
    EXPECT_EQ(unscreened.tokens, plain.tokens);
    ASSERT_EQ(unscreened.logits.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
        EXPECT_EQ(rel(unscreened.logits[i], plain.logits[i]), 0.0) << "logits read " << i;
    EXPECT_EQ(ahead.tokens, plain.tokens);
    ASSERT_EQ(ahead.logits.size(), 3u);
    ASSERT_EQ(plain.logits.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
        ASSERT_EQ(ahead.logits[i].size(), plain.logits[i].size());
        EXPECT_EQ(rel(ahead.logits[i], plain.logits[i]), 0.0) << "logits read " << i;
    }
}

// ---- residual + norms
class ResNorm : public ::testing::TestWithParam<int> {};
TEST_P(ResNorm, MatchesUnfusedOps) {
    NEED_GPU();
    const int H = GetParam(); // 1534: not a multiple of 4, the scalar path
    Dev dev;
    std::vector<float> x = randn(H, 1), d = randn(H, 2), pw = randn(H, 3), prew = randn(H, 4);
    auto pwb = to_bf16(pw), prewb = to_bf16(prew);
    std::vector<uint16_t> sc = {f32_to_bf16(0.37f)};
    CUdeviceptr gx = dev.up(x), gd = dev.up(d), gpw = dev.up(pwb), gsc = dev.up(sc), gxo = dev.alloc(H * 4),
                gprew = dev.up(prewb), gxn = dev.alloc(H * 4);
    // mode 0: d = rms(d) * pw; x_out = (x + d) * 1 * s; xn = rms(x_out) * prew. 1: no residual branch
    // (x_out = x * s). 2: no xn. 3: mode 0 with d given as d0 and three replicas (g4_resnorm_rep;
    // g4_mlp_nf4_rep's nrep), summed in replica order, which the kernel zeroes. 4: a lone RmsNorm (the first
    // layer's input norm: no d, no scalar, no x_out; xn = rms(x) * prew, against the reference RmsNorm of x).
    // Each at 512 threads, at the fewest the kernel takes (H / 8) and at 1024 (the runtime's launch for H >
    // 2048): one or two float4 a thread, or the scalar path.
    const int kRep        = 3;
    std::vector<float> d0 = randn(H, 5), reps = randn((size_t)kRep * H, 6), dsum(H);
    for (int i = 0; i < H; ++i) {
        dsum[i] = d0[i];
        for (int r = 0; r < kRep; ++r)
            dsum[i] += reps[(size_t)r * H + i];
    }
    CUdeviceptr gd0 = dev.up(d0);
    for (int mode = 0; mode < 5; ++mode)
        for (unsigned block : {512u, (unsigned)(H / 8 + 31) / 32 * 32, 1024u}) {
            std::vector<float> dr = mode == 3 ? dsum : d, xo(H), xn(H);
            if (mode == 1 || mode == 4)
                xo = x;
            else {
                ref::rms_norm({dr.data(), H, pwb.data(), DType::BF16, dr.data(), H, 1, H, H, 1e-6f});
                ref::add({x.data(), H, dr.data(), H, xo.data(), H, 1, H});
            }
            if (mode != 4) ref::scale({xo.data(), H, xo.data(), H, 1, H, 1.0f, sc.data(), DType::BF16, 0.0f});
            ref::rms_norm({xo.data(), H, prewb.data(), DType::BF16, xn.data(), H, 1, H, H, 1e-6f});
            CUdeviceptr dd = mode == 1 || mode == 4 ? 0 : gd, xnp = mode == 2 ? 0 : gxn;
            CUdeviceptr scp = mode == 4 ? 0 : gsc, xop = mode == 4 ? 0 : gxo;
            gpu().d->cuMemsetD8(gxo, 0xff, H * 4);
            int one = 1;
            float f = 1.0f, eps = 1e-6f;
            int h = H;
            gpu().d->cuMemsetD8(gxn, 0xff, H * 4);
            // mode 0 also zeroes a buffer after its reads (the next g4_mlp_nf4's output), here d itself.
            CUdeviceptr gdz = mode == 0 ? dev.up(d) : 0, zero = gdz;
            if (mode == 0) dd = gdz;
            if (mode == 3) dd = gd0;
            CUdeviceptr grep = mode == 3 ? dev.up(reps) : 0;
            int nrep         = mode == 3 ? kRep : 0;
            if (mode == 3)
                launch("g4_resnorm_rep", 1, 1, block,
                       {&gx, &dd, &gpw, &one, &gsc, &one, &f, &gxo, &gprew, &one, &xnp, &h, &eps, &zero,
                        &grep, &nrep});
            else
                launch("g4_resnorm", 1, 1, block,
                       {&gx, &dd, &gpw, &one, &scp, &one, &f, &xop, &gprew, &one, &xnp, &h, &eps, &zero});
            if (mode == 0) {
                const std::vector<float> z = dev.down<float>(gdz, H);
                EXPECT_EQ(std::count(z.begin(), z.end(), 0.0f), H) << "the zeroed buffer, block " << block;
            }
            if (mode == 3) {
                const std::vector<float> z = dev.down<float>(grep, (size_t)kRep * H);
                EXPECT_EQ(std::count(z.begin(), z.end(), 0.0f), (long)kRep * H)
                    << "the replicas, zeroed after their reads, block " << block;
            }
            if (mode == 4) {
                EXPECT_EQ(dev.down<uint32_t>(gxo, 1)[0], 0xffffffffu)
                    << "x_out written without being asked for";
            }
            double e1 = mode == 4 ? 0.0 : rel(dev.down<float>(gxo, H), xo),
                   e2 = mode == 2 ? 0.0 : rel(dev.down<float>(gxn, H), xn);
            std::printf("ResNorm H=%d mode %d block %u: x_out %.2e, xn %.2e\n", H, mode, block, e1, e2);
            EXPECT_LT(e1, 1e-6) << "mode " << mode << " block " << block;
            EXPECT_LT(e2, 1e-6) << "mode " << mode << " block " << block;
            if (mode == 2) {
                EXPECT_EQ(dev.down<uint32_t>(gxn, 1)[0], 0xffffffffu) << "xn written without being asked for";
            }
        }
}
// x nearly cancelling the normalised residual branch (x_out 3-50x smaller than x): a faster ResNorm that
// took sum(x_out^2) from sums over x and d would round relative to sum(x^2), and fails here. Both
// outputs carry the cancellation's own amplification of the inputs' rounding, hence 1e-5.
TEST_P(ResNorm, CancellingResidual) {
    NEED_GPU();
    const int H = GetParam();
    for (float alpha : {0.7f, 0.98f}) {
        Dev dev;
        std::vector<float> d = randn(H, 12), pw = randn(H, 13), prew = randn(H, 14), noise = randn(H, 15);
        auto pwb = to_bf16(pw), prewb = to_bf16(prew);
        std::vector<float> dr = d, x(H), xo(H), xn(H);
        ref::rms_norm({dr.data(), H, pwb.data(), DType::BF16, dr.data(), H, 1, H, H, 1e-6f});
        for (int i = 0; i < H; ++i)
            x[i] = -alpha * dr[i] + 0.01f * noise[i];
        ref::add({x.data(), H, dr.data(), H, xo.data(), H, 1, H});
        ref::rms_norm({xo.data(), H, prewb.data(), DType::BF16, xn.data(), H, 1, H, H, 1e-6f});
        CUdeviceptr gx = dev.up(x), gd = dev.up(d), gpw = dev.up(pwb), gxo = dev.alloc(H * 4),
                    gprew = dev.up(prewb), gxn = dev.alloc(H * 4);
        CUdeviceptr gsc = 0;
        int one         = 1;
        float f = 1.0f, eps = 1e-6f;
        int h               = H;
        CUdeviceptr no_zero = 0;
        launch("g4_resnorm", 1, 1, 512,
               {&gx, &gd, &gpw, &one, &gsc, &one, &f, &gxo, &gprew, &one, &gxn, &h, &eps, &no_zero});
        double e1 = rel(dev.down<float>(gxo, H), xo), e2 = rel(dev.down<float>(gxn, H), xn);
        std::printf("ResNorm H=%d, x = -%.2f rms(d) pw + noise: x_out %.2e, xn %.2e\n", H, alpha, e1, e2);
        EXPECT_LT(e1, 1e-5) << alpha;
        EXPECT_LT(e2, 1e-5) << alpha;
    }
}
INSTANTIATE_TEST_SUITE_P(RealShapes, ResNorm, ::testing::Values(1536, 2560, 1534));

// ---- the per-layer inputs' combination (schedule record PleIn): g4_ple_in against the four reference
// ops it replaces (Scale, RmsNorm over groups of P, Add, Scale), E2B's 35 and E4B's 42 groups of 256 and
// the tiny fixtures' 16, with f32 and bf16 norm weights. Same operation order (powf for the norm): exact
// but for the warp-shuffle sum's order.
TEST(PleIn, MatchesUnfusedOps) {
    NEED_GPU();
    Dev dev;
    struct Case {
        int groups, P;
    };
    for (Case c : {Case{35, 256}, Case{42, 256}, Case{10, 16}, Case{3, 40}})
        for (int wdt : {0, 1}) {
            const int N            = c.groups * c.P;
            std::vector<float> ctx = randn(N, 11), tok = randn(N, 12), w = randn(c.P, 13), want(N);
            const float s1 = 0.0255f, s2 = 0.7071f, eps = 1e-6f;
            std::vector<uint16_t> wb = to_bf16(w);
            std::vector<float> v     = ctx;
            ref::scale({v.data(), N, v.data(), N, 1, N, s1, nullptr, DType::F32, 0.0f});
            ref::rms_norm({v.data(), N, wdt ? (const void*)wb.data() : (const void*)w.data(),
                           wdt ? DType::BF16 : DType::F32, v.data(), N, 1, N, c.P, eps});
            ref::add({v.data(), N, tok.data(), N, want.data(), N, 1, N});
            ref::scale({want.data(), N, want.data(), N, 1, N, s2, nullptr, DType::F32, 0.0f});
            CUdeviceptr gc = dev.up(ctx), gt = dev.up(tok), gw = wdt ? dev.up(wb) : dev.up(w),
                        go = dev.alloc((size_t)N * 4);
            int P          = c.P;
            float a = s1, e = eps, b = s2;
            launch("g4_ple_in", (unsigned)c.groups, 1, (unsigned)(P + 31) / 32 * 32,
                   {&gc, &gw, &wdt, &gt, &go, &P, &a, &e, &b});
            const double err = rel(dev.down<float>(go, N), want);
            std::printf("PleIn %d x %d, %s weight: rel %.2e\n", c.groups, c.P, wdt ? "bf16" : "f32", err);
            EXPECT_LT(err, 1e-6) << c.groups << " x " << c.P << " wdt " << wdt;
        }
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

// ---- embedding gather: rows of a bf16 table (the token embedding, and the per-layer-input table L * 256
// wide), times a scale; several blocks a row past 2048 columns
struct EmbedCase {
    int rows, vocab;
    long cols;
};
class Embed : public ::testing::TestWithParam<EmbedCase> {};
TEST_P(Embed, MatchesGatherBitForBit) {
    NEED_GPU();
    const EmbedCase c = GetParam();
    Dev dev;
    const std::vector<uint16_t> table = to_bf16(randn((size_t)c.vocab * c.cols, 31));
    std::vector<int> ids(c.rows);
    for (int t = 0; t < c.rows; ++t)
        ids[t] = (t * 7919 + 13) % c.vocab;
    const float scale = 39.19183588f;
    long ldy          = c.cols + 32;
    std::vector<float> want((size_t)c.rows * ldy, -7.0f);
    for (int t = 0; t < c.rows; ++t)
        for (long j = 0; j < c.cols; ++j)
            want[(size_t)t * ldy + j] = bf16_to_f32(table[(size_t)ids[t] * c.cols + j]) * scale;
    CUdeviceptr step = dev.step(c.rows, 0, 1), gids = dev.up(ids), gtab = dev.up(table),
                gy = dev.up(std::vector<float>(want.size(), -7.0f));
    int dt         = 1;
    long n         = c.cols;
    float sc       = scale;
    launch("g4_embed", c.rows, (unsigned)((c.cols + 2047) / 2048), 256,
           {&step, &gids, &gtab, &dt, &n, &sc, &gy, &ldy});
    EXPECT_EQ(dev.down<float>(gy, want.size()), want);
}
INSTANTIATE_TEST_SUITE_P(RealShapes, Embed,
                         ::testing::Values(EmbedCase{1, 1000, 1536}, EmbedCase{1, 300, 35 * 256},
                                           EmbedCase{5, 300, 42 * 256}, EmbedCase{3, 1000, 2560},
                                           EmbedCase{2, 100, 2047}),
                         [](const ::testing::TestParamInfo<EmbedCase>& i) {
                             return "rows" + std::to_string(i.param.rows) + "cols" +
                                    std::to_string(i.param.cols);
                         });

// ---- KV store (prefill chunks): rows into the ring, f32 copied, bf16 rounded to nearest even as the
// reference
struct KvCase {
    int rows, width, slots, pos0;
    DType dt;
};
class KvStore : public ::testing::TestWithParam<KvCase> {};
TEST_P(KvStore, MatchesReferenceBitForBit) {
    NEED_GPU();
    const KvCase c = GetParam();
    Dev dev;
    const long ld        = c.width + 64; // a view into a wider activation
    std::vector<float> k = randn((size_t)c.rows * ld, 21), v = randn((size_t)c.rows * ld, 22);
    Cache rk = make_cache(c.dt, std::vector<float>((size_t)c.slots * c.width, 0.0f)), rv = rk;
    ref::kv_store({k.data(), ld, v.data(), ld, rk.data(), rv.data(), c.rows, c.width, c.slots, c.pos0, c.dt});
    CUdeviceptr step = dev.step(c.rows, c.pos0, 1), gk = dev.up(k), gv = dev.up(v),
                gkc = dev.alloc(rk.bytes()), gvc = dev.alloc(rv.bytes());
    int width = c.width, slots = c.slots, kvdt = kvdt_arg(c.dt);
    long ldk = ld;
    launch("g4_kv_store", c.rows, 1, 256, {&step, &gk, &ldk, &gv, &ldk, &gkc, &gvc, &width, &slots, &kvdt});
    if (c.dt == DType::BF16) {
        EXPECT_EQ(bf16_mismatches(dev.down<uint16_t>(gkc, rk.bf16.size()), rk.bf16), 0u);
        EXPECT_EQ(bf16_mismatches(dev.down<uint16_t>(gvc, rv.bf16.size()), rv.bf16), 0u);
    } else {
        EXPECT_EQ(dev.down<float>(gkc, rk.f32.size()), rk.f32);
        EXPECT_EQ(dev.down<float>(gvc, rv.f32.size()), rv.f32);
    }
}
INSTANTIATE_TEST_SUITE_P(
    RealShapes, KvStore,
    ::testing::Values(KvCase{1024, 256, 1535, 1000, DType::BF16}, KvCase{1024, 512, 4096, 3500, DType::BF16},
                      KvCase{300, 1024, 8192, 100, DType::BF16}, KvCase{1, 512, 32912, 32911, DType::BF16},
                      KvCase{1024, 256, 1535, 1000, DType::F32}, KvCase{300, 1024, 8192, 100, DType::F32}),
    [](const ::testing::TestParamInfo<KvCase>& i) {
        const KvCase& c = i.param;
        return "rows" + std::to_string(c.rows) + "w" + std::to_string(c.width) + "slots" +
               std::to_string(c.slots) + "pos" + std::to_string(c.pos0) + "_" + dt_name(c.dt);
    });

// ---- q/k/v post-projection: norms, RoPE, cache store
struct QkvCase {
    int heads, kvh, dim, slots, pos;
    DType dt = DType::F32; // cache
};
class QkvPost : public ::testing::TestWithParam<QkvCase> {};
TEST_P(QkvPost, MatchesUnfusedOps) {
    NEED_GPU();
    const QkvCase c = GetParam();
    Dev dev;
    const int qw = c.heads * c.dim, kw = c.kvh * c.dim;
    std::vector<float> q = randn(qw, 1), k = randn(kw, 2), v = randn(kw, 3), qn = randn(c.dim, 4),
                       kn = randn(c.dim, 5);
    auto qnb = to_bf16(qn), knb = to_bf16(kn);
    std::vector<float> inv(c.dim / 2);
    for (int i = 0; i < c.dim / 2; ++i)
        inv[i] = i < c.dim / 8 ? std::pow(10000.0f, -2.0f * i / c.dim) : 0.0f;
    Cache rkc = make_cache(c.dt, std::vector<float>((size_t)c.slots * kw, 0.0f)), rvc = rkc;
    std::vector<float> rq = q, rk = k, rv = v;
    ref::rms_norm({rq.data(), qw, qnb.data(), DType::BF16, rq.data(), qw, 1, qw, c.dim, 1e-6f});
    ref::rope({rq.data(), qw, inv.data(), 1, c.heads, c.dim, c.pos});
    ref::rms_norm({rk.data(), kw, knb.data(), DType::BF16, rk.data(), kw, 1, kw, c.dim, 1e-6f});
    ref::rope({rk.data(), kw, inv.data(), 1, c.kvh, c.dim, c.pos});
    ref::rms_norm({rv.data(), kw, nullptr, DType::F32, rv.data(), kw, 1, kw, c.dim, 1e-6f});
    ref::kv_store({rk.data(), kw, rv.data(), kw, rkc.data(), rvc.data(), 1, kw, c.slots, c.pos, c.dt});
    CUdeviceptr step = dev.step(1, c.pos, 1), gq = dev.up(q), gqn = dev.up(qnb), gk = dev.up(k),
                gkn = dev.up(knb), gv = dev.up(v), ginv = dev.up(inv), gkc = dev.alloc(rkc.bytes()),
                gvc = dev.alloc(rvc.bytes());
    int wdt = 1, heads = c.heads, kvh = c.kvh, dim = c.dim, slots = c.slots, kvdt = kvdt_arg(c.dt);
    float eps = 1e-6f;
    launch(
        "g4_qkv_post", heads + 2 * kvh, 1, std::max(32, dim / 2),
        {&step, &gq, &gqn, &gk, &gkn, &gv, &wdt, &ginv, &gkc, &gvc, &heads, &kvh, &dim, &slots, &eps, &kvdt});
    double eq = rel(dev.down<float>(gq, qw), rq), ek = rel(rkc.down(dev, gkc), rkc.values()),
           ev = rel(rvc.down(dev, gvc), rvc.values());
    std::printf("QkvPost %d/%d x %d pos %d %s cache: q %.2e k %.2e v %.2e\n", c.heads, c.kvh, c.dim, c.pos,
                dt_name(c.dt), eq, ek, ev);
    EXPECT_LT(eq, 1e-5);
    // bf16: the fp32 values agree to ~1e-6, so at most an element whose value sits on a rounding boundary
    // differs by one bf16 step.
    EXPECT_LT(ek, c.dt == DType::BF16 ? 1e-3 : 1e-5);
    EXPECT_LT(ev, c.dt == DType::BF16 ? 1e-3 : 1e-6);
}
INSTANTIATE_TEST_SUITE_P(RealShapes, QkvPost,
                         ::testing::Values(QkvCase{8, 1, 256, 767, 5000}, QkvCase{8, 1, 512, 8192, 4100},
                                           QkvCase{8, 2, 256, 767, 3}, QkvCase{8, 2, 512, 32912, 32000},
                                           QkvCase{8, 1, 256, 767, 5000, DType::BF16},
                                           QkvCase{8, 1, 512, 8192, 4100, DType::BF16},
                                           QkvCase{8, 2, 256, 767, 3, DType::BF16},
                                           QkvCase{8, 2, 512, 32912, 32000, DType::BF16}),
                         [](const ::testing::TestParamInfo<QkvCase>& i) {
                             const QkvCase& c = i.param;
                             return "h" + std::to_string(c.heads) + "kv" + std::to_string(c.kvh) + "d" +
                                    std::to_string(c.dim) + "pos" + std::to_string(c.pos) +
                                    (c.dt == DType::BF16 ? "_bf16" : "");
                         });

// ---- decode attention (split over keys, grouped by kv head) + merge, and the prefill kernels
struct AttnCase {
    int heads, kvh, dim, slots, window, pos, rows;
    DType dt = DType::F32; // cache
};
std::string attn_case_name(const ::testing::TestParamInfo<AttnCase>& i) {
    const AttnCase& c = i.param;
    return "h" + std::to_string(c.heads) + "kv" + std::to_string(c.kvh) + "d" + std::to_string(c.dim) + "w" +
           std::to_string(c.window) + "pos" + std::to_string(c.pos) + "rows" + std::to_string(c.rows) +
           (c.dt == DType::BF16 ? "_bf16" : "");
}
// The decode attention kernels a case runs (base name `base`): the generic module's, then, where the case's
// group size has a specialised module, its kernel and (head dim 256 or 512, groups of 8 or more:
// decode_attention.cu compiles the _d kernels only there) its kernel for that dim.
std::vector<std::pair<cu::CUmodule, std::string>> decode_attention_kernels(const AttnCase& c,
                                                                           const std::string& base) {
    std::vector<std::pair<cu::CUmodule, std::string>> ks{{gpu().mod, base}};
    if (cu::CUmodule spec = spec_module(c.heads / c.kvh)) {
        ks.push_back({spec, base});
        if ((c.dim == 256 || c.dim == 512) && c.heads / c.kvh >= 8)
            ks.push_back({spec, base + "_d" + std::to_string(c.dim)});
    }
    return ks;
}
// Inputs of a case: q [rows, heads*dim] (rows ending at position pos), K/V caches [slots, kv_heads*dim].
struct AttnData {
    int qw, pos0;
    std::vector<float> q;
    Cache kc, vc;
};
AttnData attn_data(const AttnCase& c) {
    const int qw = c.heads * c.dim, kw = c.kvh * c.dim;
    return {qw, c.pos - c.rows + 1, randn((size_t)c.rows * qw, 1, 0.2f),
            make_cache(c.dt, randn((size_t)c.slots * kw, 2)),
            make_cache(c.dt, randn((size_t)c.slots * kw, 3))};
}
// The inputs on the device and the kernels' scalar arguments (scale 1, row stride heads * dim).
struct AttnDev {
    CUdeviceptr step, q, kc, vc;
    int heads, kvh, dim, slots, window;
    float scale = 1.0f;
    long ld;
    int kvdt;
};
AttnDev attn_dev(Dev& dev, const AttnCase& c, const AttnData& in) {
    return {dev.step(c.rows, in.pos0, c.rows),
            dev.up(in.q),
            in.kc.up(dev),
            in.vc.up(dev),
            c.heads,
            c.kvh,
            c.dim,
            c.slots,
            c.window,
            1.0f,
            in.qw,
            kvdt_arg(c.dt)};
}
// The scalar reference on the given inputs (scale 1): [rows, heads*dim].
std::vector<float> attn_ref(const AttnCase& c, const std::vector<float>& q, const Cache& kc,
                            const Cache& vc) {
    const int qw = c.heads * c.dim;
    std::vector<float> out((size_t)c.rows * qw), scratch(c.slots + 64);
    ref::attention({q.data(), qw, kc.data(), vc.data(), out.data(), qw, c.rows, c.heads, c.kvh, c.dim,
                    c.slots, c.window, c.pos - c.rows + 1, 1.0f, scratch.data(), kc.dt});
    return out;
}

class Attention : public ::testing::TestWithParam<AttnCase> {};
TEST_P(Attention, MatchesReference) {
    NEED_GPU();
    const AttnCase c = GetParam();
    Dev dev;
    const AttnData in             = attn_data(c);
    const std::vector<float> want = attn_ref(c, in.q, in.kc, in.vc);
    const int span                = c.window > 0 ? std::min(c.window, c.slots) : c.slots;
    AttnDev a                     = attn_dev(dev, c, in);
    CUdeviceptr gy                = dev.alloc(want.size() * 4);
    if (c.rows == 1) {
        // The generic kernel, then (where this group size is one) the kernel specialised for it, and for it
        // and the head dim (256, 512).
        int splits       = cuda::decode_attention_splits(span);
        CUdeviceptr part = dev.alloc((size_t)a.heads * splits * (a.dim + 2) * 4);
        for (const auto& [mod, name] :
             decode_attention_kernels(c, a.kvdt ? "g4_attn_decode_bf16" : "g4_attn_decode")) {
            gpu().d->cuMemsetD8(gy, 0xff, want.size() * 4); // NaN: a kernel that writes nothing fails
            launch_in(mod, name.c_str(), a.kvh, splits, 256,
                      {&a.step, &a.q, &a.kc, &a.vc, &a.heads, &a.kvh, &a.dim, &a.slots, &a.window, &a.scale,
                       &splits, &part, &a.kvdt});
            launch("g4_attention_merge", a.heads, (a.dim + 63) / 64, cuda_rt::merge_threads(true),
                   {&a.step, &part, &a.heads, &a.dim, &splits, &gy, &a.ld, &a.window});
            const double e = rel(dev.down<float>(gy, want.size()), want);
            std::printf("Attention %d/%d x %d slots %d window %d pos %d %s cache, %s (%s): rel %.2e\n",
                        c.heads, c.kvh, c.dim, c.slots, c.window, c.pos, dt_name(c.dt), name.c_str(),
                        mod == gpu().mod ? "generic" : "specialised", e);
            EXPECT_LT(e, 1e-5) << name << (mod == gpu().mod ? " generic" : " specialised");
        }
        return;
    } else {
        int splits = std::max(1, std::min(32, (span + 63) / 64)), max_span = span;
        CUdeviceptr part = dev.alloc((size_t)c.rows * a.heads * splits * (a.dim + 2) * 4);
        CUdeviceptr sc =
            dev.alloc((size_t)c.rows * a.heads * splits * ((span + splits - 1) / splits + 1) * 4);
        launch("g4_attention_partial", c.rows * a.heads, splits, 256,
               {&a.step, &a.q, &a.ld, &a.kc, &a.vc, &a.heads, &a.kvh, &a.dim, &a.slots, &a.window, &a.scale,
                &splits, &part, &sc, &max_span, &a.kvdt});
        int all = -1;
        launch("g4_attention_merge", c.rows * a.heads, (a.dim + 63) / 64, 256,
               {&a.step, &part, &a.heads, &a.dim, &splits, &gy, &a.ld, &all});
    }
    double e = rel(dev.down<float>(gy, want.size()), want);
    std::printf("Attention %d/%d x %d slots %d window %d pos %d rows %d %s cache: rel %.2e\n", c.heads, c.kvh,
                c.dim, c.slots, c.window, c.pos, c.rows, dt_name(c.dt), e);
    EXPECT_LT(e, 1e-5);
}
const DType KB = DType::BF16;
INSTANTIATE_TEST_SUITE_P(
    RealShapes, Attention,
    ::testing::Values(AttnCase{8, 1, 256, 767, 512, 0, 1}, AttnCase{8, 1, 256, 767, 512, 100, 1},
                      AttnCase{8, 1, 256, 767, 512, 5000, 1}, AttnCase{8, 1, 512, 32912, 0, 4000, 1},
                      AttnCase{8, 1, 512, 32912, 0, 32000, 1}, AttnCase{8, 2, 256, 767, 512, 3000, 1},
                      AttnCase{8, 2, 512, 8192, 0, 8000, 1}, AttnCase{8, 1, 256, 767, 512, 700, 64},
                      AttnCase{8, 2, 512, 4096, 0, 2000, 64}),
    attn_case_name);
// The same shapes on a bf16 cache (E2B sliding/full, E4B GQA), plus dims the real models do not use.
INSTANTIATE_TEST_SUITE_P(
    RealShapesBf16Cache, Attention,
    ::testing::Values(AttnCase{8, 1, 256, 767, 512, 0, 1, KB}, AttnCase{8, 1, 256, 767, 512, 100, 1, KB},
                      AttnCase{8, 1, 256, 767, 512, 5000, 1, KB}, AttnCase{8, 1, 512, 32912, 0, 4000, 1, KB},
                      AttnCase{8, 1, 512, 131072, 0, 131071, 1, KB},
                      AttnCase{8, 2, 256, 767, 512, 3000, 1, KB}, AttnCase{8, 2, 512, 8192, 0, 8000, 1, KB},
                      AttnCase{8, 1, 256, 767, 512, 700, 64, KB}, AttnCase{8, 2, 512, 4096, 0, 2000, 64, KB},
                      AttnCase{4, 2, 16, 40, 0, 39, 1, KB}, AttnCase{6, 1, 40, 100, 16, 90, 1, KB},
                      AttnCase{4, 1, 24, 50, 0, 45, 7, KB}),
    attn_case_name);

// ---- the decode attention's merge and the o projection in one kernel (g4_attn_o_nf4_g*, sm_90): the
// partials of g4_attn_decode merged 32 columns a block and multiplied by the tiled o weight (kQuantTiled32)
// into a zeroed y, against the reference attention and the o GEMV's reference.
struct AttnOCase {
    const char* name;
    AttnCase a;
    int64_t H;
    bool dq, bias;
};
class AttnO : public ::testing::TestWithParam<AttnOCase> {};
TEST_P(AttnO, MatchesUnfusedReference) {
    NEED_GPU();
    if (gpu().sm < 90) GTEST_SKIP() << "g4_attn_o_nf4 is scheduled on sm_90 plans only";
    const AttnOCase& o = GetParam();
    const AttnCase& c  = o.a;
    const int64_t K    = (int64_t)c.heads * c.dim;
    Dev dev;
    const AttnData in       = attn_data(c);
    AttnDev ad              = attn_dev(dev, c, in);
    Weight w                = make_weight(dev, DType::NF4, o.H, K, 61, o.dq);
    std::vector<float> bias = o.bias ? randn(o.H, 62) : std::vector<float>(o.H, 0.0f);
    std::vector<float> want = w.ref(attn_ref(c, in.q, in.kc, in.vc));
    for (int64_t i = 0; i < o.H; ++i)
        want[i] += bias[i];
    int splits       = cuda::decode_attention_splits(c.window > 0 ? std::min(c.window, c.slots) : c.slots);
    CUdeviceptr part = dev.alloc((size_t)c.heads * splits * (c.dim + 2) * 4);
    launch(ad.kvdt ? "g4_attn_decode_bf16" : "g4_attn_decode", c.kvh, splits, 256,
           {&ad.step, &ad.q, &ad.kc, &ad.vc, &ad.heads, &ad.kvh, &ad.dim, &ad.slots, &ad.window, &ad.scale,
            &splits, &part, &ad.kvdt});
    nf4::Layout l = nf4::layout(o.H * K, o.dq);
    CUdeviceptr t = dev.up(nf4::tile32(w.blob, o.H, K, o.dq)), y = dev.alloc(o.H * 4);
    cuda_rt::AttnOArgsH a{};
    a.step = ad.step, a.part = part, a.codes = t + l.codes_off, a.absmax = t + l.absmax_off;
    if (o.dq) a.absmax2 = t + l.absmax2_off, a.offset = t + l.offset_off, a.code2 = t + l.code2_off;
    a.bias = o.bias ? dev.up(bias) : 0, a.y = y;
    a.H = (int)o.H, a.K = (int)K, a.dim = c.dim, a.splits = splits, a.window = c.window;
    const std::string name = "g4_attn_o_nf4_g" + std::to_string(cuda_rt::slice_row_groups(o.H));
    cu::CUfunction f       = nullptr;
    ASSERT_EQ(gpu().d->cuModuleGetFunction(&f, gpu().mod, name.c_str()), 0);
    ASSERT_EQ(gpu().d->cuFuncSetAttribute(f, cu::kFuncAttrMaxDynamicSmem, (int)cuda_rt::kGemvWideSmem), 0);
    for (int rep = 0; rep < 2; ++rep) { // y zeroed before each launch, as the ResNorm does
        gpu().d->cuMemsetD8(y, 0, o.H * 4);
        launch_smem(name.c_str(), (unsigned)(K / 32), 1, cuda_rt::kSliceThreads, cuda_rt::kGemvWideSmem,
                    {&a});
        const double e = rel(dev.down<float>(y, o.H), want);
        std::printf("AttnO %s (%s, %d splits): rel %.2e\n", o.name, name.c_str(), splits, e);
        EXPECT_LT(e, 2e-5) << o.name;
    }
}
INSTANTIATE_TEST_SUITE_P(
    RealShapes, AttnO,
    ::testing::Values(
        AttnOCase{"e2b_sliding_pos5", {8, 1, 256, 767, 512, 5, 1, KB}, 1536, false, false},
        AttnOCase{"e2b_sliding_pos5000_dq_bias", {8, 1, 256, 767, 512, 5000, 1, KB}, 1536, true, true},
        AttnOCase{"e2b_full_pos4000", {8, 1, 512, 32912, 0, 4000, 1, KB}, 1536, false, false},
        AttnOCase{"e2b_full_pos0_f32_cache", {8, 1, 512, 8192, 0, 0, 1}, 1536, false, true},
        AttnOCase{"e4b_sliding_pos3000", {8, 2, 256, 767, 512, 3000, 1, KB}, 2560, false, false},
        AttnOCase{"e4b_full_pos8000_dq", {8, 2, 512, 8192, 0, 8000, 1, KB}, 2560, true, false},
        AttnOCase{"tiny_full", {4, 1, 32, 100, 0, 60, 1, KB}, 64, true, true},
        AttnOCase{"tiny_e4b_g2", {4, 2, 32, 100, 0, 99, 1}, 96, false, false},
        AttnOCase{"h4096_g4", {8, 1, 512, 300, 0, 200, 1, KB}, 4096, false, true}),
    [](const ::testing::TestParamInfo<AttnOCase>& i) { return std::string(i.param.name); });

// ---- decode attention with the q/k/v post-projection folded in (g4_attn_decode_post, the schedule's
// QkvAttn) against the CPU reference of the unfused ops: q/k norms, RoPE, v norm, the cache store, then
// attention over the updated caches. kv = false: a KV-shared layer (q only; the caches are read as they are).
struct QkvAttnCase {
    AttnCase a;
    bool kv;
};
class QkvAttn : public ::testing::TestWithParam<QkvAttnCase> {};
TEST_P(QkvAttn, MatchesUnfusedReference) {
    NEED_GPU();
    const AttnCase c = GetParam().a;
    const bool kv    = GetParam().kv;
    Dev dev;
    AttnData in  = attn_data(c);
    const int qw = c.heads * c.dim, kw = c.kvh * c.dim;
    std::vector<float> k = randn(kw, 12), v = randn(kw, 13), qn = randn(c.dim, 14), kn = randn(c.dim, 15);
    auto qnb = to_bf16(qn), knb = to_bf16(kn);
    std::vector<float> inv(c.dim / 2);
    for (int i = 0; i < c.dim / 2; ++i)
        inv[i] = i < c.dim / 8 ? std::pow(10000.0f, -2.0f * i / c.dim) : 0.0f; // partial rotary
    std::vector<float> rq = in.q, rk = k, rv = v;
    Cache rkc = in.kc, rvc = in.vc;
    ref::rms_norm({rq.data(), qw, qnb.data(), DType::BF16, rq.data(), qw, 1, qw, c.dim, 1e-6f});
    ref::rope({rq.data(), qw, inv.data(), 1, c.heads, c.dim, c.pos});
    if (kv) {
        ref::rms_norm({rk.data(), kw, knb.data(), DType::BF16, rk.data(), kw, 1, kw, c.dim, 1e-6f});
        ref::rope({rk.data(), kw, inv.data(), 1, c.kvh, c.dim, c.pos});
        ref::rms_norm({rv.data(), kw, nullptr, DType::F32, rv.data(), kw, 1, kw, c.dim, 1e-6f});
        ref::kv_store({rk.data(), kw, rv.data(), kw, rkc.data(), rvc.data(), 1, kw, c.slots, c.pos, c.dt});
    }
    const std::vector<float> want = attn_ref(c, rq, rkc, rvc);
    AttnDev a                     = attn_dev(dev, c, in);
    const int span                = c.window > 0 ? std::min(c.window, c.slots) : c.slots;
    int splits                    = cuda::decode_attention_splits(span);
    CUdeviceptr part = dev.alloc((size_t)a.heads * splits * (a.dim + 2) * 4), gy = dev.alloc(want.size() * 4);
    cuda_rt::AttnPostH pa{
        kv ? dev.up(k) : 0, kv ? dev.up(v) : 0, dev.up(qnb), dev.up(knb), dev.up(inv), 1, 1e-6f};
    // The generic kernel, then (where this group size is one) the kernel specialised for it, and for it and
    // the head dim (256, 512), each on fresh copies of the caches.
    for (const auto& [mod, name] :
         decode_attention_kernels(c, a.kvdt ? "g4_attn_decode_post_bf16" : "g4_attn_decode_post")) {
        const std::string kind = name + (mod == gpu().mod ? " generic" : " specialised");
        if (mod != gpu().mod) a.kc = in.kc.up(dev), a.vc = in.vc.up(dev);
        gpu().d->cuMemsetD8(gy, 0xff, want.size() * 4);
        launch_in(mod, name.c_str(), a.kvh, splits, 256,
                  {&a.step, &a.q, &a.kc, &a.vc, &a.heads, &a.kvh, &a.dim, &a.slots, &a.window, &a.scale,
                   &splits, &part, &a.kvdt, &pa});
        launch("g4_attention_merge", a.heads, (a.dim + 63) / 64, cuda_rt::merge_threads(true),
               {&a.step, &part, &a.heads, &a.dim, &splits, &gy, &a.ld, &a.window});
        const double e  = rel(dev.down<float>(gy, want.size()), want);
        const double ek = rel(rkc.down(dev, a.kc), rkc.values()), ev = rel(rvc.down(dev, a.vc), rvc.values());
        std::printf(
            "QkvAttn %d/%d x %d slots %d window %d pos %d %s cache%s, %s: out %.2e, caches k %.2e v %.2e\n",
            c.heads, c.kvh, c.dim, c.slots, c.window, c.pos, dt_name(c.dt), kv ? "" : " (q only)",
            kind.c_str(), e, ek, ev);
        // bf16: a new k/v element on a rounding boundary may round the other way (one bf16 step).
        EXPECT_LT(e, c.dt == DType::BF16 ? 1e-4 : 1e-5) << kind;
        EXPECT_LT(ek, c.dt == DType::BF16 ? 1e-4 : 1e-6) << kind;
        EXPECT_LT(ev, c.dt == DType::BF16 ? 1e-4 : 1e-6) << kind;
        if (!kv) {
            EXPECT_EQ(ek + ev, 0.0) << "a q-only launch wrote the caches (" << kind << ")";
        }
    }
}
INSTANTIATE_TEST_SUITE_P(RealShapes, QkvAttn,
                         ::testing::Values(QkvAttnCase{{8, 1, 256, 767, 512, 0, 1}, true},
                                           QkvAttnCase{{8, 1, 256, 767, 512, 5000, 1}, true},
                                           QkvAttnCase{{8, 1, 512, 32912, 0, 4000, 1}, true},
                                           QkvAttnCase{{8, 2, 256, 767, 512, 3000, 1}, true},
                                           QkvAttnCase{{8, 2, 512, 8192, 0, 8000, 1}, true},
                                           QkvAttnCase{{8, 1, 256, 767, 512, 700, 1}, false},
                                           QkvAttnCase{{8, 1, 256, 767, 512, 100, 1, KB}, true},
                                           QkvAttnCase{{8, 1, 256, 767, 512, 5000, 1, KB}, true},
                                           QkvAttnCase{{8, 1, 512, 32912, 0, 32000, 1, KB}, true},
                                           QkvAttnCase{{8, 2, 256, 767, 512, 3000, 1, KB}, true},
                                           QkvAttnCase{{8, 1, 512, 32912, 0, 4000, 1, KB}, false},
                                           QkvAttnCase{{8, 1, 256, 767, 512, 700, 1, KB}, false},
                                           QkvAttnCase{{8, 1, 256, 767, 512, 3, 1, KB}, false},
                                           QkvAttnCase{{4, 2, 16, 40, 0, 39, 1, KB}, true},
                                           QkvAttnCase{{6, 1, 40, 100, 16, 90, 1, KB}, true}),
                         [](const ::testing::TestParamInfo<QkvAttnCase>& i) {
                             return attn_case_name({i.param.a, i.index}) + (i.param.kv ? "" : "_qonly");
                         });

// ---- prefill flash attention (tensor cores): q, K and V rounded to bf16 as the kernel stages them, so
// against the reference on the rounded inputs only P's rounding and the summation order differ. A bf16
// cache holds the rounded values already: the kernel copies them and gives the same bits as from an
// fp32 cache of the same values.
class FlashAttention : public ::testing::TestWithParam<AttnCase> {};
std::vector<float> run_flash(Dev& dev, const AttnCase& c, const AttnDev& a0) {
    AttnDev a               = a0;
    CUdeviceptr gy          = dev.up(std::vector<float>((size_t)c.rows * a.heads * a.dim, 7.0f));
    cuda_rt::FlashLaunch fl = cuda_rt::flash_launch(c.rows, a.heads, a.kvh, c.dim);
    cu::CUfunction f        = nullptr;
    EXPECT_EQ(gpu().d->cuModuleGetFunction(&f, gpu().mod, cuda_rt::flash_kernel_name(c.dim).c_str()), 0);
    EXPECT_EQ(gpu().d->cuFuncSetAttribute(f, cu::kFuncAttrMaxDynamicSmem, (int)fl.smem), 0);
    void* args[] = {&a.step,  &a.q,      &a.ld,    &a.kc, &a.vc, &a.heads, &a.kvh,
                    &a.slots, &a.window, &a.scale, &gy,   &a.ld, &a.kvdt};
    EXPECT_EQ(gpu().d->cuLaunchKernel(f, fl.gx, fl.gy, 1, fl.block, 1, 1, fl.smem, nullptr, args, nullptr),
              0);
    EXPECT_EQ(gpu().d->cuStreamSynchronize(nullptr), 0);
    return dev.down<float>(gy, (size_t)c.rows * a.heads * a.dim);
}
TEST_P(FlashAttention, MatchesReference) {
    NEED_GPU();
    const AttnCase c = GetParam();
    Dev dev;
    const AttnData in = attn_data(c);
    auto round        = [](std::vector<float> v) {
        for (float& x : v)
            x = bf16_to_f32(f32_to_bf16(x));
        return v;
    };
    const Cache rk = make_cache(DType::BF16, in.kc.f32), rv = make_cache(DType::BF16, in.vc.f32);
    const std::vector<float> want = attn_ref(c, round(in.q), rk, rv), exact = attn_ref(c, in.q, in.kc, in.vc);
    std::vector<float> got = run_flash(dev, c, attn_dev(dev, c, in));
    double e = rel(got, want), e32 = rel(got, exact), base = rel(want, exact);
    std::printf("FlashAttention %d/%d x %d slots %d window %d pos %d rows %d %s cache: rel %.2e vs "
                "bf16-input reference, %.2e vs "
                "fp32 (inputs alone: %.2e)\n",
                c.heads, c.kvh, c.dim, c.slots, c.window, c.pos, c.rows, dt_name(c.dt), e, e32, base);
    EXPECT_LT(e, 4e-3);
    EXPECT_LT(e32, 2 * base + 4e-3);
    if (c.dt == DType::BF16) { // the same values from an fp32 cache: identical output
        AttnCase c32  = c;
        c32.dt        = DType::F32;
        AttnData in32 = in;
        in32.kc = make_cache(DType::F32, in.kc.f32), in32.vc = make_cache(DType::F32, in.vc.f32);
        EXPECT_EQ(run_flash(dev, c32, attn_dev(dev, c32, in32)), got);
    }
}
// Bidirectional mode (window < 0, the vision tower): every query sees keys 0..rows-1 (slots = rows, pos0
// 0). Reference: each query row alone as the last position of a causal span over all rows, on the
// bf16-rounded inputs. Shapes: the real E2B/E4B vision tower at 280 and 70 soft tokens (2520 / 630
// patches, 12 heads of 64), the tiny fixture's, and a ragged one.
class FlashBidirectional : public ::testing::TestWithParam<AttnCase> {};
TEST_P(FlashBidirectional, MatchesReference) {
    NEED_GPU();
    AttnCase c = GetParam();
    Dev dev;
    c.slots = c.rows, c.pos = c.rows - 1;
    const AttnData in = attn_data(c);
    auto round        = [](std::vector<float> v) {
        for (float& x : v)
            x = bf16_to_f32(f32_to_bf16(x));
        return v;
    };
    const std::vector<float> q = round(in.q);
    const Cache rk = make_cache(DType::BF16, in.kc.f32), rv = make_cache(DType::BF16, in.vc.f32);
    const int qw = c.heads * c.dim;
    std::vector<float> want((size_t)c.rows * qw), scratch(c.slots + 64);
    for (int t = 0; t < c.rows; ++t)
        ref::attention({q.data() + (size_t)t * qw, qw, rk.data(), rv.data(), want.data() + (size_t)t * qw, qw,
                        1, c.heads, c.kvh, c.dim, c.slots, 0, c.rows - 1, 1.0f, scratch.data(), rk.dt});
    AttnDev a                    = attn_dev(dev, c, in);
    a.step                       = dev.step(c.rows, 0, c.rows);
    a.window                     = -1;
    const std::vector<float> got = run_flash(dev, c, a);
    const double e               = rel(got, want);
    std::printf("FlashBidirectional %d/%d x %d rows %d: rel %.2e vs the bf16-input reference\n", c.heads,
                c.kvh, c.dim, c.rows, e);
    EXPECT_LT(e, 4e-3);
}
INSTANTIATE_TEST_SUITE_P(VisionShapes, FlashBidirectional,
                         ::testing::Values(AttnCase{12, 12, 64, 0, -1, 0, 2520},
                                           AttnCase{12, 12, 64, 0, -1, 0, 630},
                                           AttnCase{2, 2, 16, 0, -1, 0, 576},
                                           AttnCase{4, 2, 32, 0, -1, 0, 37}),
                         [](const ::testing::TestParamInfo<AttnCase>& i) {
                             return "h" + std::to_string(i.param.heads) + "kv" + std::to_string(i.param.kvh) +
                                    "d" + std::to_string(i.param.dim) + "rows" + std::to_string(i.param.rows);
                         });
INSTANTIATE_TEST_SUITE_P(
    RealShapes, FlashAttention,
    ::testing::Values(AttnCase{8, 1, 256, 767, 512, 700, 256}, AttnCase{8, 1, 256, 767, 512, 255, 256},
                      AttnCase{8, 1, 512, 4096, 0, 2047, 256}, AttnCase{8, 2, 256, 1535, 512, 3000, 1024},
                      AttnCase{8, 2, 512, 8192, 0, 4095, 300}, AttnCase{4, 1, 16, 71, 8, 70, 64},
                      AttnCase{4, 2, 32, 300, 0, 200, 37}, AttnCase{3, 1, 64, 200, 40, 150, 100},
                      AttnCase{8, 8, 128, 300, 0, 299, 90}),
    attn_case_name);
INSTANTIATE_TEST_SUITE_P(RealShapesBf16Cache, FlashAttention,
                         ::testing::Values(AttnCase{8, 1, 256, 767, 512, 700, 256, KB},
                                           AttnCase{8, 1, 256, 767, 512, 255, 256, KB},
                                           AttnCase{8, 1, 512, 4096, 0, 2047, 256, KB},
                                           AttnCase{8, 2, 256, 1535, 512, 3000, 1024, KB},
                                           AttnCase{8, 2, 512, 8192, 0, 4095, 300, KB},
                                           AttnCase{4, 1, 16, 71, 8, 70, 64, KB},
                                           AttnCase{4, 2, 32, 300, 0, 200, 37, KB},
                                           AttnCase{3, 1, 64, 200, 40, 150, 100, KB},
                                           AttnCase{8, 8, 128, 300, 0, 299, 90, KB}),
                         attn_case_name);

// ---- prefill GEMM tiers: the cuBLAS tier's converters (bit-exact) and GEMM, the tensor-core kernel
TEST(PrefillGemm, Nf4ToBf16IsExact) {
    NEED_GPU();
    Dev dev;
    for (bool dq : {false, true}) {
        Weight w        = make_weight(dev, DType::NF4, 2048, 1536, 11, dq);
        nf4::Layout l   = nf4::layout(w.n * w.k, dq);
        long n          = w.n * w.k;
        CUdeviceptr out = dev.alloc(n * 2), codes = w.dev + l.codes_off, am = w.dev + l.absmax_off;
        CUdeviceptr am2 = dq ? w.dev + l.absmax2_off : 0, off = dq ? w.dev + l.offset_off : 0,
                    c2 = dq ? w.dev + l.code2_off : 0;
        int row_major  = 0;
        launch("g4_nf4_to_bf16", (unsigned)((n / 32 + 255) / 256), 1, 256,
               {&codes, &am, &am2, &off, &c2, &n, &out, &row_major});
        std::vector<float> f(n);
        nf4::dequantize(w.blob.data(), l, 0, n, f.data());
        std::vector<uint16_t> got = dev.down<uint16_t>(out, n);
        size_t bad                = 0;
        for (long i = 0; i < n; ++i)
            bad += got[i] != f32_to_bf16(f[i]);
        EXPECT_EQ(bad, 0u) << "double quant " << dq;
        // The same matrix tiled for g4_mlp_nf4 (plan kQuantTiled32) untiles to the row-major codes and
        // absmax.
        const std::vector<uint8_t> tb = nf4::tile32(w.blob, w.n, w.k, dq);
        CUdeviceptr t = dev.up(tb), tc = t + l.codes_off, ta = t + l.absmax_off,
                    uc = dev.alloc(l.codes_bytes), ua = dev.alloc((size_t)(n / 64) * (dq ? 1 : 4));
        int idq = dq, H = (int)w.n, I = (int)w.k;
        launch("g4_nf4_untile32", (unsigned)((n / 32 + 255) / 256), 1, 256,
               {&tc, &ta, &idq, &H, &I, &uc, &ua});
        EXPECT_EQ(
            dev.down<uint8_t>(uc, l.codes_bytes),
            std::vector<uint8_t>(w.blob.begin() + l.codes_off, w.blob.begin() + l.codes_off + l.codes_bytes))
            << "codes, double quant " << dq;
        const size_t ab = (size_t)(n / 64) * (dq ? 1 : 4);
        EXPECT_EQ(dev.down<uint8_t>(ua, ab),
                  std::vector<uint8_t>(w.blob.begin() + l.absmax_off, w.blob.begin() + l.absmax_off + ab))
            << "absmax, double quant " << dq;
        // ... and dequantizes in place to the same bf16 matrix (the cuBLAS tier's path for it).
        CUdeviceptr tout = dev.alloc(n * 2), ta2 = dq ? t + l.absmax2_off : 0,
                    toff = dq ? t + l.offset_off : 0, tc2 = dq ? t + l.code2_off : 0;
        launch("g4_nf4_to_bf16", (unsigned)((n / 32 + 255) / 256), 1, 256,
               {&tc, &ta, &ta2, &toff, &tc2, &n, &tout, &H});
        EXPECT_EQ(dev.down<uint16_t>(tout, n), got) << "tiled, double quant " << dq;
    }
}

TEST(PrefillGemm, CublasAndTensorCoreMatchBf16Reference) {
    NEED_GPU();
    Dev dev;
    const int T = 200, N = 2048, K = 1536;
    Weight w             = make_weight(dev, DType::NF4, N, K, 12);
    std::vector<float> x = randn((size_t)T * K, 13);
    // Reference: bf16-rounded operands, fp32 products.
    std::vector<float> wf((size_t)N * K), xr(x.size());
    nf4::dequantize(w.blob.data(), nf4::layout((int64_t)N * K, false), 0, (int64_t)N * K, wf.data());
    std::vector<uint16_t> wb = to_bf16(wf);
    for (size_t i = 0; i < x.size(); ++i)
        xr[i] = bf16_to_f32(f32_to_bf16(x[i]));
    std::vector<float> want((size_t)T * N);
    ref::matmul({xr.data(), K, wb.data(), DType::BF16, N, K, want.data(), N, T});
    CUdeviceptr step = dev.step(T, 0, 1), gx = dev.up(x), gy = dev.alloc(want.size() * 4);
    nf4::Layout l     = nf4::layout((int64_t)N * K, false);
    CUdeviceptr codes = w.dev + l.codes_off, am = w.dev + l.absmax_off, z = 0;
    int mode = 0, n = N, k = K;
    long ldx = K, ldy = N;
    launch("g4_tc_gemm_nf4", N / 64, (T + 63) / 64, 128,
           {&step, &mode, &gx, &ldx, &codes, &am, &z, &z, &z, &n, &k, &gy, &ldy, &z});
    double e_tc = rel(dev.down<float>(gy, want.size()), want);
    std::printf("tensor-core NF4 GEMM %dx%dx%d: rel %.2e\n", T, N, K, e_tc);
    EXPECT_LT(e_tc, 1e-5);

    std::string why;
    const cublas::Lib* b = cublas::lib(&why);
    if (!b) {
        std::printf("cuBLAS tier not checked: %s\n", why.c_str());
        return;
    }
    cublas::Handle h = nullptr;
    ASSERT_EQ(b->create(&h), 0);
    CUdeviceptr xs = dev.alloc((size_t)T * K * 2), ws = dev.alloc((size_t)N * K * 2);
    long numel = (long)N * K;
    launch("g4_f32_to_bf16", T, (K + 1023) / 1024, 256, {&step, &gx, &ldx, &xs, &k});
    int row_major = 0;
    launch("g4_nf4_to_bf16", (unsigned)((numel / 32 + 255) / 256), 1, 256,
           {&codes, &am, &z, &z, &z, &numel, &ws, &row_major});
    const float one = 1.0f, zero = 0.0f;
    ASSERT_EQ(b->gemm_ex(h, cublas::kOpT, cublas::kOpN, N, T, K, &one, (const void*)ws, cublas::kR16BF, K,
                         (const void*)xs, cublas::kR16BF, K, &zero, (void*)gy, cublas::kR32F, N,
                         cublas::kCompute32F, cublas::kGemmDefault),
              0);
    ASSERT_EQ(gpu().d->cuStreamSynchronize(nullptr), 0);
    double e_bl = rel(dev.down<float>(gy, want.size()), want);
    std::printf("cuBLAS tier NF4 GEMM %dx%dx%d: rel %.2e\n", T, N, K, e_bl);
    EXPECT_LT(e_bl, 1e-5);
    b->destroy(h);
}

// ---- the audio tower's kernels (g4_at_*) against the CPU tower's loops (runtime/src/towers/audio.cpp),
// written out here, at the real E2B/E4B shapes: 128 mel bins, SSCP channels 128 / 32, hidden 1024, 8 heads
// of 128, a 12-key window with 13 relative positions, depthwise kernel 5. fp32 throughout: the kernels
// differ from the loops only in summation order.

std::vector<float> widen(const std::vector<uint16_t>& b) {
    std::vector<float> v(b.size());
    for (size_t i = 0; i < b.size(); ++i)
        v[i] = bf16_to_f32(b[i]);
    return v;
}

// AudioTower::conv_layer: 3x3 stride-2 conv (w [c_out, c_in, 3, 3]), LayerNorm over channels, ReLU.
std::vector<float> conv_loops(const std::vector<float>& in, int t_valid, int f_in, int c_in,
                              const std::vector<float>& w, const std::vector<float>& norm, float eps,
                              int t_out, int f_out, int c_out) {
    std::vector<float> out((size_t)t_out * f_out * c_out);
    for (int t = 0; t < t_out; ++t)
        for (int f = 0; f < f_out; ++f) {
            float* y = out.data() + ((size_t)t * f_out + f) * c_out;
            for (int co = 0; co < c_out; ++co) {
                float acc = 0;
                for (int ci = 0; ci < c_in; ++ci)
                    for (int r = 0; r < 9; ++r) {
                        const int ti = 2 * t - 1 + r / 3, fi = 2 * f - 1 + r % 3;
                        if (ti >= 0 && ti < t_valid && fi >= 0 && fi < f_in)
                            acc += w[((size_t)co * c_in + ci) * 9 + r] *
                                   in[((size_t)ti * f_in + fi) * c_in + ci];
                    }
                y[co] = acc;
            }
            double mean = 0, var = 0;
            for (int c = 0; c < c_out; ++c)
                mean += y[c];
            mean /= c_out;
            for (int c = 0; c < c_out; ++c)
                var += (y[c] - mean) * (y[c] - mean);
            var /= c_out;
            const float r = (float)(1.0 / std::sqrt(var + eps));
            for (int c = 0; c < c_out; ++c)
                y[c] = std::max(0.0f, ((y[c] - (float)mean) * r) * norm[c]);
        }
    return out;
}

TEST(AudioTowerKernels, SubsampleConvsMatchTheLoops) {
    NEED_GPU();
    Dev dev;
    int V0 = 101, M = 128, C0 = 128, C1 = 32, V1 = (V0 + 1) / 2, T = (V1 + 1) / 2, F1 = 64, F2 = 32, one = 1,
        bf                        = 1;
    float eps                     = 1e-6f;
    const std::vector<float> feat = randn((size_t)V0 * M, 11);
    const auto w0 = to_bf16(randn((size_t)C0 * 9, 12, 0.3f)), n0 = to_bf16(randn(C0, 13, 1.0f));
    const auto w1 = to_bf16(randn((size_t)C1 * C0 * 9, 14, 0.05f)), n1 = to_bf16(randn(C1, 15, 1.0f));
    const std::vector<float> l0 = conv_loops(feat, V0, M, 1, widen(w0), widen(n0), eps, V1, F1, C0);
    const std::vector<float> l1 = conv_loops(l0, V1, F1, C0, widen(w1), widen(n1), eps, T, F2, C1);
    CUdeviceptr dfeat = dev.up(feat), dw0 = dev.up(w0), dn0 = dev.up(n0), dw1 = dev.up(w1), dn1 = dev.up(n1);
    CUdeviceptr dl0 = dev.alloc(l0.size() * 4), dl1 = dev.alloc(l1.size() * 4);
    launch_smem("g4_at_conv", V1, F1, 256, 4 * (9 + C0),
                {&dfeat, &V0, &M, &one, &dw0, &bf, &dn0, &bf, &eps, &dl0, &F1, &C0});
    launch_smem("g4_at_conv", T, F2, 256, 4 * (9 * C0 + C1),
                {&dl0, &V1, &F1, &C0, &dw1, &bf, &dn1, &bf, &eps, &dl1, &F2, &C1});
    const double e0 = rel(dev.down<float>(dl0, l0.size()), l0);
    // The second conv from the first's loop output, so that its error is its own.
    CUdeviceptr dl0r = dev.up(l0);
    launch_smem("g4_at_conv", T, F2, 256, 4 * (9 * C0 + C1),
                {&dl0r, &V1, &F1, &C0, &dw1, &bf, &dn1, &bf, &eps, &dl1, &F2, &C1});
    const double e1 = rel(dev.down<float>(dl1, l1.size()), l1);
    std::printf("audio SSCP conv 0 [%d, %d, %d]: rel %.2e; conv 1 [%d, %d, %d]: rel %.2e\n", V1, F1, C0, e0,
                T, F2, C1, e1);
    EXPECT_LT(e0, 1e-5);
    EXPECT_LT(e1, 1e-5);
}

TEST(AudioTowerKernels, ChunkedAttentionMatchesTheLoops) {
    NEED_GPU();
    Dev dev;
    int T = 750, H = 1024, NH = 8, D = 128, W = 12, NR = 13, bf = 1;
    float cap            = 50.0f;
    std::vector<float> q = randn((size_t)T * H, 21, 2.0f), k = randn((size_t)T * H, 22, 2.0f),
                       v           = randn((size_t)T * H, 23);
    const std::vector<float> rel_k = randn((size_t)NR * H, 24, 2.0f);
    const auto pds                 = to_bf16(randn(D, 25, 2.0f));
    // q/k scaling (softplus of per_dim_scale; one value above torch's threshold of 20).
    std::vector<uint16_t> pd = pds;
    pd[3]                    = f32_to_bf16(25.0f);
    const float q_scale      = (float)(std::pow((double)D, -0.5) / std::log(2.0)),
                k_scale      = (float)(std::log1p(std::exp(1.0)) / std::log(2.0));
    CUdeviceptr dq = dev.up(q), dk = dev.up(k), dv = dev.up(v), drel = dev.up(rel_k), dpd = dev.up(pd),
                dout = dev.alloc(q.size() * 4);
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < H; ++i) {
            const double p       = bf16_to_f32(pd[i % D]);
            const float sp       = (float)(p > 20.0 ? p : std::log1p(std::exp(p)));
            q[(size_t)t * H + i] = q[(size_t)t * H + i] * q_scale * sp;
            k[(size_t)t * H + i] = k[(size_t)t * H + i] * k_scale;
        }
    float qs = q_scale, ks = k_scale;
    launch("g4_at_qk_scale", T, (H + 255) / 256, 256, {&dq, &dk, &H, &D, &dpd, &bf, &qs, &ks});
    const double eq = rel(dev.down<float>(dq, q.size()), q), ek = rel(dev.down<float>(dk, k.size()), k);
    // AudioTower::attention's loop over (t, h).
    std::vector<float> want((size_t)T * H), logit(W);
    for (int t = 0; t < T; ++t)
        for (int h = 0; h < NH; ++h) {
            const int j0    = std::max(0, t - W + 1);
            const float* qh = q.data() + (size_t)t * H + h * D;
            float mx        = -INFINITY;
            for (int j = j0; j <= t; ++j) {
                const float* kh = k.data() + (size_t)j * H + h * D;
                float ac = 0, bd = 0;
                for (int d = 0; d < D; ++d)
                    ac += qh[d] * kh[d];
                const int p = W - (t - j);
                if (p < NR)
                    for (int d = 0; d < D; ++d)
                        bd += qh[d] * rel_k[(size_t)p * H + h * D + d];
                logit[j - j0] = std::tanh((ac + bd) / cap) * cap;
                mx            = std::max(mx, logit[j - j0]);
            }
            float sum = 0;
            for (int i = 0; i <= t - j0; ++i)
                sum += (logit[i] = std::exp(logit[i] - mx));
            float* oh = want.data() + (size_t)t * H + h * D;
            for (int j = j0; j <= t; ++j)
                for (int d = 0; d < D; ++d)
                    oh[d] += logit[j - j0] / sum * v[(size_t)j * H + h * D + d];
        }
    // The kernel from the loops' scaled q and k (each kernel's error its own).
    CUdeviceptr dqs = dev.up(q), dks = dev.up(k);
    launch_smem("g4_at_attention", T, NH, 32, 4 * W, {&dqs, &dks, &dv, &drel, &H, &D, &W, &NR, &cap, &dout});
    const double ea = rel(dev.down<float>(dout, want.size()), want);
    std::printf("audio q/k scaling: rel %.2e / %.2e; chunked attention %d x %d heads of %d: rel %.2e\n", eq,
                ek, T, NH, D, ea);
    EXPECT_LT(eq, 1e-6);
    EXPECT_LT(ek, 1e-6);
    EXPECT_LT(ea, 1e-5);
}

TEST(AudioTowerKernels, NormsLightConvAndResidualsMatchTheLoops) {
    NEED_GPU();
    Dev dev;
    int T = 300, H = 1024, K = 5, P = 1536, bf = 1;
    long ldH = H, ldP = P;
    float eps = 1e-6f, clip = 1.5f;
    const std::vector<float> x = randn((size_t)T * H, 31), big = randn((size_t)T * 2 * H, 32);
    const auto w = to_bf16(randn(H, 33, 1.0f)), dw = to_bf16(randn((size_t)H * K, 34, 0.5f)),
               bias             = to_bf16(randn(P, 35, 1.0f));
    const std::vector<float> wf = widen(w), dwf = widen(dw), bf_ = widen(bias);
    // RMS with the gradient clip (clamps before the norm, as HF) and a weight; without either.
    std::vector<float> r1((size_t)T * H), r2((size_t)T * H);
    for (int t = 0; t < T; ++t) {
        double s1 = 0, s2 = 0;
        for (int i = 0; i < H; ++i) {
            const float v = x[(size_t)t * H + i], c = std::min(std::max(v, -clip), clip);
            s1 += (double)c * c, s2 += (double)v * v;
        }
        const float q1 = std::pow((float)(s1 / H) + eps, -0.5f), q2 = std::pow((float)(s2 / H) + eps, -0.5f);
        for (int i = 0; i < H; ++i) {
            const float v = x[(size_t)t * H + i], c = std::min(std::max(v, -clip), clip);
            r1[(size_t)t * H + i] = c * q1 * wf[i];
            r2[(size_t)t * H + i] = v * q2;
        }
    }
    CUdeviceptr dx = dev.up(x), dw_ = dev.up(w), dy = dev.alloc(x.size() * 4), none = 0;
    float noclip = 0.0f;
    int zero     = 0;
    launch("g4_at_rms", T, 1, 256, {&dx, &ldH, &dw_, &bf, &dy, &ldH, &H, &eps, &clip});
    const double e1 = rel(dev.down<float>(dy, r1.size()), r1);
    launch("g4_at_rms", T, 1, 256, {&dx, &ldH, &none, &zero, &dx, &ldH, &H, &eps, &noclip}); // in place
    const double e2 = rel(dev.down<float>(dx, r2.size()), r2);
    // GLU, causal depthwise conv, SiLU.
    std::vector<float> g((size_t)T * H), c((size_t)T * H);
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < H; ++i) {
            const float a = big[(size_t)t * 2 * H + i], b = big[(size_t)t * 2 * H + H + i];
            g[(size_t)t * H + i] = a / (1.0f + std::exp(-b));
        }
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < H; ++i) {
            float acc = 0;
            for (int j = 0; j < K; ++j)
                if (t - (K - 1) + j >= 0)
                    acc += dwf[(size_t)i * K + j] * g[(size_t)(t - (K - 1) + j) * H + i];
            c[(size_t)t * H + i] = acc;
        }
    std::vector<float> sl = c;
    for (float& v : sl)
        v = v / (1.0f + std::exp(-v));
    CUdeviceptr dbig = dev.up(big), dg = dev.alloc(g.size() * 4), dc = dev.alloc(c.size() * 4),
                ddw = dev.up(dw);
    launch("g4_at_glu", T, (H + 255) / 256, 256, {&dbig, &H, &dg});
    const double eg = rel(dev.down<float>(dg, g.size()), g);
    CUdeviceptr dgr = dev.up(g);
    launch("g4_at_dwconv", T, (H + 255) / 256, 256, {&dgr, &ddw, &bf, &H, &K, &dc});
    const double ec = rel(dev.down<float>(dc, c.size()), c);
    CUdeviceptr dcr = dev.up(c);
    launch("g4_at_silu", T, (H + 255) / 256, 256, {&dcr, &ldH, &H});
    const double es = rel(dev.down<float>(dcr, sl.size()), sl);
    // Residuals (x = n * f + x) and the output projection's bias.
    const std::vector<float> n = randn((size_t)T * H, 36);
    std::vector<float> res     = x;
    for (size_t i = 0; i < res.size(); ++i)
        res[i] = n[i] * 0.5f + res[i];
    CUdeviceptr dres = dev.up(x), dn = dev.up(n);
    float half = 0.5f;
    launch("g4_at_residual", T, (H + 255) / 256, 256, {&dres, &dn, &H, &half});
    const double er             = rel(dev.down<float>(dres, res.size()), res);
    const std::vector<float> pr = randn((size_t)T * P, 37);
    std::vector<float> pb       = pr;
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < P; ++i)
            pb[(size_t)t * P + i] += bf_[i];
    CUdeviceptr dp = dev.up(pr), db = dev.up(bias);
    launch("g4_at_bias", T, (P + 255) / 256, 256, {&dp, &ldP, &db, &bf, &P});
    const double eb = rel(dev.down<float>(dp, pb.size()), pb);
    std::printf("audio rms (clip, weight) %.2e, rms in place %.2e, GLU %.2e, depthwise conv %.2e, SiLU %.2e, "
                "residual %.2e, bias %.2e\n",
                e1, e2, eg, ec, es, er, eb);
    for (double e : {e1, e2, eg, ec, es})
        EXPECT_LT(e, 1e-6);
    EXPECT_EQ(er, 0.0);
    EXPECT_EQ(eb, 0.0);
}

} // namespace
