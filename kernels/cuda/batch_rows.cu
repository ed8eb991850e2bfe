// The per-sequence ops of a batched decode step (rope, KV store, decode attention and its merge) for all the
// step's rows in one launch: row j is session j's one token, at its own position and in its own KV cache.
// rec: the step's records, rec[0] the shared ops' (rows = n), rec[1 + j] row j's session's (one row at its
// position); kv_delta[j]: row j's KV arena minus the first row's (the caches passed are the first row's).

// RoPE of row j at its session's position. grid (n, heads), block dim / 2.
extern "C" __global__ void g4_rope_rows(const Step* rec, float* x, long ldx, const float* inv_freq, int dim) {
    pdl_begin();
    const int t = blockIdx.x, half = dim >> 1, k = threadIdx.x;
    if (t >= rec[0].rows || k >= half) return;
    float* xr = x + (long)t * ldx + (long)blockIdx.y * dim;
    float ang = (float)rec[1 + t].pos0 * inv_freq[k];
    float cs, sn;
    sincosf(ang, &sn, &cs);
    float x0 = xr[k], x1 = xr[k + half];
    xr[k]        = x0 * cs - x1 * sn;
    xr[k + half] = x1 * cs + x0 * sn;
}

// KV store of row j into its session's caches at slot pos % slots. grid (n), block 256.
extern "C" __global__ void g4_kv_store_rows(const Step* rec, const long long* kv_delta, const float* k,
                                            long ldk, const float* v, long ldv, char* kc, char* vc, int width,
                                            int slots, int kvdt) {
    pdl_begin();
    const int t = blockIdx.x;
    if (t >= rec[0].rows) return;
    const long slot = (long)(rec[1 + t].pos0 % slots) * width;
    char *kt = kc + kv_delta[t], *vt = vc + kv_delta[t];
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        kv_put(kt, kvdt, slot + i, k[(long)t * ldk + i]);
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        kv_put(vt, kvdt, slot + i, v[(long)t * ldv + i]);
}

// g4_attn_decode[_bf16] for row z = blockIdx.z: q row z, session z's caches and position, partials at
// part + z * part_rows. grid (kv heads, splits, n), block 256.
#define G4_ATTN_DECODE_ROWS(NAME, BF16)                                                                      \
    extern "C" __global__ void __launch_bounds__(256)                                                        \
        NAME(const Step* rec, const long long* kv_delta, const float* q, long ldq, const char* kc,           \
             const char* vc, int heads, int kvh, int dim, int slots, int window, float scale, int splits,    \
             float* part, long part_rows) {                                                                  \
        __shared__ __align__(16) float qs[4096];                                                             \
        __shared__ __align__(16) float sc[16][AD_KEYS];                                                      \
        __shared__ float mh[16], lh[16];                                                                     \
        const int z = blockIdx.z;                                                                            \
        attn_decode_body<BF16, false, 0>(rec + 1 + z, q + (long)z * ldq, kc + kv_delta[z], vc + kv_delta[z], \
                                         heads, kvh, dim, slots, window, scale, splits,                      \
                                         part + (long)z * part_rows, qs, sc, mh, lh);                        \
    }
G4_ATTN_DECODE_ROWS(g4_attn_decode_rows, false)
G4_ATTN_DECODE_ROWS(g4_attn_decode_rows_bf16, true)

// g4_attention_merge of the decode partials above: head blockIdx.x of row z = blockIdx.z into y row z.
// grid (heads, ceil(dim / 64), n), block 1024.
extern "C" __global__ void __launch_bounds__(1024)
    g4_attention_merge_rows(const Step* rec, const float* part, long part_rows, int heads, int dim,
                            int splits, float* y, long ldy, int window) {
    pdl_begin();
    const int z = blockIdx.z, h = blockIdx.x;
    attention_merge_block(rec + 1 + z, part + (long)z * part_rows + (long)h * splits * (dim + 2), dim, splits,
                          y + (long)z * ldy + (long)h * dim, window);
}
