// The fused decode kernels for several rows (a batched decode step: one token of each of T sessions): the
// GEMV family (decode_gemv.cu: q/k/v, gate/up pairs, the LM head) and the residual norm (resnorm.cu). Each
// weight chunk is loaded and dequantized once and multiplied by the T rows; every row's float32 sums are
// those of the one-row kernel (g4_gemv_*, g4_resnorm): the same lanes take the same chunks in the same order,
// each chunk's products run in the same two FMA chains, the same reductions and epilogues. rows (<= T) rows
// of x at ldx floats apart; the outputs of row t at t * ld of their tensor. grid ceil(threads / B) of B
// threads (B: 128 for the t4 kernels, 256 for t8), threads as the one-row kernel's launch.
// xs (sm_90): the rows of x are staged in dynamic shared memory: NF4 after the wide pair table, C * 9 float4
// a row (chunk c's 8 float4 at 9 c, as the one-row kernel's xs_slot: 8 lanes reading 8 consecutive chunks hit
// distinct banks); bf16 row-major. Else each lane reads its chunks of x from global memory, 128 (NF4) or 32
// bytes apart from its neighbours' (an NF4 warp's 16-byte loads touch 32 lines: 8x the L1 wavefronts of the
// staged reads).
// sm_90+ only (the plans whose batched steps were measured; elsewhere the step runs its records' ops one by
// one): for sm_80, NVRTC's cubin of these kernels differed from one compile of the same source to the next.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
struct GemvRowsLd {
    long x, y[3], out, aux;
    int rows, xs;
};

// acc[t][q] += row q's NF4 chunk (code words pk[q]) . row t of x at chunk c, scaled: nf4_chunk_dot's chains
// for each row, the table lookups shared by the rows.
template <bool W, int G, int T>
__device__ __forceinline__ void nf4_chunk_rows(const uint4* pk, const float* scale, const float* x, long ldx,
                                               const float4* xs, int xs_row, int rows, int c, const char* tb,
                                               u32 lane_off, float (&acc)[T][G]) {
    float s0[T][G], s1[T][G];
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
        for (int q = 0; q < G; ++q)
            s0[t][q] = 0.0f, s1[t][q] = 0.0f;
#pragma unroll
    for (int wd = 0; wd < 4; ++wd) {
        float2 p[G][4];
#pragma unroll
        for (int q = 0; q < G; ++q) {
            const u32 w = wd == 0 ? pk[q].x : wd == 1 ? pk[q].y : wd == 2 ? pk[q].z : pk[q].w;
            p[q][0]     = *(const float2*)(tb + nf4_lookup_off<W, 0>(w, lane_off));
            p[q][1]     = *(const float2*)(tb + nf4_lookup_off<W, 1>(w, lane_off));
            p[q][2]     = *(const float2*)(tb + nf4_lookup_off<W, 2>(w, lane_off));
            p[q][3]     = *(const float2*)(tb + nf4_lookup_off<W, 3>(w, lane_off));
        }
#pragma unroll
        for (int t = 0; t < T; ++t) {
            if (t < rows) {
                const float4* xr = xs ? xs + t * xs_row + c * 9 + wd * 2
                                      : (const float4*)(x + (long)t * ldx + (long)c * 32 + wd * 8);
                const float4 xa = xr[0], xb = xr[1];
                const float xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                for (int q = 0; q < G; ++q) {
                    s0[t][q] = fmaf(p[q][0].x, xw[0], s0[t][q]), s1[t][q] = fmaf(p[q][0].y, xw[1], s1[t][q]);
                    s0[t][q] = fmaf(p[q][1].x, xw[2], s0[t][q]), s1[t][q] = fmaf(p[q][1].y, xw[3], s1[t][q]);
                    s0[t][q] = fmaf(p[q][2].x, xw[4], s0[t][q]), s1[t][q] = fmaf(p[q][2].y, xw[5], s1[t][q]);
                    s0[t][q] = fmaf(p[q][3].x, xw[6], s0[t][q]), s1[t][q] = fmaf(p[q][3].y, xw[7], s1[t][q]);
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
        for (int q = 0; q < G; ++q) {
            const float dot = s0[t][q] + s1[t][q];
            acc[t][q] += dot * scale[q];
        }
}

template <bool kIsNf4, int L, int M, int T, bool W, int B>
__device__ __forceinline__ void gemv_rows_body(const GemvArgs& a, const GemvRowsLd& ld, float2* tab,
                                               float4* xs) {
    constexpr int G = GV_OUT, R = G / M;
    const int gl    = threadIdx.x % L;
    const int group = (int)((blockIdx.x * blockDim.x + threadIdx.x) / L);
    const int n_out =
        M == 2 ? a.m[0].n : a.m[0].n + (a.nmat > 1 ? a.m[1].n : 0) + (a.nmat > 2 ? a.m[2].n : 0);
    const int o0 = group * R;
    const int K  = a.k;
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
    int blk0[G];
#pragma unroll
    for (int q = 0; q < G; ++q) {
        const GemvMat& m = mi[q] == 0 ? a.m[0] : mi[q] == 1 ? a.m[1] : a.m[2];
        wrow[q] = (const uint4*)((const char*)m.w + (kIsNf4 ? (long)ln[q] * K / 2 : (long)ln[q] * K * 2));
        amp[q] = m.absmax, am2p[q] = m.absmax2, offp[q] = m.offset, c2p[q] = m.code2;
        blk0[q] = (int)((long)ln[q] * K / 32);
    }
    constexpr int PER  = kIsNf4 ? 32 : 8;
    const int C        = K / PER;
    const u32 lane_off = (threadIdx.x & 15) * 8;
    auto load          = [&](int c, uint4* pk, u32* raw) {
#pragma unroll
        for (int q = 0; q < G; ++q) {
            pk[q]  = __ldcs(wrow[q] + c);
            raw[q] = kIsNf4 ? nf4_raw<NF4_SCALES_ANY>(amp[q], am2p[q], (blk0[q] + c) >> 1) : 0u;
        }
    };
    uint4 pk[G];
    u32 raw[G];
    if (gl < C) load(gl, pk, raw);
    if (kIsNf4) {
        nf4_pair_table_b<B, W>(tab);
        __syncthreads();
    }
    pdl_begin();
    const int rows = ld.rows;
    if (!ld.xs || (kIsNf4 && !W)) xs = nullptr;
    if (xs) { // NF4: chunk c's 8 float4 at 9 c; bf16: row-major
        const int n4 = K / 4;
        for (int t = 0; t < rows; ++t) {
            const float4* x4 = (const float4*)(a.x + (long)t * ld.x);
            for (int i = threadIdx.x; i < n4; i += B)
                xs[kIsNf4 ? t * C * 9 + (i >> 3) * 9 + (i & 7) : t * n4 + i] = x4[i];
        }
        __syncthreads();
    }
    float acc[T][G];
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
        for (int q = 0; q < G; ++q)
            acc[t][q] = 0.0f;
    for (int c = gl; c < C; c += L) {
        uint4 pn[G];
        u32 rn[G];
        load(c + L < C ? c + L : c, pn, rn);
        if (kIsNf4) {
            float scale[G];
#pragma unroll
            for (int q = 0; q < G; ++q)
                scale[q] = nf4_value<NF4_SCALES_ANY>(raw[q], am2p[q], offp[q], c2p[q], (blk0[q] + c) >> 1);
            nf4_chunk_rows<W, G, T>(pk, scale, a.x, ld.x, xs, C * 9, rows, c, (const char*)tab, lane_off,
                                    acc);
        } else {
#pragma unroll
            for (int t = 0; t < T; ++t) {
                if (t < rows) {
                    const float4* xr =
                        xs ? xs + t * (K / 4) + c * 2 : (const float4*)(a.x + (long)t * ld.x + (long)c * 8);
                    const float4 xa = xr[0], xb = xr[1];
                    const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                    for (int q = 0; q < G; ++q) {
                        u32 words[4] = {pk[q].x, pk[q].y, pk[q].z, pk[q].w};
                        float sum    = 0.0f;
#pragma unroll
                        for (int wd = 0; wd < 4; ++wd)
                            sum += __uint_as_float(words[wd] << 16) * xv[2 * wd] +
                                   __uint_as_float(words[wd] & 0xffff0000u) * xv[2 * wd + 1];
                        acc[t][q] += sum;
                    }
                }
            }
        }
#pragma unroll
        for (int q = 0; q < G; ++q)
            pk[q] = pn[q], raw[q] = rn[q];
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
        if (L > 32 && t > 0) __syncthreads(); // gemv_group_sum's shared partials are reused row by row
        gemv_group_sum<L, G, B>(acc[t], gl);
    }
    if (gl != 0) return;
#pragma unroll
    for (int t = 0; t < T; ++t) {
        if (t >= rows) break;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int o = o0 + r;
            if (o >= n_out) break;
            if (M == 2) {
                float g                     = acc[t][2 * r] + (a.m[0].bias ? a.m[0].bias[o] : 0.0f);
                float u                     = acc[t][2 * r + 1] + (a.m[1].bias ? a.m[1].bias[o] : 0.0f);
                a.out[(long)t * ld.out + o] = gelu_tanh(g) * u;
            } else {
                const GemvMat& m = mi[r] == 0 ? a.m[0] : mi[r] == 1 ? a.m[1] : a.m[2];
                const long yo    = (long)t * ld.y[mi[r]] + ln[r];
                float v          = acc[t][r] + (m.bias ? m.bias[ln[r]] : 0.0f);
                if (a.epi == 0)
                    m.y[yo] = v;
                else if (a.epi == 2)
                    a.out[(long)t * ld.out + o] = gelu_tanh(v) * a.aux[(long)t * ld.aux + o];
                else
                    m.y[yo] = a.cap * tanhf(v / a.cap);
            }
        }
    }
}

// g4_gemv_rows_{nf4,bf16}_l<L>_m<M>_t<T>: up to T rows. NF4 on sm_90: the wide pair table in GV_WIDE_BYTES of
// dynamic shared memory, then (ld.xs) the staged rows of x; elsewhere the static table.
#define G4_GEMV_ROWS(NAME, NF4, L, M, T, B)                                                                  \
    extern "C" __global__ void __launch_bounds__(B) NAME(const GemvArgs a, const GemvRowsLd ld) {            \
        if (NF4 && GV_WIDE) {                                                                                \
            extern __shared__ float4 gv_wide[];                                                              \
            gemv_rows_body<NF4, L, M, T, true, B>(a, ld, (float2*)gv_wide, gv_wide + GV_WIDE_BYTES / 16);    \
        } else {                                                                                             \
            extern __shared__ float4 gv_rows_x[];                                                            \
            __shared__ float2 tab[NF4 && !GV_WIDE ? NF4_PAIRS : 1];                                          \
            gemv_rows_body<NF4, L, M, T, false, B>(a, ld, tab, gv_rows_x);                                   \
        }                                                                                                    \
    }
#define G4_GEMV_ROWS_T(NF4, DT, L, M)                                                                        \
    G4_GEMV_ROWS(g4_gemv_rows_##DT##_l##L##_m##M##_t4, NF4, L, M, 4, 128)                                    \
    G4_GEMV_ROWS(g4_gemv_rows_##DT##_l##L##_m##M##_t8, NF4, L, M, 8, 256)
G4_GEMV_ROWS_T(true, nf4, 8, 1)
G4_GEMV_ROWS_T(true, nf4, 16, 1)
G4_GEMV_ROWS_T(true, nf4, 32, 1)
G4_GEMV_ROWS_T(true, nf4, 64, 1)
G4_GEMV_ROWS_T(true, nf4, 128, 1)
G4_GEMV_ROWS_T(true, nf4, 8, 2)
G4_GEMV_ROWS_T(true, nf4, 16, 2)
G4_GEMV_ROWS_T(true, nf4, 32, 2)
G4_GEMV_ROWS_T(true, nf4, 64, 2)
G4_GEMV_ROWS_T(true, nf4, 128, 2)
G4_GEMV_ROWS_T(false, bf16, 8, 1)
G4_GEMV_ROWS_T(false, bf16, 16, 1)
G4_GEMV_ROWS_T(false, bf16, 32, 1)
G4_GEMV_ROWS_T(false, bf16, 64, 1)
G4_GEMV_ROWS_T(false, bf16, 128, 1)
G4_GEMV_ROWS_T(false, bf16, 8, 2)
G4_GEMV_ROWS_T(false, bf16, 16, 2)
G4_GEMV_ROWS_T(false, bf16, 32, 2)
G4_GEMV_ROWS_T(false, bf16, 64, 2)
G4_GEMV_ROWS_T(false, bf16, 128, 2)

// g4_resnorm on row blockIdx.x of x, d, x_out and xn (ldx, ldd, ldxo, ldxn floats apart): grid rows, block as
// g4_resnorm's launch (its block sums' order).
extern "C" __global__ void __launch_bounds__(1024)
    g4_resnorm_rows(const float* x, long ldx, const float* d, long ldd, const void* pw, int pwdt,
                    const void* sc, int sdt, float f, float* xout, long ldxo, const void* prew, int prewdt,
                    float* xn, long ldxn, int H, float eps) {
    const long t = blockIdx.x;
    resnorm_entry<false>(x + t * ldx, d ? d + t * ldd : d, pw, pwdt, sc, sdt, f,
                         xout ? xout + t * ldxo : xout, prew, prewdt, xn ? xn + t * ldxn : xn, H, eps,
                         nullptr, nullptr, 0);
}
#endif
