// Decode MLP lab, TMA-staged variants (sm_90): the fused MLP of kernels.cu (g4_mlp_nf4: 3 blocks
// an SM, each with its own 64 KiB pair table, weights loaded into registers one chunk ahead) against one
// block an SM whose weights stream by bulk copies (cp.async.bulk + mbarriers) into a ring of shared-memory
// stages while the block computes from them. A stage is one 32-row segment: the gate rows, the up rows or the
// down tile of a 32-column slice, with its block scales; the ring is filled before the programmatic wait
// (weights never depend on the kernel before), so ~80-130 KB an SM is in flight instead of ~24 KB of
// register loads.
//   g4_mlp_tma<EF, CT, MODE>: a producer warp and CT consumer threads; EF: the copies' L2 policy
//     evict-first; MODE 1 loads only (no arithmetic), 2 arithmetic only (no loads: stale stages). The two
//     lab modes split the kernel's time into its memory and its compute.
//   g4_mlp_tma2<XC>: 256 threads, no producer warp (thread 0 refills stages at the block's barriers), x of
//     each thread's chunks held in registers for the whole kernel (XC = H / 512).
// What it found (bench/results/mlp-labs-h200/, docs/performance.md; H200): the decode MLP is
// bound by its arithmetic, not by the weights' DRAM traffic. E2B wide, f32 scales, back to back: loads alone
// 9.0 us, arithmetic alone 15.6 us, both 18.0 us; g4_mlp_nf4 18.1 us from DRAM and 15.8 us with the weights
// in L2. Nsight Compute on g4_mlp_nf4: L1/shared throughput 74.5% (the pair-table lookups), 4.0
// instructions a weight, issue slots 35% busy. The staged kernels tie or lose; x in registers (2 warps a
// scheduler) is twice as slow.
// G4_LAB_F32=1: block scales as f32 absmax (g4 compile's default), else double quant. G4_LAB_BASE_ONLY=1:
// kernels.cu's two kernels only. Graph modes: MLPs back to back; with a one-block ResNorm-like kernel between
// them (the decode graph's order); back to back on one weight set (L2-resident). G4_LAB_PROFILE=<shape
// index>: each variant once, no timing (for ncu --kernel-name regex:g4_mlp). Build with the CUDA toolkit from
// the repo root (an sm_90 GPU runs it):
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o build/mlp_tma_lab bench/labs/mlp_tma_lab.cu &&
//   build/mlp_tma_lab [reps]
#include "kernels/cuda/all_kernels.cuh"
#include "runtime/src/cuda/kernel_args.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <random>
#include <string>
#include <vector>

#include "bench/labs/bench_cuda.h"
#include "bench/labs/mlp_lab.h"
#include "bench/labs/mlp_sets.h"

// ---------------------------------------------------------------------------------------------------
__device__ __forceinline__ u32 smem_u32(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 ok;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 "
                     "%0, 1, 0, p;\n}\n"
                     : "=r"(ok)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!ok);
}
// bytes (a multiple of 16) from global src (16-byte aligned) into shared dst, completing on bar.
template <bool EF>
__device__ __forceinline__ void bulk_g2s(u32 dst, const void* src, u32 bytes, u32 bar,
                                         unsigned long long pol) {
    if (EF)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
                     "[%1], %2, [%3], %4;" ::"r"(dst),
                     "l"(src), "r"(bytes), "r"(bar), "l"(pol)
                     : "memory");
    else
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                dst),
            "l"(src), "r"(bytes), "r"(bar)
            : "memory");
}
__device__ __forceinline__ void red_add_v2(float* p, float a, float b) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
}

#define MT_MAX_STAGES 8
// Bytes of one stage for rows of H: 16 H of codes (32 rows of H / 2, or the tile's H rows of 16), then
// the block scales (H / 2 or H of them, u8 with double quant, else f32), rounded to 128.
__host__ __device__ inline u32 mlp_tma_stage_bytes(int H, bool dq) {
    return (u32)((16 * H + (dq ? H : 4 * H) + 127) / 128 * 128);
}
// A block's ring of stages after the wide pair table: NS stages of SB bytes (NS from the launch's dynamic
// shared memory), full[s] at bars[s]; a segment (slice j, seg 0 gate / 1 up / 2 down) copied into a stage.
struct MtRing {
    int H, I, nslices, sb, NS; // sb: bytes a block scale
    u32 SB, bar0;
    char* stages;
    __device__ MtRing(const MlpArgs& a, float4* sm, unsigned long long* bars) {
        H = a.H, I = a.I, nslices = I / MLP_S, sb = a.dn.absmax2 ? 1 : 4;
        SB = mlp_tma_stage_bytes(H, a.dn.absmax2 != nullptr);
        u32 dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        NS = min((int)((dyn - GV_WIDE_BYTES) / SB), MT_MAX_STAGES), stages = (char*)sm + GV_WIDE_BYTES,
        bar0 = smem_u32(bars);
    }
    __device__ u32 full(int s) const { return bar0 + 8u * (u32)s; }
    __device__ const char* stage(int s) const { return stages + (long)s * SB; }
    // Expects the segment's bytes on full(s) and starts its two bulk copies (codes, then scales).
    template <bool EF>
    __device__ void issue(const MlpArgs& a, int j, int seg, int s, unsigned long long pol) const {
        const void *codes, *scales;
        u32 scale_bytes;
        if (seg < 2) { // 32 rows of gate (m[0]) or up (m[1]) from row 32j, and their scales
            const GemvMat& m = a.gu.m[seg];
            codes            = (const char*)m.w + (long)j * MLP_S * (H / 2),
            scales           = (const char*)m.absmax + (long)j * (MLP_S * H / 64) * sb;
            scale_bytes      = (u32)(MLP_S * H / 64 * sb);
        } else { // the down tile of slice j and the scales of its 64-column block
            codes       = a.dn.codes + (long)j * H * (MLP_S / 2),
            scales      = (const char*)a.dn.absmax + (long)(j / 2) * H * sb;
            scale_bytes = (u32)(H * sb);
        }
        const u32 dst = smem_u32(stage(s));
        mbar_expect_tx(full(s), (u32)(16 * H) + scale_bytes);
        bulk_g2s<EF>(dst, codes, (u32)(16 * H), full(s), pol);
        bulk_g2s<EF>(dst + 16u * H, scales, scale_bytes, full(s), pol);
    }
};

// Chunk ch (16 bytes of codes a row) of the slice's gate (G) and up (U) stages for NQ rows of a lane group:
// rows r0, r0 + 1, ... (q: gate for even q, up for odd q, row r0 + q / 2), times x's chunk xv, into acc.
template <int NQ>
__device__ __forceinline__ void mt_gate_up_chunk(const MlpArgs& a, const char* G, const char* U, int j,
                                                 int r0, int ch, const float* xv, const char* tb,
                                                 u32 lane_off, float* acc) {
    const int H   = a.H;
    const bool dq = a.dn.absmax2 != nullptr;
#pragma unroll
    for (int q = 0; q < NQ; ++q) {
        const char* S      = (q & 1) ? U : G;
        const int row      = r0 + (q >> 1); // row of the segment
        const uint4 pk     = *(const uint4*)(S + (long)row * (H / 2) + ch * 16);
        const int bl       = row * (H / 64) + (ch >> 1); // block of the segment
        const u32 raw      = dq ? (u32)((const u8*)(S + 16 * H))[bl] : ((const u32*)(S + 16 * H))[bl];
        const GemvMat& m   = (q & 1) ? a.gu.m[1] : a.gu.m[0];
        const long b       = (long)j * (MLP_S * H / 64) + bl; // the matrix's block
        const u32 words[4] = {pk.x, pk.y, pk.z, pk.w};
        acc[q] += nf4_chunk_dot<true>(words, xv, tb, lane_off) *
                  nf4_absmax_value(raw, m.absmax2, m.offset, m.code2, b);
    }
}
// The 16-lane group's sums of its OPG outputs' gate and up rows (acc: gate, up, gate, up ...), then
// act[OPG g + r] = gelu(gate + bias) * (up + bias) by the group's first lane.
template <int OPG>
__device__ __forceinline__ void mt_act(const MlpArgs& a, int j, int g, int gl, float* acc, float* act) {
#pragma unroll
    for (int q = 0; q < 2 * OPG; ++q)
#pragma unroll
        for (int o = 8; o > 0; o >>= 1)
            acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], o);
    if (gl != 0) return;
#pragma unroll
    for (int r = 0; r < OPG; ++r) {
        const int o      = j * MLP_S + OPG * g + r;
        const float gv   = acc[2 * r] + (a.gu.m[0].bias ? a.gu.m[0].bias[o] : 0.0f);
        const float uv   = acc[2 * r + 1] + (a.gu.m[1].bias ? a.gu.m[1].bias[o] : 0.0f);
        act[OPG * g + r] = gelu_tanh(gv) * uv;
    }
}
// Rows r, r + 1 of the slice's down stage D (64-column block c64) times act av, added to d0, d1.
__device__ __forceinline__ void mt_down_pair(const MlpArgs& a, const char* D, int r, int c64, const float* av,
                                             const char* tb, u32 lane_off, float& d0, float& d1) {
    const int H = a.H, I = a.I;
    const bool dq  = a.dn.absmax2 != nullptr;
    const uint4 p0 = *(const uint4*)(D + (long)r * 16), p1 = *(const uint4*)(D + (long)(r + 1) * 16);
    const u32 raw0  = dq ? (u32)((const u8*)(D + 16 * H))[r] : ((const u32*)(D + 16 * H))[r];
    const u32 raw1  = dq ? (u32)((const u8*)(D + 16 * H))[r + 1] : ((const u32*)(D + 16 * H))[r + 1];
    const u32 w0[4] = {p0.x, p0.y, p0.z, p0.w}, w1[4] = {p1.x, p1.y, p1.z, p1.w};
    d0 += nf4_chunk_dot<true>(w0, av, tb, lane_off) * a.dn.scale(raw0, (long)r * (I / 64) + c64);
    d1 += nf4_chunk_dot<true>(w1, av, tb, lane_off) * a.dn.scale(raw1, (long)(r + 1) * (I / 64) + c64);
}

// CT consumer threads (256: a 16-lane group owns 2 outputs of the slice; 512: one), warp 0 produces.
// The down rows a thread owns (2 c + 2 CT m, + 1) stay the same over the block's slices, so their sums
// stay in registers and go to y once, at the end (one red.add.v2 a row pair a block). H % (2 CT) == 0,
// H % 64 == 0, H <= 8192 (x in the wide table's spare half rows).
// grid: blocks take slices j = blockIdx.x, + gridDim.x, ...; block CT + 32; dynamic shared memory
// GV_WIDE_BYTES + NS * mlp_tma_stage_bytes(H, dq) (NS >= 3 stages, from the launch's size).
template <bool EF, int CT, int MODE = 0>
__device__ __forceinline__ void mlp_tma_body(const MlpArgs& a, float4* sm) {
    constexpr int OPG  = 512 / CT;                                    // outputs a group
    constexpr int NQ   = 2 * OPG;                                     // rows a group: gate, up (, gate, up)
    constexpr int RMAX = 8192 / (2 * CT);                             // row pairs a thread at most
    __shared__ alignas(8) unsigned long long bars[2 * MT_MAX_STAGES]; // full[s], empty[s]
    __shared__ float s_act[2][MLP_S];
    const MtRing ring(a, sm, bars);
    const int H = a.H, C = H / 32, nslices = ring.nslices, NS = ring.NS;
    auto full  = [&](int s) { return ring.full(s); };
    auto empty = [&](int s) { return ring.bar0 + 8u * (u32)(MT_MAX_STAGES + s); };
    if (threadIdx.x == 0) {
        for (int s = 0; s < NS; ++s)
            mbar_init(full(s), 1), mbar_init(empty(s), CT / 32);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x < 32) { // producer: segments G, U, D of each of the block's slices, in order
        if (threadIdx.x == 0) {
            unsigned long long pol = 0;
            if (EF) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
            int k = 0;
            for (int j = blockIdx.x; j < nslices; j += gridDim.x)
                for (int seg = 0; seg < 3; ++seg, ++k) {
                    const int s = k % NS, use = k / NS;
                    if (use > 0) mbar_wait(empty(s), (u32)(use - 1) & 1u);
                    if (MODE == 2)
                        mbar_arrive(full(s)); // lab: compute only
                    else
                        ring.issue<EF>(a, j, seg, s, pol);
                }
        }
        return;
    }
    const int c = threadIdx.x - 32, g = c >> 4, gl = c & 15;
    const u32 lane_off = (threadIdx.x & 15) * 8;
    const char* tb     = (const char*)sm;
    for (int i = c; i < NF4_PAIRS; i += CT)
        ((float2*)sm)[(i >> 4) * 32 + (i & 15)] = make_float2(kNf4[i >> 8], kNf4[(i >> 4) & 15]);
    pdl_begin();
    { // x into the table's unused half rows (xs_slot<true>)
        const float4* x4 = (const float4*)a.gu.x;
        for (int i = c; i < H / 4; i += CT)
            sm[xs_slot<true>(i >> 3, i & 7)] = x4[i];
    }
    asm volatile("bar.sync 1, %0;" ::"n"(CT) : "memory");
    float dacc[RMAX][2];
#pragma unroll
    for (int m = 0; m < RMAX; ++m)
        dacc[m][0] = dacc[m][1] = 0.0f;
    bool has0 = false;
    int k = 0, it = 0;
    for (int j = blockIdx.x; j < nslices; j += gridDim.x, ++it) {
        has0 |= j == 0;
        // gate/up: stages k (gate), k + 1 (up)
        const int sg = k % NS, su = (k + 1) % NS;
        mbar_wait(full(sg), (u32)(k / NS) & 1u);
        mbar_wait(full(su), (u32)((k + 1) / NS) & 1u);
        const char* G = ring.stage(sg);
        const char* U = ring.stage(su);
        float acc[NQ];
#pragma unroll
        for (int q = 0; q < NQ; ++q)
            acc[q] = 0.0f;
        for (int ch = gl; ch < (MODE == 1 ? 0 : C); ch += 16) {
            float xv[32];
#pragma unroll
            for (int v = 0; v < 8; ++v) {
                const float4 t = sm[xs_slot<true>(ch, v)];
                xv[4 * v] = t.x, xv[4 * v + 1] = t.y, xv[4 * v + 2] = t.z, xv[4 * v + 3] = t.w;
            }
            mt_gate_up_chunk<NQ>(a, G, U, j, OPG * g, ch, xv, tb, lane_off, acc);
        }
        __syncwarp();
        if ((threadIdx.x & 31) == 0) mbar_arrive(empty(sg)), mbar_arrive(empty(su));
        mt_act<OPG>(a, j, g, gl, acc, s_act[it & 1]);
        asm volatile("bar.sync 1, %0;" ::"n"(CT) : "memory");
        float av[MLP_S];
#pragma unroll
        for (int q = 0; q < MLP_S; ++q)
            av[q] = s_act[it & 1][q];
        // down: stage k + 2
        const int sd = (k + 2) % NS;
        mbar_wait(full(sd), (u32)((k + 2) / NS) & 1u);
        const char* D = ring.stage(sd);
        const int c64 = j / 2;
#pragma unroll
        for (int m = 0; m < RMAX; ++m) {
            const int r = 2 * c + 2 * CT * m;
            if (r >= H || MODE == 1) break;
            mt_down_pair(a, D, r, c64, av, tb, lane_off, dacc[m][0], dacc[m][1]);
        }
        __syncwarp();
        if ((threadIdx.x & 31) == 0) mbar_arrive(empty(sd));
        k += 3;
    }
#pragma unroll
    for (int m = 0; m < RMAX; ++m) {
        const int r = 2 * c + 2 * CT * m;
        if (r >= H) break;
        if (a.bias && has0) dacc[m][0] += a.bias[r], dacc[m][1] += a.bias[r + 1];
        red_add_v2(a.y + r, dacc[m][0], dacc[m][1]);
    }
}
template <bool EF, int CT, int MODE = 0>
__global__ void __launch_bounds__(CT + 32, 1) g4_mlp_tma(const MlpArgs a) {
    extern __shared__ float4 mt_smem[];
    mlp_tma_body<EF, CT, MODE>(a, mt_smem);
}

// v2: 256 threads, no producer warp (2 warps a scheduler: up to 255 registers). Thread 0 issues the first
// NS segments before the wait and refills stages at the two consumer barriers of each slice (after the
// gate/up reads, after the down reads); x of each thread's chunks in registers (XC = C / 16).
template <int XC> __device__ __forceinline__ void mlp_tma2_body(const MlpArgs& a, float4* sm) {
    constexpr int CT = 256, NQ = 4;
    __shared__ alignas(8) unsigned long long bars[MT_MAX_STAGES];
    __shared__ float s_act[MLP_S];
    const MtRing ring(a, sm, bars);
    const int H = a.H, C = H / 32, nslices = ring.nslices, NS = ring.NS;
    auto full = [&](int s) { return ring.full(s); };
    const int mine =
        (nslices - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x; // slices of this block
    const int total        = 3 * mine;
    int kp                 = 0; // next segment to issue (thread 0)
    unsigned long long pol = 0;
    auto issue             = [&](int upto) { // thread 0: segments kp .. upto - 1
        for (; kp < upto && kp < total; ++kp)
            ring.issue<true>(a, (int)blockIdx.x + (kp / 3) * (int)gridDim.x, kp % 3, kp % NS, pol);
    };
    if (threadIdx.x == 0) {
        for (int s = 0; s < NS; ++s)
            mbar_init(full(s), 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
        issue(NS);
    }
    const int c = threadIdx.x, g = c >> 4, gl = c & 15;
    const u32 lane_off = (threadIdx.x & 15) * 8;
    const char* tb     = (const char*)sm;
    for (int i = c; i < NF4_PAIRS; i += CT)
        ((float2*)sm)[(i >> 4) * 32 + (i & 15)] = make_float2(kNf4[i >> 8], kNf4[(i >> 4) & 15]);
    pdl_begin();
    float xr[XC][32];
    {
        const float4* x4 = (const float4*)a.gu.x;
#pragma unroll
        for (int i = 0; i < XC; ++i) {
            const int ch = min(gl + 16 * i, C - 1);
#pragma unroll
            for (int v = 0; v < 8; ++v) {
                const float4 t = __ldcg(x4 + ch * 8 + v);
                xr[i][4 * v] = t.x, xr[i][4 * v + 1] = t.y, xr[i][4 * v + 2] = t.z, xr[i][4 * v + 3] = t.w;
            }
        }
    }
    __syncthreads(); // the table
    float dacc[XC][2];
#pragma unroll
    for (int m = 0; m < XC; ++m)
        dacc[m][0] = dacc[m][1] = 0.0f;
    bool has0 = false;
    for (int it = 0; it < mine; ++it) {
        const int j = (int)blockIdx.x + it * (int)gridDim.x, k = 3 * it;
        has0 |= j == 0;
        const int sg = k % NS, su = (k + 1) % NS, sd = (k + 2) % NS;
        mbar_wait(full(sg), (u32)(k / NS) & 1u);
        mbar_wait(full(su), (u32)((k + 1) / NS) & 1u);
        const char* G = ring.stage(sg);
        const char* U = ring.stage(su);
        float acc[NQ] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < XC; ++i) {
            const int ch = gl + 16 * i;
            if (ch < C) mt_gate_up_chunk<NQ>(a, G, U, j, 2 * g, ch, xr[i], tb, lane_off, acc);
        }
        mt_act<2>(a, j, g, gl, acc, s_act);
        __syncthreads(); // act ready; G, U read by every thread
        if (threadIdx.x == 0) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            issue(k + 2 + NS); // segments up to the NS after D_it; G and U of this slice are free
        }
        float av[MLP_S];
#pragma unroll
        for (int q = 0; q < MLP_S; ++q)
            av[q] = s_act[q];
        mbar_wait(full(sd), (u32)((k + 2) / NS) & 1u);
        const char* D = ring.stage(sd);
        const int c64 = j / 2;
#pragma unroll
        for (int m = 0; m < XC; ++m) {
            const int r = 2 * c + 2 * CT * m;
            if (r >= H) break;
            mt_down_pair(a, D, r, c64, av, tb, lane_off, dacc[m][0], dacc[m][1]);
        }
        __syncthreads(); // D read by every thread; s_act free
        if (threadIdx.x == 0) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            issue(k + 3 + NS);
        }
    }
#pragma unroll
    for (int m = 0; m < XC; ++m) {
        const int r = 2 * c + 2 * CT * m;
        if (r >= H) break;
        if (a.bias && has0) dacc[m][0] += a.bias[r], dacc[m][1] += a.bias[r + 1];
        red_add_v2(a.y + r, dacc[m][0], dacc[m][1]);
    }
}
template <int XC> __global__ void __launch_bounds__(256, 1) g4_mlp_tma2(const MlpArgs a) {
    extern __shared__ float4 mt_smem[];
    mlp_tma2_body<XC>(a, mt_smem);
}

int main(int argc, char** argv) {
    const int reps         = argc > 1 ? std::atoi(argv[1]) : 15;
    const BenchGpu gpu     = bench_gpu();
    const int nsm          = gpu.prop.multiProcessorCount;
    cudaStream_t st        = gpu.st;
    const DqTables dq      = dq_tables();
    const float* code2_dev = dq.code2;
    const float* off_dev   = dq.offset;
    std::mt19937 rng(7);
    if (g_f32)
        std::printf("G4_LAB_F32: block scales as f32 absmax (g4 compile's default), not double quant\n");
    if (g_profile) std::printf("profile mode: shape %s, each variant once\n", g_profile);
    CK(cudaFuncSetAttribute(mlp_kernel(128), cudaFuncAttributeMaxDynamicSharedMemorySize,
                            g4::cuda_rt::gemv_smem(true, 90, 2560)));
    CK(cudaFuncSetAttribute(mlp_kernel(256), cudaFuncAttributeMaxDynamicSharedMemorySize,
                            g4::cuda_rt::gemv_smem(true, 90, 2560)));
    const int smax           = (int)gpu.prop.sharedMemPerBlockOptin - 1024;
    const void* tma_fn[4][2] = {
        {(const void*)g4_mlp_tma<false, 256>, (const void*)g4_mlp_tma<true, 256>},
        {(const void*)g4_mlp_tma<false, 512>, (const void*)g4_mlp_tma<true, 512>},
        {(const void*)g4_mlp_tma<false, 256, 1>, (const void*)g4_mlp_tma<true, 256, 1>},
        {(const void*)g4_mlp_tma<false, 256, 2>, (const void*)g4_mlp_tma<true, 256, 2>}};
    for (auto& row : tma_fn)
        for (const void* f : row)
            CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smax));
    CK(cudaFuncSetAttribute((const void*)g4_mlp_tma2<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, smax));
    CK(cudaFuncSetAttribute((const void*)g4_mlp_tma2<5>, cudaFuncAttributeMaxDynamicSharedMemorySize, smax));
    const char* prof = g_profile; // shape index: each variant launched once, no timing (for ncu)
    for (const MlpShape& sh : kMlpShapes) {
        if (prof && &sh - kMlpShapes != std::atoi(prof)) continue;
        const int H = sh.H, I = sh.I, nslices = I / MLP_S;
        const MlpLab L(H, I, rng, code2_dev, off_dev);
        const std::vector<MlpSet>& sets = L.sets;
        float *y = L.y, *xo = L.xo;
        const size_t mlp_bytes = L.mlp_bytes;
        const int copies       = L.copies;
        auto args              = [&](const MlpSet& s) { return L.args(s); };
        const u32 SB           = mlp_tma_stage_bytes(H, !g_f32);
        const int per          = (nslices + nsm - 1) / nsm;
        const unsigned tg      = (unsigned)((nslices + per - 1) / per);
        struct V {
            std::string name;
            int kind; // 0 g4_mlp_nf4, 1 b256, 2 tma
            int ns;
            unsigned grid;
            int ef, ct512;
        };
        std::vector<V> vs = {{"g4_mlp_nf4 (128 thr)", 0, 0, (unsigned)nslices, 0, 0},
                             {"g4_mlp_nf4_b256", 1, 0, (unsigned)nslices, 0, 0}};
        if (!g_base_only) { // G4_LAB_BASE_ONLY: kernels.cu's two kernels only
            const unsigned g2 = (unsigned)std::min(nsm, nslices);
            vs.push_back({"tma ns3 c256 ef", 2, 3, tg, 1, 0});
            vs.push_back({"tma ns3 c256 ef, loads only", 2, 3, tg, 1, 2});
            vs.push_back({"tma ns3 c256 ef, compute only", 2, 3, tg, 1, 3});
            vs.push_back({"tma ns3 c256 ef grid " + std::to_string(g2), 2, 3, g2, 1, 0});
            vs.push_back({"  same, loads only", 2, 3, g2, 1, 2});
            vs.push_back({"  same, compute only", 2, 3, g2, 1, 3});
            for (int ns : {3, 4, 5, 6})
                if (GV_WIDE_BYTES + ns * SB <= (u32)smax) {
                    vs.push_back({"tma2 (x in regs) ns" + std::to_string(ns), 3, ns, tg, 1, 0});
                    vs.push_back({"  same, grid " + std::to_string(g2), 3, ns, g2, 1, 0});
                }
        }
        auto enqueue = [&](const V& v, const MlpSet& s, bool rn) {
            MlpArgs a  = args(s);
            void* pa[] = {&a};
            if (v.kind == 0)
                launch_pdl(mlp_kernel(128), nslices, 128, g4::cuda_rt::gemv_smem(true, 90, H), st, pa);
            else if (v.kind == 1)
                launch_pdl(mlp_kernel(256), nslices, 256, g4::cuda_rt::gemv_smem(true, 90, H), st, pa);
            else if (v.kind == 3)
                launch_pdl(H / 512 == 3 ? (const void*)g4_mlp_tma2<3> : (const void*)g4_mlp_tma2<5>, v.grid,
                           256, GV_WIDE_BYTES + v.ns * SB, st, pa);
            else
                launch_pdl(tma_fn[v.ct512][v.ef], v.grid, v.ct512 == 1 ? 544 : 288, GV_WIDE_BYTES + v.ns * SB,
                           st, pa);
            if (rn) launch_stand_in(st, y, xo, H);
        };
        auto result = [&](const V& v) { return mlp_result(st, y, H, [&] { enqueue(v, sets[0], false); }); };
        const std::vector<double> err = mlp_errors(vs, result); // G4_LAB_PROFILE: these runs only
        if (prof) continue;
        std::printf("%s: H %d I %d, %.1f MB a set, %d sets, stage %u B, tma grid %u (%d slices a block)\n",
                    sh.name, H, I, mlp_bytes / 1e6, copies, SB, tg, per);
        std::vector<std::string> names;
        for (const V& v : vs)
            names.push_back(v.name);
        mlp_time_modes(gpu, reps, copies, mlp_bytes, names, err, sets,
                       [&](size_t vi, const MlpSet& set, bool rn) { enqueue(vs[vi], set, rn); });
    }
    return 0;
}
