// Prefill attention on tensor cores, flash style.
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
