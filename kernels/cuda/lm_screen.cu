// LM-head screening for greedy decode steps: an int8 bound of every logit, then exact rows.
// ---- LM-head screening for greedy decode steps (runtime/src/cuda/backend.cpp: the decode graph replayed
// ahead of a greedy token). At engine open the bf16 head W [V, K] gets an int8 copy q (bytes q + 128), per
// row s_r = max|w_r| / 127 and d_r >= ||w_r - s_r q_r||_2 (g4_lm_screen_build). g4_lm_screen bounds every
// logit before its softcap (and after the head's LoRA bias, if any): |w_r . x - s_r (q_r . x)| <= d_r
// ||x||_2, plus both fp32 dot products' rounding (each <= gamma_K sum |w_i x_i| <= gamma_K 128 s_r ||x||_1),
// so lo_r <= logit_r <= hi_r, reading one byte a weight instead of two. g4_lm_exact then runs the head GEMV's
// own code (gemv_body, the same lanes and order: bit-equal logits) on every block of rows holding a row with
// hi_r >= max_j lo_j - margin, and takes the argmax of the rows it computed. The full head's argmax (the
// lowest index among equal maxima) is among them: its logit is >= max lo, and the margin (0.05 + 1e-4|T|,
// every row when |T| > 4 cap) keeps rows left out strictly below it after the softcap, whose slope is
// >= sech^2(4) there. Other logits of the row are not written.

// One warp a row: grid ceil(V / 8), block 256.
extern "C" __global__ void __launch_bounds__(256)
    g4_lm_screen_build(const u16* w, int V, int K, u8* q, float* scale, float* bnd) {
    const int r = (int)((blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (r >= V) return;
    const u16* row = w + (long)r * K;
    float mx       = 0.0f;
    for (int i = lane; i < K; i += 32)
        mx = fmaxf(mx, fabsf(bf16f(row[i])));
    mx            = warp_max(mx);
    const float s = mx / 127.0f;
    double e2     = 0.0;
    for (int i = lane; i < K; i += 32) {
        const float v      = bf16f(row[i]);
        const int qi       = s > 0.0f ? max(-127, min(127, __float2int_rn(v / s))) : 0;
        q[(long)r * K + i] = (u8)(qi + 128);
        const double dl    = (double)v - (double)s * (double)qi;
        e2 += dl * dl;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        e2 += __shfl_xor_sync(0xffffffffu, e2, o);
    if (lane == 0) scale[r] = s, bnd[r] = __double2float_ru(sqrt(e2) * (1.0 + 1e-9));
}

// lohi[r] = (lo_r, hi_r); *tmax = max(*tmax, the largest lo as an order-preserving key: lm_key) (g4_lm_exact
// reads it, and its last block resets it to 0). Warp w of the grid takes rows 4w..4w+3,
// then 4 (w + warps)..., its lanes the 16-byte chunks l, l + 32, ... of them; x staged in shared memory
// (swizzled so 8 lanes reading 8 consecutive chunks hit distinct banks). K % 16 == 0, K <= LM_KMAX.
// grid any (the runtime: 4 a multiprocessor), block 256.
#define LM_KMAX 4096
__device__ __forceinline__ int lm_xslot(int c, int v) {
    return 4 * c + (v ^ ((c >> 1) & 3));
}
__device__ __forceinline__ u32 lm_key(float f) { // unsigned order = float order (NaN aside)
    const u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}
__device__ __forceinline__ float lm_unkey(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? k & 0x7fffffffu : ~k);
}
extern "C" __global__ void __launch_bounds__(256)
    g4_lm_screen(const float* x, const u8* q, const float* scale, const float* bnd, const float* bias, int V,
                 int K, float2* lohi, u32* tmax) {
    __shared__ float4 xs[LM_KMAX / 4];
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, gw = (int)((blockIdx.x * (long)blockDim.x + threadIdx.x) >> 5);
    const int nw = (int)((gridDim.x * (long)blockDim.x) >> 5), C = K / 16;
    for (int c = lane; c < C; c += 32) // the warp's first rows, while the previous kernel finishes
        for (int j = 0; j < 4; ++j)
            prefetch_l2(q + (long)min(4 * gw + j, V - 1) * K + 16 * c);
    pdl_begin();
    float s1 = 0.0f, s2 = 0.0f;
    for (int i = threadIdx.x; i < K / 4; i += blockDim.x) {
        const float4 v              = ((const float4*)x)[i];
        xs[lm_xslot(i >> 2, i & 3)] = v;
        s1 += fabsf(v.x) + fabsf(v.y) + fabsf(v.z) + fabsf(v.w);
        s2 += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    s1 = block_sum(s1, red); // its barriers also publish xs
    s2 = block_sum(s2, red);
    // gamma_K (K u / (1 - K u), u = 2^-24) rounded up; ||x||_1 and ||x||_2 less their own rounding.
    const float gam = (float)(K + 8) * 6.0e-8f, xl1 = s1 * (1.0f + 2.0f * gam),
                xl2 = sqrtf(s2) * (1.0f + 2.0f * gam);
    float best      = NEG_INF;
    for (int r0 = 4 * gw; r0 < V; r0 += 4 * nw) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int c = lane; c < C; c += 32) {
            uint4 w[4];
#pragma unroll
            for (int j = 0; j < 4; ++j)
                w[j] = __ldcs((const uint4*)(q + (long)min(r0 + j, V - 1) * K) + c);
            float xv[16];
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                const float4 t = xs[lm_xslot(c, v)];
                xv[4 * v] = t.x, xv[4 * v + 1] = t.y, xv[4 * v + 2] = t.z, xv[4 * v + 3] = t.w;
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const u32 wd[4] = {w[j].x, w[j].y, w[j].z, w[j].w};
#pragma unroll
                for (int e = 0; e < 16; ++e) { // byte e: 2^23 + 128 + q as a float's bits, less that offset
                    const float f =
                        __uint_as_float(__byte_perm(wd[e >> 2], 0x4B000000u, 0x7650u | (e & 3))) - 8388736.0f;
                    acc[j] = fmaf(f, xv[e], acc[j]);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
            acc[j] = warp_sum(acc[j]);
        const float mine = lane == 0 ? acc[0] : lane == 1 ? acc[1] : lane == 2 ? acc[2] : acc[3];
        const int r      = r0 + lane;
        if (lane < 4 && r < V) {
            // + the LoRA bias, added after the dot product as the head GEMV does (one more rounding).
            const float sr = scale[r], b = bias ? bias[r] : 0.0f, a = sr * mine + b;
            const float B =
                (bnd[r] * xl2 + 2.0f * gam * 128.0f * sr * xl1 + 4.0e-7f * (fabsf(a) + fabsf(b))) * 1.0001f +
                1e-30f;
            lohi[r] = make_float2(a - B, a + B);
            best    = fmaxf(best, a - B);
        }
    }
    best = block_max(best, red);
    if (threadIdx.x == 0 && best > NEG_INF) atomicMax(tmax, lm_key(best));
}

// grid kArgmaxBlocks (runtime/src/cuda/workspace.h), block 128; `a` is the LM head's GEMV launch (lanes
// L, one matrix). Block b scans the head launch's blocks [b per, (b + 1) per) (per <= LM_VB_MAX), computes
// those that hold a candidate row, and the token goes out as g4_argmax's does.
#define LM_VB_MAX 1024
template <int L>
__device__ __forceinline__ void lm_exact(const GemvArgs& a, const float2* lohi, u32* tmax, int* ws,
                                         Step* step, int* ids, volatile int* host_tok, int limit) {
    __shared__ int flag[LM_VB_MAX];
    __shared__ int list[LM_VB_MAX];
    __shared__ int wcount[4];
    __shared__ float bv[128];
    __shared__ int bi[128];
    constexpr int RPV = 128 / L * GV_OUT; // rows a block of the head launch
    const int V = a.m[0].n, nvb = (V + RPV - 1) / RPV, per = (nvb + gridDim.x - 1) / gridDim.x;
    const int vb0 = blockIdx.x * per, vb1 = min(nvb, vb0 + per), r0 = vb0 * RPV, r1 = min(V, vb1 * RPV);
    for (int v = threadIdx.x; v < per; v += blockDim.x)
        flag[v] = 0;
    __syncthreads(); // every flag zeroed before any thread sets one
    pdl_begin();
    const float T = lm_unkey(__ldcg(tmax));
    float thr     = T - (0.05f + 1e-4f * fabsf(T));
    if (!(fabsf(T) <= 3.0e38f) || (a.epi == 3 && fabsf(T) > 4.0f * a.cap)) thr = NEG_INF; // every row
    // Two rows' (lo, hi) a 16-byte load, all of a thread's issued before any is used (r0 is even).
    const float4* lh4 = (const float4*)(lohi + r0);
    const int n2      = (r1 - r0 + 1) / 2;
#pragma unroll 4
    for (int i = threadIdx.x; i < n2; i += blockDim.x) {
        const float4 t = __ldcg(lh4 + i);
        const int r    = r0 + 2 * i;
        // Several threads may flag one block: atomic, so that no write races another.
        if (!(t.y < thr)) atomicOr(&flag[(r - r0) / RPV], 1); // hi >= thr, or NaN
        if (r + 1 < r1 && !(t.w < thr)) atomicOr(&flag[(r + 1 - r0) / RPV], 1);
    }
    __syncthreads();
    // The flagged blocks in order, compacted (a ballot per warp, 128 flags a pass).
    int nl = 0;
    for (int c0 = 0; c0 < per; c0 += 128) {
        const int v  = c0 + threadIdx.x;
        const bool f = v < per && flag[v];
        const u32 m  = __ballot_sync(0xffffffffu, f);
        const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
        if (lane == 0) wcount[w] = __popc(m);
        __syncthreads();
        int off = nl;
        for (int i = 0; i < w; ++i)
            off += wcount[i];
        if (f) list[off + __popc(m & ((1u << lane) - 1u))] = vb0 + v;
        nl += wcount[0] + wcount[1] + wcount[2] + wcount[3];
        __syncthreads();
    }
    for (int i = 0; i < nl; ++i) // the candidates' weights into L2 at once
        for (long o = (long)threadIdx.x * 128; o < (long)RPV * a.k * 2; o += (long)blockDim.x * 128)
            prefetch_l2((const char*)a.m[0].w + (long)list[i] * RPV * a.k * 2 + o);
    for (int i = 0; i < nl; ++i) {
        gemv_body<false, L, 1>(a, nullptr, nullptr, list[i]);
        __syncthreads(); // its reduction buffer is reused by the next call; its outputs read below
    }
    float best = NEG_INF;
    int idx    = 0x7fffffff;
    for (int i = threadIdx.x; i < nl * RPV; i += blockDim.x) {
        const int r = list[i / RPV] * RPV + i % RPV;
        if (r < V) argmax_pick(best, idx, __ldcg(a.m[0].y + r), r);
    }
    if (argmax_finish(bv, bi, best, idx, ws, step, ids, host_tok, limit) && threadIdx.x == 0)
        *tmax = 0u; // for the next step
}
#define G4_LM_EXACT(L)                                                                                       \
    extern "C" __global__ void __launch_bounds__(128)                                                        \
        g4_lm_exact_l##L(const GemvArgs a, const float2* lohi, u32* tmax, int* ws, Step* step, int* ids,     \
                         volatile int* host_tok, int limit) {                                                \
        lm_exact<L>(a, lohi, tmax, ws, step, ids, host_tok, limit);                                          \
    }
G4_LM_EXACT(8)
G4_LM_EXACT(16)
G4_LM_EXACT(32)
G4_LM_EXACT(64)
G4_LM_EXACT(128)
