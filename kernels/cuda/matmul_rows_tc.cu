// Matmul of 2..16 rows on tensor cores (batched decode steps, short prefill chunks): y[T, N] = x[T, K] . W[N,
// K]^T
// (+ bias), each weight read once in the layout it is stored in (NF4 row-major or kQuantTiled32, bf16), with
// products close to float32: x = xh + xl is split into two bf16 (as is every NF4 code value, w = wh + wl),
// and xh.wh + xh.wl + xl.wh (bf16 weights: xh.w + xl.w) run as mma.sync m16n8k16 with fp32 accumulation; the
// dropped xl.wl is below 2^-16 of the product. NF4 scales multiply each 64-element block's sums in fp32.
// A row's outputs do not depend on the other rows, nor on T.
// ---- Layout. A block of 8 warps owns C * WN output columns: warp w takes the C columns (C / 8 n8 tiles; NF4
// 16, bf16 32) of column group w % WN and the 64-element K blocks j = w / WN, + 8 / WN, ...; the K groups'
// sums meet in shared memory.
// The order of k inside a 32-element slice is permuted (x and W use the same order; the sum does not care):
// the lane of thread-in-group t (lane % 4) holds elements 8t .. 8t + 7 of its column (lane / 4) in the slice
// (NF4: one 32-bit word of codes; bf16: 16 bytes) and at k-step s multiplies elements 8t + 4s .. 8t + 4s + 3:
// the mma's k positions 2t, 2t + 1 (b0, a0 / a1) hold elements 8t + 4s, + 1 and positions 2t + 8, 2t + 9
// (b1, a2 / a3) elements + 2, + 3. Rows T..15 of the mma's A are zeros. Warps that share a K group read the
// same x (L1 hits). grid ceil(N / (C WN)), block 256; K % 64 == 0.
// sm_80+ (mma.sync with bf16 operands): every supported target.
#define TCR_WARPS 8

// x = hi + lo, each rounded to bf16 (hi + lo equals x to 2^-16 of it); a, b are consecutive k.
__device__ __forceinline__ void tcr_split2(float a, float b, u32* hi, u32* lo) {
    const u32 ha = bf16_bits(a), hb = bf16_bits(b);
    *hi = ha | (hb << 16);
    *lo = bf16_bits(a - __uint_as_float(ha << 16)) | (bf16_bits(b - __uint_as_float(hb << 16)) << 16);
}

// The A fragments (hi, lo) of k-step s of the slice at k0 for rows g and g + 8 (zeros past T).
__device__ __forceinline__ void tcr_x_frag(const float* x, long ldx, int T, int g, int k, u32 (&ah)[4],
                                           u32 (&al)[4]) {
    const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4 a = g < T ? *(const float4*)(x + (long)g * ldx + k) : z;
    const float4 b = g + 8 < T ? *(const float4*)(x + (long)(g + 8) * ldx + k) : z;
    tcr_split2(a.x, a.y, &ah[0], &al[0]);
    tcr_split2(b.x, b.y, &ah[1], &al[1]);
    tcr_split2(a.z, a.w, &ah[2], &al[2]);
    tcr_split2(b.z, b.w, &ah[3], &al[3]);
}

// Sums each lane's acc over the K groups of its column group (shared memory) and writes rows < T, columns <
// N.
template <int TCR_TILES>
__device__ __forceinline__ void tcr_store(float (&acc)[TCR_TILES][4], int WN, int n_blk, int N, int T,
                                          float* y, long ldy, const float* bias) {
    __shared__ float red[TCR_WARPS][TCR_TILES][4][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, WK = TCR_WARPS / WN;
#pragma unroll
    for (int q = 0; q < TCR_TILES; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            red[warp][q][e][lane] = acc[q][e];
    __syncthreads();
    if (warp >= WN) return; // K group 0 writes
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int q = 0; q < TCR_TILES; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float v = 0.0f;
            for (int kg = 0; kg < WK; ++kg)
                v += red[warp + kg * WN][q][e][lane];
            const int row = g + (e >> 1) * 8, col = n_blk + warp * 8 * TCR_TILES + q * 8 + 2 * t + (e & 1);
            if (row < T && col < N) y[(long)row * ldy + col] = v + (bias ? bias[col] : 0.0f);
        }
}

// Two blocks a multiprocessor (at most 128 registers a thread): a warp's few K blocks leave its loads'
// latency to the other warps.
extern "C" __global__ void __launch_bounds__(256, 2)
    g4_mm_rows_tc_nf4(const Step* s, int mode, const float* x, long ldx, const u8* codes, const void* absmax,
                      const float* absmax2, const float* offset, const float* code2, int N, int K, float* y,
                      long ldy, const float* bias, int tiled, int WN) {
    // Code value v as two bf16, hi | rest << 16: 16 words in 16 banks, so a warp's lookups never conflict.
    __shared__ u32 tab[16];
    if (threadIdx.x < 16) {
        const float v    = kNf4[threadIdx.x];
        const u32 h      = bf16_bits(v);
        tab[threadIdx.x] = h | (bf16_bits(v - __uint_as_float(h << 16)) << 16);
    }
    __syncthreads();
    constexpr int TCR_TILES = 2;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int WK = TCR_WARPS / WN, kg = warp / WN, kb = K / 64;
    const int n_blk = blockIdx.x * 8 * TCR_TILES * WN, n_w = n_blk + (warp % WN) * 8 * TCR_TILES;
    // Column of lane group g in tile q (its codes), and the two columns of this lane's accumulators.
    auto code_word = [&](int j, int q, int sl) -> u32 {
        const long n = min(n_w + q * 8 + g, N - 1), c = 2 * j + sl; // 32-element slice c
        const long off = tiled ? (c * N + n) * 16 + t * 4 : n * (K / 2) + c * 16 + t * 4;
        return __ldcs((const u32*)(codes + off));
    };
    auto scale_raw = [&](int j, int col) -> u32 {
        const long n = min(col, N - 1);
        return nf4_absmax_raw(absmax, absmax2, tiled ? (long)j * N + n : n * kb + j);
    };
    u32 wq[TCR_TILES][2];
    auto load = [&](int j) {
#pragma unroll
        for (int q = 0; q < TCR_TILES; ++q)
            wq[q][0] = code_word(j, q, 0), wq[q][1] = code_word(j, q, 1);
    };
    int j = kg;
    if (j < kb && n_w < N) load(j);
    pdl_begin();
    const int T = rows_of(s, mode);
    x += (long)in_row0(s, mode) * ldx;
    float acc[TCR_TILES][4] = {};
    for (; j < kb && n_w < N; j += WK) {
        u32 cw[TCR_TILES][2],
            cs[TCR_TILES][2]; // this K block's codes (loaded one block ahead) and scales (the mma hides them)
#pragma unroll
        for (int q = 0; q < TCR_TILES; ++q) {
            cw[q][0] = wq[q][0], cw[q][1] = wq[q][1];
            const int c0 = n_w + q * 8 + 2 * t;
            cs[q][0] = scale_raw(j, c0), cs[q][1] = scale_raw(j, c0 + 1);
        }
        if (j + WK < kb) load(j + WK);
        float part[TCR_TILES][4] = {};
#pragma unroll
        for (int sl = 0; sl < 2; ++sl)
#pragma unroll
            for (int st = 0; st < 2; ++st) {
                u32 ah[4], al[4];
                tcr_x_frag(x, ldx, T, g, j * 64 + sl * 32 + 8 * t + 4 * st, ah, al);
#pragma unroll
                for (int q = 0; q < TCR_TILES; ++q) {
                    // Elements 8t + 4st .. + 3: the high then the low nibble of two code bytes.
                    const u32 w  = cw[q][sl] >> (16 * st);
                    const u32 e0 = tab[(w >> 4) & 15], e1 = tab[w & 15], e2 = tab[(w >> 12) & 15],
                              e3    = tab[(w >> 8) & 15];
                    const u32 bh[2] = {__byte_perm(e0, e1, 0x5410), __byte_perm(e2, e3, 0x5410)};
                    const u32 bl[2] = {__byte_perm(e0, e1, 0x7632), __byte_perm(e2, e3, 0x7632)};
                    mma_bf16(part[q], ah, bh);
                    mma_bf16(part[q], ah, bl);
                    mma_bf16(part[q], al, bh);
                }
            }
#pragma unroll
        for (int q = 0; q < TCR_TILES; ++q) {
            const long c0 = min(n_w + q * 8 + 2 * t, N - 1), c1 = min(n_w + q * 8 + 2 * t + 1, N - 1);
            const float s0 = nf4_absmax_value(cs[q][0], absmax2, offset, code2, c0 * kb + j);
            const float s1 = nf4_absmax_value(cs[q][1], absmax2, offset, code2, c1 * kb + j);
            acc[q][0] = fmaf(part[q][0], s0, acc[q][0]), acc[q][1] = fmaf(part[q][1], s1, acc[q][1]);
            acc[q][2] = fmaf(part[q][2], s0, acc[q][2]), acc[q][3] = fmaf(part[q][3], s1, acc[q][3]);
        }
    }
    tcr_store(acc, WN, n_blk, N, T, y, ldy, bias);
}

extern "C" __global__ void __launch_bounds__(256)
    g4_mm_rows_tc_bf16(const Step* s, int mode, const float* x, long ldx, const u16* w, int N, int K,
                       float* y, long ldy, const float* bias, int WN) {
    constexpr int TCR_TILES = 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int WK = TCR_WARPS / WN, kg = warp / WN, kb = K / 64;
    const int n_blk = blockIdx.x * 8 * TCR_TILES * WN, n_w = n_blk + (warp % WN) * 8 * TCR_TILES;
    uint4 wq[TCR_TILES][2];
    auto load = [&](int j) {
#pragma unroll
        for (int q = 0; q < TCR_TILES; ++q) {
            const long n = min(n_w + q * 8 + g, N - 1);
#pragma unroll
            for (int sl = 0; sl < 2; ++sl)
                wq[q][sl] = __ldcs((const uint4*)(w + n * K + j * 64 + sl * 32 + t * 8));
        }
    };
    int j = kg;
    if (j < kb && n_w < N) load(j);
    pdl_begin();
    const int T = rows_of(s, mode);
    x += (long)in_row0(s, mode) * ldx;
    float acc[TCR_TILES][4] = {};
    for (; j < kb && n_w < N; j += WK) {
        uint4 cw[TCR_TILES][2];
#pragma unroll
        for (int q = 0; q < TCR_TILES; ++q)
            cw[q][0] = wq[q][0], cw[q][1] = wq[q][1];
        if (j + WK < kb) load(j + WK);
#pragma unroll
        for (int sl = 0; sl < 2; ++sl)
#pragma unroll
            for (int st = 0; st < 2; ++st) {
                u32 ah[4], al[4];
                tcr_x_frag(x, ldx, T, g, j * 64 + sl * 32 + 8 * t + 4 * st, ah, al);
#pragma unroll
                for (int q = 0; q < TCR_TILES; ++q) {
                    const u32 b[2] = {st ? cw[q][sl].z : cw[q][sl].x, st ? cw[q][sl].w : cw[q][sl].y};
                    mma_bf16(acc[q], ah, b);
                    mma_bf16(acc[q], al, b);
                }
            }
    }
    tcr_store(acc, WN, n_blk, N, T, y, ldy, bias);
}
