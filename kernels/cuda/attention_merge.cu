// The merge of split attention partials (prefill and decode rows).

// grid (max_rows * heads, ceil(dim / 64)), block 256 or 1024: y = sum_s exp(m_s - M) acc_s / sum_s exp(m_s -
// M) l_s. A block takes 64 columns of one (row, head); its blockDim / 64 groups of 64 threads each sum every
// (blockDim / 64)-th split, so 1024 threads (a full-attention layer's decode at long context: hundreds of
// splits) give each thread a quarter of the dependent loads 256 do. window >= 0: a decode row of
// g4_attn_decode (the layer's window, 0 = none), whose splits past the span's last hold nothing and are
// not read; -1: every split is read (prefill).
#define AD_MIN 8 // g4_attn_decode: keys a split at least
// The decode attention merge's split weights (g4_attention_merge, g4_attn_o_nf4): over a head's partials p
// ([ks][dim + 2]: acc, max, sum), wsplit[k] = exp(max_k - M) for the splits holding keys (0 for the rest),
// *L = sum_k wsplit[k] sum_k, *nact = 1 + the last split holding keys. Up to 32 splits with keys (a short
// span) take one warp and one barrier; more, the whole block in parallel (B: its threads, 0 = blockDim.x).
// red: 32 floats.
template <int B = 0>
__device__ __forceinline__ void merge_split_weights(const float* p, int dim, int ks, float* wsplit,
                                                    float* red, float* L, int* nact) {
    const int D2 = dim + 2;
    if (ks <= 32) {
        if (threadIdx.x < 32) {
            const int k   = threadIdx.x;
            const float l = k < ks ? p[k * D2 + dim + 1] : 0.0f, m = l > 0.0f ? p[k * D2 + dim] : NEG_INF;
            const float M = warp_max(m), wk = l > 0.0f ? __expf(m - M) : 0.0f;
            wsplit[k]      = wk;
            const float Ls = warp_sum(wk * l), last = warp_max(l > 0.0f ? (float)(k + 1) : 0.0f);
            if (k == 0) red[0] = Ls, red[1] = last;
        }
        __syncthreads();
        *L = red[0], *nact = (int)red[1];
    } else {
        float M       = NEG_INF;
        const auto nt = [] { // as the kernels had it: int B, or unsigned blockDim.x
            if constexpr (B != 0)
                return B;
            else
                return blockDim.x;
        }();
        for (int k = threadIdx.x; k < ks; k += nt)
            if (p[k * D2 + dim + 1] > 0.0f) M = fmaxf(M, p[k * D2 + dim]);
        M        = block_max(M, red);
        float Lp = 0.0f, last = 0.0f;
        for (int k = threadIdx.x; k < ks; k += nt) {
            const float l = p[k * D2 + dim + 1], wk = l > 0.0f ? __expf(p[k * D2 + dim] - M) : 0.0f;
            wsplit[k] = wk;
            Lp += wk * l;
            if (l > 0.0f) last = (float)(k + 1);
        }
        *L    = block_sum(Lp, red);
        *nact = (int)block_max(last, red);
        __syncthreads();
    }
}
// One block's merge: head h of row t (p: its splits' partials, y: its output row's head columns).
__device__ __forceinline__ void attention_merge_block(const Step* s, const float* p, int dim, int splits,
                                                      float* y, int window) {
    int ks = splits; // splits that may hold keys
    if (window >= 0) {
        const int pos = s->pos0, lo = window > 0 ? max(0, pos - window + 1) : 0, span = pos - lo + 1;
        const int per = max(AD_MIN, (span + splits - 1) / splits);
        ks            = min(splits, (span + per - 1) / per);
    }
    __shared__ float red[32];
    __shared__ float wsplit[1024]; // splits <= 1024
    __shared__ float accs[16][64];
    float L;
    int nact; // splits past the last non-empty one are skipped
    merge_split_weights(p, dim, ks, wsplit, red, &L, &nact);
    const int NG = blockDim.x >> 6, g = threadIdx.x >> 6, cl = threadIdx.x & 63, c = blockIdx.y * 64 + cl;
    float acc = 0.0f;
    if (c < dim) {
        // Empty splits have weight 0 and unwritten columns: selected away, never multiplied.
        int k = g;
        for (; k + 3 * NG < nact; k += 4 * NG) {
            float v0 = p[k * (dim + 2) + c], v1 = p[(k + NG) * (dim + 2) + c];
            float v2 = p[(k + 2 * NG) * (dim + 2) + c], v3 = p[(k + 3 * NG) * (dim + 2) + c];
            float w0 = wsplit[k], w1 = wsplit[k + NG], w2 = wsplit[k + 2 * NG], w3 = wsplit[k + 3 * NG];
            acc += w0 > 0.0f ? w0 * v0 : 0.0f;
            acc += w1 > 0.0f ? w1 * v1 : 0.0f;
            acc += w2 > 0.0f ? w2 * v2 : 0.0f;
            acc += w3 > 0.0f ? w3 * v3 : 0.0f;
        }
        for (; k < nact; k += NG) {
            float w = wsplit[k];
            if (w > 0.0f) acc += w * p[k * (dim + 2) + c];
        }
    }
    accs[g][cl] = acc;
    __syncthreads();
    if (g == 0 && c < dim) {
        float sum = 0.0f;
        for (int i = 0; i < NG; ++i)
            sum += accs[i][cl];
        y[c] = sum / L;
    }
}
extern "C" __global__ void __launch_bounds__(1024)
    g4_attention_merge(const Step* s, const float* part, int heads, int dim, int splits, float* y, long ldy,
                       int window) {
    G4_TRACE_SCOPE(4, y);
    pdl_begin();
    int t = blockIdx.x / heads, h = blockIdx.x % heads;
    if (t >= s->rows) return;
    attention_merge_block(s, part + (long)blockIdx.x * splits * (dim + 2), dim, splits,
                          y + (long)t * ldy + (long)h * dim, window);
}
