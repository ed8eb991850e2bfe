// Matmul for prefill chunks of up to 8 rows and the op-by-op decode GEMV (bf16, f32, NF4 weights),
// and the NF4 dequantization helpers the later families share.
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
