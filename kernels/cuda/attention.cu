// Attention split over the key span (partials per split; attention_merge.cu combines them).
// Attention, split over the key span: grid (max_rows * heads, splits), block 256. Each block
// computes over its slice of keys an unnormalized partial (max m, sum l, acc[dim]) into `part`
// [rows*heads, splits, dim + 2]; g4_attention_merge combines the splits.
extern "C" __global__ void g4_attention_partial(const Step* s, const float* q, long ldq, const void* kc,
                                                const void* vc, int heads, int kv_heads, int dim, int slots,
                                                int window, float scale, int splits, float* part,
                                                float* scores_ws, int max_span, int kvdt) {
    pdl_begin();
    __shared__ float red[32];
    int t = blockIdx.x / heads, h = blockIdx.x % heads;
    if (t >= s->rows) return;
    int pos  = s->pos0 + t;
    int lo   = window > 0 ? max(0, pos - window + 1) : 0;
    int span = pos - lo + 1;
    int per  = (span + splits - 1) / splits;
    int j0 = blockIdx.y * per, j1 = min(span, j0 + per);
    int width = kv_heads * dim, kvh = h / (heads / kv_heads);
    const float* qr = q + (long)t * ldq + (long)h * dim;
    float* sc =
        scores_ws + ((long)blockIdx.x * splits + blockIdx.y) * (long)((max_span + splits - 1) / splits + 1);
    float* out = part + ((long)blockIdx.x * splits + blockIdx.y) * (long)(dim + 2);
    // Scores: one warp per key.
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int j = j0 + wid; j < j1; j += nw) {
        const long kr = (long)((lo + j) % slots) * width + (long)kvh * dim;
        float d       = 0.0f;
        for (int i = lane; i < dim; i += 32)
            d += qr[i] * loadw(kc, kvdt, kr + i);
        d = warp_sum(d);
        if (lane == 0) sc[j - j0] = d * scale;
    }
    __syncthreads();
    float m = NEG_INF;
    for (int j = threadIdx.x; j < j1 - j0; j += blockDim.x)
        m = fmaxf(m, sc[j]);
    m       = block_max(m, red);
    float l = 0.0f;
    for (int j = threadIdx.x; j < j1 - j0; j += blockDim.x) {
        float p = __expf(sc[j] - m);
        sc[j]   = p;
        l += p;
    }
    l = block_sum(l, red);
    __syncthreads();
    // P.V: warp w takes keys j0+w, j0+w+nw, ...; lane holds dims lane, lane+32, ... (dim <= 512);
    // the warps' partial sums are added through shared memory.
    __shared__ float vacc[8][512];
    float acc[16];
#pragma unroll
    for (int c = 0; c < 16; ++c)
        acc[c] = 0.0f;
    for (int j = j0 + wid; j < j1; j += nw) {
        const long vr = (long)((lo + j) % slots) * width + (long)kvh * dim;
        float pj      = sc[j - j0];
#pragma unroll
        for (int c = 0; c < 16; ++c)
            if (lane + 32 * c < dim) acc[c] += pj * loadw(vc, kvdt, vr + lane + 32 * c);
    }
#pragma unroll
    for (int c = 0; c < 16; ++c)
        if (lane + 32 * c < dim && wid < 8) vacc[wid][lane + 32 * c] = acc[c];
    __syncthreads();
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < min(nw, 8); ++w)
            a += vacc[w][i];
        out[i] = a;
    }
    if (threadIdx.x == 0) out[dim] = m, out[dim + 1] = l;
}
