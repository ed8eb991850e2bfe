// RMSNorm over groups of columns, the elementwise ops, and the grouped scale-norm-add of a decode row.
// RMSNorm over groups of `dim` of the first `cols` columns. grid (max_rows, cols/dim), block 256.
extern "C" __global__ void g4_rms_norm(const Step* s, int mode, const float* x, long ldx, const void* w,
                                       int wdt, float* y, long ldy, int dim, float eps) {
    G4_TRACE_SCOPE(8, y);
    pdl_begin();
    __shared__ float red[32];
    int t = blockIdx.x;
    if (t >= rows_of(s, mode)) return;
    const float* xr = x + (long)(t + in_row0(s, mode)) * ldx + (long)blockIdx.y * dim;
    float* yr       = y + (long)t * ldy + (long)blockIdx.y * dim;
    float ss        = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss      = block_sum(ss, red);
    float r = powf(ss / (float)dim + eps, -0.5f);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        yr[i] = xr[i] * r * (w ? loadw(w, wdt, i) : 1.0f);
}

// Elementwise over [rows, cols]: op 0 add, 1 gelu_tanh(a)*b, 2 scale, 3 softcap. grid (max_rows,
// ceil(cols/256)), block 256.
extern "C" __global__ void g4_elementwise(const Step* s, int mode, int op, const float* a, long lda,
                                          const float* b, long ldb, float* y, long ldy, int cols, float f,
                                          const void* scalar, int sdt) {
    G4_TRACE_SCOPE(9 | op << 8, y);
    pdl_begin();
    int t = blockIdx.x;
    if (t >= rows_of(s, mode)) return;
    int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    long r0  = in_row0(s, mode);
    float av = a[(t + r0) * lda + i], out;
    if (op == 0)
        out = av + b[(t + r0) * ldb + i];
    else if (op == 1) {
        float g = 0.5f * av * (1.0f + tanhf(0.7978845608028654f * (av + 0.044715f * av * av * av)));
        out     = g * b[(t + r0) * ldb + i];
    } else if (op == 2)
        out = av * f * (scalar ? loadw(scalar, sdt, 0) : 1.0f);
    else
        out = f * tanhf(av / f);
    y[(long)t * ldy + i] = out;
}

// A grouped scale-norm-add of a decode row (schedule record GroupNormAdd): ctx = ctx * s1; ctx = rms(ctx) * w
// over each group of P; out = (ctx + tok) * s2, the Scale, RmsNorm, Add and Scale ops in one kernel with
// their operation order (the generic kernels': powf for the norm). ctx [N], tok [N], out [N] (N = groups x P,
// row 0); w [P] (f32 or bf16). grid N / P (one group a block), block P rounded up to 32 (P <= 1024).
extern "C" __global__ void g4_group_norm_add(const float* ctx, const void* w, int wdt, const float* tok,
                                             float* out, int P, float s1, float eps, float s2) {
    G4_TRACE_SCOPE(9 | 4 << 8, out);
    __shared__ float red[32];
    const int i    = threadIdx.x;
    const long at  = (long)blockIdx.x * P + i;
    const float wv = i < P ? loadw(w, wdt, i) : 0.0f;
    pdl_begin();
    const float c = i < P ? ctx[at] * s1 : 0.0f, t = i < P ? tok[at] : 0.0f;
    const float r = powf(block_sum(c * c, red) / (float)P + eps, -0.5f);
    if (i < P) out[at] = (c * r * wv + t) * s2;
}
