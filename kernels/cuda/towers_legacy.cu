// ---- audio tower on the GPU (runtime/src/cuda/audio.cpp; the reference is the CPU tower,
// runtime/src/towers/audio.cpp, whose loops these kernels follow one to one). Launched outside the decode
// graph; rows are the clip's frames (T after the two stride-2 convs). Matmuls go through g4_tc_gemm_bf16 /
// g4_matmul_bf16 and the ClippableLinear bounds through g4_clamp; everything here is fp32.

// One SSCP layer (AudioTower::conv_layer): Conv2d 3x3, stride 2, padding 1, no bias, over [time, freq] with
// channels last; LayerNorm over the c_out channels (mean and biased variance of the conv outputs, eps,
// weight, no bias); ReLU. in [.., f_in, c_in], rows at or past t_in_valid read as zero (HF's mask); w
// [c_out, c_in, 3, 3] of dtype wdt; norm [c_out] of dtype ndt; out [gridDim.x, f_out, c_out]. One block per
// output position (t, f): the 3x3 input patch is staged in shared memory (kh, kw, c_in order, zeros outside
// the input), one warp per output channel sums over the weight row in its own order. grid (t_out, f_out),
// block 256, dynamic shared memory (9 * c_in + c_out) floats.
extern "C" __global__ void g4_at_conv(const float* in, int t_in_valid, int f_in, int c_in, const void* w,
                                      int wdt, const void* norm, int ndt, float eps, float* out, int f_out,
                                      int c_out) {
    extern __shared__ float at_sm[];
    float* patch = at_sm;            // [3, 3, c_in]
    float* ys    = at_sm + 9 * c_in; // [c_out]
    __shared__ float red[32];
    const int t = blockIdx.x, f = blockIdx.y, kc = 9 * c_in;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int e = threadIdx.x; e < kc; e += blockDim.x) {
        const int r = e / c_in, ci = e % c_in;
        const int ti = 2 * t - 1 + r / 3, fi = 2 * f - 1 + r % 3;
        patch[e] = ti >= 0 && ti < t_in_valid && fi >= 0 && fi < f_in ? in[((long)ti * f_in + fi) * c_in + ci]
                                                                      : 0.0f;
    }
    __syncthreads();
    for (int co = warp; co < c_out; co += nw) {
        float acc = 0.0f;
        for (int e = lane; e < kc; e += 32) { // e = ci * 9 + r: w's own layout
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
        out[((long)t * f_out + f) * c_out + co] = fmaxf(0.0f, ((ys[co] - mean) * r) * loadw(norm, ndt, co));
}

// RMS norm of each row's first dim values with the audio tower's optional pre-clamp (audio.cpp rms()):
// v = clip > 0 ? min(max(x, -clip), clip) : x; y = v * (mean(v^2) + eps)^-1/2, times w (dtype wdt) when w is
// given. y may be x. grid (rows), block 256.
extern "C" __global__ void g4_at_rms(const float* x, long ldx, const void* w, int wdt, float* y, long ldy,
                                     int dim, float eps, float clip) {
    __shared__ float red[32];
    const float* xr = x + (long)blockIdx.x * ldx;
    float* yr       = y + (long)blockIdx.x * ldy;
    float ss        = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = clip > 0.0f ? fminf(fmaxf(xr[i], -clip), clip) : xr[i];
        ss += v * v;
    }
    ss            = block_sum(ss, red);
    const float r = powf(ss / (float)dim + eps, -0.5f);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = clip > 0.0f ? fminf(fmaxf(xr[i], -clip), clip) : xr[i];
        yr[i]         = w ? v * r * loadw(w, wdt, i) : v * r;
    }
}

// In place: x[r, c] = x[r, c] / (1 + exp(-x[r, c])) (SiLU) for c < cols. grid (rows, ceil(cols / 256)),
// block 256.
extern "C" __global__ void g4_at_silu(float* x, long ldx, int cols) {
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    const float v        = x[(long)r * ldx + c];
    x[(long)r * ldx + c] = v / (1.0f + expf(-v));
}

// Residual: x[r, c] = n[r, c] * f + x[r, c] for c < cols (f: residual_weight for the feed-forwards, 1
// elsewhere), x and n [rows, cols]. grid (rows, ceil(cols / 256)), block 256.
extern "C" __global__ void g4_at_residual(float* x, const float* n, int cols, float f) {
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    const long i = (long)r * cols + c;
    x[i]         = n[i] * f + x[i];
}

// y[r, c] += b[c] (dtype bdt) for c < cols (output_proj's bias). grid (rows, ceil(cols / 256)), block 256.
extern "C" __global__ void g4_at_bias(float* y, long ldy, const void* b, int bdt, int cols) {
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c < cols) y[(long)r * ldy + c] += loadw(b, bdt, c);
}

// Query and key scaling of the chunked attention, q and k [rows, H] in place: q[r, i] = q[r, i] * q_scale *
// softplus(per_dim_scale[i % D]) (softplus as torch, threshold 20, in double as the CPU tower), k[r, i] =
// k[r, i] * k_scale. grid (rows, ceil(H / 256)), block 256.
extern "C" __global__ void g4_at_qk_scale(float* q, float* k, int H, int D, const void* pds, int pdt,
                                          float q_scale, float k_scale) {
    const int r = blockIdx.x, i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= H) return;
    const double p = loadw(pds, pdt, i % D);
    const float sp = (float)(p > 20.0 ? p : log1p(exp(p)));
    const long at  = (long)r * H + i;
    q[at]          = q[at] * q_scale * sp;
    k[at]          = k[at] * k_scale;
}

// Chunked local attention with relative positions and the logit cap (AudioTower::attention's loop), one warp
// per (query t, head h): keys j = max(0, t - W + 1) .. t; logit_j = cap * tanh((q.k_j + q.rel_p) / cap) with
// p = W - (t - j) (no q.rel_p term when p is outside [0, n_rel)); softmax over those keys in fp32 (max, then
// the sum of exp in key order); o = sum_j (e_j / sum) v_j in key order. q, k, v, o [rows, H], rel [n_rel, H],
// head h at columns h*D. grid (rows, heads), block 32, dynamic shared memory W floats (the logits).
extern "C" __global__ void g4_at_attention(const float* q, const float* k, const float* v, const float* rel,
                                           int H, int D, int W, int n_rel, float cap, float* o) {
    extern __shared__ float at_sm[];
    float* logit = at_sm; // [W]
    const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    const int j0 = max(0, t - W + 1), nk = t - j0 + 1;
    const float* qh = q + (long)t * H + (long)h * D;
    float mx        = NEG_INF;
    for (int j = j0; j <= t; ++j) {
        const float* kh = k + (long)j * H + (long)h * D;
        const int p     = W - (t - j);
        const float* rh = p >= 0 && p < n_rel ? rel + (long)p * H + (long)h * D : nullptr;
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
            acc += logit[j - j0] / sum * v[(long)j * H + (long)h * D + d];
        o[(long)t * H + (long)h * D + d] = acc;
    }
}

// GLU of linear_start's output: g[r, i] = a / (1 + exp(-b)), a = x[r, i], b = x[r, H + i], x [rows, 2H], g
// [rows, H]. grid (rows, ceil(H / 256)), block 256.
extern "C" __global__ void g4_at_glu(const float* x, int H, float* g) {
    const int r = blockIdx.x, i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= H) return;
    const float a = x[(long)r * 2 * H + i], b = x[(long)r * 2 * H + H + i];
    g[(long)r * H + i] = a / (1.0f + expf(-b));
}

// Causal depthwise conv1d over time (the light conv): c[t, i] = sum over j = 0..K-1 with s = t - (K - 1) + j
// >= 0 of w[i, j] * g[s, i], j ascending; w [H, 1, K] of dtype wdt, g and c [rows, H]. grid (rows, ceil(H /
// 256)), block 256.
extern "C" __global__ void g4_at_dwconv(const float* g, const void* w, int wdt, int H, int K, float* c) {
    const int t = blockIdx.x, i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= H) return;
    float acc = 0.0f;
    for (int j = 0; j < K; ++j) {
        const int s = t - (K - 1) + j;
        if (s >= 0) acc += loadw(w, wdt, (long)i * K + j) * g[(long)s * H + i];
    }
    c[(long)t * H + i] = acc;
}
