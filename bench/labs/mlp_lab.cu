// Fused decode MLP lab (sm_90): times the decode graph's gate/up GEMV + down GEMV pair (the kernels of
// kernels/cuda/decode_gemv.cu at the compiler's lane choices) against one kernel that does both. Block j of
// the fused kernel computes act[jS, jS + S) = gelu(gate . x) * (up . x) with the gate/up GEMV's own body
// (into shared memory), then the down projection's K-slice j: part[r] = sum_c D[r, jS + c] act[jS + c] for
// every output row r, which it adds into y (red.global.add of f32, or of u64 fixed point in 2^-36 units:
// a sum independent of the order). No block waits for another. The down matrix is the same NF4
// bytes re-tiled so each slice is contiguous: codes [I / S][H][S / 2 bytes], absmax [I / 64][H].
// Launches are captured in a CUDA graph with programmatic dependent launch, as the decode graph runs them;
// weight sets rotate so every launch reads DRAM. Prints µs per MLP (median over samples) and each fused
// variant's largest difference from the two-kernel output, relative to its largest |output|.
// Build with the CUDA toolkit from the repo root (an sm_90 GPU runs it):
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o build/mlp_lab bench/labs/mlp_lab.cu && build/mlp_lab [reps]
#include "compiler/cuda_schedule.h"
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

struct MlpDown {
    const u8* codes;      // [I / S][H][S / 2]
    const u8* absmax;     // [I / 64][H] (double quant codes)
    const float* absmax2; // [H * I / 64 / 256], indexed by the original flat block (r * I / 64 + c / 64)
    const float* offset;
    const float* code2;
    float* y;            // [H], accumulated into (RED 3: written)
    float* part;         // RED 3: [I / S][H] partials
    const u8* codes_std; // the standard layout ([H][I / 2] codes, [H][I / 64] absmax): T = false
    const u8* absmax_std;
    unsigned* cnt; // RED 3: two zeroed counters, zeroed again at exit
    int H, I;
};

// S: outputs a block (gate/up row pairs; S = 2 B / L, a multiple of 32); L: gate/up lanes; B: threads;
// RED: 0 f32 adds (kernels.cu's red_add_v4), 2 u64 fixed-point adds (s32: 35-51% slower than the two kernels
// on an H100), 3 partials to global memory, summed in block order by the last 64 blocks to finish theirs
// (deterministic); PF: 1 the down slice pulled into L2 before the wait, 2 after the gate/up, 0 not at all;
// T: the down weight tiled (else row-major). (An earlier form also summed over clusters of 8 blocks
// through distributed shared memory before adding: 3-31% slower than the two kernels.)
// DB > 0 (f32 adds, tiled, S = 32): the down half issues the code and scale loads of up to DB of its
// row groups (4 rows each, B * 4 rows apart) before the first multiply, rather than one group at a time.
template <int S, int L, int B, int RED, int PF, bool T = true, int DB = 0>
__device__ __forceinline__ void mlp_body(const GemvArgs& gu, const MlpDown& d) {
    static_assert(S == 2 * B / L && S % 32 == 0,
                  "B threads, groups of L lanes, 2 outputs a group; whole 16-byte chunks");
    extern __shared__ float4 ml_wide[];
    float4* gv_wide = ml_wide;
    __shared__ float s_act[S];
    const int j = blockIdx.x, H = d.H, I = d.I;
    const u8* tile     = T ? d.codes + (long)j * H * (S / 2) : d.codes_std + (long)j * (S / 2);
    const long rstride = T ? S / 2 : I / 2; // bytes between rows of the slice
    if (PF == 1 && T)
        for (int i = threadIdx.x; i < H * (S / 2) / 128; i += B)
            prefetch_l2(tile + i * 128);
    GemvArgs a = gu;
    a.out      = s_act - j * S;
    gemv_body<true, L, 2, GV_OUT, true, B, true>(a, (float2*)gv_wide, gv_wide);
    if (PF == 2 && T)
        for (int i = threadIdx.x; i < H * (S / 2) / 128; i += B)
            prefetch_l2(tile + i * 128);
    __syncthreads();
    float av[S];
#pragma unroll
    for (int c = 0; c < S; ++c)
        av[c] = s_act[c];
    const u32 lane_off = (threadIdx.x & 15) * 8;
    const char* tb     = (const char*)gv_wide;
    const int c64      = j * S / 64;
    int r_start        = 4 * threadIdx.x;
    if constexpr (DB > 0 && T && RED == 0 && S == 32) {
        uint4 pk[DB][4];
        u32 r4[DB];
#pragma unroll
        for (int g = 0; g < DB; ++g) {
            const int r0 = 4 * (threadIdx.x + g * B);
            if (r0 < H) {
#pragma unroll
                for (int k = 0; k < 4; ++k)
                    pk[g][k] = __ldcs((const uint4*)(tile + (long)(r0 + k) * 16));
                r4[g] = __ldcs((const u32*)(d.absmax + (long)c64 * H + r0));
            }
        }
#pragma unroll
        for (int g = 0; g < DB; ++g) {
            const int r0 = 4 * (threadIdx.x + g * B);
            if (r0 >= H) break;
            float out[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const u32 words[4] = {pk[g][k].x, pk[g][k].y, pk[g][k].z, pk[g][k].w};
                const float dot    = nf4_chunk_dot<true>(words, av, tb, lane_off);
                const long b       = (long)(r0 + k) * (I / 64) + c64;
                out[k] = dot * nf4_absmax_value((r4[g] >> (8 * k)) & 0xffu, d.absmax2, d.offset, d.code2, b);
            }
            red_add_v4(d.y + r0, make_float4(out[0], out[1], out[2], out[3]));
        }
        r_start = 4 * (threadIdx.x + DB * B);
    }
    // Thread t: rows 4 (t + B i) .. + 3.
    for (int r0 = r_start; r0 < H; r0 += 4 * B) {
        constexpr int W = S / 8; // code words a row
        u32 wv[4][W];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if (W == 8) {
                const uint4* p = (const uint4*)(tile + (long)(r0 + k) * rstride);
                uint4 t0 = __ldcs(p), t1 = __ldcs(p + 1);
                const u32 v[8] = {t0.x, t0.y, t0.z, t0.w, t1.x, t1.y, t1.z, t1.w};
#pragma unroll
                for (int q = 0; q < W; ++q)
                    wv[k][q] = v[q];
            } else {
                uint4 t  = __ldcs((const uint4*)(tile + (long)(r0 + k) * rstride));
                wv[k][0] = t.x, wv[k][1] = t.y, wv[k][2] = t.z, wv[k][3] = t.w;
            }
        }
        u32 raw4;
        if (T)
            raw4 = __ldcs((const u32*)(d.absmax + (long)c64 * H + r0));
        else {
            raw4 = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k)
                raw4 |= (u32)__ldg(d.absmax_std + (long)(r0 + k) * (I / 64) + c64) << (8 * k);
        }
        float out[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            float dot = 0.0f;
#pragma unroll
            for (int ch = 0; ch < W / 4; ++ch)
                dot += nf4_chunk_dot<true>(wv[k] + 4 * ch, av + 32 * ch, tb, lane_off);
            const long b   = (long)(r0 + k) * (I / 64) + c64;
            const float sc = nf4_absmax_value((raw4 >> (8 * k)) & 0xffu, d.absmax2, d.offset, d.code2, b);
            out[k]         = dot * sc;
        }
        const float4 o = make_float4(out[0], out[1], out[2], out[3]);
        if (RED == 0)
            red_add_v4(d.y + r0, o);
        else if (RED == 3)
            __stcg((float4*)(d.part + (long)j * H + r0), o);
        else if (RED == 2) {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const long long q = __float2ll_rn(out[k] * 68719476736.0f); // 2^36
                asm volatile("red.global.add.u64 [%0], %1;" ::"l"((unsigned long long*)d.y + r0 + k), "l"(q)
                             : "memory");
            }
        }
    }
    if (RED == 3) {
        // The last ML_R blocks to finish their partials sum them, each H / ML_R columns, in block order.
        constexpr int R = 64;
        __shared__ int s_t;
        __threadfence();
        __syncthreads();
        const int NB = gridDim.x;
        if (threadIdx.x == 0) s_t = (int)atomicAdd(d.cnt, 1u);
        __syncthreads();
        const int q = s_t - (NB - R);
        if (q < 0) return;
        if (threadIdx.x == 0) {
            unsigned v;
            do
                asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(d.cnt) : "memory");
            while (v < (unsigned)NB);
        }
        __syncthreads();
        const int cols4 = H / R / 4, P = B / cols4; // P threads a float4 column group, strided over blocks
        const int g = threadIdx.x % cols4, sl = threadIdx.x / cols4;
        float4 acc         = make_float4(0.f, 0.f, 0.f, 0.f);
        constexpr int MAXL = 32; // every load in flight at once, then summed in block order
        float4 v[MAXL];
#pragma unroll
        for (int k = 0; k < MAXL; ++k)
            if (sl < P && sl + k * P < NB)
                v[k] = __ldcg((const float4*)(d.part + (long)(sl + k * P) * H + q * (H / R)) + g);
#pragma unroll
        for (int k = 0; k < MAXL; ++k)
            if (sl < P && sl + k * P < NB) acc.x += v[k].x, acc.y += v[k].y, acc.z += v[k].z, acc.w += v[k].w;
        __shared__ float4 s_red[B];
        s_red[threadIdx.x] = acc;
        __syncthreads();
        if (threadIdx.x < cols4) {
            float4 t = s_red[threadIdx.x];
            for (int k = 1; k < P; ++k) {
                const float4 v = s_red[k * cols4 + threadIdx.x];
                t.x += v.x, t.y += v.y, t.z += v.z, t.w += v.w;
            }
            ((float4*)(d.y + q * (H / R)))[threadIdx.x] = t;
        }
        if (threadIdx.x == 0 && atomicAdd(d.cnt + 1, 1u) == R - 1) d.cnt[0] = 0, d.cnt[1] = 0;
    }
}

#define ML_KERNEL(NAME, S, L, B, RED, PF, T, ...)                                                            \
    __global__ void __launch_bounds__(B, B == 128 ? 3 : 2) NAME(const GemvArgs gu, const MlpDown d) {        \
        mlp_body<S, L, B, RED, PF, T __VA_OPT__(, ) __VA_ARGS__>(gu, d);                                     \
    }
ML_KERNEL(ml_s32_f_p0, 32, 8, 128, 0, 0, true)
ML_KERNEL(ml_s32_f_std, 32, 8, 128, 0, 0, false)
ML_KERNEL(ml_s32b256_f_std, 32, 16, 256, 0, 0, false)
ML_KERNEL(ml_s32b256_f_p0, 32, 16, 256, 0, 0, true)
ML_KERNEL(ml_s32_f_db3, 32, 8, 128, 0, 0, true, 3)
ML_KERNEL(ml_s32_f_db5, 32, 8, 128, 0, 0, true, 5)
ML_KERNEL(ml_s32b256_f_db2, 32, 16, 256, 0, 0, true, 2)
ML_KERNEL(ml_s32b256_f_db3, 32, 16, 256, 0, 0, true, 3)
ML_KERNEL(ml_s32_t_p0, 32, 8, 128, 3, 0, true)
ML_KERNEL(ml_s32_t_std, 32, 8, 128, 3, 0, false)
ML_KERNEL(ml_s32b256_t_std, 32, 16, 256, 3, 0, false)
typedef void (*MlFn)(const GemvArgs, const MlpDown);
struct MlVariant {
    const char* name;
    MlFn fn;
    int S, B, red;
};
static const MlVariant kMl[] = {
    {"s32 f32 tiled", ml_s32_f_p0, 32, 128, 0},
    {"s32 b256 f32 tiled", ml_s32b256_f_p0, 32, 256, 0},
    {"s32 tiled down x3", ml_s32_f_db3, 32, 128, 0},
    {"s32 tiled down x5", ml_s32_f_db5, 32, 128, 0},
    {"s32 b256 tiled down x2", ml_s32b256_f_db2, 32, 256, 0},
    {"s32 b256 tiled down x3", ml_s32b256_f_db3, 32, 256, 0},
    {"s32 f32 std", ml_s32_f_std, 32, 128, 0},
    {"s32 b256 f32 std", ml_s32b256_f_std, 32, 256, 0},
    {"s32 ticket tiled", ml_s32_t_p0, 32, 128, 3},
    {"s32 ticket std", ml_s32_t_std, 32, 128, 3},
    {"s32 b256 ticket std", ml_s32b256_t_std, 32, 256, 3},
};

// One NF4 matrix [n, k] (double quant), standard layout, random bytes; host copies kept for re-tiling.
struct Nf4 {
    std::vector<u8> codes, aq;
    std::vector<float> a2;
    GemvMat dev{};
};
static Nf4 make_nf4(int n, int k, std::mt19937& rng, const float* code2_dev, const float* off_dev) {
    Nf4 m;
    size_t elems = (size_t)n * k, blocks = elems / 64;
    m.codes.resize(elems / 2), m.aq.resize(blocks), m.a2.assign((blocks + 255) / 256, 0.02f);
    for (auto& b : m.codes)
        b = (u8)rng();
    for (auto& b : m.aq)
        b = (u8)rng();
    m.dev.w = up(m.codes.data(), m.codes.size()), m.dev.absmax = up(m.aq.data(), m.aq.size());
    m.dev.absmax2 = (const float*)up(m.a2.data(), m.a2.size() * 4), m.dev.offset = off_dev,
    m.dev.code2 = code2_dev, m.dev.n = n;
    return m;
}
struct Set {
    Nf4 gate, up, down;
    const u8 *tcodes16, *tcodes32, *tcodes64, *tabs;
};

int main(int argc, char** argv) {
    const int reps     = argc > 1 ? std::atoi(argv[1]) : 15;
    const BenchGpu gpu = bench_gpu();
    cudaStream_t st    = gpu.st;
    cudaEvent_t e0 = gpu.e0, e1 = gpu.e1;
    const DqTables dq      = dq_tables();
    const float* code2_dev = dq.code2;
    const float* off_dev   = dq.offset;
    std::mt19937 rng(7);
    for (const MlpShape& sh : kMlpShapes) {
        const int H = sh.H, I = sh.I;
        const size_t mlp_bytes = (size_t)3 * H * I / 2 + (size_t)3 * H * I / 64;
        const int copies       = (int)std::max<size_t>(2, (size_t)(384u << 20) / mlp_bytes + 1);
        std::vector<Set> sets(copies);
        for (auto& s : sets) {
            s.gate = make_nf4(I, H, rng, code2_dev, off_dev);
            s.up   = make_nf4(I, H, rng, code2_dev, off_dev);
            s.down = make_nf4(H, I, rng, code2_dev, off_dev);
            for (int S : {16, 32, 64}) {
                std::vector<u8> t((size_t)H * I / 2);
                for (int jj = 0; jj < I / S; ++jj)
                    for (int r = 0; r < H; ++r)
                        std::memcpy(&t[((size_t)jj * H + r) * (S / 2)],
                                    &s.down.codes[((size_t)r * I + (size_t)jj * S) / 2], S / 2);
                (S == 16   ? s.tcodes16
                 : S == 32 ? s.tcodes32
                           : s.tcodes64) = (const u8*)up(t.data(), t.size());
            }
            std::vector<u8> ta((size_t)H * I / 64);
            for (int c = 0; c < I / 64; ++c)
                for (int r = 0; r < H; ++r)
                    ta[(size_t)c * H + r] = s.down.aq[(size_t)r * (I / 64) + c];
            s.tabs = (const u8*)up(ta.data(), ta.size());
        }
        float *x, *act, *y;
        CK(cudaMalloc(&x, H * 4));
        CK(cudaMalloc(&act, I * 4));
        CK(cudaMalloc(&y, H * 8));
        float* part;
        unsigned* cnt;
        CK(cudaMalloc(&part, (size_t)I / 16 * H * 4));
        CK(cudaMalloc(&cnt, 8));
        CK(cudaMemset(cnt, 0, 8));
        std::vector<float> hx(H);
        for (auto& v : hx)
            v = (float)(rng() % 1000) / 1000.0f - 0.5f;
        CK(cudaMemcpy(x, hx.data(), H * 4, cudaMemcpyHostToDevice));
        const int lgu = g4::cuda::gemv_lanes(H, true, I), ldn = g4::cuda::gemv_lanes(I, true, (H + 3) / 4);
        int li_gu = 0, li_dn = 0;
        while ((8 << li_gu) != lgu)
            ++li_gu;
        while ((8 << li_dn) != ldn)
            ++li_dn;
        const void* gu_fn[5]   = {(void*)g4_gemv_nf4_l8_m2, (void*)g4_gemv_nf4_l16_m2,
                                  (void*)g4_gemv_nf4_l32_m2, (void*)g4_gemv_nf4_l64_m2,
                                  (void*)g4_gemv_nf4_l128_m2};
        const void* dn_fn[5]   = {(void*)g4_gemv_nf4_l8_m1, (void*)g4_gemv_nf4_l16_m1,
                                  (void*)g4_gemv_nf4_l32_m1, (void*)g4_gemv_nf4_l64_m1,
                                  (void*)g4_gemv_nf4_l128_m1};
        const unsigned smem_gu = g4::cuda_rt::gemv_smem(true, 90, H),
                       smem_dn = g4::cuda_rt::gemv_smem(true, 90, I);
        CK(cudaFuncSetAttribute(gu_fn[li_gu], cudaFuncAttributeMaxDynamicSharedMemorySize, smem_gu));
        CK(cudaFuncSetAttribute(dn_fn[li_dn], cudaFuncAttributeMaxDynamicSharedMemorySize, smem_dn));
        const unsigned grid_gu = (unsigned)(((long)(I + 1) / 2 * lgu + 127) / 128),
                       grid_dn = (unsigned)(((long)(H + 3) / 4 * ldn + 127) / 128);
        auto gu_args           = [&](const Set& s, float* out) {
            GemvArgs a{};
            a.m[0] = s.gate.dev, a.m[1] = s.up.dev;
            a.x = x, a.out = out, a.nmat = 2, a.k = H, a.epi = 1;
            return a;
        };
        auto dn_args = [&](const Set& s) {
            GemvArgs a{};
            a.m[0] = s.down.dev, a.m[0].y = y;
            a.x = act, a.nmat = 1, a.k = I, a.epi = 0;
            return a;
        };
        auto ml_args = [&](const Set& s, int S) {
            MlpDown d{S == 16   ? s.tcodes16
                      : S == 32 ? s.tcodes32
                                : s.tcodes64,
                      s.tabs,
                      s.down.dev.absmax2,
                      off_dev,
                      code2_dev,
                      y,
                      part,
                      (const u8*)s.down.dev.w,
                      (const u8*)s.down.dev.absmax,
                      cnt,
                      H,
                      I};
            return d;
        };
        // variant -1: the two kernels; returns µs per MLP.
        auto enqueue = [&](int vi, const Set& s) {
            if (vi < 0) {
                GemvArgs a = gu_args(s, act), b = dn_args(s);
                void* pa[] = {&a};
                launch_pdl(gu_fn[li_gu], grid_gu, 128, smem_gu, st, pa);
                void* pb[] = {&b};
                launch_pdl(dn_fn[li_dn], grid_dn, 128, smem_dn, st, pb);
            } else {
                GemvArgs a = gu_args(s, nullptr);
                MlpDown d  = ml_args(s, kMl[vi].S);
                void* pa[] = {&a, &d};
                launch_pdl((const void*)kMl[vi].fn, (unsigned)(I / kMl[vi].S), kMl[vi].B, smem_gu, st, pa);
            }
        };
        for (const auto& v : kMl)
            CK(cudaFuncSetAttribute((const void*)v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_gu));
        auto result = [&](int vi) {
            CK(cudaMemset(y, 0, H * 8));
            enqueue(vi, sets[0]);
            CK(cudaStreamSynchronize(st));
            CK(cudaGetLastError());
            std::vector<float> h(H);
            if (vi >= 0 && kMl[vi].red == 2) {
                std::vector<long long> q(H);
                CK(cudaMemcpy(q.data(), y, H * 8, cudaMemcpyDeviceToHost));
                for (int i = 0; i < H; ++i)
                    h[i] = (float)((double)q[i] / 68719476736.0);
            } else
                CK(cudaMemcpy(h.data(), y, H * 4, cudaMemcpyDeviceToHost));
            return h;
        };
        const std::vector<float> ref = result(-1);
        std::printf(
            "%s: H %d I %d, %.1f MB a set, %d sets; two kernels: gate/up L%d %u blocks, down L%d %u blocks\n",
            sh.name, H, I, mlp_bytes / 1e6, copies, lgu, grid_gu, ldn, grid_dn);
        const int nv = (int)(sizeof kMl / sizeof kMl[0]);
        // Alternate the variants within each round so drift hits all alike.
        std::vector<std::vector<float>> t(nv + 1);
        std::vector<cudaGraphExec_t> ex(nv + 1);
        for (int vi = -1; vi < nv; ++vi) {
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            for (int rep = 0; rep < 2; ++rep)
                for (int si = 0; si < copies; ++si)
                    enqueue(vi, sets[si]);
            CK(cudaStreamEndCapture(st, &g));
            CK(cudaGraphInstantiate(&ex[vi + 1], g, 0));
            CK(cudaGraphDestroy(g));
        }
        for (int r = 0; r < reps + 2; ++r)
            for (int vi = -1; vi < nv; ++vi) {
                CK(cudaEventRecord(e0, st));
                CK(cudaGraphLaunch(ex[vi + 1], st));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (r >= 2) t[vi + 1].push_back(ms * 1e3f / (2 * copies));
            }
        const float base = median(t[0]);
        std::printf("  %-24s %8.2f us\n", "gate/up + down", base);
        for (int vi = 0; vi < nv; ++vi) {
            const std::vector<float> got = result(vi);
            double dmax = 0, rmax = 0;
            for (int i = 0; i < H; ++i)
                dmax = std::max(dmax, (double)std::fabs(got[i] - ref[i])),
                rmax = std::max(rmax, (double)std::fabs(ref[i]));
            const float us = median(t[vi + 1]);
            std::printf("  %-24s %8.2f us  %+6.1f%%  err %.1e\n", kMl[vi].name, us,
                        100.0f * (base / us - 1.0f), dmax / rmax);
        }
        for (auto e : ex)
            cudaGraphExecDestroy(e);
    }
    return 0;
}
