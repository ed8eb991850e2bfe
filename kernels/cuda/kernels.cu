// g4 CUDA kernels, compiled ahead of time by NVRTC (compiler/cuda_compile.cpp) for the plan's target
// and stored in the plan (cubin + PTX). Self-contained: no host headers. Every kernel reads the step
// (rows, pos0, out_rows) from device memory so a captured CUDA graph replays for any position.
//
// Conventions (same semantics as kernels/ref): activations are row-major float32 with a leading
// dimension in elements; weights are bf16 (uint16 bits), f32, or an NF4 blob (kernels/nf4.h);
// KV caches are float32 or bf16 (kernel argument kvdt: G4_DT_F32 / G4_DT_BF16, rounded to nearest even
// when stored) [slots, kv_heads*dim], position p in slot p % slots; attention reads them as float32.
// Row modes: 0 = rows 0..T-1; 1 = inputs from row T-R, outputs from row 0 (final norm); 2 = rows 0..R-1.

#define NEG_INF __int_as_float(0xff800000)

typedef unsigned short u16;
typedef unsigned char u8;
typedef unsigned int u32;

struct Step {
    int rows, pos0, out_rows, pad;
};

#define G4_DT_F32 0
#define G4_DT_BF16 1

// Programmatic dependent launch (sm_90+): the decode graph launches each kernel while its predecessor
// drains. Every kernel calls pdl_begin() before it reads or writes activations (the wait returns once
// the previous kernel has finished and its writes are visible; without the launch attribute it is a
// no-op), then lets its successor launch. Only weight prefetches may come before it.
//
// Timeline lab (g4 compile --kernel-trace launches, see bench/scripts/trace_lab.sh): the first and the last
// block of every traced kernel record, from thread 0, the global timer at entry, after the wait and at
// exit, with a tag (the kernel and its variant; bench/scripts/trace_summary.py name_of decodes it) and a key
// (a weight or output pointer) saying which launch it was; the runtime writes the records out when the engine
// closes (G4_TRACE_OUT). Not compiled into ordinary plans. With G4_TRACE_ALL (--kernel-trace blocks) every
// block records, its linear index in bits 8..30 of smid (bench/scripts/trace_blocks.py reads those), into a
// ring that keeps the last G4_TRACE_CAP records (the end of the run: decode).
#ifdef G4_TRACE
#ifdef G4_TRACE_ALL
#define G4_TRACE_CAP (1 << 21)
#else
#define G4_TRACE_CAP (1 << 19)
#endif
struct TraceRec {
    unsigned long long key, t0, t1, t2; // ns: entry, after the wait, exit
    unsigned int tag, blocks, smid;     // smid: bit 31 the last block (ALL: 8..30 its index)
    unsigned int cycles;                // SM clocks from after the wait to exit
    unsigned int mark[4];               // ns after the wait at the kernel's G4_TRACE_MARK(0..3), or 0
};
__device__ TraceRec g4_trace_buf[G4_TRACE_CAP];
__device__ unsigned int g4_trace_n;
__shared__ unsigned long long g4_trace_tw, g4_trace_cw;
__shared__ unsigned int g4_trace_mk[4];
__device__ __forceinline__ unsigned long long g4_gtimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
struct TraceScope {
    unsigned long long key, t0;
    unsigned int tag, blocks, last, idx; // idx: G4_TRACE_ALL, the block's index << 8, else 0
    bool on;
    __device__ TraceScope(unsigned int tag_, const void* k,
                          bool enable = true) { // enable false: records nothing
        blocks                 = gridDim.x * gridDim.y * gridDim.z;
        const unsigned int lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
#ifdef G4_TRACE_ALL
        on   = enable && threadIdx.x == 0;
        last = lin == blocks - 1 && lin != 0;
        idx  = lin << 8;
#else
        on                   = enable && threadIdx.x == 0 && (lin == 0 || lin == blocks - 1);
        last                 = lin != 0;
        idx                  = 0;
#endif
        if (on) t0 = g4_gtimer(), key = (unsigned long long)k, tag = tag_;
        if (enable && threadIdx.x == 0)
            g4_trace_tw = 0, g4_trace_mk[0] = g4_trace_mk[1] = g4_trace_mk[2] = g4_trace_mk[3] = 0;
    }
    __device__ ~TraceScope() {
        if (!on) return;
        const unsigned long long t2 = g4_gtimer(), c2 = clock64();
        unsigned int sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
#ifdef G4_TRACE_ALL
        const unsigned int i = atomicAdd(&g4_trace_n, 1u) & (G4_TRACE_CAP - 1); // a ring: the last records
#else
        const unsigned int i = atomicAdd(&g4_trace_n, 1u);
#endif
        if (i < G4_TRACE_CAP)
            g4_trace_buf[i] = TraceRec{key,
                                       t0,
                                       g4_trace_tw,
                                       t2,
                                       tag,
                                       blocks,
                                       sm | (last ? 0x80000000u : 0u) | idx,
                                       (unsigned int)(c2 - g4_trace_cw),
                                       {g4_trace_mk[0], g4_trace_mk[1], g4_trace_mk[2], g4_trace_mk[3]}};
    }
};
#define G4_TRACE_SCOPE(tag, key) TraceScope g4_trace_scope_((tag), (key))
#define G4_TRACE_SCOPE_IF(on, tag, key) TraceScope g4_trace_scope_((tag), (key), (on))
#define G4_TRACE_MARK(k)                                                                                     \
    do {                                                                                                     \
        if (threadIdx.x == 0) g4_trace_mk[k] = (unsigned int)(g4_gtimer() - g4_trace_tw);                    \
    } while (0)
#else
#define G4_TRACE_SCOPE(tag, key)
#define G4_TRACE_SCOPE_IF(on, tag, key)
#define G4_TRACE_MARK(k)                                                                                     \
    do {                                                                                                     \
    } while (0)
#endif
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
#ifdef G4_TRACE
    if (threadIdx.x == 0) g4_trace_tw = g4_gtimer(), g4_trace_cw = clock64();
#endif
}
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

__device__ __forceinline__ int rows_of(const Step* s, int mode) {
    return mode == 0 ? s->rows : s->out_rows;
}
__device__ __forceinline__ int in_row0(const Step* s, int mode) {
    return mode == 1 ? s->rows - s->out_rows : 0;
}
__device__ __forceinline__ float bf16f(u16 h) {
    return __uint_as_float(((u32)h) << 16);
}
__device__ __forceinline__ float loadw(const void* w, int dt, long i) {
    return dt == G4_DT_BF16 ? bf16f(((const u16*)w)[i]) : ((const float*)w)[i];
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Block-wide sum / max for blockDim.x a multiple of 32 (<= 1024); `red` holds 32 floats. Every
// thread returns the same total, combined in the same order.
template <bool kMax> __device__ float block_reduce(float v, float* red) {
    v        = kMax ? warp_max(v) : warp_sum(v);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    // Second level in registers: lane i takes warp i's value; the xor butterfly pairs the same values in
    // every lane, so every thread returns the same total.
    float t = lane < nw ? red[lane] : (kMax ? NEG_INF : 0.0f);
    return kMax ? warp_max(t) : warp_sum(t);
}
__device__ float block_sum(float v, float* red) {
    return block_reduce<false>(v, red);
}
__device__ float block_max(float v, float* red) {
    return block_reduce<true>(v, red);
}

// y[t, :n] = table[ids[t], :n] * scale. grid (max_rows, ceil(n / 2048)), block 256: a thread loads its (up
// to) 8 values before it stores any. (A per-layer-input row is L * 256 values; looped one at a time, each
// was a DRAM round trip, ~16 us a token at E2B.)
extern "C" __global__ void g4_embed(const Step* s, const int* ids, const void* table, int dt, long n,
                                    float scale, float* y, long ldy) {
    G4_TRACE_SCOPE(7, table);
    pdl_begin();
    const int t = blockIdx.x;
    if (t >= s->rows) return;
    const long row = (long)ids[t] * n, j0 = (long)blockIdx.y * 2048 + threadIdx.x;
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u)
        v[u] = j0 + u * 256 < n ? loadw(table, dt, row + j0 + u * 256) : 0.0f;
#pragma unroll
    for (int u = 0; u < 8; ++u)
        if (j0 + u * 256 < n) y[t * ldy + j0 + u * 256] = v[u] * scale;
}

// ---- matmul: y[T, N] = x[T, K] . W[N, K]^T (+ bias). One warp per output row n, up to 8 rows of x
// per pass so each weight row is read once per 8 tokens. grid (ceil(N / warps)), block 32*warps.
#define MM_ROWS 8

extern "C" __global__ void g4_matmul_bf16(const Step* s, int mode, const float* x, long ldx, const u16* w,
                                          int N, int K, float* y, long ldy, const float* bias) {
    G4_TRACE_SCOPE(10, w);
    pdl_begin();
    int n    = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (n >= N) return;
    int T = rows_of(s, mode);
    x += (long)in_row0(s, mode) * ldx;
    const u16* wr = w + (long)n * K;
    for (int t0 = 0; t0 < T; t0 += MM_ROWS) {
        int tn = min(MM_ROWS, T - t0);
        float acc[MM_ROWS];
#pragma unroll
        for (int r = 0; r < MM_ROWS; ++r)
            acc[r] = 0.0f;
        if ((K & 7) == 0) {
            // 16-byte loads: 8 bf16 weights per lane per step.
            for (int k = lane * 8; k < K; k += 32 * 8) {
                uint4 pk = *(const uint4*)(wr + k);
                float wf[8];
                wf[0] = __uint_as_float(pk.x << 16), wf[1] = __uint_as_float(pk.x & 0xffff0000u);
                wf[2] = __uint_as_float(pk.y << 16), wf[3] = __uint_as_float(pk.y & 0xffff0000u);
                wf[4] = __uint_as_float(pk.z << 16), wf[5] = __uint_as_float(pk.z & 0xffff0000u);
                wf[6] = __uint_as_float(pk.w << 16), wf[7] = __uint_as_float(pk.w & 0xffff0000u);
#pragma unroll
                for (int r = 0; r < MM_ROWS; ++r) {
                    if (r < tn) {
                        const float* xr = x + (long)(t0 + r) * ldx + k;
                        float4 a = *(const float4*)xr, b = *(const float4*)(xr + 4);
                        acc[r] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x +
                                  wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
                    }
                }
            }
        } else {
            for (int k = lane; k < K; k += 32) {
                float wf = bf16f(wr[k]);
#pragma unroll
                for (int r = 0; r < MM_ROWS; ++r)
                    if (r < tn) acc[r] += wf * x[(long)(t0 + r) * ldx + k];
            }
        }
#pragma unroll
        for (int r = 0; r < MM_ROWS; ++r) {
            float v = warp_sum(acc[r]);
            if (lane == 0 && r < tn) y[(long)(t0 + r) * ldy + n] = v + (bias ? bias[n] : 0.0f);
        }
    }
}

extern "C" __global__ void g4_matmul_f32(const Step* s, int mode, const float* x, long ldx, const float* w,
                                         int N, int K, float* y, long ldy, const float* bias) {
    pdl_begin();
    int n    = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (n >= N) return;
    int T = rows_of(s, mode);
    x += (long)in_row0(s, mode) * ldx;
    const float* wr = w + (long)n * K;
    for (int t = 0; t < T; ++t) {
        float acc = 0.0f;
        for (int k = lane; k < K; k += 32)
            acc += wr[k] * x[(long)t * ldx + k];
        acc = warp_sum(acc);
        if (lane == 0) y[(long)t * ldy + n] = acc + (bias ? bias[n] : 0.0f);
    }
}

__constant__ float kNf4[16] = {-1.0f,
                               -0.6961928009986877f,
                               -0.5250730514526367f,
                               -0.39491748809814453f,
                               -0.28444138169288635f,
                               -0.18477343022823334f,
                               -0.09105003625154495f,
                               0.0f,
                               0.07958029955625534f,
                               0.16093020141124725f,
                               0.24611230194568634f,
                               0.33791524171829224f,
                               0.44070982933044434f,
                               0.5626170039176941f,
                               0.7229568362236023f,
                               1.0f};
// The code book in shared memory, for the block (a barrier follows): a warp's lookups hit 16 distinct
// banks there, while divergent indices into the constant cache serialise.
__device__ __forceinline__ void nf4_codebook(float* cb) {
    if (threadIdx.x < 16) cb[threadIdx.x] = kNf4[threadIdx.x];
    __syncthreads();
}

// absmax of 64-element block b: f32 table, or double quant code2[q[b]] * absmax2[b/256] + offset.
// In two steps for kernels that issue the load early: the raw word (f32 bits, or the u8 code q[b]),
// then its value. SM: the scale format a kernel is specialised for. NF4_SCALES_F32 / NF4_SCALES_DQ take the
// f32 table / the double quant only; NF4_SCALES_ANY decides by absmax2 at run time (both paths in the machine
// code, one predicated off). A GEMV loop issues the predicated-off path too, so the decode MLP has a kernel
// for each format (g4_mlp_nf4[_b256] f32, _dq double quant).
#define NF4_SCALES_ANY 0
#define NF4_SCALES_F32 1
#define NF4_SCALES_DQ 2
template <int SM> __device__ __forceinline__ u32 nf4_raw(const void* absmax, const float* absmax2, long b) {
    if constexpr (SM == NF4_SCALES_ANY)
        return absmax2 ? nf4_raw<NF4_SCALES_DQ>(absmax, absmax2, b)
                       : nf4_raw<NF4_SCALES_F32>(absmax, absmax2, b);
    else if constexpr (SM == NF4_SCALES_DQ)
        return (u32)((const u8*)absmax)[b];
    else
        return __float_as_uint(((const float*)absmax)[b]);
}
template <int SM>
__device__ __forceinline__ float nf4_value(u32 raw, const float* absmax2, const float* offset,
                                           const float* code2, long b) {
    if constexpr (SM == NF4_SCALES_ANY)
        return absmax2 ? nf4_value<NF4_SCALES_DQ>(raw, absmax2, offset, code2, b)
                       : nf4_value<NF4_SCALES_F32>(raw, absmax2, offset, code2, b);
    else if constexpr (SM == NF4_SCALES_DQ)
        return __fadd_rn(__fmul_rn(code2[raw], absmax2[b >> 8]), *offset);
    else
        return __uint_as_float(raw);
}
__device__ __forceinline__ u32 nf4_absmax_raw(const void* absmax, const float* absmax2, long b) {
    return nf4_raw<NF4_SCALES_ANY>(absmax, absmax2, b);
}
__device__ __forceinline__ float nf4_absmax_value(u32 raw, const float* absmax2, const float* offset,
                                                  const float* code2, long b) {
    return nf4_value<NF4_SCALES_ANY>(raw, absmax2, offset, code2, b);
}
__device__ __forceinline__ float nf4_absmax(const void* absmax, const float* absmax2, const float* offset,
                                            const float* code2, long b) {
    return nf4_absmax_value(nf4_absmax_raw(absmax, absmax2, b), absmax2, offset, code2, b);
}

// NF4 weights (kernels/nf4.h blob, pointers to its parts). Elements of row n start at n*K; blocks of
// 64 over the flattened array. Fast path when K % 64 == 0: each lane takes 16 elements (8 bytes)
// per step, half a block.
extern "C" __global__ void g4_matmul_nf4(const Step* s, int mode, const float* x, long ldx, const u8* codes,
                                         const void* absmax, const float* absmax2, const float* offset,
                                         const float* code2, int N, int K, float* y, long ldy,
                                         const float* bias) {
    pdl_begin();
    __shared__ float cb[16];
    nf4_codebook(cb);
    int n    = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (n >= N) return;
    int T = rows_of(s, mode);
    x += (long)in_row0(s, mode) * ldx;
    long e0 = (long)n * K;
    for (int t0 = 0; t0 < T; t0 += MM_ROWS) {
        int tn = min(MM_ROWS, T - t0);
        float acc[MM_ROWS];
#pragma unroll
        for (int r = 0; r < MM_ROWS; ++r)
            acc[r] = 0.0f;
        if ((K & 63) == 0) {
            for (int k = lane * 16; k < K; k += 32 * 16) {
                long e   = e0 + k;
                uint2 pk = *(const uint2*)(codes + (e >> 1));
                float am = nf4_absmax(absmax, absmax2, offset, code2, e >> 6);
                float wf[16];
                u32 words[2] = {pk.x, pk.y};
#pragma unroll
                for (int q = 0; q < 2; ++q)
#pragma unroll
                    for (int b = 0; b < 4; ++b) {
                        u32 byte              = (words[q] >> (8 * b)) & 0xff;
                        wf[q * 8 + b * 2]     = cb[byte >> 4] * am;
                        wf[q * 8 + b * 2 + 1] = cb[byte & 15] * am;
                    }
#pragma unroll
                for (int r = 0; r < MM_ROWS; ++r) {
                    if (r < tn) {
                        const float* xr = x + (long)(t0 + r) * ldx + k;
                        float sum       = 0.0f;
#pragma unroll
                        for (int v = 0; v < 4; ++v) {
                            float4 a = *(const float4*)(xr + 4 * v);
                            sum += wf[4 * v] * a.x + wf[4 * v + 1] * a.y + wf[4 * v + 2] * a.z +
                                   wf[4 * v + 3] * a.w;
                        }
                        acc[r] += sum;
                    }
                }
            }
        } else {
            for (int k = lane; k < K; k += 32) {
                long e   = e0 + k;
                u8 byte  = codes[e >> 1];
                float wf = cb[(e & 1) ? (byte & 15) : (byte >> 4)] *
                           nf4_absmax(absmax, absmax2, offset, code2, e >> 6);
#pragma unroll
                for (int r = 0; r < MM_ROWS; ++r)
                    if (r < tn) acc[r] += wf * x[(long)(t0 + r) * ldx + k];
            }
        }
#pragma unroll
        for (int r = 0; r < MM_ROWS; ++r) {
            float v = warp_sum(acc[r]);
            if (lane == 0 && r < tn) y[(long)(t0 + r) * ldy + n] = v + (bias ? bias[n] : 0.0f);
        }
    }
}

// ---- decode GEMV (one row of x): each warp computes 4 consecutive outputs, so every lane's slice of x
// is loaded once for 4 weight rows. grid (ceil(N/32)), block 256. Needs K % 512 == 0 (NF4) or
// K % 256 == 0 (bf16); the per-row kernels above handle the rest.
#define GV_R 4
extern "C" __global__ void g4_gemv_nf4(const Step* s, int mode, const float* x, long ldx, const u8* codes,
                                       const void* absmax, const float* absmax2, const float* offset,
                                       const float* code2, int N, int K, float* y, long ldy,
                                       const float* bias) {
    pdl_begin();
    __shared__ float cb[16];
    nf4_codebook(cb);
    int n0   = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * GV_R;
    int lane = threadIdx.x & 31;
    if (n0 >= N) return;
    x += (long)in_row0(s, mode) * ldx;
    float acc[GV_R] = {};
    for (int k = lane * 16; k < K; k += 32 * 16) {
        float xv[16];
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            float4 a  = *(const float4*)(x + k + 4 * v);
            xv[4 * v] = a.x, xv[4 * v + 1] = a.y, xv[4 * v + 2] = a.z, xv[4 * v + 3] = a.w;
        }
        uint2 pk[GV_R];
        float am[GV_R];
#pragma unroll
        for (int r = 0; r < GV_R; ++r) {
            int n  = min(n0 + r, N - 1);
            long e = (long)n * K + k;
            pk[r]  = *(const uint2*)(codes + (e >> 1));
            am[r]  = nf4_absmax(absmax, absmax2, offset, code2, e >> 6);
        }
#pragma unroll
        for (int r = 0; r < GV_R; ++r) {
            u32 words[2] = {pk[r].x, pk[r].y};
            float sum    = 0.0f;
#pragma unroll
            for (int q = 0; q < 2; ++q)
#pragma unroll
                for (int b = 0; b < 4; ++b) {
                    u32 byte = (words[q] >> (8 * b)) & 0xff;
                    sum += cb[byte >> 4] * xv[q * 8 + b * 2] + cb[byte & 15] * xv[q * 8 + b * 2 + 1];
                }
            acc[r] += sum * am[r];
        }
    }
#pragma unroll
    for (int r = 0; r < GV_R; ++r) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && n0 + r < N) y[n0 + r] = v + (bias ? bias[n0 + r] : 0.0f);
    }
}

extern "C" __global__ void g4_gemv_bf16(const Step* s, int mode, const float* x, long ldx, const u16* w,
                                        int N, int K, float* y, long ldy, const float* bias) {
    pdl_begin();
    int n0   = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * GV_R;
    int lane = threadIdx.x & 31;
    if (n0 >= N) return;
    x += (long)in_row0(s, mode) * ldx;
    float acc[GV_R] = {};
    for (int k = lane * 8; k < K; k += 32 * 8) {
        float4 a = *(const float4*)(x + k), b = *(const float4*)(x + k + 4);
        uint4 pk[GV_R];
#pragma unroll
        for (int r = 0; r < GV_R; ++r)
            pk[r] = *(const uint4*)(w + (long)min(n0 + r, N - 1) * K + k);
#pragma unroll
        for (int r = 0; r < GV_R; ++r) {
            acc[r] += __uint_as_float(pk[r].x << 16) * a.x + __uint_as_float(pk[r].x & 0xffff0000u) * a.y +
                      __uint_as_float(pk[r].y << 16) * a.z + __uint_as_float(pk[r].y & 0xffff0000u) * a.w +
                      __uint_as_float(pk[r].z << 16) * b.x + __uint_as_float(pk[r].z & 0xffff0000u) * b.y +
                      __uint_as_float(pk[r].w << 16) * b.z + __uint_as_float(pk[r].w & 0xffff0000u) * b.w;
        }
    }
#pragma unroll
    for (int r = 0; r < GV_R; ++r) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && n0 + r < N) y[n0 + r] = v + (bias ? bias[n0 + r] : 0.0f);
    }
}

// ---- tiled matmul for prefill chunks (T > 8): 64x64 output tiles, K in steps of 32 through shared
// memory, 4x4 outputs per thread, weights widened to float32 as the tile is loaded (bf16 or NF4).
// fp32 arithmetic like the CPU path. grid (ceil(N/64), ceil(T/64)), block 256. Needs K % 32 == 0.
#define TB 64
#define TK 32
__device__ __forceinline__ void tile_body(float (*xs)[TB + 4], float (*ws)[TB + 4], float acc[4][4], int tx,
                                          int ty) {
#pragma unroll 8
    for (int kk = 0; kk < TK; ++kk) {
        float a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            a[i] = xs[kk][ty * 4 + i], b[i] = ws[kk][tx * 4 + i];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                acc[i][j] += a[i] * b[j];
    }
}

__device__ __forceinline__ void tile_store(const Step* s, int mode, float acc[4][4], int t_base, int n_base,
                                           int tx, int ty, int T, int N, float* y, long ldy,
                                           const float* bias) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int t = t_base + ty * 4 + i;
        if (t >= T) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int n = n_base + tx * 4 + j;
            if (n < N) y[(long)t * ldy + n] = acc[i][j] + (bias ? bias[n] : 0.0f);
        }
    }
}

// Loads x[t_base.., k0..k0+31] transposed into xs[k][t].
__device__ __forceinline__ void load_x_tile(float (*xs)[TB + 4], const float* x, long ldx, int t_base, int T,
                                            int k0) {
    for (int e = threadIdx.x; e < TB * TK; e += blockDim.x) {
        int t = e / TK, k = e % TK;
        xs[k][t] = t_base + t < T ? x[(long)(t_base + t) * ldx + k0 + k] : 0.0f;
    }
}

// One 64x64 output tile; the weight tile is widened to fp32 from bf16 or NF4 as it is staged.
template <bool kIsNf4>
__device__ void simt_gemm(const Step* s, int mode, const float* x, long ldx, const u16* w, const u8* codes,
                          const void* absmax, const float* absmax2, const float* offset, const float* code2,
                          int N, int K, float* y, long ldy, const float* bias) {
    __shared__ float xs[TK][TB + 4], ws[TK][TB + 4];
    __shared__ float cb[16];
    nf4_codebook(cb);
    int T      = rows_of(s, mode);
    int t_base = blockIdx.y * TB, n_base = blockIdx.x * TB;
    if (t_base >= T) return;
    x += (long)in_row0(s, mode) * ldx;
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += TK) {
        load_x_tile(xs, x, ldx, t_base, T, k0);
        if (kIsNf4) { // 256 threads x 8 elements: thread -> (row n = tid / 4, 8 consecutive k)
            int n = threadIdx.x >> 2, kq = (threadIdx.x & 3) * 8;
            if (n_base + n < N) {
                long e   = (long)(n_base + n) * K + k0 + kq;
                u32 word = *(const u32*)(codes + (e >> 1));
                float am = nf4_absmax(absmax, absmax2, offset, code2, e >> 6);
#pragma unroll
                for (int b = 0; b < 4; ++b) {
                    u32 byte              = (word >> (8 * b)) & 0xff;
                    ws[kq + 2 * b][n]     = cb[byte >> 4] * am;
                    ws[kq + 2 * b + 1][n] = cb[byte & 15] * am;
                }
            } else {
#pragma unroll
                for (int b = 0; b < 8; ++b)
                    ws[kq + b][n] = 0.0f;
            }
        } else {
            for (int e = threadIdx.x; e < TB * TK; e += blockDim.x) {
                int n = e / TK, k = e % TK;
                ws[k][n] = n_base + n < N ? bf16f(w[(long)(n_base + n) * K + k0 + k]) : 0.0f;
            }
        }
        __syncthreads();
        tile_body(xs, ws, acc, tx, ty);
        __syncthreads();
    }
    tile_store(s, mode, acc, t_base, n_base, tx, ty, T, N, y, ldy, bias);
}

extern "C" __global__ void g4_gemm_bf16(const Step* s, int mode, const float* x, long ldx, const u16* w,
                                        int N, int K, float* y, long ldy, const float* bias) {
    pdl_begin();
    simt_gemm<false>(s, mode, x, ldx, w, nullptr, nullptr, nullptr, nullptr, nullptr, N, K, y, ldy, bias);
}

extern "C" __global__ void g4_gemm_nf4(const Step* s, int mode, const float* x, long ldx, const u8* codes,
                                       const void* absmax, const float* absmax2, const float* offset,
                                       const float* code2, int N, int K, float* y, long ldy,
                                       const float* bias) {
    pdl_begin();
    simt_gemm<true>(s, mode, x, ldx, nullptr, codes, absmax, absmax2, offset, code2, N, K, y, ldy, bias);
}

// ---- tensor-core GEMM for prefill (bf16 operands, fp32 accumulate): mma.sync m16n8k16. Block
// tile 64 tokens x 64 outputs, K in steps of 32; 4 warps as 2x2, each 32x32 (2 m-tiles x 4 n-tiles).
// Activations are rounded to bf16 as they are staged (like a bf16 model); weights are bf16, or NF4
// dequantized and rounded to bf16. grid (ceil(N/64), ceil(T/64)), block 128. Needs K % 32 == 0.
#define TCS 40 // shared row stride in bf16 elements (32 + 8 padding: conflict-free fragment loads)
__device__ __forceinline__ u32 bf16_bits(float f) {
    u32 u = __float_as_uint(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    return bf16_bits(lo) | (bf16_bits(hi) << 16);
}

__device__ __forceinline__ void mma_bf16(float* c, const u32* a, const u32* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <bool kIsNf4>
__device__ void tc_gemm(const Step* s, int mode, const float* x, long ldx, const u16* w, const u8* codes,
                        const void* absmax, const float* absmax2, const float* offset, const float* code2,
                        int N, int K, float* y, long ldy, const float* bias) {
    __shared__ __align__(16) u16 xs[64 * TCS];
    __shared__ __align__(16) u16 ws[64 * TCS];
    __shared__ float cb[16];
    nf4_codebook(cb);
    int T      = rows_of(s, mode);
    int t_base = blockIdx.y * 64, n_base = blockIdx.x * 64;
    if (t_base >= T) return;
    x += (long)in_row0(s, mode) * ldx;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int wm = (warp >> 1) * 32, wn = (warp & 1) * 32; // warp's 32x32 sub-tile
    int g = lane >> 2, tig = lane & 3;
    float acc[2][4][4] = {};
    for (int k0 = 0; k0 < K; k0 += 32) {
        // Stage x[64 x 32] (fp32 -> bf16) and W[64 x 32]: 128 threads; every load of a thread is
        // issued before the first use (8 independent 8-byte loads), so staging is not latency-bound.
        {
            float2 xv[8];
            int r0 = threadIdx.x >> 4, c = (threadIdx.x & 15) * 2;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                int r = r0 + 8 * i;
                xv[i] = t_base + r < T ? *(const float2*)(x + (long)(t_base + r) * ldx + k0 + c)
                                       : make_float2(0.0f, 0.0f);
            }
#pragma unroll
            for (int i = 0; i < 8; ++i)
                *(u32*)&xs[(r0 + 8 * i) * TCS + c] = pack2(xv[i].x, xv[i].y);
        }
        if (kIsNf4) {
            int r = threadIdx.x >> 1, c = (threadIdx.x & 1) * 16; // 64 rows x 2 halves of 16
            u32 out[8] = {};
            if (n_base + r < N) {
                long e       = (long)(n_base + r) * K + k0 + c;
                uint2 pk     = *(const uint2*)(codes + (e >> 1));
                float am     = nf4_absmax(absmax, absmax2, offset, code2, e >> 6);
                u32 words[2] = {pk.x, pk.y};
#pragma unroll
                for (int q = 0; q < 2; ++q)
#pragma unroll
                    for (int b = 0; b < 4; ++b) {
                        u32 byte       = (words[q] >> (8 * b)) & 0xff;
                        out[q * 4 + b] = pack2(cb[byte >> 4] * am, cb[byte & 15] * am);
                    }
            }
#pragma unroll
            for (int q = 0; q < 8; ++q)
                *(u32*)&ws[r * TCS + c + 2 * q] = out[q];
        } else {
            u32 wv[8];
            int r0 = threadIdx.x >> 4, c = (threadIdx.x & 15) * 2;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                int r = r0 + 8 * i;
                wv[i] = n_base + r < N ? *(const u32*)(w + (long)(n_base + r) * K + k0 + c) : 0u;
            }
#pragma unroll
            for (int i = 0; i < 8; ++i)
                *(u32*)&ws[(r0 + 8 * i) * TCS + c] = wv[i];
        }
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < 32; ks += 16) {
            u32 a[2][4], b[4][2];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                const u16* base = xs + (wm + mi * 16 + g) * TCS + ks + tig * 2;
                a[mi][0]        = *(const u32*)base;
                a[mi][1]        = *(const u32*)(base + 8 * TCS);
                a[mi][2]        = *(const u32*)(base + 8);
                a[mi][3]        = *(const u32*)(base + 8 * TCS + 8);
            }
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                const u16* base = ws + (wn + ni * 8 + g) * TCS + ks + tig * 2;
                b[ni][0]        = *(const u32*)base;
                b[ni][1]        = *(const u32*)(base + 8);
            }
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int ni = 0; ni < 4; ++ni)
                    mma_bf16(acc[mi][ni], a[mi], b[ni]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                int t = t_base + wm + mi * 16 + g + h * 8;
                if (t >= T) continue;
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    int n = n_base + wn + ni * 8 + tig * 2 + c;
                    if (n < N) y[(long)t * ldy + n] = acc[mi][ni][h * 2 + c] + (bias ? bias[n] : 0.0f);
                }
            }
}

extern "C" __global__ void g4_tc_gemm_bf16(const Step* s, int mode, const float* x, long ldx, const u16* w,
                                           int N, int K, float* y, long ldy, const float* bias) {
    pdl_begin();
    tc_gemm<false>(s, mode, x, ldx, w, nullptr, nullptr, nullptr, nullptr, nullptr, N, K, y, ldy, bias);
}
extern "C" __global__ void g4_tc_gemm_nf4(const Step* s, int mode, const float* x, long ldx, const u8* codes,
                                          const void* absmax, const float* absmax2, const float* offset,
                                          const float* code2, int N, int K, float* y, long ldy,
                                          const float* bias) {
    pdl_begin();
    tc_gemm<true>(s, mode, x, ldx, nullptr, codes, absmax, absmax2, offset, code2, N, K, y, ldy, bias);
}

// RMSNorm over groups of `dim` of the first `cols` columns. grid (max_rows, cols/dim), block 256.
extern "C" __global__ void g4_rms_norm(const Step* s, int mode, const float* x, long ldx, const void* w,
                                       int wdt, float* y, long ldy, int dim, float eps) {
    G4_TRACE_SCOPE(8, y);
    pdl_begin();
    __shared__ float red[32];
    int t = blockIdx.x;
    if (t >= rows_of(s, mode)) return;
    const float* xr = x + (long)(t + in_row0(s, mode)) * ldx + (long)blockIdx.y * dim;
    float* yr       = y + (long)t * ldy + (long)blockIdx.y * dim;
    float ss        = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss      = block_sum(ss, red);
    float r = powf(ss / (float)dim + eps, -0.5f);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        yr[i] = xr[i] * r * (w ? loadw(w, wdt, i) : 1.0f);
}

// Elementwise over [rows, cols]: op 0 add, 1 gelu_tanh(a)*b, 2 scale, 3 softcap. grid (max_rows,
// ceil(cols/256)), block 256.
extern "C" __global__ void g4_elementwise(const Step* s, int mode, int op, const float* a, long lda,
                                          const float* b, long ldb, float* y, long ldy, int cols, float f,
                                          const void* scalar, int sdt) {
    G4_TRACE_SCOPE(9 | op << 8, y);
    pdl_begin();
    int t = blockIdx.x;
    if (t >= rows_of(s, mode)) return;
    int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    long r0  = in_row0(s, mode);
    float av = a[(t + r0) * lda + i], out;
    if (op == 0)
        out = av + b[(t + r0) * ldb + i];
    else if (op == 1) {
        float g = 0.5f * av * (1.0f + tanhf(0.7978845608028654f * (av + 0.044715f * av * av * av)));
        out     = g * b[(t + r0) * ldb + i];
    } else if (op == 2)
        out = av * f * (scalar ? loadw(scalar, sdt, 0) : 1.0f);
    else
        out = f * tanhf(av / f);
    y[(long)t * ldy + i] = out;
}

// The per-layer inputs of a decode row (schedule record PleIn): ctx = ctx * s1; ctx = rms(ctx) * w over each
// group of P; out = (ctx + tok) * s2, the Scale, RmsNorm, Add and Scale ops in one kernel with their
// operation order (the generic kernels': powf for the norm). ctx [N], tok [N], out [N] (N = groups x P, row
// 0); w [P] (f32 or bf16). grid N / P (one group a block), block P rounded up to 32 (P <= 1024).
extern "C" __global__ void g4_ple_in(const float* ctx, const void* w, int wdt, const float* tok, float* out,
                                     int P, float s1, float eps, float s2) {
    G4_TRACE_SCOPE(9 | 4 << 8, out);
    __shared__ float red[32];
    const int i    = threadIdx.x;
    const long at  = (long)blockIdx.x * P + i;
    const float wv = i < P ? loadw(w, wdt, i) : 0.0f;
    pdl_begin();
    const float c = i < P ? ctx[at] * s1 : 0.0f, t = i < P ? tok[at] : 0.0f;
    const float r = powf(block_sum(c * c, red) / (float)P + eps, -0.5f);
    if (i < P) out[at] = (c * r * wv + t) * s2;
}

// RoPE in place (rotate-half pairing). grid (max_rows, heads), block half = dim/2 (<= 1024).
extern "C" __global__ void g4_rope(const Step* s, float* x, long ldx, const float* inv_freq, int dim) {
    G4_TRACE_SCOPE(11, x);
    pdl_begin();
    int t = blockIdx.x;
    if (t >= s->rows) return;
    int half = dim >> 1, k = threadIdx.x;
    if (k >= half) return;
    float* xr = x + (long)t * ldx + (long)blockIdx.y * dim;
    float ang = (float)(s->pos0 + t) * inv_freq[k];
    float cs, sn;
    sincosf(ang, &sn, &cs);
    float x0 = xr[k], x1 = xr[k + half];
    xr[k]        = x0 * cs - x1 * sn;
    xr[k + half] = x1 * cs + x0 * sn;
}

// Element i of a KV cache of dtype kvdt: stored rounded to nearest even (bf16); read with loadw.
__device__ __forceinline__ void kv_put(void* c, int kvdt, long i, float x) {
    if (kvdt == G4_DT_BF16)
        ((u16*)c)[i] = (u16)bf16_bits(x);
    else
        ((float*)c)[i] = x;
}

// KV store: rows of k, v into slot (pos0+t) % slots. grid (max_rows), block 256.
extern "C" __global__ void g4_kv_store(const Step* s, const float* k, long ldk, const float* v, long ldv,
                                       void* kc, void* vc, int width, int slots, int kvdt) {
    G4_TRACE_SCOPE(12, kc);
    pdl_begin();
    int t = blockIdx.x;
    if (t >= s->rows) return;
    long slot = (long)((s->pos0 + t) % slots) * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        kv_put(kc, kvdt, slot + i, k[(long)t * ldk + i]);
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        kv_put(vc, kvdt, slot + i, v[(long)t * ldv + i]);
}

// Attention, split over the key span: grid (max_rows * heads, splits), block 256. Each block
// computes over its slice of keys an unnormalized partial (max m, sum l, acc[dim]) into `part`
// [rows*heads, splits, dim + 2]; g4_attention_merge combines the splits.
extern "C" __global__ void g4_attention_partial(const Step* s, const float* q, long ldq, const void* kc,
                                                const void* vc, int heads, int kv_heads, int dim, int slots,
                                                int window, float scale, int splits, float* part,
                                                float* scores_ws, int max_span, int kvdt) {
    pdl_begin();
    __shared__ float red[32];
    int t = blockIdx.x / heads, h = blockIdx.x % heads;
    if (t >= s->rows) return;
    int pos  = s->pos0 + t;
    int lo   = window > 0 ? max(0, pos - window + 1) : 0;
    int span = pos - lo + 1;
    int per  = (span + splits - 1) / splits;
    int j0 = blockIdx.y * per, j1 = min(span, j0 + per);
    int width = kv_heads * dim, kvh = h / (heads / kv_heads);
    const float* qr = q + (long)t * ldq + (long)h * dim;
    float* sc =
        scores_ws + ((long)blockIdx.x * splits + blockIdx.y) * (long)((max_span + splits - 1) / splits + 1);
    float* out = part + ((long)blockIdx.x * splits + blockIdx.y) * (long)(dim + 2);
    // Scores: one warp per key.
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int j = j0 + wid; j < j1; j += nw) {
        const long kr = (long)((lo + j) % slots) * width + (long)kvh * dim;
        float d       = 0.0f;
        for (int i = lane; i < dim; i += 32)
            d += qr[i] * loadw(kc, kvdt, kr + i);
        d = warp_sum(d);
        if (lane == 0) sc[j - j0] = d * scale;
    }
    __syncthreads();
    float m = NEG_INF;
    for (int j = threadIdx.x; j < j1 - j0; j += blockDim.x)
        m = fmaxf(m, sc[j]);
    m       = block_max(m, red);
    float l = 0.0f;
    for (int j = threadIdx.x; j < j1 - j0; j += blockDim.x) {
        float p = __expf(sc[j] - m);
        sc[j]   = p;
        l += p;
    }
    l = block_sum(l, red);
    __syncthreads();
    // P.V: warp w takes keys j0+w, j0+w+nw, ...; lane holds dims lane, lane+32, ... (dim <= 512);
    // the warps' partial sums are added through shared memory.
    __shared__ float vacc[8][512];
    float acc[16];
#pragma unroll
    for (int c = 0; c < 16; ++c)
        acc[c] = 0.0f;
    for (int j = j0 + wid; j < j1; j += nw) {
        const long vr = (long)((lo + j) % slots) * width + (long)kvh * dim;
        float pj      = sc[j - j0];
#pragma unroll
        for (int c = 0; c < 16; ++c)
            if (lane + 32 * c < dim) acc[c] += pj * loadw(vc, kvdt, vr + lane + 32 * c);
    }
#pragma unroll
    for (int c = 0; c < 16; ++c)
        if (lane + 32 * c < dim && wid < 8) vacc[wid][lane + 32 * c] = acc[c];
    __syncthreads();
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < min(nw, 8); ++w)
            a += vacc[w][i];
        out[i] = a;
    }
    if (threadIdx.x == 0) out[dim] = m, out[dim + 1] = l;
}

// ---- Prefill attention on tensor cores (flash style, bf16 operands, fp32 accumulate and softmax).
// A block holds 4 units of 16 query rows of one head; heads of a KV group share the block (HW = 4, 2
// or 1 heads as the group size allows), so a block is 64 / HW rows x HW heads and every K/V tile it
// stages serves all of them. Each unit is one warp, or at dim 512 two warps that split the output
// columns (DV = 256 each, so O fits in registers; both compute the same scores). Keys stream through
// shared memory BK at a time (an fp32 cache rounded to bf16, a bf16 cache copied as it is); S = Q.K^T
// and O += P.V are mma.sync m16n8k16 with an online softmax in fp32 (log2 domain).
// grid (ceil(rows / (64 / HW)), heads / HW), block 128 * DIM / DV, dynamic shared memory
// FlashShape<DIM>::SMEM bytes (<= 99 KiB: sm_86/sm_89 fit). q [rows, heads*DIM] (ld ldq), caches
// [slots, kv_heads*DIM] of dtype kvdt, y [rows, ld ldy]. window > 0: sliding causal; 0: causal;
// < 0: bidirectional over the step's rows (keys in slots 0..rows-1, pos0 0: the vision tower).
__device__ __forceinline__ void ldsm_x4(u32* r, const u16* p) {
    u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(u32* r, const u16* p) {
    u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
// Stages n rows of `cols` fp32 (row j from src_row(j), or zeros where it returns null) as bf16 into
// dst [n][stride]; NT threads, 8 float4 loads in flight per thread.
template <int COLS, int NT, class RowFn>
__device__ __forceinline__ void stage_bf16(u16* dst, int stride, int n, RowFn src_row) {
    constexpr int C4 = COLS / 4;
    const int total  = n * C4;
    for (int e0 = threadIdx.x; e0 < total; e0 += NT * 8) {
        float4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            int e          = e0 + u * NT;
            const float* r = e < total ? src_row(e / C4) : nullptr;
            v[u]           = r ? *(const float4*)(r + 4 * (e % C4)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            int e = e0 + u * NT;
            if (e < total)
                *(uint2*)&dst[(e / C4) * stride + 4 * (e % C4)] =
                    make_uint2(pack2(v[u].x, v[u].y), pack2(v[u].z, v[u].w));
        }
    }
}
// K and V tiles together: n rows of COLS fp32 each, row j at element offset row_off[j] of kc and vc (-1:
// zeros), 16 float4 loads in flight per thread (8 of K, 8 of V) before any is converted.
template <int COLS, int NT>
__device__ __forceinline__ void stage_kv(u16* ks, u16* vs, int kstride, int vstride, int n, const float* kc,
                                         const float* vc, const long* row_off) {
    constexpr int C4 = COLS / 4;
    const int total  = n * C4;
    for (int e0 = threadIdx.x; e0 < total; e0 += NT * 8) {
        float4 kv[8], vv[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int e    = e0 + u * NT;
            const long o   = e < total ? row_off[e / C4] : -1;
            const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            kv[u]          = o >= 0 ? *(const float4*)(kc + o + 4 * (e % C4)) : z;
            vv[u]          = o >= 0 ? *(const float4*)(vc + o + 4 * (e % C4)) : z;
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int e = e0 + u * NT;
            if (e >= total) continue;
            *(uint2*)&ks[(e / C4) * kstride + 4 * (e % C4)] =
                make_uint2(pack2(kv[u].x, kv[u].y), pack2(kv[u].z, kv[u].w));
            *(uint2*)&vs[(e / C4) * vstride + 4 * (e % C4)] =
                make_uint2(pack2(vv[u].x, vv[u].y), pack2(vv[u].z, vv[u].w));
        }
    }
}
// The same tiles from a bf16 cache: copied as they are, 16 bytes per cp.async straight into shared
// memory (zero-filled rows past the chunk); the caller's __syncthreads() follows cp_async_wait().
template <int COLS, int NT>
__device__ __forceinline__ void stage_kv_bf16(u16* ks, u16* vs, int kstride, int vstride, int n,
                                              const u16* kc, const u16* vc, const long* row_off) {
    constexpr int C8 = COLS / 8;
    const int total  = n * C8;
    for (int e = threadIdx.x; e < total; e += NT) {
        const long o    = row_off[e / C8];
        const int col   = 8 * (e % C8);
        const u32 bytes = o >= 0 ? 16u : 0u;
        const long src  = o >= 0 ? o + col : 0;
        const u32 kd    = (u32)__cvta_generic_to_shared(ks + (e / C8) * kstride + col);
        const u32 vd    = (u32)__cvta_generic_to_shared(vs + (e / C8) * vstride + col);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(kd), "l"(kc + src), "r"(bytes));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(vd), "l"(vc + src), "r"(bytes));
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}
template <int DIM> struct FlashShape {
    static constexpr int BK = DIM <= 256 ? 32 : 16;   // keys per tile
    static constexpr int DV = DIM <= 256 ? DIM : 256; // output columns per warp
    static constexpr int NT = 128 * (DIM / DV);       // threads per block
    // Shared row strides (bf16), padded so ldmatrix is conflict-free; V unpadded at dim 512 to stay
    // within 99 KiB.
    static constexpr int QS = DIM + 8, VS = DIM + (DIM / DV == 1 ? 8 : 0);
    static constexpr int SMEM = (64 * QS + BK * QS + BK * VS) * 2;
};
template <int DIM>
__device__ void attn_flash(const Step* s, const float* q, long ldq, const void* kc, const void* vc, int heads,
                           int kv_heads, int slots, int window, float scale, float* y, long ldy, int kvdt) {
    using F          = FlashShape<DIM>;
    constexpr int BK = F::BK, DV = F::DV, QS = F::QS, VS = F::VS, NT = F::NT;
    extern __shared__ __align__(16) u16 fsm[];
    __shared__ long koff[BK]; // element offset of each key row of the tile in the caches, -1 past the chunk
    u16* Qs = fsm;            // [4 units][16][QS]
    u16* Ks = Qs + 64 * QS;   // [BK][QS]
    u16* Vs = Ks + BK * QS;   // [BK][VS]
    pdl_begin();
    const int rows = s->rows, pos0 = s->pos0, hpg = heads / kv_heads;
    const int HW = (hpg & 3) == 0 ? 4 : (hpg & 1) == 0 ? 2 : 1, RB = 64 / HW;
    const int r0 = blockIdx.x * RB;
    if (r0 >= rows) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int unit = warp & 3; // 16 rows of one head; warps unit and unit + 4 split the columns at dim 512
    const int h = blockIdx.y * HW + unit % HW, kvh = blockIdx.y * HW / hpg;
    const int wr0 = r0 + 16 * (unit / HW), dv0 = (warp >> 2) * DV, width = kv_heads * DIM;
    // Query rows of every unit, rounded to bf16 (rows past the chunk are zeros, never stored).
    stage_bf16<DIM, NT>(Qs, QS, 64, [&](int j) -> const float* {
        int w = j / 16, r = r0 + 16 * (w / HW) + j % 16;
        return r < rows ? q + (long)r * ldq + (long)(blockIdx.y * HW + w % HW) * DIM : nullptr;
    });
    // window < 0: bidirectional over the step's rows (the vision tower): every query sees keys 0..rows-1.
    const bool bidir = window < 0;
    const int p_last = bidir ? pos0 + rows - 1 : pos0 + min(rows, r0 + RB) - 1;
    const int k_lo   = window > 0 ? max(0, pos0 + r0 - window + 1) : 0;
    const int qa = pos0 + wr0 + g, qb = qa + 8; // this thread's two query positions
    const int wp0 = pos0 + wr0, wp1 = pos0 + min(wr0 + 15, rows - 1);
    const float sl2 = scale * 1.4426950408889634f; // scores in log2 units
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    float o[DV / 8][4];
#pragma unroll
    for (int i = 0; i < DV / 8; ++i)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    const u16* qw = Qs + unit * 16 * QS;
    for (int kt = k_lo; kt <= p_last; kt += BK) {
        __syncthreads();
        if (threadIdx.x < BK)
            koff[threadIdx.x] =
                kt + (int)threadIdx.x <= p_last ? (long)((kt + threadIdx.x) % slots) * width + kvh * DIM : -1;
        __syncthreads();
        if (kvdt == G4_DT_BF16)
            stage_kv_bf16<DIM, NT>(Ks, Vs, QS, VS, BK, (const u16*)kc, (const u16*)vc, koff);
        else
            stage_kv<DIM, NT>(Ks, Vs, QS, VS, BK, (const float*)kc, (const float*)vc, koff);
        __syncthreads();
        if (wr0 >= rows || (!bidir && (kt > wp1 || (window > 0 && kt + BK - 1 < wp0 - window + 1))))
            continue; // tile masked for the warp
        float sc[BK / 8][4];
#pragma unroll
        for (int i = 0; i < BK / 8; ++i)
            sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.0f;
#pragma unroll 4
        for (int k0 = 0; k0 < DIM; k0 += 16) {
            u32 a[4];
            ldsm_x4(a, qw + (lane & 15) * QS + k0 + 8 * (lane >> 4));
#pragma unroll
            for (int n0 = 0; n0 < BK; n0 += 16) {
                u32 b[4];
                ldsm_x4(b, Ks + (n0 + (lane & 7) + 8 * (lane >> 4)) * QS + k0 + 8 * ((lane >> 3) & 1));
                mma_bf16(sc[n0 / 8], a, b);
                mma_bf16(sc[n0 / 8 + 1], a, b + 2);
            }
        }
        // Mask (causal, window, past the chunk) and the online softmax; a row's 4 threads share it.
        float mt[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int i = 0; i < BK / 8; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int kp = kt + i * 8 + 2 * t4 + (e & 1), qp = e < 2 ? qa : qb;
                const bool ok = bidir ? kp <= p_last : kp <= qp && (window <= 0 || kp > qp - window);
                sc[i][e]      = ok ? sc[i][e] * sl2 : NEG_INF;
                mt[e >> 1]    = fmaxf(mt[e >> 1], sc[i][e]);
            }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mt[r]          = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 1));
            mt[r]          = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 2));
            const float mn = fmaxf(m[r], mt[r]), mu = mn == NEG_INF ? 0.0f : mn;
            corr[r] = exp2f(m[r] - mu);
            m[r]    = mn;
            l[r] *= corr[r];
            mt[r] = mu;
        }
#pragma unroll
        for (int i = 0; i < BK / 8; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                sc[i][e] = exp2f(sc[i][e] - mt[e >> 1]);
                l[e >> 1] += sc[i][e];
            }
#pragma unroll
        for (int i = 0; i < DV / 8; ++i)
            o[i][0] *= corr[0], o[i][1] *= corr[0], o[i][2] *= corr[1], o[i][3] *= corr[1];
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            u32 a[4] = {pack2(sc[2 * kk][0], sc[2 * kk][1]), pack2(sc[2 * kk][2], sc[2 * kk][3]),
                        pack2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                        pack2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
            for (int n0 = 0; n0 < DV; n0 += 16) {
                u32 b[4];
                ldsm_x4_t(b, Vs + (kk * 16 + (lane & 15)) * VS + dv0 + n0 + 8 * (lane >> 4));
                mma_bf16(o[n0 / 8], a, b);
                mma_bf16(o[n0 / 8 + 1], a, b + 2);
            }
        }
    }
    if (wr0 >= rows) return;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        l[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = wr0 + g + 8 * r;
        if (row >= rows) continue;
        float* yr = y + (long)row * ldy + (long)h * DIM + dv0 + 2 * t4;
#pragma unroll
        for (int i = 0; i < DV / 8; ++i)
            *(float2*)(yr + i * 8) = make_float2(o[i][2 * r] * l[r], o[i][2 * r + 1] * l[r]);
    }
}
#define G4_FLASH(D)                                                                                          \
    extern "C" __global__ void __launch_bounds__(FlashShape<D>::NT) g4_attn_flash_d##D(                      \
        const Step* s, const float* q, long ldq, const void* kc, const void* vc, int heads, int kv_heads,    \
        int slots, int window, float scale, float* y, long ldy, int kvdt) {                                  \
        attn_flash<D>(s, q, ldq, kc, vc, heads, kv_heads, slots, window, scale, y, ldy, kvdt);               \
    }
G4_FLASH(16)
G4_FLASH(32)
G4_FLASH(64)
G4_FLASH(128)
G4_FLASH(256)
G4_FLASH(512)

// grid (max_rows * heads, ceil(dim / 64)), block 256 or 1024: y = sum_s exp(m_s - M) acc_s / sum_s exp(m_s -
// M) l_s. A block takes 64 columns of one (row, head); its blockDim / 64 groups of 64 threads each sum every
// (blockDim / 64)-th split, so 1024 threads (a full-attention layer's decode at long context: hundreds of
// splits) give each thread a quarter of the dependent loads 256 do. window >= 0: a decode row of
// g4_attn_decode (the layer's window, 0 = none), whose splits past the span's last hold nothing and are
// not read; -1: every split is read (prefill).
#define AD_MIN 8 // g4_attn_decode: keys a split at least
// The decode attention merge's split weights (g4_attention_merge, g4_attn_o_nf4): over a head's partials p
// ([ks][dim + 2]: acc, max, sum), wsplit[k] = exp(max_k - M) for the splits holding keys (0 for the rest),
// *L = sum_k wsplit[k] sum_k, *nact = 1 + the last split holding keys. Up to 32 splits with keys (a short
// span) take one warp and one barrier; more, the whole block in parallel (B: its threads, 0 = blockDim.x).
// red: 32 floats.
template <int B = 0>
__device__ __forceinline__ void merge_split_weights(const float* p, int dim, int ks, float* wsplit,
                                                    float* red, float* L, int* nact) {
    const int D2 = dim + 2;
    if (ks <= 32) {
        if (threadIdx.x < 32) {
            const int k   = threadIdx.x;
            const float l = k < ks ? p[k * D2 + dim + 1] : 0.0f, m = l > 0.0f ? p[k * D2 + dim] : NEG_INF;
            const float M = warp_max(m), wk = l > 0.0f ? __expf(m - M) : 0.0f;
            wsplit[k]      = wk;
            const float Ls = warp_sum(wk * l), last = warp_max(l > 0.0f ? (float)(k + 1) : 0.0f);
            if (k == 0) red[0] = Ls, red[1] = last;
        }
        __syncthreads();
        *L = red[0], *nact = (int)red[1];
    } else {
        float M       = NEG_INF;
        const auto nt = [] { // as the kernels had it: int B, or unsigned blockDim.x
            if constexpr (B != 0)
                return B;
            else
                return blockDim.x;
        }();
        for (int k = threadIdx.x; k < ks; k += nt)
            if (p[k * D2 + dim + 1] > 0.0f) M = fmaxf(M, p[k * D2 + dim]);
        M        = block_max(M, red);
        float Lp = 0.0f, last = 0.0f;
        for (int k = threadIdx.x; k < ks; k += nt) {
            const float l = p[k * D2 + dim + 1], wk = l > 0.0f ? __expf(p[k * D2 + dim] - M) : 0.0f;
            wsplit[k] = wk;
            Lp += wk * l;
            if (l > 0.0f) last = (float)(k + 1);
        }
        *L    = block_sum(Lp, red);
        *nact = (int)block_max(last, red);
        __syncthreads();
    }
}
extern "C" __global__ void __launch_bounds__(1024)
    g4_attention_merge(const Step* s, const float* part, int heads, int dim, int splits, float* y, long ldy,
                       int window) {
    G4_TRACE_SCOPE(4, y);
    pdl_begin();
    int ks = splits; // splits that may hold keys
    if (window >= 0) {
        const int pos = s->pos0, lo = window > 0 ? max(0, pos - window + 1) : 0, span = pos - lo + 1;
        const int per = max(AD_MIN, (span + splits - 1) / splits);
        ks            = min(splits, (span + per - 1) / per);
    }
    __shared__ float red[32];
    __shared__ float wsplit[1024]; // splits <= 1024
    __shared__ float accs[16][64];
    int t = blockIdx.x / heads, h = blockIdx.x % heads;
    if (t >= s->rows) return;
    const float* p = part + (long)blockIdx.x * splits * (dim + 2);
    float L;
    int nact; // splits past the last non-empty one are skipped
    merge_split_weights(p, dim, ks, wsplit, red, &L, &nact);
    const int NG = blockDim.x >> 6, g = threadIdx.x >> 6, cl = threadIdx.x & 63, c = blockIdx.y * 64 + cl;
    float acc = 0.0f;
    if (c < dim) {
        // Empty splits have weight 0 and unwritten columns: selected away, never multiplied.
        int k = g;
        for (; k + 3 * NG < nact; k += 4 * NG) {
            float v0 = p[k * (dim + 2) + c], v1 = p[(k + NG) * (dim + 2) + c];
            float v2 = p[(k + 2 * NG) * (dim + 2) + c], v3 = p[(k + 3 * NG) * (dim + 2) + c];
            float w0 = wsplit[k], w1 = wsplit[k + NG], w2 = wsplit[k + 2 * NG], w3 = wsplit[k + 3 * NG];
            acc += w0 > 0.0f ? w0 * v0 : 0.0f;
            acc += w1 > 0.0f ? w1 * v1 : 0.0f;
            acc += w2 > 0.0f ? w2 * v2 : 0.0f;
            acc += w3 > 0.0f ? w3 * v3 : 0.0f;
        }
        for (; k < nact; k += NG) {
            float w = wsplit[k];
            if (w > 0.0f) acc += w * p[k * (dim + 2) + c];
        }
    }
    accs[g][cl] = acc;
    __syncthreads();
    if (g == 0 && c < dim) {
        float sum = 0.0f;
        for (int i = 0; i < NG; ++i)
            sum += accs[i][cl];
        y[(long)t * ldy + (long)h * dim + c] = sum / L;
    }
}

// Greedy sampling on the device: index of the largest logit (ties: the lowest index, as the CPU
// sampler). Each block reduces a contiguous slice into ws[2 + 2b] (value bits, index); the last block
// to finish (counter ws[1]) reduces the partials, writes ws[0] and resets the counter.
// grid <= 512, block 1024; ws: int32 [2 + 2 * grid], ws[1] zero at the first launch.
__device__ __forceinline__ void argmax_pick(float& bv, int& bi, float ov, int oi) {
    if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
}
// Tree reduction of every thread's (value, index) in shared memory; the block's pick lands in [0].
__device__ void argmax_block(float* bv, int* bi, float best, int idx) {
    bv[threadIdx.x] = best, bi[threadIdx.x] = idx;
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (threadIdx.x < st)
            argmax_pick(bv[threadIdx.x], bi[threadIdx.x], bv[threadIdx.x + st], bi[threadIdx.x + st]);
        __syncthreads();
    }
}
// Every block's (best, idx) to ws; the last block to finish picks among them and writes the token.
__device__ bool argmax_finish(float* bv, int* bi, float best, int idx, int* ws, Step* step, int* ids,
                              volatile int* host_tok, int limit) {
    __shared__ bool last;
    argmax_block(bv, bi, best, idx);
    if (threadIdx.x == 0) {
        ws[2 + 2 * blockIdx.x] = __float_as_int(bv[0]), ws[3 + 2 * blockIdx.x] = bi[0];
        __threadfence();
        last = atomicAdd(&ws[1], 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return false;
    __threadfence();
    best = NEG_INF, idx = 0x7fffffff;
    for (int b = threadIdx.x; b < gridDim.x; b += blockDim.x)
        argmax_pick(best, idx, __int_as_float(__ldcg(&ws[2 + 2 * b])), __ldcg(&ws[3 + 2 * b]));
    argmax_block(bv, bi, best, idx);
    if (threadIdx.x == 0) {
        ws[0] = bi[0], ws[1] = 0;
        if (step) {
            host_tok[step->pos0 & 1] = bi[0];
            ids[0]                   = bi[0] < limit ? bi[0] : 0;
            step->pos0 += 1;
        }
    }
    return true;
}
// The decode step's greedy token (lowest index among equal maxima) in ws[0]; ws[1] is the blocks'
// counter, reset for the next call. Feed (step non-null): the token also goes to the host-mapped slot
// host_tok[step->pos0 & 1], becomes the next step's id (ids[0]; an id the embedding cannot take,
// >= limit, as 0: such a step is only ever a speculative one the host discards), and the step's
// position advances, so the next decode step can run before the host has read the token.
extern "C" __global__ void g4_argmax(const float* logits, int vocab, int* ws, Step* step, int* ids,
                                     volatile int* host_tok, int limit) {
    G4_TRACE_SCOPE(6, logits);
    pdl_begin();
    __shared__ float bv[1024];
    __shared__ int bi[1024];
    const int per = (vocab + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per, hi = min(vocab, lo + per);
    float best = NEG_INF;
    int idx    = 0x7fffffff;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x)
        argmax_pick(best, idx, logits[i], i);
    argmax_finish(bv, bi, best, idx, ws, step, ids, host_tok, limit);
}

// ---- sampling on the GPU (outside the decode graph; the host draws from the candidates).
// Repetition penalty: y = logits (g4_copy_f32), then for each history token t, y[t] = logits[t] * p if
// negative, else / p (duplicates write the same value). grid ceil(n / 256), block 256.
extern "C" __global__ void g4_copy_f32(const float* x, float* y, long n) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
extern "C" __global__ void g4_penalize(const float* logits, float* y, const int* tokens, int n, int vocab,
                                       float penalty) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int t = tokens[i];
    if (t < 0 || t >= vocab) return;
    const float l = logits[t];
    y[t]          = l < 0.0f ? __fmul_rn(l, penalty) : __fdiv_rn(l, penalty);
}
// The softmax's normalizer over a row without top-k (GPU top-p / min-p): block b takes values
// [b * per, (b + 1) * per) of val[i] / temp (rounded as the host divides) and writes their maximum m
// and the sum of exp(v - m) in double, out[2b] = m, out[2b + 1] = sum; the host merges the blocks.
// grid kSoftmaxBlocks, block 256.
extern "C" __global__ void __launch_bounds__(256)
    g4_softmax_partial(const float* val, long n, float temp, double* out) {
    __shared__ float red[32];
    __shared__ double dred[256];
    const long per = (n + gridDim.x - 1) / gridDim.x, lo = (long)blockIdx.x * per, hi = min(n, lo + per);
    float m = NEG_INF;
    for (long i = lo + threadIdx.x; i < hi; i += blockDim.x)
        m = fmaxf(m, __fdiv_rn(val[i], temp));
    m          = block_max(m, red);
    double sum = 0.0;
    if (m > NEG_INF)
        for (long i = lo + threadIdx.x; i < hi; i += blockDim.x)
            sum += exp((double)__fdiv_rn(val[i], temp) - (double)m);
    dred[threadIdx.x] = sum;
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (threadIdx.x < st) dred[threadIdx.x] += dred[threadIdx.x + st];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[2 * blockIdx.x] = (double)m, out[2 * blockIdx.x + 1] = dred[0];
}

// One round of top-k: block b sorts pairs b * TK_BLOCK .. + TK_BLOCK (values val[i] / temp when temp
// > 0, indices idx[i] or i when idx is null; past n: -inf) by value descending, ties by the lower
// index (the host sampler's order), and writes its first `keep` to out[b * keep ..]. Bitonic sort in
// shared memory. grid ceil(n / TK_BLOCK), block 1024.
#define TK_BLOCK 2048
extern "C" __global__ void __launch_bounds__(1024)
    g4_topk_round(const float* val, const int* idx, long n, float temp, int keep, float* oval, int* oidx) {
    __shared__ float sv[TK_BLOCK];
    __shared__ int si[TK_BLOCK];
    const long base = (long)blockIdx.x * TK_BLOCK;
    for (int j = threadIdx.x; j < TK_BLOCK; j += blockDim.x) {
        const long i = base + j;
        float v      = NEG_INF;
        int id       = 0x7fffffff;
        if (i < n) {
            v  = temp > 0.0f ? __fdiv_rn(val[i], temp) : val[i];
            id = idx ? idx[i] : (int)i;
        }
        sv[j] = v, si[j] = id;
    }
    __syncthreads();
    for (int size = 2; size <= TK_BLOCK; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            const int t = threadIdx.x, i = 2 * t - (t & (stride - 1)), j = i + stride;
            const float a = sv[i], b = sv[j];
            const int ia = si[i], ib = si[j];
            const bool first = a > b || (a == b && ia < ib); // i's pair ranks before j's
            if (first != ((i & size) == 0)) sv[i] = b, sv[j] = a, si[i] = ib, si[j] = ia;
            __syncthreads();
        }
    for (int j = threadIdx.x; j < keep; j += blockDim.x)
        oval[(long)blockIdx.x * keep + j] = sv[j], oidx[(long)blockIdx.x * keep + j] = si[j];
}

// ============================================================================================
// Fused decode kernels, launched from the compiler's CUDA schedule (plan section CUDA_SCHEDULE;
// compiler/cuda_schedule.cpp says which op sequences each one replaces). Decode steps only: one row.
// ============================================================================================

__device__ __forceinline__ float gelu_tanh(float a) {
    return 0.5f * a * (1.0f + tanhf(0.7978845608028654f * (a + 0.044715f * a * a * a)));
}

// ---- GEMV family: up to 3 matrices of one dtype sharing x (q/k/v), or (M = 2) a gate/up pair per
// output. L lanes (8..128; past 32 several warps, reduced through shared memory) share one weight row
// in 16-byte chunks (32 NF4 or 8 bf16 values: one load per lane per row), each lane group owns GV_OUT
// weight rows so its x chunk is reused 4 times. Each lane's first FC chunks of its rows are loaded
// before the wait on the previous kernel; the compiler picks L (compiler/cuda_schedule.h gemv_lanes).
// NF4 rows of K <= GV_XS_MAX read x from a padded copy in shared memory, written once per block after
// the wait: straight from global memory, the 16-byte x loads of a warp's lanes fall 128 bytes apart
// (one chunk each) and cost L1 wavefronts like the code-book lookups do (bench/labs/gemv_bench.cu lab:
// E2B gate/up 17.6 -> 13.7 us, E4B 38.5 -> 27.1 us on an H100).
// Epilogues: 0 y_m[n] = v (+bias); 1 out[n] = gelu(v_gate) * v_up; 2 out[n] = gelu(v) * aux[n];
// 3 y_0[n] = cap * tanh(v / cap). grid ceil(rows / (GV_OUT / M) * L / 128), block 128.
struct GemvMat {
    const void* w;        // bf16 [N, K], or the NF4 codes
    const void* absmax;   // NF4: f32 [blocks] or u8 [blocks] (double quant)
    const float* absmax2; // NF4 double quant, else null
    const float* offset;
    const float* code2;
    const float* bias; // LoRA bias [N] or null
    float* y;          // epilogues 0 and 3: output [N]
    int n;
    int pad;
};
struct GemvArgs {
    GemvMat m[3];
    const float* x;   // [K]
    float* out;       // epilogues 1 and 2: output [N]
    const float* aux; // epilogue 2: [N]
    int nmat, k, epi;
    float cap;
};

#define GV_OUT 4
// NF4 pair table for the GEMV: entry e (a code byte) -> (cb[e >> 4], cb[e & 15]), the two weights it
// holds in element order. 16 copies, copy s in bank pair s: lane l reads copy l % 16, so the 64-bit
// lookups of a half warp never share a bank whatever the bytes are. Byte offset of (e, copy s):
// e * 128 + s * 8, which one shift and one LOP3 make from a code word. 32 KiB.
#define NF4_PAIRS 4096
__device__ __forceinline__ void nf4_pair_table(float2* tab) {
    for (int i = threadIdx.x; i < NF4_PAIRS; i += blockDim.x)
        tab[i] = make_float2(kNf4[i >> 8], kNf4[(i >> 4) & 15]);
}
// Byte b of code word w as a pair-table byte offset, or'ed with the lane's copy offset.
template <int B> __device__ __forceinline__ u32 nf4_pair_off(u32 w, u32 lane_off) {
    return ((B == 0 ? w << 7 : w >> (8 * B - 7)) & 0x7f80u) | lane_off;
}
// The wide pair table (sm_90: 64 KiB of dynamic shared memory, GV_WIDE_BYTES): entry e, copy s at
// e * 256 + s * 8 (bytes 128..255 of each entry's row unused), so one PRMT makes the offset from a code
// word: byte 1 <- byte b of w, byte 0 <- the copy offset (< 128), bytes 2, 3 <- zero bytes of lane_off.
#define GV_WIDE_BYTES 65536
__device__ __forceinline__ void nf4_pair_table_wide(float2* tab) {
    for (int i = threadIdx.x; i < NF4_PAIRS; i += blockDim.x)
        tab[(i >> 4) * 32 + (i & 15)] = make_float2(kNf4[i >> 8], kNf4[(i >> 4) & 15]);
}
// Either pair table (W: the wide one) by a block of B threads (blockDim.x == B), B a multiple of 128: float4
// f = tid + B k holds copies 2 (f & 7) and 2 (f & 7) + 1 of entry e = f >> 3, whose values (cb[e >> 4], cb[e
// & 15]) are cb[(B / 128) k + (tid >> 7)] and cb[(tid >> 3) & 15]. Unrolled: 4096 / (2 B) 16-byte stores a
// thread and a constant load each, independent of one another, against the loops above (32 iterations at
// 128 threads of two dependent indexed constant loads and an 8-byte store: 15 SASS instructions each). The
// tables are built before the programmatic wait, so this is on the critical path whenever the kernel
// waited on finishes first. Other B: the loops above.
template <int B, bool W> __device__ __forceinline__ void nf4_pair_table_b(float2* tab) {
    if constexpr (B % 128 == 0 && B <= 2048) {
        const int t     = threadIdx.x;
        const float lo  = kNf4[(t >> 3) & 15];
        const float* hc = kNf4 + (t >> 7);
        float4* t4      = (float4*)tab;
#pragma unroll
        for (int k = 0; k < NF4_PAIRS / 2 / B; ++k) {
            const int f = t + B * k, e = f >> 3;
            const float hi               = hc[(B / 128) * k];
            t4[W ? e * 16 + (f & 7) : f] = make_float4(hi, lo, hi, lo);
        }
    } else if constexpr (W) {
        nf4_pair_table_wide(tab);
    } else {
        nf4_pair_table(tab);
    }
}
template <int B> __device__ __forceinline__ u32 nf4_pair_off_wide(u32 w, u32 lane_off) {
    return __byte_perm(w, lane_off, 0x5504u | (B << 4));
}
template <bool W, int B> __device__ __forceinline__ u32 nf4_lookup_off(u32 w, u32 lane_off) {
    return W ? nf4_pair_off_wide<B>(w, lane_off) : nf4_pair_off<B>(w, lane_off);
}
// One 16-byte NF4 chunk (code words w[0..3], 32 weights) . x[0..31] through the pair table tb (W: the wide
// one), in two FMA chains (half the dependent latency), unscaled.
template <bool W>
__device__ __forceinline__ float nf4_chunk_dot(const u32* words, const float* xv, const char* tb,
                                               u32 lane_off) {
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int wd = 0; wd < 4; ++wd) {
        const u32 w     = words[wd];
        const float2 p0 = *(const float2*)(tb + nf4_lookup_off<W, 0>(w, lane_off));
        const float2 p1 = *(const float2*)(tb + nf4_lookup_off<W, 1>(w, lane_off));
        const float2 p2 = *(const float2*)(tb + nf4_lookup_off<W, 2>(w, lane_off));
        const float2 p3 = *(const float2*)(tb + nf4_lookup_off<W, 3>(w, lane_off));
        const float* xw = xv + wd * 8;
        s0 = fmaf(p0.x, xw[0], s0), s1 = fmaf(p0.y, xw[1], s1);
        s0 = fmaf(p1.x, xw[2], s0), s1 = fmaf(p1.y, xw[3], s1);
        s0 = fmaf(p2.x, xw[4], s0), s1 = fmaf(p2.y, xw[5], s1);
        s0 = fmaf(p3.x, xw[6], s0), s1 = fmaf(p3.y, xw[7], s1);
    }
    return s0 + s1;
}
// x staged in shared memory (XS): 8 float4 of chunk c at xs[9c..], one float4 of padding per chunk so
// the 16-byte loads of 8 lanes reading 8 consecutive chunks hit distinct banks. K <= GV_XS_MAX. With the
// wide table (W) x lives in its unused half rows: float4 v of chunk c at byte c * 256 + 128 + 16 (v ^ (c &
// 7)), the xor keeping 8 consecutive chunks on distinct banks.
#define GV_XS_MAX 2560
// Chunks 256..GV_XS_EXT_CHUNKS - 1 (K > GV_XS_WIDE_MAX) follow the table: float4 v of chunk c at byte
// GV_WIDE_BYTES + (c - 256) * 128 + 16 (v ^ (c & 7)); the launch passes (min(K / 32, GV_XS_EXT_CHUNKS) - 256)
// * 128 bytes more dynamic shared memory (cuda_rt::gemv_smem; 72 KiB still fits three blocks an SM). Chunks
// past those (E2B's K = 12288) are read from global memory (a multiple of 32 chunks: warp-uniform).
#define GV_XS_WIDE_MAX 8192 // the wide table's 256 unused half rows hold 256 chunks
#define GV_XS_EXT_CHUNKS 320
template <bool W> __device__ __forceinline__ int xs_slot(int c, int v) {
    return W ? (c < 256 ? c * 16 + 8 : c * 8 + 2048) + (v ^ (c & 7)) : c * 9 + v;
}
// G: weight rows per lane group; B: threads a block (the kernels launch 128; bench/labs/gemv_bench.cu's lab
// variants also take other values of both). SM: the NF4 scale format (NF4_SCALES_*); XA: every chunk of x
// is staged (K <= 32 GV_XS_EXT_CHUNKS with the wide table), so the loop has no global-memory path for x; U2:
// the loop over the chunks past the front ones is unrolled by two, its two register sets of codes and scales
// taking turns (no copy of the next chunk's registers an iteration; the body's code twice); FC: the chunks a
// lane loads before the programmatic wait (below); TR: the timeline lab's record (false inside a kernel that
// keeps its own, the fused MLP).
template <bool kIsNf4, int L, int M, int G = GV_OUT, bool XS = false, int B = 128, bool W = false,
          int SM = NF4_SCALES_ANY, bool XA = false, bool U2 = false, int FC = 2, bool TR = true>
__device__ __forceinline__ void gemv_body(const GemvArgs& a, float2* tab, float4* xs = nullptr,
                                          int vblock = -1) {
    G4_TRACE_SCOPE_IF(
        TR, 1u | (kIsNf4 ? 16u : 0u) | (u32)M << 5 | (u32)L << 8 | (u32)a.epi << 16 | (u32)a.nmat << 20,
        a.m[0].w);
    constexpr int R  = G / M;           // outputs per lane group
    constexpr int LW = L < 32 ? L : 32; // lanes of the group in one warp
    constexpr int KS = L / LW;          // warps per group
    const int gl     = threadIdx.x % L;
    // vblock >= 0: this block computes the rows block `vblock` of a launch of the kernel would
    // (g4_lm_exact), by the same arithmetic.
    const int group = ((vblock >= 0 ? vblock : (int)blockIdx.x) * blockDim.x + threadIdx.x) / L;
    const int n_out =
        M == 2 ? a.m[0].n : a.m[0].n + (a.nmat > 1 ? a.m[1].n : 0) + (a.nmat > 2 ? a.m[2].n : 0);
    const int o0 = group * R;
    const int K  = a.k;
    // Per weight row q: matrix index and local row (rows past the end are clamped, never stored).
    int mi[G], ln[G];
#pragma unroll
    for (int q = 0; q < G; ++q) {
        int o = min(o0 + q / M, n_out - 1);
        if (M == 2) {
            mi[q] = q % 2;
            ln[q] = o;
        } else {
            int n0 = a.m[0].n, n1 = a.nmat > 1 ? a.m[1].n : 0;
            mi[q] = o < n0 ? 0 : o < n0 + n1 ? 1 : 2;
            ln[q] = o - (mi[q] == 0 ? 0 : mi[q] == 1 ? n0 : n0 + n1);
        }
    }
    const uint4* wrow[G];
    const void* amp[G];
    const float *am2p[G], *offp[G], *c2p[G];
    int blk0[G]; // NF4: the row's first element / 32 (its half block)
#pragma unroll
    for (int q = 0; q < G; ++q) {
        const GemvMat& m = mi[q] == 0 ? a.m[0] : mi[q] == 1 ? a.m[1] : a.m[2];
        wrow[q] = (const uint4*)((const char*)m.w + (kIsNf4 ? (long)ln[q] * K / 2 : (long)ln[q] * K * 2));
        amp[q] = m.absmax, am2p[q] = m.absmax2, offp[q] = m.offset, c2p[q] = m.code2;
        blk0[q] = (int)((long)ln[q] * K / 32);
    }
    constexpr int PER  = kIsNf4 ? 32 : 8; // values per 16-byte chunk
    const int C        = K / PER;
    const u32 lane_off = (threadIdx.x & 15) * 8;
    // NF4 block scale of chunk c of row q, in two steps (the load is issued with the codes).
    auto raw_scale = [&](int q, int c) { return nf4_raw<SM>(amp[q], am2p[q], (blk0[q] + c) >> 1); };
    auto scale_of  = [&](int q, int c, u32 raw) {
        return nf4_value<SM>(raw, am2p[q], offp[q], c2p[q], (blk0[q] + c) >> 1);
    };
    // acc[q] += row q's chunk c (codes pk[q]) . x[c * PER ...].
    auto accumulate = [&](int c, const uint4* pk, const u32* raw, float* acc) {
        float scale[G];
        if (kIsNf4)
#pragma unroll
            for (int q = 0; q < G; ++q)
                scale[q] = scale_of(q, c, raw[q]);
        float xv[PER];
#pragma unroll
        for (int v = 0; v < PER / 4; ++v) {
            float4 t  = XS && (XA || !W || c < GV_XS_EXT_CHUNKS) ? xs[xs_slot<W>(c, v)]
                                                                 : ((const float4*)(a.x + (long)c * PER))[v];
            xv[4 * v] = t.x, xv[4 * v + 1] = t.y, xv[4 * v + 2] = t.z, xv[4 * v + 3] = t.w;
        }
#pragma unroll
        for (int q = 0; q < G; ++q) {
            u32 words[4] = {pk[q].x, pk[q].y, pk[q].z, pk[q].w};
            if (kIsNf4) {
                acc[q] += nf4_chunk_dot<W>(words, xv, (const char*)tab, lane_off) * scale[q];
            } else {
                float sum = 0.0f;
#pragma unroll
                for (int wd = 0; wd < 4; ++wd)
                    sum += __uint_as_float(words[wd] << 16) * xv[2 * wd] +
                           __uint_as_float(words[wd] & 0xffff0000u) * xv[2 * wd + 1];
                acc[q] += sum;
            }
        }
    };
    // The lane's first FC chunks of every row (codes and scales) are loaded into registers before the
    // wait on the previous kernel: weights never depend on it, so their DRAM latency overlaps its tail
    // (and the pair table's set-up). Two, not three: the kernel waited on runs faster under less DRAM
    // traffic from its dependent's loads (on an H100: E2B +2.3%, E4B +3.4% tok/s against three).
    // The fused MLP loads one: it follows a one-block ResNorm, and its 192-384 blocks' front loads
    // (megabytes) delayed that ResNorm's exit and the MLP's release (on an H200: E2B +0.8% / +0.9%,
    // E4B +0.2% / +0.3% tok/s at depth 16 / 4096 against two).
    // Later chunks (E2B's wide and E4B's gate/up: 4 and 8 a lane on sm_90, E4B's down 3; bf16 rows of more
    // than FC * L chunks) are loaded in the loop below, one chunk ahead of the multiply. bf16 rows' later
    // chunks are also pulled into L2 before the wait; NF4 rows' are not: the post-wait prefetch of the whole
    // rest of the matrix (E4B's gate/up: 24 MB at once) cost more than it saved once the loop loaded a chunk
    // ahead (on an H100: without it E4B +3.0%, E2B +0.3% tok/s).
    uint4 pk0[FC][G];
    u32 raw0[FC][G];
#pragma unroll
    for (int i = 0; i < FC; ++i) {
        const int c = gl + i * L;
        if (c < C)
#pragma unroll
            for (int q = 0; q < G; ++q) {
                pk0[i][q]  = __ldcs(wrow[q] + c);
                raw0[i][q] = kIsNf4 ? raw_scale(q, c) : 0u;
            }
    }
    if (!kIsNf4) // bf16: the chunks past the registers' into L2
        for (int c = gl + FC * L; c < C; c += L)
#pragma unroll
            for (int q = 0; q < G; ++q)
                prefetch_l2(wrow[q] + c);
    if (kIsNf4) {
        nf4_pair_table_b<B, W>(tab);
        __syncthreads();
    }
    // bf16 (the per-layer-input gate): epilogue 2's multiplier, the per-layer input written at the start
    // of the step, many launches before this one (complete once the previous kernel passed its wait), is
    // loaded before the wait too, so the epilogue has no dependent load. (NF4 kernels: registers.)
    float auxv[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
        auxv[r] = !kIsNf4 && a.epi == 2 && gl == 0 && o0 + r < n_out ? __ldcg(a.aux + o0 + r) : 0.0f;
    pdl_begin();
    if (XS) {
        const float4* x4 = (const float4*)a.x;
        const int n4     = W ? min(K / 4, GV_XS_EXT_CHUNKS * 8) : K / 4; // float4s staged
        for (int i0 = threadIdx.x; i0 < n4; i0 += 4 * B) {               // four loads in flight a thread
            float4 t[4];
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (i0 + j * B < n4) t[j] = x4[i0 + j * B];
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (i0 + j * B < n4) xs[xs_slot<W>((i0 + j * B) >> 3, (i0 + j * B) & 7)] = t[j];
        }
        __syncthreads();
    }
    G4_TRACE_MARK(0);
    float acc[G] = {};
#pragma unroll
    for (int i = 0; i < FC; ++i)
        if (gl + i * L < C) accumulate(gl + i * L, pk0[i], raw0[i], acc);
    G4_TRACE_MARK(1);
    if (U2 && gl + FC * L < C) { // the next chunk's codes and scales load while this one's multiply runs
        uint4 pa[G], pb[G];
        u32 ra[G], rb[G];
        auto load = [&](int c, uint4* pk, u32* raw) {
#pragma unroll
            for (int q = 0; q < G; ++q) {
                pk[q]  = __ldcs(wrow[q] + c);
                raw[q] = kIsNf4 ? raw_scale(q, c) : 0u;
            }
        };
        load(gl + FC * L, pa, ra);
        for (int c = gl + FC * L;; c += 2 * L) { // chunk c in pa / ra, c + L in pb / rb
            if (c + L < C) load(c + L, pb, rb);
            accumulate(c, pa, ra, acc);
            if (c + L >= C) break;
            if (c + 2 * L < C) load(c + 2 * L, pa, ra);
            accumulate(c + L, pb, rb, acc);
            if (c + 2 * L >= C) break;
        }
    } else if (gl + FC * L < C) {
        uint4 pk[G];
        u32 raw[G];
#pragma unroll
        for (int q = 0; q < G; ++q) {
            pk[q]  = __ldcs(wrow[q] + gl + FC * L);
            raw[q] = kIsNf4 ? raw_scale(q, gl + FC * L) : 0u;
        }
        for (int c = gl + FC * L; c < C; c += L) {
            uint4 pn[G];
            u32 rn[G];
            const int cn = c + L < C ? c + L : c;
#pragma unroll
            for (int q = 0; q < G; ++q) {
                pn[q] = __ldcs(wrow[q] + cn);
                rn[q] = kIsNf4 ? raw_scale(q, cn) : 0u;
            }
            accumulate(c, pk, raw, acc);
#pragma unroll
            for (int q = 0; q < G; ++q)
                pk[q] = pn[q], raw[q] = rn[q];
        }
    }
#pragma unroll
    for (int q = 0; q < G; ++q)
#pragma unroll
        for (int o = LW / 2; o > 0; o >>= 1)
            acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], o);
    if (KS > 1) {
        __shared__ float red[B / 32][G];
        const int w = threadIdx.x >> 5;
        if ((threadIdx.x & 31) == 0)
#pragma unroll
            for (int q = 0; q < G; ++q)
                red[w][q] = acc[q];
        __syncthreads();
        if (gl == 0)
#pragma unroll
            for (int q = 0; q < G; ++q) {
                float t = 0.0f;
#pragma unroll
                for (int i = 0; i < KS; ++i)
                    t += red[w + i][q];
                acc[q] = t;
            }
    }
    G4_TRACE_MARK(2);
    if (gl != 0) return;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        int o = o0 + r;
        if (o >= n_out) break;
        if (M == 2) {
            float g  = acc[2 * r] + (a.m[0].bias ? a.m[0].bias[o] : 0.0f);
            float u  = acc[2 * r + 1] + (a.m[1].bias ? a.m[1].bias[o] : 0.0f);
            a.out[o] = gelu_tanh(g) * u;
        } else {
            const GemvMat& m = mi[r] == 0 ? a.m[0] : mi[r] == 1 ? a.m[1] : a.m[2];
            float v          = acc[r] + (m.bias ? m.bias[ln[r]] : 0.0f);
            if (a.epi == 0)
                m.y[ln[r]] = v;
            else if (a.epi == 2)
                a.out[o] = gelu_tanh(v) * (kIsNf4 ? a.aux[o] : auxv[r]);
            else
                m.y[ln[r]] = a.cap * tanhf(v / a.cap);
        }
    }
}

// NF4 with K <= GV_XS_MAX stages x in shared memory (the compiler's lane choice assumes it). On sm_90
// the NF4 kernels take the wide pair table in GV_WIDE_BYTES of dynamic shared memory, and the first
// GV_XS_EXT_CHUNKS chunks of x (the launch passes the size for its K: cuda_rt::gemv_smem); elsewhere the 32
// KiB table is static (3-4 blocks an SM of 100 KiB).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GV_WIDE 1
#else
#define GV_WIDE 0
#endif
#define G4_GEMV(NAME, NF4, L, M)                                                                             \
    extern "C" __global__ void __launch_bounds__(128, M == 2 ? 4 : 3) NAME(const GemvArgs a) {               \
        if (NF4 && GV_WIDE) {                                                                                \
            extern __shared__ float4 gv_wide[];                                                              \
            gemv_body<NF4, L, M, GV_OUT, true, 128, true>(a, (float2*)gv_wide, gv_wide);                     \
        } else {                                                                                             \
            __shared__ float4 xs[NF4 ? GV_XS_MAX / 32 * 9 : 1];                                              \
            __shared__ float2 tab[NF4 && !GV_WIDE ? NF4_PAIRS : 1];                                          \
            if (NF4 && a.k <= GV_XS_MAX)                                                                     \
                gemv_body<NF4, L, M, GV_OUT, true>(a, tab, xs);                                              \
            else                                                                                             \
                gemv_body<NF4, L, M>(a, tab);                                                                \
        }                                                                                                    \
    }
G4_GEMV(g4_gemv_nf4_l8_m1, true, 8, 1)
G4_GEMV(g4_gemv_nf4_l16_m1, true, 16, 1)
G4_GEMV(g4_gemv_nf4_l32_m1, true, 32, 1)
G4_GEMV(g4_gemv_nf4_l64_m1, true, 64, 1)
G4_GEMV(g4_gemv_nf4_l128_m1, true, 128, 1)
G4_GEMV(g4_gemv_nf4_l8_m2, true, 8, 2)
G4_GEMV(g4_gemv_nf4_l16_m2, true, 16, 2)
G4_GEMV(g4_gemv_nf4_l32_m2, true, 32, 2)
G4_GEMV(g4_gemv_nf4_l64_m2, true, 64, 2)
G4_GEMV(g4_gemv_nf4_l128_m2, true, 128, 2)
G4_GEMV(g4_gemv_bf16_l8_m1, false, 8, 1)
G4_GEMV(g4_gemv_bf16_l16_m1, false, 16, 1)
G4_GEMV(g4_gemv_bf16_l32_m1, false, 32, 1)
G4_GEMV(g4_gemv_bf16_l64_m1, false, 64, 1)
G4_GEMV(g4_gemv_bf16_l128_m1, false, 128, 1)
G4_GEMV(g4_gemv_bf16_l8_m2, false, 8, 2)
G4_GEMV(g4_gemv_bf16_l16_m2, false, 16, 2)
G4_GEMV(g4_gemv_bf16_l32_m2, false, 32, 2)
G4_GEMV(g4_gemv_bf16_l64_m2, false, 64, 2)
G4_GEMV(g4_gemv_bf16_l128_m2, false, 128, 2)

// A tiled NF4 matrix [H, K] (plan kQuantTiled32) as the fused decode kernels (g4_mlp_nf4's down,
// g4_attn_o_nf4's o) read it: codes [K / 32][H][16 bytes], each 32-column slice contiguous, absmax [K /
// 64][H] (double quant: absmax2 still indexed by the row-major block r * K / 64 + c / 64).
struct Nf4Tiled {
    const u8* codes;
    const void* absmax; // u8 (double quant) or f32
    const float* absmax2;
    const float* offset;
    const float* code2;
    // The raw block scales of rows r0 .. r0 + 3 in 64-column block c64 (SM: the scale format, NF4_SCALES_*).
    template <int SM = NF4_SCALES_ANY>
    __device__ __forceinline__ void raw4(int c64, int H, int r0, u32* raw) const {
        if (SM == NF4_SCALES_DQ || (SM == NF4_SCALES_ANY && absmax2)) {
            const u32 r4 = __ldcs((const u32*)((const u8*)absmax + (long)c64 * H + r0));
#pragma unroll
            for (int k = 0; k < 4; ++k)
                raw[k] = (r4 >> (8 * k)) & 0xffu;
        } else {
            const uint4 r4 = __ldcs((const uint4*)((const float*)absmax + (long)c64 * H + r0));
            raw[0] = r4.x, raw[1] = r4.y, raw[2] = r4.z, raw[3] = r4.w;
        }
    }
    template <int SM = NF4_SCALES_ANY> __device__ __forceinline__ float scale(u32 raw, long b) const {
        return nf4_value<SM>(raw, absmax2, offset, code2, b);
    }
};

// ---- The decode MLP in one kernel (sm_90): gate/up pairs, GeluMul and the down projection. Block j
// computes act[32j, 32j + 32) = gelu(gate . x) * (up . x) with the gate/up GEMV's own body (8 lanes a
// group, 16 groups: 32 outputs) into shared memory, then the down projection's K-slice j for every output
// row r, part[r] = sum_c D[r, 32j + c] act[32j + c], which it adds into y with red.global.add.v4.f32: no
// block waits for another, and the down's weights stream while other blocks still do the gate/up (the
// two-kernel path stages all of act in every down block after a grid-wide wait). y must be zero at the
// wait: the ResNorm before zeroes it (g4_resnorm's zero). The order of the adds varies, so y may differ
// in its last bits from run to run (g4 compile --deterministic keeps the two GEMVs). The down matrix is
// stored tiled (Nf4Tiled). bench/labs/mlp_lab.cu (H100): E2B 15.7 -> 12.8 us, E2B wide 22.0 -> 19.1,
// E4B 28.5 -> 25.5 against the gate/up + down GEMVs in a graph.
// grid I / 32, block 128 (g4_mlp_nf4) or 256 (g4_mlp_nf4_b256: the gate/up at 16 lanes, two blocks an SM;
// bench/labs/mlp_lab.cu: E2B 12.7 -> 11.0 us, but slower at 384 and 320 blocks), dynamic shared memory
// cuda_rt::gemv_smem(true, 90, H). H % 4 == 0, I % 64 == 0. One kernel a scale format (_dq: double quant), so
// the loops carry no predicated-off path for the other (measured: 9-11% a kernel, E2B +3.3%,
// E4B +4.5% decode on an H100). The _rep kernels add into output replicas (MlpArgs::nrep; the plan's ip6).
struct MlpArgs {
    GemvArgs gu;       // gate (m[0]) and up (m[1]), x, k = H, epi 1
    Nf4Tiled dn;       // down, tiled [H, I]
    const float* bias; // down's LoRA bias [H] or null (block 0 adds it)
    float* y;          // [H], zero at the wait
    int H, I;
    // nrep > 0: block j adds into replica j % (nrep + 1) of y: y itself (0) or yr + (j % (nrep + 1) - 1) H
    // (yr [nrep, H], zero at the wait; the ResNorm after sums and re-zeroes them), so nrep + 1 times fewer
    // atomic adds meet at each address (the plan's CudaLaunch ip6 = nrep + 1, chosen by the compiler).
    float* yr;
    int nrep;
    float* zero; // [H] (the _z kernels): block 0 zeroes it at its end (the output of the g4_ple_res launch
                 // after)
    // The _r kernels (g4_mlp_nf4*_h2*_r; the ResNorm before folded in: plan ResNorm record ip1 = 2): every
    // block makes its input xn = rms(x1) * rprew from x1 = rx + rms(rd) * rpw itself (gu.x is unused), block
    // 0 writes x1 to xo.
    const float* rx;   // [H] the residual
    const float* rd;   // [H] the attention's o output
    const void* rpw;   // [H] the norm weight on rd (rpwdt)
    const void* rprew; // [H] the norm weight making xn (rprewdt)
    float* xo;         // [H] x1
    int rpwdt, rprewdt;
    float eps;
};
static_assert(sizeof(MlpArgs) == 376, "cuda_rt::MlpArgsH");
// Z kernels (g4_mlp_nf4_b256*_z): block 0 zeroes a.zero (H % 4 == 0) after its own work, when every block is
// past the wait. Kernels of their own: the zeroing changed the other kernels' register allocation.
template <int B> __device__ __forceinline__ void mlp_zero_next(const MlpArgs& a) {
    if (a.zero && blockIdx.x == 0)
        for (int i = threadIdx.x; i < a.H / 4; i += B)
            ((float4*)a.zero)[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}
#define MLP_S 32
#define RN_MAX 3 // plan::kMlpReplicasMax - 1: most output replicas a reader adds
__device__ __forceinline__ void red_add_v4(float* p, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z),
                 "f"(v.w)
                 : "memory");
#else
    atomicAdd(p, v.x), atomicAdd(p + 1, v.y), atomicAdd(p + 2, v.z), atomicAdd(p + 3, v.w);
#endif
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// B threads a block: 128 (three blocks an SM) or 256 (two), the gate/up at 2 B / 32 lanes a group; SM the
// scale format of all three matrices (NF4_SCALES_F32 or _DQ; the runtime picks the kernel by the plan's). XA
// false: the gate/up loop keeps a global-memory path for x (bench/labs/mlp_mma_lab.cu's copy of the kernels
// from before the per-format split, with SM NF4_SCALES_ANY). REP: adds into the output replicas (a.nrep; the
// _rep kernels); without it the kernel reads neither field.
template <int B, int SM, bool REP, bool XA = true, bool Z = false>
__device__ __forceinline__ void mlp_body(const MlpArgs& a, float4* mlp_wide) {
    __shared__ float s_act[MLP_S];
    G4_TRACE_SCOPE(15u | (B == 256 ? 16u : 0u), a.y); // the whole kernel; mark 0: the gate/up done
    const int j = blockIdx.x, H = a.H, I = a.I;
    GemvArgs g = a.gu;
    g.out      = s_act - j * MLP_S; // gemv_body stores output o at out[o]: this block's 32
    gemv_body<true, 2 * B / MLP_S, 2, GV_OUT, true, B, true, SM, XA, true, 1, false>(g, (float2*)mlp_wide,
                                                                                     mlp_wide);
    // The down slice: rows r0 .. r0 + 3 for r0 = 4 tid + 4 B i. Each iteration's codes and scales are loaded
    // while the one before multiplies (the first before the barrier, while other warps finish the gate/up),
    // in two register sets taking turns.
    const u8* tile = a.dn.codes + (long)j * H * (MLP_S / 2);
    const int c64  = j / 2;
    uint4 pa[4], pb[4];
    u32 ra[4], rb[4];
    auto load = [&](int r0, uint4* pk, u32* raw) {
#pragma unroll
        for (int k = 0; k < 4; ++k)
            pk[k] = __ldcs((const uint4*)(tile + (long)(r0 + k) * (MLP_S / 2)));
        a.dn.raw4<SM>(c64, H, r0, raw);
    };
    if (4 * (int)threadIdx.x < H) load(4 * threadIdx.x, pa, ra);
    __syncthreads();
    G4_TRACE_MARK(0);
    float av[MLP_S];
#pragma unroll
    for (int c = 0; c < MLP_S; ++c)
        av[c] = s_act[c];
    const u32 lane_off = (threadIdx.x & 15) * 8;
    const char* tb     = (const char*)mlp_wide; // the pair table, still in place
    const int rep      = REP && a.nrep > 0 ? j % (a.nrep + 1) : 0;
    float* yt          = REP && rep ? a.yr + (long)(rep - 1) * H : a.y;
    auto down          = [&](int r0, const uint4* pk, const u32* raw) {
        float out[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const u32 words[4] = {pk[k].x, pk[k].y, pk[k].z, pk[k].w};
            float s0           = 0.0f,
                  s1 = 0.0f; // nf4_chunk_dot's body, kept inline: the SASS bench/labs/mlp_lab.cu measured
#pragma unroll
            for (int wd = 0; wd < 4; ++wd) {
                const u32 w     = words[wd];
                const float2 p0 = *(const float2*)(tb + nf4_pair_off_wide<0>(w, lane_off));
                const float2 p1 = *(const float2*)(tb + nf4_pair_off_wide<1>(w, lane_off));
                const float2 p2 = *(const float2*)(tb + nf4_pair_off_wide<2>(w, lane_off));
                const float2 p3 = *(const float2*)(tb + nf4_pair_off_wide<3>(w, lane_off));
                const float* xw = av + wd * 8;
                s0 = fmaf(p0.x, xw[0], s0), s1 = fmaf(p0.y, xw[1], s1);
                s0 = fmaf(p1.x, xw[2], s0), s1 = fmaf(p1.y, xw[3], s1);
                s0 = fmaf(p2.x, xw[4], s0), s1 = fmaf(p2.y, xw[5], s1);
                s0 = fmaf(p3.x, xw[6], s0), s1 = fmaf(p3.y, xw[7], s1);
            }
            const long b = (long)(r0 + k) * (I / 64) + c64; // the row-major block (absmax2's index)
            out[k]       = (s0 + s1) * a.dn.scale<SM>(raw[k], b);
            if (a.bias && j == 0) out[k] += a.bias[r0 + k];
        }
        red_add_v4(yt + r0, make_float4(out[0], out[1], out[2], out[3]));
    };
    for (int r0 = 4 * threadIdx.x; r0 < H; r0 += 8 * B) { // rows r0 (pa / ra) and r0 + 4 B (pb / rb)
        if (r0 + 4 * B < H) load(r0 + 4 * B, pb, rb);
        down(r0, pa, ra);
        if (r0 + 4 * B >= H) break;
        if (r0 + 8 * B < H) load(r0 + 8 * B, pa, ra);
        down(r0 + 4 * B, pb, rb);
    }
    if constexpr (Z) mlp_zero_next<B>(a);
}
#define G4_MLP(NAME, B, SM, REP, Z)                                                                          \
    extern "C" __global__ void __launch_bounds__(B, B == 128 ? 3 : 2) NAME(const MlpArgs a) {                \
        extern __shared__ float4 mlp_wide[];                                                                 \
        mlp_body<B, SM, REP, true, Z>(a, mlp_wide);                                                          \
    }
#else
#define G4_MLP(NAME, B, SM, REP, Z)                                                                          \
    extern "C" __global__ void NAME(const MlpArgs a) {                                                       \
        __trap();                                                                                            \
    } // scheduled on sm_90 plans only
#endif
G4_MLP(g4_mlp_nf4, 128, NF4_SCALES_F32, false, false)
G4_MLP(g4_mlp_nf4_b256, 256, NF4_SCALES_F32, false, false)
G4_MLP(g4_mlp_nf4_dq, 128, NF4_SCALES_DQ, false, false)
G4_MLP(g4_mlp_nf4_b256_dq, 256, NF4_SCALES_DQ, false, false)
G4_MLP(g4_mlp_nf4_rep, 128, NF4_SCALES_F32, true, false)
G4_MLP(g4_mlp_nf4_b256_rep, 256, NF4_SCALES_F32, true, false)
G4_MLP(g4_mlp_nf4_dq_rep, 128, NF4_SCALES_DQ, true, false)
G4_MLP(g4_mlp_nf4_b256_dq_rep, 256, NF4_SCALES_DQ, true, false)
G4_MLP(g4_mlp_nf4_b256_z, 256, NF4_SCALES_F32, false, true)
G4_MLP(g4_mlp_nf4_b256_dq_z, 256, NF4_SCALES_DQ, false, true)

// ---- The decode MLP with packed-f16 products (sm_90, f32 block scales; schedule record Mlp ip7 = 1) ----
// g4_mlp_nf4's work with the multiplies as HFMA2: a code byte is one PRMT, one 32-bit lookup and one HFMA2
// (two weights) against a PRMT, a 64-bit lookup and two FFMAs, and x's shared-memory loads halve. The pair
// table holds f16 pairs (cb[e >> 4] low, cb[e & 15] high: the code book rounded to f16, <= 2.4e-4 of a code
// away) in 32 copies, copy s at e * 256 + 4 s, so a warp's lookups hit 32 banks whatever the bytes are. x is
// staged as f16 scaled by a power of two a 32-element chunk (|x| < 2, so each row-chunk's two chains of 8
// half products stay below 16) in the table rows' unused halves: chunk c's 16-byte piece p at byte
// (c >> 1) * 256 + 128 + (c & 1) * 64 + 16 (p ^ ((c >> 1) & 3)), 8 consecutive chunks on 8 bank groups. A
// row-chunk's chains are summed in f32 and scaled by its block scale times the chunk's power of two; the down
// half scales act by a power of two over the block's 32 values the same way. Relative error of an MLP output
// ~1e-3 (the f32 kernels': ~5e-7), below bf16's rounding (3.9e-3). On an H200 (`g4 bench`): E2B decode
// +5.6% / +4.3% at depth 16 / 4096, E4B +6.6% / +5.9%; the down loop repeats mlp_body's (a shared helper
// changed the f32 kernels' SASS, so it stays apart). grid I / 32, block B (128 or 256), dynamic shared memory
// GV_WIDE_BYTES; H % 32 == 0, H <= 32 GV_XS_EXT_CHUNKS, I % 64 == 0.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ u32 hfma2_u(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
// (lo, hi) rounded to f16 and packed, lo in the low half.
__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
    u32 d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
// 2^floor(log2 m) for m >= 0 (1 for zero or subnormal m), and its reciprocal (exact: a power of two).
__device__ __forceinline__ float pow2_floor(float m) {
    const u32 e = __float_as_uint(m) & 0x7f800000u;
    return e ? __uint_as_float(e) : 1.0f;
}
__device__ __forceinline__ float pow2_recip(float e) {
    return __uint_as_float(0x7f000000u - __float_as_uint(e));
}
// One 16-byte chunk of codes (words, 32 weights) . xh (16 f16 pairs) through the f16 pair table tb: two
// chains of 8 HFMA2, summed in f32.
__device__ __forceinline__ float h2_chunk_dot(const u32* words, const u32* xh, const char* tb, u32 lane_off) {
    u32 s0 = 0u, s1 = 0u;
#pragma unroll
    for (int wd = 0; wd < 4; ++wd) {
        const u32 w = words[wd];
        s0          = hfma2_u(*(const u32*)(tb + nf4_pair_off_wide<0>(w, lane_off)), xh[4 * wd], s0);
        s1          = hfma2_u(*(const u32*)(tb + nf4_pair_off_wide<1>(w, lane_off)), xh[4 * wd + 1], s1);
        s0          = hfma2_u(*(const u32*)(tb + nf4_pair_off_wide<2>(w, lane_off)), xh[4 * wd + 2], s0);
        s1          = hfma2_u(*(const u32*)(tb + nf4_pair_off_wide<3>(w, lane_off)), xh[4 * wd + 3], s1);
    }
    unsigned short a0, a1, b0, b1;
    asm("mov.b32 {%0, %1}, %2;" : "=h"(a0), "=h"(a1) : "r"(s0));
    asm("mov.b32 {%0, %1}, %2;" : "=h"(b0), "=h"(b1) : "r"(s1));
    float f0, f1, f2, f3;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f0) : "h"(a0));
    asm("cvt.f32.f16 %0, %1;" : "=f"(f1) : "h"(a1));
    asm("cvt.f32.f16 %0, %1;" : "=f"(f2) : "h"(b0));
    asm("cvt.f32.f16 %0, %1;" : "=f"(f3) : "h"(b1));
    return (f0 + f1) + (f2 + f3);
}
__device__ __forceinline__ int h2_xpiece(int c, int p) {
    return (c >> 1) * 256 + 128 + (c & 1) * 64 + 16 * (p ^ ((c >> 1) & 3));
}
// The _r kernels' input (MlpArgs r*): per thread its float4s q = tid + B k (k < mlp_rv) of xn. One block
// reduction of four sums gives both norms: with w = rd * rpw, x1 = rx + r1 w and sum x1^2 = sum rx^2 + 2 r1
// sum rx w + r1^2 sum w^2 (g4_resnorm reduces twice, one block for the whole row; here every block pays it
// after the wait).
template <int B> __host__ __device__ constexpr int mlp_rv() {
    return B == 128 ? 5 : 3;
} // H / 4 rounded up to 32 <= B mlp_rv (plan::mlp_res_fits)
template <int B> __device__ __forceinline__ void mlp_res_input(const MlpArgs& a, float4* xr) {
    constexpr int RV = mlp_rv<B>();
    __shared__ float4 s_red4[B / 32];
    const int H = a.H, Q = H / 4, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float4 xv[RV], wv[RV];
    float pw[4 * RV], pr[4 * RV];
    // Every load before any use (one round trip; clamped indices, no branch around a load).
#pragma unroll
    for (int k = 0; k < RV; ++k) {
        const int q = min((int)threadIdx.x + B * k, Q - 1);
        xv[k] = __ldcg((const float4*)a.rx + q), wv[k] = __ldcg((const float4*)a.rd + q);
#pragma unroll
        for (int c = 0; c < 4; ++c)
            pw[4 * k + c]            = loadw(a.rpw, a.rpwdt, 4 * q + c),
                       pr[4 * k + c] = loadw(a.rprew, a.rprewdt, 4 * q + c);
    }
    float sd = 0.0f, sx = 0.0f, sxw = 0.0f, sw = 0.0f;
#pragma unroll
    for (int k = 0; k < RV; ++k) {
        const bool in = (int)threadIdx.x + B * k < Q;
        float* xx     = &xv[k].x;
        float* ww     = &wv[k].x;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            if (!in) xx[c] = 0.0f, ww[c] = 0.0f;
            sd += ww[c] * ww[c];
            ww[c] *= pw[4 * k + c];
            sx += xx[c] * xx[c], sxw += xx[c] * ww[c], sw += ww[c] * ww[c];
        }
    }
    sd = warp_sum(sd), sx = warp_sum(sx), sxw = warp_sum(sxw), sw = warp_sum(sw);
    if (lane == 0) s_red4[w] = make_float4(sd, sx, sxw, sw);
    __syncthreads();
    float4 t = s_red4[0];
#pragma unroll
    for (int i = 1; i < B / 32; ++i) {
        const float4 u = s_red4[i];
        t.x += u.x, t.y += u.y, t.z += u.z, t.w += u.w;
    }
    const float r1 = rsqrtf(t.x / (float)H + a.eps);
    const float r2 = rsqrtf(fmaxf(t.y + 2.0f * r1 * t.z + r1 * r1 * t.w, 0.0f) / (float)H + a.eps);
#pragma unroll
    for (int k = 0; k < RV; ++k) {
        const int q = (int)threadIdx.x + B * k;
        float4 x1   = make_float4(fmaf(r1, wv[k].x, xv[k].x), fmaf(r1, wv[k].y, xv[k].y),
                                  fmaf(r1, wv[k].z, xv[k].z), fmaf(r1, wv[k].w, xv[k].w));
        if (blockIdx.x == 0 && q < Q) ((float4*)a.xo)[q] = x1;
        xr[k] = make_float4(x1.x * r2 * pr[4 * k], x1.y * r2 * pr[4 * k + 1], x1.z * r2 * pr[4 * k + 2],
                            x1.w * r2 * pr[4 * k + 3]);
    }
}
template <int B, bool REP, bool Z = false, bool R = false>
__device__ __forceinline__ void mlp_h2_body(const MlpArgs& a, float4* mlp_wide) {
    __shared__ float s_act[MLP_S];
    __shared__ float s_xe[GV_XS_EXT_CHUNKS]; // chunk c of x: its power of two
    G4_TRACE_SCOPE(15u | (B == 256 ? 16u : 0u), a.y);
    char* sm        = (char*)mlp_wide;
    constexpr int L = 2 * B / MLP_S; // lanes a group; 16 groups of 2 outputs (a gate and an up row each)
    const int j = blockIdx.x, H = a.H, I = a.I, C = H / 32;
    const int gl = threadIdx.x % L, o0 = MLP_S * j + 2 * (threadIdx.x / L);
    // Rows q: gate o0, up o0, gate o0 + 1, up o0 + 1.
    const uint4* wrow[4];
    const float* srow[4];
    long blk0[4]; // the row's first element / 32
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const GemvMat& m = a.gu.m[q & 1];
        const long row   = o0 + (q >> 1);
        wrow[q] = (const uint4*)((const u8*)m.w + row * H / 2), srow[q] = (const float*)m.absmax,
        blk0[q] = row * H / 32;
    }
    uint4 pa[4], pb[4];
    float ra[4], rb[4];
    auto load = [&](int c, uint4* pk, float* r) {
#pragma unroll
        for (int q = 0; q < 4; ++q)
            pk[q] = __ldcs(wrow[q] + c), r[q] = __ldcs(srow[q] + ((blk0[q] + c) >> 1));
    };
    if (gl < C) load(gl, pa, ra); // the front chunk, before the wait
    { // the f16 pair table (as nf4_pair_table_b: warp-uniform constant loads but one)
        const int t        = threadIdx.x;
        const float second = kNf4[(t >> 3) & 15];
        const float* fc    = kNf4 + (t >> 7);
        uint4* t4          = (uint4*)sm;
#pragma unroll
        for (int k = 0; k < NF4_PAIRS / 2 / B; ++k) {
            const int f                 = t + B * k;
            const u32 v                 = pack_h2(fc[(B / 128) * k], second);
            t4[(f >> 3) * 16 + (f & 7)] = make_uint4(v, v, v, v);
        }
    }
    pdl_begin();
    { // x as f16 by chunk: a chunk's 8 float4 are 8 consecutive threads' (every lane of a warp takes part)
        const float4* x4 = (const float4*)a.gu.x;
        const int n4 = H / 4, n4w = (n4 + 31) & ~31;
        // One float4 t of x at index i, staged; a macro for the two loops below (a lambda changed the
        // existing kernels' sm_90 SASS).
#define G4_MLP_H2_STAGE_X                                                                                    \
    float m = fmaxf(fmaxf(fabsf(t.x), fabsf(t.y)), fmaxf(fabsf(t.z), fabsf(t.w)));                           \
    m       = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));                                                  \
    m       = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));                                                  \
    m       = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));                                                  \
    if (i < n4) {                                                                                            \
        const float e = pow2_floor(m), ie = pow2_recip(e);                                                   \
        const int c = i >> 3, v = i & 7;                                                                     \
        *(uint2*)(sm + h2_xpiece(c, v >> 1) + 8 * (v & 1)) =                                                 \
            make_uint2(pack_h2(t.x * ie, t.y * ie), pack_h2(t.z * ie, t.w * ie));                            \
        if (v == 0) s_xe[c] = e;                                                                             \
    }
        if constexpr (R) { // xn made here (the ResNorm before folded in), one float4 a thread and k in
                           // registers
            float4 xr[mlp_rv<B>()];
            mlp_res_input<B>(a, xr);
#pragma unroll
            for (int k = 0; k < mlp_rv<B>(); ++k) {
                const int i = threadIdx.x + B * k;
                if (i >= n4w) break;
                const float4 t = i < n4 ? xr[k] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                G4_MLP_H2_STAGE_X
            }
        } else {
            for (int i = threadIdx.x; i < n4w; i += B) {
                const float4 t = i < n4 ? x4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                G4_MLP_H2_STAGE_X
            }
        }
#undef G4_MLP_H2_STAGE_X
    }
    __syncthreads();
    const u32 lane_off = (threadIdx.x & 31) * 4;
    float acc[4]       = {};
    auto accumulate    = [&](int c, const uint4* pk, const float* r) {
        u32 xh[16];
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            const uint4 t = *(const uint4*)(sm + h2_xpiece(c, p));
            xh[4 * p] = t.x, xh[4 * p + 1] = t.y, xh[4 * p + 2] = t.z, xh[4 * p + 3] = t.w;
        }
        const float e = s_xe[c];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const u32 words[4] = {pk[q].x, pk[q].y, pk[q].z, pk[q].w};
            acc[q] += h2_chunk_dot(words, xh, sm, lane_off) * (r[q] * e);
        }
    };
    if (gl < C)
        for (int c = gl;; c += 2 * L) { // chunk c in pa / ra, c + L in pb / rb
            if (c + L < C) load(c + L, pb, rb);
            accumulate(c, pa, ra);
            if (c + L >= C) break;
            if (c + 2 * L < C) load(c + 2 * L, pa, ra);
            accumulate(c + L, pb, rb);
            if (c + 2 * L >= C) break;
        }
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1)
            acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], o);
    if (gl == 0)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int o          = o0 + r;
            const float g        = acc[2 * r] + (a.gu.m[0].bias ? a.gu.m[0].bias[o] : 0.0f);
            const float u        = acc[2 * r + 1] + (a.gu.m[1].bias ? a.gu.m[1].bias[o] : 0.0f);
            s_act[o - MLP_S * j] = gelu_tanh(g) * u;
        }
    // The down slice, as mlp_body's, with act as f16 pairs scaled by a power of two.
    const u8* tile = a.dn.codes + (long)j * H * (MLP_S / 2);
    const int c64  = j / 2;
    uint4 qa[4], qb[4];
    u32 sa[4], sb[4];
    auto dload = [&](int r0, uint4* pk, u32* raw) {
#pragma unroll
        for (int k = 0; k < 4; ++k)
            pk[k] = __ldcs((const uint4*)(tile + (long)(r0 + k) * (MLP_S / 2)));
        a.dn.raw4<NF4_SCALES_F32>(c64, H, r0, raw);
    };
    if (4 * (int)threadIdx.x < H) dload(4 * threadIdx.x, qa, sa);
    __syncthreads();
    u32 ah[MLP_S / 2];
    float ae;
    {
        float av[MLP_S], m = 0.0f;
#pragma unroll
        for (int c = 0; c < MLP_S; ++c)
            av[c] = s_act[c], m = fmaxf(m, fabsf(av[c]));
        ae             = pow2_floor(m);
        const float ie = pow2_recip(ae);
#pragma unroll
        for (int c = 0; c < MLP_S / 2; ++c)
            ah[c] = pack_h2(av[2 * c] * ie, av[2 * c + 1] * ie);
    }
    const int rep = REP && a.nrep > 0 ? j % (a.nrep + 1) : 0;
    float* yt     = REP && rep ? a.yr + (long)(rep - 1) * H : a.y;
    auto down     = [&](int r0, const uint4* pk, const u32* raw) {
        float out[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const u32 words[4] = {pk[k].x, pk[k].y, pk[k].z, pk[k].w};
            const long b       = (long)(r0 + k) * (I / 64) + c64;
            out[k] = h2_chunk_dot(words, ah, sm, lane_off) * (ae * a.dn.scale<NF4_SCALES_F32>(raw[k], b));
            if (a.bias && j == 0) out[k] += a.bias[r0 + k];
        }
        red_add_v4(yt + r0, make_float4(out[0], out[1], out[2], out[3]));
    };
    for (int r0 = 4 * threadIdx.x; r0 < H; r0 += 8 * B) { // rows r0 (qa / sa) and r0 + 4 B (qb / sb)
        if (r0 + 4 * B < H) dload(r0 + 4 * B, qb, sb);
        down(r0, qa, sa);
        if (r0 + 4 * B >= H) break;
        if (r0 + 8 * B < H) dload(r0 + 8 * B, qa, sa);
        down(r0 + 4 * B, qb, sb);
    }
    if constexpr (Z) mlp_zero_next<B>(a);
}
#define G4_MLP_H2(NAME, B, REP, Z, R)                                                                        \
    extern "C" __global__ void __launch_bounds__(B, B == 128 ? 3 : 2) NAME(const MlpArgs a) {                \
        extern __shared__ float4 mlp_wide[];                                                                 \
        mlp_h2_body<B, REP, Z, R>(a, mlp_wide);                                                              \
    }
#else
#define G4_MLP_H2(NAME, B, REP, Z, R)                                                                        \
    extern "C" __global__ void NAME(const MlpArgs a) {                                                       \
        __trap();                                                                                            \
    } // scheduled on sm_90 plans only
#endif
G4_MLP_H2(g4_mlp_nf4_h2, 128, false, false, false)
G4_MLP_H2(g4_mlp_nf4_b256_h2, 256, false, false, false)
G4_MLP_H2(g4_mlp_nf4_h2_rep, 128, true, false, false)
G4_MLP_H2(g4_mlp_nf4_b256_h2_rep, 256, true, false, false)
G4_MLP_H2(g4_mlp_nf4_b256_h2_z, 256, false, true, false)
// The ResNorm before folded in (MlpArgs r*; plan ResNorm record ip1 = 2): _r.
G4_MLP_H2(g4_mlp_nf4_h2_r, 128, false, false, true)
G4_MLP_H2(g4_mlp_nf4_b256_h2_r, 256, false, false, true)
G4_MLP_H2(g4_mlp_nf4_h2_rep_r, 128, true, false, true)
G4_MLP_H2(g4_mlp_nf4_b256_h2_rep_r, 256, true, false, true)
G4_MLP_H2(g4_mlp_nf4_b256_h2_z_r, 256, false, true, true)

// ---- the decode attention's merge and the o projection in one kernel (sm_90; schedule record AttnO) ----
// Block j takes columns 32j .. 32j + 31 of the attention output (one head's: dim % 32 == 0): it merges them
// from g4_attn_decode's split partials as g4_attention_merge does, multiplies the o weight's K-slice j for
// every output row and adds the products into y with red.global.add.v4.f32, as g4_mlp_nf4's down half does.
// The slice's codes and scales (H x 16 bytes) are loaded before the programmatic wait: they do not depend on
// the attention, which then runs beside them. y must be zero at the wait (the ResNorm before the layer's
// q/k/v projection zeroes it); the adds land in a varying order (g4 compile --deterministic keeps the merge
// kernel and the o GEMV). The o weight is stored tiled (Nf4Tiled). grid K / 32, block AO_B, dynamic shared
// memory GV_WIDE_BYTES (the wide pair table); G = ceil(H / (4 AO_B)) groups of 4 rows a thread
// (g4_attn_o_nf4_g1..4). H % 4 == 0, K % 64 == 0.
struct AttnOArgs {
    const Step* s;
    const float* part; // [heads][splits][dim + 2]: acc[dim], max, sum of each split
    Nf4Tiled o;        // o weight [H, K = heads * dim], tiled
    const float* bias; // o's LoRA bias [H] or null (block 0 adds it)
    float* y;          // [H], zero at the wait
    int H, K, dim, splits, window;
};
#define AO_B 256
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
template <int G> __device__ __forceinline__ void attn_o_body(const AttnOArgs& a, float2* tab) {
    __shared__ float wsplit[1024]; // splits <= 1024
    __shared__ float accs[AO_B / 32][32];
    __shared__ float red[32];
    __shared__ float s_act[32];
    G4_TRACE_SCOPE(13, a.y);
    const int j = blockIdx.x, H = a.H, K = a.K;
    const u8* tile = a.o.codes + (long)j * H * 16;
    const int c64  = j / 2;
    uint4 pk[G][4]; // rows 4 (tid + g AO_B) .. + 3 of the slice
    u32 raw[G][4];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const int r0 = 4 * (threadIdx.x + g * AO_B);
        if (r0 >= H) break;
#pragma unroll
        for (int k = 0; k < 4; ++k)
            pk[g][k] = __ldcs((const uint4*)(tile + (long)(r0 + k) * 16));
        a.o.raw4(c64, H, r0, raw[g]);
    }
    nf4_pair_table_b<AO_B, true>(tab);
    pdl_begin();
    // The merge of this block's 32 columns (g4_attention_merge's arithmetic for a decode row).
    const int dim = a.dim, D2 = dim + 2, pos = a.s->pos0;
    const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0, span = pos - lo + 1;
    const int per = max(AD_MIN, (span + a.splits - 1) / a.splits);
    const int ks  = min(a.splits, (span + per - 1) / per); // splits that may hold keys
    const int h = j * 32 / dim, c0 = j * 32 % dim;
    const float* p = a.part + (long)h * a.splits * D2;
    float L;
    int nact;
    merge_split_weights<AO_B>(p, dim, ks, wsplit, red, &L, &nact);
    constexpr int NG = AO_B / 32;
    const int grp = threadIdx.x >> 5, cl = threadIdx.x & 31;
    float acc = 0.0f;
    int k     = grp;
    for (; k + 3 * NG < nact; k += 4 * NG) { // four loads in flight, added in split order
        const float v0 = p[k * D2 + c0 + cl], v1 = p[(k + NG) * D2 + c0 + cl];
        const float v2 = p[(k + 2 * NG) * D2 + c0 + cl], v3 = p[(k + 3 * NG) * D2 + c0 + cl];
        const float w0 = wsplit[k], w1 = wsplit[k + NG], w2 = wsplit[k + 2 * NG], w3 = wsplit[k + 3 * NG];
        acc += w0 > 0.0f ? w0 * v0 : 0.0f;
        acc += w1 > 0.0f ? w1 * v1 : 0.0f;
        acc += w2 > 0.0f ? w2 * v2 : 0.0f;
        acc += w3 > 0.0f ? w3 * v3 : 0.0f;
    }
    for (; k < nact; k += NG) {
        const float w = wsplit[k];
        if (w > 0.0f) acc += w * p[k * D2 + c0 + cl];
    }
    accs[grp][cl] = acc;
    __syncthreads();
    if (threadIdx.x < 32) {
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < AO_B / 32; ++i)
            sum += accs[i][threadIdx.x];
        s_act[threadIdx.x] = sum / L;
    }
    __syncthreads();
    float av[32];
#pragma unroll
    for (int c = 0; c < 32; ++c)
        av[c] = s_act[c];
    const u32 lane_off = (threadIdx.x & 15) * 8;
    const char* tb     = (const char*)tab;
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const int r0 = 4 * (threadIdx.x + g * AO_B);
        if (r0 >= H) break;
        float out[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const u32 words[4] = {pk[g][k].x, pk[g][k].y, pk[g][k].z, pk[g][k].w};
            const long b       = (long)(r0 + k) * (K / 64) + c64; // the row-major block (absmax2's index)
            out[k]             = nf4_chunk_dot<true>(words, av, tb, lane_off) * a.o.scale(raw[g][k], b);
            if (a.bias && j == 0) out[k] += a.bias[r0 + k];
        }
        red_add_v4(a.y + r0, make_float4(out[0], out[1], out[2], out[3]));
    }
}
#define G4_ATTN_O(G)                                                                                         \
    extern "C" __global__ void __launch_bounds__(AO_B, 2) g4_attn_o_nf4_g##G(const AttnOArgs a) {            \
        extern __shared__ float2 ao_tab[];                                                                   \
        attn_o_body<G>(a, ao_tab);                                                                           \
    }
#else
#define G4_ATTN_O(G)                                                                                         \
    extern "C" __global__ void g4_attn_o_nf4_g##G(const AttnOArgs a) {                                       \
        __trap();                                                                                            \
    } // scheduled on sm_90 plans only
#endif
G4_ATTN_O(1)
G4_ATTN_O(2)
G4_ATTN_O(3)
G4_ATTN_O(4)

// ---- the per-layer-input gate and projection in one kernel (sm_90; schedule record Ple) ----
// Block j takes gate rows 8j .. 8j + 7, one a warp: act = gelu(W_g x + b_g) * aux, then the projection's
// columns 8j .. 8j + 7 for every output row, added into y with red.global.add.v4.f32 (zeroed by the ResNorm
// before, as for g4_mlp_nf4). Both bf16 slices stay row-major (a projection row's 8 columns are one 16-byte
// load) and are loaded before the programmatic wait, with aux (written at the start of the step); only x
// is read after it. grid P / 8, block 256, G = ceil(H / 1024) (g4_ple_bf16_g1..4). H % 8 == 0, P % 8 == 0.
// g4_ple_res_bf16_g1..4 also run the ResNorm before (x = residual + rms(MLP output) * weight) in every block,
// its loads in this kernel's one L2 round trip after the wait: one launch fewer a layer. y is then zeroed by
// the MLP before (MlpArgs zero).
struct PleArgs {
    const float* x;   // [H]
    const u16* wg;    // gate [P, H] bf16
    const float* bg;  // gate bias [P] or null
    const float* aux; // [P]: the layer's per-layer input
    const u16* wp;    // projection [H, P] bf16
    const float* bp;  // projection bias [H] or null (block 0 adds it)
    float* y;         // [H], zero at the wait
    int H, P;
    // g4_ple_res_bf16_g* only (the ResNorm before folded in; plan ResNorm record ip1 = 1): every block makes
    // its input x = rx + rms(rd) * rpw and block 0 writes it to xo (x above is unused).
    const float* rx; // [H] the residual
    const float* rd; // [H] the MLP's output (one output: the fold takes MLPs without replicas)
    const void* rpw; // [H] post-norm weight (rpwdt)
    float* xo;       // [H]
    int rpwdt;
    float eps;
};
static_assert(sizeof(PleArgs) == 104, "cuda_rt::PleArgsH");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// RES: the residual norm before (PleArgs' r* fields) in every block, its result staged in shared memory.
template <int G>
__device__ __forceinline__ void ple_res_prologue(const PleArgs& a, const float* pwv, float* s_x, float* red) {
    const int H = a.H, Q = H / 4;
    const float4* x4 = (const float4*)a.rx;
    const float4* d4 = (const float4*)a.rd;
    float4 xv[G], dv[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const int q = min((int)threadIdx.x + 256 * g, Q - 1);
        xv[g]       = __ldcg(x4 + q);
        dv[g]       = __ldcg(d4 + q);
    }
    float ss = 0.0f;
#pragma unroll
    for (int g = 0; g < G; ++g)
        if ((int)threadIdx.x + 256 * g < Q)
            ss += dv[g].x * dv[g].x + dv[g].y * dv[g].y + dv[g].z * dv[g].z + dv[g].w * dv[g].w;
    const float r1 = rsqrtf(block_sum(ss, red) / (float)H + a.eps);
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const int q = threadIdx.x + 256 * g;
        if (q >= Q) break;
        float* v        = &xv[g].x;
        const float* dd = &dv[g].x;
#pragma unroll
        for (int c = 0; c < 4; ++c)
            v[c] = v[c] + dd[c] * r1 * pwv[4 * g + c];
        ((float4*)s_x)[q] = xv[g];
        if (blockIdx.x == 0) ((float4*)a.xo)[q] = xv[g];
    }
    __syncthreads();
}
template <int G, bool RES> __device__ __forceinline__ void ple_body(const PleArgs& a) {
    constexpr int GC = 4 * G; // gate chunks (8 values) a lane: H / 256 <= 4 G
    __shared__ float s_act[8];
    __shared__ __align__(16) float s_x[RES ? 1024 * G : 4];
    __shared__ float red[32];
    G4_TRACE_SCOPE(14, a.y);
    const int j = blockIdx.x, H = a.H, P = a.P, lane = threadIdx.x & 31, w = threadIdx.x >> 5,
              row     = 8 * j + w;
    const uint4* grow = (const uint4*)(a.wg + (long)row * H);
    uint4 gk[GC];
#pragma unroll
    for (int i = 0; i < GC; ++i)
        if ((lane + 32 * i) * 8 < H) gk[i] = __ldcs(grow + lane + 32 * i);
    uint4 pk[G][4];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const int r0 = 4 * (threadIdx.x + g * 256);
        if (r0 >= H) break;
#pragma unroll
        for (int k = 0; k < 4; ++k)
            pk[g][k] = __ldcs((const uint4*)(a.wp + (long)(r0 + k) * P + 8 * j));
    }
    const float auxv = lane == 0 ? __ldcg(a.aux + row) : 0.0f;
    float pwv[RES ? 4 * G : 1];
    if constexpr (RES)
#pragma unroll
        for (int k = 0; k < 4 * G; ++k) {
            const int i = 4 * (threadIdx.x + 256 * (k / 4)) + k % 4;
            pwv[k]      = i < H ? loadw(a.rpw, a.rpwdt, i) : 0.0f;
        }
    pdl_begin();
    const float* xs = a.x;
    if constexpr (RES) ple_res_prologue<G>(a, pwv, s_x, red), xs = s_x;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < GC; ++i) {
        const int c = (lane + 32 * i) * 8;
        if (c >= H) break;
        const float4 x0 = *(const float4*)(xs + c), x1 = *(const float4*)(xs + c + 4);
        const u32 wv[4]   = {gk[i].x, gk[i].y, gk[i].z, gk[i].w};
        const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            s = fmaf(__uint_as_float(wv[q] << 16), xv[2 * q], s);
            s = fmaf(__uint_as_float(wv[q] & 0xffff0000u), xv[2 * q + 1], s);
        }
    }
    s = warp_sum(s);
    if (lane == 0) s_act[w] = gelu_tanh(s + (a.bg ? a.bg[row] : 0.0f)) * auxv;
    __syncthreads();
    float av[8];
#pragma unroll
    for (int c = 0; c < 8; ++c)
        av[c] = s_act[c];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const int r0 = 4 * (threadIdx.x + g * 256);
        if (r0 >= H) break;
        float out[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const u32 wv[4] = {pk[g][k].x, pk[g][k].y, pk[g][k].z, pk[g][k].w};
            float o         = 0.0f;
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                o = fmaf(__uint_as_float(wv[q] << 16), av[2 * q], o);
                o = fmaf(__uint_as_float(wv[q] & 0xffff0000u), av[2 * q + 1], o);
            }
            out[k] = o + (a.bp && j == 0 ? a.bp[r0 + k] : 0.0f);
        }
        red_add_v4(a.y + r0, make_float4(out[0], out[1], out[2], out[3]));
    }
}
#define G4_PLE(G)                                                                                            \
    extern "C" __global__ void __launch_bounds__(256) g4_ple_bf16_g##G(const PleArgs a) {                    \
        ple_body<G, false>(a);                                                                               \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(256) g4_ple_res_bf16_g##G(const PleArgs a) {                \
        ple_body<G, true>(a);                                                                                \
    }
#else
#define G4_PLE(G)                                                                                            \
    extern "C" __global__ void g4_ple_bf16_g##G(const PleArgs a) {                                           \
        __trap();                                                                                            \
    } /* sm_90 plans only */                                                                                 \
    extern "C" __global__ void g4_ple_res_bf16_g##G(const PleArgs a) {                                       \
        __trap();                                                                                            \
    }
#endif
G4_PLE(1)
G4_PLE(2)
G4_PLE(3)
G4_PLE(4)

// ---- LM-head screening for greedy decode steps (runtime/src/cuda/backend.cpp: the decode graph replayed
// ahead of a greedy token). At engine open the bf16 head W [V, K] gets an int8 copy q (bytes q + 128), per
// row s_r = max|w_r| / 127 and d_r >= ||w_r - s_r q_r||_2 (g4_lm_screen_build). g4_lm_screen bounds every
// logit before its softcap (and after the head's LoRA bias, if any): |w_r . x - s_r (q_r . x)| <= d_r
// ||x||_2, plus both fp32 dot products' rounding (each <= gamma_K sum |w_i x_i| <= gamma_K 128 s_r ||x||_1),
// so lo_r <= logit_r <= hi_r, reading one byte a weight instead of two. g4_lm_exact then runs the head GEMV's
// own code (gemv_body, the same lanes and order: bit-equal logits) on every block of rows holding a row with
// hi_r >= max_j lo_j - margin, and takes the argmax of the rows it computed. The full head's argmax (the
// lowest index among equal maxima) is among them: its logit is >= max lo, and the margin (0.05 + 1e-4|T|,
// every row when |T| > 4 cap) keeps rows left out strictly below it after the softcap, whose slope is
// >= sech^2(4) there. Other logits of the row are not written.

// One warp a row: grid ceil(V / 8), block 256.
extern "C" __global__ void __launch_bounds__(256)
    g4_lm_screen_build(const u16* w, int V, int K, u8* q, float* scale, float* bnd) {
    const int r = (int)((blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (r >= V) return;
    const u16* row = w + (long)r * K;
    float mx       = 0.0f;
    for (int i = lane; i < K; i += 32)
        mx = fmaxf(mx, fabsf(bf16f(row[i])));
    mx            = warp_max(mx);
    const float s = mx / 127.0f;
    double e2     = 0.0;
    for (int i = lane; i < K; i += 32) {
        const float v      = bf16f(row[i]);
        const int qi       = s > 0.0f ? max(-127, min(127, __float2int_rn(v / s))) : 0;
        q[(long)r * K + i] = (u8)(qi + 128);
        const double dl    = (double)v - (double)s * (double)qi;
        e2 += dl * dl;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        e2 += __shfl_xor_sync(0xffffffffu, e2, o);
    if (lane == 0) scale[r] = s, bnd[r] = __double2float_ru(sqrt(e2) * (1.0 + 1e-9));
}

// lohi[r] = (lo_r, hi_r); *tmax = max(*tmax, the largest lo as an order-preserving key: lm_key) (g4_lm_exact
// reads it, and its last block resets it to 0). Warp w of the grid takes rows 4w..4w+3,
// then 4 (w + warps)..., its lanes the 16-byte chunks l, l + 32, ... of them; x staged in shared memory
// (swizzled so 8 lanes reading 8 consecutive chunks hit distinct banks). K % 16 == 0, K <= LM_KMAX.
// grid any (the runtime: 4 a multiprocessor), block 256.
#define LM_KMAX 4096
__device__ __forceinline__ int lm_xslot(int c, int v) {
    return 4 * c + (v ^ ((c >> 1) & 3));
}
__device__ __forceinline__ u32 lm_key(float f) { // unsigned order = float order (NaN aside)
    const u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}
__device__ __forceinline__ float lm_unkey(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? k & 0x7fffffffu : ~k);
}
extern "C" __global__ void __launch_bounds__(256)
    g4_lm_screen(const float* x, const u8* q, const float* scale, const float* bnd, const float* bias, int V,
                 int K, float2* lohi, u32* tmax) {
    __shared__ float4 xs[LM_KMAX / 4];
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, gw = (int)((blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5);
    const int nw = (int)((gridDim.x * (long)blockDim.x) >> 5), C = K / 16;
    for (int c = lane; c < C; c += 32) // the warp's first rows, while the previous kernel finishes
        for (int j = 0; j < 4; ++j)
            prefetch_l2(q + (long)min(4 * gw + j, V - 1) * K + 16 * c);
    pdl_begin();
    float s1 = 0.0f, s2 = 0.0f;
    for (int i = threadIdx.x; i < K / 4; i += blockDim.x) {
        const float4 v              = ((const float4*)x)[i];
        xs[lm_xslot(i >> 2, i & 3)] = v;
        s1 += fabsf(v.x) + fabsf(v.y) + fabsf(v.z) + fabsf(v.w);
        s2 += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    s1 = block_sum(s1, red); // its barriers also publish xs
    s2 = block_sum(s2, red);
    // gamma_K (K u / (1 - K u), u = 2^-24) rounded up; ||x||_1 and ||x||_2 less their own rounding.
    const float gam = (float)(K + 8) * 6.0e-8f, xl1 = s1 * (1.0f + 2.0f * gam),
                xl2 = sqrtf(s2) * (1.0f + 2.0f * gam);
    float best      = NEG_INF;
    for (int r0 = 4 * gw; r0 < V; r0 += 4 * nw) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int c = lane; c < C; c += 32) {
            uint4 w[4];
#pragma unroll
            for (int j = 0; j < 4; ++j)
                w[j] = __ldcs((const uint4*)(q + (long)min(r0 + j, V - 1) * K) + c);
            float xv[16];
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                const float4 t = xs[lm_xslot(c, v)];
                xv[4 * v] = t.x, xv[4 * v + 1] = t.y, xv[4 * v + 2] = t.z, xv[4 * v + 3] = t.w;
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const u32 wd[4] = {w[j].x, w[j].y, w[j].z, w[j].w};
#pragma unroll
                for (int e = 0; e < 16; ++e) { // byte e: 2^23 + 128 + q as a float's bits, less that offset
                    const float f =
                        __uint_as_float(__byte_perm(wd[e >> 2], 0x4B000000u, 0x7650u | (e & 3))) - 8388736.0f;
                    acc[j] = fmaf(f, xv[e], acc[j]);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
            acc[j] = warp_sum(acc[j]);
        const float mine = lane == 0 ? acc[0] : lane == 1 ? acc[1] : lane == 2 ? acc[2] : acc[3];
        const int r      = r0 + lane;
        if (lane < 4 && r < V) {
            // + the LoRA bias, added after the dot product as the head GEMV does (one more rounding).
            const float sr = scale[r], b = bias ? bias[r] : 0.0f, a = sr * mine + b;
            const float B =
                (bnd[r] * xl2 + 2.0f * gam * 128.0f * sr * xl1 + 4.0e-7f * (fabsf(a) + fabsf(b))) * 1.0001f +
                1e-30f;
            lohi[r] = make_float2(a - B, a + B);
            best    = fmaxf(best, a - B);
        }
    }
    best = block_max(best, red);
    if (threadIdx.x == 0 && best > NEG_INF) atomicMax(tmax, lm_key(best));
}

// grid kArgmaxBlocks (runtime/src/cuda/workspace.h), block 128; `a` is the LM head's GEMV launch (lanes
// L, one matrix). Block b scans the head launch's blocks [b per, (b + 1) per) (per <= LM_VB_MAX), computes
// those that hold a candidate row, and the token goes out as g4_argmax's does.
#define LM_VB_MAX 1024
template <int L>
__device__ __forceinline__ void lm_exact(const GemvArgs& a, const float2* lohi, u32* tmax, int* ws,
                                         Step* step, int* ids, volatile int* host_tok, int limit) {
    __shared__ int flag[LM_VB_MAX];
    __shared__ int list[LM_VB_MAX];
    __shared__ int wcount[4];
    __shared__ float bv[128];
    __shared__ int bi[128];
    constexpr int RPV = 128 / L * GV_OUT; // rows a block of the head launch
    const int V = a.m[0].n, nvb = (V + RPV - 1) / RPV, per = (nvb + gridDim.x - 1) / gridDim.x;
    const int vb0 = blockIdx.x * per, vb1 = min(nvb, vb0 + per), r0 = vb0 * RPV, r1 = min(V, vb1 * RPV);
    for (int v = threadIdx.x; v < per; v += blockDim.x)
        flag[v] = 0;
    __syncthreads(); // every flag zeroed before any thread sets one
    pdl_begin();
    const float T = lm_unkey(__ldcg(tmax));
    float thr     = T - (0.05f + 1e-4f * fabsf(T));
    if (!(fabsf(T) <= 3.0e38f) || (a.epi == 3 && fabsf(T) > 4.0f * a.cap)) thr = NEG_INF; // every row
    // Two rows' (lo, hi) a 16-byte load, all of a thread's issued before any is used (r0 is even).
    const float4* lh4 = (const float4*)(lohi + r0);
    const int n2      = (r1 - r0 + 1) / 2;
#pragma unroll 4
    for (int i = threadIdx.x; i < n2; i += blockDim.x) {
        const float4 t = __ldcg(lh4 + i);
        const int r    = r0 + 2 * i;
        // Several threads may flag one block: atomic, so that no write races another.
        if (!(t.y < thr)) atomicOr(&flag[(r - r0) / RPV], 1); // hi >= thr, or NaN
        if (r + 1 < r1 && !(t.w < thr)) atomicOr(&flag[(r + 1 - r0) / RPV], 1);
    }
    __syncthreads();
    // The flagged blocks in order, compacted (a ballot per warp, 128 flags a pass).
    int nl = 0;
    for (int c0 = 0; c0 < per; c0 += 128) {
        const int v  = c0 + threadIdx.x;
        const bool f = v < per && flag[v];
        const u32 m  = __ballot_sync(0xffffffffu, f);
        const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
        if (lane == 0) wcount[w] = __popc(m);
        __syncthreads();
        int off = nl;
        for (int i = 0; i < w; ++i)
            off += wcount[i];
        if (f) list[off + __popc(m & ((1u << lane) - 1u))] = vb0 + v;
        nl += wcount[0] + wcount[1] + wcount[2] + wcount[3];
        __syncthreads();
    }
    for (int i = 0; i < nl; ++i) // the candidates' weights into L2 at once
        for (long o = (long)threadIdx.x * 128; o < (long)RPV * a.k * 2; o += (long)blockDim.x * 128)
            prefetch_l2((const char*)a.m[0].w + (long)list[i] * RPV * a.k * 2 + o);
    for (int i = 0; i < nl; ++i) {
        gemv_body<false, L, 1>(a, nullptr, nullptr, list[i]);
        __syncthreads(); // its reduction buffer is reused by the next call; its outputs read below
    }
    float best = NEG_INF;
    int idx    = 0x7fffffff;
    for (int i = threadIdx.x; i < nl * RPV; i += blockDim.x) {
        const int r = list[i / RPV] * RPV + i % RPV;
        if (r < V) argmax_pick(best, idx, __ldcg(a.m[0].y + r), r);
    }
    if (argmax_finish(bv, bi, best, idx, ws, step, ids, host_tok, limit) && threadIdx.x == 0)
        *tmax = 0u; // for the next step
}
#define G4_LM_EXACT(L)                                                                                       \
    extern "C" __global__ void __launch_bounds__(128)                                                        \
        g4_lm_exact_l##L(const GemvArgs a, const float2* lohi, u32* tmax, int* ws, Step* step, int* ids,     \
                         volatile int* host_tok, int limit) {                                                \
        lm_exact<L>(a, lohi, tmax, ws, step, ids, host_tok, limit);                                          \
    }
G4_LM_EXACT(8)
G4_LM_EXACT(16)
G4_LM_EXACT(32)
G4_LM_EXACT(64)
G4_LM_EXACT(128)

// ---- residual + norms (decode row): x_out = (x + rms(d) * pw) * f * s; xn = rms(x_out) * prew.
// d null: no residual branch (x_out = x * f * s); x_out null: not written; xn null: not computed.
// Same operation order as the unfused RmsNorm / Add / Scale / RmsNorm ops. One block: its cost is
// latency, so every load is issued up front (the weights before the wait on the previous kernel) and
// the two reductions are the only round trips. grid 1, block a multiple of 32 from H / 8 to 1024 (the
// runtime: 512, 1024 for H > 2048), H <= 8 x block. Rows of H % 4 == 0 at 16-byte aligned addresses
// (every plan's hidden size) take the float4 path: one or two 16-byte loads of x and of d a thread after
// the wait, instead of up to eight branch-guarded scalar loads of each (E2B decode +4.7%, E4B +6.9% on
// an H200); the scalar path takes the rest.
// dr (or null): nrep replicas [nrep, H] of d (g4_mlp_nf4's nrep, at most RN_MAX), added to it in replica
// order and zeroed by the thread that read them.
__device__ __forceinline__ void resnorm_scalar(const float* x, const float* d, const void* pw, int pwdt,
                                               const void* sc, int sdt, float f, float* xout,
                                               const void* prew, int prewdt, float* xn, int H, float eps,
                                               float* red, float* dr, int nrep) {
    float xv[8], dv[8], pwv[8], prv[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        int i  = threadIdx.x + j * blockDim.x;
        pwv[j] = d && i < H ? loadw(pw, pwdt, i) : 0.0f;
        prv[j] = xn && prew && i < H ? loadw(prew, prewdt, i) : 1.0f;
    }
    const float sv = sc ? loadw(sc, sdt, 0) : 1.0f;
    pdl_begin();
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        int i = threadIdx.x + j * blockDim.x;
        xv[j] = i < H ? x[i] : 0.0f;
        dv[j] = d && i < H ? d[i] : 0.0f;
        if (d && dr && i < H)
            for (int r = 0; r < nrep; ++r) {
                dv[j] += dr[(long)r * H + i];
                dr[(long)r * H + i] = 0.0f;
            }
        ss += dv[j] * dv[j];
    }
    G4_TRACE_MARK(0);
    const float r1 = d ? powf(block_sum(ss, red) / (float)H + eps, -0.5f) : 0.0f;
    G4_TRACE_MARK(1);
    float ss2 = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < H) {
            float v = xv[j];
            if (d) v = v + dv[j] * r1 * pwv[j];
            if (sc || f != 1.0f) v = v * f * sv;
            xv[j] = v;
            if (xout) xout[i] = v;
            ss2 += v * v;
        }
    }
    G4_TRACE_MARK(2);
    if (!xn) return;
    const float r2 = powf(block_sum(ss2, red) / (float)H + eps, -0.5f);
    G4_TRACE_MARK(3);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < H) xn[i] = xv[j] * r2 * prv[j];
    }
}
// float4 q = threadIdx.x + j * blockDim.x holds elements 4q..4q+3 (RV a thread: H <= 4 * RV * blockDim.x).
// zero (16-byte aligned, or null): the next kernel's output, zeroed float4 by float4 by the thread that owns
// it right after its loads of x and d, which may alias it (each element is read by its owner only): no
// barrier before the zeroing, and no store loop after the norm.
template <int RV>
__device__ __forceinline__ void resnorm_vec4(const float* x, const float* d, const void* pw, int pwdt,
                                             const void* sc, int sdt, float f, float* xout, const void* prew,
                                             int prewdt, float* xn, int H, float eps, float* red, float* zero,
                                             float* dr, int nrep) {
    float4 xv[RV], dv[RV];
    float pwv[RV * 4], prv[RV * 4];
    const int Q = H / 4;
#pragma unroll
    for (int j = 0; j < RV; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int i    = 4 * (threadIdx.x + j * blockDim.x) + c;
            pwv[4 * j + c] = d && i < H ? loadw(pw, pwdt, i) : 0.0f;
            prv[4 * j + c] = xn && prew && i < H ? loadw(prew, prewdt, i) : 1.0f;
        }
    const float sv = sc ? loadw(sc, sdt, 0) : 1.0f;
    pdl_begin();
    // Clamped indices (always valid) and no branch around a load: both loads go out before any use.
    const float4* x4 = (const float4*)x;
    const float4* d4 = (const float4*)(d ? d : x);
#pragma unroll
    for (int j = 0; j < RV; ++j) {
        const int q = min((int)(threadIdx.x + j * blockDim.x), Q - 1);
        xv[j]       = __ldcg(x4 + q);
        dv[j]       = __ldcg(d4 + q);
    }
    if (d && dr) { // d's replicas (g4_mlp_nf4's nrep), added in replica order and zeroed by their reader
        // RV 1 (every plan's launch): all loads out before the first add (one round trip); RV 2: as registers
        // allow.
        constexpr int RB = RV == 1 ? RN_MAX : 1;
        for (int r0 = 0; r0 < nrep; r0 += RB) {
            float4 t[RB][RV];
#pragma unroll
            for (int r = 0; r < RB; ++r)
#pragma unroll
                for (int j = 0; j < RV; ++j)
                    t[r][j] = r0 + r < nrep ? __ldcg((const float4*)dr + (long)(r0 + r) * Q +
                                                     min((int)(threadIdx.x + j * blockDim.x), Q - 1))
                                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int r = 0; r < RB; ++r)
#pragma unroll
                for (int j = 0; j < RV; ++j)
                    if (r0 + r < nrep)
                        dv[j].x += t[r][j].x, dv[j].y += t[r][j].y, dv[j].z += t[r][j].z,
                            dv[j].w += t[r][j].w;
        }
#pragma unroll
        for (int r = 0; r < RN_MAX; ++r)
            if (r < nrep)
#pragma unroll
                for (int j = 0; j < RV; ++j)
                    if (threadIdx.x + j * blockDim.x < Q)
                        ((float4*)dr)[(long)r * Q + threadIdx.x + j * blockDim.x] =
                            make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (zero)
#pragma unroll
        for (int j = 0; j < RV; ++j)
            if (threadIdx.x + j * blockDim.x < Q)
                ((float4*)zero)[threadIdx.x + j * blockDim.x] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < RV; ++j) {
        const bool in = threadIdx.x + j * blockDim.x < Q;
        if (!in) xv[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (!in || !d) dv[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ss += dv[j].x * dv[j].x + dv[j].y * dv[j].y + dv[j].z * dv[j].z + dv[j].w * dv[j].w;
    }
    G4_TRACE_MARK(0);
    const float r1 = d ? rsqrtf(block_sum(ss, red) / (float)H + eps) : 0.0f;
    G4_TRACE_MARK(1);
    float ss2 = 0.0f;
#pragma unroll
    for (int j = 0; j < RV; ++j) {
        const int q = threadIdx.x + j * blockDim.x;
        if (q < Q) {
            float* v        = &xv[j].x;
            const float* dd = &dv[j].x;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                float t = v[c];
                if (d) t = t + dd[c] * r1 * pwv[4 * j + c];
                if (sc || f != 1.0f) t = t * f * sv;
                v[c] = t;
                ss2 += t * t;
            }
            if (xout) ((float4*)xout)[q] = xv[j];
        }
    }
    G4_TRACE_MARK(2);
    if (!xn) return;
    const float r2 = rsqrtf(block_sum(ss2, red) / (float)H + eps);
    G4_TRACE_MARK(3);
#pragma unroll
    for (int j = 0; j < RV; ++j) {
        const int q = threadIdx.x + j * blockDim.x;
        if (q < Q)
            ((float4*)xn)[q] = make_float4(xv[j].x * r2 * prv[4 * j], xv[j].y * r2 * prv[4 * j + 1],
                                           xv[j].z * r2 * prv[4 * j + 2], xv[j].w * r2 * prv[4 * j + 3]);
    }
}
// REP: dr / nrep are read (g4_resnorm_rep, after an MLP with output replicas); g4_resnorm compiles without
// them (their code measured 56 -> 64 registers and a stack frame in the one kernel).
template <bool REP>
__device__ __forceinline__ void resnorm_entry(const float* x, const float* d, const void* pw, int pwdt,
                                              const void* sc, int sdt, float f, float* xout, const void* prew,
                                              int prewdt, float* xn, int H, float eps, float* zero, float* dr,
                                              int nrep) {
    G4_TRACE_SCOPE(2, pw ? pw : prew);
    __shared__ float red[32];
    if (!REP) dr = nullptr, nrep = 0;
    const unsigned long long at = (unsigned long long)x | (unsigned long long)d | (unsigned long long)xout |
                                  (unsigned long long)xn | (unsigned long long)zero | (unsigned long long)dr;
    if ((H & 3) == 0 && (at & 15) == 0 && H <= 4 * (int)blockDim.x)
        return resnorm_vec4<1>(x, d, pw, pwdt, sc, sdt, f, xout, prew, prewdt, xn, H, eps, red, zero, dr,
                               nrep);
    if ((H & 3) == 0 && (at & 15) == 0 && H <= 8 * (int)blockDim.x)
        return resnorm_vec4<2>(x, d, pw, pwdt, sc, sdt, f, xout, prew, prewdt, xn, H, eps, red, zero, dr,
                               nrep);
    resnorm_scalar(x, d, pw, pwdt, sc, sdt, f, xout, prew, prewdt, xn, H, eps, red, dr, nrep);
    if (zero) { // the next kernel's output (g4_mlp_nf4 adds into it), after every read above (it may alias d)
        __syncthreads();
        for (int i = threadIdx.x; i < H; i += blockDim.x)
            zero[i] = 0.0f;
    }
}
extern "C" __global__ void __launch_bounds__(1024)
    g4_resnorm(const float* x, const float* d, const void* pw, int pwdt, const void* sc, int sdt, float f,
               float* xout, const void* prew, int prewdt, float* xn, int H, float eps, float* zero) {
    resnorm_entry<false>(x, d, pw, pwdt, sc, sdt, f, xout, prew, prewdt, xn, H, eps, zero, nullptr, 0);
}
extern "C" __global__ void __launch_bounds__(1024)
    g4_resnorm_rep(const float* x, const float* d, const void* pw, int pwdt, const void* sc, int sdt, float f,
                   float* xout, const void* prew, int prewdt, float* xn, int H, float eps, float* zero,
                   float* dr, int nrep) {
    resnorm_entry<true>(x, d, pw, pwdt, sc, sdt, f, xout, prew, prewdt, xn, H, eps, zero, dr, nrep);
}
// g4_resnorm with a second buffer zeroed at its end: zero2 [H], the output of a fused MLP that runs its own
// ResNorm (the _r kernels; plan ResNorm record ip2 = zero2's tensor + 1). zero2 shares no bytes with what
// this kernel reads or writes, nor with what the launches between it and that MLP touch (the compiler
// checks).
extern "C" __global__ void __launch_bounds__(1024)
    g4_resnorm_z2(const float* x, const float* d, const void* pw, int pwdt, const void* sc, int sdt, float f,
                  float* xout, const void* prew, int prewdt, float* xn, int H, float eps, float* zero,
                  float* zero2) {
    resnorm_entry<false>(x, d, pw, pwdt, sc, sdt, f, xout, prew, prewdt, xn, H, eps, zero, nullptr, 0);
    if ((H & 3) == 0 && ((unsigned long long)zero2 & 15) == 0)
        for (int i = threadIdx.x; i < H / 4; i += blockDim.x)
            ((float4*)zero2)[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    else
        for (int i = threadIdx.x; i < H; i += blockDim.x)
            zero2[i] = 0.0f;
}

// ---- q/k/v after the projections (decode row): q head: rms * q_norm, RoPE, in place; k head: rms *
// k_norm, RoPE, into its cache slot; v head: rms (no weight) into its cache slot (caches of dtype
// kvdt). grid (heads [+ 2 * kv_heads]), block max(32, dim / 2): thread i owns the rotate-half pair
// (i, i + dim / 2).
extern "C" __global__ void g4_qkv_post(const Step* s, float* q, const void* qw, const float* k,
                                       const void* kw, const float* v, int wdt, const float* inv_freq,
                                       void* kc, void* vc, int heads, int kvh, int dim, int slots, float eps,
                                       int kvdt) {
    G4_TRACE_SCOPE(5, qw);
    pdl_begin();
    __shared__ float red[32];
    int b = blockIdx.x, half = dim >> 1, i = threadIdx.x;
    int kind         = b < heads ? 0 : b < heads + kvh ? 1 : 2;
    int h            = kind == 0 ? b : kind == 1 ? b - heads : b - heads - kvh;
    const float* src = kind == 0 ? q + (long)h * dim : kind == 1 ? k + (long)h * dim : v + (long)h * dim;
    const void* w    = kind == 0 ? qw : kind == 1 ? kw : nullptr;
    bool on          = i < half;
    float x0 = on ? src[i] : 0.0f, x1 = on ? src[i + half] : 0.0f;
    float r = powf(block_sum(x0 * x0 + x1 * x1, red) / (float)dim + eps, -0.5f);
    if (!on) return;
    float y0 = x0 * r * (w ? loadw(w, wdt, i) : 1.0f), y1 = x1 * r * (w ? loadw(w, wdt, i + half) : 1.0f);
    if (kind < 2) {
        float ang = (float)s->pos0 * inv_freq[i];
        float cs, sn;
        sincosf(ang, &sn, &cs);
        float o0 = y0 * cs - y1 * sn, o1 = y1 * cs + y0 * sn;
        y0 = o0, y1 = o1;
    }
    if (kind == 0) {
        q[(long)h * dim + i] = y0, q[(long)h * dim + i + half] = y1;
    } else {
        void* cache = kind == 1 ? kc : vc;
        long slot   = (long)(s->pos0 % slots) * kvh * dim + (long)h * dim;
        kv_put(cache, kvdt, slot + i, y0);
        kv_put(cache, kvdt, slot + i + half, y1);
    }
}

// ---- decode attention over the KV ring, split across the key span; one block per (kv head, split)
// computes all heads of the group so each key and value row is read once. Writes the unnormalized
// partials (acc[dim], max, sum) that g4_attention_merge combines. Keys per split: max(AD_MIN, ceil(span
// / splits)) <= AD_KEYS (the compiler sizes splits). grid (kv_heads, splits), block 256; heads per
// group <= 16, dim <= 512, heads per group * dim <= 4096; a bf16 cache (kvdt) also dim % 8 == 0.
// fp32 cache: lane / thread c reads element c (+ 32 or 256 steps); bf16 cache: a lane reads 8 keys'
// elements as one 16-byte load, a thread two adjacent values as one 32-bit load.
#define AD_KEYS 256
// One step of the decode scores' 16-head warp sums: a lane keeps N of 2N heads' partials (the upper half
// where lane bit O is set) and adds its partner's partials of those.
template <int O, int N> __device__ __forceinline__ void head_sum_step(float* v, int lane) {
    const bool up = lane & O;
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const float send = up ? v[i] : v[i + N], keep = up ? v[i + N] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
}
// The warp sums of HS heads' partials (HS a power of two <= 16): log2(HS) halving steps from lane bit
// 16 down, then plain sums over the lane bits left. Lane l ends with head sum_k bit(4 - k) of l * HS /
// 2^(k+1), in v[0].
template <int HS, int O = 16> __device__ __forceinline__ void head_sums(float* v, int lane) {
    if constexpr (HS > 1) {
        head_sum_step<O, HS / 2>(v, lane);
        head_sums<HS / 2, O / 2>(v, lane);
    } else {
#pragma unroll
        for (int o = O; o >= 1; o >>= 1)
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
    }
}
template <int HS> __device__ __forceinline__ int head_of_lane(int lane) {
    int h = 0;
#pragma unroll
    for (int k = 0, w = HS / 2; w >= 1; ++k, w >>= 1)
        h += ((lane >> (4 - k)) & 1) * w;
    return h;
}
// Heads per KV group in the decode attention kernels. A plan whose decode attention layers all have one
// group size compiles its kernels with -DG4_AD_HPG=<it> (compiler/cuda_compile.cpp), so the head loops are
// unrolled to exactly that count with no runtime predicates; otherwise up to 16 heads, predicated on the
// runtime count. The runtime checks that a plan's layers match (backend.cpp decode_attention_fits).
#ifdef G4_AD_HPG
#define AD_HS G4_AD_HPG
#define AD_FIXED 1
#else
#define AD_HS 16
#define AD_FIXED 0
#endif
// QkvAttn (the compiler's CUDA schedule): g4_qkv_post's work done by the decode attention kernel itself.
// Every block norms and rotates its group's q heads from the raw projection into shared memory (q is not
// written back); the block holding the newest key (index span - 1) also norms and rotates k, norms v and
// stores both into the cache slot of pos before it reads the split's keys. Same arithmetic as g4_qkv_post.
struct AttnPost {
    const float* k;        // raw k [kvh * dim], or null (a KV-shared layer: only q)
    const float* v;        // raw v [kvh * dim]
    const void* qw;        // q_norm weight [dim] (dtype wdt)
    const void* kw;        // k_norm weight [dim]
    const float* inv_freq; // RoPE [dim / 2]
    int wdt;
    float eps;
};
// P.V of one split of attn_decode_body and its partials: NC columns a thread (1: dim <= 256, 2: dim <= 512),
// HS head slots of which hpg are real. sc: the split's probabilities [HS][AD_KEYS], zero-padded to a
// multiple of 8 keys; jn: the key whose value row is in pst + 2048 (QkvAttn), or -1.
template <bool kBf16, bool kPost, int HS, int NC>
__device__ __forceinline__ void
attn_pv(const void* vc, const float* pst, float (*sc)[AD_KEYS], const float* mh, const float* lh, float* part,
        int g, int hpg, int dim, int width, int splits, int j0, int j1, int jn, int lo_slot, int slots) {
    constexpr int ES     = kBf16 ? 2 : 4;
    constexpr bool pairs = kBf16 && NC == 2;
    auto col = [&](int i) { return pairs ? 2 * (int)threadIdx.x + i : (int)threadIdx.x + 256 * i; };
    float acc[NC][HS];
#pragma unroll
    for (int i = 0; i < NC; ++i)
#pragma unroll
        for (int h = 0; h < HS; ++h)
            acc[i][h] = 0.0f;
    // Eight keys' values are loaded before they are used (up to 16 loads in flight a thread); keys past
    // j1 read the last key's row and have probability 0.
    for (int jb = j0; jb < j1; jb += 8) {
        float v[8][NC];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int jv     = min(jb + u, j1 - 1);
            const int rs     = lo_slot + jv >= slots ? lo_slot + jv - slots : lo_slot + jv;
            const char* vrow = kPost && jv == jn ? (const char*)(pst + 2048)
                                                 : (const char*)vc + ((long)rs * width + (long)g * dim) * ES;
            if (pairs) {
                const u32 w = col(0) < dim ? *(const u32*)((const u16*)vrow + col(0)) : 0u;
                v[u][0] = __uint_as_float(w << 16), v[u][1] = __uint_as_float(w & 0xffff0000u);
            } else {
#pragma unroll
                for (int i = 0; i < NC; ++i)
                    v[u][i] = col(i) >= dim ? 0.0f
                              : kBf16       ? bf16f(((const u16*)vrow)[col(i)])
                                            : ((const float*)vrow)[col(i)];
            }
        }
#pragma unroll
        for (int h = 0; h < HS; ++h) {
            if (h >= hpg) break;
            const float4 p0 = *(const float4*)&sc[h][jb - j0], p1 = *(const float4*)&sc[h][jb - j0 + 4];
            const float p[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
            for (int u = 0; u < 8; ++u)
#pragma unroll
                for (int i = 0; i < NC; ++i)
                    acc[i][h] += p[u] * v[u][i];
        }
    }
    G4_TRACE_MARK(3);
#pragma unroll
    for (int h = 0; h < HS; ++h) {
        if (h >= hpg) break;
        float* out = part + ((long)(g * hpg + h) * splits + blockIdx.y) * (dim + 2);
#pragma unroll
        for (int i = 0; i < NC; ++i)
            if (col(i) < dim) out[col(i)] = acc[i][h];
        if (threadIdx.x == 0) out[dim] = mh[h], out[dim + 1] = lh[h];
    }
}
// DIMC: the head dim as a compile-time constant (the _d256 / _d512 kernels), or 0 (dim_ at run time).
template <bool kBf16, bool kPost = false, int DIMC = 0>
__device__ __forceinline__ void
attn_decode_body(const Step* s, const float* q, const void* kc, const void* vc, int heads, int kvh, int dim_,
                 int slots, int window, float scale, int splits, float* part, float* qs, float (*sc)[AD_KEYS],
                 float* mh, float* lh, const AttnPost& pa = AttnPost{}, float* pst = nullptr) {
    G4_TRACE_SCOPE(3u | (kPost ? 16u : 0u) | (kBf16 ? 32u : 0u) | (u32)(window > 0) << 6, kc);
    const int dim    = DIMC ? DIMC : dim_;
    constexpr int HS = AD_HS; // head slots a group
    const int g = blockIdx.x, hpg = AD_FIXED ? AD_HS : heads / kvh, width = kvh * dim;
    const int pos  = s->pos0;
    const int lo   = window > 0 ? max(0, pos - window + 1) : 0;
    const int span = pos - lo + 1;
    const int per  = max(AD_MIN, (span + splits - 1) / splits);
    const int j0 = blockIdx.y * per, j1 = min(span, j0 + per);
    // No keys in this split (blockIdx.y >= ceil(span / per)): nothing to do, and nothing to write either,
    // since both merges (g4_attention_merge with window >= 0, g4_attn_o_nf4) read only the splits that may
    // hold keys. Leaving before the wait frees the block's slot at once (a full layer's 1024 splits at a
    // short depth).
    if (j0 >= j1) return;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    constexpr int ES = kBf16 ? 2 : 4; // bytes per cache element
    // Ring slot of key j (0 <= j < span <= slots): one division here instead of one a key (a runtime
    // modulo is a chain of ~15 dependent instructions).
    const int lo_slot = lo % slots;
    auto ring         = [&](int j) { return lo_slot + j >= slots ? lo_slot + j - slots : lo_slot + j; };
    { // the split's K/V rows into L2 while the previous kernel drains (rows before pos are not written this
      // step)
        const int lines = dim * ES / 128; // 128-byte lines per row
        for (int e = threadIdx.x; e < (j1 - j0) * lines * 2; e += blockDim.x) {
            int j = j0 + e / (lines * 2), l = e % (lines * 2);
            prefetch_l2((const char*)(l < lines ? kc : vc) + ((long)ring(j) * width + (long)g * dim) * ES +
                        (l % lines) * 128);
        }
    }
    // QkvAttn: the norm weights and RoPE's cos/sin into shared memory before the wait (they do not depend
    // on the previous kernel). pst: q weight [512], k weight [512], cos [256], sin [256], then the newest
    // k and v rows in the cache's dtype [2][512 floats].
    const int jn =
        kPost && pa.k && j0 <= span - 1 && span - 1 < j1 ? span - 1 : -1; // this block stores the newest key
    if (kPost && j0 < j1) {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) {
            pst[i] = loadw(pa.qw, pa.wdt, i);
            if (jn >= 0) pst[512 + i] = loadw(pa.kw, pa.wdt, i);
        }
        for (int i = threadIdx.x; i < dim / 2; i += blockDim.x)
            sincosf((float)pos * pa.inv_freq[i], &pst[1280 + i], &pst[1024 + i]);
        __syncthreads();
    }
    pdl_begin();
    if (!kPost) {
        for (int e = threadIdx.x; e < hpg * dim; e += blockDim.x)
            qs[e] = q[(long)g * hpg * dim + e];
    } else { // one warp a row (the group's q heads, then k and v), its rows' loads issued together;
             // lane: pairs (i, i + dim / 2), i = lane + 32 m
        const int half   = dim >> 1;
        const int rows   = hpg + (jn >= 0 ? 2 : 0);
        const long slot  = (long)(pos % slots) * width + (long)g * dim;
        constexpr int RW = 3; // rows a warp at most: (16 heads + k + v) / 8 warps
        float x0[RW][8], x1[RW][8];
#pragma unroll
        for (int t = 0; t < RW; ++t) {
            const int r      = wid + t * nw;
            const float* src = r >= rows ? nullptr
                               : r < hpg ? q + (long)(g * hpg + r) * dim
                                         : (r == hpg ? pa.k : pa.v) + (long)g * dim;
#pragma unroll
            for (int m = 0; m < 8; ++m) {
                const int i = lane + 32 * m;
                x0[t][m] = src && i < half ? src[i] : 0.0f, x1[t][m] = src && i < half ? src[i + half] : 0.0f;
            }
        }
#pragma unroll
        for (int t = 0; t < RW; ++t) {
            const int r = wid + t * nw;
            if (r >= rows) break;
            const int kind = r < hpg ? 0 : r - hpg + 1; // 0 q, 1 k, 2 v
            const float* w = kind == 0 ? pst : pst + 512;
            float ss       = 0.0f;
#pragma unroll
            for (int m = 0; m < 8; ++m)
                ss += x0[t][m] * x0[t][m] + x1[t][m] * x1[t][m];
            const float rr = powf(warp_sum(ss) / (float)dim + pa.eps, -0.5f);
            void* nrow     = pst + 1536 + (kind - 1) * 512; // kind 1, 2: the newest k / v row, cache dtype
#pragma unroll
            for (int m = 0; m < 8; ++m) {
                const int i = lane + 32 * m;
                if (i >= half) break;
                float y0 = x0[t][m] * rr * (kind < 2 ? w[i] : 1.0f),
                      y1 = x1[t][m] * rr * (kind < 2 ? w[i + half] : 1.0f);
                if (kind < 2) {
                    const float cs = pst[1024 + i], sn = pst[1280 + i];
                    const float o0 = y0 * cs - y1 * sn, o1 = y1 * cs + y0 * sn;
                    y0 = o0, y1 = o1;
                }
                if (kind == 0) {
                    qs[r * dim + i] = y0, qs[r * dim + i + half] = y1;
                } else {
                    void* cache = (void*)(kind == 1 ? kc : vc);
                    kv_put(cache, kBf16 ? G4_DT_BF16 : G4_DT_F32, slot + i, y0);
                    kv_put(cache, kBf16 ? G4_DT_BF16 : G4_DT_F32, slot + i + half, y1);
                    kv_put(nrow, kBf16 ? G4_DT_BF16 : G4_DT_F32, i, y0);
                    kv_put(nrow, kBf16 ? G4_DT_BF16 : G4_DT_F32, i + half, y1);
                }
            }
        }
    }
    __syncthreads();
    G4_TRACE_MARK(0);
    // Scores: one warp per key, all heads of the group; the heads' warp reductions interleave.
    for (int j = j0 + wid; j < j1; j += nw) {
        const long kr = (long)ring(j) * width + (long)g * dim;
        // QkvAttn: the newest key from shared memory (this block stored it; a global read-back is an L2 trip)
        const char* krow = kPost && j == jn ? (const char*)(pst + 1536) : (const char*)kc + kr * ES;
        float v[HS];
        if (kBf16) { // lane: elements 8 * lane + 256 * c .. + 7
            uint4 kw[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int e = 8 * lane + 256 * c;
                kw[c]       = e < dim ? *(const uint4*)((const u16*)krow + e) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int h = 0; h < HS; ++h) {
                v[h] = 0.0f;
                if (h < hpg)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int e = 8 * lane + 256 * c;
                        if (e < dim) {
                            const float4 q0   = *(const float4*)&qs[h * dim + e],
                                         q1   = *(const float4*)&qs[h * dim + e + 4];
                            const u32 w[4]    = {kw[c].x, kw[c].y, kw[c].z, kw[c].w};
                            const float qv[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
                            for (int i = 0; i < 4; ++i) {
                                v[h] += qv[2 * i] * __uint_as_float(w[i] << 16);
                                v[h] += qv[2 * i + 1] * __uint_as_float(w[i] & 0xffff0000u);
                            }
                        }
                    }
            }
        } else {
            const float* kf = (const float*)krow;
            float kv[16];
#pragma unroll
            for (int c = 0; c < 16; ++c)
                kv[c] = lane + 32 * c < dim ? kf[lane + 32 * c] : 0.0f;
#pragma unroll
            for (int h = 0; h < HS; ++h) {
                v[h] = 0.0f;
                if (h < hpg)
#pragma unroll
                    for (int c = 0; c < 16; ++c)
                        if (lane + 32 * c < dim) v[h] += qs[h * dim + lane + 32 * c] * kv[c];
            }
        }
        // HS warp sums in HS - 1 + 5 - log2(HS) shuffles: each step halves the heads a lane keeps,
        // adding the partner's partials of those heads (constant indices throughout: left to the
        // unroller, v went to local memory); lanes (32 / HS of them) end with each head's sum.
        head_sums<HS>(v, lane);
        const int hl = head_of_lane<HS>(lane);
        if (!(lane & (32 / HS - 1)) && hl < hpg) sc[hl][j - j0] = v[0] * scale;
    }
    __syncthreads();
    G4_TRACE_MARK(1);
    // Softmax numerators per head: one warp per head; the row is zero-padded to a multiple of 8 keys for
    // P.V's vector loads.
    const int nk = j1 - j0, nk8 = (nk + 7) & ~7; // nk8 <= AD_KEYS
    for (int h = wid; h < hpg; h += nw) {
        float m = NEG_INF;
        for (int j = lane; j < nk; j += 32)
            m = fmaxf(m, sc[h][j]);
        m       = warp_max(m);
        float l = 0.0f;
        for (int j = lane; j < nk8; j += 32) {
            const float p = j < nk ? __expf(sc[h][j] - m) : 0.0f;
            sc[h][j]      = p;
            l += p;
        }
        l = warp_sum(l);
        if (lane == 0) mh[h] = m, lh[h] = l;
    }
    __syncthreads();
    G4_TRACE_MARK(2);
    // P.V: thread owns columns c = tid (+ 256 when dim > 256) for every head of the group; with a bf16
    // cache and dim > 256 the adjacent pair 2 tid, 2 tid + 1 (one 32-bit load). At dim <= 256 the pair
    // mapping would leave half the threads idle and double the others' sequential work. The column count
    // is a block-uniform branch, so each path multiplies only real columns.
    if (dim > 256)
        attn_pv<kBf16, kPost, HS, 2>(vc, pst, sc, mh, lh, part, g, hpg, dim, width, splits, j0, j1, jn,
                                     lo_slot, slots);
    else
        attn_pv<kBf16, kPost, HS, 1>(vc, pst, sc, mh, lh, part, g, hpg, dim, width, splits, j0, j1, jn,
                                     lo_slot, slots);
}
// One kernel per cache dtype (kvdt must match the name): on sm_90 the fp32 body needs 96 registers, the
// bf16 one 80, and a kernel holding both runs at the larger count (2 blocks per SM instead of 3).
#define G4_ATTN_DECODE(NAME, BF16, DIMC)                                                                     \
    extern "C" __global__ void __launch_bounds__(256)                                                        \
        NAME(const Step* s, const float* q, const void* kc, const void* vc, int heads, int kvh, int dim,     \
             int slots, int window, float scale, int splits, float* part, int kvdt) {                        \
        __shared__ __align__(16) float qs[4096];                                                             \
        __shared__ __align__(16) float sc[16][AD_KEYS];                                                      \
        __shared__ float mh[16], lh[16];                                                                     \
        attn_decode_body<BF16, false, DIMC>(s, q, kc, vc, heads, kvh, dim, slots, window, scale, splits,     \
                                            part, qs, sc, mh, lh);                                           \
    }
G4_ATTN_DECODE(g4_attn_decode, false, 0)
G4_ATTN_DECODE(g4_attn_decode_bf16, true, 0)
// The same with the q/k/v post-projection folded in (q: the raw projection; AttnPost above). 3 blocks an
// SM on sm_90 (80 registers, no spills); elsewhere 43 KiB of shared memory allows 2 of 100 KiB anyway.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define AD_POST_BLOCKS 3
#else
#define AD_POST_BLOCKS 2
#endif
#define G4_ATTN_DECODE_POST(NAME, BF16, DIMC)                                                                \
    extern "C" __global__ void __launch_bounds__(256, AD_POST_BLOCKS)                                        \
        NAME(const Step* s, const float* q, const void* kc, const void* vc, int heads, int kvh, int dim,     \
             int slots, int window, float scale, int splits, float* part, int kvdt, const AttnPost pa) {     \
        __shared__ __align__(16) float qs[4096];                                                             \
        __shared__ __align__(16) float sc[16][AD_KEYS];                                                      \
        __shared__ float mh[16], lh[16];                                                                     \
        __shared__ __align__(16) float pst[2560];                                                            \
        attn_decode_body<BF16, true, DIMC>(s, q, kc, vc, heads, kvh, dim, slots, window, scale, splits,      \
                                           part, qs, sc, mh, lh, pa, pst);                                   \
    }
G4_ATTN_DECODE_POST(g4_attn_decode_post, false, 0)
G4_ATTN_DECODE_POST(g4_attn_decode_post_bf16, true, 0)
// With the group size fixed (G4_AD_HPG), the same four kernels also for Gemma 4's two head dims as constants
// (_d256: sliding layers, _d512: full ones): the post-projection's and the scores' element loops then hold
// only the real elements (no predicated-off loads) and P.V one column layout. The runtime takes them for
// layers of that dim when the plan has them (older plans and the generic module do not). Only for groups of 8
// (E2B): at E4B's group of 4 they were faster at depth 16 but 0.3-1.0% slower a token at depth 4096 on an
// H200
// (`g4 bench -d 16,4096`), so its plans keep the kernels above.
#if defined(G4_AD_HPG) && G4_AD_HPG >= 8
G4_ATTN_DECODE(g4_attn_decode_d256, false, 256)
G4_ATTN_DECODE(g4_attn_decode_bf16_d256, true, 256)
G4_ATTN_DECODE(g4_attn_decode_d512, false, 512)
G4_ATTN_DECODE(g4_attn_decode_bf16_d512, true, 512)
G4_ATTN_DECODE_POST(g4_attn_decode_post_d256, false, 256)
G4_ATTN_DECODE_POST(g4_attn_decode_post_bf16_d256, true, 256)
G4_ATTN_DECODE_POST(g4_attn_decode_post_d512, false, 512)
G4_ATTN_DECODE_POST(g4_attn_decode_post_bf16_d512, true, 512)
#endif

// ---- prefill helpers for the cuBLAS tier: NF4 blob -> bf16 matrix (same rounding as the tensor-core
// kernel), fp32 activations -> bf16, and a bias row added after the GEMM.
// grid ceil(n / 32 / 256), block 256: one 16-byte chunk (32 values, half an NF4 block) per thread.
extern "C" __global__ void g4_nf4_to_bf16(const u8* codes, const void* absmax, const float* absmax2,
                                          const float* offset, const float* code2, long n, u16* out,
                                          int tiled_rows) {
    __shared__ float cb[16];
    nf4_codebook(cb);
    pdl_begin();
    long c = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c * 32 >= n) return;
    // tiled_rows = H > 0: a kQuantTiled32 matrix [H, I] (the fused decode MLP's down or attention-o
    // projection), read in place: thread c still writes output chunk c (row r = c / (I / 32), columns 32 jj
    // ..: coalesced stores), whose codes sit at chunk jj * H + r and absmax at (jj / 2) * H + r. The same
    // values as after g4_nf4_untile32.
    long blk = (c * 32) >> 6, stored = blk, src = c; // blk: the row-major block (absmax2's index)
    if (tiled_rows > 0) {
        const long H = tiled_rows, I = n / H, r = c / (I / 32), jj = c % (I / 32);
        src    = jj * H + r;
        stored = (jj / 2) * H + r;
    }
    uint4 pk     = *(const uint4*)(codes + src * 16);
    float am     = nf4_absmax_value(nf4_absmax_raw(absmax, absmax2, stored), absmax2, offset, code2, blk);
    u32 words[4] = {pk.x, pk.y, pk.z, pk.w}, o[16];
#pragma unroll
    for (int wd = 0; wd < 4; ++wd)
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            u32 byte      = (words[wd] >> (8 * b)) & 0xff;
            o[wd * 4 + b] = pack2(cb[byte >> 4] * am, cb[byte & 15] * am);
        }
    uint4* dst = (uint4*)(out + c * 32);
#pragma unroll
    for (int v = 0; v < 4; ++v)
        dst[v] = make_uint4(o[4 * v], o[4 * v + 1], o[4 * v + 2], o[4 * v + 3]);
}

// A kQuantTiled32 matrix [H, I] (g4_mlp_nf4's down projection) back in the row-major layout, codes and
// absmax (u8 when dq, else f32) into scratch copies, for every other use of it (prefill): the NF4 kernels
// then run exactly as on an untiled plan. grid ceil(H * I / 32 / 256), block 256: output chunk c (row
// c / (I / 32), columns 32 jj ..) per thread, coalesced stores; its codes sit at chunk jj * H + r.
extern "C" __global__ void g4_nf4_untile32(const u8* codes_t, const void* absmax_t, int dq, int H, int I,
                                           u8* codes, void* absmax) {
    pdl_begin();
    const long c = (long)blockIdx.x * blockDim.x + threadIdx.x, per_row = I / 32;
    if (c >= (long)H * per_row) return;
    const long r = c / per_row, jj = c % per_row;
    ((uint4*)codes)[c] = ((const uint4*)codes_t)[jj * H + r];
    if (jj % 2 == 0) {
        const long to = r * (I / 64) + jj / 2, from = (jj / 2) * H + r;
        if (dq)
            ((u8*)absmax)[to] = ((const u8*)absmax_t)[from];
        else
            ((float*)absmax)[to] = ((const float*)absmax_t)[from];
    }
}

// grid (max_rows, ceil(cols / 1024)), block 256: 4 consecutive values per thread. cols % 4 == 0.
extern "C" __global__ void g4_f32_to_bf16(const Step* s, const float* x, long ldx, u16* y, int cols) {
    pdl_begin();
    int t = blockIdx.x;
    if (t >= s->rows) return;
    int i = (blockIdx.y * blockDim.x + threadIdx.x) * 4;
    if (i >= cols) return;
    float4 v                          = *(const float4*)(x + (long)t * ldx + i);
    *(uint2*)(y + (long)t * cols + i) = make_uint2(pack2(v.x, v.y), pack2(v.z, v.w));
}

// grid (max_rows, ceil(n / 256)), block 256.
extern "C" __global__ void g4_add_bias(const Step* s, float* y, long ldy, const float* bias, int n) {
    pdl_begin();
    int t = blockIdx.x, i = blockIdx.y * blockDim.x + threadIdx.x;
    if (t >= s->rows || i >= n) return;
    y[(long)t * ldy + i] += bias[i];
}

// ---- vision tower on the GPU (runtime/src/cuda/vision.cpp; the reference is the CPU tower,
// runtime/src/towers/vision.cpp). Launched outside the decode graph; rows are the image's patches.

// x = 2 * (x - 0.5) over n floats (HF's pixel scaling). grid ceil(n / 256), block 256.
extern "C" __global__ void g4_vt_pixels(float* x, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 2.0f * (x[i] - 0.5f);
}

// z[i, :H] += table[0, pos[i].x, :] + table[1, pos[i].y, :] (table [2, P, H] of dtype tdt). grid (rows,
// ceil(H / 256)), block 256.
extern "C" __global__ void g4_vt_posemb(float* z, const int* pos, const void* table, int tdt, int H, int P) {
    const int i = blockIdx.x, e = blockIdx.y * blockDim.x + threadIdx.x;
    if (e >= H) return;
    const long ox = (long)pos[2 * i] * H + e, oy = ((long)P + pos[2 * i + 1]) * H + e;
    z[(long)i * H + e] += loadw(table, tdt, ox) + loadw(table, tdt, oy);
}

// y[r, :cols] = min(max(x[r, :cols], lo), hi) (also the audio tower's clamps). grid (rows, ceil(cols / 256)),
// block 256.
extern "C" __global__ void g4_vt_clamp(const float* x, long ldx, float* y, long ldy, int cols, float lo,
                                       float hi) {
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c < cols) y[(long)r * ldy + c] = fminf(fmaxf(x[(long)r * ldx + c], lo), hi);
}

// 2-D RoPE in place: within each head of D channels, [0, D/2) rotate with pos.x and [D/2, D) with pos.y,
// rotate-half pairs (m, m + D/4), inv_freq[m] = 1 / theta^(2m / (D/2)). grid (rows, heads), block D/2.
extern "C" __global__ void g4_vt_rope2d(float* x, long ldx, const int* pos, int D, float theta) {
    const int i = blockIdx.x, q = D / 4, axis = threadIdx.x / q, m = threadIdx.x % q;
    if (threadIdx.x >= D / 2) return;
    float* h        = x + (long)i * ldx + (long)blockIdx.y * D + axis * (D / 2);
    const float inv = 1.0f / powf(theta, (float)(2 * m) / (float)(D / 2));
    float sn, cs;
    sincosf((float)pos[2 * i + axis] * inv, &sn, &cs);
    const float x0 = h[m], x1 = h[m + q];
    h[m]     = x0 * cs - x1 * sn;
    h[m + q] = x1 * cs + x0 * sn;
}

// Average pooling into cells and the sqrt(hidden) scale: y[c, e] = root * sum_j w * z[idx[c, j], e] over
// the cell's kk patches in increasing patch order (the CPU tower's order). grid (cells, ceil(H / 256)),
// block 256.
extern "C" __global__ void g4_vt_pool(const float* z, const int* idx, int kk, int H, float w, float root,
                                      float* y) {
    const int c = blockIdx.x, e = blockIdx.y * blockDim.x + threadIdx.x;
    if (e >= H) return;
    float acc = 0.0f;
    for (int j = 0; j < kk; ++j)
        acc += w * z[(long)idx[c * kk + j] * H + e];
    y[(long)c * H + e] = acc * root;
}

// ---- audio tower on the GPU (runtime/src/cuda/audio.cpp; the reference is the CPU tower,
// runtime/src/towers/audio.cpp, whose loops these kernels follow one to one). Launched outside the decode
// graph; rows are the clip's frames (T after the two stride-2 convs). Matmuls go through g4_tc_gemm_bf16 /
// g4_matmul_bf16 and the ClippableLinear bounds through g4_vt_clamp; everything here is fp32.

// One SSCP layer (AudioTower::conv_layer): Conv2d 3x3, stride 2, padding 1, no bias, over [time, freq] with
// channels last; LayerNorm over the c_out channels (mean and biased variance of the conv outputs, eps,
// weight, no bias); ReLU. in [.., f_in, c_in], rows at or past t_in_valid read as zero (HF's mask); w
// [c_out, c_in, 3, 3] of dtype wdt; norm [c_out] of dtype ndt; out [gridDim.x, f_out, c_out]. One block per
// output position (t, f): the 3x3 input patch is staged in shared memory (kh, kw, c_in order, zeros outside
// the input), one warp per output channel sums over the weight row in its own order. grid (t_out, f_out),
// block 256, dynamic shared memory (9 * c_in + c_out) floats.
extern "C" __global__ void g4_at_conv(const float* in, int t_in_valid, int f_in, int c_in, const void* w,
                                      int wdt, const void* norm, int ndt, float eps, float* out, int f_out,
                                      int c_out) {
    extern __shared__ float at_sm[];
    float* patch = at_sm;            // [3, 3, c_in]
    float* ys    = at_sm + 9 * c_in; // [c_out]
    __shared__ float red[32];
    const int t = blockIdx.x, f = blockIdx.y, kc = 9 * c_in;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int e = threadIdx.x; e < kc; e += blockDim.x) {
        const int r = e / c_in, ci = e % c_in;
        const int ti = 2 * t - 1 + r / 3, fi = 2 * f - 1 + r % 3;
        patch[e] = ti >= 0 && ti < t_in_valid && fi >= 0 && fi < f_in ? in[((long)ti * f_in + fi) * c_in + ci]
                                                                      : 0.0f;
    }
    __syncthreads();
    for (int co = warp; co < c_out; co += nw) {
        float acc = 0.0f;
        for (int e = lane; e < kc; e += 32) { // e = ci * 9 + r: w's own layout
            const int ci = e / 9, r = e % 9;
            acc += loadw(w, wdt, (long)co * kc + e) * patch[r * c_in + ci];
        }
        acc = warp_sum(acc);
        if (lane == 0) ys[co] = acc;
    }
    __syncthreads();
    float s = 0.0f;
    for (int co = threadIdx.x; co < c_out; co += blockDim.x)
        s += ys[co];
    const float mean = block_sum(s, red) / (float)c_out;
    float q          = 0.0f;
    for (int co = threadIdx.x; co < c_out; co += blockDim.x)
        q += (ys[co] - mean) * (ys[co] - mean);
    const float var = block_sum(q, red) / (float)c_out;
    const float r   = 1.0f / sqrtf(var + eps);
    for (int co = threadIdx.x; co < c_out; co += blockDim.x)
        out[((long)t * f_out + f) * c_out + co] = fmaxf(0.0f, ((ys[co] - mean) * r) * loadw(norm, ndt, co));
}

// RMS norm of each row's first dim values with the audio tower's optional pre-clamp (audio.cpp rms()):
// v = clip > 0 ? min(max(x, -clip), clip) : x; y = v * (mean(v^2) + eps)^-1/2, times w (dtype wdt) when w is
// given. y may be x. grid (rows), block 256.
extern "C" __global__ void g4_at_rms(const float* x, long ldx, const void* w, int wdt, float* y, long ldy,
                                     int dim, float eps, float clip) {
    __shared__ float red[32];
    const float* xr = x + (long)blockIdx.x * ldx;
    float* yr       = y + (long)blockIdx.x * ldy;
    float ss        = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = clip > 0.0f ? fminf(fmaxf(xr[i], -clip), clip) : xr[i];
        ss += v * v;
    }
    ss            = block_sum(ss, red);
    const float r = powf(ss / (float)dim + eps, -0.5f);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = clip > 0.0f ? fminf(fmaxf(xr[i], -clip), clip) : xr[i];
        yr[i]         = w ? v * r * loadw(w, wdt, i) : v * r;
    }
}

// In place: x[r, c] = x[r, c] / (1 + exp(-x[r, c])) (SiLU) for c < cols. grid (rows, ceil(cols / 256)),
// block 256.
extern "C" __global__ void g4_at_silu(float* x, long ldx, int cols) {
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    const float v        = x[(long)r * ldx + c];
    x[(long)r * ldx + c] = v / (1.0f + expf(-v));
}

// Residual: x[r, c] = n[r, c] * f + x[r, c] for c < cols (f: residual_weight for the feed-forwards, 1
// elsewhere), x and n [rows, cols]. grid (rows, ceil(cols / 256)), block 256.
extern "C" __global__ void g4_at_residual(float* x, const float* n, int cols, float f) {
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    const long i = (long)r * cols + c;
    x[i]         = n[i] * f + x[i];
}

// y[r, c] += b[c] (dtype bdt) for c < cols (output_proj's bias). grid (rows, ceil(cols / 256)), block 256.
extern "C" __global__ void g4_at_bias(float* y, long ldy, const void* b, int bdt, int cols) {
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c < cols) y[(long)r * ldy + c] += loadw(b, bdt, c);
}

// Query and key scaling of the chunked attention, q and k [rows, H] in place: q[r, i] = q[r, i] * q_scale *
// softplus(per_dim_scale[i % D]) (softplus as torch, threshold 20, in double as the CPU tower), k[r, i] =
// k[r, i] * k_scale. grid (rows, ceil(H / 256)), block 256.
extern "C" __global__ void g4_at_qk_scale(float* q, float* k, int H, int D, const void* pds, int pdt,
                                          float q_scale, float k_scale) {
    const int r = blockIdx.x, i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= H) return;
    const double p = loadw(pds, pdt, i % D);
    const float sp = (float)(p > 20.0 ? p : log1p(exp(p)));
    const long at  = (long)r * H + i;
    q[at]          = q[at] * q_scale * sp;
    k[at]          = k[at] * k_scale;
}

// Chunked local attention with relative positions and the logit cap (AudioTower::attention's loop), one warp
// per (query t, head h): keys j = max(0, t - W + 1) .. t; logit_j = cap * tanh((q.k_j + q.rel_p) / cap) with
// p = W - (t - j) (no q.rel_p term when p is outside [0, n_rel)); softmax over those keys in fp32 (max, then
// the sum of exp in key order); o = sum_j (e_j / sum) v_j in key order. q, k, v, o [rows, H], rel [n_rel, H],
// head h at columns h*D. grid (rows, heads), block 32, dynamic shared memory W floats (the logits).
extern "C" __global__ void g4_at_attention(const float* q, const float* k, const float* v, const float* rel,
                                           int H, int D, int W, int n_rel, float cap, float* o) {
    extern __shared__ float at_sm[];
    float* logit = at_sm; // [W]
    const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    const int j0 = max(0, t - W + 1), nk = t - j0 + 1;
    const float* qh = q + (long)t * H + (long)h * D;
    float mx        = NEG_INF;
    for (int j = j0; j <= t; ++j) {
        const float* kh = k + (long)j * H + (long)h * D;
        const int p     = W - (t - j);
        const float* rh = p >= 0 && p < n_rel ? rel + (long)p * H + (long)h * D : nullptr;
        float ac = 0.0f, bd = 0.0f;
        for (int d = lane; d < D; d += 32) {
            ac += qh[d] * kh[d];
            if (rh) bd += qh[d] * rh[d];
        }
        ac            = warp_sum(ac);
        bd            = warp_sum(bd);
        const float s = tanhf((ac + bd) / cap) * cap;
        if (lane == 0) logit[j - j0] = s;
        mx = fmaxf(mx, s);
    }
    __syncwarp();
    if (lane == 0)
        for (int i = 0; i < nk; ++i)
            logit[i] = expf(logit[i] - mx);
    __syncwarp();
    float sum = 0.0f;
    for (int i = 0; i < nk; ++i)
        sum += logit[i];
    for (int d = lane; d < D; d += 32) {
        float acc = 0.0f;
        for (int j = j0; j <= t; ++j)
            acc += logit[j - j0] / sum * v[(long)j * H + (long)h * D + d];
        o[(long)t * H + (long)h * D + d] = acc;
    }
}

// GLU of linear_start's output: g[r, i] = a / (1 + exp(-b)), a = x[r, i], b = x[r, H + i], x [rows, 2H], g
// [rows, H]. grid (rows, ceil(H / 256)), block 256.
extern "C" __global__ void g4_at_glu(const float* x, int H, float* g) {
    const int r = blockIdx.x, i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= H) return;
    const float a = x[(long)r * 2 * H + i], b = x[(long)r * 2 * H + H + i];
    g[(long)r * H + i] = a / (1.0f + expf(-b));
}

// Causal depthwise conv1d over time (the light conv): c[t, i] = sum over j = 0..K-1 with s = t - (K - 1) + j
// >= 0 of w[i, j] * g[s, i], j ascending; w [H, 1, K] of dtype wdt, g and c [rows, H]. grid (rows, ceil(H /
// 256)), block 256.
extern "C" __global__ void g4_at_dwconv(const float* g, const void* w, int wdt, int H, int K, float* c) {
    const int t = blockIdx.x, i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= H) return;
    float acc = 0.0f;
    for (int j = 0; j < K; ++j) {
        const int s = t - (K - 1) + j;
        if (s >= 0) acc += loadw(w, wdt, (long)i * K + j) * g[(long)s * H + i];
    }
    c[(long)t * H + i] = acc;
}
