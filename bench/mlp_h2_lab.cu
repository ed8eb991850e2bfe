// Decode MLP lab, packed-f16 variant (sm_90; session 40): kernels.cu's fused MLP (g4_mlp_nf4: a code byte is
// one 64-bit lookup of an f32 pair and two FFMAs) against one whose products run as HFMA2: the pair table
// holds half2 (cb[hi], cb[lo]) in 32 copies (one 32-bit lookup a byte, one copy a bank), x goes to shared
// memory as f16 scaled by a power of two per 32-element chunk (so |x| < 2 and 16-term half sums stay far
// from f16's range), and each row-chunk's two HFMA2 chains (8 products each) are summed in f32 and scaled by
// the block scale and the chunk's power of two. The down half does the same with act scaled by a power of
// two over the block's 32 values. Per byte: PRMT + LDS.32 + HFMA2 (3 instructions) against PRMT + LDS.64 + 2
// FFMA (4); x's shared-memory loads halve. Code book rounded to f16 (<= 2.4e-4 of a code away).
//   g4_mlp_h2<B, HGU, HDN>: B threads (128: three blocks an SM; 256: two), HGU / HDN the gate/up / down
//   half in f16 (else the f32 arithmetic of g4_mlp_nf4; HDN needs HGU, whose x is not in the table's rows).
//   f32 block scales only (G4_LAB_F32=1).
// Graph modes as bench/mlp_tma_lab.cu. Build on a GPU machine (repo root):
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o build-dev/mlp_h2_lab bench/mlp_h2_lab.cu &&
//   G4_LAB_F32=1 build-dev/mlp_h2_lab [reps]
#include "kernels/cuda/kernels.cu"
#include "runtime/src/cuda/kernel_args.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "bench/bench_cuda.h"
#include "bench/mlp_lab.h"
#include "bench/mlp_sets.h"

#define H2_XOFF 65536 // x as f16: chunk c's 64 bytes at H2_XOFF + 64 c (16-byte pieces swizzled)
#define H2_MAXC 96    // chunks of x (K <= 3072)
#define H2_SMEM (H2_XOFF + H2_MAXC * 64 + H2_MAXC * 4)

__device__ __forceinline__ int h2_piece(int c, int p) { return H2_XOFF + 64 * c + 16 * (p ^ ((c >> 1) & 3)); }
// 2^E with E the exponent of m (m > 0): m / 2^E in [1, 2).
__device__ __forceinline__ float pow2_floor(float m) {
    return m > 0.0f ? __uint_as_float(__float_as_uint(m) & 0x7f800000u) : 1.0f;
}
// One 16-byte chunk of codes (words) . xh (16 half2, element pairs) through the half2 table: the sum in f32.
__device__ __forceinline__ float h2_chunk_dot(const u32* words, const __half2* xh, const char* tb, u32 lane_off) {
    __half2 s0 = __float2half2_rn(0.0f), s1 = s0;
#pragma unroll
    for (int wd = 0; wd < 4; ++wd) {
        const u32 w = words[wd];
        const __half2 p0 = *(const __half2*)(tb + nf4_pair_off_wide<0>(w, lane_off));
        const __half2 p1 = *(const __half2*)(tb + nf4_pair_off_wide<1>(w, lane_off));
        const __half2 p2 = *(const __half2*)(tb + nf4_pair_off_wide<2>(w, lane_off));
        const __half2 p3 = *(const __half2*)(tb + nf4_pair_off_wide<3>(w, lane_off));
        s0 = __hfma2(p0, xh[4 * wd], s0), s1 = __hfma2(p1, xh[4 * wd + 1], s1);
        s0 = __hfma2(p2, xh[4 * wd + 2], s0), s1 = __hfma2(p3, xh[4 * wd + 3], s1);
    }
    const float2 f = __half22float2(__hadd2(s0, s1));
    return f.x + f.y;
}

template <int B, bool HGU, bool HDN> __global__ void __launch_bounds__(B, B == 128 ? 3 : 2) g4_mlp_h2(const MlpArgs a) {
    static_assert(HGU || !HDN, "the f32 gate/up keeps x where the half2 table goes");
    extern __shared__ float4 smem4[];
    char* sm = (char*)smem4;
    __shared__ float s_act[MLP_S];
    constexpr int L = 2 * B / MLP_S; // lanes a group; 16 groups of 2 outputs (4 rows)
    const int j = blockIdx.x, H = a.H, C = H / 32;
    const int gl = threadIdx.x % L, o0 = 32 * j + 2 * (threadIdx.x / L);
    const uint4* wrow[4];
    long blk0[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const long row = o0 + q / 2;
        wrow[q] = (const uint4*)((const u8*)a.gu.m[q % 2].w + row * H / 2);
        blk0[q] = row * H / 32;
    }
    auto raw = [&](int q, int c) { return __float_as_uint(((const float*)a.gu.m[q % 2].absmax)[(blk0[q] + c) >> 1]); };
    uint4 pa[4], pb[4];
    u32 ra[4], rb[4];
    auto load = [&](int c, uint4* pk, u32* r) {
#pragma unroll
        for (int q = 0; q < 4; ++q) pk[q] = __ldcs(wrow[q] + c), r[q] = raw(q, c);
    };
    load(gl, pa, ra); // the front chunk, before the wait
    // Pair tables in one 64 KiB: f32 (16 copies at e * 256 + 8 s) and / or half2 (32 copies at e * 256 + 128 +
    // 4 s); the f32-only variant keeps x in the bytes past 128 (kernels.cu's layout).
    if (HGU || HDN) {
        uint4* t4 = (uint4*)sm;
        for (int f = threadIdx.x; f < 256 * 8; f += B) { // entry e = f >> 3, 16 bytes (f & 7)
            const int e = f >> 3;
            const __half2 h = __floats2half2_rn(kNf4[e >> 4], kNf4[e & 15]);
            const u32 v = *(const u32*)&h;
            t4[e * 16 + 8 + (f & 7)] = make_uint4(v, v, v, v);
        }
    }
    if (!HGU || !HDN) nf4_pair_table_b<B, true>((float2*)sm);
    __syncthreads();
    pdl_begin();
    const u32 lane_off32 = 128 + (threadIdx.x & 31) * 4, lane_off16 = (threadIdx.x & 15) * 8;
    float acc[4] = {};
    if (HGU) {
        // x -> f16 by chunk, with its power of two.
        float* xsc = (float*)(sm + H2_XOFF + H2_MAXC * 64);
        const float4* x4 = (const float4*)a.gu.x;
        for (int i = threadIdx.x; i < H / 4; i += B) {
            const float4 t = x4[i];
            float m = fmaxf(fmaxf(fabsf(t.x), fabsf(t.y)), fmaxf(fabsf(t.z), fabsf(t.w)));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
            const float e = pow2_floor(m), ie = 1.0f / e;
            const int c = i >> 3, v = i & 7;
            const __half2 h0 = __floats2half2_rn(t.x * ie, t.y * ie), h1 = __floats2half2_rn(t.z * ie, t.w * ie);
            *(uint2*)(sm + h2_piece(c, v >> 1) + 8 * (v & 1)) = make_uint2(*(const u32*)&h0, *(const u32*)&h1);
            if (v == 0) xsc[c] = e;
        }
        __syncthreads();
        auto accumulate = [&](int c, const uint4* pk, const u32* r) {
            __half2 xh[16];
#pragma unroll
            for (int p = 0; p < 4; ++p) {
                const uint4 t = *(const uint4*)(sm + h2_piece(c, p));
                xh[4 * p] = *(const __half2*)&t.x, xh[4 * p + 1] = *(const __half2*)&t.y;
                xh[4 * p + 2] = *(const __half2*)&t.z, xh[4 * p + 3] = *(const __half2*)&t.w;
            }
            const float e = xsc[c];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const u32 words[4] = {pk[q].x, pk[q].y, pk[q].z, pk[q].w};
                acc[q] += h2_chunk_dot(words, xh, sm, lane_off32) * (__uint_as_float(r[q]) * e);
            }
        };
        for (int c = gl;; c += 2 * L) {
            if (c + L < C) load(c + L, pb, rb);
            accumulate(c, pa, ra);
            if (c + L >= C) break;
            if (c + 2 * L < C) load(c + 2 * L, pa, ra);
            accumulate(c + L, pb, rb);
            if (c + 2 * L >= C) break;
        }
    } else {
        // x in f32 in shared memory (as kernels.cu's wide-table slots), the f32 pair table at sm (+ 0).
        float4* xs = smem4;
        const float4* x4 = (const float4*)a.gu.x;
        for (int i = threadIdx.x; i < H / 4; i += B) xs[xs_slot<true>(i >> 3, i & 7)] = x4[i];
        __syncthreads();
        auto accumulate = [&](int c, const uint4* pk, const u32* r) {
            float xv[32];
#pragma unroll
            for (int v = 0; v < 8; ++v) {
                const float4 t = xs[xs_slot<true>(c, v)];
                xv[4 * v] = t.x, xv[4 * v + 1] = t.y, xv[4 * v + 2] = t.z, xv[4 * v + 3] = t.w;
            }
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const u32 words[4] = {pk[q].x, pk[q].y, pk[q].z, pk[q].w};
                acc[q] += nf4_chunk_dot<true>(words, xv, sm, lane_off16) * __uint_as_float(r[q]);
            }
        };
        for (int c = gl;; c += 2 * L) {
            if (c + L < C) load(c + L, pb, rb);
            accumulate(c, pa, ra);
            if (c + L >= C) break;
            if (c + 2 * L < C) load(c + 2 * L, pa, ra);
            accumulate(c + L, pb, rb);
            if (c + 2 * L >= C) break;
        }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1) acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], o);
    if (gl == 0) {
        s_act[o0 - 32 * j]     = gelu_tanh(acc[0]) * acc[1];
        s_act[o0 - 32 * j + 1] = gelu_tanh(acc[2]) * acc[3];
    }
    // The down slice, as kernels.cu's.
    const u8* tile = a.dn.codes + (long)j * H * (MLP_S / 2);
    const int c64  = j / 2;
    uint4 qa[4], qb[4];
    u32 sa[4], sb[4];
    auto dload = [&](int r0, uint4* pk, u32* r) {
#pragma unroll
        for (int k = 0; k < 4; ++k) pk[k] = __ldcs((const uint4*)(tile + (long)(r0 + k) * (MLP_S / 2)));
        a.dn.raw4<NF4_SCALES_F32>(c64, H, r0, r);
    };
    if (4 * (int)threadIdx.x < H) dload(4 * threadIdx.x, qa, sa);
    __syncthreads();
    float av[MLP_S];
#pragma unroll
    for (int c = 0; c < MLP_S; ++c) av[c] = s_act[c];
    __half2 ah[16];
    float ae = 1.0f;
    if (HDN) {
        float m = 0.0f;
#pragma unroll
        for (int c = 0; c < MLP_S; ++c) m = fmaxf(m, fabsf(av[c]));
        ae = pow2_floor(m);
        const float ie = 1.0f / ae;
#pragma unroll
        for (int c = 0; c < 16; ++c) ah[c] = __floats2half2_rn(av[2 * c] * ie, av[2 * c + 1] * ie);
    }
    auto down = [&](int r0, const uint4* pk, const u32* r) {
        float out[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const u32 words[4] = {pk[k].x, pk[k].y, pk[k].z, pk[k].w};
            const float d = HDN ? h2_chunk_dot(words, ah, sm, lane_off32) * ae
                                : nf4_chunk_dot<true>(words, av, sm, lane_off16);
            out[k] = d * __uint_as_float(r[k]);
        }
        red_add_v4(a.y + r0, make_float4(out[0], out[1], out[2], out[3]));
    };
    for (int r0 = 4 * threadIdx.x; r0 < H; r0 += 8 * B) {
        if (r0 + 4 * B < H) dload(r0 + 4 * B, qb, sb);
        down(r0, qa, sa);
        if (r0 + 4 * B >= H) break;
        if (r0 + 8 * B < H) dload(r0 + 8 * B, qa, sa);
        down(r0 + 4 * B, qb, sb);
    }
}

int main(int argc, char** argv) {
    const int reps     = argc > 1 ? std::atoi(argv[1]) : 15;
    const BenchGpu gpu = bench_gpu();
    cudaStream_t st    = gpu.st;
    const DqTables dq  = dq_tables();
    std::mt19937 rng(7);
    if (!g_f32) {
        std::fprintf(stderr, "mlp_h2_lab: run with G4_LAB_F32=1 (f32 block scales only)\n");
        return 2;
    }
    struct V {
        std::string name;
        const void* fn;
        unsigned block, smem;
    };
    std::vector<V> vs = {
        {"g4_mlp_nf4 (128 thr)", mlp_kernel(128), 128, 0},
        {"g4_mlp_nf4_b256", mlp_kernel(256), 256, 0},
        {"lab f32 (128)", (const void*)g4_mlp_h2<128, false, false>, 128, H2_SMEM},
        {"h2 gate/up + down (128)", (const void*)g4_mlp_h2<128, true, true>, 128, H2_SMEM},
        {"h2 gate/up + down (256)", (const void*)g4_mlp_h2<256, true, true>, 256, H2_SMEM},
        {"h2 gate/up only (128)", (const void*)g4_mlp_h2<128, true, false>, 128, H2_SMEM},
    };
    for (const V& v : vs)
        CK(cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                std::max<unsigned>(H2_SMEM, g4::cuda_rt::gemv_smem(true, 90, 2560))));
    for (const MlpShape& sh : kMlpShapes) {
        const int H = sh.H, I = sh.I, nslices = I / MLP_S;
        const MlpLab L(H, I, rng, dq.code2, dq.offset);
        float *y = L.y, *xo = L.xo;
        auto enqueue = [&](const V& v, const MlpSet& s, bool rn) {
            MlpArgs a  = L.args(s);
            void* pa[] = {&a};
            launch_pdl(v.fn, nslices, v.block, v.smem ? v.smem : g4::cuda_rt::gemv_smem(true, 90, H), st, pa);
            if (rn) launch_stand_in(st, y, xo, H);
        };
        auto result = [&](const V& v) { return mlp_result(st, y, H, [&] { enqueue(v, L.sets[0], false); }); };
        const std::vector<double> err = mlp_errors(vs, result);
        std::printf("%s: H %d I %d, %.1f MB a set, %d sets\n", sh.name, H, I, L.mlp_bytes / 1e6, L.copies);
        std::vector<std::string> vnames;
        for (const V& v : vs)
            vnames.push_back(v.name);
        mlp_time_modes(gpu, reps, L.copies, L.mlp_bytes, vnames, err, L.sets,
                       [&](size_t vi, const MlpSet& set, bool rn) { enqueue(vs[vi], set, rn); });
    }
    return 0;
}
