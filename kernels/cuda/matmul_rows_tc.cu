// Matmul of 2..16 rows on tensor cores (batched decode steps, short prefill chunks): y[T, N] = x[T, K] .
// W[N, K]^T (+ bias), each weight read once in the layout it is stored in (NF4 row-major or kQuantTiled32,
// bf16), with products close to float32: x = xh + xl is split into two bf16 (as is every NF4 code value,
// w = wh + wl), and xh.wh + xh.wl + xl.wh (bf16 weights: xh.w + xl.w) run as mma.sync m16n8k16 with fp32
// accumulation; the dropped xl.wl is below 2^-16 of the product. NF4 scales multiply each 64-element block's
// sums in fp32. A row's outputs do not depend on the other rows, nor on T.
// ---- Layout. grid (column blocks, S), block 256 = 8 warps. Split blockIdx.y covers the 64-element K blocks
// [y kps, min(kb, (y + 1) kps)), kps = ceil(kb / S), in chunks of TCS_XS K blocks: the block stages a chunk
// of x in shared memory, split into bf16 hi / lo and in the mma's fragment order (one latency for the block
// instead of one a K block for every warp), then multiplies it. It owns 8 TILES WN output columns: warp w
// takes the TILES n8 tiles of column group w % WN and the range's K blocks kg, kg + WK, ... (kg = w / WN,
// WK = 8 / WN); the K groups' sums meet in shared memory. With S > 1 each split writes its sums to
// part[y][T][N] and g4_mm_rows_tcs_sum adds the S of them in split order, then the bias: the result does not
// depend on timing (the _gelu, _norm_rope and _resnorm sums also run the ops after the matmul). Each warp
// keeps D K blocks of weights in flight in a ring of registers, each slot refilled as soon as it is used,
// the next chunk's first ones loaded before its x is staged (the grid: runtime/src/cuda/rows_tc_grid.h).
// The order of k inside a 32-element slice is permuted (x and W use the same order; the sum does not care):
// the lane of thread-in-group t (lane % 4) holds elements 8t .. 8t + 7 of its column (lane / 4) in the slice
// (NF4: one 32-bit word of codes; bf16: 16 bytes) and at k-step s multiplies elements 8t + 4s .. 8t + 4s + 3:
// the mma's k positions 2t, 2t + 1 (b0, a0 / a1) hold elements 8t + 4s, + 1 and positions 2t + 8, 2t + 9
// (b1, a2 / a3) elements + 2, + 3. Rows T..15 of the mma's A are zeros. K % 64 == 0.
// sm_80+ (mma.sync with bf16 operands): every supported target. The kernels' names carry their argument
// list: a plan compiled with other arguments has other names, and the runtime falls back to the float32
// row kernels for it.
#define TCS_WARPS 8
#define TCS_XS 8 // K blocks of x a block stages at a time: 32 KiB

// x = hi + lo, each rounded to bf16 (hi + lo equals x to 2^-16 of it); a, b are consecutive k.
__device__ __forceinline__ void tcs_split2(float a, float b, u32* hi, u32* lo) {
    const u32 ha = bf16_bits(a), hb = bf16_bits(b);
    *hi = ha | (hb << 16);
    *lo = bf16_bits(a - __uint_as_float(ha << 16)) | (bf16_bits(b - __uint_as_float(hb << 16)) << 16);
}

// The A fragments (hi, lo) at element k for rows g and g + 8 (zeros past T).
__device__ __forceinline__ void tcs_x_frag(const float* x, long ldx, int T, int g, int k, u32 (&ah)[4],
                                           u32 (&al)[4]) {
    const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4 a = g < T ? *(const float4*)(x + (long)g * ldx + k) : z;
    const float4 b = g + 8 < T ? *(const float4*)(x + (long)(g + 8) * ldx + k) : z;
    tcs_split2(a.x, a.y, &ah[0], &al[0]);
    tcs_split2(b.x, b.y, &ah[1], &al[1]);
    tcs_split2(a.z, a.w, &ah[2], &al[2]);
    tcs_split2(b.z, b.w, &ah[3], &al[3]);
}

// The weight operand: NF4 codes and scales, or bf16 values.
struct TcsWeight {
    const u8* codes;
    const void* absmax;
    const float *absmax2, *offset, *code2;
    const u16* w;
};

// One K block of a lane's TILES tiles: NF4, a 32-bit word of codes for each 32-element slice and the raw
// scales of the lane's two columns; bf16, 16 bytes for each slice.
template <bool NF4, int TILES> struct TcsBlock;
template <int TILES> struct TcsBlock<true, TILES> { u32 c[TILES][2], s[TILES][2]; };
template <int TILES> struct TcsBlock<false, TILES> { uint4 c[TILES][2]; };

// A warp's weight addresses at K block 0, computed once: K block j of tile q is at c[q] + j * cj (+ csl for
// the second slice), its scales at index s[q][e] + j * sj (of columns 2t + e), their double-quant index (the
// row-major one) at col[q][e] * kb + j. TL: the kQuantTiled32 layout (a slice's 16 bytes of codes for
// each column in turn, the scales K block by K block).
template <bool NF4, int TILES> struct TcsPtrs {
    const u8* c[TILES];
    int s[TILES][2], col[TILES][2];
    long cj, csl;
    int sj, kb;
};

template <bool NF4, bool TL, int TILES>
__device__ __forceinline__ TcsPtrs<NF4, TILES> tcs_ptrs(const TcsWeight& W, int n_w, int g, int t, int N,
                                                        int K) {
    TcsPtrs<NF4, TILES> P;
    P.kb = K / 64;
#pragma unroll
    for (int q = 0; q < TILES; ++q) {
        const long n = min(n_w + q * 8 + g, N - 1);
        if constexpr (NF4) {
            P.c[q] = W.codes + (TL ? n * 16 + t * 4 : n * (K / 2) + t * 4);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int col = min(n_w + q * 8 + 2 * t + e, N - 1);
                P.col[q][e]   = col;
                P.s[q][e]     = TL ? col : col * P.kb;
            }
        } else {
            P.c[q] = (const u8*)(W.w + n * K + t * 8);
        }
    }
    P.cj  = NF4 ? (TL ? 32L * N : 32) : 128;
    P.csl = NF4 ? (TL ? 16L * N : 16) : 64;
    P.sj  = TL ? N : 1;
    return P;
}

template <bool NF4, int SM, int TILES>
__device__ __forceinline__ void tcs_load(TcsBlock<NF4, TILES>& b, const TcsWeight& W,
                                         const TcsPtrs<NF4, TILES>& P, int j) {
#pragma unroll
    for (int q = 0; q < TILES; ++q) {
        const u8* c = P.c[q] + j * P.cj;
        if constexpr (NF4) {
            b.c[q][0] = __ldcs((const u32*)c);
            b.c[q][1] = __ldcs((const u32*)(c + P.csl));
#pragma unroll
            for (int e = 0; e < 2; ++e)
                b.s[q][e] = nf4_raw<SM>(W.absmax, W.absmax2, P.s[q][e] + j * P.sj);
        } else {
            b.c[q][0] = __ldcs((const uint4*)c);
            b.c[q][1] = __ldcs((const uint4*)(c + P.csl));
        }
    }
}

// acc += the products of K block j (its weights in b, its x fragments in xb: [k-step][hi, lo][lane]).
// tab: NF4 code value v as two bf16, hi | rest << 16.
template <bool NF4, int SM, int TILES>
__device__ __forceinline__ void tcs_block(float (&acc)[TILES][4], const TcsBlock<NF4, TILES>& b,
                                          const uint4 (*xb)[2][32], int lane, int j, const u32* tab,
                                          const TcsWeight& W, const TcsPtrs<NF4, TILES>& P) {
    float part[TILES][4] = {};
#pragma unroll
    for (int sl = 0; sl < 2; ++sl)
#pragma unroll
        for (int st = 0; st < 2; ++st) {
            const uint4 h = xb[sl * 2 + st][0][lane], l = xb[sl * 2 + st][1][lane];
            const u32 ah[4] = {h.x, h.y, h.z, h.w}, al[4] = {l.x, l.y, l.z, l.w};
#pragma unroll
            for (int q = 0; q < TILES; ++q) {
                if constexpr (NF4) {
                    // Elements 8t + 4st .. + 3: the high then the low nibble of two code bytes.
                    const u32 w  = b.c[q][sl] >> (16 * st);
                    const u32 e0 = tab[(w >> 4) & 15], e1 = tab[w & 15], e2 = tab[(w >> 12) & 15],
                              e3    = tab[(w >> 8) & 15];
                    const u32 bh[2] = {__byte_perm(e0, e1, 0x5410), __byte_perm(e2, e3, 0x5410)};
                    const u32 bl[2] = {__byte_perm(e0, e1, 0x7632), __byte_perm(e2, e3, 0x7632)};
                    mma_bf16(part[q], ah, bh);
                    mma_bf16(part[q], ah, bl);
                    mma_bf16(part[q], al, bh);
                } else {
                    const uint4& c  = b.c[q][sl];
                    const u32 bw[2] = {st ? c.z : c.x, st ? c.w : c.y};
                    mma_bf16(acc[q], ah, bw);
                    mma_bf16(acc[q], al, bw);
                }
            }
        }
    if constexpr (NF4) {
#pragma unroll
        for (int q = 0; q < TILES; ++q) {
            const float s0 =
                nf4_value<SM>(b.s[q][0], W.absmax2, W.offset, W.code2, (long)P.col[q][0] * P.kb + j);
            const float s1 =
                nf4_value<SM>(b.s[q][1], W.absmax2, W.offset, W.code2, (long)P.col[q][1] * P.kb + j);
            acc[q][0] = fmaf(part[q][0], s0, acc[q][0]), acc[q][1] = fmaf(part[q][1], s1, acc[q][1]);
            acc[q][2] = fmaf(part[q][2], s0, acc[q][2]), acc[q][3] = fmaf(part[q][3], s1, acc[q][3]);
        }
    }
}

// Sums each lane's acc over the K groups of its column group (WN == 8: none) in red (shared memory of
// TCS_WARPS * TILES * 4 * 32 floats, free once every warp is past its last K block) and writes rows < T,
// columns < N of y (+ bias).
template <int TILES>
__device__ __forceinline__ void tcs_store(float (&acc)[TILES][4], int WN, int n_blk, int N, int T, float* y,
                                          long ldy, const float* bias, float* red) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, WK = TCS_WARPS / WN;
    auto at = [&](int w, int q, int e) -> float& { return red[((w * TILES + q) * 4 + e) * 32 + lane]; };
    if (WK > 1) {
        __syncthreads();
#pragma unroll
        for (int q = 0; q < TILES; ++q)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                at(warp, q, e) = acc[q][e];
        __syncthreads();
        if (warp >= WN) return; // K group 0 writes
    }
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int q = 0; q < TILES; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float v = acc[q][e];
            for (int kg = 1; kg < WK; ++kg)
                v += at(warp + kg * WN, q, e);
            const int row = g + (e >> 1) * 8, col = n_blk + warp * 8 * TILES + q * 8 + 2 * t + (e & 1);
            if (row < T && col < N) y[(long)row * ldy + col] = v + (bias ? bias[col] : 0.0f);
        }
}

// The kernels' shared memory, declared in the kernels (one copy for all of a kernel's instantiations).
template <int TILES> struct TcsShared {
    static_assert(TCS_XS * 4 * 2 * 32 * 4 >= TCS_WARPS * TILES * 4 * 32, "the sums' reduction fits in xs");
    uint4 xs[TCS_XS][4][2][32]; // the range's x: [K block][k-step][hi, lo][lane]
    u32 tab[16];                // NF4: 16 words in 16 banks, so a warp's lookups never conflict
};

// NF4, TL (tiled codes) and SM (the scales' format) are template arguments, so a warp's per-K-block work
// is the loads at precomputed addresses, the lookups and the products.
template <bool NF4, bool TL, int SM, int TILES, int D>
__device__ __forceinline__ void tcs_run(TcsShared<TILES>& sh, const Step* s, int mode, const float* x,
                                        long ldx, const TcsWeight& W, int N, int K, float* y, long ldy,
                                        const float* bias, int WN, float* part, int bx, long ldp) {
    auto& xs = sh.xs;
    u32* tab = sh.tab;
    if (NF4 && threadIdx.x < 16) {
        const float v    = kNf4[threadIdx.x];
        const u32 h      = bf16_bits(v);
        tab[threadIdx.x] = h | (bf16_bits(v - __uint_as_float(h << 16)) << 16);
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int WK = TCS_WARPS / WN, kg = warp / WN, kb = K / 64, S = gridDim.y;
    const int kps = (kb + S - 1) / S, b0 = blockIdx.y * kps, nk = max(0, min(kb - b0, kps));
    const int n_blk = bx * 8 * TILES * WN, n_w = n_blk + (warp % WN) * 8 * TILES;
    const bool live             = n_w < N;
    const TcsPtrs<NF4, TILES> P = tcs_ptrs<NF4, TL, TILES>(W, n_w, g, t, N, K);
    // This warp's K blocks of the chunk [c0, c1) of the range: kg + i WK for i in [*ia, *ib).
    auto mine = [&](int c0, int c1, int* ia, int* ib) {
        *ia = c0 > kg ? (c0 - kg + WK - 1) / WK : 0;
        *ib = live && c1 > kg ? (c1 - kg + WK - 1) / WK : 0;
    };
    TcsBlock<NF4, TILES> ring[D];
    auto prologue = [&](int ia, int ib) {
#pragma unroll
        for (int d = 0; d < D; ++d)
            if (ia + d < ib) tcs_load<NF4, SM, TILES>(ring[d], W, P, b0 + kg + (ia + d) * WK);
    };
    int ia, ib;
    mine(0, min(nk, TCS_XS), &ia, &ib);
    prologue(ia, ib);
    pdl_begin();
    const int T = rows_of(s, mode);
    x += (long)in_row0(s, mode) * ldx;
    float acc[TILES][4] = {};
    for (int c0 = 0; c0 < nk; c0 += TCS_XS) { // chunks of TCS_XS K blocks: stage x, then the warps' blocks
        const int c1 = min(nk, c0 + TCS_XS);
        if (c0 > 0) {
            mine(c0, c1, &ia, &ib);
            prologue(ia, ib);
            __syncthreads(); // every warp is done with the previous chunk's x
        }
        // Fragment i = (K block, k-step, lane) of the chunk, one a thread at a time.
#pragma unroll
        for (int r = 0; r < TCS_XS * 4 * 32 / 256; ++r) {
            const int i = threadIdx.x + r * 256;
            if (i < (c1 - c0) * 128) {
                const int jj = i >> 7, ks = (i >> 5) & 3, ln = i & 31;
                const int k = (b0 + c0 + jj) * 64 + (ks >> 1) * 32 + 8 * (ln & 3) + 4 * (ks & 1);
                u32 ah[4], al[4];
                tcs_x_frag(x, ldx, T, ln >> 2, k, ah, al);
                xs[jj][ks][0][ln] = make_uint4(ah[0], ah[1], ah[2], ah[3]);
                xs[jj][ks][1][ln] = make_uint4(al[0], al[1], al[2], al[3]);
            }
        }
        __syncthreads();
        for (int i0 = ia; i0 < ib; i0 += D)
#pragma unroll
            for (int d = 0; d < D; ++d) {
                const int i = i0 + d;
                if (i < ib) {
                    const TcsBlock<NF4, TILES> cur = ring[d];
                    if (i + D < ib) tcs_load<NF4, SM, TILES>(ring[d], W, P, b0 + kg + (i + D) * WK);
                    tcs_block<NF4, SM, TILES>(acc, cur, xs[kg + i * WK - c0], lane, b0 + kg + i * WK, tab, W,
                                              P);
                }
            }
    }
    float* red = (float*)xs;
    if (S > 1)
        tcs_store<TILES>(acc, WN, n_blk, N, T, part + (long)blockIdx.y * T * ldp, ldp, nullptr, red);
    else
        tcs_store<TILES>(acc, WN, n_blk, N, T, y, ldy, bias, red);
}

// An NF4 weight of layout TL, its scales' format picked at run time.
template <bool TL, int TILES, int D>
__device__ __forceinline__ void tcs_nf4(TcsShared<TILES>& sh, const Step* s, int mode, const float* x,
                                        long ldx, const TcsWeight& W, int N, int K, float* y, long ldy,
                                        const float* bias, int WN, float* part, int bx, long ldp) {
    if (W.absmax2)
        tcs_run<true, TL, NF4_SCALES_DQ, TILES, D>(sh, s, mode, x, ldx, W, N, K, y, ldy, bias, WN, part, bx,
                                                   ldp);
    else
        tcs_run<true, TL, NF4_SCALES_F32, TILES, D>(sh, s, mode, x, ldx, W, N, K, y, ldy, bias, WN, part, bx,
                                                    ldp);
}

// Both kernels: 2 tiles (16 columns) a warp, 2 K blocks in flight, two blocks a multiprocessor: on an H200
// at 16 rows, faster than 3 or 4 K blocks in flight or 4 tiles a warp at every projection shape of Gemma 4
// E2B (bench/labs/mm_rows_tc_bench.cu).
#define TCS_TILES 2
#define TCS_DEPTH 2
extern "C" __global__ void __launch_bounds__(256, 2)
    g4_mm_rows_tcs_nf4(const Step* s, int mode, const float* x, long ldx, const u8* codes, const void* absmax,
                       const float* absmax2, const float* offset, const float* code2, int N, int K, float* y,
                       long ldy, const float* bias, int tiled, int WN, float* part) {
    __shared__ TcsShared<TCS_TILES> sh;
    const TcsWeight W{codes, absmax, absmax2, offset, code2, nullptr};
    if (tiled)
        tcs_nf4<true, TCS_TILES, TCS_DEPTH>(sh, s, mode, x, ldx, W, N, K, y, ldy, bias, WN, part, blockIdx.x,
                                            N);
    else
        tcs_nf4<false, TCS_TILES, TCS_DEPTH>(sh, s, mode, x, ldx, W, N, K, y, ldy, bias, WN, part, blockIdx.x,
                                             N);
}

// An MLP's gate and up projections (two N x K NF4 weights of the same layout and scale format) in one
// launch: blocks [0, gridDim.x / 2) take the gate's columns, the others the up's; each split's partial sums
// go to part[y][T][2N] (the gate's N columns, then the up's) for g4_mm_rows_tcs_sum_gelu_pair. S > 1.
extern "C" __global__ void __launch_bounds__(256, 2)
    g4_mm_rows_tcs_nf4_pair(const Step* s, int mode, const float* x, long ldx, const u8* g_codes,
                            const void* g_absmax, const float* g_absmax2, const float* g_offset,
                            const float* g_code2, const u8* u_codes, const void* u_absmax,
                            const float* u_absmax2, const float* u_offset, const float* u_code2, int N, int K,
                            int tiled, int WN, float* part) {
    __shared__ TcsShared<TCS_TILES> sh;
    const int half    = gridDim.x / 2;
    const bool up     = (int)blockIdx.x >= half;
    const TcsWeight W = up ? TcsWeight{u_codes, u_absmax, u_absmax2, u_offset, u_code2, nullptr}
                           : TcsWeight{g_codes, g_absmax, g_absmax2, g_offset, g_code2, nullptr};
    float* pp         = part + (up ? N : 0);
    const int bx      = (int)blockIdx.x - (up ? half : 0);
    if (tiled)
        tcs_nf4<true, TCS_TILES, TCS_DEPTH>(sh, s, mode, x, ldx, W, N, K, nullptr, 0, nullptr, WN, pp, bx,
                                            2L * N);
    else
        tcs_nf4<false, TCS_TILES, TCS_DEPTH>(sh, s, mode, x, ldx, W, N, K, nullptr, 0, nullptr, WN, pp, bx,
                                             2L * N);
}

extern "C" __global__ void __launch_bounds__(256, 2)
    g4_mm_rows_tcs_bf16(const Step* s, int mode, const float* x, long ldx, const u16* w, int N, int K,
                        float* y, long ldy, const float* bias, int WN, float* part) {
    __shared__ TcsShared<TCS_TILES> sh;
    const TcsWeight W{nullptr, nullptr, nullptr, nullptr, nullptr, w};
    tcs_run<false, false, NF4_SCALES_F32, TCS_TILES, TCS_DEPTH>(sh, s, mode, x, ldx, W, N, K, y, ldy, bias,
                                                                WN, part, blockIdx.x, N);
}

// Output (r, c) of T x N: the S splits' partial sums of g4_mm_rows_tcs_* in split order, + bias.
__device__ __forceinline__ float tcs_part_sum(const float* part, int S, int T, int N, int r, int c,
                                              const float* bias) {
    float sum = 0.0f;
    for (int k = 0; k < S; ++k)
        sum += part[((long)k * T + r) * N + c];
    return sum + (bias ? bias[c] : 0.0f);
}

// Output (r, c) of a sum kernel's thread (false past the T x N outputs): tcs_part_sum.
__device__ __forceinline__ bool tcs_split_sum(const Step* s, int mode, const float* part, int S, int N,
                                              const float* bias, int* r, int* c, float* v) {
    const int T  = rows_of(s, mode);
    const long i = (long)blockIdx.x * 256 + threadIdx.x;
    if (i >= (long)T * N) return false;
    *r = (int)(i / N), *c = (int)(i % N);
    *v = tcs_part_sum(part, S, T, N, *r, *c, bias);
    return true;
}

// y[r][n] = the S splits' partial sums of g4_mm_rows_tcs_* in split order, + bias; one thread an output.
extern "C" __global__ void __launch_bounds__(256)
    g4_mm_rows_tcs_sum(const Step* s, int mode, const float* part, int S, int N, float* y, long ldy,
                       const float* bias) {
    pdl_begin();
    int r, c;
    float v;
    if (tcs_split_sum(s, mode, part, S, N, bias, &r, &c, &v)) y[(long)r * ldy + c] = v;
}

// A matmul with the GeluMul after it, in the K splits' sum: gate_of_sum 0: y[r][n] = gelu_tanh(a[r][n]) *
// (the S splits' sums + bias) (the up projection of a gate/up pair, a its gate); 1: gelu_tanh(sums + bias) *
// a[r][n] (a gate multiplying a). a is read at the step's input rows, as g4_elementwise reads it.
extern "C" __global__ void __launch_bounds__(256)
    g4_mm_rows_tcs_sum_gelu(const Step* s, int mode, const float* part, int S, int N, const float* a,
                            long lda, int gate_of_sum, float* y, long ldy, const float* bias) {
    pdl_begin();
    int r, c;
    float v;
    if (!tcs_split_sum(s, mode, part, S, N, bias, &r, &c, &v)) return;
    const float o        = a[(long)(r + in_row0(s, mode)) * lda + c];
    y[(long)r * ldy + c] = gate_of_sum ? gelu_tanh(v) * o : gelu_tanh(o) * v;
}

// The GeluMul of an MLP's gate and up projections from g4_mm_rows_tcs_nf4_pair's partial sums: y[r][n] =
// gelu_tanh(gate sums + bg) * (up sums + bu), each sum in split order (bg, bu: biases or null). One thread
// an output.
extern "C" __global__ void __launch_bounds__(256)
    g4_mm_rows_tcs_sum_gelu_pair(const Step* s, int mode, const float* part, int S, int N, float* y, long ldy,
                                 const float* bg, const float* bu) {
    pdl_begin();
    const int T  = rows_of(s, mode);
    const long i = (long)blockIdx.x * 256 + threadIdx.x;
    if (i >= (long)T * N) return;
    const int r = (int)(i / N), c = (int)(i % N);
    const float g        = tcs_part_sum(part, S, T, 2 * N, r, c, bg),
                u        = tcs_part_sum(part + N, S, T, 2 * N, r, c, bu);
    y[(long)r * ldy + c] = gelu_tanh(g) * u;
}

// A matmul with the ResNorm record after it (g4_resnorm_rows on its rows, d the matmul's output), in the K
// splits' sum: y[t] = the S splits' sums + bias (written, as the matmul writes it), then x_out[t] and xn[t]
// of g4_resnorm on x[t] and y[t]. The sum's thread of a float4 of y is the one the norm's float4 path reads
// it with. grid (rows), block as g4_resnorm_rows' launch (H = N, N % 4 == 0, rows 16-byte aligned).
extern "C" __global__ void __launch_bounds__(1024)
    g4_mm_rows_tcs_sum_resnorm(const Step* s, int mode, const float* part, int S, int N, const float* bias,
                               float* y, long ldy, const float* x, long ldx, const void* pw, int pwdt,
                               const void* sc, int sdt, float f, float* xout, long ldxo, const void* prew,
                               int prewdt, float* xn, long ldxn, float eps) {
    pdl_begin();
    const int t = blockIdx.x, T = rows_of(s, mode);
    if (t >= T) return;
    float* yr = y + (long)t * ldy;
    for (int q = threadIdx.x; q < N / 4; q += blockDim.x) {
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
        for (int k = 0; k < S; ++k) {
            const float4 p = __ldcg((const float4*)(part + ((long)k * T + t) * N) + q);
            v.x += p.x, v.y += p.y, v.z += p.z, v.w += p.w;
        }
        if (bias) v.x += bias[4 * q], v.y += bias[4 * q + 1], v.z += bias[4 * q + 2], v.w += bias[4 * q + 3];
        ((float4*)yr)[q] = v;
    }
    __syncthreads();
    resnorm_entry<false>(x + t * ldx, yr, pw, pwdt, sc, sdt, f, xout ? xout + t * ldxo : xout, prew, prewdt,
                         xn ? xn + t * ldxn : xn, N, eps, nullptr, nullptr, 0);
}

// A matmul with the per-head RMS norm (g4_rms_norm over groups of dim; weight w, or none) and the RoPE
// (g4_rope_rows; inv_freq, or none) after it, both in place on its output, in the K splits' sum: y[t][h dim
// + i] for head h = blockIdx.x. Rows of a batched step: s its records, row t at position s[1 + t].pos0.
// grid (N / dim, rows), block dim (even, <= 1024).
extern "C" __global__ void __launch_bounds__(1024)
    g4_mm_rows_tcs_sum_norm_rope(const Step* s, int mode, const float* part, int S, int N, const float* bias,
                                 float* y, long ldy, const void* w, int wdt, int dim, float eps,
                                 const float* inv_freq) {
    __shared__ float red[32];
    __shared__ float hv[1024];
    pdl_begin();
    const int t = blockIdx.y, T = rows_of(s, mode), i = threadIdx.x, c = blockIdx.x * dim + i;
    if (t >= T) return;
    float v       = tcs_part_sum(part, S, T, N, t, c, bias);
    const float r = powf(block_sum(v * v, red) / (float)dim + eps, -0.5f);
    v             = v * r * (w ? loadw(w, wdt, i) : 1.0f);
    if (inv_freq) {
        hv[i] = v;
        __syncthreads();
        const int half = dim >> 1, k = i < half ? i : i - half;
        float sn, cs;
        sincosf((float)s[1 + t].pos0 * inv_freq[k], &sn, &cs);
        v = i < half ? hv[i] * cs - hv[i + half] * sn : hv[i] * cs + hv[i - half] * sn;
    }
    y[(long)t * ldy + c] = v;
}
