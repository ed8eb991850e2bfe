// Embedding lookup: rows of a table gathered by token id and scaled.
// y[t, :n] = table[ids[t], :n] * scale. grid (max_rows, ceil(n / 2048)), block 256: a thread loads its (up
// to) 8 values before it stores any. (Looped one value at a time, a row of 8960 values (35 slices of 256)
// cost a DRAM round trip each, ~16 us a token.)
extern "C" __global__ void g4_embed(const Step* s, const int* ids, const void* table, int dt, long n,
                                    float scale, float* y, long ldy) {
    G4_TRACE_SCOPE(7, table);
    pdl_begin();
    const int t = blockIdx.x;
    if (t >= s->rows) return;
    const long row = (long)ids[t] * n, j0 = (long)blockIdx.y * 2048 + threadIdx.x;
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u)
        v[u] = j0 + u * 256 < n ? loadw(table, dt, row + j0 + u * 256) : 0.0f;
#pragma unroll
    for (int u = 0; u < 8; ++u)
        if (j0 + u * 256 < n) y[t * ldy + j0 + u * 256] = v[u] * scale;
}
