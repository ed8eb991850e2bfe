// Prefill GEMM for chunks of more than 8 rows: the tiled SIMT kernels and the tensor-core kernels.
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
