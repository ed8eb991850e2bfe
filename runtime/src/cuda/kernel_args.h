// Host images of argument structs passed by value to CUDA kernels (kernels/cuda/*.cu): same
// members in the same order, checked by size. Shared by the backend and the kernel tests.
#pragma once
#include "runtime/src/cuda/driver.h"

#include <algorithm>
#include <string>

namespace g4::cuda_rt {

struct GemvMatH {
    cu::CUdeviceptr w, absmax, absmax2, offset, code2, bias, y;
    int n, pad;
};
struct GemvArgsH {
    GemvMatH m[3];
    cu::CUdeviceptr x, out, aux;
    int nmat, k, epi;
    float cap;
};
static_assert(sizeof(GemvMatH) == 64 && sizeof(GemvArgsH) == 232, "GemvArgs layout");
// g4_gemv_rows_*'s second argument (GemvRowsLd): the row strides (floats) of x, of each matrix's output, of
// the epilogue's output and multiplier; the rows; xs 1: x staged in shared memory (gemv_rows_smem).
struct GemvRowsLdH {
    long x, y[3], out, aux;
    int rows, xs;
};
static_assert(sizeof(GemvRowsLdH) == 56, "GemvRowsLd layout");
// g4_mlp_nf4's arguments (MlpArgs): the gate/up pair, then the tiled down matrix's parts and output.
struct MlpArgsH {
    GemvArgsH gu;
    cu::CUdeviceptr codes, absmax, absmax2, offset, code2, bias, y;
    int H, I;
    cu::CUdeviceptr yr; // y's replicas [nrep, H] (nrep = the launch's ip6 - 1; 0: none)
    int nrep, pad;
    cu::CUdeviceptr zero; // [H] (the _z kernels, before a folded ResNorm): block 0 zeroes it at its end (the
                          // GatedProj launch's output)
    // The _r kernels (after a ResNorm record with ip1 = 2, which the runtime does not launch): its residual
    // rx, attention output rd, norm weights rpw (on rd) and rprew (making the MLP's input), eps; block 0
    // writes x1 to xo.
    cu::CUdeviceptr rx, rd, rpw, rprew, xo;
    int rpwdt, rprewdt;
    float eps;
    int pad2;
};
static_assert(sizeof(MlpArgsH) == 376, "MlpArgs layout");
// g4_attn_o_nf4_g*'s arguments (AttnOArgs): the decode attention's partials, the tiled o matrix, y.
struct AttnOArgsH {
    cu::CUdeviceptr step, part, codes, absmax, absmax2, offset, code2, bias, y;
    int H, K, dim, splits, window;
};
static_assert(sizeof(AttnOArgsH) == 96, "AttnOArgs layout");
// g4_gated_proj_bf16_g*'s arguments (GatedProjArgs): x, the gate (bf16 [P, H]) and its bias, the multiplier
// aux, the projection (bf16 [H, P]) and its bias, y; grid P / 8 blocks of kSliceThreads, G =
// slice_row_groups(H). g4_resnorm_gated_proj_bf16_g* (after a ResNorm record with ip1 = 1, which the runtime
// does not launch) also take the ResNorm's residual rx, MLP output rd, post-norm weight rpw and eps, and
// write its result to xo (block 0).
struct GatedProjArgsH {
    cu::CUdeviceptr x, wg, bg, aux, wp, bp, y;
    int H, P;
    cu::CUdeviceptr rx, rd, rpw, xo;
    int rpwdt;
    float eps;
};
static_assert(sizeof(GatedProjArgsH) == 104, "GatedProjArgs layout");
// Threads a block of the kernels that add one K-slice into all H output rows (g4_attn_o_nf4_g*: AO_B,
// g4_gated_proj_bf16_g*), and which of their kernels (_gG) takes H: G groups of 4 rows a thread.
inline constexpr int kSliceThreads = 256;
inline int slice_row_groups(int64_t H) {
    return (int)((H + 4 * kSliceThreads - 1) / (4 * kSliceThreads));
}

// Whether a decode row of an attention op runs g4_attn_decode (one block per (kv head, split) for all heads
// of the group) rather than the prefill kernels; with kernels specialised for a group size (the plan's
// cuda.attn_hpg, 0: none), only layers of that size. heads, kvh, dim, dsp: the op's AttentionParams
// heads, kv_heads, dim, decode_splits; kvdt: the cache is bf16.
inline bool decode_attention_fits(int heads, int kvh, int dim, int dsp, bool kvdt, int attn_hpg) {
    const int hpg = kvh > 0 ? heads / kvh : 0;
    if (attn_hpg != 0 && (hpg != attn_hpg || hpg * kvh != heads)) return false;
    return dsp >= 1 && dsp <= 1024 && hpg >= 1 && hpg <= 16 && hpg * dim <= 4096 && dim <= 512 &&
           (!kvdt || dim % 8 == 0);
}

// g4_attn_decode_post's q/k/v post-projection arguments (AttnPost).
struct AttnPostH {
    cu::CUdeviceptr k, v, qw, kw, inv_freq; // k, v 0: a KV-shared layer (q only)
    int wdt;
    float eps;
};
static_assert(sizeof(AttnPostH) == 48, "AttnPost layout");

// Lanes per weight row the GEMV kernels come in, and the kernel name for a dtype, lanes and pairing.
inline constexpr int kGemvLanes[5] = {8, 16, 32, 64, 128};
inline int gemv_lanes_index(int lanes) {
    return lanes == 8 ? 0 : lanes == 16 ? 1 : lanes == 32 ? 2 : lanes == 64 ? 3 : lanes == 128 ? 4 : -1;
}
inline std::string gemv_kernel_name(bool nf4, int lanes, bool pairs) {
    return std::string("g4_gemv_") + (nf4 ? "nf4" : "bf16") + "_l" + std::to_string(lanes) +
           (pairs ? "_m2" : "_m1");
}
// Dynamic shared memory a GEMV launch of K columns passes: the NF4 kernels compiled for sm_90+ keep their
// wide pair table and x there (GV_WIDE_BYTES in decode_gemv.cu; x past 8192 columns, up to 10240, in 128
// bytes a 32-column chunk after the table: GV_XS_EXT_CHUNKS; columns past 10240 are read from global memory);
// every other GEMV kernel uses static memory only.
// kGemvSmemMax: the most any launch passes (the kernels' attribute).
inline constexpr unsigned kGemvWideSmem = 65536;
inline constexpr int kGemvXsWideMax = 8192, kGemvXsExtMax = 10240; // GV_XS_WIDE_MAX, GV_XS_EXT_CHUNKS * 32
inline constexpr unsigned gemv_smem(bool nf4, int sm, int k) {
    if (!nf4 || sm < 90) return 0u;
    return kGemvWideSmem +
           (k > kGemvXsWideMax ? (unsigned)(std::min(k, kGemvXsExtMax) - kGemvXsWideMax) / 32u * 128u : 0u);
}
inline constexpr unsigned kGemvSmemMax = gemv_smem(true, 90, kGemvXsExtMax);
static_assert(kGemvSmemMax == 73728 && gemv_smem(true, 90, 8192) == 65536 &&
                  gemv_smem(true, 90, 8256) == 65792 && gemv_smem(true, 90, 10304) == 73728 &&
                  gemv_smem(true, 89, 10240) == 0 && gemv_smem(false, 90, 10240) == 0,
              "GEMV shared memory sizes");
// g4_gemv_rows_*: threads a block (t4 kernels 128, t8 256), and the dynamic shared memory of a launch: NF4
// kernels for sm_90+ keep the wide pair table there; on sm_90+, for K <= kGemvRowsXsMaxK, the rows of x
// follow (*xs set; NF4 144 bytes a 32-column chunk and row, bf16 4 bytes a column and row, bf16 only up to 4
// rows: the 262144 x 1536 LM head of 8 rows took 1041 us staged against 857 us from global memory on an
// H200).
inline constexpr int kGemvRowsXsMaxK = 2560;
inline unsigned gemv_rows_block(int rows) {
    return rows <= 4 ? 128u : 256u;
}
inline unsigned gemv_rows_smem(bool nf4, int sm, int k, int rows, int* xs) {
    *xs = sm >= 90 && k % 32 == 0 && k <= kGemvRowsXsMaxK && (nf4 || rows <= 4) ? 1 : 0;
    return gemv_smem(nf4, sm, 0) + (*xs ? (unsigned)(rows * (nf4 ? k / 32 * 144 : k * 4)) : 0u);
}
inline constexpr unsigned kGemvRowsSmemMax = kGemvWideSmem + 8 * (kGemvRowsXsMaxK / 32) * 144;
// Threads (128 per block) a GEMV launch needs for n_out outputs.
inline long gemv_threads(int n_out, int lanes, bool pairs) {
    return (long)((n_out + (pairs ? 2 : 4) - 1) / (pairs ? 2 : 4)) * lanes;
}

// Threads of a g4_attention_merge block: 1024 for a decode row (a full-attention layer at long context has
// hundreds of filled splits; a short span takes one warp), 256 for prefill rows.
inline unsigned merge_threads(bool decode) {
    return decode ? 1024u : 256u;
}

// Prefill flash attention (g4_attn_flash_d<dim>, dim 16..512, powers of two): launch shape, as the
// kernel derives it. Heads of a KV group share a block: hw heads x 64/hw rows.
struct FlashLaunch {
    unsigned gx, gy, block, smem;
};
inline FlashLaunch flash_launch(int rows, int heads, int kv_heads, int dim) {
    const int hpg = heads / kv_heads, hw = hpg % 4 == 0 ? 4 : hpg % 2 == 0 ? 2 : 1, rb = 64 / hw;
    const int bk = dim <= 256 ? 32 : 16, split = dim <= 256 ? 1 : dim / 256, vs = dim + (split == 1 ? 8 : 0);
    return {(unsigned)((rows + rb - 1) / rb), (unsigned)(heads / hw), (unsigned)(128 * split),
            (unsigned)(((64 + bk) * (dim + 8) + bk * vs) * 2)};
}
inline std::string flash_kernel_name(int dim) {
    return "g4_attn_flash_d" + std::to_string(dim);
}
inline constexpr int kFlashDims[6] = {16, 32, 64, 128, 256, 512};

} // namespace g4::cuda_rt
