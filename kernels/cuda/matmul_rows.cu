// Matmul of 2..8 rows (batched decode steps, short prefill chunks) that reads each weight once, in the layout
// it is stored in: y[T, N] = x[T, K] . W[N, K]^T (+ bias), float32 arithmetic.
// ---- Each lane group (ks warps: 1, 2 or 4, splitting K; the launch picks ks so small N still fills the
// GPU) owns MR_G consecutive weight rows. A lane takes one chunk of every row at a time (NF4: 16 values, 8
// bytes of codes; bf16: 8 values, 16 bytes), dequantizes it into registers, then multiplies it by the same
// columns of each of the T rows of x (float4 loads, L1 hits after the first warp), so x is read MR_G times
// less than one warp per row would. The next chunk's codes and scales load while this one's multiply runs.
// NF4 rows may be kQuantTiled32 (the fused decode kernels' down / o layout, Nf4Tiled): read in place, no
// untiling pass. grid ceil(N / MR_G / (4 / ks)), block 128. K % 64 == 0 (NF4), K % 8 == 0 (bf16).
#define MR_G 4
#define MR_T 8

// Sums acc over each warp, then over the ks warps of a lane group (shared memory); lane 0 of the group's
// first warp writes rows n0 .. n0 + MR_G - 1 of the T output rows.
__device__ __forceinline__ void mm_rows_store(float (&acc)[MR_T][MR_G], int T, int ks, int n0, int N,
                                              float* y, long ldy, const float* bias) {
    __shared__ float red[4][MR_T][MR_G];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < MR_T; ++t)
#pragma unroll
        for (int g = 0; g < MR_G; ++g)
            acc[t][g] = t < T ? warp_sum(acc[t][g]) : 0.0f;
    if (ks > 1) {
        if (lane == 0)
#pragma unroll
            for (int t = 0; t < MR_T; ++t)
#pragma unroll
                for (int g = 0; g < MR_G; ++g)
                    red[warp][t][g] = acc[t][g];
        __syncthreads();
        if (lane == 0 && warp % ks == 0)
#pragma unroll
            for (int t = 0; t < MR_T; ++t)
#pragma unroll
                for (int g = 0; g < MR_G; ++g) {
                    float v = 0.0f;
                    for (int k = 0; k < ks; ++k)
                        v += red[warp + k][t][g];
                    acc[t][g] = v;
                }
    }
    if (lane != 0 || warp % ks != 0) return;
#pragma unroll
    for (int t = 0; t < MR_T; ++t)
#pragma unroll
        for (int g = 0; g < MR_G; ++g)
            if (t < T && n0 + g < N) y[(long)t * ldy + n0 + g] = acc[t][g] + (bias ? bias[n0 + g] : 0.0f);
}

extern "C" __global__ void __launch_bounds__(128)
    g4_mm_rows_nf4(const Step* s, int mode, const float* x, long ldx, const u8* codes, const void* absmax,
                   const float* absmax2, const float* offset, const float* code2, int N, int K, float* y,
                   long ldy, const float* bias, int tiled, int ks) {
    __shared__ float cb[16];
    nf4_codebook(cb);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n0 = (blockIdx.x * (4 / ks) + warp / ks) * MR_G;
    const int C = K / 16, stride = ks * 32, kb = K / 64;
    int c = (warp % ks) * 32 + lane;
    // Chunk c of row n: its 8 code bytes and its block's stored scale (row-major, or tiled: 32-column
    // slices of 16 bytes a row, scales [K / 64][N]); absmax2 takes the row-major block index.
    auto load = [&](int cc, uint2* pk, u32* raw) {
#pragma unroll
        for (int g = 0; g < MR_G; ++g) {
            const long n   = min(n0 + g, N - 1);
            const long off = tiled ? ((long)(cc >> 1) * N + n) * 16 + (cc & 1) * 8 : n * (K / 2) + cc * 8;
            const long sb  = tiled ? (long)(cc >> 2) * N + n : n * kb + (cc >> 2);
            pk[g]          = __ldcs((const uint2*)(codes + off));
            raw[g]         = nf4_absmax_raw(absmax, absmax2, sb);
        }
    };
    uint2 pk[MR_G];
    u32 raw[MR_G];
    const bool live = n0 < N;
    if (live && c < C) load(c, pk, raw);
    pdl_begin();
    const int T = rows_of(s, mode);
    x += (long)in_row0(s, mode) * ldx;
    float acc[MR_T][MR_G] = {};
    for (; live && c < C; c += stride) {
        uint2 pn[MR_G];
        u32 rn[MR_G];
        if (c + stride < C) load(c + stride, pn, rn);
        float w[MR_G][16], am[MR_G];
#pragma unroll
        for (int g = 0; g < MR_G; ++g) {
            const long n = min(n0 + g, N - 1);
            am[g]        = nf4_absmax_value(raw[g], absmax2, offset, code2, n * kb + (c >> 2));
            u32 words[2] = {pk[g].x, pk[g].y};
#pragma unroll
            for (int q = 0; q < 2; ++q)
#pragma unroll
                for (int b = 0; b < 4; ++b) {
                    u32 byte                = (words[q] >> (8 * b)) & 0xff;
                    w[g][q * 8 + b * 2]     = cb[byte >> 4];
                    w[g][q * 8 + b * 2 + 1] = cb[byte & 15];
                }
        }
#pragma unroll
        for (int t = 0; t < MR_T; ++t) {
            if (t < T) {
                const float4* xr = (const float4*)(x + (long)t * ldx + c * 16);
                float xv[16];
#pragma unroll
                for (int v = 0; v < 4; ++v) {
                    float4 a  = xr[v];
                    xv[4 * v] = a.x, xv[4 * v + 1] = a.y, xv[4 * v + 2] = a.z, xv[4 * v + 3] = a.w;
                }
#pragma unroll
                for (int g = 0; g < MR_G; ++g) {
                    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                    for (int e = 0; e < 16; e += 2)
                        s0 = fmaf(w[g][e], xv[e], s0), s1 = fmaf(w[g][e + 1], xv[e + 1], s1);
                    acc[t][g] = fmaf(s0 + s1, am[g], acc[t][g]);
                }
            }
        }
#pragma unroll
        for (int g = 0; g < MR_G; ++g)
            pk[g] = pn[g], raw[g] = rn[g];
    }
    mm_rows_store(acc, T, ks, n0, N, y, ldy, bias);
}

extern "C" __global__ void __launch_bounds__(128)
    g4_mm_rows_bf16(const Step* s, int mode, const float* x, long ldx, const u16* w, int N, int K, float* y,
                    long ldy, const float* bias, int ks) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n0 = (blockIdx.x * (4 / ks) + warp / ks) * MR_G;
    const int C = K / 8, stride = ks * 32;
    int c           = (warp % ks) * 32 + lane;
    const bool live = n0 < N;
    auto load       = [&](int cc, uint4* pk) {
#pragma unroll
        for (int g = 0; g < MR_G; ++g)
            pk[g] = __ldcs((const uint4*)(w + (long)min(n0 + g, N - 1) * K + cc * 8));
    };
    uint4 pk[MR_G];
    if (live && c < C) load(c, pk);
    pdl_begin();
    const int T = rows_of(s, mode);
    x += (long)in_row0(s, mode) * ldx;
    float acc[MR_T][MR_G] = {};
    for (; live && c < C; c += stride) {
        uint4 pn[MR_G];
        if (c + stride < C) load(c + stride, pn);
        float wf[MR_G][8];
#pragma unroll
        for (int g = 0; g < MR_G; ++g) {
            const u32 words[4] = {pk[g].x, pk[g].y, pk[g].z, pk[g].w};
#pragma unroll
            for (int q = 0; q < 4; ++q)
                wf[g][2 * q]               = __uint_as_float(words[q] << 16),
                          wf[g][2 * q + 1] = __uint_as_float(words[q] & 0xffff0000u);
        }
#pragma unroll
        for (int t = 0; t < MR_T; ++t) {
            if (t < T) {
                const float4* xr = (const float4*)(x + (long)t * ldx + c * 8);
                const float4 a = xr[0], b = xr[1];
                const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int g = 0; g < MR_G; ++g) {
                    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                    for (int e = 0; e < 8; e += 2)
                        s0 = fmaf(wf[g][e], xv[e], s0), s1 = fmaf(wf[g][e + 1], xv[e + 1], s1);
                    acc[t][g] += s0 + s1;
                }
            }
        }
#pragma unroll
        for (int g = 0; g < MR_G; ++g)
            pk[g] = pn[g];
    }
    mm_rows_store(acc, T, ks, n0, N, y, ldy, bias);
}
