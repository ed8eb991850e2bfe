// Decode MLP lab, tensor-core variant (sm_90): the fused MLP of kernels.cu (g4_mlp_nf4: every
// weight byte is one pair-table lookup and two FFMAs against x in f32, ~4 instructions a weight) against a
// kernel whose products run on mma.sync m16n8k16 (f16 in, f32 accumulate) at batch 1. The weight codes
// still go through a pair table in shared memory, now of f16 pairs that are the A fragment's registers as
// they come; x goes in as B's first two columns, its f16 high part in column 0 and the remainder in column 1
// (the other six are zero), so the two columns' sum carries x to ~22 bits. LO=1 also splits each code into
// f16 high + f16 remainder (a tile's two row halves; hi + lo = the f32 code to ~2^-24): the same arithmetic
// as the f32 kernels up to the order of the sums. LO=0 uses the code book rounded to f16 (up to 3.3e-4 of a
// code away) with half the table traffic. x and act are scaled by a power of two (block-wide max) into f16's
// range first, and the sums scaled back: exact, and no overflow for any finite input.
//   g4_mlp_mma<LO, DQ, D, D2, KS, NA>: grid I / 32, 128 KS threads; warp w (of 4) owns intermediates
//     32j + 8w .. + 7 over a 1 / KS share of H in 64-column blocks, D blocks in flight a thread. LO: the gate
//     tile's rows g / g + 8 are row 32j + 8w + g's high / remainder codes (one 64-bit lookup is the A
//     registers a0a1 as loaded), the up tile likewise; else rows g / g + 8 are the gate / up rows. Thread
//     (g, t) reads bytes 8t .. 8t + 7 of its rows' 32-byte block; the mma's k order is permuted to match, so
//     x[16t .. 16t + 15] of the block is its B fragment in order. NA 2: the 16-column steps alternate
//     between two accumulators. act goes through shared memory; then the down slice j in 32-row groups
//     (lane group g takes rows 4g .. 4g + 3, one red.global.add.v4 stores them), D2 groups in flight. DQ:
//     double-quant block scales, else f32.
// What it found (docs/performance.md; H100): exact to the f32 kernels (err
// <= 1.1e-6) and slower at every shape (E2B wide 24.8-26.9 us against g4_mlp_nf4's 19.8; E4B 36.0-40.2
// against 26.0); the f16 code book (err 2.8e-4) also loses except E2B narrow at two warps a tile (13.46
// against 13.83, but b256's 11.39). The pair-table lookup a byte stays; the mmas replace only the FFMAs.
// Graph modes as bench/labs/mlp_tma_lab.cu: MLPs back to back; with a one-block ResNorm stand-in between
// them; back to back on one weight set (L2-resident). G4_LAB_F32=1: block scales as f32 absmax (g4 compile's
// default), else double quant. G4_LAB_BASE_ONLY=1: kernels.cu's kernels only (and their earlier form
// that read either scale format). G4_LAB_SHAPES="H:I,...": other shapes. G4_LAB_PROFILE=<shape index>: each
// variant once, no timing (for ncu
// --kernel-name regex:g4_mlp). Build with the CUDA toolkit from the repo root (an sm_90 GPU runs it):
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o build/mlp_mma_lab bench/labs/mlp_mma_lab.cu &&
//   build/mlp_mma_lab [reps]
#include "kernels/cuda/all_kernels.cuh"
#include "runtime/src/cuda/kernel_args.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <random>
#include <string>
#include <vector>

#include "bench/labs/bench_cuda.h"
#include "bench/labs/mlp_lab.h"
#include "bench/labs/mlp_sets.h"

// ---------------------------------------------------------------------------------------------------
__device__ __forceinline__ u32 f2h(float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}
__device__ __forceinline__ float h2f(u32 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
    return f;
}
// d += A (16 x 16, f16, row) * B (16 x 8, f16, col), f32.
__device__ __forceinline__ void mma16816(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// The f16 pair table in the wide table's geometry (rows of 256 bytes, entry e in row e; bytes 128..255
// free): LO, copy s (lane % 16) of {hi pair, lo pair} at e * 256 + 8 s; else copy s (the lane) of the hi
// pair at e * 256 + 4 s. A pair holds the byte's two codes in element order, the first in the low half.
// Eight lanes fill an entry's 128 bytes with one 16-byte store each (a warp: four rows, no bank conflict).
template <bool LO> __device__ __forceinline__ void nf4_half_table(char* sm) {
    for (int i = threadIdx.x; i < 256 * 8; i += blockDim.x) {
        const int e = i >> 3, q = i & 7;
        const float c0 = kNf4[e >> 4], c1 = kNf4[e & 15];
        const u32 h0 = f2h(c0), h1 = f2h(c1), hp = h0 | h1 << 16;
        uint4 v;
        if (LO) {
            const u32 lp = f2h(c0 - h2f(h0)) | f2h(c1 - h2f(h1)) << 16;
            v            = make_uint4(hp, lp, hp, lp);
        } else {
            v = make_uint4(hp, hp, hp, hp);
        }
        *(uint4*)(sm + e * 256 + 16 * q) = v;
    }
}
// Byte B of code word w through the table: {hi pair, lo pair} (LO) or {hi pair, 0}.
template <bool LO, int B> __device__ __forceinline__ uint2 half_pair(const char* tb, u32 w, u32 lane_off) {
    const u32 off = __byte_perm(w, lane_off, 0x5504u | (B << 4));
    if (LO) return *(const uint2*)(tb + off);
    return make_uint2(*(const u32*)(tb + off), 0u);
}
// 2^e as a float, e in [-126, 127].
__device__ __forceinline__ float pow2f(int e) {
    return __int_as_float((127 + e) << 23);
}
// The exponent s that puts amax * 2^s in [2^14, 2^15) (clamped to +-100; 0 for amax 0).
__device__ __forceinline__ int f16_shift(float amax) {
    const int e = (int)((__float_as_uint(amax) >> 23) & 0xffu) - 127;
    return amax > 0.0f ? max(-100, min(100, 14 - e)) : 0;
}
// v (already scaled) as f16 high parts and remainders of two values: {hi pair, lo pair}.
__device__ __forceinline__ uint2 split2(float v0, float v1) {
    const u32 h0 = f2h(v0), h1 = f2h(v1);
    return make_uint2(h0 | h1 << 16, f2h(v0 - h2f(h0)) | f2h(v1 - h2f(h1)) << 16);
}
// One 16-column step jj (bytes 2jj, 2jj + 1 of code word w) of a tile into acc. LO: tile rows g / g + 8 are
// one weight row's hi / lo codes (the pair table's two words are the A registers as loaded); else rows
// g / g + 8 are two weight rows, words w and w2.
template <bool LO, int JJ>
__device__ __forceinline__ void tile_step(float* acc, const char* tb, u32 w, u32 w2, u32 lane_off, u32 b0,
                                          u32 b1) {
    const uint2 p = half_pair<LO, 2 * JJ>(tb, w, lane_off), q = half_pair<LO, 2 * JJ + 1>(tb, w, lane_off);
    if (LO) {
        mma16816(acc, p.x, p.y, q.x, q.y, b0, b1);
    } else {
        const uint2 p2 = half_pair<LO, 2 * JJ>(tb, w2, lane_off),
                    q2 = half_pair<LO, 2 * JJ + 1>(tb, w2, lane_off);
        mma16816(acc, p.x, p2.x, q.x, q2.x, b0, b1);
    }
}
// kernels.cu's scale format for the gate/up blocks: double quant (DQ) or f32.
template <bool DQ> constexpr int kScales = DQ ? NF4_SCALES_DQ : NF4_SCALES_F32;

// KS warps a tile (each a 1 / KS share of the 64-column blocks), NA accumulators a matrix (the 16-column
// steps alternate between them: shorter mma chains). H % (64 KS D) == 0, H % (128 KS D2) == 0.
template <bool LO, bool DQ, int D, int D2, int KS = 1, int NA = 1>
__device__ __forceinline__ void mlp_mma_body(const MlpArgs& a, char* sm) {
    constexpr int NW = 4 * KS;
    __shared__ float s_act[MLP_S];
    __shared__ float s_part[KS][2][MLP_S];
    __shared__ float s_red[32];
    const int j = blockIdx.x, H = a.H, I = a.I, nb = H / 64;
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int w = wi & 3, kh = wi >> 2, bbeg = kh * (nb / KS), bend = bbeg + nb / KS;
    const GemvMat &G = a.gu.m[0], &U = a.gu.m[1];
    const int irow  = MLP_S * j + 8 * w + g; // this lane group's intermediate
    const long blk0 = (long)irow * nb;       // its first 64-column block (row-major scale index)
    const u8* gp    = (const u8*)G.w + (long)irow * (H / 2) + 8 * t;
    const u8* upp   = (const u8*)U.w + (long)irow * (H / 2) + 8 * t;
    // Gate/up ring: block b's codes and raw scales in slot b % D.
    uint2 cg[D], cu[D];
    u32 rg[D], ru[D];
    auto load_gu = [&](int d, int b) {
        cg[d] = __ldcs((const uint2*)(gp + 32 * b)), cu[d] = __ldcs((const uint2*)(upp + 32 * b));
        rg[d] = nf4_raw<kScales<DQ>>(G.absmax, G.absmax2, blk0 + b);
        ru[d] = nf4_raw<kScales<DQ>>(U.absmax, U.absmax2, blk0 + b);
    };
#pragma unroll
    for (int d = 0; d < D; ++d)
        load_gu(d, bbeg + d);
    // Down ring: a 32-row group R0's codes (rows R0 + 4g + i, bytes 4t .. 4t + 3) and raw scales.
    const u8* tile = a.dn.codes + (long)j * H * (MLP_S / 2) + 4 * t;
    const int c64  = j / 2;
    u32 dc[D2][4], dr[D2][4];
    auto load_dn = [&](int d, int R0) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
            dc[d][i] = __ldcs((const u32*)(tile + (long)(R0 + 4 * g + i) * (MLP_S / 2)));
        a.dn.raw4(c64, H, R0 + 4 * g, dr[d]);
    };
#pragma unroll
    for (int d = 0; d < D2; ++d)
        load_dn(d, 32 * wi + 32 * NW * d);
    nf4_half_table<LO>(sm);
    pdl_begin();
    // x * 2^xs as f16 hi / lo halves in the free half rows: block b's hi in row b, its lo in row nb + b;
    // row 2 nb zero (the B fragment of lanes g >= 2).
    const float* x = a.gu.x;
    float xmax     = 0.0f;
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        xmax = fmaxf(xmax, fabsf(x[i]));
    const int xs   = f16_shift(block_reduce<true>(xmax, s_red));
    const float xm = pow2f(xs);
    for (int i = threadIdx.x; i < H / 2; i += blockDim.x) {
        const float2 v = ((const float2*)x)[i];
        const uint2 p  = split2(v.x * xm, v.y * xm);
        const int b = (2 * i) >> 6, o = 128 + 4 * (i & 31);
        *(u32*)(sm + b * 256 + o)        = p.x;
        *(u32*)(sm + (nb + b) * 256 + o) = p.y;
    }
    if (threadIdx.x < 32) *(u32*)(sm + 2 * nb * 256 + 128 + 4 * threadIdx.x) = 0u;
    __syncthreads();
    const char* tb     = sm;
    const u32 lane_off = LO ? (lane & 15) * 8 : lane * 4;
    const char* xb     = sm + 128 + 32 * t + (g == 0 ? 0 : g == 1 ? nb * 256 : 2 * nb * 256);
    const int xstep    = g < 2 ? 256 : 0;
    float accg = 0.0f, accu = 0.0f;
    for (int b0 = bbeg; b0 < bend; b0 += D) {
#pragma unroll
        for (int d = 0; d < D; ++d) {
            const int b    = b0 + d;
            const uint4 x0 = *(const uint4*)(xb + b * xstep), x1 = *(const uint4*)(xb + b * xstep + 16);
            float tg[4] = {0.0f, 0.0f, 0.0f, 0.0f}, tu[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            float tg2[4] = {0.0f, 0.0f, 0.0f, 0.0f}, tu2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            float* tgb = NA > 1 ? tg2 : tg;
            float* tub = NA > 1 ? tu2 : tu;
            if (LO) {
                tile_step<LO, 0>(tg, tb, cg[d].x, 0u, lane_off, x0.x, x0.y);
                tile_step<LO, 0>(tu, tb, cu[d].x, 0u, lane_off, x0.x, x0.y);
                tile_step<LO, 1>(tgb, tb, cg[d].x, 0u, lane_off, x0.z, x0.w);
                tile_step<LO, 1>(tub, tb, cu[d].x, 0u, lane_off, x0.z, x0.w);
                tile_step<LO, 0>(tg, tb, cg[d].y, 0u, lane_off, x1.x, x1.y);
                tile_step<LO, 0>(tu, tb, cu[d].y, 0u, lane_off, x1.x, x1.y);
                tile_step<LO, 1>(tgb, tb, cg[d].y, 0u, lane_off, x1.z, x1.w);
                tile_step<LO, 1>(tub, tb, cu[d].y, 0u, lane_off, x1.z, x1.w);
                if (NA > 1)
#pragma unroll
                    for (int q = 0; q < 4; ++q)
                        tg[q] += tg2[q], tu[q] += tu2[q];
                accg += (tg[0] + tg[1] + (tg[2] + tg[3])) *
                        nf4_value<kScales<DQ>>(rg[d], G.absmax2, G.offset, G.code2, blk0 + b);
                accu += (tu[0] + tu[1] + (tu[2] + tu[3])) *
                        nf4_value<kScales<DQ>>(ru[d], U.absmax2, U.offset, U.code2, blk0 + b);
            } else { // rows g: gate, g + 8: up
                tile_step<LO, 0>(tg, tb, cg[d].x, cu[d].x, lane_off, x0.x, x0.y);
                tile_step<LO, 1>(tgb, tb, cg[d].x, cu[d].x, lane_off, x0.z, x0.w);
                tile_step<LO, 0>(tg, tb, cg[d].y, cu[d].y, lane_off, x1.x, x1.y);
                tile_step<LO, 1>(tgb, tb, cg[d].y, cu[d].y, lane_off, x1.z, x1.w);
                if (NA > 1)
#pragma unroll
                    for (int q = 0; q < 4; ++q)
                        tg[q] += tg2[q];
                accg +=
                    (tg[0] + tg[1]) * nf4_value<kScales<DQ>>(rg[d], G.absmax2, G.offset, G.code2, blk0 + b);
                accu +=
                    (tg[2] + tg[3]) * nf4_value<kScales<DQ>>(ru[d], U.absmax2, U.offset, U.code2, blk0 + b);
            }
            load_gu(d, min(b + D, bend - 1)); // past the end: the last block again, unused
        }
    }
    if (KS > 1) {
        if (t == 0) s_part[kh][0][8 * w + g] = accg, s_part[kh][1][8 * w + g] = accu;
        __syncthreads();
        if (kh == 0 && t == 0) {
            accg = accu = 0.0f;
#pragma unroll
            for (int k = 0; k < KS; ++k)
                accg += s_part[k][0][8 * w + g], accu += s_part[k][1][8 * w + g];
        }
    }
    if (kh == 0 && t == 0) {
        const float xi   = pow2f(-xs);
        const float gv   = accg * xi + (G.bias ? G.bias[irow] : 0.0f);
        const float uv   = accu * xi + (U.bias ? U.bias[irow] : 0.0f);
        s_act[8 * w + g] = gelu_tanh(gv) * uv;
    }
    __syncthreads();
    // act * 2^as as B fragments: lane (g, t) holds act[8t .. 8t + 7] (g 0: hi, 1: lo, else 0).
    const int as   = f16_shift(warp_max(fabsf(s_act[lane])));
    const float am = pow2f(as), ai = pow2f(-as);
    u32 ba[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const uint2 p = split2(s_act[8 * t + 2 * q] * am, s_act[8 * t + 2 * q + 1] * am);
        ba[q]         = g == 0 ? p.x : g == 1 ? p.y : 0u;
    }
    const bool add_bias = a.bias && j == 0;
    for (int R00 = 32 * wi; R00 < H; R00 += 32 * NW * D2) {
#pragma unroll
        for (int d = 0; d < D2; ++d) {
            const int R0 = R00 + 32 * NW * d;
            float o[4];
            if (LO) { // four tiles: row R0 + 4g + k's hi and lo codes
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    tile_step<LO, 0>(acc, tb, dc[d][k], 0u, lane_off, ba[0], ba[1]);
                    tile_step<LO, 1>(acc, tb, dc[d][k], 0u, lane_off, ba[2], ba[3]);
                    o[k] = acc[0] + acc[1] + (acc[2] + acc[3]);
                }
            } else { // two tiles: rows R0 + 4g + {0, 1} and {2, 3}
#pragma unroll
                for (int k = 0; k < 4; k += 2) {
                    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    tile_step<LO, 0>(acc, tb, dc[d][k], dc[d][k + 1], lane_off, ba[0], ba[1]);
                    tile_step<LO, 1>(acc, tb, dc[d][k], dc[d][k + 1], lane_off, ba[2], ba[3]);
                    o[k] = acc[0] + acc[1], o[k + 1] = acc[2] + acc[3];
                }
            }
            if (t == 0) {
                const int r = R0 + 4 * g;
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    o[k] = o[k] * ai * a.dn.scale(dr[d][k], (long)(r + k) * (I / 64) + c64);
                    if (add_bias) o[k] += a.bias[r + k];
                }
                red_add_v4(a.y + r, make_float4(o[0], o[1], o[2], o[3]));
            }
            load_dn(d, min(R0 + 32 * NW * D2, H - 32 * NW + 32 * wi));
        }
    }
}
template <bool LO, bool DQ, int D, int D2, int KS = 1, int NA = 1>
__global__ void __launch_bounds__(128 * KS, KS == 1 ? 3 : 2) g4_mlp_mma(const MlpArgs a) {
    extern __shared__ float4 mm_smem[];
    mlp_mma_body<LO, DQ, D, D2, KS, NA>(a, (char*)mm_smem);
}

// kernels.cu's fused MLP in its earlier form: one kernel for either scale format (decided per block
// at run time, both paths in the loops) and a global-memory path for x in the gate/up loop.
template <int B> __global__ void __launch_bounds__(B, B == 128 ? 3 : 2) g4_mlp_any(const MlpArgs a) {
#ifdef __CUDA_ARCH__ // mlp_body exists in sm_90 device code only
    extern __shared__ float4 any_wide[];
    mlp_body<B, NF4_SCALES_ANY, false>(a, any_wide);
#endif
}

int main(int argc, char** argv) {
    const int reps     = argc > 1 ? std::atoi(argv[1]) : 15;
    const BenchGpu gpu = bench_gpu();
    cudaStream_t st    = gpu.st;
    const DqTables dq  = dq_tables();
    std::mt19937 rng(7);
    if (g_f32)
        std::printf("G4_LAB_F32: block scales as f32 absmax (g4 compile's default), not double quant\n");
    struct V {
        std::string name;
        const void* fn;
        unsigned block;
    };
    const bool dqs = !g_f32;
#define MMA_FN(LO, D, D2, KS, NA)                                                                            \
    (dqs ? (const void*)g4_mlp_mma<LO, true, D, D2, KS, NA>                                                  \
         : (const void*)g4_mlp_mma<LO, false, D, D2, KS, NA>)
    std::vector<V> vs = {
        {"g4_mlp_nf4 (128 thr)", mlp_kernel(128), 128},
        {"g4_mlp_nf4_b256", mlp_kernel(256), 256},
        {"  either format (128 thr)", (const void*)g4_mlp_any<128>, 128},
        {"  either format (b256)", (const void*)g4_mlp_any<256>, 256},
        {"mma hi+lo D4 D2 4", MMA_FN(true, 4, 4, 1, 1), 128},
        {"mma hi+lo D4 D2 4 NA2", MMA_FN(true, 4, 4, 1, 2), 128},
        {"mma hi+lo KS2 D4 D2 2", MMA_FN(true, 4, 2, 2, 1), 256},
        {"mma hi+lo KS2 D2 D2 2 NA2", MMA_FN(true, 2, 2, 2, 2), 256},
        {"mma f16 codes D4 D2 4", MMA_FN(false, 4, 4, 1, 1), 128},
        {"mma f16 codes D4 D2 4 NA2", MMA_FN(false, 4, 4, 1, 2), 128},
        {"mma f16 codes KS2 D4 D2 2", MMA_FN(false, 4, 2, 2, 1), 256},
    };
    if (g_base_only) vs.resize(4); // kernels.cu's kernels only (and their earlier form)
    for (const V& v : vs)
        CK(cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                g4::cuda_rt::gemv_smem(true, 90, 2560)));
    const char* prof = g_profile; // shape index: each variant once, no timing (ncu)
    // G4_LAB_SHAPES="H:I,H:I,...": these shapes instead of the real ones (e.g. I a multiple of the SMs' block
    // slots, to see what the real grids' uneven blocks an SM cost).
    std::vector<MlpShape> shapes(std::begin(kMlpShapes), std::end(kMlpShapes));
    std::vector<std::string> names;
    if (const char* e = std::getenv("G4_LAB_SHAPES")) {
        shapes.clear();
        for (const char* p = e; *p;) {
            int h = 0, i = 0, n = 0;
            if (std::sscanf(p, "%d:%d%n", &h, &i, &n) != 2 || h % 512 || i % 64) {
                std::fprintf(stderr, "G4_LAB_SHAPES: want H:I pairs, H %% 512 == 0, I %% 64 == 0, at '%s'\n",
                             p);
                return 2;
            }
            names.push_back("H " + std::to_string(h) + " I " + std::to_string(i));
            shapes.push_back({nullptr, h, i});
            p += n;
            if (*p == ',') ++p;
        }
        for (size_t k = 0; k < shapes.size(); ++k)
            shapes[k].name = names[k].c_str();
    }
    for (const MlpShape& sh : shapes) {
        if (prof && &sh - shapes.data() != std::atoi(prof)) continue;
        const int H = sh.H, I = sh.I, nslices = I / MLP_S;
        const MlpLab L(H, I, rng, dq.code2, dq.offset);
        const std::vector<MlpSet>& sets = L.sets;
        float *y = L.y, *xo = L.xo;
        const size_t mlp_bytes = L.mlp_bytes;
        const int copies       = L.copies;
        auto enqueue           = [&](const V& v, const MlpSet& s, bool rn) {
            MlpArgs a  = L.args(s);
            void* pa[] = {&a};
            launch_pdl(v.fn, nslices, v.block, g4::cuda_rt::gemv_smem(true, 90, H), st, pa);
            if (rn) launch_stand_in(st, y, xo, H);
        };
        auto result = [&](const V& v) { return mlp_result(st, y, H, [&] { enqueue(v, sets[0], false); }); };
        const std::vector<double> err = mlp_errors(vs, result); // G4_LAB_PROFILE: these runs only
        if (prof) continue;
        std::printf("%s: H %d I %d, %.1f MB a set, %d sets\n", sh.name, H, I, mlp_bytes / 1e6, copies);
        std::vector<std::string> vnames;
        for (const V& v : vs)
            vnames.push_back(v.name);
        mlp_time_modes(gpu, reps, copies, mlp_bytes, vnames, err, sets,
                       [&](size_t vi, const MlpSet& set, bool rn) { enqueue(vs[vi], set, rn); });
    }
    return 0;
}
