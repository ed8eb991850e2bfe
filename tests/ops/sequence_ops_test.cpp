// The ops over frame sequences (Conv2dNormRelu, Silu, SigmoidMul, CausalConv1d, LocalAttention,
// SoftplusScale, AddScaled) on every backend present against the scalar reference (kernels/ref): one row per
// case, at the shapes of Gemma 4's audio encoder (hidden 1024, 8 heads of 128, chunk 12, conv channels 128
// and 32 over 128 mel bins, kernel 5) and small odd ones. The CUDA rows run the kernels compiled by NVRTC as
// a plan compiles them, through the runtime's launch code; they are skipped without an NVIDIA GPU.
#include "cuda/cuda_test_util.h"
#include "kernels/cpu/cpu.h"
#include "kernels/ref/ref.h"
#include "runtime/src/cuda/driver.h"
#include "runtime/src/cuda/sequence_ops.h"
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <gtest/gtest.h>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace g4;
using g4test::randn;
using g4test::to_bf16;

enum class Tier { Ref, Cpu, Cuda };
const char* tier_name(Tier t) {
    return t == Tier::Ref ? "ref" : t == Tier::Cpu ? "cpu" : "cuda";
}

// The CUDA kernel tests' GPU and module (cuda/cuda_test_util.h) with the sequence kernels looked up in it; d
// is null, and why says why, without a GPU or the CUDA toolkit, or where a kernel is missing.
struct Gpu {
    const cu::Driver* d = nullptr;
    cuda_rt::SequenceKernels k;
    std::string why;
};

Gpu& gpu() {
    static Gpu g;
    static bool tried = false;
    if (tried) return g;
    tried = true;

    const g4test_cuda::Gpu& shared = g4test_cuda::gpu();
    g.why                          = shared.why;
    if (!shared.d) return g;
    const std::string missing = cuda_rt::load_sequence_kernels(*shared.d, shared.mod, &g.k);
    if (missing.empty())
        g.d = shared.d;
    else
        g.why = "kernel " + missing + " missing from the module";
    return g;
}

// The inputs of one case, as the tier reads them: host memory for ref and cpu, device copies for cuda.
struct Bufs {
    Tier tier;
    std::vector<cu::CUdeviceptr> owned;
    float* out_host         = nullptr;
    size_t out_n            = 0;
    cu::CUdeviceptr out_dev = 0;
    std::vector<float> out;
    explicit Bufs(Tier t) : tier(t) {}
    ~Bufs() {
        for (cu::CUdeviceptr p : owned)
            gpu().d->cuMemFree(p);
    }
    const void* put(const void* data, size_t bytes) {
        if (tier != Tier::Cuda) return data;
        cu::CUdeviceptr p = 0;
        EXPECT_EQ(gpu().d->cuMemAlloc(&p, std::max<size_t>(bytes, 16)), 0);
        gpu().d->cuMemcpyHtoD(p, data, bytes);
        owned.push_back(p);
        return (const void*)p;
    }
    template <class T> const T* in(const std::vector<T>& v) {
        return (const T*)put(v.data(), v.size() * sizeof(T));
    }
    // The case's one output of n floats (NaN-filled, so an element never written fails the comparison).
    float* output(size_t n) {
        out.assign(n, std::nanf(""));
        if (tier != Tier::Cuda) return out.data();
        out_dev = (cu::CUdeviceptr)in(out);
        return (float*)out_dev;
    }
    std::vector<float> result() {
        if (tier == Tier::Cuda) {
            EXPECT_EQ(gpu().d->cuStreamSynchronize(nullptr), 0);
            EXPECT_EQ(gpu().d->cuMemcpyDtoH(out.data(), out_dev, out.size() * sizeof(float)), 0);
        }
        return out;
    }
};

struct Cpu {
    cpu::ThreadPool pool{3};
    std::vector<float> scratch;
    cpu::Context ctx;
    explicit Cpu(size_t floats) {
        scratch.assign(floats * pool.size(), 0.0f);
        ctx = {&pool, scratch.data(), floats};
    }
};

// One row of the table: its name, the per-thread scratch its CPU kernel needs, and how it runs on a tier.
struct Case {
    std::string name;
    size_t scratch;
    std::function<void(Tier, Bufs&, const cpu::Context&)> run;
    double tol = 2e-6;
};

void run_case(const Case& c) {
    Cpu cpu(std::max<size_t>(c.scratch, 16));
    auto on = [&](Tier t) {
        Bufs b(t);
        c.run(t, b, cpu.ctx);
        return b.result();
    };
    const std::vector<float> want = on(Tier::Ref);
    std::vector<Tier> tiers{Tier::Cpu};
    if (gpu().d) tiers.push_back(Tier::Cuda);
    for (Tier t : tiers) {
        std::vector<float> got = on(t);
        ASSERT_EQ(got.size(), want.size());
        const double e = g4test::rel_l2(got.data(), want.data(), want.size());
        EXPECT_LT(e, c.tol) << c.name << " on " << tier_name(t);
    }
    if (!gpu().d) std::printf("[ note ] %s: CUDA tier skipped (%s)\n", c.name.c_str(), gpu().why.c_str());
}

// A weight of n values in dtype dt, as raw bytes.
struct Weight {
    std::vector<float> f;
    std::vector<uint16_t> b;
    DType dt;
    Weight(size_t n, uint32_t seed, DType dt, float sd = 0.3f, float mean = 0.0f)
        : f(randn(n, seed, sd)), dt(dt) {
        for (float& v : f)
            v += mean;
        b = to_bf16(f);
    }
    const void* on(Bufs& bf) const {
        return dt == DType::BF16 ? (const void*)bf.in(b) : (const void*)bf.in(f);
    }
};

Case conv2d(int in_rows, int f_in, int c_in, int c_out, DType dt) {
    const int out_rows = (in_rows + 1) / 2, f_out = (f_in + 1) / 2;
    auto x           = std::make_shared<std::vector<float>>(randn((size_t)in_rows * f_in * c_in, 1));
    auto w           = std::make_shared<Weight>((size_t)c_out * c_in * 9, 2, dt);
    auto n           = std::make_shared<Weight>((size_t)c_out, 3, dt, 0.2f, 1.0f);
    std::string name = "conv2d_norm_relu " + std::to_string(in_rows) + "x" + std::to_string(f_in) + "x" +
                       std::to_string(c_in) + "->" + std::to_string(c_out) + " " + dtype_str(dt);
    return {name, cpu::conv2d_scratch_floats(f_out, c_in, c_out),
            [=](Tier t, Bufs& b, const cpu::Context& ctx) {
                Conv2dArgs a{b.in(*x), in_rows, f_in,    c_in,     w->on(b), dt,   n->on(b),
                             dt,       1e-6f,   nullptr, out_rows, f_out,    c_out};
                a.y = b.output((size_t)out_rows * f_out * c_out);
                if (t == Tier::Ref) ref::conv2d_norm_relu(a);
                if (t == Tier::Cpu) cpu::conv2d_norm_relu(ctx, a);
                if (t == Tier::Cuda) {
                    EXPECT_EQ(cuda_rt::launch_conv2d_norm_relu(*gpu().d, gpu().k, nullptr, a), 0);
                }
            },
            1e-5};
}

Case silu(int rows, int cols) {
    auto x = std::make_shared<std::vector<float>>(randn((size_t)rows * (cols + 3), 4, 3.0f));
    return {"silu " + std::to_string(rows) + "x" + std::to_string(cols), 0,
            [=](Tier t, Bufs& b, const cpu::Context& ctx) {
                UnaryArgs a{b.in(*x), cols + 3, nullptr, cols, rows, cols};
                a.y = b.output((size_t)rows * cols);
                if (t == Tier::Ref) ref::silu(a);
                if (t == Tier::Cpu) cpu::silu(ctx, a);
                if (t == Tier::Cuda) {
                    EXPECT_EQ(cuda_rt::launch_silu(*gpu().d, gpu().k, nullptr, a), 0);
                }
            }};
}

Case sigmoid_mul(int rows, int cols) { // a and b: the two halves of one [rows, 2 * cols] tensor
    auto x = std::make_shared<std::vector<float>>(randn((size_t)rows * 2 * cols, 5, 3.0f));
    return {"sigmoid_mul " + std::to_string(rows) + "x" + std::to_string(cols), 0,
            [=](Tier t, Bufs& b, const cpu::Context& ctx) {
                const float* xd = b.in(*x);
                BinaryArgs a{xd, 2 * cols, xd + cols, 2 * cols, nullptr, cols, rows, cols};
                a.y = b.output((size_t)rows * cols);
                if (t == Tier::Ref) ref::sigmoid_mul(a);
                if (t == Tier::Cpu) cpu::sigmoid_mul(ctx, a);
                if (t == Tier::Cuda) {
                    EXPECT_EQ(cuda_rt::launch_sigmoid_mul(*gpu().d, gpu().k, nullptr, a), 0);
                }
            }};
}

Case causal_conv1d(int rows, int cols, int k, DType dt) {
    auto x = std::make_shared<std::vector<float>>(randn((size_t)rows * cols, 6));
    auto w = std::make_shared<Weight>((size_t)cols * k, 7, dt);
    return {"causal_conv1d " + std::to_string(rows) + "x" + std::to_string(cols) + " k" + std::to_string(k) +
                " " + dtype_str(dt),
            cpu::causal_conv1d_scratch_floats(cols, k), [=](Tier t, Bufs& b, const cpu::Context& ctx) {
                CausalConv1dArgs a{b.in(*x), cols, w->on(b), dt, nullptr, cols, rows, cols, k};
                a.y = b.output((size_t)rows * cols);
                if (t == Tier::Ref) ref::causal_conv1d(a);
                if (t == Tier::Cpu) cpu::causal_conv1d(ctx, a);
                if (t == Tier::Cuda) {
                    EXPECT_EQ(cuda_rt::launch_causal_conv1d(*gpu().d, gpu().k, nullptr, a), 0);
                }
            }};
}

// q, k, v as column views of one [rows, 3 * H] tensor (other leading dimensions than the output's).
Case local_attention(int rows, int heads, int dim, int window, int n_rel, float cap) {
    const int H = heads * dim;
    auto qkv    = std::make_shared<std::vector<float>>(randn((size_t)rows * 3 * H, 8));
    auto rel    = std::make_shared<std::vector<float>>(randn((size_t)n_rel * H, 9));
    return {"local_attention rows " + std::to_string(rows) + " heads " + std::to_string(heads) + " dim " +
                std::to_string(dim) + " window " + std::to_string(window) + " n_rel " + std::to_string(n_rel),
            cpu::local_attention_scratch_floats(window),
            [=](Tier t, Bufs& b, const cpu::Context& ctx) {
                const float* p = b.in(*qkv);
                LocalAttentionArgs a{p,       3 * H, p + H, 3 * H, p + 2 * H, 3 * H,  b.in(*rel), H,
                                     nullptr, H,     rows,  heads, dim,       window, n_rel,      cap};
                a.y = b.output((size_t)rows * H);
                if (t == Tier::Ref) ref::local_attention(a);
                if (t == Tier::Cpu) cpu::local_attention(ctx, a);
                if (t == Tier::Cuda) {
                    EXPECT_EQ(cuda_rt::launch_local_attention(*gpu().d, gpu().k, nullptr, a), 0);
                }
            },
            1e-5};
}

Case softplus_scale(int rows, int cols, int dim, DType dt) { // weights around 0 and past torch's threshold 20
    auto x = std::make_shared<std::vector<float>>(randn((size_t)rows * cols, 10));
    auto w = std::make_shared<Weight>((size_t)dim, 11, dt, 12.0f, 8.0f);
    return {"softplus_scale " + std::to_string(rows) + "x" + std::to_string(cols) + " dim " +
                std::to_string(dim) + " " + dtype_str(dt),
            cpu::softplus_scale_scratch_floats(dim), [=](Tier t, Bufs& b, const cpu::Context& ctx) {
                DimScaleArgs a{b.in(*x), cols, nullptr, cols, rows, cols, dim, w->on(b), dt, 0.1275f};
                a.y = b.output((size_t)rows * cols);
                if (t == Tier::Ref) ref::softplus_scale(a);
                if (t == Tier::Cpu) cpu::softplus_scale(ctx, a);
                if (t == Tier::Cuda) {
                    EXPECT_EQ(cuda_rt::launch_softplus_scale(*gpu().d, gpu().k, nullptr, a), 0);
                }
            }};
}

Case add_scaled(int rows, int cols, float s) {
    auto x = std::make_shared<std::vector<float>>(randn((size_t)rows * cols * 2, 12));
    return {"add_scaled " + std::to_string(rows) + "x" + std::to_string(cols), 0,
            [=](Tier t, Bufs& b, const cpu::Context& ctx) {
                const float* p = b.in(*x);
                AddScaledArgs a{p, cols, p + (size_t)rows * cols, cols, nullptr, cols, rows, cols, s};
                a.y = b.output((size_t)rows * cols);
                if (t == Tier::Ref) ref::add_scaled(a);
                if (t == Tier::Cpu) cpu::add_scaled(ctx, a);
                if (t == Tier::Cuda) {
                    EXPECT_EQ(cuda_rt::launch_add_scaled(*gpu().d, gpu().k, nullptr, a), 0);
                }
            }};
}

std::vector<Case> table() {
    std::vector<Case> v;
    for (DType dt : {DType::F32, DType::BF16}) {
        v.push_back(conv2d(61, 128, 1, 128, dt)); // the first subsampling conv (mel bins -> channels[0])
        v.push_back(conv2d(31, 64, 128, 32, dt)); // the second
        v.push_back(conv2d(11, 8, 1, 8, dt));     // the tiny test checkpoint's
        v.push_back(conv2d(1, 3, 5, 7, dt));      // one input row, odd sizes
        v.push_back(causal_conv1d(37, 1024, 5, dt));
        v.push_back(causal_conv1d(3, 33, 5, dt)); // fewer rows than taps
        v.push_back(softplus_scale(19, 1024, 128, dt));
    }
    v.push_back(silu(37, 4096));
    v.push_back(silu(5, 33));
    v.push_back(sigmoid_mul(37, 1024));
    v.push_back(sigmoid_mul(3, 17));
    v.push_back(local_attention(40, 8, 128, 12, 13, 50.0f)); // chunk 12, left context 13
    v.push_back(local_attention(30, 2, 16, 12, 13, 50.0f));
    v.push_back(local_attention(9, 3, 40, 5, 2, 0.5f)); // relative keys for the two nearest only; a low cap
    v.push_back(add_scaled(37, 1024, 0.5f));
    v.push_back(add_scaled(2, 7, -1.25f));
    return v;
}

class SequenceOps : public ::testing::TestWithParam<int> {};

TEST_P(SequenceOps, EveryBackendMatchesTheReference) {
    static const std::vector<Case> cases = table();
    run_case(cases[GetParam()]);
}

INSTANTIATE_TEST_SUITE_P(Table, SequenceOps, ::testing::Range(0, (int)table().size()));

} // namespace
