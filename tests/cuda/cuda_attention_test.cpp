// The attention kernels (q/k/v post-projection, split decode attention and merge, the merge with the o
// projection, flash prefill) against the scalar reference (kernels/ref). Needs an NVIDIA GPU: each test
// is skipped where no driver or GPU is present (CI); with a GPU they run in full. Kernels are compiled
// with NVRTC for the GPU present, exactly as `g4 compile --device cuda` does.
#include "cuda_test_util.h"

namespace {

using namespace g4test_cuda;

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

} // namespace
