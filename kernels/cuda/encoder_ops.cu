// CUDA kernels of the encoder-program ops over rows of one input (kernels/ops.h Clamp, AddPosition2D, Rope2D,
// PoolRows; the reference is kernels/ref/encoder_ops.cpp). SelfAttention runs the flash kernel in its
// bidirectional mode (flash_attention.cu). Row counts come from the launch's grid (the host knows them); fp32
// arithmetic in the CPU kernels' order. Launch code: runtime/src/cuda/encoder_launch.cpp.

// Clamp: y[r, c] = min(max(x[r, c], lo), hi) for c < cols (y may be x). grid (rows, ceil(cols / 256)), block
// 256.
extern "C" __global__ void g4_clamp(const float* x, long ldx, float* y, long ldy, int cols, float lo,
                                    float hi) {
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c < cols) y[(long)r * ldy + c] = fminf(fmaxf(x[(long)r * ldx + c], lo), hi);
}

// AddPosition2D: y[r, c] = x[r, c] + (table[0, pos[r].x, c] + table[1, pos[r].y, c]), table [2, P, cols] of
// dtype tdt (y may be x). grid (rows, ceil(cols / 256)), block 256.
extern "C" __global__ void g4_add_position_2d(const float* x, long ldx, const void* table, int tdt, long P,
                                              const int* pos, float* y, long ldy, int cols) {
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    const long ox = (long)pos[2 * r] * cols + c, oy = (P + pos[2 * r + 1]) * cols + c;
    y[(long)r * ldy + c] = x[(long)r * ldx + c] + (loadw(table, tdt, ox) + loadw(table, tdt, oy));
}

// Rope2D in place: within each head of D channels, [0, D/2) rotate by pos[r].x * inv_freq[m] and [D/2, D) by
// pos[r].y * inv_freq[m], rotate-half pairs (m, m + D/4). One thread per (axis, m) pair of one head. grid
// (rows, heads), block max(32, D/2).
extern "C" __global__ void g4_rope_2d(float* x, long ldx, const float* inv_freq, const int* pos, int D) {
    const int q = D / 4;
    if ((int)threadIdx.x >= D / 2) return;
    const int r = blockIdx.x, axis = threadIdx.x / q, m = threadIdx.x % q;
    float* h       = x + (long)r * ldx + (long)blockIdx.y * D + axis * (D / 2);
    const float a  = (float)pos[2 * r + axis] * inv_freq[m];
    const float cs = cosf(a), sn = sinf(a);
    const float x0 = h[m], x1 = h[m + q];
    h[m]     = x0 * cs - x1 * sn;
    h[m + q] = x1 * cs + x0 * sn;
}

// PoolRows: y[r, c] = sum over j in order of w * x[index[r, j], c], from zero. grid (rows, ceil(cols / 256)),
// block 256.
extern "C" __global__ void g4_pool_rows(const float* x, long ldx, const int* index, int taps, float w,
                                        float* y, long ldy, int cols) {
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float acc = 0.0f;
    for (int j = 0; j < taps; ++j)
        acc += w * x[(long)index[r * taps + j] * ldx + c];
    y[(long)r * ldy + c] = acc;
}
