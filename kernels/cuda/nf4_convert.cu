// Conversions for the cuBLAS prefill tier: NF4 blob to bf16, fp32 activations to bf16, a bias row.
// ---- prefill helpers for the cuBLAS tier: NF4 blob -> bf16 matrix (same rounding as the tensor-core
// kernel), fp32 activations -> bf16, and a bias row added after the GEMM.
// grid ceil(n / 32 / 256), block 256: one 16-byte chunk (32 values, half an NF4 block) per thread.
extern "C" __global__ void g4_nf4_to_bf16(const u8* codes, const void* absmax, const float* absmax2,
                                          const float* offset, const float* code2, long n, u16* out,
                                          int tiled_rows) {
    __shared__ float cb[16];
    nf4_codebook(cb);
    pdl_begin();
    long c = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c * 32 >= n) return;
    // tiled_rows = H > 0: a kQuantTiled32 matrix [H, I] (the fused decode MLP's down or attention-o
    // projection), read in place: thread c still writes output chunk c (row r = c / (I / 32), columns 32 jj
    // ..: coalesced stores), whose codes sit at chunk jj * H + r and absmax at (jj / 2) * H + r. The same
    // values as after g4_nf4_untile32.
    long blk = (c * 32) >> 6, stored = blk, src = c; // blk: the row-major block (absmax2's index)
    if (tiled_rows > 0) {
        const long H = tiled_rows, I = n / H, r = c / (I / 32), jj = c % (I / 32);
        src    = jj * H + r;
        stored = (jj / 2) * H + r;
    }
    uint4 pk     = *(const uint4*)(codes + src * 16);
    float am     = nf4_absmax_value(nf4_absmax_raw(absmax, absmax2, stored), absmax2, offset, code2, blk);
    u32 words[4] = {pk.x, pk.y, pk.z, pk.w}, o[16];
#pragma unroll
    for (int wd = 0; wd < 4; ++wd)
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            u32 byte      = (words[wd] >> (8 * b)) & 0xff;
            o[wd * 4 + b] = pack2(cb[byte >> 4] * am, cb[byte & 15] * am);
        }
    uint4* dst = (uint4*)(out + c * 32);
#pragma unroll
    for (int v = 0; v < 4; ++v)
        dst[v] = make_uint4(o[4 * v], o[4 * v + 1], o[4 * v + 2], o[4 * v + 3]);
}

// A kQuantTiled32 matrix [H, I] (g4_mlp_nf4's down projection) back in the row-major layout, codes and
// absmax (u8 when dq, else f32) into scratch copies, for every other use of it (prefill): the NF4 kernels
// then run exactly as on an untiled plan. grid ceil(H * I / 32 / 256), block 256: output chunk c (row
// c / (I / 32), columns 32 jj ..) per thread, coalesced stores; its codes sit at chunk jj * H + r.
extern "C" __global__ void g4_nf4_untile32(const u8* codes_t, const void* absmax_t, int dq, int H, int I,
                                           u8* codes, void* absmax) {
    pdl_begin();
    const long c = (long)blockIdx.x * blockDim.x + threadIdx.x, per_row = I / 32;
    if (c >= (long)H * per_row) return;
    const long r = c / per_row, jj = c % per_row;
    ((uint4*)codes)[c] = ((const uint4*)codes_t)[jj * H + r];
    if (jj % 2 == 0) {
        const long to = r * (I / 64) + jj / 2, from = (jj / 2) * H + r;
        if (dq)
            ((u8*)absmax)[to] = ((const u8*)absmax_t)[from];
        else
            ((float*)absmax)[to] = ((const float*)absmax_t)[from];
    }
}

// grid (max_rows, ceil(cols / 1024)), block 256: 4 consecutive values per thread. cols % 4 == 0.
extern "C" __global__ void g4_f32_to_bf16(const Step* s, const float* x, long ldx, u16* y, int cols) {
    pdl_begin();
    int t = blockIdx.x;
    if (t >= s->rows) return;
    int i = (blockIdx.y * blockDim.x + threadIdx.x) * 4;
    if (i >= cols) return;
    float4 v                          = *(const float4*)(x + (long)t * ldx + i);
    *(uint2*)(y + (long)t * cols + i) = make_uint2(pack2(v.x, v.y), pack2(v.z, v.w));
}

// grid (max_rows, ceil(n / 256)), block 256.
extern "C" __global__ void g4_add_bias(const Step* s, float* y, long ldy, const float* bias, int n) {
    pdl_begin();
    int t = blockIdx.x, i = blockIdx.y * blockDim.x + threadIdx.x;
    if (t >= s->rows || i >= n) return;
    y[(long)t * ldy + i] += bias[i];
}
