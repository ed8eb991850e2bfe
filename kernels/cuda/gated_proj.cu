// The gated per-slice projection of a decode row in one kernel: gelu(W_g x + b_g) * aux, then W_p.
// ---- the gated projection in one kernel (sm_90; schedule record GatedProj) ----
// Block j takes gate rows 8j .. 8j + 7, one a warp: act = gelu(W_g x + b_g) * aux, then the projection's
// columns 8j .. 8j + 7 for every output row, added into y with red.global.add.v4.f32 (zeroed by the ResNorm
// before, as for g4_mlp_nf4). Both bf16 slices stay row-major (a projection row's 8 columns are one 16-byte
// load) and are loaded before the programmatic wait, with aux (written at the start of the step); only x
// is read after it. grid P / 8, block 256, G = ceil(H / 1024) (g4_gated_proj_bf16_g1..4). H % 8 == 0, P % 8
// == 0. g4_resnorm_gated_proj_bf16_g1..4 also run the ResNorm before (x = residual + rms(MLP output) *
// weight) in every block, its loads in this kernel's one L2 round trip after the wait: one launch fewer a
// layer. y is then zeroed by the MLP before (MlpArgs zero).
struct GatedProjArgs {
    const float* x;   // [H]
    const u16* wg;    // gate [P, H] bf16
    const float* bg;  // gate bias [P] or null
    const float* aux; // [P]: the gate's multiplier
    const u16* wp;    // projection [H, P] bf16
    const float* bp;  // projection bias [H] or null (block 0 adds it)
    float* y;         // [H], zero at the wait
    int H, P;
    // g4_resnorm_gated_proj_bf16_g* only (the ResNorm before folded in; plan ResNorm record ip1 = 1): every
    // block makes its input x = rx + rms(rd) * rpw and block 0 writes it to xo (x above is unused).
    const float* rx; // [H] the residual
    const float* rd; // [H] the MLP's output (one output: the fold takes MLPs without replicas)
    const void* rpw; // [H] post-norm weight (rpwdt)
    float* xo;       // [H]
    int rpwdt;
    float eps;
};
static_assert(sizeof(GatedProjArgs) == 104, "cuda_rt::GatedProjArgsH");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// RES: the residual norm before (GatedProjArgs' r* fields) in every block, its result staged in shared
// memory.
template <int G>
__device__ __forceinline__ void gated_proj_res_prologue(const GatedProjArgs& a, const float* pwv, float* s_x,
                                                        float* red) {
    const int H = a.H, Q = H / 4;
    const float4* x4 = (const float4*)a.rx;
    const float4* d4 = (const float4*)a.rd;
    float4 xv[G], dv[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const int q = min((int)threadIdx.x + 256 * g, Q - 1);
        xv[g]       = __ldcg(x4 + q);
        dv[g]       = __ldcg(d4 + q);
    }
    float ss = 0.0f;
#pragma unroll
    for (int g = 0; g < G; ++g)
        if ((int)threadIdx.x + 256 * g < Q)
            ss += dv[g].x * dv[g].x + dv[g].y * dv[g].y + dv[g].z * dv[g].z + dv[g].w * dv[g].w;
    const float r1 = rsqrtf(block_sum(ss, red) / (float)H + a.eps);
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const int q = threadIdx.x + 256 * g;
        if (q >= Q) break;
        float* v        = &xv[g].x;
        const float* dd = &dv[g].x;
#pragma unroll
        for (int c = 0; c < 4; ++c)
            v[c] = v[c] + dd[c] * r1 * pwv[4 * g + c];
        ((float4*)s_x)[q] = xv[g];
        if (blockIdx.x == 0) ((float4*)a.xo)[q] = xv[g];
    }
    __syncthreads();
}
template <int G, bool RES> __device__ __forceinline__ void gated_proj_body(const GatedProjArgs& a) {
    constexpr int GC = 4 * G; // gate chunks (8 values) a lane: H / 256 <= 4 G
    __shared__ float s_act[8];
    __shared__ __align__(16) float s_x[RES ? 1024 * G : 4];
    __shared__ float red[32];
    G4_TRACE_SCOPE(14, a.y);
    const int j = blockIdx.x, H = a.H, P = a.P, lane = threadIdx.x & 31, w = threadIdx.x >> 5,
              row     = 8 * j + w;
    const uint4* grow = (const uint4*)(a.wg + (long)row * H);
    uint4 gk[GC];
#pragma unroll
    for (int i = 0; i < GC; ++i)
        if ((lane + 32 * i) * 8 < H) gk[i] = __ldcs(grow + lane + 32 * i);
    uint4 pk[G][4];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const int r0 = 4 * (threadIdx.x + g * 256);
        if (r0 >= H) break;
#pragma unroll
        for (int k = 0; k < 4; ++k)
            pk[g][k] = __ldcs((const uint4*)(a.wp + (long)(r0 + k) * P + 8 * j));
    }
    const float auxv = lane == 0 ? __ldcg(a.aux + row) : 0.0f;
    float pwv[RES ? 4 * G : 1];
    if constexpr (RES)
#pragma unroll
        for (int k = 0; k < 4 * G; ++k) {
            const int i = 4 * (threadIdx.x + 256 * (k / 4)) + k % 4;
            pwv[k]      = i < H ? loadw(a.rpw, a.rpwdt, i) : 0.0f;
        }
    pdl_begin();
    const float* xs = a.x;
    if constexpr (RES) gated_proj_res_prologue<G>(a, pwv, s_x, red), xs = s_x;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < GC; ++i) {
        const int c = (lane + 32 * i) * 8;
        if (c >= H) break;
        const float4 x0 = *(const float4*)(xs + c), x1 = *(const float4*)(xs + c + 4);
        const u32 wv[4]   = {gk[i].x, gk[i].y, gk[i].z, gk[i].w};
        const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            s = fmaf(__uint_as_float(wv[q] << 16), xv[2 * q], s);
            s = fmaf(__uint_as_float(wv[q] & 0xffff0000u), xv[2 * q + 1], s);
        }
    }
    s = warp_sum(s);
    if (lane == 0) s_act[w] = gelu_tanh(s + (a.bg ? a.bg[row] : 0.0f)) * auxv;
    __syncthreads();
    float av[8];
#pragma unroll
    for (int c = 0; c < 8; ++c)
        av[c] = s_act[c];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const int r0 = 4 * (threadIdx.x + g * 256);
        if (r0 >= H) break;
        float out[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const u32 wv[4] = {pk[g][k].x, pk[g][k].y, pk[g][k].z, pk[g][k].w};
            float o         = 0.0f;
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                o = fmaf(__uint_as_float(wv[q] << 16), av[2 * q], o);
                o = fmaf(__uint_as_float(wv[q] & 0xffff0000u), av[2 * q + 1], o);
            }
            out[k] = o + (a.bp && j == 0 ? a.bp[r0 + k] : 0.0f);
        }
        red_add_v4(a.y + r0, make_float4(out[0], out[1], out[2], out[3]));
    }
}
#define G4_GATED_PROJ(G)                                                                                     \
    extern "C" __global__ void __launch_bounds__(256) g4_gated_proj_bf16_g##G(const GatedProjArgs a) {       \
        gated_proj_body<G, false>(a);                                                                        \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(256)                                                        \
        g4_resnorm_gated_proj_bf16_g##G(const GatedProjArgs a) {                                             \
        gated_proj_body<G, true>(a);                                                                         \
    }
#else
#define G4_GATED_PROJ(G)                                                                                     \
    extern "C" __global__ void g4_gated_proj_bf16_g##G(const GatedProjArgs a) {                              \
        __trap();                                                                                            \
    } /* sm_90 plans only */                                                                                 \
    extern "C" __global__ void g4_resnorm_gated_proj_bf16_g##G(const GatedProjArgs a) {                      \
        __trap();                                                                                            \
    }
#endif
G4_GATED_PROJ(1)
G4_GATED_PROJ(2)
G4_GATED_PROJ(3)
G4_GATED_PROJ(4)
