// The shared part of g4's CUDA kernels: types, the device Step, the kernel trace, reductions. The kernels
// (kernels/cuda/*.cu, one file per op family, concatenated in the order of G4_CUDA_KERNEL_SOURCES) are
// compiled ahead of time by NVRTC (compiler/cuda_compile.cpp) for the plan's target and stored in the plan
// (cubin + PTX). Self-contained: no host headers. Every kernel reads the step
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
