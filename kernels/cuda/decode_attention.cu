// Decode attention: the q/k/v post-projection (norms, RoPE, cache store) and attention over the KV
// ring split across the key span.
// ---- q/k/v after the projections (decode row): q head: rms * q_norm, RoPE, in place; k head: rms *
// k_norm, RoPE, into its cache slot; v head: rms (no weight) into its cache slot (caches of dtype
// kvdt). grid (heads [+ 2 * kv_heads]), block max(32, dim / 2): thread i owns the rotate-half pair
// (i, i + dim / 2).
extern "C" __global__ void g4_qkv_post(const Step* s, float* q, const void* qw, const float* k,
                                       const void* kw, const float* v, int wdt, const float* inv_freq,
                                       void* kc, void* vc, int heads, int kvh, int dim, int slots, float eps,
                                       int kvdt) {
    G4_TRACE_SCOPE(5, qw);
    pdl_begin();
    __shared__ float red[32];
    int b = blockIdx.x, half = dim >> 1, i = threadIdx.x;
    int kind         = b < heads ? 0 : b < heads + kvh ? 1 : 2;
    int h            = kind == 0 ? b : kind == 1 ? b - heads : b - heads - kvh;
    const float* src = kind == 0 ? q + (long)h * dim : kind == 1 ? k + (long)h * dim : v + (long)h * dim;
    const void* w    = kind == 0 ? qw : kind == 1 ? kw : nullptr;
    bool on          = i < half;
    float x0 = on ? src[i] : 0.0f, x1 = on ? src[i + half] : 0.0f;
    float r = powf(block_sum(x0 * x0 + x1 * x1, red) / (float)dim + eps, -0.5f);
    if (!on) return;
    float y0 = x0 * r * (w ? loadw(w, wdt, i) : 1.0f), y1 = x1 * r * (w ? loadw(w, wdt, i + half) : 1.0f);
    if (kind < 2) {
        float ang = (float)s->pos0 * inv_freq[i];
        float cs, sn;
        sincosf(ang, &sn, &cs);
        float o0 = y0 * cs - y1 * sn, o1 = y1 * cs + y0 * sn;
        y0 = o0, y1 = o1;
    }
    if (kind == 0) {
        q[(long)h * dim + i] = y0, q[(long)h * dim + i + half] = y1;
    } else {
        void* cache = kind == 1 ? kc : vc;
        long slot   = (long)(s->pos0 % slots) * kvh * dim + (long)h * dim;
        kv_put(cache, kvdt, slot + i, y0);
        kv_put(cache, kvdt, slot + i + half, y1);
    }
}

// ---- decode attention over the KV ring, split across the key span; one block per (kv head, split)
// computes all heads of the group so each key and value row is read once. Writes the unnormalized
// partials (acc[dim], max, sum) that g4_attention_merge combines. Keys per split: max(AD_MIN, ceil(span
// / splits)) <= AD_KEYS (the compiler sizes splits). grid (kv_heads, splits), block 256; heads per
// group <= 16, dim <= 512, heads per group * dim <= 4096; a bf16 cache (kvdt) also dim % 8 == 0.
// fp32 cache: lane / thread c reads element c (+ 32 or 256 steps); bf16 cache: a lane reads 8 keys'
// elements as one 16-byte load, a thread two adjacent values as one 32-bit load.
#define AD_KEYS 256
// One step of the decode scores' 16-head warp sums: a lane keeps N of 2N heads' partials (the upper half
// where lane bit O is set) and adds its partner's partials of those.
template <int O, int N> __device__ __forceinline__ void head_sum_step(float* v, int lane) {
    const bool up = lane & O;
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const float send = up ? v[i] : v[i + N], keep = up ? v[i + N] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
}
// The warp sums of HS heads' partials (HS a power of two <= 16): log2(HS) halving steps from lane bit
// 16 down, then plain sums over the lane bits left. Lane l ends with head sum_k bit(4 - k) of l * HS /
// 2^(k+1), in v[0].
template <int HS, int O = 16> __device__ __forceinline__ void head_sums(float* v, int lane) {
    if constexpr (HS > 1) {
        head_sum_step<O, HS / 2>(v, lane);
        head_sums<HS / 2, O / 2>(v, lane);
    } else {
#pragma unroll
        for (int o = O; o >= 1; o >>= 1)
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
    }
}
template <int HS> __device__ __forceinline__ int head_of_lane(int lane) {
    int h = 0;
#pragma unroll
    for (int k = 0, w = HS / 2; w >= 1; ++k, w >>= 1)
        h += ((lane >> (4 - k)) & 1) * w;
    return h;
}
// Heads per KV group in the decode attention kernels. A plan whose decode attention layers all have one
// group size compiles its kernels with -DG4_AD_HPG=<it> (compiler/cuda_compile.cpp), so the head loops are
// unrolled to exactly that count with no runtime predicates; otherwise up to 16 heads, predicated on the
// runtime count. The runtime checks that a plan's layers match (backend.cpp decode_attention_fits).
#ifdef G4_AD_HPG
#define AD_HS G4_AD_HPG
#define AD_FIXED 1
#else
#define AD_HS 16
#define AD_FIXED 0
#endif
// QkvAttn (the compiler's CUDA schedule): g4_qkv_post's work done by the decode attention kernel itself.
// Every block norms and rotates its group's q heads from the raw projection into shared memory (q is not
// written back); the block holding the newest key (index span - 1) also norms and rotates k, norms v and
// stores both into the cache slot of pos before it reads the split's keys. Same arithmetic as g4_qkv_post.
struct AttnPost {
    const float* k;        // raw k [kvh * dim], or null (a KV-shared layer: only q)
    const float* v;        // raw v [kvh * dim]
    const void* qw;        // q_norm weight [dim] (dtype wdt)
    const void* kw;        // k_norm weight [dim]
    const float* inv_freq; // RoPE [dim / 2]
    int wdt;
    float eps;
};
// P.V of one split of attn_decode_body and its partials: NC columns a thread (1: dim <= 256, 2: dim <= 512),
// HS head slots of which hpg are real. sc: the split's probabilities [HS][AD_KEYS], zero-padded to a
// multiple of 8 keys; jn: the key whose value row is in pst + 2048 (QkvAttn), or -1.
template <bool kBf16, bool kPost, int HS, int NC>
__device__ __forceinline__ void
attn_pv(const void* vc, const float* pst, float (*sc)[AD_KEYS], const float* mh, const float* lh, float* part,
        int g, int hpg, int dim, int width, int splits, int j0, int j1, int jn, int lo_slot, int slots) {
    constexpr int ES     = kBf16 ? 2 : 4;
    constexpr bool pairs = kBf16 && NC == 2;
    auto col = [&](int i) { return pairs ? 2 * (int)threadIdx.x + i : (int)threadIdx.x + 256 * i; };
    float acc[NC][HS];
#pragma unroll
    for (int i = 0; i < NC; ++i)
#pragma unroll
        for (int h = 0; h < HS; ++h)
            acc[i][h] = 0.0f;
    // Eight keys' values are loaded before they are used (up to 16 loads in flight a thread); keys past
    // j1 read the last key's row and have probability 0.
    for (int jb = j0; jb < j1; jb += 8) {
        float v[8][NC];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int jv     = min(jb + u, j1 - 1);
            const int rs     = lo_slot + jv >= slots ? lo_slot + jv - slots : lo_slot + jv;
            const char* vrow = kPost && jv == jn ? (const char*)(pst + 2048)
                                                 : (const char*)vc + ((long)rs * width + (long)g * dim) * ES;
            if (pairs) {
                const u32 w = col(0) < dim ? *(const u32*)((const u16*)vrow + col(0)) : 0u;
                v[u][0] = __uint_as_float(w << 16), v[u][1] = __uint_as_float(w & 0xffff0000u);
            } else {
#pragma unroll
                for (int i = 0; i < NC; ++i)
                    v[u][i] = col(i) >= dim ? 0.0f
                              : kBf16       ? bf16f(((const u16*)vrow)[col(i)])
                                            : ((const float*)vrow)[col(i)];
            }
        }
#pragma unroll
        for (int h = 0; h < HS; ++h) {
            if (h >= hpg) break;
            const float4 p0 = *(const float4*)&sc[h][jb - j0], p1 = *(const float4*)&sc[h][jb - j0 + 4];
            const float p[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
            for (int u = 0; u < 8; ++u)
#pragma unroll
                for (int i = 0; i < NC; ++i)
                    acc[i][h] += p[u] * v[u][i];
        }
    }
    G4_TRACE_MARK(3);
#pragma unroll
    for (int h = 0; h < HS; ++h) {
        if (h >= hpg) break;
        float* out = part + ((long)(g * hpg + h) * splits + blockIdx.y) * (dim + 2);
#pragma unroll
        for (int i = 0; i < NC; ++i)
            if (col(i) < dim) out[col(i)] = acc[i][h];
        if (threadIdx.x == 0) out[dim] = mh[h], out[dim + 1] = lh[h];
    }
}
// DIMC: the head dim as a compile-time constant (the _d256 / _d512 kernels), or 0 (dim_ at run time).
template <bool kBf16, bool kPost = false, int DIMC = 0>
__device__ __forceinline__ void
attn_decode_body(const Step* s, const float* q, const void* kc, const void* vc, int heads, int kvh, int dim_,
                 int slots, int window, float scale, int splits, float* part, float* qs, float (*sc)[AD_KEYS],
                 float* mh, float* lh, const AttnPost& pa = AttnPost{}, float* pst = nullptr) {
    G4_TRACE_SCOPE(3u | (kPost ? 16u : 0u) | (kBf16 ? 32u : 0u) | (u32)(window > 0) << 6, kc);
    const int dim    = DIMC ? DIMC : dim_;
    constexpr int HS = AD_HS; // head slots a group
    const int g = blockIdx.x, hpg = AD_FIXED ? AD_HS : heads / kvh, width = kvh * dim;
    const int pos  = s->pos0;
    const int lo   = window > 0 ? max(0, pos - window + 1) : 0;
    const int span = pos - lo + 1;
    const int per  = max(AD_MIN, (span + splits - 1) / splits);
    const int j0 = blockIdx.y * per, j1 = min(span, j0 + per);
    // No keys in this split (blockIdx.y >= ceil(span / per)): nothing to do, and nothing to write either,
    // since both merges (g4_attention_merge with window >= 0, g4_attn_o_nf4) read only the splits that may
    // hold keys. Leaving before the wait frees the block's slot at once (a full layer's 1024 splits at a
    // short depth).
    if (j0 >= j1) return;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    constexpr int ES = kBf16 ? 2 : 4; // bytes per cache element
    // Ring slot of key j (0 <= j < span <= slots): one division here instead of one a key (a runtime
    // modulo is a chain of ~15 dependent instructions).
    const int lo_slot = lo % slots;
    auto ring         = [&](int j) { return lo_slot + j >= slots ? lo_slot + j - slots : lo_slot + j; };
    { // the split's K/V rows into L2 while the previous kernel drains (rows before pos are not written this
      // step)
        const int lines = dim * ES / 128; // 128-byte lines per row
        for (int e = threadIdx.x; e < (j1 - j0) * lines * 2; e += blockDim.x) {
            int j = j0 + e / (lines * 2), l = e % (lines * 2);
            prefetch_l2((const char*)(l < lines ? kc : vc) + ((long)ring(j) * width + (long)g * dim) * ES +
                        (l % lines) * 128);
        }
    }
    // QkvAttn: the norm weights and RoPE's cos/sin into shared memory before the wait (they do not depend
    // on the previous kernel). pst: q weight [512], k weight [512], cos [256], sin [256], then the newest
    // k and v rows in the cache's dtype [2][512 floats].
    const int jn =
        kPost && pa.k && j0 <= span - 1 && span - 1 < j1 ? span - 1 : -1; // this block stores the newest key
    if (kPost && j0 < j1) {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) {
            pst[i] = loadw(pa.qw, pa.wdt, i);
            if (jn >= 0) pst[512 + i] = loadw(pa.kw, pa.wdt, i);
        }
        for (int i = threadIdx.x; i < dim / 2; i += blockDim.x)
            sincosf((float)pos * pa.inv_freq[i], &pst[1280 + i], &pst[1024 + i]);
        __syncthreads();
    }
    pdl_begin();
    if (!kPost) {
        for (int e = threadIdx.x; e < hpg * dim; e += blockDim.x)
            qs[e] = q[(long)g * hpg * dim + e];
    } else { // one warp a row (the group's q heads, then k and v), its rows' loads issued together;
             // lane: pairs (i, i + dim / 2), i = lane + 32 m
        const int half   = dim >> 1;
        const int rows   = hpg + (jn >= 0 ? 2 : 0);
        const long slot  = (long)(pos % slots) * width + (long)g * dim;
        constexpr int RW = 3; // rows a warp at most: (16 heads + k + v) / 8 warps
        float x0[RW][8], x1[RW][8];
#pragma unroll
        for (int t = 0; t < RW; ++t) {
            const int r      = wid + t * nw;
            const float* src = r >= rows ? nullptr
                               : r < hpg ? q + (long)(g * hpg + r) * dim
                                         : (r == hpg ? pa.k : pa.v) + (long)g * dim;
#pragma unroll
            for (int m = 0; m < 8; ++m) {
                const int i = lane + 32 * m;
                x0[t][m] = src && i < half ? src[i] : 0.0f, x1[t][m] = src && i < half ? src[i + half] : 0.0f;
            }
        }
#pragma unroll
        for (int t = 0; t < RW; ++t) {
            const int r = wid + t * nw;
            if (r >= rows) break;
            const int kind = r < hpg ? 0 : r - hpg + 1; // 0 q, 1 k, 2 v
            const float* w = kind == 0 ? pst : pst + 512;
            float ss       = 0.0f;
#pragma unroll
            for (int m = 0; m < 8; ++m)
                ss += x0[t][m] * x0[t][m] + x1[t][m] * x1[t][m];
            const float rr = powf(warp_sum(ss) / (float)dim + pa.eps, -0.5f);
            void* nrow     = pst + 1536 + (kind - 1) * 512; // kind 1, 2: the newest k / v row, cache dtype
#pragma unroll
            for (int m = 0; m < 8; ++m) {
                const int i = lane + 32 * m;
                if (i >= half) break;
                float y0 = x0[t][m] * rr * (kind < 2 ? w[i] : 1.0f),
                      y1 = x1[t][m] * rr * (kind < 2 ? w[i + half] : 1.0f);
                if (kind < 2) {
                    const float cs = pst[1024 + i], sn = pst[1280 + i];
                    const float o0 = y0 * cs - y1 * sn, o1 = y1 * cs + y0 * sn;
                    y0 = o0, y1 = o1;
                }
                if (kind == 0) {
                    qs[r * dim + i] = y0, qs[r * dim + i + half] = y1;
                } else {
                    void* cache = (void*)(kind == 1 ? kc : vc);
                    kv_put(cache, kBf16 ? G4_DT_BF16 : G4_DT_F32, slot + i, y0);
                    kv_put(cache, kBf16 ? G4_DT_BF16 : G4_DT_F32, slot + i + half, y1);
                    kv_put(nrow, kBf16 ? G4_DT_BF16 : G4_DT_F32, i, y0);
                    kv_put(nrow, kBf16 ? G4_DT_BF16 : G4_DT_F32, i + half, y1);
                }
            }
        }
    }
    __syncthreads();
    G4_TRACE_MARK(0);
    // Scores: one warp per key, all heads of the group; the heads' warp reductions interleave.
    for (int j = j0 + wid; j < j1; j += nw) {
        const long kr = (long)ring(j) * width + (long)g * dim;
        // QkvAttn: the newest key from shared memory (this block stored it; a global read-back is an L2 trip)
        const char* krow = kPost && j == jn ? (const char*)(pst + 1536) : (const char*)kc + kr * ES;
        float v[HS];
        if (kBf16) { // lane: elements 8 * lane + 256 * c .. + 7
            uint4 kw[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int e = 8 * lane + 256 * c;
                kw[c]       = e < dim ? *(const uint4*)((const u16*)krow + e) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int h = 0; h < HS; ++h) {
                v[h] = 0.0f;
                if (h < hpg)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int e = 8 * lane + 256 * c;
                        if (e < dim) {
                            const float4 q0   = *(const float4*)&qs[h * dim + e],
                                         q1   = *(const float4*)&qs[h * dim + e + 4];
                            const u32 w[4]    = {kw[c].x, kw[c].y, kw[c].z, kw[c].w};
                            const float qv[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
                            for (int i = 0; i < 4; ++i) {
                                v[h] += qv[2 * i] * __uint_as_float(w[i] << 16);
                                v[h] += qv[2 * i + 1] * __uint_as_float(w[i] & 0xffff0000u);
                            }
                        }
                    }
            }
        } else {
            const float* kf = (const float*)krow;
            float kv[16];
#pragma unroll
            for (int c = 0; c < 16; ++c)
                kv[c] = lane + 32 * c < dim ? kf[lane + 32 * c] : 0.0f;
#pragma unroll
            for (int h = 0; h < HS; ++h) {
                v[h] = 0.0f;
                if (h < hpg)
#pragma unroll
                    for (int c = 0; c < 16; ++c)
                        if (lane + 32 * c < dim) v[h] += qs[h * dim + lane + 32 * c] * kv[c];
            }
        }
        // HS warp sums in HS - 1 + 5 - log2(HS) shuffles: each step halves the heads a lane keeps,
        // adding the partner's partials of those heads (constant indices throughout: left to the
        // unroller, v went to local memory); lanes (32 / HS of them) end with each head's sum.
        head_sums<HS>(v, lane);
        const int hl = head_of_lane<HS>(lane);
        if (!(lane & (32 / HS - 1)) && hl < hpg) sc[hl][j - j0] = v[0] * scale;
    }
    __syncthreads();
    G4_TRACE_MARK(1);
    // Softmax numerators per head: one warp per head; the row is zero-padded to a multiple of 8 keys for
    // P.V's vector loads.
    const int nk = j1 - j0, nk8 = (nk + 7) & ~7; // nk8 <= AD_KEYS
    for (int h = wid; h < hpg; h += nw) {
        float m = NEG_INF;
        for (int j = lane; j < nk; j += 32)
            m = fmaxf(m, sc[h][j]);
        m       = warp_max(m);
        float l = 0.0f;
        for (int j = lane; j < nk8; j += 32) {
            const float p = j < nk ? __expf(sc[h][j] - m) : 0.0f;
            sc[h][j]      = p;
            l += p;
        }
        l = warp_sum(l);
        if (lane == 0) mh[h] = m, lh[h] = l;
    }
    __syncthreads();
    G4_TRACE_MARK(2);
    // P.V: thread owns columns c = tid (+ 256 when dim > 256) for every head of the group; with a bf16
    // cache and dim > 256 the adjacent pair 2 tid, 2 tid + 1 (one 32-bit load). At dim <= 256 the pair
    // mapping would leave half the threads idle and double the others' sequential work. The column count
    // is a block-uniform branch, so each path multiplies only real columns.
    if (dim > 256)
        attn_pv<kBf16, kPost, HS, 2>(vc, pst, sc, mh, lh, part, g, hpg, dim, width, splits, j0, j1, jn,
                                     lo_slot, slots);
    else
        attn_pv<kBf16, kPost, HS, 1>(vc, pst, sc, mh, lh, part, g, hpg, dim, width, splits, j0, j1, jn,
                                     lo_slot, slots);
}
// One kernel per cache dtype (kvdt must match the name): on sm_90 the fp32 body needs 96 registers, the
// bf16 one 80, and a kernel holding both runs at the larger count (2 blocks per SM instead of 3).
#define G4_ATTN_DECODE(NAME, BF16, DIMC)                                                                     \
    extern "C" __global__ void __launch_bounds__(256)                                                        \
        NAME(const Step* s, const float* q, const void* kc, const void* vc, int heads, int kvh, int dim,     \
             int slots, int window, float scale, int splits, float* part, int kvdt) {                        \
        __shared__ __align__(16) float qs[4096];                                                             \
        __shared__ __align__(16) float sc[16][AD_KEYS];                                                      \
        __shared__ float mh[16], lh[16];                                                                     \
        attn_decode_body<BF16, false, DIMC>(s, q, kc, vc, heads, kvh, dim, slots, window, scale, splits,     \
                                            part, qs, sc, mh, lh);                                           \
    }
G4_ATTN_DECODE(g4_attn_decode, false, 0)
G4_ATTN_DECODE(g4_attn_decode_bf16, true, 0)
// The same with the q/k/v post-projection folded in (q: the raw projection; AttnPost above). 3 blocks an
// SM on sm_90 (80 registers, no spills); elsewhere 43 KiB of shared memory allows 2 of 100 KiB anyway.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define AD_POST_BLOCKS 3
#else
#define AD_POST_BLOCKS 2
#endif
#define G4_ATTN_DECODE_POST(NAME, BF16, DIMC)                                                                \
    extern "C" __global__ void __launch_bounds__(256, AD_POST_BLOCKS)                                        \
        NAME(const Step* s, const float* q, const void* kc, const void* vc, int heads, int kvh, int dim,     \
             int slots, int window, float scale, int splits, float* part, int kvdt, const AttnPost pa) {     \
        __shared__ __align__(16) float qs[4096];                                                             \
        __shared__ __align__(16) float sc[16][AD_KEYS];                                                      \
        __shared__ float mh[16], lh[16];                                                                     \
        __shared__ __align__(16) float pst[2560];                                                            \
        attn_decode_body<BF16, true, DIMC>(s, q, kc, vc, heads, kvh, dim, slots, window, scale, splits,      \
                                           part, qs, sc, mh, lh, pa, pst);                                   \
    }
G4_ATTN_DECODE_POST(g4_attn_decode_post, false, 0)
G4_ATTN_DECODE_POST(g4_attn_decode_post_bf16, true, 0)
// With the group size fixed (G4_AD_HPG), the same four kernels also for head dims 256 and 512 as constants
// (_d256: sliding layers, _d512: full ones): the post-projection's and the scores' element loops then hold
// only the real elements (no predicated-off loads) and P.V one column layout. The runtime takes them for
// layers of that dim when the plan has them (older plans and the generic module do not). Only for groups of 8
// (H 1536): at groups of 4 (H 2560) they were faster at depth 16 but 0.3-1.0% slower a token at depth 4096 on
// an H200
// (`g4 bench -d 16,4096`), so its plans keep the kernels above.
#if defined(G4_AD_HPG) && G4_AD_HPG >= 8
G4_ATTN_DECODE(g4_attn_decode_d256, false, 256)
G4_ATTN_DECODE(g4_attn_decode_bf16_d256, true, 256)
G4_ATTN_DECODE(g4_attn_decode_d512, false, 512)
G4_ATTN_DECODE(g4_attn_decode_bf16_d512, true, 512)
G4_ATTN_DECODE_POST(g4_attn_decode_post_d256, false, 256)
G4_ATTN_DECODE_POST(g4_attn_decode_post_bf16_d256, true, 256)
G4_ATTN_DECODE_POST(g4_attn_decode_post_d512, false, 512)
G4_ATTN_DECODE_POST(g4_attn_decode_post_bf16_d512, true, 512)
#endif
