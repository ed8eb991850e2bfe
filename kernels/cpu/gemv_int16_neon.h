// The NF4 x int16 GEMV's block kernel for Advanced SIMD (aarch64; the neon and dotprod levels), included by
// gemv_int16_body.h in its namespace. No include guard, by design.
//
// x keeps kIntOrder's plain order (a block's even elements, which the high nibbles of its 32 code bytes hold,
// then its odd ones). Each 16 code bytes give their nibbles' int16 codebook values as the low and the high
// bytes (tbl) zipped into 8 + 8 int16 lanes in element order; smlal multiplies and accumulates them with x in
// two int32x4 sums a block (8 products a lane: at most 8 * 8191 * 4096 < 2^31, the exact integer products
// of the reference), converted to float32 and scaled by absmax * amax / (8191 * 4096) into two float32x4
// accumulators per row.

struct Nf4Int16Bytes { // kNf4Int16 as its low and high bytes
    uint8_t lo[16], hi[16];
    constexpr Nf4Int16Bytes() : lo(), hi() {
        for (int c = 0; c < 16; ++c)
            lo[c] = (uint8_t)((uint16_t)q16::kNf4Int16.v[c] & 0xFF),
            hi[c] = (uint8_t)((uint16_t)q16::kNf4Int16.v[c] >> 8);
    }
};
constexpr Nf4Int16Bytes kNf4Int16Bytes;

template <int R, bool DQ> void int_blocks(const Nf4Blob& w, int64_t b0, const IntX& x, float* out) {
    const uint8_t* codes = w.codes + b0 * (nf4::kBlock / 2);
    const uint8x16_t lo = vld1q_u8(kNf4Int16Bytes.lo), hi = vld1q_u8(kNf4Int16Bytes.hi);
    const uint8x16_t m4 = vdupq_n_u8(15);
    float32x4_t acc0[R], acc1[R];
    for (int t = 0; t < R; ++t)
        acc0[t] = acc1[t] = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < x.nb; ++i) {
        const uint8_t* c = codes + 32 * i;
        if ((i & 1) == 0) __builtin_prefetch(c + kPrefetchBytes);
        int16x8_t wv[8]; // [0, 4): the high nibbles' values (elements 0, 2, .., 62), [4, 8): the low ones'
        for (int h = 0; h < 2; ++h) {
            const uint8x16_t v  = vld1q_u8(c + 16 * h);
            const uint8x16_t hn = vshrq_n_u8(v, 4), ln = vandq_u8(v, m4);
            const uint8x16_t hl = vqtbl1q_u8(lo, hn), hh = vqtbl1q_u8(hi, hn);
            const uint8x16_t ll = vqtbl1q_u8(lo, ln), lh = vqtbl1q_u8(hi, ln);
            wv[2 * h]     = vreinterpretq_s16_u8(vzip1q_u8(hl, hh));
            wv[2 * h + 1] = vreinterpretq_s16_u8(vzip2q_u8(hl, hh));
            wv[4 + 2 * h] = vreinterpretq_s16_u8(vzip1q_u8(ll, lh));
            wv[5 + 2 * h] = vreinterpretq_s16_u8(vzip2q_u8(ll, lh));
        }
        const float s = w.scale<DQ>(b0 + i);
        for (int t = 0; t < R; ++t) {
            const int64_t xb  = t * x.nb + i;
            const int16_t* xq = x.q + 64 * xb;
            int32x4_t d0 = vdupq_n_s32(0), d1 = vdupq_n_s32(0);
            for (int j = 0; j < 8; j += 2) {
                const int16x8_t x0 = vld1q_s16(xq + 8 * j), x1 = vld1q_s16(xq + 8 * j + 8);
                d0 = vmlal_s16(d0, vget_low_s16(wv[j]), vget_low_s16(x0));
                d0 = vmlal_high_s16(d0, wv[j], x0);
                d1 = vmlal_s16(d1, vget_low_s16(wv[j + 1]), vget_low_s16(x1));
                d1 = vmlal_high_s16(d1, wv[j + 1], x1);
            }
            const float32x4_t f = vdupq_n_f32(s * x.sx[xb]);
            acc0[t]             = vfmaq_f32(acc0[t], vcvtq_f32_s32(d0), f);
            acc1[t]             = vfmaq_f32(acc1[t], vcvtq_f32_s32(d1), f);
        }
    }
    for (int t = 0; t < R; ++t)
        out[t] = vaddvq_f32(vaddq_f32(acc0[t], acc1[t]));
}
