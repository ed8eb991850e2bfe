// CUDA kernels of the ops over frame sequences (kernels/ops.h Conv2dNormRelu .. AddScaled; the reference is
// kernels/ref/sequence_ops.cpp). Row counts come from the launch's grid (the host knows them); fp32
// arithmetic throughout, F32/BF16 weights read through loadw. Launch code: runtime/src/cuda/sequence_ops.cpp.

// Conv2dNormRelu: 3x3 stride-2 pad-1 conv over [rows, f_in, c_in] (channels last), LayerNorm over the c_out
// channels (mean and biased variance, eps, weight, no bias), ReLU. Rows at or past in_rows read as zero.
// One block per output position (t, f): the 3x3 patch staged in shared memory (kh, kw, c_in order), one warp
// per output channel summing over the weight row in its own (c_in, kh, kw) order. grid (out_rows, f_out),
// block 256, dynamic shared memory (9 * c_in + c_out) floats.
extern "C" __global__ void g4_conv2d_norm_relu(const float* x, int in_rows, int f_in, int c_in, const void* w,
                                               int wdt, const void* norm, int ndt, float eps, float* y,
                                               int f_out, int c_out) {
    extern __shared__ float cv_sm[];
    float* patch = cv_sm;            // [3, 3, c_in]
    float* ys    = cv_sm + 9 * c_in; // [c_out]
    __shared__ float red[32];
    const int t = blockIdx.x, f = blockIdx.y, kc = 9 * c_in;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int e = threadIdx.x; e < kc; e += blockDim.x) {
        const int r = e / c_in, ci = e % c_in;
        const int ti = 2 * t - 1 + r / 3, fi = 2 * f - 1 + r % 3;
        patch[e] =
            ti >= 0 && ti < in_rows && fi >= 0 && fi < f_in ? x[((long)ti * f_in + fi) * c_in + ci] : 0.0f;
    }
    __syncthreads();
    for (int co = warp; co < c_out; co += nw) {
        float acc = 0.0f;
        for (int e = lane; e < kc; e += 32) {
            const int ci = e / 9, r = e % 9;
            acc += loadw(w, wdt, (long)co * kc + e) * patch[r * c_in + ci];
        }
        acc = warp_sum(acc);
        if (lane == 0) ys[co] = acc;
    }
    __syncthreads();
    float s = 0.0f;
    for (int co = threadIdx.x; co < c_out; co += blockDim.x)
        s += ys[co];
    const float mean = block_sum(s, red) / (float)c_out;
    float q          = 0.0f;
    for (int co = threadIdx.x; co < c_out; co += blockDim.x)
        q += (ys[co] - mean) * (ys[co] - mean);
    const float var = block_sum(q, red) / (float)c_out;
    const float r   = 1.0f / sqrtf(var + eps);
    for (int co = threadIdx.x; co < c_out; co += blockDim.x)
        y[((long)t * f_out + f) * c_out + co] = fmaxf(0.0f, ((ys[co] - mean) * r) * loadw(norm, ndt, co));
}

// Silu: y = x / (1 + exp(-x)). grid (rows, ceil(cols / 256)), block 256.
extern "C" __global__ void g4_silu(const float* x, long ldx, float* y, long ldy, int cols) {
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    const float v        = x[(long)r * ldx + c];
    y[(long)r * ldy + c] = v / (1.0f + expf(-v));
}

// SigmoidMul: y = a / (1 + exp(-b)). grid (rows, ceil(cols / 256)), block 256.
extern "C" __global__ void g4_sigmoid_mul(const float* a, long lda, const float* b, long ldb, float* y,
                                          long ldy, int cols) {
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    y[(long)r * ldy + c] = a[(long)r * lda + c] / (1.0f + expf(-b[(long)r * ldb + c]));
}

// CausalConv1d: y[t, i] = sum over j = 0..k-1 with s = t - (k - 1) + j >= 0 of w[i, j] * x[s, i], j
// ascending; w [cols, k] of dtype wdt. grid (rows, ceil(cols / 256)), block 256.
extern "C" __global__ void g4_causal_conv1d(const float* x, long ldx, const void* w, int wdt, float* y,
                                            long ldy, int cols, int k) {
    const int t = blockIdx.x, i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
        const int s = t - (k - 1) + j;
        if (s >= 0) acc += loadw(w, wdt, (long)i * k + j) * x[(long)s * ldx + i];
    }
    y[(long)t * ldy + i] = acc;
}

// LocalAttention, one warp per (query t, head h): keys j = max(0, t - W + 1) .. t; logit_j = cap *
// tanh((q.k_j
// + q.rel_p) / cap) with p = W - (t - j) (no rel term when p >= n_rel); softmax over those keys in fp32 (max,
// then the sum of exp in key order); y = sum_j (e_j / sum) v_j in key order. Head h at columns h * D. grid
// (rows, heads), block 32, dynamic shared memory W floats (the logits).
extern "C" __global__ void g4_local_attention(const float* q, long ldq, const float* k, long ldk,
                                              const float* v, long ldv, const float* rel, long ldr, float* y,
                                              long ldy, int D, int W, int n_rel, float cap) {
    extern __shared__ float la_sm[];
    float* logit = la_sm; // [W]
    const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    const int j0 = max(0, t - W + 1), nk = t - j0 + 1;
    const float* qh = q + (long)t * ldq + (long)h * D;
    float mx        = NEG_INF;
    for (int j = j0; j <= t; ++j) {
        const float* kh = k + (long)j * ldk + (long)h * D;
        const int p     = W - (t - j);
        const float* rh = p >= 0 && p < n_rel ? rel + (long)p * ldr + (long)h * D : nullptr;
        float ac = 0.0f, bd = 0.0f;
        for (int d = lane; d < D; d += 32) {
            ac += qh[d] * kh[d];
            if (rh) bd += qh[d] * rh[d];
        }
        ac            = warp_sum(ac);
        bd            = warp_sum(bd);
        const float s = tanhf((ac + bd) / cap) * cap;
        if (lane == 0) logit[j - j0] = s;
        mx = fmaxf(mx, s);
    }
    __syncwarp();
    if (lane == 0)
        for (int i = 0; i < nk; ++i)
            logit[i] = expf(logit[i] - mx);
    __syncwarp();
    float sum = 0.0f;
    for (int i = 0; i < nk; ++i)
        sum += logit[i];
    for (int d = lane; d < D; d += 32) {
        float acc = 0.0f;
        for (int j = j0; j <= t; ++j)
            acc += logit[j - j0] / sum * v[(long)j * ldv + (long)h * D + d];
        y[(long)t * ldy + (long)h * D + d] = acc;
    }
}

// SoftplusScale: y[r, i] = x[r, i] * s * softplus(w[i % dim]) (softplus as torch, threshold 20, in double).
// grid (rows, ceil(cols / 256)), block 256.
extern "C" __global__ void g4_softplus_scale(const float* x, long ldx, float* y, long ldy, int cols, int dim,
                                             const void* w, int wdt, float s) {
    const int r = blockIdx.x, i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    const double p       = loadw(w, wdt, i % dim);
    const float sp       = (float)(p > 20.0 ? p : log1p(exp(p)));
    y[(long)r * ldy + i] = x[(long)r * ldx + i] * s * sp;
}

// AddScaled: y = b * s + a. grid (rows, ceil(cols / 256)), block 256.
extern "C" __global__ void g4_add_scaled(const float* a, long lda, const float* b, long ldb, float* y,
                                         long ldy, int cols, float s) {
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    y[(long)r * ldy + c] = b[(long)r * ldb + c] * s + a[(long)r * lda + c];
}
