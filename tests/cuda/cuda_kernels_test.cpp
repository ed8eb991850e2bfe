// The fused decode kernels (GEMV family, MLP, gated projection, residual norms, grouped scale-norm-add)
// against the scalar reference (kernels/ref), and whole CUDA plans of the fixtures (bf16 KV cache, MLP
// replicas and packed-f16 products, folded norms, decoding ahead) against the CPU plan. Needs an NVIDIA GPU:
// each test is skipped where no driver or GPU is present (CI); with a GPU they run in full. Kernels are
// compiled with NVRTC for the GPU present, exactly as `g4 compile --device cuda` does.
#include "cuda_test_util.h"

namespace {

using namespace g4test_cuda;

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
                    // a.zero (_z): the output of the g4_resnorm_gated_proj launch after (a folded ResNorm),
                    // zeroed by block 0 at its end.
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

// ---- the per-layer-input gate and projection in one kernel (g4_gated_proj_bf16_g*, sm_90): gelu(W_g x +
// b_g) * aux, then the projection (its bf16 [H, P] row-major) adding into a zeroed y, against the unfused
// reference.
struct GatedProjCase {
    const char* name;
    int64_t H, P;
    bool bias;
};
class GatedProj : public ::testing::TestWithParam<GatedProjCase> {};
TEST_P(GatedProj, MatchesUnfusedReference) {
    NEED_GPU();
    if (gpu().sm < 90) GTEST_SKIP() << "g4_gated_proj_bf16 is scheduled on sm_90 plans only";
    const GatedProjCase& c = GetParam();
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
    cuda_rt::GatedProjArgsH a{};
    a.x = dev.up(x), a.wg = g.dev, a.bg = c.bias ? dev.up(bg) : 0, a.aux = dev.up(aux), a.wp = w.dev,
    a.bp = c.bias ? dev.up(bp) : 0;
    a.y = y, a.H = (int)c.H, a.P = (int)c.P;
    const std::string name = "g4_gated_proj_bf16_g" + std::to_string(cuda_rt::slice_row_groups(c.H));
    for (int rep = 0; rep < 2; ++rep) {
        gpu().d->cuMemsetD8(y, 0, c.H * 4);
        launch(name.c_str(), (unsigned)(c.P / 8), 1, 256, {&a});
        const double e = rel(dev.down<float>(y, c.H), want);
        std::printf("PLE %s (%s): rel %.2e\n", c.name, name.c_str(), e);
        EXPECT_LT(e, 2e-5) << c.name;
    }
}
// g4_resnorm_gated_proj_bf16_g*: the ResNorm before folded in (a plan's ResNorm record with ip1 = 1). Every
// block makes x = rx + rms(rd) * pw and block 0 writes it to xo; y as the unfused ResNorm then PLE.
TEST_P(GatedProj, ResNormBeforeFoldedIn) {
    NEED_GPU();
    if (gpu().sm < 90) GTEST_SKIP() << "g4_resnorm_gated_proj_bf16 is scheduled on sm_90 plans only";
    const GatedProjCase& c = GetParam();
    const int H            = (int)c.H;
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
    cuda_rt::GatedProjArgsH a{};
    a.x = 0, a.wg = g.dev, a.bg = c.bias ? dev.up(bg) : 0, a.aux = dev.up(aux), a.wp = w.dev,
    a.bp = c.bias ? dev.up(bp) : 0;
    a.y = y, a.H = H, a.P = (int)c.P;
    a.rx = dev.up(rx), a.rd = dev.up(d0), a.rpw = dev.up(pwb), a.rpwdt = 1, a.xo = xo, a.eps = 1e-6f;
    const std::string name = "g4_resnorm_gated_proj_bf16_g" + std::to_string(cuda_rt::slice_row_groups(c.H));
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
    RealShapes, GatedProj,
    ::testing::Values(GatedProjCase{"e2b", 1536, 256, false}, GatedProjCase{"e4b_bias", 2560, 256, true},
                      GatedProjCase{"tiny_e2b_bias", 64, 16, true}, GatedProjCase{"tiny_e4b", 96, 16, false},
                      GatedProjCase{"h4096_bias", 4096, 256, true}),
    [](const ::testing::TestParamInfo<GatedProjCase>& i) { return std::string(i.param.name); });

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

// ---- the per-layer inputs' combination (schedule record GroupNormAdd): g4_group_norm_add against the four
// reference ops it replaces (Scale, RmsNorm over groups of P, Add, Scale), E2B's 35 and E4B's 42 groups of
// 256 and the tiny fixtures' 16, with f32 and bf16 norm weights. Same operation order (powf for the norm):
// exact but for the warp-shuffle sum's order.
TEST(GroupNormAdd, MatchesUnfusedOps) {
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
            launch("g4_group_norm_add", (unsigned)c.groups, 1, (unsigned)(P + 31) / 32 * 32,
                   {&gc, &gw, &wdt, &gt, &go, &P, &a, &e, &b});
            const double err = rel(dev.down<float>(go, N), want);
            std::printf("GroupNormAdd %d x %d, %s weight: rel %.2e\n", c.groups, c.P, wdt ? "bf16" : "f32",
                        err);
            EXPECT_LT(err, 1e-6) << c.groups << " x " << c.P << " wdt " << wdt;
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

// The ResNorm between each MLP and PLE run by the PLE launch (ResNorm record ip1 = 1, g4_resnorm_gated_proj,
// the MLP before it a _z kernel; default plans) against plans compiled with --ple-fold off, with f32 MLP
// arithmetic: every layer's ResNorm folds in the tiny fixtures; 24 greedy steps give the same tokens, the
// logits agree to the adds' order (1e-3, as MlpReplicasMatchOneOutput).
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
                ples += pl.launch(li).kind == (uint16_t)g4::plan::LaunchKind::GatedProj;
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

} // namespace
