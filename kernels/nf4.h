// NF4 (bitsandbytes 4-bit NormalFloat) storage in g4 plans, shared by compiler, runtime and kernels.
//
// A weight of n elements (row-major flattened, e.g. [N, K]) is one blob:
//   [packed codes: ceil(n/2) bytes; element 2i in the high nibble of byte i, 2i+1 in the low nibble]
//   [pad to 16]
//   single quant:  absmax f32[nblocks]                       (nblocks = ceil(n / 64))
//   double quant:  absmax_q u8[nblocks], pad to 16,
//                  absmax2 f32[nblocks2] (nblocks2 = ceil(nblocks / 256)), offset f32[1], pad to 16,
//                  code2 f32[256] (bitsandbytes' signed dynamic 8-bit map)
// w[j] = kCodebook[code(j)] * absmax(j / 64), absmax(b) = code2[absmax_q[b]] * absmax2[b / 256] + offset
// (double quant) — exactly bitsandbytes' dequantize_4bit definition.
#pragma once
#include <cstddef>
#include <cstdint>

namespace g4::nf4 {

inline constexpr int kBlock  = 64;
inline constexpr int kBlock2 = 256;

// bitsandbytes get_4bit_type("nf4"), index 0..15.
inline constexpr float kCodebook[16] = {-1.0f,
                                        -0.6961928009986877f,
                                        -0.5250730514526367f,
                                        -0.39491748809814453f,
                                        -0.28444138169288635f,
                                        -0.18477343022823334f,
                                        -0.09105003625154495f,
                                        0.0f,
                                        0.07958029955625534f,
                                        0.16093020141124725f,
                                        0.24611230194568634f,
                                        0.33791524171829224f,
                                        0.44070982933044434f,
                                        0.5626170039176941f,
                                        0.7229568362236023f,
                                        1.0f};

struct Layout {
    int64_t n = 0, nblocks = 0, nblocks2 = 0;
    bool double_quant  = false;
    uint64_t codes_off = 0, codes_bytes = 0;
    uint64_t absmax_off  = 0; // f32[nblocks] or u8[nblocks]
    uint64_t absmax2_off = 0; // double quant: f32[nblocks2]
    uint64_t offset_off  = 0; // double quant: f32
    uint64_t code2_off   = 0; // double quant: f32[256]
    uint64_t total       = 0; // blob bytes
};

// The CPU kernels link one more copy of the functions below per instruction-set level (kernels/cpu/level.h),
// each in an inline namespace named by the level; everywhere else they are plain g4::nf4 functions.
#if defined(G4_CPU_NS)
#define G4_NF4_LEVEL_BEGIN inline namespace G4_CPU_NS {
#define G4_NF4_LEVEL_END }
#else
#define G4_NF4_LEVEL_BEGIN
#define G4_NF4_LEVEL_END
#endif
G4_NF4_LEVEL_BEGIN

Layout layout(int64_t n, bool double_quant);

// Dequantizes elements [start, start + count) of the blob into out (float32).
void dequantize(const uint8_t* blob, const Layout& l, int64_t start, int64_t count, float* out);

// Value of element i (slow; for reference kernels and tests).
float element(const uint8_t* blob, const Layout& l, int64_t i);

// a * b + c with the product rounded to fp32 before the sum, as torch computes
// dequantize_blockwise(...) + offset. The empty asm (or, elsewhere, a volatile store) hides the product from
// the optimiser so that it cannot contract the two operations into one FMA (GCC does so by default in C++).
inline float mul_then_add(float a, float b, float c) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    float p = a * b;
    __asm__("" : "+x"(p));
#elif defined(__GNUC__) && defined(__aarch64__)
    float p = a * b;
    __asm__("" : "+w"(p));
#else
    volatile float p = a * b;
#endif
    return p + c;
}

// fp32 scale of 64-element block b: absmax[b], or code2[absmax_q[b]] * absmax2[b / 256] + offset rounded
// after the product and after the sum (never fused), as bitsandbytes computes it.
float block_absmax(const uint8_t* blob, const Layout& l, int64_t b);

G4_NF4_LEVEL_END

} // namespace g4::nf4
