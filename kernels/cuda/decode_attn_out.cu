// The decode attention merge and the output projection in one kernel.
// ---- the decode attention's merge and the o projection in one kernel (sm_90; schedule record AttnO) ----
// Block j takes columns 32j .. 32j + 31 of the attention output (one head's: dim % 32 == 0): it merges them
// from g4_attn_decode's split partials as g4_attention_merge does, multiplies the o weight's K-slice j for
// every output row and adds the products into y with red.global.add.v4.f32, as g4_mlp_nf4's down half does.
// The slice's codes and scales (H x 16 bytes) are loaded before the programmatic wait: they do not depend on
// the attention, which then runs beside them. y must be zero at the wait (the ResNorm before the layer's
// q/k/v projection zeroes it); the adds land in a varying order (g4 compile --deterministic keeps the merge
// kernel and the o GEMV). The o weight is stored tiled (Nf4Tiled). grid K / 32, block AO_B, dynamic shared
// memory GV_WIDE_BYTES (the wide pair table); G = ceil(H / (4 AO_B)) groups of 4 rows a thread
// (g4_attn_o_nf4_g1..4). H % 4 == 0, K % 64 == 0.
struct AttnOArgs {
    const Step* s;
    const float* part; // [heads][splits][dim + 2]: acc[dim], max, sum of each split
    Nf4Tiled o;        // o weight [H, K = heads * dim], tiled
    const float* bias; // o's LoRA bias [H] or null (block 0 adds it)
    float* y;          // [H], zero at the wait
    int H, K, dim, splits, window;
};
#define AO_B 256
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
template <int G> __device__ __forceinline__ void attn_o_body(const AttnOArgs& a, float2* tab) {
    __shared__ float wsplit[1024]; // splits <= 1024
    __shared__ float accs[AO_B / 32][32];
    __shared__ float red[32];
    __shared__ float s_act[32];
    G4_TRACE_SCOPE(13, a.y);
    const int j = blockIdx.x, H = a.H, K = a.K;
    const u8* tile = a.o.codes + (long)j * H * 16;
    const int c64  = j / 2;
    uint4 pk[G][4]; // rows 4 (tid + g AO_B) .. + 3 of the slice
    u32 raw[G][4];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const int r0 = 4 * (threadIdx.x + g * AO_B);
        if (r0 >= H) break;
#pragma unroll
        for (int k = 0; k < 4; ++k)
            pk[g][k] = __ldcs((const uint4*)(tile + (long)(r0 + k) * 16));
        a.o.raw4(c64, H, r0, raw[g]);
    }
    nf4_pair_table_b<AO_B, true>(tab);
    pdl_begin();
    // The merge of this block's 32 columns (g4_attention_merge's arithmetic for a decode row).
    const int dim = a.dim, D2 = dim + 2, pos = a.s->pos0;
    const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0, span = pos - lo + 1;
    const int per = max(AD_MIN, (span + a.splits - 1) / a.splits);
    const int ks  = min(a.splits, (span + per - 1) / per); // splits that may hold keys
    const int h = j * 32 / dim, c0 = j * 32 % dim;
    const float* p = a.part + (long)h * a.splits * D2;
    float L;
    int nact;
    merge_split_weights<AO_B>(p, dim, ks, wsplit, red, &L, &nact);
    constexpr int NG = AO_B / 32;
    const int grp = threadIdx.x >> 5, cl = threadIdx.x & 31;
    float acc = 0.0f;
    int k     = grp;
    for (; k + 3 * NG < nact; k += 4 * NG) { // four loads in flight, added in split order
        const float v0 = p[k * D2 + c0 + cl], v1 = p[(k + NG) * D2 + c0 + cl];
        const float v2 = p[(k + 2 * NG) * D2 + c0 + cl], v3 = p[(k + 3 * NG) * D2 + c0 + cl];
        const float w0 = wsplit[k], w1 = wsplit[k + NG], w2 = wsplit[k + 2 * NG], w3 = wsplit[k + 3 * NG];
        acc += w0 > 0.0f ? w0 * v0 : 0.0f;
        acc += w1 > 0.0f ? w1 * v1 : 0.0f;
        acc += w2 > 0.0f ? w2 * v2 : 0.0f;
        acc += w3 > 0.0f ? w3 * v3 : 0.0f;
    }
    for (; k < nact; k += NG) {
        const float w = wsplit[k];
        if (w > 0.0f) acc += w * p[k * D2 + c0 + cl];
    }
    accs[grp][cl] = acc;
    __syncthreads();
    if (threadIdx.x < 32) {
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < AO_B / 32; ++i)
            sum += accs[i][threadIdx.x];
        s_act[threadIdx.x] = sum / L;
    }
    __syncthreads();
    float av[32];
#pragma unroll
    for (int c = 0; c < 32; ++c)
        av[c] = s_act[c];
    const u32 lane_off = (threadIdx.x & 15) * 8;
    const char* tb     = (const char*)tab;
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const int r0 = 4 * (threadIdx.x + g * AO_B);
        if (r0 >= H) break;
        float out[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const u32 words[4] = {pk[g][k].x, pk[g][k].y, pk[g][k].z, pk[g][k].w};
            const long b       = (long)(r0 + k) * (K / 64) + c64; // the row-major block (absmax2's index)
            out[k]             = nf4_chunk_dot<true>(words, av, tb, lane_off) * a.o.scale(raw[g][k], b);
            if (a.bias && j == 0) out[k] += a.bias[r0 + k];
        }
        red_add_v4(a.y + r0, make_float4(out[0], out[1], out[2], out[3]));
    }
}
#define G4_ATTN_O(G)                                                                                         \
    extern "C" __global__ void __launch_bounds__(AO_B, 2) g4_attn_o_nf4_g##G(const AttnOArgs a) {            \
        extern __shared__ float2 ao_tab[];                                                                   \
        attn_o_body<G>(a, ao_tab);                                                                           \
    }
#else
#define G4_ATTN_O(G)                                                                                         \
    extern "C" __global__ void g4_attn_o_nf4_g##G(const AttnOArgs a) {                                       \
        __trap();                                                                                            \
    } // scheduled on sm_90 plans only
#endif
G4_ATTN_O(1)
G4_ATTN_O(2)
G4_ATTN_O(3)
G4_ATTN_O(4)
