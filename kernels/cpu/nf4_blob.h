// NF4 weights as the level sources' matrix-vector kernels read them (cpu_ops.cpp, gemv_int16.cpp): the blob's
// parts and block scales, and the tiling the GEMVs share. Included by level sources only
// (kernels/cpu/level.h).
#pragma once
#include "kernels/cpu/level.h"
#include "kernels/nf4.h"

#include <cstdint>
#include <cstring>

namespace g4::cpu::G4_CPU_NS::gemv {

constexpr int kGemvTileRows  = 16;   // output columns (rows of W) per task
constexpr int kGemvGroupRows = 4;    // rows of x per pass over a row of W
constexpr int kPrefetchBytes = 2048; // codes are prefetched this far ahead of the block being read
// Smaller matmuls run on the calling thread: handing them to the pool (a few microseconds with spinning
// workers, kernels/cpu/thread_pool.h) costs more than it saves. The k/v projections (256 x 1536) are above
// it: inline they were the largest single-threaded part of a decode step at 16 threads.
constexpr int64_t kGemvInlineElems = 1 << 16;

inline float load_f32(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, sizeof f);
    return f;
}

// Block scales of one NF4 blob, inlined (nf4::block_absmax is out of line and runs once per 64 weights).
struct Nf4Blob {
    const uint8_t* codes;
    const uint8_t* absmax; // f32[nblocks] or u8[nblocks]
    const uint8_t* absmax2;
    const uint8_t* code2;
    float offset = 0.0f;
    Nf4Blob(const uint8_t* blob, const nf4::Layout& l)
        : codes(blob + l.codes_off), absmax(blob + l.absmax_off), absmax2(blob + l.absmax2_off),
          code2(blob + l.code2_off) {
        if (l.double_quant) offset = load_f32(blob + l.offset_off);
    }
    template <bool DQ> float scale(int64_t b) const {
        if constexpr (DQ)
            return nf4::mul_then_add(load_f32(code2 + 4 * (size_t)absmax[b]),
                                     load_f32(absmax2 + 4 * (size_t)(b / nf4::kBlock2)), offset);
        else
            return load_f32(absmax + 4 * (size_t)b);
    }
};

} // namespace g4::cpu::G4_CPU_NS::gemv
