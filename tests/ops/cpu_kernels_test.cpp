// Eigen CPU kernels vs the scalar reference (kernels/ref) at Gemma 4 E2B/E4B shapes: hidden 1536/2560,
// q widths 2048/4096, MLP 6144/10240/12288, head dims 256/512, PLE 35x256, MQA and GQA; the NF4 GEMV at
// decode shapes and odd ones. The plain matmul at the projection shapes is a set of rows of the op test
// table (op_table_test.cpp); this file keeps what a row cannot say (kernel tiers, threads, strided views).
#include "compiler/nf4_quant.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/kernel_list.h"
#include "kernels/nf4.h"
#include "kernels/q16.h"
#include "kernels/ref/ref.h"
#include "models/gemma4/model.h"
#include "runtime/src/cpu_lm_screen.h"
#include "test_util.h"

#include <cmath>
#include <cstring>
#include <gtest/gtest.h>
#include <limits>
#include <random>
#include <vector>

namespace {

using namespace g4;
using g4test::randn;
using g4test::to_bf16;

struct Fixture {
    cpu::ThreadPool pool{2};
    std::vector<float> scratch;
    cpu::Context ctx;
    Fixture(int64_t max_k, int64_t max_slots) {
        size_t stride = cpu::scratch_floats_per_thread(max_k, max_slots);
        scratch.assign(stride * pool.size(), 0.0f);
        ctx = {&pool, scratch.data(), stride};
    }
};

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
    return g4test::rel_l2(a.data(), b.data(), a.size());
}

struct MatShape {
    int rows;
    int64_t n, k;
};

// matmul_gemm (the towers' many-row path) against the reference: partial register blocks in rows, columns and
// k (kGemmMr x kGemmNr blocks, kGemmKc-deep panels), strided views left untouched outside, the same bits with
// 1 and 2 threads.
TEST(CpuKernels, MatmulGemmMatchesReference) {
    const MatShape shapes[] = {{1, 5, 3},      {13, 31, 7},      {15, 33, 513},
                               {29, 64, 1024}, {266, 1536, 768}, {100, 97, 1100}};
    for (const MatShape& s : shapes) {
        const int64_t ldx = s.k + 3, ldy = s.n + 5;
        auto x  = randn((size_t)s.rows * ldx, 11);
        auto wf = randn((size_t)s.n * s.k, 12, 0.05f);
        auto wb = to_bf16(wf);
        for (DType dt : {DType::F32, DType::BF16}) {
            const void* w = dt == DType::F32 ? (const void*)wf.data() : (const void*)wb.data();
            std::vector<float> y_ref((size_t)s.rows * ldy, -7.0f), y1(y_ref), y2(y_ref);
            MatmulArgs a{x.data(), ldx, w, dt, s.n, s.k, y_ref.data(), ldy, s.rows};
            ref::matmul(a);
            const size_t stride =
                std::max(cpu::scratch_floats_per_thread(s.k, 0), cpu::gemm_scratch_floats());
            for (int threads : {1, 2}) {
                cpu::ThreadPool pool(threads);
                std::vector<float> scratch(stride * threads);
                cpu::Context ctx{&pool, scratch.data(), stride};
                a.y = threads == 1 ? y1.data() : y2.data();
                cpu::matmul_gemm(ctx, a);
            }
            EXPECT_LT(max_rel(y1, y_ref), 1e-5)
                << dtype_str(dt) << " rows " << s.rows << " n " << s.n << " k " << s.k;
            EXPECT_EQ(std::memcmp(y1.data(), y2.data(), sizeof(float) * y1.size()), 0);
            for (int r = 0; r < s.rows; ++r)
                for (int64_t j = s.n; j < ldy; ++j)
                    ASSERT_EQ(y1[r * ldy + j], -7.0f);
        }
    }
}

// Both gemm_block versions: this build's (AVX-512 where the CPU has it) and the portable one a build
// without AVX-512 uses, so CI covers both whatever machine it runs on.
TEST(CpuKernels, GemmBlockAccumulates) {
    std::printf("gemm_block: AVX-512 kernel %s in this build\n",
                cpu::gemm_has_avx512() ? "present" : "absent");
    for (int portable = 0; portable < 2; ++portable) {
        const int rows = 17, cols = 45, k = 70, lda = 80, ldb = 50, ldc = 48;
        auto a = randn(rows * lda, 21), b = randn(k * ldb, 22), c0 = randn(rows * ldc, 23);
        std::vector<float> c = c0;
        (portable ? cpu::gemm_block_portable : cpu::gemm_block)(rows, cols, k, a.data(), lda, b.data(), ldb,
                                                                c.data(), ldc, true);
        double num = 0, den = 0;
        for (int i = 0; i < rows; ++i)
            for (int j = 0; j < ldc; ++j) {
                double want = c0[i * ldc + j];
                if (j < cols)
                    for (int p = 0; p < k; ++p)
                        want += (double)a[i * lda + p] * b[p * ldb + j];
                else
                    ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]);
                num += (c[i * ldc + j] - want) * (c[i * ldc + j] - want), den += want * want;
            }
        EXPECT_LT(std::sqrt(num / den), 1e-6) << (portable ? "portable" : "this build's");
    }
}

// gemm_block_bf16 (the bf16 attention's products) against a double-precision sum of its bf16 pairs, with
// b both as kGemmNr-wide panels (K^T) and as one strided row block (V), columns past a panel and odd rows.
TEST(CpuKernels, GemmBlockBf16MatchesPairSums) {
    const int rows = 13, kp = 37, lda = 40;
    for (int layout = 0; layout < 2; ++layout) {
        const int cols    = layout ? 72 : 45;
        const int64_t ldb = layout ? cols : cpu::kGemmNr;
        const int64_t pnl = layout ? cpu::kGemmNr : (int64_t)kp * cpu::kGemmNr;
        const int64_t bsz = layout ? (int64_t)kp * cols : (cols + cpu::kGemmNr - 1) / cpu::kGemmNr * pnl;
        const int ldc     = cols + 3;
        auto af = randn((size_t)rows * lda * 2, 41), bf = randn((size_t)bsz * 2, 42);
        std::vector<uint16_t> ab(af.size()), bb(bf.size());
        for (size_t i = 0; i < af.size(); ++i)
            ab[i] = f32_to_bf16(af[i]);
        for (size_t i = 0; i < bf.size(); ++i)
            bb[i] = f32_to_bf16(bf[i]);
        const uint32_t* a = (const uint32_t*)ab.data();
        const uint32_t* b = (const uint32_t*)bb.data();
        auto c0 = randn((size_t)rows * ldc, 43), c = c0;
        cpu::gemm_block_bf16(rows, cols, kp, a, lda, b, ldb, pnl, c.data(), ldc, true);
        auto half = [](uint32_t u, int h) {
            return (double)bf16_to_f32((uint16_t)(h ? u >> 16 : u & 0xFFFF));
        };
        double num = 0, den = 0;
        for (int i = 0; i < rows; ++i)
            for (int j = 0; j < ldc; ++j) {
                if (j >= cols) {
                    ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]);
                    continue;
                }
                double want = c0[i * ldc + j];
                for (int q = 0; q < kp; ++q) {
                    const uint32_t x = a[i * lda + q],
                                   w = b[(j / cpu::kGemmNr) * pnl + q * ldb + j % cpu::kGemmNr];
                    want += half(x, 0) * half(w, 0) + half(x, 1) * half(w, 1);
                }
                num += (c[i * ldc + j] - want) * (c[i * ldc + j] - want), den += want * want;
            }
        EXPECT_LT(std::sqrt(num / den), 1e-6) << "layout " << layout;
    }
}

// bf16 GEMM against a double-precision reference on bf16-rounded operands: only the fp32 summation differs.
TEST(CpuKernels, MatmulGemmBf16MatchesRoundedReference) {
    std::printf("matmul_gemm_bf16: AVX-512 BF16 kernel %s in this build\n",
                cpu::gemm_has_avx512_bf16() ? "present" : "absent");
    cpu::ThreadPool pool{2};
    std::vector<float> scratch(cpu::gemm_bf16_scratch_floats() * pool.size());
    cpu::Context ctx{&pool, scratch.data(), cpu::gemm_bf16_scratch_floats()};
    struct Case {
        int rows;
        int64_t n, k;
        DType dt;
    };
    // Tails in every dimension: rows not a multiple of kGemmMr, n past a panel group, k odd and past kGemmKc;
    // with and without the fused clamps (bounds that cut off some x and some y, a NaN in x passing through).
    for (const Case& cs : {Case{37, 150, 1031, DType::BF16}, Case{5, 32, 64, DType::F32},
                           Case{100, 97, 7, DType::BF16}, Case{1, 300, 513, DType::F32}})
        for (int variant = 0; variant < 4; ++variant) {
            const bool portable = variant & 1, clamped = variant & 2;
            const int64_t ldx = cs.k + 3, ldy = cs.n + 5;
            auto x  = randn((size_t)cs.rows * ldx, 31);
            auto wf = randn((size_t)cs.n * cs.k, 32);
            std::vector<uint16_t> wb(wf.size());
            for (size_t i = 0; i < wf.size(); ++i)
                wb[i] = f32_to_bf16(wf[i]);
            std::vector<float> y((size_t)cs.rows * ldy, -7.0f);
            MatmulArgs a{
                x.data(), ldx,  cs.dt == DType::BF16 ? (const void*)wb.data() : (const void*)wf.data(),
                cs.dt,    cs.n, cs.k,
                y.data(), ldy,  cs.rows};
            const float ylim = 0.5f * std::sqrt((float)cs.k); // about half the outputs' spread
            if (clamped) a.x_lo = -1.2f, a.x_hi = 0.9f, a.y_lo = -ylim, a.y_hi = 0.7f * ylim;
            const bool nan = clamped && cs.rows > 3;
            if (nan) x[3 * ldx] = NAN;
            ASSERT_TRUE(cpu::gemm_bf16_clamps(ctx, a));
            (portable ? cpu::matmul_gemm_bf16_portable : cpu::matmul_gemm_bf16)(ctx, a);
            if (nan) { // row 3 is NaN throughout; the check below skips it
                for (int64_t j = 0; j < cs.n; ++j) {
                    ASSERT_TRUE(std::isnan(y[3 * ldy + j])) << "column " << j;
                }
            }
            double num = 0, den = 0, num_f = 0;
            int cut_x = 0, cut_y = 0;
            for (int i = 0; i < cs.rows; ++i)
                for (int64_t j = 0; j < ldy; ++j) {
                    const float got = y[i * ldy + j];
                    if (j >= cs.n) {
                        ASSERT_EQ(got, -7.0f);
                        continue;
                    }
                    if (nan && i == 3) continue;
                    double want = 0, want_f = 0;
                    for (int64_t p = 0; p < cs.k; ++p) {
                        const float xv = std::min(std::max(x[i * ldx + p], a.x_lo), a.x_hi);
                        cut_x += xv != x[i * ldx + p];
                        want += (double)bf16_to_f32(f32_to_bf16(xv)) * bf16_to_f32(wb[j * cs.k + p]);
                        want_f += (double)xv * wf[j * cs.k + p];
                    }
                    const double uncut = want;
                    want               = std::min(std::max(want, (double)a.y_lo), (double)a.y_hi);
                    want_f             = std::min(std::max(want_f, (double)a.y_lo), (double)a.y_hi);
                    cut_y += want != uncut;
                    num += (got - want) * (got - want), den += want * want,
                        num_f += (got - want_f) * (got - want_f);
                }
            if (clamped && cs.k > 7) { // the bounds did cut
                EXPECT_GT(cut_x, 0);
                EXPECT_GT(cut_y, 0);
            }
            const double err = std::sqrt(num / den), err_f = std::sqrt(num_f / den);
            EXPECT_LT(err, 1e-6) << (portable ? "portable" : "this build's") << " rows " << cs.rows << " n "
                                 << cs.n << " k " << cs.k;
            // And it really is bf16: against unrounded fp32 operands the error is bf16-sized.
            EXPECT_GT(err_f, 1e-4);
            EXPECT_LT(err_f, 1e-2);
        }
}

// gemm_bf16_clamps says where each level's matmul_gemm_bf16 applies MatmulArgs' clamps: with the full
// gemm_bf16_scratch_floats(), what plans compiled before the AMX group grew give, less than the AVX-512 BF16
// and portable kernels need (the AMX tiles still run) and less than any needs (matmul, which ignores the
// clamps), y lies within its bounds exactly where it says so.
TEST(CpuKernels, GemmBf16ClampsWhereItsKernelsApplyThem) {
    cpu::ThreadPool pool{2};
    const int rows = 40, n = 64, k = 96;
    auto x = randn((size_t)rows * k, 71), w = randn((size_t)n * k, 72);
    for (int l = 0; l < cpu::kLevelCount; ++l) {
        const cpu::Kernels* t = cpu::level_kernels((cpu::Level)l);
        if (!t) continue;
        for (const size_t stride :
             {t->gemm_bf16_scratch_floats(), (size_t)42512, (size_t)30000, (size_t)12000}) {
            SCOPED_TRACE(std::string(cpu::level_name((cpu::Level)l)) + " stride " + std::to_string(stride));
            std::vector<float> scratch(stride * pool.size()), y((size_t)rows * n);
            cpu::Context ctx{&pool, scratch.data(), stride};
            MatmulArgs a{x.data(), k, w.data(), DType::F32, n, k, y.data(), n, rows};
            a.x_lo = -1.0f, a.x_hi = 1.0f, a.y_lo = -2.0f, a.y_hi = 1.5f; // y's spread is about 10
            const bool clamps = t->gemm_bf16_clamps(ctx, a);
            EXPECT_TRUE(clamps || stride != t->gemm_bf16_scratch_floats()); // the full scratch: always
            t->matmul_gemm_bf16(ctx, a);
            bool within = true;
            for (float v : y)
                within = within && v >= a.y_lo && v <= a.y_hi;
            EXPECT_EQ(within, clamps);
        }
    }
}

// The amx level's bf16 GEMM and attention products (AMX tiles) against the avx512_bf16 level's in one
// process: the same bf16 operands and fp32 sums, in another order. Tails in rows (not a multiple of 32), n
// (past a panel) and k (odd, past kGemmKc); bf16 and fp32 weights.
TEST(CpuKernels, AmxGemmBf16MatchesAvx512Bf16) {
    if (!cpu::level_supported(cpu::Level::Amx))
        GTEST_SKIP()
            << "no amx level (this build's compiler, the CPU's AMX-TILE/AMX-BF16 or the OS's grant of "
               "the tile state is missing; levels here: "
            << cpu::supported_levels() << ")";
    const cpu::Kernels* amx  = cpu::level_kernels(cpu::Level::Amx);
    const cpu::Kernels* bf16 = cpu::level_kernels(cpu::Level::Avx512Bf16);
    ASSERT_NE(bf16, nullptr);
    cpu::ThreadPool pool{3};
    // Odd strides (the kernel aligns its own): the full scratch (up to 16 panels a task), one for 4 (what
    // plans compiled before the group grew give); rows below and above the count that takes larger groups.
    for (const size_t stride : {amx->gemm_bf16_scratch_floats() + 5, (size_t)42512 + 5})
        for (const int rows : {77, 333, 1100})
            for (DType dt : {DType::BF16, DType::F32}) {
                SCOPED_TRACE("stride " + std::to_string(stride) + " rows " + std::to_string(rows));
                std::vector<float> scratch(stride * pool.size() + 1);
                cpu::Context ctx{&pool, scratch.data() + 1, stride};
                const int n       = dt == DType::BF16 ? (rows > 100 ? 1000 : 200) : (rows > 1000 ? 300 : 45),
                          k       = dt == DType::BF16 ? 1037 : 64;
                const int64_t ldx = k + 3, ldy = n + 5;
                auto x = randn((size_t)rows * ldx, 51), wf = randn((size_t)n * k, 52);
                std::vector<uint16_t> wb(wf.size());
                for (size_t i = 0; i < wf.size(); ++i)
                    wb[i] = f32_to_bf16(wf[i]);
                std::vector<float> y0((size_t)rows * ldy, -7.0f), y1 = y0;
                MatmulArgs a{
                    x.data(),  ldx, dt == DType::BF16 ? (const void*)wb.data() : (const void*)wf.data(),
                    dt,        n,   k,
                    y0.data(), ldy, rows};
                if (rows > 100) a.x_lo = -1.0f, a.x_hi = 1.5f, a.y_lo = -10.0f, a.y_hi = 8.0f; // fused clamps
                bf16->matmul_gemm_bf16(ctx, a);
                a.y = y1.data();
                amx->matmul_gemm_bf16(ctx, a);
                for (int i = 0; i < rows; ++i)
                    for (int64_t j = n; j < ldy; ++j)
                        ASSERT_EQ(y1[i * ldy + j], -7.0f);
                EXPECT_LT(max_rel(y1, y0), 1e-6) << (dt == DType::BF16 ? "bf16" : "fp32") << " weights";
            }
    // gemm_block_bf16 (the bf16 attention's products) at the attention's shapes: 24 query rows against K^T
    // panels (kp = 32 pairs, head dim 64), then P . V (kp = keys / 2, 64 strided columns), accumulating.
    for (int layout = 0; layout < 2; ++layout) {
        const int rows = 24, cols = layout ? 64 : 96, kp = layout ? 400 : 32, lda = kp + 3, ldc = cols + 5;
        const int64_t ldb = layout ? cols + 16 : cpu::kGemmNr;
        const int64_t pnl = layout ? cpu::kGemmNr : (int64_t)kp * cpu::kGemmNr;
        const int64_t bsz = layout ? (int64_t)kp * ldb : (cols + cpu::kGemmNr - 1) / cpu::kGemmNr * pnl;
        auto af = randn((size_t)rows * lda * 2, 53), bf = randn((size_t)bsz * 2, 54);
        std::vector<uint16_t> ab(af.size()), bb(bf.size());
        for (size_t i = 0; i < af.size(); ++i)
            ab[i] = f32_to_bf16(af[i]);
        for (size_t i = 0; i < bf.size(); ++i)
            bb[i] = f32_to_bf16(bf[i]);
        auto c0 = randn((size_t)rows * ldc, 55), c1 = c0;
        bf16->gemm_block_bf16(rows, cols, kp, (const uint32_t*)ab.data(), lda, (const uint32_t*)bb.data(),
                              ldb, pnl, c0.data(), ldc, true);
        amx->gemm_block_bf16(rows, cols, kp, (const uint32_t*)ab.data(), lda, (const uint32_t*)bb.data(), ldb,
                             pnl, c1.data(), ldc, true);
        EXPECT_LT(max_rel(c1, c0), 1e-6) << "gemm_block_bf16 layout " << layout;
    }
}

// The amx level's NF4 matmul for prefill chunks (int16_x and bf16_rows, more than q16::kMaxRows rows) against
// its definition: bf16(x) . bf16(dequantized W)^T with exact products, summed here in double. Tails in rows
// (not a multiple of 32), n (past a panel) and k (past kGemmKc); single and double quant; a scratch that
// holds 32 rows of x at a time (further passes) and one too small for any (the int16 GEMM instead).
TEST(CpuKernels, AmxNf4GemmMatchesBf16Definition) {
    if (!cpu::level_supported(cpu::Level::Amx))
        GTEST_SKIP() << "no amx level (levels here: " << cpu::supported_levels() << ")";
    const cpu::Kernels* amx = cpu::level_kernels(cpu::Level::Amx);
    struct Case {
        int rows;
        int64_t n, k;
        bool dq;
        int scratch; // 0: as a session sizes it; 1: 32 rows of x a pass; 2: too small for the AMX path
    };
    const Case cases[] = {{64, 1536, 1536, true, 0},
                          {77, 200, 640, false, 0},
                          {37, 256, 6144, true, 0},
                          {77, 96, 1536, true, 1},
                          {40, 64, 128, false, 2}};
    for (const Case& cs : cases) {
        const int64_t ldx = cs.k + 3, ldy = cs.n + 5;
        auto x    = randn((size_t)cs.rows * ldx, 61, 1.0f);
        auto wf   = randn((size_t)(cs.n * cs.k), 62, 0.02f);
        auto blob = nf4::quantize(wf.data(), cs.n * cs.k, cs.dq);
        std::vector<float> wd((size_t)(cs.n * cs.k));
        nf4::dequantize(blob.data(), nf4::layout(cs.n * cs.k, cs.dq), 0, cs.n * cs.k, wd.data());
        std::vector<float> y((size_t)cs.rows * ldy, -7.0f), want = y;
        double num = 0, den = 0;
        for (int i = 0; i < cs.rows; ++i)
            for (int64_t j = 0; j < cs.n; ++j) {
                double acc = 0;
                for (int64_t p = 0; p < cs.k; ++p)
                    acc += (double)bf16_to_f32(f32_to_bf16(x[i * ldx + p])) *
                           bf16_to_f32(f32_to_bf16(wd[j * cs.k + p]));
                want[i * ldy + j] = (float)acc;
            }
        cpu::ThreadPool pool{3};
        // a task's part: one panel (these shapes have few columns for 3 threads) of min(k, kGemmKc) / 2 pairs
        const int64_t lx = cs.k / 2 + 16, task = std::min<int64_t>(cs.k, cpu::kGemmKc) / 2 * cpu::kGemmNr +
                                                 32 * cpu::kGemmNr + 16;
        const size_t stride = cs.scratch == 0   ? cpu::scratch_floats_per_thread(cs.k, 0)
                              : cs.scratch == 1 ? (size_t)task + (32 * lx + 16) / 3 + 1
                                                : (size_t)task;
        std::vector<float> scratch(stride * pool.size() + 1);
        cpu::Context ctx{&pool, scratch.data() + 1, stride}; // unaligned: the kernel aligns its own
        MatmulArgs a{x.data(), ldx, blob.data(), DType::NF4, cs.n, cs.k, y.data(), ldy, cs.rows};
        a.nf4_double_quant = cs.dq;
        a.int16_x          = true;
        a.bf16_rows        = true;
        amx->matmul(ctx, a);
        for (int i = 0; i < cs.rows; ++i) {
            for (int64_t j = 0; j < cs.n; ++j) {
                const double d = (double)y[i * ldy + j] - want[i * ldy + j];
                num += d * d, den += (double)want[i * ldy + j] * want[i * ldy + j];
            }
            for (int64_t j = cs.n; j < ldy; ++j)
                ASSERT_EQ(y[i * ldy + j], -7.0f) << "row " << i << " column " << j;
        }
        const double err = std::sqrt(num / den);
        if (cs.scratch == 2) // the int16 GEMM's arithmetic: near the definition, not at it
            EXPECT_LT(err, 1e-2) << "rows " << cs.rows << " n " << cs.n << " k " << cs.k;
        else
            EXPECT_LT(err, 1e-6) << "rows " << cs.rows << " n " << cs.n << " k " << cs.k << " dq " << cs.dq
                                 << " scratch " << cs.scratch;
        // Without bf16_rows (the fast precision) the amx level runs the int16 GEMM, as the others do.
        if (cs.scratch == 0) {
            const cpu::Kernels* bf16 = cpu::level_kernels(cpu::Level::Avx512Bf16);
            ASSERT_NE(bf16, nullptr);
            std::vector<float> y1 = y, y2 = y;
            a.bf16_rows = false;
            a.y         = y1.data();
            amx->matmul(ctx, a);
            a.y = y2.data();
            bf16->matmul(ctx, a);
            EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0);
        }
    }
}

TEST(CpuKernels, MatmulHandlesStridedViews) {
    Fixture f(64, 16);
    const int rows = 4, k = 64, n = 40, ldx = 100, ldy = 90;
    auto x = randn(rows * ldx, 3);
    auto w = randn(n * k, 4);
    std::vector<float> y_ref(rows * ldy, -7.0f), y_cpu(rows * ldy, -7.0f);
    MatmulArgs a{x.data() + 5, ldx, w.data(), DType::F32, n, k, y_ref.data() + 10, ldy, rows};
    ref::matmul(a);
    a.y = y_cpu.data() + 10;
    cpu::matmul(f.ctx, a);
    EXPECT_LT(max_rel(y_cpu, y_ref), 1e-6);
    EXPECT_EQ(y_cpu[0], -7.0f); // untouched outside the view
}

// ---- NF4 GEMV (1..8 rows) --------------------------------------------------------------------------------

struct Nf4Shape {
    int rows;
    int64_t n, k;
};

struct Nf4Case {
    std::vector<float> x;
    std::vector<uint8_t> blob;
    MatmulArgs a;
    Nf4Case(const Nf4Shape& s, bool dq, int64_t ldx, int64_t ldy, std::vector<float>& y) {
        x      = randn((size_t)s.rows * ldx, 21, 1.0f);
        auto w = randn((size_t)(s.n * s.k), 22, 0.02f);
        blob   = nf4::quantize(w.data(), s.n * s.k, dq);
        y.assign((size_t)s.rows * ldy, -7.0f);
        a = MatmulArgs{x.data(), ldx, blob.data(), DType::NF4, s.n, s.k, y.data(), ldy, s.rows};
        a.nf4_double_quant = dq;
    }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class Nf4GemvTest : public ::testing::TestWithParam<Nf4Shape> {};

TEST_P(Nf4GemvTest, MatchesReference) {
    const Nf4Shape s = GetParam();
    Fixture f(s.k, 16);
    for (bool dq : {false, true}) {
        SCOPED_TRACE(dq ? "double quant" : "single quant");
        std::vector<float> y_ref, y_gemv, y_mm;
        Nf4Case c(s, dq, s.k, s.n, y_ref);
        ref::matmul(c.a);
        y_gemv.assign(y_ref.size(), 0.0f);
        c.a.y = y_gemv.data();
        cpu::matmul_nf4_gemv(f.ctx, c.a);
        EXPECT_LT(max_rel(y_gemv, y_ref), 1e-5);
        y_mm.assign(y_ref.size(), 0.0f);
        c.a.y = y_mm.data();
        cpu::matmul(f.ctx, c.a);
        EXPECT_TRUE(same_bits(y_mm, y_gemv)) << "cpu::matmul takes the GEMV for " << s.rows << " rows";
    }
}

// E2B (q, kv, o, MLP up/down, double-wide MLP) and E4B (q, kv, o, MLP) decode projections; 2..8 rows; then
// K not a multiple of 64 (blocks straddle rows of W, rows start on odd elements), N not a multiple of the
// 16-column task, K below one block.
INSTANTIATE_TEST_SUITE_P(
    Shapes, Nf4GemvTest,
    ::testing::Values(Nf4Shape{1, 2048, 1536}, Nf4Shape{1, 256, 1536}, Nf4Shape{1, 1536, 2048},
                      Nf4Shape{1, 6144, 1536}, Nf4Shape{1, 1536, 6144}, Nf4Shape{1, 12288, 1536},
                      Nf4Shape{1, 1536, 12288}, Nf4Shape{1, 2048, 2560}, Nf4Shape{1, 512, 2560},
                      Nf4Shape{1, 2560, 2048}, Nf4Shape{1, 10240, 2560}, Nf4Shape{1, 2560, 10240},
                      Nf4Shape{2, 2048, 1536}, Nf4Shape{3, 256, 1536}, Nf4Shape{4, 1536, 6144},
                      Nf4Shape{5, 512, 2560}, Nf4Shape{6, 2560, 2048}, Nf4Shape{7, 1536, 2048},
                      Nf4Shape{8, 6144, 1536}, Nf4Shape{1, 40, 100}, Nf4Shape{7, 33, 75}, Nf4Shape{8, 17, 96},
                      Nf4Shape{2, 1537, 257}, Nf4Shape{3, 2111, 257}, Nf4Shape{3, 19, 64},
                      Nf4Shape{5, 45, 128}, Nf4Shape{4, 5, 33}, Nf4Shape{1, 3, 1}, Nf4Shape{6, 64, 6143}),
    [](const auto& i) {
        return "rows" + std::to_string(i.param.rows) + "_n" + std::to_string(i.param.n) + "_k" +
               std::to_string(i.param.k);
    });

// Row views inside wider buffers: only the first K columns of x are read and the first N of y written.
// One NF4 matrix-vector case in strided views (x's padding NaN, never read; y's padding untouched) against
// the reference, through `run` (the float32 GEMV, or the int16 path with `int16_x`).
void check_strided_nf4(const Fixture& f, int64_t k, int rows, bool dq, bool int16_x,
                       void (*run)(const cpu::Context&, const MatmulArgs&)) {
    SCOPED_TRACE("k " + std::to_string(k) + " rows " + std::to_string(rows) + (dq ? " dq" : ""));
    const int64_t n = 37, ldx = k + 29, ldy = n + 11;
    std::vector<float> y_ref, y_cpu;
    Nf4Case c({rows, n, k}, dq, ldx, ldy, y_ref);
    c.a.int16_x = int16_x;
    for (int t = 0; t < rows; ++t)
        for (int64_t j = k; j < ldx; ++j)
            c.x[t * ldx + j] = NAN;
    ref::matmul(c.a);
    y_cpu.assign(y_ref.size(), -7.0f);
    c.a.y = y_cpu.data();
    run(f.ctx, c.a);
    for (int t = 0; t < rows; ++t)
        for (int64_t j = 0; j < ldy; ++j) {
            const float r = y_ref[t * ldy + j], v = y_cpu[t * ldy + j];
            if (j >= n)
                ASSERT_EQ(v, -7.0f) << "row " << t << " col " << j;
            else
                ASSERT_NEAR(v, r, 1e-5f * (1.0f + std::fabs(r))) << "row " << t << " col " << j;
        }
}

TEST(Nf4Gemv, StridedViews) {
    for (int64_t k : {128, 100}) {
        Fixture f(k, 16);
        for (int rows = 1; rows <= cpu::kNf4GemvMaxRows; ++rows)
            for (bool dq : {false, true})
                check_strided_nf4(f, k, rows, dq, false, cpu::matmul_nf4_gemv);
    }
}

// x = one-hot rows: every output is one weight, which must equal nf4::element bit for bit (the exact
// codebook[c] * absmax product, double-quantized absmax included).
TEST(Nf4Gemv, OneHotRowsGiveExactWeights) {
    for (int64_t k : {1536, 96, 75}) {
        const int64_t n = 48;
        Fixture f(k, 16);
        for (bool dq : {false, true}) {
            const int rows = cpu::kNf4GemvMaxRows;
            std::vector<float> y;
            Nf4Case c({rows, n, k}, dq, k, n, y);
            std::fill(c.x.begin(), c.x.end(), 0.0f);
            int64_t col[rows];
            for (int t = 0; t < rows; ++t)
                col[t] = (t * 37 + 5) % k, c.x[t * k + col[t]] = 1.0f;
            cpu::matmul_nf4_gemv(f.ctx, c.a);
            const nf4::Layout l = nf4::layout(n * k, dq);
            for (int t = 0; t < rows; ++t)
                for (int64_t j = 0; j < n; ++j)
                    ASSERT_EQ(y[t * n + j], nf4::element(c.blob.data(), l, j * k + col[t]))
                        << "k " << k << (dq ? " dq" : "") << " row " << t << " col " << j;
        }
    }
}

// The same bits for 1, 2 and 3 threads, and for each row of x whether it comes alone or with 1..7 others
// (N * K large enough for the pool to be used).
TEST(Nf4Gemv, DeterministicAcrossThreadsAndRowCounts) {
    for (int64_t k : {1536, 257}) {
        const int64_t n = 2111;
        const int rows  = cpu::kNf4GemvMaxRows;
        for (bool dq : {false, true}) {
            SCOPED_TRACE("k " + std::to_string(k) + (dq ? " dq" : ""));
            std::vector<float> y;
            Nf4Case c({rows, n, k}, dq, k, n, y);
            std::vector<float> first;
            for (int threads : {1, 2, 3}) {
                cpu::ThreadPool pool(threads);
                std::vector<float> scratch(cpu::scratch_floats_per_thread(k, 16) * threads);
                cpu::Context ctx{&pool, scratch.data(), cpu::scratch_floats_per_thread(k, 16)};
                std::fill(y.begin(), y.end(), 0.0f);
                cpu::matmul_nf4_gemv(ctx, c.a);
                if (first.empty())
                    first = y;
                else
                    EXPECT_TRUE(same_bits(y, first)) << threads << " threads";
                for (int r = 1; r < rows; ++r) {
                    for (int t0 = 0; t0 + r <= rows; t0 += r) {
                        std::vector<float> part((size_t)r * n);
                        MatmulArgs a = c.a;
                        a.x = c.x.data() + t0 * k, a.y = part.data(), a.rows = r;
                        cpu::matmul_nf4_gemv(ctx, a);
                        const std::vector<float> want(first.begin() + t0 * n, first.begin() + (t0 + r) * n);
                        EXPECT_TRUE(same_bits(part, want))
                            << "rows " << t0 << ".." << t0 + r - 1 << ", " << threads << " threads";
                    }
                }
            }
        }
    }
}

// NF4 x int16 (MatmulArgs::int16_x, kernels/q16.h): 1..8 rows in strided views against the reference (the
// integer dot products are exact: only the fp32 sum of the block terms differs), single and double quant.
TEST(Nf4Int16, StridedViewsMatchReference) {
    for (int64_t k : {1536, 128}) {
        Fixture f(k, 16);
        for (int rows = 1; rows <= q16::kMaxRows; ++rows)
            for (bool dq : {false, true})
                check_strided_nf4(f, k, rows, dq, true, cpu::matmul);
    }
}

// The integer path approximates the float32 NF4 GEMV: x and the codebook rounded to 2^-15 of their block's
// largest value give about 5e-5 relative L2 at E2B's decode shapes (bound 1e-3).
TEST(Nf4Int16, CloseToFloat32Gemv) {
    for (const Nf4Shape& s : {Nf4Shape{1, 6144, 1536}, Nf4Shape{1, 1536, 6144}, Nf4Shape{3, 2048, 1536}}) {
        SCOPED_TRACE("n " + std::to_string(s.n) + " k " + std::to_string(s.k));
        Fixture f(s.k, 16);
        std::vector<float> y_f32, y_int;
        Nf4Case c(s, false, s.k, s.n, y_f32);
        cpu::matmul(f.ctx, c.a);
        y_int.assign(y_f32.size(), 0.0f);
        c.a.y = y_int.data(), c.a.int16_x = true;
        cpu::matmul(f.ctx, c.a);
        const double rel = max_rel(y_int, y_f32);
        std::printf("NF4_INT16 n=%lld k=%lld rows=%d int16_vs_f32_rel_l2=%.3e\n", (long long)s.n,
                    (long long)s.k, s.rows, rel);
        EXPECT_GT(rel, 0.0) << "the integer path ran";
        EXPECT_LT(rel, 1e-3);
    }
}

// The same bits for 1, 2 and 3 threads, and for each row of x whether it comes alone or with others.
TEST(Nf4Int16, DeterministicAcrossThreadsAndRowCounts) {
    const int64_t n = 2111, k = 1536;
    const int rows = q16::kMaxRows;
    std::vector<float> y;
    Nf4Case c({rows, n, k}, true, k, n, y);
    c.a.int16_x = true;
    std::vector<float> first;
    for (int threads : {1, 2, 3}) {
        cpu::ThreadPool pool(threads);
        std::vector<float> scratch(cpu::scratch_floats_per_thread(k, 16) * threads);
        cpu::Context ctx{&pool, scratch.data(), cpu::scratch_floats_per_thread(k, 16)};
        std::fill(y.begin(), y.end(), 0.0f);
        cpu::matmul(ctx, c.a);
        if (first.empty())
            first = y;
        else
            EXPECT_TRUE(same_bits(y, first)) << threads << " threads";
        for (int r : {1, 3, 5}) {
            std::vector<float> part((size_t)r * n);
            MatmulArgs a = c.a;
            a.x = c.x.data() + k, a.y = part.data(), a.rows = r;
            cpu::matmul(ctx, a);
            const std::vector<float> want(first.begin() + n, first.begin() + (1 + r) * n);
            EXPECT_TRUE(same_bits(part, want)) << "rows 1.." << r << ", " << threads << " threads";
        }
    }
}

// The bf16 GEMV of the fast precision (int16_x with bf16 weights, 1..8 rows: cpu::matmul_bf16_gemv) against
// the reference in strided views, k a whole number of every level's chunks or not (tails of 8 and 7), rows
// outside the view untouched; the same bits for 1 and 3 threads.
TEST(Bf16Gemv, StridedViewsMatchReference) {
    const int64_t n = 300;
    for (int64_t k : {1536, 264, 7}) {
        const int64_t ldx = k + 5, ldy = n + 3;
        const std::vector<uint16_t> w = to_bf16(randn((size_t)(n * k), 32, 0.05f));
        for (int rows : {1, 3, 4, 8}) {
            SCOPED_TRACE("k " + std::to_string(k) + " rows " + std::to_string(rows));
            const std::vector<float> x = randn((size_t)rows * ldx, 31);
            std::vector<float> y_ref((size_t)rows * ldy, -7.0f), y1(y_ref), y3(y_ref);
            MatmulArgs a{x.data(), ldx, w.data(), DType::BF16, n, k, y_ref.data(), ldy, rows};
            a.int16_x = true;
            ref::matmul(a);
            for (int threads : {1, 3}) {
                cpu::ThreadPool pool(threads);
                std::vector<float> scratch(cpu::scratch_floats_per_thread(k, 16) * threads);
                const cpu::Context ctx{&pool, scratch.data(), cpu::scratch_floats_per_thread(k, 16)};
                a.y = threads == 1 ? y1.data() : y3.data();
                cpu::matmul(ctx, a);
            }
            EXPECT_TRUE(same_bits(y1, y3));
            for (int t = 0; t < rows; ++t)
                for (int64_t j = 0; j < ldy; ++j) {
                    const float r = y_ref[t * ldy + j], v = y1[t * ldy + j];
                    if (j >= n)
                        ASSERT_EQ(v, -7.0f) << "row " << t << " col " << j;
                    else
                        ASSERT_NEAR(v, r, 1e-5f * (1.0f + std::fabs(r))) << "row " << t << " col " << j;
                }
        }
    }
}

// ---- NF4 x int16 GEMM (cpu::matmul_nf4_gemm_int16: more than q16::kMaxRows rows)
// ----------------------------

// Partial row tiles and column groups in strided views against the reference, single and double quant.
TEST(Nf4Int16Gemm, StridedViewsMatchReference) {
    for (int64_t k : {1536, 128}) {
        Fixture f(k, 16);
        for (int rows : {9, 16, 33, 64})
            for (bool dq : {false, true})
                check_strided_nf4(f, k, rows, dq, true, cpu::matmul);
    }
}

// The GEMM quantizes x to the GEMV's values and forms the same integer products: against the GEMV run 8 rows
// a call, only the fp32 order of the block sums differs (and blocks of zeros, tiny values or one large
// outlier quantize alike).
TEST(Nf4Int16Gemm, SameArithmeticAsGemv) {
    const int64_t n = 300, k = 1536;
    const int rows = 50;
    Fixture f(k, 16);
    std::vector<float> y_gemm, y_gemv;
    Nf4Case c({rows, n, k}, true, k, n, y_gemm);
    c.a.int16_x = true;
    for (int64_t j = 0; j < 64; ++j) {
        c.x[3 * k + j]       = 0.0f;                 // a zero block
        c.x[4 * k + 64 + j]  = 1e-39f * (float)j;    // a subnormal block (quantizes to zero)
        c.x[5 * k + 128 + j] = j == 7 ? 1e4f : 0.5f; // one outlier
    }
    cpu::matmul(f.ctx, c.a);
    y_gemv.assign(y_gemm.size(), 0.0f);
    for (int r = 0; r < rows; r += q16::kMaxRows) {
        MatmulArgs a = c.a;
        a.x = c.x.data() + r * k, a.y = y_gemv.data() + r * n, a.rows = std::min(q16::kMaxRows, rows - r);
        cpu::matmul_nf4_int16(f.ctx, a);
    }
    EXPECT_LT(max_rel(y_gemm, y_gemv), 1e-6);
}

// The largest products: every x of a block at its amax (q = 16383) against codes of +-1 (16384) of the same
// signs. A block's dot product (64 * 16383 * 16384) exceeds int32; the kernel converts every 8 products.
TEST(Nf4Int16Gemm, LargestBlockProductsDoNotOverflow) {
    const int64_t n = 8, k = 256;
    const int rows = 16;
    Fixture f(k, 16);
    std::vector<float> w((size_t)(n * k)), x((size_t)rows * k), y_ref((size_t)rows * n), y((size_t)rows * n);
    for (int64_t i = 0; i < n * k; ++i)
        w[i] = (i / k) % 2 ? -1.0f : 1.0f;
    for (size_t i = 0; i < x.size(); ++i)
        x[i] = (i / k) % 3 ? 2.5f : -2.5f;
    const std::vector<uint8_t> blob = nf4::quantize(w.data(), n * k, false);
    MatmulArgs a{x.data(), k, blob.data(), DType::NF4, n, k, y_ref.data(), n, rows};
    a.int16_x = true;
    ref::matmul(a);
    a.y = y.data();
    cpu::matmul(f.ctx, a);
    for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_NEAR(std::fabs(y_ref[i]), 2.5 * (double)k, 1e-2) << i;
        ASSERT_NEAR(y[i], y_ref[i], 1e-5f * std::fabs(y_ref[i])) << i;
    }
}

// The same bits for 1, 2, 3 and 24 threads (a pool for which the tasks take fewer columns each), and for each
// row of x whether it comes with 63 others or 11.
TEST(Nf4Int16Gemm, DeterministicAcrossThreadsAndRowCounts) {
    const int64_t n = 517, k = 1536;
    const int rows = 64;
    std::vector<float> y;
    Nf4Case c({rows, n, k}, false, k, n, y);
    c.a.int16_x = true;
    std::vector<float> first;
    for (int threads : {1, 2, 3, 24}) {
        cpu::ThreadPool pool(threads);
        std::vector<float> scratch(cpu::scratch_floats_per_thread(k, 16) * threads);
        cpu::Context ctx{&pool, scratch.data(), cpu::scratch_floats_per_thread(k, 16)};
        std::fill(y.begin(), y.end(), 0.0f);
        cpu::matmul(ctx, c.a);
        if (first.empty())
            first = y;
        else
            EXPECT_TRUE(same_bits(y, first)) << threads << " threads";
        std::vector<float> part((size_t)11 * n);
        MatmulArgs a = c.a;
        a.x = c.x.data() + 20 * k, a.y = part.data(), a.rows = 11;
        cpu::matmul(ctx, a);
        const std::vector<float> want(first.begin() + 20 * n, first.begin() + 31 * n);
        EXPECT_TRUE(same_bits(part, want)) << "rows 20..30, " << threads << " threads";
    }
}

TEST(CpuKernels, RmsNormGroupsWithAndWithoutWeight) {
    Fixture f(16, 16);
    for (int dim : {256, 512, 1536}) {
        const int rows = 3, cols = dim == 1536 ? 1536 : dim * 8;
        auto x  = randn(rows * cols, 5, 3.0f);
        auto w  = randn(dim, 6);
        auto wb = to_bf16(w);
        for (bool with_w : {true, false}) {
            std::vector<float> r(rows * cols), c(rows * cols);
            RmsNormArgs a{x.data(),    cols,     with_w ? (const void*)wb.data() : nullptr,
                          DType::BF16, r.data(), cols,
                          rows,        cols,     dim,
                          1e-6f};
            ref::rms_norm(a);
            a.y = c.data();
            cpu::rms_norm(f.ctx, a);
            EXPECT_LT(max_rel(c, r), 1e-6) << "dim " << dim << " weight " << with_w;
        }
    }
}

TEST(CpuKernels, EmbedScaleAndGather) {
    Fixture f(16, 16);
    const int64_t V = 1000, N = 8960;
    auto tab                 = to_bf16(randn(V * N, 7));
    std::vector<int32_t> ids = {2, 999, 0, 17};
    std::vector<float> r(ids.size() * N), c(ids.size() * N);
    EmbedArgs a{ids.data(), tab.data(), DType::BF16, V, N, 16.0f, r.data(), N, (int)ids.size()};
    ref::embed(a);
    a.y = c.data();
    cpu::embed(f.ctx, a);
    EXPECT_EQ(c, r);
}

TEST(CpuKernels, ElementwiseOps) {
    Fixture f(16, 16);
    const int rows = 9, cols = 12288;
    auto a = randn(rows * cols, 8, 2.0f), b = randn(rows * cols, 9);
    std::vector<float> r(rows * cols), c(rows * cols);
    BinaryArgs ba{a.data(), cols, b.data(), cols, r.data(), cols, rows, cols};
    ref::gelu_mul(ba);
    ba.y = c.data();
    cpu::gelu_mul(f.ctx, ba);
    EXPECT_LT(max_rel(c, r), 1e-6);
    ba.y = r.data();
    ref::add(ba);
    ba.y = c.data();
    cpu::add(f.ctx, ba);
    EXPECT_LT(max_rel(c, r), 1e-7);
    uint16_t scalar = f32_to_bf16(0.4375f);
    ScaleArgs sa{a.data(), cols, r.data(), cols, rows, cols, 0.5f, &scalar, DType::BF16, 0.0f};
    ref::scale(sa);
    sa.y = c.data();
    cpu::scale(f.ctx, sa);
    EXPECT_LT(max_rel(c, r), 1e-7);
    EXPECT_FLOAT_EQ(c[1], a[1] * 0.5f * 0.4375f);
    auto big = randn(4 * 262144, 10, 20.0f);
    std::vector<float> r2(big.size()), c2(big.size());
    ScaleArgs sc{big.data(), 262144, r2.data(), 262144, 4, 262144, 1.0f, nullptr, DType::F32, 30.0f};
    ref::softcap(sc);
    sc.y = c2.data();
    cpu::softcap(f.ctx, sc);
    EXPECT_LT(max_rel(c2, r2), 1e-6);
}

TEST(CpuKernels, RopeBothVariants) {
    Fixture f(16, 16);
    gemma4::TextHParams hp;
    hp.head_dim = 256, hp.head_dim_full = 512, hp.partial_rotary_full = 0.25f;
    for (auto t : {gemma4::LayerType::Sliding, gemma4::LayerType::Full}) {
        int dim        = t == gemma4::LayerType::Full ? 512 : 256;
        auto inv       = gemma4::rope_inv_freq(hp, t);
        const int rows = 5, heads = 8;
        auto x = randn(rows * heads * dim, 11);
        auto r = x, c = x;
        RopeArgs a{r.data(), heads * dim, inv.data(), rows, heads, dim, 8190};
        ref::rope(a);
        a.x = c.data();
        cpu::rope(f.ctx, a);
        EXPECT_LT(max_rel(c, r), 1e-6);
        if (t == gemma4::LayerType::Full) {
            // Proportional RoPE: only 64 of 256 angle pairs rotate; dims 64..255 pass through.
            EXPECT_EQ(inv[63] > 0, true);
            EXPECT_EQ(inv[64], 0.0f);
            EXPECT_EQ(c[100], x[100]);
            EXPECT_NE(c[10], x[10]);
        }
    }
}

struct AttnShape {
    int rows, heads, kv_heads, dim, slots, window, pos0;
};
class AttentionTest : public ::testing::TestWithParam<AttnShape> {};

TEST_P(AttentionTest, MatchesReference) {
    AttnShape s = GetParam();
    Fixture f(16, s.slots);
    const int width = s.kv_heads * s.dim;
    auto q          = randn((size_t)s.rows * s.heads * s.dim, 12, 0.2f);
    auto kc         = randn((size_t)s.slots * width, 13);
    auto vc         = randn((size_t)s.slots * width, 14);
    std::vector<float> r((size_t)s.rows * s.heads * s.dim), c(r.size()), scratch(s.slots + 64);
    AttentionArgs a{q.data(),        s.heads * s.dim, kc.data(), vc.data(),  r.data(),
                    s.heads * s.dim, s.rows,          s.heads,   s.kv_heads, s.dim,
                    s.slots,         s.window,        s.pos0,    1.0f,       scratch.data()};
    ref::attention(a);
    a.y = c.data();
    cpu::attention(f.ctx, a);
    EXPECT_LT(max_rel(c, r), 1e-5);
}

// cpu::attention_prefill (the query heads of a few rows per task, key blocks, online softmax), f32 and bf16
// caches: against the reference, and the same bits with 1 and 3 threads.
TEST_P(AttentionTest, PrefillKernelMatchesReference) {
    AttnShape s = GetParam();
    Fixture f(4096, s.slots);
    const int width = s.kv_heads * s.dim;
    auto q          = randn((size_t)s.rows * s.heads * s.dim, 12, 0.2f);
    auto kc         = randn((size_t)s.slots * width, 13);
    auto vc         = randn((size_t)s.slots * width, 14);
    auto kb = to_bf16(kc), vb = to_bf16(vc);
    for (DType dt : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(dt == DType::F32 ? "f32 cache" : "bf16 cache");
        const void* k = dt == DType::F32 ? (const void*)kc.data() : (const void*)kb.data();
        const void* v = dt == DType::F32 ? (const void*)vc.data() : (const void*)vb.data();
        std::vector<float> r((size_t)s.rows * s.heads * s.dim), c(r.size()), c3(r.size()),
            scratch(s.slots + 64);
        AttentionArgs a{q.data(), s.heads * s.dim, k,
                        v,        r.data(),        s.heads * s.dim,
                        s.rows,   s.heads,         s.kv_heads,
                        s.dim,    s.slots,         s.window,
                        s.pos0,   1.0f / 16.0f,    scratch.data(),
                        dt};
        ref::attention(a);
        ASSERT_GE(f.ctx.scratch_stride, cpu::attention_prefill_floats(a));
        a.y = c.data();
        cpu::attention_prefill(f.ctx, a);
        EXPECT_LT(max_rel(c, r), 1e-5);
        cpu::ThreadPool pool(3);
        std::vector<float> sc(f.ctx.scratch_stride * 3);
        a.y = c3.data();
        cpu::attention_prefill({&pool, sc.data(), f.ctx.scratch_stride}, a);
        EXPECT_TRUE(same_bits(c3, c));
    }
}

// E2B sliding (MQA, d=256, 512-window ring wrapped), E2B full (d=512), E4B GQA 4:1, decode and chunks.
INSTANTIATE_TEST_SUITE_P(
    GemmaShapes, AttentionTest,
    ::testing::Values(AttnShape{1, 8, 1, 256, 575, 512, 2000}, AttnShape{4, 8, 1, 512, 1024, 0, 700},
                      AttnShape{3, 8, 2, 256, 575, 512, 9}, AttnShape{1, 8, 2, 512, 4096, 0, 4095},
                      AttnShape{64, 8, 2, 256, 575, 512, 600}, AttnShape{64, 8, 1, 256, 575, 512, 0},
                      AttnShape{37, 8, 1, 512, 1024, 0, 150}, AttnShape{20, 8, 1, 256, 575, 512, 1100}),
    [](const auto& i) {
        const AttnShape& a = i.param;
        return "rows" + std::to_string(a.rows) + "_kv" + std::to_string(a.kv_heads) + "_d" +
               std::to_string(a.dim) + "_slots" + std::to_string(a.slots) + "_win" +
               std::to_string(a.window) + "_pos" + std::to_string(a.pos0);
    });

// A bf16 cache: chunk rows stored (rounded to nearest even) by the Eigen and the reference kv_store
// into the same ring, then attention by both over the cache, which reads the widened values.
TEST_P(AttentionTest, Bf16CacheMatchesReference) {
    AttnShape s = GetParam();
    Fixture f(16, s.slots);
    const int width = s.kv_heads * s.dim;
    auto q          = randn((size_t)s.rows * s.heads * s.dim, 12, 0.2f);
    auto kc         = to_bf16(randn((size_t)s.slots * width, 13));
    auto vc         = to_bf16(randn((size_t)s.slots * width, 14));
    auto k = randn((size_t)s.rows * (width + 8), 15), v = randn((size_t)s.rows * (width + 8), 16);
    auto kr = kc, vr = vc;
    KvStoreArgs st{k.data(), width + 8, v.data(), width + 8, kr.data(),  vr.data(),
                   s.rows,   width,     s.slots,  s.pos0,    DType::BF16};
    ref::kv_store(st);
    st.k_cache = kc.data(), st.v_cache = vc.data();
    cpu::kv_store(f.ctx, st);
    ASSERT_EQ(kc, kr);
    ASSERT_EQ(vc, vr);
    for (int t = 0; t < s.rows; ++t)
        for (int i = 0; i < width; i += 37) {
            const int64_t slot = (s.pos0 + t) % s.slots;
            EXPECT_EQ(kc[slot * width + i], f32_to_bf16(k[t * (width + 8) + i]));
            EXPECT_EQ(vc[slot * width + i], f32_to_bf16(v[t * (width + 8) + i]));
        }
    std::vector<float> r((size_t)s.rows * s.heads * s.dim), c(r.size()), scratch(s.slots + 64);
    AttentionArgs a{q.data(),       s.heads * s.dim, kc.data(), vc.data(), r.data(), s.heads * s.dim, s.rows,
                    s.heads,        s.kv_heads,      s.dim,     s.slots,   s.window, s.pos0,          1.0f,
                    scratch.data(), DType::BF16};
    ref::attention(a);
    a.y = c.data();
    cpu::attention(f.ctx, a);
    EXPECT_LT(max_rel(c, r), 1e-5);
    // The same values in an f32 cache give the same result: both are widened rows through one code path.
    std::vector<float> kf(kc.size()), vf(vc.size()), c32(r.size());
    for (size_t i = 0; i < kc.size(); ++i)
        kf[i] = bf16_to_f32(kc[i]), vf[i] = bf16_to_f32(vc[i]);
    AttentionArgs a32 = a;
    a32.k_cache = kf.data(), a32.v_cache = vf.data(), a32.cache_dt = DType::F32, a32.y = c32.data();
    cpu::attention(f.ctx, a32);
    EXPECT_EQ(c32, c);
}

TEST(CpuKernels, KvStoreWrapsRing) {
    const int width = 16, slots = 5, rows = 3;
    auto k = randn(rows * width, 15), v = randn(rows * width, 16);
    std::vector<float> kc(slots * width, 0), vc(slots * width, 0);
    ref::kv_store({k.data(), width, v.data(), width, kc.data(), vc.data(), rows, width, slots, 4});
    EXPECT_EQ(kc[4 * width], k[0]);     // position 4 -> slot 4
    EXPECT_EQ(kc[0 * width], k[width]); // position 5 -> slot 0
    EXPECT_EQ(vc[1 * width + 3], v[2 * width + 3]);
    std::vector<uint16_t> kb(slots * width, 0), vb(slots * width, 0);
    ref::kv_store(
        {k.data(), width, v.data(), width, kb.data(), vb.data(), rows, width, slots, 4, DType::BF16});
    EXPECT_EQ(kb[0 * width + 5], f32_to_bf16(k[width + 5]));
    EXPECT_EQ(vb[1 * width + 3], f32_to_bf16(v[2 * width + 3]));
}

TEST(CpuKernels, Bf16RoundingIsNearestEven) {
    // Halfway cases round to the even neighbour; just above halfway rounds up; NaN stays a NaN.
    EXPECT_EQ(f32_to_bf16(1.0f + 0.5f / 128), 0x3F80); // 1 + 2^-8: halfway, 0x3F80 is even
    EXPECT_EQ(f32_to_bf16(1.0f + 1.5f / 128), 0x3F82); // 1 + 3 * 2^-8: halfway, up to the even 0x3F82
    EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + 0.5f / 128, 2.0f)), 0x3F81);
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

// ---- LM-head screening (kernels/cpu/lm_screen.cpp, runtime/src/cpu_lm_screen.cpp) ----

// A bf16 head [n, k]: random rows at scales over three decades, one zero row.
struct ScreenHead {
    int64_t n, k;
    std::vector<uint16_t> w;
    std::vector<int8_t> q;
    std::vector<float> scale, bound, qnorm;
    std::vector<int32_t> qsum;
    ScreenHead(int64_t n_, int64_t k_, uint32_t seed) : n(n_), k(k_) {
        std::vector<float> wf = randn((size_t)(n * k), seed, 0.05f);
        std::mt19937 rng(seed);
        std::uniform_real_distribution<float> e(-2.0f, 1.0f);
        for (int64_t r = 0; r < n; ++r) {
            const float f = r == 3 ? 0.0f : std::pow(10.0f, e(rng));
            for (int64_t i = 0; i < k; ++i)
                wf[r * k + i] *= f;
        }
        w = to_bf16(wf);
        build();
    }
    void build() {
        q.assign((size_t)(n * k), 0), scale.assign(n, 0), bound.assign(n, 0), qnorm.assign(n, 0),
            qsum.assign(n, 0);
        cpu::lm_screen_build(w.data(), k, 0, n, copy());
    }
    cpu::LmScreenCopy copy() { return {q.data(), scale.data(), bound.data(), qnorm.data(), qsum.data()}; }
    // What a decode step's head computes: the bf16 GEMV of the fast precision, the bias added after it.
    std::vector<float> exact(Fixture& f, const std::vector<float>& x, const float* bias) {
        std::vector<float> y(n);
        MatmulArgs a{x.data(), k, w.data(), DType::BF16, n, k, y.data(), n, 1};
        a.int16_x = true;
        cpu::matmul(f.ctx, a);
        if (bias)
            for (int64_t r = 0; r < n; ++r)
                y[r] = y[r] + bias[r];
        return y;
    }
};

// Inputs x of the head: Gaussian, with a few outliers 100x the rest, tiny, and mixed signs and scales.
std::vector<float> screen_x(int64_t k, int kind, uint32_t seed) {
    std::vector<float> x = randn((size_t)k, seed, kind == 2 ? 1e-6f : 1.0f);
    if (kind == 1)
        for (int64_t i = 0; i < k; i += 37)
            x[i] *= 100.0f;
    if (kind == 3)
        for (int64_t i = 0; i < k; ++i)
            x[i] *= (i % 3 == 0 ? 20.0f : 0.3f);
    return x;
}

// lo[r] <= the logit the head computes <= hi[r] for every row, max_lo <= the largest logit: K a multiple of
// the vector width and not, vocabularies across several screening tasks, with and without a bias.
TEST(LmScreen, BoundHoldsForEveryRow) {
    Fixture f(2048, 64);
    for (auto [n, k] : {std::pair<int64_t, int64_t>{700, 64}, {1501, 200}, {4099, 1536}}) {
        ScreenHead h(n, k, (uint32_t)(n + k));
        std::vector<float> bias = randn((size_t)n, 5, 0.5f), hi(n), lo(n);
        for (int kind = 0; kind < 4; ++kind)
            for (const float* b : {(const float*)nullptr, (const float*)bias.data()}) {
                const std::vector<float> x = screen_x(k, kind, (uint32_t)(kind * 31 + n));
                const cpu::LmScreenResult r =
                    cpu::lm_screen(f.ctx, {x.data(), h.q.data(), h.scale.data(), h.bound.data(),
                                           h.qnorm.data(), h.qsum.data(), b, n, k, hi.data(), lo.data()});
                ASSERT_TRUE(r.screened);
                const std::vector<float> y = h.exact(f, x, b);
                float mx = -std::numeric_limits<float>::infinity(), mlo = mx;
                for (int64_t i = 0; i < n; ++i) {
                    ASSERT_LE(lo[i], y[i]) << "n " << n << " k " << k << " kind " << kind << " row " << i;
                    ASSERT_GE(hi[i], y[i]) << "n " << n << " k " << k << " kind " << kind << " row " << i;
                    mx = std::max(mx, y[i]), mlo = std::max(mlo, lo[i]);
                }
                EXPECT_EQ(r.max_lo, mlo);
                EXPECT_LE(r.max_lo, mx);
            }
    }
    std::vector<float> x(64, 0.0f), hi(700);
    ScreenHead h(700, 64, 9);
    EXPECT_FALSE(cpu::lm_screen(f.ctx, {x.data(), h.q.data(), h.scale.data(), h.bound.data(), h.qnorm.data(),
                                        h.qsum.data(), nullptr, 700, 64, hi.data()})
                     .screened); // zero x: nothing to quantize
}

// The screened greedy token is the full head's (softcap(x . w^T + bias), the lowest index among equal
// maxima) on heads with exact ties and rows one bf16 step from the best, and the rows it computes carry the
// full head's bits.
TEST(LmScreen, ArgmaxIsTheFullHeads) {
    Fixture f(2048, 64);
    const int64_t n = 2300, k = 192;
    int screened = 0;
    for (uint32_t seed = 1; seed <= 6; ++seed) {
        ScreenHead h(n, k, 100 + seed);
        std::vector<float> x    = screen_x(k, seed % 4 == 2 ? 0 : seed % 4, seed),
                           bias = randn((size_t)n, seed, 0.2f);
        const float* b          = seed % 2 ? bias.data() : nullptr;
        // The best row copied below and above it, and again with one element one bf16 step up or down.
        std::vector<float> y0 = h.exact(f, x, b);
        const int64_t best    = std::max_element(y0.begin(), y0.end()) - y0.begin();
        const int64_t lowest  = std::min<int64_t>(best, 7);
        for (int64_t dst : {int64_t(7), n - 5, n / 2, n / 3})
            if (dst != best) {
                std::copy_n(h.w.begin() + best * k, k, h.w.begin() + dst * k);
                if (b) bias[dst] = bias[best];
            }
        h.w[(n / 2) * k + 5] += 1, h.w[(n / 3) * k + 9] -= 1;
        h.build();
        for (float cap : {0.0f, 30.0f}) {
            std::vector<float> full = h.exact(f, x, b);
            if (cap > 0)
                cpu::softcap(f.ctx,
                             {full.data(), n, full.data(), n, 1, (int32_t)n, 1.0f, nullptr, DType::F32, cap});
            const int64_t want = std::max_element(full.begin(), full.end()) - full.begin();
            EXPECT_TRUE(want == lowest || want == n / 2 || want == n / 3) << want; // the ties: the lowest
            std::vector<float> y(n), g = h.exact(f, x, nullptr);
            int64_t computed  = 0;
            const int32_t tok = rt::lm_screen_argmax(
                f.ctx, h.copy(), {x.data(), h.w.data(), b, n, k, cap, y.data()}, &computed);
            if (tok < 0) continue; // not screened: the caller computes the whole head
            ++screened;
            EXPECT_EQ(tok, want) << "seed " << seed << " cap " << cap;
            EXPECT_GE(computed, 3);
            EXPECT_LT(computed, n);
            for (int64_t r = 0; r < n; ++r)
                if (y[r] != -std::numeric_limits<float>::infinity()) {
                    ASSERT_EQ(y[r], g[r]) << "row " << r;
                }
        }
    }
    EXPECT_GE(screened, 8);
}

} // namespace
