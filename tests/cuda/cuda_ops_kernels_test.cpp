// The per-op CUDA kernels of prefill (embedding gather, KV store, the GEMM tiers) against the scalar
// reference (kernels/ref). Needs an NVIDIA GPU: each test
// is skipped where no driver or GPU is present (CI); with a GPU they run in full. Kernels are compiled
// with NVRTC for the GPU present, exactly as `g4 compile --device cuda` does.
#include "cuda_test_util.h"

namespace {

using namespace g4test_cuda;

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

// A row-matmul case: the weight's dtype and shape [n, k], double-quant scales, NF4 stored tiled32.
struct RowsCase {
    DType dt;
    int n, k;
    bool dq, tiled;
};
// A matmul weight on the device as the row kernels take it: NF4 row-major or tiled32 (its parts), or bf16.
struct RowsWeight {
    Weight w;
    CUdeviceptr wd = 0, codes = 0, am = 0, am2 = 0, off = 0, c2 = 0;
};
RowsWeight rows_weight(Dev& dev, DType dt, int n, int k, uint32_t seed, bool dq, bool tiled) {
    RowsWeight r;
    r.w                 = make_weight(dev, dt, n, k, seed, dq);
    r.wd                = tiled ? dev.up(nf4::tile32(r.w.blob, r.w.n, r.w.k, dq)) : r.w.dev;
    const nf4::Layout l = nf4::layout(r.w.n * r.w.k, dq);
    r.codes = r.wd + l.codes_off, r.am = r.wd + l.absmax_off, r.am2 = dq ? r.wd + l.absmax2_off : 0;
    r.off = dq ? r.wd + l.offset_off : 0, r.c2 = dq ? r.wd + l.code2_off : 0;
    return r;
}

// ---- matmuls of 2..8 rows (batched decode steps, short prefill chunks): g4_mm_rows_nf4 on row-major and
// tiled32 NF4 (f32 and double-quant scales) and g4_mm_rows_bf16 against the reference, at every split of K
// over a lane group's warps (ks 1, 2, 4) and output counts that are not a multiple of the 4 rows a group
// computes.
TEST(MatmulRows, MatchTheReference) {
    NEED_GPU();
    Dev dev;
    const RowsCase cases[] = {{DType::NF4, 70, 1536, false, false}, {DType::NF4, 70, 1536, true, false},
                              {DType::NF4, 96, 512, false, true},   {DType::NF4, 98, 512, true, true},
                              {DType::BF16, 70, 200, false, false}, {DType::BF16, 1030, 1536, false, false}};
    for (const RowsCase& c : cases) {
        RowsWeight rw     = rows_weight(dev, c.dt, c.n, c.k, 21, c.dq, c.tiled);
        const Weight& w   = rw.w;
        const bool nf4    = c.dt == DType::NF4;
        CUdeviceptr codes = rw.codes, am = rw.am, am2 = rw.am2, off = rw.off, c2 = rw.c2, wd = rw.wd,
                    bias = 0;
        for (int T : {2, 5, 8}) {
            const std::vector<float> x    = randn((size_t)T * c.k, 30 + T, 1.0f);
            const std::vector<float> want = w.ref(x, T);
            CUdeviceptr xd = dev.up(x), yd = dev.alloc((size_t)T * c.n * 4), st = dev.step(T, 0, T);
            for (int ks : {1, 2, 4}) {
                int mode = 0, N = c.n, K = c.k, tl = c.tiled;
                long ldx = K, ldy = N;
                const unsigned grid = (unsigned)(((N + 3) / 4 + 4 / ks - 1) / (4 / ks));
                if (nf4)
                    launch("g4_mm_rows_nf4", grid, 1, 128,
                           {&st, &mode, &xd, &ldx, &codes, &am, &am2, &off, &c2, &N, &K, &yd, &ldy, &bias,
                            &tl, &ks});
                else
                    launch("g4_mm_rows_bf16", grid, 1, 128,
                           {&st, &mode, &xd, &ldx, &wd, &N, &K, &yd, &ldy, &bias, &ks});
                EXPECT_LT(rel(dev.down<float>(yd, (size_t)T * N), want), 1e-5)
                    << (nf4 ? "nf4" : "bf16") << " " << N << "x" << K << " dq " << c.dq << " tiled "
                    << c.tiled << " rows " << T << " ks " << ks;
            }
        }
    }
}

// ---- the tensor-core row matmuls (kernels/cuda/matmul_rows_tc.cu): 2..16 rows at Gemma's shapes and odd
// ones (N not a multiple of 32, K blocks not a multiple of the K groups or splits), every column-group count,
// one split and several (partials summed by g4_mm_rows_tcs_sum, more splits than K blocks: empty ones; and
// by g4_mm_rows_tcs_sum_gelu with a gate's GeluMul),
// NF4 row-major and tiled, f32 and double-quant scales, bf16; within 3e-5 of the reference matmul (products
// of two bf16 each, float32 accumulation), bias added; the grid rows_tc_grid picks gives the same result.
TEST(MatmulRowsTc, MatchTheReference) {
    NEED_GPU();
    Dev dev;
    const RowsCase cases[] = {
        {DType::NF4, 1536, 6144, false, true},  {DType::NF4, 2048, 1536, false, false},
        {DType::NF4, 70, 1536, true, false},    {DType::NF4, 98, 512, true, true},
        {DType::NF4, 1536, 2048, false, true},  {DType::BF16, 256, 1536, false, false},
        {DType::BF16, 1536, 256, false, false}, {DType::BF16, 1030, 1536, false, false}};
    for (const RowsCase& c : cases) {
        RowsWeight rw     = rows_weight(dev, c.dt, c.n, c.k, 23, c.dq, c.tiled);
        const Weight& w   = rw.w;
        const bool nf4    = c.dt == DType::NF4;
        CUdeviceptr codes = rw.codes, am = rw.am, am2 = rw.am2, off = rw.off, c2 = rw.c2, wd = rw.wd;
        const std::vector<float> bias_h    = randn((size_t)c.n, 5, 0.5f);
        CUdeviceptr bias                   = dev.up(bias_h);
        const g4::cuda_ws::RowsTcGrid pick = g4::cuda_ws::rows_tc_grid(c.n, c.k);
        CUdeviceptr part = dev.alloc((size_t)std::max(16, pick.splits) * 16 * c.n * 4); // [splits, T, N]
        for (int T : {2, 5, 8, 9, 16}) {
            const std::vector<float> x = randn((size_t)T * c.k, 40 + T, 1.0f);
            std::vector<float> want    = w.ref(x, T);
            for (int t = 0; t < T; ++t)
                for (int i = 0; i < c.n; ++i)
                    want[(size_t)t * c.n + i] += bias_h[(size_t)i];
            CUdeviceptr xd = dev.up(x), yd = dev.alloc((size_t)T * c.n * 4), st = dev.step(T, 0, T);
            const std::pair<int, int> grids[] = {{1, 1}, {2, 3},  {4, 2},
                                                 {8, 1}, {8, 16}, {pick.wn, pick.splits}};
            for (auto [wn, S] : grids) {
                int mode = 0, N = c.n, K = c.k, tl = c.tiled;
                long ldx = K, ldy = N;
                const int cols      = g4::cuda_ws::kRowsTcCols;
                const unsigned grid = (unsigned)((N + cols * wn - 1) / (cols * wn));
                if (nf4)
                    launch("g4_mm_rows_tcs_nf4", grid, (unsigned)S, 256,
                           {&st, &mode, &xd, &ldx, &codes, &am, &am2, &off, &c2, &N, &K, &yd, &ldy, &bias,
                            &tl, &wn, &part});
                else
                    launch("g4_mm_rows_tcs_bf16", grid, (unsigned)S, 256,
                           {&st, &mode, &xd, &ldx, &wd, &N, &K, &yd, &ldy, &bias, &wn, &part});
                if (S > 1)
                    launch("g4_mm_rows_tcs_sum", (unsigned)((T * N + 255) / 256), 1, 256,
                           {&st, &mode, &part, &S, &N, &yd, &ldy, &bias});
                EXPECT_LT(rel(dev.down<float>(yd, (size_t)T * N), want), 3e-5)
                    << (nf4 ? "nf4" : "bf16") << " " << N << "x" << K << " dq " << c.dq << " tiled "
                    << c.tiled << " rows " << T << " column groups " << wn << " splits " << S;
                for (int gate_of_sum = 0; gate_of_sum < 2 && S > 1;
                     ++gate_of_sum) { // with the GeluMul after the matmul
                    const std::vector<float> a_h = randn((size_t)T * N, 60 + T, 2.0f);
                    CUdeviceptr ad = dev.up(a_h), yg = dev.alloc((size_t)T * N * 4);
                    long lda = N;
                    launch("g4_mm_rows_tcs_sum_gelu", (unsigned)((T * N + 255) / 256), 1, 256,
                           {&st, &mode, &part, &S, &N, &ad, &lda, &gate_of_sum, &yg, &ldy, &bias});
                    auto gelu = [](double v) {
                        return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
                    };
                    std::vector<float> want_g = want;
                    for (size_t i = 0; i < want_g.size(); ++i)
                        want_g[i] = (float)(gate_of_sum ? gelu(want[i]) * a_h[i] : gelu(a_h[i]) * want[i]);
                    EXPECT_LT(rel(dev.down<float>(yg, (size_t)T * N), want_g), 3e-5)
                        << "sum_gelu " << gate_of_sum << " " << N << "x" << K << " rows " << T << " splits "
                        << S;
                }
            }
        }
    }
}

// ---- an MLP's gate and up projections as one launch (g4_mm_rows_tcs_nf4_pair) and their GeluMul in the K
// splits' sum (g4_mm_rows_tcs_sum_gelu_pair): Gemma 4 E2B's two MLP widths and an odd shape (N not a
// multiple of a block's columns, double-quant scales, tiled), 9 and 16 rows, the grid rows_tc_grid picks for
// 2N columns and others; gelu_tanh(gate + bias) * (up + bias) within 3e-5 of the reference.
TEST(MatmulRowsTc, GateAndUpInOneLaunch) {
    NEED_GPU();
    Dev dev;
    const RowsCase cases[] = {{DType::NF4, 6144, 1536, false, false},
                              {DType::NF4, 12288, 1536, false, false},
                              {DType::NF4, 70, 512, true, true}};
    auto gelu              = [](double v) {
        return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    };
    for (const RowsCase& c : cases) {
        RowsWeight gw                 = rows_weight(dev, c.dt, c.n, c.k, 31, c.dq, c.tiled);
        RowsWeight uw                 = rows_weight(dev, c.dt, c.n, c.k, 37, c.dq, c.tiled);
        const std::vector<float> bg_h = randn((size_t)c.n, 7, 0.5f), bu_h = randn((size_t)c.n, 8, 0.5f);
        CUdeviceptr bg = dev.up(bg_h), bu = dev.up(bu_h);
        const g4::cuda_ws::RowsTcGrid pick = g4::cuda_ws::rows_tc_grid(2 * c.n, c.k);
        CUdeviceptr part = dev.alloc((size_t)std::max(3, pick.splits) * 16 * 2 * c.n * 4); // [splits, T, 2N]
        for (int T : {9, 16}) {
            const std::vector<float> x = randn((size_t)T * c.k, 70 + T, 1.0f);
            const std::vector<float> g = gw.w.ref(x, T), u = uw.w.ref(x, T);
            std::vector<float> want((size_t)T * c.n);
            for (size_t i = 0; i < want.size(); ++i)
                want[i] = (float)(gelu((double)g[i] + bg_h[i % (size_t)c.n]) *
                                  ((double)u[i] + bu_h[i % (size_t)c.n]));
            CUdeviceptr xd = dev.up(x), yd = dev.alloc((size_t)T * c.n * 4), st = dev.step(T, 0, T);
            const std::pair<int, int> grids[] = {{pick.wn, pick.splits}, {8, 3}, {2, 2}};
            for (auto [wn, S] : grids) {
                if (S < 2) continue;
                int mode = 0, N = c.n, K = c.k, tl = c.tiled;
                long ldx = K, ldy = N;
                const unsigned half =
                    (unsigned)((N + g4::cuda_ws::kRowsTcCols * wn - 1) / (g4::cuda_ws::kRowsTcCols * wn));
                launch("g4_mm_rows_tcs_nf4_pair", 2 * half, (unsigned)S, 256,
                       {&st, &mode, &xd, &ldx, &gw.codes, &gw.am, &gw.am2, &gw.off, &gw.c2, &uw.codes, &uw.am,
                        &uw.am2, &uw.off, &uw.c2, &N, &K, &tl, &wn, &part});
                launch("g4_mm_rows_tcs_sum_gelu_pair", (unsigned)((T * N + 255) / 256), 1, 256,
                       {&st, &mode, &part, &S, &N, &yd, &ldy, &bg, &bu});
                EXPECT_LT(rel(dev.down<float>(yd, (size_t)T * N), want), 3e-5)
                    << N << "x" << K << " dq " << c.dq << " tiled " << c.tiled << " rows " << T
                    << " column groups " << wn << " splits " << S;
            }
        }
    }
}

// ---- the K splits' sums that run the ops after a matmul (kernels/cuda/matmul_rows_tc.cu): at Gemma 4 E2B's
// q, k, v, o and down shapes, 9 and 16 rows at their own positions, the split sums of g4_mm_rows_tcs_nf4
// with the per-head RmsNorm (bf16, f32 or no weight) and the RoPE of the batched step's rows after them
// (g4_mm_rows_tcs_sum_norm_rope), or the ResNorm of a decode row after them (g4_mm_rows_tcs_sum_resnorm:
// residual branch, scalar, both outputs); within 3e-5 of the reference (the matmul in double, then the ops).
TEST(MatmulRowsTc, SumsRunTheOpsAfterTheMatmul) {
    NEED_GPU();
    Dev dev;
    struct Case {
        int n, k, dim; // dim: a head's width (norm and rope), 0: the ResNorm of rows of n
        int wdt;       // the norm weight: 0 f32, 1 bf16, -1 none
        bool rope;
    };
    const Case cases[] = {{2048, 1536, 256, 1, true},  {4096, 1536, 512, 0, true}, {256, 1536, 256, 1, true},
                          {256, 1536, 256, -1, false}, {1536, 2048, 0, 1, false},  {1536, 6144, 0, 0, false}};
    for (const Case& c : cases) {
        RowsWeight rw     = rows_weight(dev, DType::NF4, c.n, c.k, 31, false, false);
        CUdeviceptr codes = rw.codes, am = rw.am, am2 = rw.am2, off = rw.off, c2 = rw.c2;
        const std::vector<float> bias_h    = randn((size_t)c.n, 7, 0.5f);
        CUdeviceptr bias                   = dev.up(bias_h);
        const g4::cuda_ws::RowsTcGrid pick = g4::cuda_ws::rows_tc_grid(c.n, c.k);
        ASSERT_GT(pick.splits, 1) << c.n << "x" << c.k;
        CUdeviceptr part        = dev.alloc((size_t)pick.splits * 16 * c.n * 4);
        const int W             = c.dim ? c.dim : c.n; // the norm weight's width
        std::vector<float> nw_h = randn((size_t)W, 8, 0.3f), pw_h = randn((size_t)c.n, 9, 0.3f);
        for (float& v : nw_h)
            v = c.wdt == 1 ? bf16_to_f32(f32_to_bf16(1.0f + v)) : 1.0f + v;
        for (float& v : pw_h)
            v = bf16_to_f32(f32_to_bf16(1.0f + v));
        std::vector<uint16_t> nw_b(nw_h.size()), pw_b(pw_h.size());
        for (size_t i = 0; i < nw_h.size(); ++i)
            nw_b[i] = f32_to_bf16(nw_h[i]);
        for (size_t i = 0; i < pw_h.size(); ++i)
            pw_b[i] = f32_to_bf16(pw_h[i]);
        CUdeviceptr nw  = c.wdt == 1   ? dev.up(nw_b)
                          : c.wdt == 0 ? dev.up(nw_h)
                                       : 0,
                    pwd = dev.up(pw_b), prewd = dev.up(nw_h);
        std::vector<float> inv_h((size_t)std::max(1, W / 2));
        for (size_t k = 0; k < inv_h.size(); ++k) // partial rotary at 512: the second half does not turn
            inv_h[k] = W == 512 && k >= 64 ? 0.0f : (float)std::pow(10000.0, -2.0 * (double)k / W);
        CUdeviceptr inv = dev.up(inv_h);
        const float eps = 1e-6f, f = 1.0f, scalar_h = 0.75f;
        CUdeviceptr scd = dev.up(std::vector<float>{scalar_h});
        for (int T : {9, 16}) {
            std::vector<int> recs = {T, 0, T, 0};
            std::vector<int> pos((size_t)T);
            for (int t = 0; t < T; ++t) {
                pos[(size_t)t] = 3 + 517 * t;
                recs.insert(recs.end(), {1, pos[(size_t)t], 1, 0});
            }
            CUdeviceptr st             = dev.up(recs);
            const std::vector<float> x = randn((size_t)T * c.k, 50 + T, 1.0f);
            std::vector<double> mm((size_t)T * c.n);
            {
                const std::vector<float> r = rw.w.ref(x, T);
                for (size_t i = 0; i < mm.size(); ++i)
                    mm[i] = (double)r[i] + bias_h[i % (size_t)c.n];
            }
            CUdeviceptr xd = dev.up(x), yd = dev.alloc((size_t)T * c.n * 4);
            int mode = 0, N = c.n, K = c.k, tl = 0, wn = pick.wn, S = pick.splits;
            long ldx = K, ldy = N;
            const unsigned grid =
                (unsigned)((N + g4::cuda_ws::kRowsTcCols * wn - 1) / (g4::cuda_ws::kRowsTcCols * wn));
            launch("g4_mm_rows_tcs_nf4", grid, (unsigned)S, 256,
                   {&st, &mode, &xd, &ldx, &codes, &am, &am2, &off, &c2, &N, &K, &yd, &ldy, &bias, &tl, &wn,
                    &part});
            auto rms = [&](const double* v, int w) {
                double ss = 0;
                for (int i = 0; i < w; ++i)
                    ss += v[i] * v[i];
                return 1.0 / std::sqrt(ss / w + eps);
            };
            if (c.dim) {
                int dim = c.dim, wdt = std::max(0, c.wdt);
                float e          = eps;
                CUdeviceptr invp = c.rope ? inv : 0;
                launch("g4_mm_rows_tcs_sum_norm_rope", (unsigned)(N / dim), (unsigned)T, (unsigned)dim,
                       {&st, &mode, &part, &S, &N, &bias, &yd, &ldy, &nw, &wdt, &dim, &e, &invp});
                std::vector<float> want((size_t)T * N);
                for (int t = 0; t < T; ++t)
                    for (int h = 0; h < N / dim; ++h) {
                        const double* v = &mm[(size_t)t * N + (size_t)h * dim];
                        const double r  = rms(v, dim);
                        std::vector<double> u((size_t)dim);
                        for (int i = 0; i < dim; ++i)
                            u[(size_t)i] = v[i] * r * (c.wdt >= 0 ? nw_h[(size_t)i] : 1.0);
                        for (int i = 0; i < dim; ++i) {
                            double o = u[(size_t)i];
                            if (c.rope) {
                                const int half = dim / 2, k = i < half ? i : i - half;
                                const double a = (double)pos[(size_t)t] * inv_h[(size_t)k];
                                o              = i < half
                                                     ? u[(size_t)i] * std::cos(a) - u[(size_t)(i + half)] * std::sin(a)
                                                     : u[(size_t)i] * std::cos(a) + u[(size_t)(i - half)] * std::sin(a);
                            }
                            want[(size_t)t * N + (size_t)h * dim + (size_t)i] = (float)o;
                        }
                    }
                EXPECT_LT(rel(dev.down<float>(yd, want.size()), want), 3e-5)
                    << "norm_rope " << N << "x" << K << " dim " << dim << " weight " << c.wdt << " rope "
                    << c.rope << " rows " << T;
            } else {
                const std::vector<float> xr = randn((size_t)T * N, 70 + T, 1.0f);
                CUdeviceptr xrd = dev.up(xr), xo = dev.alloc((size_t)T * N * 4),
                            xn = dev.alloc((size_t)T * N * 4);
                int pwdt = 1, sdt = 0, prewdt = 0;
                float ff = f, e = eps;
                long ld = N;
                launch("g4_mm_rows_tcs_sum_resnorm", (unsigned)T, 1, N <= 2048 ? 512 : 1024,
                       {&st,   &mode, &part, &S,  &N,  &bias, &yd,    &ldy,    &xrd, &ld, &pwd,
                        &pwdt, &scd,  &sdt,  &ff, &xo, &ld,   &prewd, &prewdt, &xn,  &ld, &e});
                std::vector<float> want_y((size_t)T * N), want_o((size_t)T * N), want_n((size_t)T * N);
                for (int t = 0; t < T; ++t) {
                    const double* d = &mm[(size_t)t * N];
                    const double r1 = rms(d, N);
                    std::vector<double> o((size_t)N);
                    for (int i = 0; i < N; ++i) {
                        want_y[(size_t)t * N + i] = (float)d[i];
                        o[(size_t)i] = (xr[(size_t)t * N + i] + d[i] * r1 * pw_h[(size_t)i]) * f * scalar_h;
                        want_o[(size_t)t * N + i] = (float)o[(size_t)i];
                    }
                    const double r2 = rms(o.data(), N);
                    for (int i = 0; i < N; ++i)
                        want_n[(size_t)t * N + i] = (float)(o[(size_t)i] * r2 * nw_h[(size_t)i]);
                }
                const char* what[]               = {"y", "x_out", "xn"};
                const CUdeviceptr got[]          = {yd, xo, xn};
                const std::vector<float>* want[] = {&want_y, &want_o, &want_n};
                for (int q = 0; q < 3; ++q)
                    EXPECT_LT(rel(dev.down<float>(got[q], (size_t)T * N), *want[q]), 3e-5)
                        << "resnorm " << what[q] << " " << N << "x" << K << " rows " << T;
            }
        }
    }
}

// ---- the fused decode kernels of several rows (batched decode steps, kernels/cuda/decode_rows.cu): each row
// of g4_gemv_rows_* and g4_resnorm_rows is the one-row kernel's result on that row, bit for bit (the same
// float32 sums), for 1..8 rows in strided views.
TEST(GemvRows, EachRowIsTheOneRowKernel) {
    NEED_GPU();
    if (gpu().sm < 90) GTEST_SKIP() << "the row kernels are compiled for sm_90+ only";
    struct Case {
        const char* name;
        DType dt;
        std::vector<int64_t> n;
        int64_t k;
        int epi, lanes;
        bool dq;
    };
    const DType NF = DType::NF4, BF = DType::BF16;
    const Case cases[] = {{"qkv", NF, {2048, 256, 256}, 1536, 0, 32, false},
                          {"gate_up", NF, {6144, 6144}, 1536, 1, 16, false},
                          {"gate_up_dq_l8", NF, {512, 512}, 1536, 1, 8, true},
                          {"down_global_x", NF, {1536}, 6144, 0, 64, false},
                          {"ple_gate_nf4", NF, {256}, 1536, 2, 16, false},
                          {"ple_gate_bf16", BF, {256}, 1536, 2, 32, false},
                          {"lm_head_softcap_l128", BF, {4100}, 1536, 3, 128, false}};
    for (const Case& c : cases) {
        Dev dev;
        const bool nf4 = c.dt == DType::NF4, pairs = c.epi == 1;
        std::vector<Weight> ws;
        for (size_t m = 0; m < c.n.size(); ++m)
            ws.push_back(make_weight(dev, c.dt, c.n[m], c.k, 200 + (uint32_t)m, c.dq));
        int n_out = pairs ? (int)c.n[0] : 0;
        if (!pairs)
            for (int64_t v : c.n)
                n_out += (int)v;
        const int kMax = 8;
        const long ldx = c.k + 32, ldo = n_out + 8;
        std::vector<long> ldy;
        for (int64_t v : c.n)
            ldy.push_back(v + 4);
        const std::vector<float> x = randn((size_t)kMax * ldx, 61), aux = randn((size_t)kMax * ldo, 62);
        CUdeviceptr gx = dev.up(x), gaux = dev.up(aux), gout = dev.alloc((size_t)kMax * ldo * 4);
        std::vector<CUdeviceptr> gy;
        for (size_t m = 0; m < c.n.size(); ++m)
            gy.push_back(dev.alloc((size_t)kMax * ldy[m] * 4));
        // The one-row kernel on each row.
        std::vector<std::vector<float>> want_out(kMax), want_y(kMax * 3);
        for (int t = 0; t < kMax; ++t) {
            cuda_rt::GemvArgsH a{};
            for (size_t m = 0; m < c.n.size(); ++m)
                a.m[m] = ws[m].mat(gy[m] + (uint64_t)t * ldy[m] * 4);
            a.x = gx + (uint64_t)t * ldx * 4, a.out = gout + (uint64_t)t * ldo * 4,
            a.aux  = gaux + (uint64_t)t * ldo * 4;
            a.nmat = (int)c.n.size(), a.k = (int)c.k, a.epi = c.epi, a.cap = 30.0f;
            run_gemv(a, nf4, c.lanes, pairs, n_out);
            want_out[t] = dev.down<float>(a.out, (size_t)n_out);
            for (size_t m = 0; m < c.n.size(); ++m)
                want_y[t * 3 + m] = dev.down<float>(a.m[m].y, (size_t)c.n[m]);
        }
        for (int T : {1, 2, 3, 5, 8}) {
            for (int tk : {4, 8})
                for (int staged : {0, 1}) {
                    if (T > tk) continue;
                    cuda_rt::GemvArgsH a{};
                    cuda_rt::GemvRowsLdH ld{};
                    for (size_t m = 0; m < c.n.size(); ++m) {
                        gpu().d->cuMemsetD8(gy[m], 0xff, (size_t)kMax * ldy[m] * 4);
                        a.m[m] = ws[m].mat(gy[m]), ld.y[m] = ldy[m];
                    }
                    gpu().d->cuMemsetD8(gout, 0xff, (size_t)kMax * ldo * 4);
                    a.x = gx, a.out = gout, a.aux = gaux;
                    a.nmat = (int)c.n.size(), a.k = (int)c.k, a.epi = c.epi, a.cap = 30.0f;
                    ld.x = ldx, ld.out = ldo, ld.aux = ldo, ld.rows = T;
                    const std::string name = std::string("g4_gemv_rows_") + (nf4 ? "nf4" : "bf16") + "_l" +
                                             std::to_string(c.lanes) + (pairs ? "_m2" : "_m1") + "_t" +
                                             std::to_string(tk);
                    unsigned smem = cuda_rt::gemv_rows_smem(nf4, gpu().sm, (int)c.k, T, &ld.xs);
                    if (staged && !ld.xs && gpu().sm >= 90 && c.k <= cuda_rt::kGemvRowsXsMaxK)
                        smem = (unsigned)(T * c.k * 4), ld.xs = 1; // bf16 of 5..8 rows: the kernel takes it
                    if (staged && !ld.xs) continue;
                    if (!staged && ld.xs)
                        smem = cuda_rt::gemv_smem(nf4, gpu().sm, 0), ld.xs = 0; // x from global memory
                    if (smem) {
                        cu::CUfunction f = nullptr;
                        ASSERT_EQ(gpu().d->cuModuleGetFunction(&f, gpu().mod, name.c_str()), 0) << name;
                        ASSERT_EQ(gpu().d->cuFuncSetAttribute(f, cu::kFuncAttrMaxDynamicSmem, (int)smem), 0);
                    }
                    const long threads   = cuda_rt::gemv_threads(n_out, c.lanes, pairs);
                    const unsigned block = cuda_rt::gemv_rows_block(tk);
                    launch_smem(name.c_str(), (unsigned)((threads + block - 1) / block), 1, block, smem,
                                {&a, &ld});
                    for (int t = 0; t < T; ++t) {
                        if (pairs || c.epi == 2) {
                            EXPECT_EQ(dev.down<float>(gout + (uint64_t)t * ldo * 4, (size_t)n_out),
                                      want_out[t])
                                << name << " " << c.name << " row " << t << " of " << T << " staged "
                                << staged;
                            continue;
                        }
                        for (size_t m = 0; m < c.n.size(); ++m)
                            EXPECT_EQ(dev.down<float>(gy[m] + (uint64_t)t * ldy[m] * 4, (size_t)c.n[m]),
                                      want_y[t * 3 + m])
                                << name << " " << c.name << " matrix " << m << " row " << t << " of " << T
                                << " staged " << staged;
                    }
                    // Rows past T are not written.
                    if (T < kMax && !pairs && c.epi != 2) {
                        EXPECT_EQ(dev.down<uint32_t>(gy[0] + (uint64_t)T * ldy[0] * 4, 1)[0], 0xffffffffu)
                            << name;
                    }
                }
        }
    }
}

TEST(GemvRows, ResNormRowsAreTheOneRowKernel) {
    NEED_GPU();
    if (gpu().sm < 90) GTEST_SKIP() << "the row kernels are compiled for sm_90+ only";
    for (int H : {1536, 2560}) {
        Dev dev;
        const int kRows      = 5;
        const long ld        = H + 64;
        std::vector<float> x = randn((size_t)kRows * ld, 71), d = randn((size_t)kRows * ld, 72);
        auto pwb = to_bf16(randn(H, 73)), prewb = to_bf16(randn(H, 74)), scb = to_bf16(randn(1, 75));
        CUdeviceptr gx = dev.up(x), gd = dev.up(d), gpw = dev.up(pwb), gprew = dev.up(prewb),
                    gsc = dev.up(scb);
        CUdeviceptr gxo = dev.alloc((size_t)kRows * ld * 4), gxn = dev.alloc((size_t)kRows * ld * 4);
        int one = 1, h = H;
        float f = 0.5f, eps = 1e-6f;
        const unsigned nt = H <= 2048 ? 512 : 1024;
        std::vector<std::vector<float>> want_xo, want_xn;
        for (int t = 0; t < kRows; ++t) {
            CUdeviceptr xt = gx + (uint64_t)t * ld * 4, dt = gd + (uint64_t)t * ld * 4,
                        xot = gxo + (uint64_t)t * ld * 4, xnt = gxn + (uint64_t)t * ld * 4, zero = 0;
            launch("g4_resnorm", 1, 1, nt,
                   {&xt, &dt, &gpw, &one, &gsc, &one, &f, &xot, &gprew, &one, &xnt, &h, &eps, &zero});
            want_xo.push_back(dev.down<float>(xot, H));
            want_xn.push_back(dev.down<float>(xnt, H));
        }
        gpu().d->cuMemsetD8(gxo, 0xff, (size_t)kRows * ld * 4);
        gpu().d->cuMemsetD8(gxn, 0xff, (size_t)kRows * ld * 4);
        long l = ld;
        launch("g4_resnorm_rows", kRows, 1, nt,
               {&gx, &l, &gd, &l, &gpw, &one, &gsc, &one, &f, &gxo, &l, &gprew, &one, &gxn, &l, &h, &eps});
        for (int t = 0; t < kRows; ++t) {
            EXPECT_EQ(dev.down<float>(gxo + (uint64_t)t * ld * 4, H), want_xo[t])
                << "H " << H << " row " << t;
            EXPECT_EQ(dev.down<float>(gxn + (uint64_t)t * ld * 4, H), want_xn[t])
                << "H " << H << " row " << t;
        }
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

} // namespace
