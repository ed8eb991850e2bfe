// The fused residual add and norms of a decode row.
// ---- residual + norms (decode row): x_out = (x + rms(d) * pw) * f * s; xn = rms(x_out) * prew.
// d null: no residual branch (x_out = x * f * s); x_out null: not written; xn null: not computed.
// Same operation order as the unfused RmsNorm / Add / Scale / RmsNorm ops. One block: its cost is
// latency, so every load is issued up front (the weights before the wait on the previous kernel) and
// the two reductions are the only round trips. grid 1, block a multiple of 32 from H / 8 to 1024 (the
// runtime: 512, 1024 for H > 2048), H <= 8 x block. Rows of H % 4 == 0 at 16-byte aligned addresses
// (every plan's hidden size) take the float4 path: one or two 16-byte loads of x and of d a thread after
// the wait, instead of up to eight branch-guarded scalar loads of each (H 1536 decode +4.7%, H 2560 +6.9% on
// an H200); the scalar path takes the rest.
// dr (or null): nrep replicas [nrep, H] of d (g4_mlp_nf4's nrep, at most RN_MAX), added to it in replica
// order and zeroed by the thread that read them.
__device__ __forceinline__ void resnorm_scalar(const float* x, const float* d, const void* pw, int pwdt,
                                               const void* sc, int sdt, float f, float* xout,
                                               const void* prew, int prewdt, float* xn, int H, float eps,
                                               float* red, float* dr, int nrep) {
    float xv[8], dv[8], pwv[8], prv[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        int i  = threadIdx.x + j * blockDim.x;
        pwv[j] = d && i < H ? loadw(pw, pwdt, i) : 0.0f;
        prv[j] = xn && prew && i < H ? loadw(prew, prewdt, i) : 1.0f;
    }
    const float sv = sc ? loadw(sc, sdt, 0) : 1.0f;
    pdl_begin();
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        int i = threadIdx.x + j * blockDim.x;
        xv[j] = i < H ? x[i] : 0.0f;
        dv[j] = d && i < H ? d[i] : 0.0f;
        if (d && dr && i < H)
            for (int r = 0; r < nrep; ++r) {
                dv[j] += dr[(long)r * H + i];
                dr[(long)r * H + i] = 0.0f;
            }
        ss += dv[j] * dv[j];
    }
    G4_TRACE_MARK(0);
    const float r1 = d ? powf(block_sum(ss, red) / (float)H + eps, -0.5f) : 0.0f;
    G4_TRACE_MARK(1);
    float ss2 = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < H) {
            float v = xv[j];
            if (d) v = v + dv[j] * r1 * pwv[j];
            if (sc || f != 1.0f) v = v * f * sv;
            xv[j] = v;
            if (xout) xout[i] = v;
            ss2 += v * v;
        }
    }
    G4_TRACE_MARK(2);
    if (!xn) return;
    const float r2 = powf(block_sum(ss2, red) / (float)H + eps, -0.5f);
    G4_TRACE_MARK(3);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < H) xn[i] = xv[j] * r2 * prv[j];
    }
}
// float4 q = threadIdx.x + j * blockDim.x holds elements 4q..4q+3 (RV a thread: H <= 4 * RV * blockDim.x).
// zero (16-byte aligned, or null): the next kernel's output, zeroed float4 by float4 by the thread that owns
// it right after its loads of x and d, which may alias it (each element is read by its owner only): no
// barrier before the zeroing, and no store loop after the norm.
template <int RV>
__device__ __forceinline__ void resnorm_vec4(const float* x, const float* d, const void* pw, int pwdt,
                                             const void* sc, int sdt, float f, float* xout, const void* prew,
                                             int prewdt, float* xn, int H, float eps, float* red, float* zero,
                                             float* dr, int nrep) {
    float4 xv[RV], dv[RV];
    float pwv[RV * 4], prv[RV * 4];
    const int Q = H / 4;
#pragma unroll
    for (int j = 0; j < RV; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int i    = 4 * (threadIdx.x + j * blockDim.x) + c;
            pwv[4 * j + c] = d && i < H ? loadw(pw, pwdt, i) : 0.0f;
            prv[4 * j + c] = xn && prew && i < H ? loadw(prew, prewdt, i) : 1.0f;
        }
    const float sv = sc ? loadw(sc, sdt, 0) : 1.0f;
    pdl_begin();
    // Clamped indices (always valid) and no branch around a load: both loads go out before any use.
    const float4* x4 = (const float4*)x;
    const float4* d4 = (const float4*)(d ? d : x);
#pragma unroll
    for (int j = 0; j < RV; ++j) {
        const int q = min((int)(threadIdx.x + j * blockDim.x), Q - 1);
        xv[j]       = __ldcg(x4 + q);
        dv[j]       = __ldcg(d4 + q);
    }
    if (d && dr) { // d's replicas (g4_mlp_nf4's nrep), added in replica order and zeroed by their reader
        // RV 1 (every plan's launch): all loads out before the first add (one round trip); RV 2: as registers
        // allow.
        constexpr int RB = RV == 1 ? RN_MAX : 1;
        for (int r0 = 0; r0 < nrep; r0 += RB) {
            float4 t[RB][RV];
#pragma unroll
            for (int r = 0; r < RB; ++r)
#pragma unroll
                for (int j = 0; j < RV; ++j)
                    t[r][j] = r0 + r < nrep ? __ldcg((const float4*)dr + (long)(r0 + r) * Q +
                                                     min((int)(threadIdx.x + j * blockDim.x), Q - 1))
                                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int r = 0; r < RB; ++r)
#pragma unroll
                for (int j = 0; j < RV; ++j)
                    if (r0 + r < nrep)
                        dv[j].x += t[r][j].x, dv[j].y += t[r][j].y, dv[j].z += t[r][j].z,
                            dv[j].w += t[r][j].w;
        }
#pragma unroll
        for (int r = 0; r < RN_MAX; ++r)
            if (r < nrep)
#pragma unroll
                for (int j = 0; j < RV; ++j)
                    if (threadIdx.x + j * blockDim.x < Q)
                        ((float4*)dr)[(long)r * Q + threadIdx.x + j * blockDim.x] =
                            make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (zero)
#pragma unroll
        for (int j = 0; j < RV; ++j)
            if (threadIdx.x + j * blockDim.x < Q)
                ((float4*)zero)[threadIdx.x + j * blockDim.x] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < RV; ++j) {
        const bool in = threadIdx.x + j * blockDim.x < Q;
        if (!in) xv[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (!in || !d) dv[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ss += dv[j].x * dv[j].x + dv[j].y * dv[j].y + dv[j].z * dv[j].z + dv[j].w * dv[j].w;
    }
    G4_TRACE_MARK(0);
    const float r1 = d ? rsqrtf(block_sum(ss, red) / (float)H + eps) : 0.0f;
    G4_TRACE_MARK(1);
    float ss2 = 0.0f;
#pragma unroll
    for (int j = 0; j < RV; ++j) {
        const int q = threadIdx.x + j * blockDim.x;
        if (q < Q) {
            float* v        = &xv[j].x;
            const float* dd = &dv[j].x;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                float t = v[c];
                if (d) t = t + dd[c] * r1 * pwv[4 * j + c];
                if (sc || f != 1.0f) t = t * f * sv;
                v[c] = t;
                ss2 += t * t;
            }
            if (xout) ((float4*)xout)[q] = xv[j];
        }
    }
    G4_TRACE_MARK(2);
    if (!xn) return;
    const float r2 = rsqrtf(block_sum(ss2, red) / (float)H + eps);
    G4_TRACE_MARK(3);
#pragma unroll
    for (int j = 0; j < RV; ++j) {
        const int q = threadIdx.x + j * blockDim.x;
        if (q < Q)
            ((float4*)xn)[q] = make_float4(xv[j].x * r2 * prv[4 * j], xv[j].y * r2 * prv[4 * j + 1],
                                           xv[j].z * r2 * prv[4 * j + 2], xv[j].w * r2 * prv[4 * j + 3]);
    }
}
// REP: dr / nrep are read (g4_resnorm_rep, after an MLP with output replicas); g4_resnorm compiles without
// them (their code measured 56 -> 64 registers and a stack frame in the one kernel).
template <bool REP>
__device__ __forceinline__ void resnorm_entry(const float* x, const float* d, const void* pw, int pwdt,
                                              const void* sc, int sdt, float f, float* xout, const void* prew,
                                              int prewdt, float* xn, int H, float eps, float* zero, float* dr,
                                              int nrep) {
    G4_TRACE_SCOPE(2, pw ? pw : prew);
    __shared__ float red[32];
    if (!REP) dr = nullptr, nrep = 0;
    const unsigned long long at = (unsigned long long)x | (unsigned long long)d | (unsigned long long)xout |
                                  (unsigned long long)xn | (unsigned long long)zero | (unsigned long long)dr;
    if ((H & 3) == 0 && (at & 15) == 0 && H <= 4 * (int)blockDim.x)
        return resnorm_vec4<1>(x, d, pw, pwdt, sc, sdt, f, xout, prew, prewdt, xn, H, eps, red, zero, dr,
                               nrep);
    if ((H & 3) == 0 && (at & 15) == 0 && H <= 8 * (int)blockDim.x)
        return resnorm_vec4<2>(x, d, pw, pwdt, sc, sdt, f, xout, prew, prewdt, xn, H, eps, red, zero, dr,
                               nrep);
    resnorm_scalar(x, d, pw, pwdt, sc, sdt, f, xout, prew, prewdt, xn, H, eps, red, dr, nrep);
    if (zero) { // the next kernel's output (g4_mlp_nf4 adds into it), after every read above (it may alias d)
        __syncthreads();
        for (int i = threadIdx.x; i < H; i += blockDim.x)
            zero[i] = 0.0f;
    }
}
extern "C" __global__ void __launch_bounds__(1024)
    g4_resnorm(const float* x, const float* d, const void* pw, int pwdt, const void* sc, int sdt, float f,
               float* xout, const void* prew, int prewdt, float* xn, int H, float eps, float* zero) {
    resnorm_entry<false>(x, d, pw, pwdt, sc, sdt, f, xout, prew, prewdt, xn, H, eps, zero, nullptr, 0);
}
extern "C" __global__ void __launch_bounds__(1024)
    g4_resnorm_rep(const float* x, const float* d, const void* pw, int pwdt, const void* sc, int sdt, float f,
                   float* xout, const void* prew, int prewdt, float* xn, int H, float eps, float* zero,
                   float* dr, int nrep) {
    resnorm_entry<true>(x, d, pw, pwdt, sc, sdt, f, xout, prew, prewdt, xn, H, eps, zero, dr, nrep);
}
// g4_resnorm with a second buffer zeroed at its end: zero2 [H], the output of a fused MLP that runs its own
// ResNorm (the _r kernels; plan ResNorm record ip2 = zero2's tensor + 1). zero2 shares no bytes with what
// this kernel reads or writes, nor with what the launches between it and that MLP touch (the compiler
// checks).
extern "C" __global__ void __launch_bounds__(1024)
    g4_resnorm_z2(const float* x, const float* d, const void* pw, int pwdt, const void* sc, int sdt, float f,
                  float* xout, const void* prew, int prewdt, float* xn, int H, float eps, float* zero,
                  float* zero2) {
    resnorm_entry<false>(x, d, pw, pwdt, sc, sdt, f, xout, prew, prewdt, xn, H, eps, zero, nullptr, 0);
    if ((H & 3) == 0 && ((unsigned long long)zero2 & 15) == 0)
        for (int i = threadIdx.x; i < H / 4; i += blockDim.x)
            ((float4*)zero2)[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    else
        for (int i = threadIdx.x; i < H; i += blockDim.x)
            zero2[i] = 0.0f;
}
