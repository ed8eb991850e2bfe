// Lab variants for bench/labs/gemv_bench.cu (-DG4_LAB='"bench/labs/gemv_mma_lab.h"'): an NF4 decode GEMV on
// tensor cores. A CTA owns a tile of 16 weight rows (8 gate/up pairs) and its KS warps split K; per 64-weight
// NF4 block a thread (g = lane / 4, t = lane % 4) holds bytes 8t..8t+7 of rows g and g+8, turns each code
// byte into a bf16 pair through a 32-copy shared table (one conflict-free 32-bit load), and 4 mma.sync
// m16n8k16 give the block's 16 row sums (every column of B is x, so every column of D is the same dot
// product); the block scale is applied to those sums in fp32. x is bf16 (SPLIT: x = hi + lo, two MMAs,
// ~16-bit x).
template <int M, int KS, bool SPLIT, bool XSMEM>
__global__ void __launch_bounds__(KS * 32) mma_gemv(const GemvArgs a) {
    __shared__ u32 tab[256 * 32];                  // bf16x2 pair of code byte e, copy l: [e * 32 + l]
    __shared__ uint2 xs[XSMEM ? 2 * 3072 / 4 : 1]; // [2][K / 4]: hi, lo bf16 of x, 4 values a word pair
    __shared__ float red[KS][16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int K = a.k, nb = K / 64;
    const int n_out =
        M == 2 ? a.m[0].n : a.m[0].n + (a.nmat > 1 ? a.m[1].n : 0) + (a.nmat > 2 ? a.m[2].n : 0);
    // Rows g and g + 8 of the tile: matrix and local row (clamped; never stored past the end).
    const GemvMat* mr[2];
    int ln[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (M == 2) {
            mr[h] = &a.m[h];
            ln[h] = min(blockIdx.x * 8 + g, n_out - 1);
        } else {
            int o  = min((int)blockIdx.x * 16 + g + 8 * h, n_out - 1);
            int n0 = a.m[0].n, n1 = a.nmat > 1 ? a.m[1].n : 0;
            int mi = o < n0 ? 0 : o < n0 + n1 ? 1 : 2;
            mr[h]  = &a.m[mi];
            ln[h]  = o - (mi == 0 ? 0 : mi == 1 ? n0 : n0 + n1);
        }
    }
    const u8* rowp[2]  = {(const u8*)mr[0]->w + (long)ln[0] * K / 2 + 8 * t,
                          (const u8*)mr[1]->w + (long)ln[1] * K / 2 + 8 * t};
    const long blk0[2] = {(long)ln[0] * nb, (long)ln[1] * nb};
    // This warp's blocks: b = warp + i * KS.
    constexpr int FC = 8;
    uint2 w0[FC][2];
    u32 raw0[FC][2];
#pragma unroll
    for (int i = 0; i < FC; ++i) {
        const int b = warp + i * KS;
        if (b < nb)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                w0[i][h]   = __ldcs((const uint2*)(rowp[h] + 32 * b));
                raw0[i][h] = nf4_absmax_raw(mr[h]->absmax, mr[h]->absmax2, blk0[h] + b);
            }
    }
    for (int i = threadIdx.x; i < 256 * 32; i += blockDim.x) {
        const int e = i >> 5;
        tab[i]      = bf16_bits(kNf4[e >> 4]) | (bf16_bits(kNf4[e & 15]) << 16);
    }
    pdl_begin();
    const float4* x4 = (const float4*)a.x;
    if (XSMEM) {
        for (int u = threadIdx.x; u < K / 4; u += blockDim.x) {
            const float4 v = x4[u];
            const u32 h0 = pack2(v.x, v.y), h1 = pack2(v.z, v.w);
            xs[u] = make_uint2(h0, h1);
            if (SPLIT) {
                const float lx = v.x - __uint_as_float(h0 << 16),
                            ly = v.y - __uint_as_float(h0 & 0xffff0000u);
                const float lz = v.z - __uint_as_float(h1 << 16),
                            lw = v.w - __uint_as_float(h1 & 0xffff0000u);
                xs[K / 4 + u]  = make_uint2(pack2(lx, ly), pack2(lz, lw));
            }
        }
    }
    __syncthreads();
    const u32 loff = lane * 4;
    const char* tb = (const char*)tab;
    auto pair      = [&](u32 w, int p) -> u32 {
        const u32 off = (p == 0 ? w << 7 : w >> (8 * p - 7)) & 0x7f80u;
        return *(const u32*)(tb + (off | loff));
    };
    float acc[2] = {0.0f, 0.0f};
    auto block   = [&](int b, const uint2* w, const u32* raw) {
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 r0 = j < 2 ? w[0].x : w[0].y, r1 = j < 2 ? w[1].x : w[1].y;
            const int p0 = (2 * j) & 3;
            u32 af[4]    = {pair(r0, p0), pair(r1, p0), pair(r0, p0 + 1), pair(r1, p0 + 1)};
            const int u  = (64 * b + 16 * t + 4 * j) / 4;
            u32 bf[2];
            if (XSMEM) {
                const uint2 xv = xs[u];
                bf[0] = xv.x, bf[1] = xv.y;
            } else {
                const float4 v = x4[u];
                bf[0] = pack2(v.x, v.y), bf[1] = pack2(v.z, v.w);
            }
            mma_bf16(c, af, bf);
            if (SPLIT) {
                if (XSMEM) {
                    const uint2 xv = xs[K / 4 + u];
                    bf[0] = xv.x, bf[1] = xv.y;
                } else {
                    const float4 v = x4[u];
                    const float lx = v.x - __uint_as_float(bf[0] << 16),
                                ly = v.y - __uint_as_float(bf[0] & 0xffff0000u);
                    const float lz = v.z - __uint_as_float(bf[1] << 16),
                                lw = v.w - __uint_as_float(bf[1] & 0xffff0000u);
                    bf[0] = pack2(lx, ly), bf[1] = pack2(lz, lw);
                }
                mma_bf16(c, af, bf);
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h)
            acc[h] = fmaf(c[2 * h],
                          nf4_absmax_value(raw[h], mr[h]->absmax2, mr[h]->offset, mr[h]->code2, blk0[h] + b),
                          acc[h]);
    };
#pragma unroll
    for (int i = 0; i < FC; ++i)
        if (warp + i * KS < nb) block(warp + i * KS, w0[i], raw0[i]);
    for (int b = warp + FC * KS; b < nb; b += KS) {
        uint2 w[2];
        u32 raw[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            w[h]   = __ldcs((const uint2*)(rowp[h] + 32 * b));
            raw[h] = nf4_absmax_raw(mr[h]->absmax, mr[h]->absmax2, blk0[h] + b);
        }
        block(b, w, raw);
    }
    if (t == 0) red[warp][g] = acc[0], red[warp][g + 8] = acc[1];
    __syncthreads();
    if (threadIdx.x >= 16) return;
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < KS; ++i)
        v += red[i][threadIdx.x];
    if (M == 2) {
        if (threadIdx.x >= 8) return;
        const int o = blockIdx.x * 8 + threadIdx.x;
        if (o >= n_out) return;
        const float up = red[0][threadIdx.x + 8];
        float u        = up;
        for (int i = 1; i < KS; ++i)
            u += red[i][threadIdx.x + 8];
        const float gt = v + (a.m[0].bias ? a.m[0].bias[o] : 0.0f);
        a.out[o]       = gelu_tanh(gt) * (u + (a.m[1].bias ? a.m[1].bias[o] : 0.0f));
    } else {
        const int o = blockIdx.x * 16 + threadIdx.x;
        if (o >= n_out) return;
        int n0 = a.m[0].n, n1 = a.nmat > 1 ? a.m[1].n : 0;
        int mi           = o < n0 ? 0 : o < n0 + n1 ? 1 : 2;
        const GemvMat& m = a.m[mi];
        const int l      = o - (mi == 0 ? 0 : mi == 1 ? n0 : n0 + n1);
        v += m.bias ? m.bias[l] : 0.0f;
        if (a.epi == 0)
            m.y[l] = v;
        else if (a.epi == 2)
            a.out[o] = gelu_tanh(v) * a.aux[o];
        else
            m.y[l] = a.cap * tanhf(v / a.cap);
    }
}
template <int M, int KS, bool SPLIT, bool XSMEM> static GemvFn mma_fn(int) {
    return mma_gemv<M, KS, SPLIT, XSMEM>;
}

#define MMA_V(NAME, KS, SPLIT, XSMEM, KMAX)                                                                  \
    {                                                                                                        \
        NAME, 16, KS * 32, {{nullptr, nullptr}, {mma_fn<1, KS, SPLIT, XSMEM>, mma_fn<2, KS, SPLIT, XSMEM>}}, \
            KMAX, true                                                                                       \
    }
static const Variant kVariants[] = {
    MMA_V("mma ks4 split xs", 4, true, true, 3072),   MMA_V("mma ks8 split xs", 8, true, true, 3072),
    MMA_V("mma ks4 bf16x xs", 4, false, true, 3072),  MMA_V("mma ks8 bf16x xs", 8, false, true, 3072),
    MMA_V("mma ks4 split gx", 4, true, false, 0),     MMA_V("mma ks8 split gx", 8, true, false, 0),
    MMA_V("mma ks16 split gx", 16, true, false, 0),   MMA_V("mma ks16 bf16x gx", 16, false, false, 0),
    MMA_V("mma ks16 split xs", 16, true, true, 3072),
};
