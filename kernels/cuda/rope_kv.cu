// Rotary position embedding in place and the KV cache store.
// RoPE in place (rotate-half pairing). grid (max_rows, heads), block half = dim/2 (<= 1024).
extern "C" __global__ void g4_rope(const Step* s, float* x, long ldx, const float* inv_freq, int dim) {
    G4_TRACE_SCOPE(11, x);
    pdl_begin();
    int t = blockIdx.x;
    if (t >= s->rows) return;
    int half = dim >> 1, k = threadIdx.x;
    if (k >= half) return;
    float* xr = x + (long)t * ldx + (long)blockIdx.y * dim;
    float ang = (float)(s->pos0 + t) * inv_freq[k];
    float cs, sn;
    sincosf(ang, &sn, &cs);
    float x0 = xr[k], x1 = xr[k + half];
    xr[k]        = x0 * cs - x1 * sn;
    xr[k + half] = x1 * cs + x0 * sn;
}

// Element i of a KV cache of dtype kvdt: stored rounded to nearest even (bf16); read with loadw.
__device__ __forceinline__ void kv_put(void* c, int kvdt, long i, float x) {
    if (kvdt == G4_DT_BF16)
        ((u16*)c)[i] = (u16)bf16_bits(x);
    else
        ((float*)c)[i] = x;
}

// KV store: rows of k, v into slot (pos0+t) % slots. grid (max_rows), block 256.
extern "C" __global__ void g4_kv_store(const Step* s, const float* k, long ldk, const float* v, long ldv,
                                       void* kc, void* vc, int width, int slots, int kvdt) {
    G4_TRACE_SCOPE(12, kc);
    pdl_begin();
    int t = blockIdx.x;
    if (t >= s->rows) return;
    long slot = (long)((s->pos0 + t) % slots) * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        kv_put(kc, kvdt, slot + i, k[(long)t * ldk + i]);
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        kv_put(vc, kvdt, slot + i, v[(long)t * ldv + i]);
}
