// The decode MLP in one kernel: gate/up GEMV pairs, the gelu product and the down projection.
// ---- The decode MLP in one kernel (sm_90): gate/up pairs, GeluMul and the down projection. Block j
// computes act[32j, 32j + 32) = gelu(gate . x) * (up . x) with the gate/up GEMV's own body (8 lanes a
// group, 16 groups: 32 outputs) into shared memory, then the down projection's K-slice j for every output
// row r, part[r] = sum_c D[r, 32j + c] act[32j + c], which it adds into y with red.global.add.v4.f32: no
// block waits for another, and the down's weights stream while other blocks still do the gate/up (the
// two-kernel path stages all of act in every down block after a grid-wide wait). y must be zero at the
// wait: the ResNorm before zeroes it (g4_resnorm's zero). The order of the adds varies, so y may differ
// in its last bits from run to run (g4 compile --deterministic keeps the two GEMVs). The down matrix is
// stored tiled (Nf4Tiled). bench/labs/mlp_lab.cu (H100): H 1536 15.7 -> 12.8 us, H 1536, I 12288 22.0
// -> 19.1, H 2560 28.5 -> 25.5 against the gate/up + down GEMVs in a graph. grid I / 32, block 128
// (g4_mlp_nf4) or 256 (g4_mlp_nf4_b256: the gate/up at 16 lanes, two blocks an SM; bench/labs/mlp_lab.cu: H
// 1536 12.7 -> 11.0 us, but slower at 384 and 320 blocks), dynamic shared memory cuda_rt::gemv_smem(true, 90,
// H). H % 4 == 0, I % 64 == 0. One kernel a scale format (_dq: double quant), so the loops carry no
// predicated-off path for the other (measured: 9-11% a kernel, H 1536 +3.3%, H 2560 +4.5% decode on an H100).
// The _rep kernels add into output replicas (MlpArgs::nrep; the plan's ip6).
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
    float* zero; // [H] (the _z kernels): block 0 zeroes it at its end (the output of the
                 // g4_resnorm_gated_proj launch after)
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
// ~1e-3 (the f32 kernels': ~5e-7), below bf16's rounding (3.9e-3). On an H200 (`g4 bench`): H 1536 decode
// +5.6% / +4.3% at depth 16 / 4096, H 2560 +6.6% / +5.9%; the down loop repeats mlp_body's (a shared helper
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
