// Encoder-program ops (kernels/ops.h Clamp .. PoolRows): the Eigen CPU kernels against the scalar
// reference beyond the rows of the op test table (op_table_test.cpp: AddPosition2D, Rope2D), at the vision
// encoder's shapes (head dims 64/72, GQA and MHA, row counts around the attention's key padding and query
// blocks) and odd ones, with strided views.
#include "kernels/cpu/cpu.h"
#include "kernels/ref/ref.h"
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <gtest/gtest.h>
#include <numeric>
#include <random>
#include <vector>

namespace {

using namespace g4;
using g4test::randn;

struct Fixture {
    cpu::ThreadPool pool{2};
    std::vector<float> scratch;
    cpu::Context ctx;
    explicit Fixture(size_t stride) {
        scratch.assign(stride * pool.size(), 0.0f);
        ctx = {&pool, scratch.data(), stride};
    }
};

double rel(const std::vector<float>& a, const std::vector<float>& b) {
    return g4test::rel_l2(a.data(), b.data(), a.size());
}

TEST(EncoderOps, ClampMatchesReference) {
    Fixture f(16);
    const int rows = 37, cols = 100, ld = 112;
    std::vector<float> x = randn((size_t)rows * ld, 1, 2.0f), y_ref(x.size(), 0.0f), y(x.size(), 0.0f);
    ref::clamp({x.data(), ld, y_ref.data(), ld, rows, cols, -1.25f, 0.5f});
    cpu::clamp(f.ctx, {x.data(), ld, y.data(), ld, rows, cols, -1.25f, 0.5f});
    EXPECT_EQ(y, y_ref); // exact: no arithmetic
    EXPECT_EQ(*std::max_element(y.begin(), y.end()), 0.5f);
    EXPECT_EQ(*std::min_element(y.begin(), y.end()), -1.25f);
}

// An RMSNorm with RmsNormArgs' input clamp gives the bits of a Clamp op and then the norm (the executor's
// fusion of an audio tower's gradient clip): bf16 and fp32 weights, a norm over groups, a NaN and
// infinities passing the clamp as the Clamp op passes them, y apart from x and in place.
TEST(EncoderOps, RmsNormInputClampMatchesClampThenNorm) {
    Fixture f(16);
    const int rows = 37, cols = 1536, ld = 1544;
    std::vector<float> x = randn((size_t)rows * ld, 3, 30.0f);
    x[5] = std::nanf(""), x[ld + 7] = INFINITY, x[2 * ld + 9] = -INFINITY;
    const std::vector<float> wf = randn(cols, 4, 1.0f);
    std::vector<uint16_t> wb(cols);
    for (int i = 0; i < cols; ++i)
        wb[i] = f32_to_bf16(wf[i]);
    for (int variant = 0; variant < 4; ++variant) {
        SCOPED_TRACE("variant " + std::to_string(variant));
        const bool bf16 = variant & 1, in_place = variant & 2;
        const int dim   = variant == 2 ? 256 : cols;
        const void* w   = bf16 ? (const void*)wb.data() : (const void*)wf.data();
        const DType wdt = bf16 ? DType::BF16 : DType::F32;
        std::vector<float> clamped(x.size(), 0.0f), want(x.size(), 0.0f), got = in_place ? x : want;
        cpu::clamp(f.ctx, {x.data(), ld, clamped.data(), ld, rows, cols, -12.5f, 10.0f});
        cpu::rms_norm(f.ctx, {clamped.data(), ld, w, wdt, want.data(), ld, rows, cols, dim, 1e-6f});
        RmsNormArgs a{in_place ? got.data() : x.data(), ld, w, wdt, got.data(), ld, rows, cols, dim, 1e-6f};
        a.x_lo = -12.5f, a.x_hi = 10.0f;
        cpu::rms_norm(f.ctx, a);
        for (int r = 0; r < rows; ++r)
            ASSERT_EQ(std::memcmp(got.data() + (size_t)r * ld, want.data() + (size_t)r * ld, cols * 4), 0)
                << "row " << r;
        EXPECT_TRUE(std::isnan(got[variant == 2 ? 5 : 0])); // the NaN reached its group's sum
    }
}

struct AttnCase {
    int rows, heads, kv_heads, dim;
    float scale;
};
class SelfAttentionTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(SelfAttentionTest, MatchesReference) {
    const AttnCase c = GetParam();
    Fixture f(cpu::self_attention_thread_floats(c.rows));
    const int64_t qw = (int64_t)c.heads * c.dim, kvw = (int64_t)c.kv_heads * c.dim, ld = qw + 2 * kvw + 4;
    std::vector<float> qkv = randn((size_t)c.rows * ld, 5, 0.5f);
    std::vector<float> y_ref((size_t)c.rows * qw), y(y_ref.size(), -7.0f);
    std::vector<float> work(self_attention_work_floats(c.rows, c.kv_heads, c.dim));
    SelfAttentionArgs a{qkv.data(),
                        ld,
                        qkv.data() + qw,
                        ld,
                        qkv.data() + qw + kvw,
                        ld,
                        y_ref.data(),
                        qw,
                        c.rows,
                        c.heads,
                        c.kv_heads,
                        c.dim,
                        c.scale,
                        nullptr};
    ref::self_attention(a);
    a.y = y.data(), a.work = work.data();
    cpu::self_attention(f.ctx, a);
    EXPECT_LT(rel(y, y_ref), 2e-6);
}

INSTANTIATE_TEST_SUITE_P(EncoderShapes, SelfAttentionTest,
                         ::testing::Values(AttnCase{1, 2, 2, 64, 1.0f}, AttnCase{31, 4, 4, 64, 1.0f},
                                           AttnCase{33, 4, 2, 72, 1.0f}, AttnCase{100, 6, 3, 64, 0.125f},
                                           AttnCase{257, 2, 1, 64, 1.0f}));

TEST(EncoderOps, PoolRowsMatchesReferenceAndIdentity) {
    Fixture f(16);
    const int src = 96, cols = 40, taps = 9, cells = src / taps + 1;
    std::vector<float> x = randn((size_t)src * cols, 6);
    std::vector<int32_t> idx((size_t)cells * taps);
    std::mt19937 rng(7);
    for (int32_t& v : idx)
        v = (int32_t)(rng() % src);
    std::vector<float> y_ref((size_t)cells * cols), y(y_ref.size(), 3.0f);
    ref::pool_rows({x.data(), cols, idx.data(), y_ref.data(), cols, cells, cols, taps, 1.0f / taps});
    cpu::pool_rows(f.ctx, {x.data(), cols, idx.data(), y.data(), cols, cells, cols, taps, 1.0f / taps});
    EXPECT_LT(rel(y, y_ref), 1e-6);
    // One tap with weight 1 gathers rows exactly.
    std::vector<int32_t> one(src);
    std::iota(one.begin(), one.end(), 0);
    std::reverse(one.begin(), one.end());
    std::vector<float> g((size_t)src * cols);
    cpu::pool_rows(f.ctx, {x.data(), cols, one.data(), g.data(), cols, src, cols, 1, 1.0f});
    for (int r = 0; r < src; ++r)
        ASSERT_EQ(g[(size_t)r * cols + 3], x[(size_t)(src - 1 - r) * cols + 3]);
}

TEST(EncoderOps, VectorisedGeluMulMatchesReference) {
    Fixture f(16);
    const int rows = 50, cols = 300;
    std::vector<float> a = randn((size_t)rows * cols, 8, 2.0f), b = randn(a.size(), 9);
    std::vector<float> y_ref(a.size()), y(a.size());
    ref::gelu_mul({a.data(), cols, b.data(), cols, y_ref.data(), cols, rows, cols});
    cpu::gelu_mul_vec(f.ctx, {a.data(), cols, b.data(), cols, y.data(), cols, rows, cols});
    EXPECT_LT(rel(y, y_ref), 1e-6);
}

// A few long rows are split into column pieces over the pool: the same bits as one thread, for rows that
// start off a 64-byte boundary (ld not a multiple of 16) and a view that starts mid-row.
TEST(EncoderOps, VectorisedGeluMulSameBitsWhenSplit) {
    const int rows = 3, cols = 5000, ld = 5003;
    std::vector<float> a = randn((size_t)rows * ld + 8, 10, 2.0f), b = randn(a.size(), 11);
    for (int off : {0, 5}) {
        std::vector<float> y1(a.size(), 0.0f), y4(a.size(), 0.0f);
        for (int threads : {1, 4}) {
            cpu::ThreadPool pool(threads);
            cpu::Context ctx{&pool, nullptr, 0};
            std::vector<float>& y = threads == 1 ? y1 : y4;
            cpu::gelu_mul_vec(ctx, {a.data() + off, ld, b.data() + off, ld, y.data() + off, ld, rows, cols});
        }
        EXPECT_EQ(std::memcmp(y1.data(), y4.data(), y1.size() * sizeof(float)), 0) << "offset " << off;
    }
}

} // namespace
