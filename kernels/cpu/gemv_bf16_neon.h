// The bf16 GEMV's row kernel for Advanced SIMD (aarch64; the neon and dotprod levels), included by
// gemv_bf16.cpp in its namespace. No include guard, by design.
//
// x keeps its order: shll by 16 widens 4 bf16 values at a time into their float32 values in place. 16
// elements an iteration into four float32x4 accumulators per row (vfmaq), added pairwise at the end; the tail
// (k % 16) in scalar float32 as the other levels do it.

template <int R> void dot_rows(const uint16_t* w, const float* xp, int64_t k, float* out) {
    const int64_t whole = k / kChunk * kChunk;
    float tail[R]       = {};
    float32x4_t acc[R][4];
    for (int t = 0; t < R; ++t)
        for (int v = 0; v < 4; ++v)
            acc[t][v] = vdupq_n_f32(0.0f);
    for (int64_t j = 0; j < whole; j += kChunk) {
        const uint16x8_t v0 = vld1q_u16(w + j), v1 = vld1q_u16(w + j + 8);
        const float32x4_t wv[4] = {vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v0), 16)),
                                   vreinterpretq_f32_u32(vshll_high_n_u16(v0, 16)),
                                   vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v1), 16)),
                                   vreinterpretq_f32_u32(vshll_high_n_u16(v1, 16))};
        for (int t = 0; t < R; ++t)
            for (int v = 0; v < 4; ++v)
                acc[t][v] = vfmaq_f32(acc[t][v], vld1q_f32(xp + t * k + j + 4 * v), wv[v]);
    }
    for (int64_t j = whole; j < k; ++j) {
        const float wv = bf16_value(w[j]);
        for (int t = 0; t < R; ++t)
            tail[t] += xp[t * k + j] * wv;
    }
    for (int t = 0; t < R; ++t)
        out[t] =
            vaddvq_f32(vaddq_f32(vaddq_f32(acc[t][0], acc[t][1]), vaddq_f32(acc[t][2], acc[t][3]))) + tail[t];
}
