// The decode GEMV family (the fused decode kernels' first file): q/k/v, gate/up pairs, epilogues.
// ============================================================================================
// Fused decode kernels, launched from the compiler's CUDA schedule (plan section CUDA_SCHEDULE;
// compiler/cuda_schedule.cpp says which op sequences each one replaces). Decode steps only: one row.
// ============================================================================================

__device__ __forceinline__ float gelu_tanh(float a) {
    return 0.5f * a * (1.0f + tanhf(0.7978845608028654f * (a + 0.044715f * a * a * a)));
}

// ---- GEMV family: up to 3 matrices of one dtype sharing x (q/k/v), or (M = 2) a gate/up pair per
// output. L lanes (8..128; past 32 several warps, reduced through shared memory) share one weight row
// in 16-byte chunks (32 NF4 or 8 bf16 values: one load per lane per row), each lane group owns GV_OUT
// weight rows so its x chunk is reused 4 times. Each lane's first FC chunks of its rows are loaded
// before the wait on the previous kernel; the compiler picks L (compiler/cuda_schedule.h gemv_lanes).
// NF4 rows of K <= GV_XS_MAX read x from a padded copy in shared memory, written once per block after
// the wait: straight from global memory, the 16-byte x loads of a warp's lanes fall 128 bytes apart
// (one chunk each) and cost L1 wavefronts like the code-book lookups do (bench/labs/gemv_bench.cu lab:
// H 1536 gate/up 17.6 -> 13.7 us, H 2560 38.5 -> 27.1 us on an H100).
// Epilogues: 0 y_m[n] = v (+bias); 1 out[n] = gelu(v_gate) * v_up; 2 out[n] = gelu(v) * aux[n];
// 3 y_0[n] = cap * tanh(v / cap). grid ceil(rows / (GV_OUT / M) * L / 128), block 128.
struct GemvMat {
    const void* w;        // bf16 [N, K], or the NF4 codes
    const void* absmax;   // NF4: f32 [blocks] or u8 [blocks] (double quant)
    const float* absmax2; // NF4 double quant, else null
    const float* offset;
    const float* code2;
    const float* bias; // LoRA bias [N] or null
    float* y;          // epilogues 0 and 3: output [N]
    int n;
    int pad;
};
struct GemvArgs {
    GemvMat m[3];
    const float* x;   // [K]
    float* out;       // epilogues 1 and 2: output [N]
    const float* aux; // epilogue 2: [N]
    int nmat, k, epi;
    float cap;
};

// Sums each lane group's partial dot products acc[G] over its L lanes (shuffles within a warp, then shared
// memory across the group's warps); lane gl == 0 of the group holds the sums.
template <int L, int G, int B> __device__ __forceinline__ void gemv_group_sum(float* acc, int gl) {
    constexpr int LW = L < 32 ? L : 32; // lanes of the group in one warp
    constexpr int KS = L / LW;          // warps per group
#pragma unroll
    for (int q = 0; q < G; ++q)
#pragma unroll
        for (int o = LW / 2; o > 0; o >>= 1)
            acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], o);
    if (KS > 1) {
        __shared__ float red[B / 32][G];
        const int w = threadIdx.x >> 5;
        if ((threadIdx.x & 31) == 0)
#pragma unroll
            for (int q = 0; q < G; ++q)
                red[w][q] = acc[q];
        __syncthreads();
        if (gl == 0)
#pragma unroll
            for (int q = 0; q < G; ++q) {
                float t = 0.0f;
#pragma unroll
                for (int i = 0; i < KS; ++i)
                    t += red[w + i][q];
                acc[q] = t;
            }
    }
}

// The lane group's outputs o0 .. o0 + G / M - 1 from its sums acc (rows mi / ln: matrix, local row): epilogue
// 0 y = v (+bias), 1 gelu(gate) * up, 2 gelu(v) * aux (auxv: aux loaded before the wait, bf16), 3 softcap.
template <bool kIsNf4, int M, int G>
__device__ __forceinline__ void gemv_epilogue(const GemvArgs& a, const float* acc, const int* mi,
                                              const int* ln, const float* auxv, int o0, int n_out) {
    constexpr int R = G / M;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        int o = o0 + r;
        if (o >= n_out) break;
        if (M == 2) {
            float g  = acc[2 * r] + (a.m[0].bias ? a.m[0].bias[o] : 0.0f);
            float u  = acc[2 * r + 1] + (a.m[1].bias ? a.m[1].bias[o] : 0.0f);
            a.out[o] = gelu_tanh(g) * u;
        } else {
            const GemvMat& m = mi[r] == 0 ? a.m[0] : mi[r] == 1 ? a.m[1] : a.m[2];
            float v          = acc[r] + (m.bias ? m.bias[ln[r]] : 0.0f);
            if (a.epi == 0)
                m.y[ln[r]] = v;
            else if (a.epi == 2)
                a.out[o] = gelu_tanh(v) * (kIsNf4 ? a.aux[o] : auxv[r]);
            else
                m.y[ln[r]] = a.cap * tanhf(v / a.cap);
        }
    }
}

#define GV_OUT 4
// NF4 pair table for the GEMV: entry e (a code byte) -> (cb[e >> 4], cb[e & 15]), the two weights it
// holds in element order. 16 copies, copy s in bank pair s: lane l reads copy l % 16, so the 64-bit
// lookups of a half warp never share a bank whatever the bytes are. Byte offset of (e, copy s):
// e * 128 + s * 8, which one shift and one LOP3 make from a code word. 32 KiB.
#define NF4_PAIRS 4096
__device__ __forceinline__ void nf4_pair_table(float2* tab) {
    for (int i = threadIdx.x; i < NF4_PAIRS; i += blockDim.x)
        tab[i] = make_float2(kNf4[i >> 8], kNf4[(i >> 4) & 15]);
}
// Byte b of code word w as a pair-table byte offset, or'ed with the lane's copy offset.
template <int B> __device__ __forceinline__ u32 nf4_pair_off(u32 w, u32 lane_off) {
    return ((B == 0 ? w << 7 : w >> (8 * B - 7)) & 0x7f80u) | lane_off;
}
// The wide pair table (sm_90: 64 KiB of dynamic shared memory, GV_WIDE_BYTES): entry e, copy s at
// e * 256 + s * 8 (bytes 128..255 of each entry's row unused), so one PRMT makes the offset from a code
// word: byte 1 <- byte b of w, byte 0 <- the copy offset (< 128), bytes 2, 3 <- zero bytes of lane_off.
#define GV_WIDE_BYTES 65536
__device__ __forceinline__ void nf4_pair_table_wide(float2* tab) {
    for (int i = threadIdx.x; i < NF4_PAIRS; i += blockDim.x)
        tab[(i >> 4) * 32 + (i & 15)] = make_float2(kNf4[i >> 8], kNf4[(i >> 4) & 15]);
}
// Either pair table (W: the wide one) by a block of B threads (blockDim.x == B), B a multiple of 128: float4
// f = tid + B k holds copies 2 (f & 7) and 2 (f & 7) + 1 of entry e = f >> 3, whose values (cb[e >> 4], cb[e
// & 15]) are cb[(B / 128) k + (tid >> 7)] and cb[(tid >> 3) & 15]. Unrolled: 4096 / (2 B) 16-byte stores a
// thread and a constant load each, independent of one another, against the loops above (32 iterations at
// 128 threads of two dependent indexed constant loads and an 8-byte store: 15 SASS instructions each). The
// tables are built before the programmatic wait, so this is on the critical path whenever the kernel
// waited on finishes first. Other B: the loops above.
template <int B, bool W> __device__ __forceinline__ void nf4_pair_table_b(float2* tab) {
    if constexpr (B % 128 == 0 && B <= 2048) {
        const int t     = threadIdx.x;
        const float lo  = kNf4[(t >> 3) & 15];
        const float* hc = kNf4 + (t >> 7);
        float4* t4      = (float4*)tab;
#pragma unroll
        for (int k = 0; k < NF4_PAIRS / 2 / B; ++k) {
            const int f = t + B * k, e = f >> 3;
            const float hi               = hc[(B / 128) * k];
            t4[W ? e * 16 + (f & 7) : f] = make_float4(hi, lo, hi, lo);
        }
    } else if constexpr (W) {
        nf4_pair_table_wide(tab);
    } else {
        nf4_pair_table(tab);
    }
}
template <int B> __device__ __forceinline__ u32 nf4_pair_off_wide(u32 w, u32 lane_off) {
    return __byte_perm(w, lane_off, 0x5504u | (B << 4));
}
template <bool W, int B> __device__ __forceinline__ u32 nf4_lookup_off(u32 w, u32 lane_off) {
    return W ? nf4_pair_off_wide<B>(w, lane_off) : nf4_pair_off<B>(w, lane_off);
}
// One 16-byte NF4 chunk (code words w[0..3], 32 weights) . x[0..31] through the pair table tb (W: the wide
// one), in two FMA chains (half the dependent latency), unscaled.
template <bool W>
__device__ __forceinline__ float nf4_chunk_dot(const u32* words, const float* xv, const char* tb,
                                               u32 lane_off) {
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int wd = 0; wd < 4; ++wd) {
        const u32 w     = words[wd];
        const float2 p0 = *(const float2*)(tb + nf4_lookup_off<W, 0>(w, lane_off));
        const float2 p1 = *(const float2*)(tb + nf4_lookup_off<W, 1>(w, lane_off));
        const float2 p2 = *(const float2*)(tb + nf4_lookup_off<W, 2>(w, lane_off));
        const float2 p3 = *(const float2*)(tb + nf4_lookup_off<W, 3>(w, lane_off));
        const float* xw = xv + wd * 8;
        s0 = fmaf(p0.x, xw[0], s0), s1 = fmaf(p0.y, xw[1], s1);
        s0 = fmaf(p1.x, xw[2], s0), s1 = fmaf(p1.y, xw[3], s1);
        s0 = fmaf(p2.x, xw[4], s0), s1 = fmaf(p2.y, xw[5], s1);
        s0 = fmaf(p3.x, xw[6], s0), s1 = fmaf(p3.y, xw[7], s1);
    }
    return s0 + s1;
}
// x staged in shared memory (XS): 8 float4 of chunk c at xs[9c..], one float4 of padding per chunk so
// the 16-byte loads of 8 lanes reading 8 consecutive chunks hit distinct banks. K <= GV_XS_MAX. With the
// wide table (W) x lives in its unused half rows: float4 v of chunk c at byte c * 256 + 128 + 16 (v ^ (c &
// 7)), the xor keeping 8 consecutive chunks on distinct banks.
#define GV_XS_MAX 2560
// Chunks 256..GV_XS_EXT_CHUNKS - 1 (K > GV_XS_WIDE_MAX) follow the table: float4 v of chunk c at byte
// GV_WIDE_BYTES + (c - 256) * 128 + 16 (v ^ (c & 7)); the launch passes (min(K / 32, GV_XS_EXT_CHUNKS) - 256)
// * 128 bytes more dynamic shared memory (cuda_rt::gemv_smem; 72 KiB still fits three blocks an SM). Chunks
// past those (K = 12288 at H 1536) are read from global memory (a multiple of 32 chunks: warp-uniform).
#define GV_XS_WIDE_MAX 8192 // the wide table's 256 unused half rows hold 256 chunks
#define GV_XS_EXT_CHUNKS 320
template <bool W> __device__ __forceinline__ int xs_slot(int c, int v) {
    return W ? (c < 256 ? c * 16 + 8 : c * 8 + 2048) + (v ^ (c & 7)) : c * 9 + v;
}
// G: weight rows per lane group; B: threads a block (the kernels launch 128; bench/labs/gemv_bench.cu's lab
// variants also take other values of both). SM: the NF4 scale format (NF4_SCALES_*); XA: every chunk of x
// is staged (K <= 32 GV_XS_EXT_CHUNKS with the wide table), so the loop has no global-memory path for x; U2:
// the loop over the chunks past the front ones is unrolled by two, its two register sets of codes and scales
// taking turns (no copy of the next chunk's registers an iteration; the body's code twice); FC: the chunks a
// lane loads before the programmatic wait (below); TR: the timeline lab's record (false inside a kernel that
// keeps its own, the fused MLP).
template <bool kIsNf4, int L, int M, int G = GV_OUT, bool XS = false, int B = 128, bool W = false,
          int SM = NF4_SCALES_ANY, bool XA = false, bool U2 = false, int FC = 2, bool TR = true>
__device__ __forceinline__ void gemv_body(const GemvArgs& a, float2* tab, float4* xs = nullptr,
                                          int vblock = -1) {
    G4_TRACE_SCOPE_IF(
        TR, 1u | (kIsNf4 ? 16u : 0u) | (u32)M << 5 | (u32)L << 8 | (u32)a.epi << 16 | (u32)a.nmat << 20,
        a.m[0].w);
    constexpr int R = G / M; // outputs per lane group
    const int gl    = threadIdx.x % L;
    // vblock >= 0: this block computes the rows block `vblock` of a launch of the kernel would
    // (g4_lm_exact), by the same arithmetic.
    const int group = ((vblock >= 0 ? vblock : (int)blockIdx.x) * blockDim.x + threadIdx.x) / L;
    const int n_out =
        M == 2 ? a.m[0].n : a.m[0].n + (a.nmat > 1 ? a.m[1].n : 0) + (a.nmat > 2 ? a.m[2].n : 0);
    const int o0 = group * R;
    const int K  = a.k;
    // Per weight row q: matrix index and local row (rows past the end are clamped, never stored).
    int mi[G], ln[G];
#pragma unroll
    for (int q = 0; q < G; ++q) {
        int o = min(o0 + q / M, n_out - 1);
        if (M == 2) {
            mi[q] = q % 2;
            ln[q] = o;
        } else {
            int n0 = a.m[0].n, n1 = a.nmat > 1 ? a.m[1].n : 0;
            mi[q] = o < n0 ? 0 : o < n0 + n1 ? 1 : 2;
            ln[q] = o - (mi[q] == 0 ? 0 : mi[q] == 1 ? n0 : n0 + n1);
        }
    }
    const uint4* wrow[G];
    const void* amp[G];
    const float *am2p[G], *offp[G], *c2p[G];
    int blk0[G]; // NF4: the row's first element / 32 (its half block)
#pragma unroll
    for (int q = 0; q < G; ++q) {
        const GemvMat& m = mi[q] == 0 ? a.m[0] : mi[q] == 1 ? a.m[1] : a.m[2];
        wrow[q] = (const uint4*)((const char*)m.w + (kIsNf4 ? (long)ln[q] * K / 2 : (long)ln[q] * K * 2));
        amp[q] = m.absmax, am2p[q] = m.absmax2, offp[q] = m.offset, c2p[q] = m.code2;
        blk0[q] = (int)((long)ln[q] * K / 32);
    }
    constexpr int PER  = kIsNf4 ? 32 : 8; // values per 16-byte chunk
    const int C        = K / PER;
    const u32 lane_off = (threadIdx.x & 15) * 8;
    // NF4 block scale of chunk c of row q, in two steps (the load is issued with the codes).
    auto raw_scale = [&](int q, int c) { return nf4_raw<SM>(amp[q], am2p[q], (blk0[q] + c) >> 1); };
    auto scale_of  = [&](int q, int c, u32 raw) {
        return nf4_value<SM>(raw, am2p[q], offp[q], c2p[q], (blk0[q] + c) >> 1);
    };
    // acc[q] += row q's chunk c (codes pk[q]) . x[c * PER ...].
    auto accumulate = [&](int c, const uint4* pk, const u32* raw, float* acc) {
        float scale[G];
        if (kIsNf4)
#pragma unroll
            for (int q = 0; q < G; ++q)
                scale[q] = scale_of(q, c, raw[q]);
        float xv[PER];
#pragma unroll
        for (int v = 0; v < PER / 4; ++v) {
            float4 t  = XS && (XA || !W || c < GV_XS_EXT_CHUNKS) ? xs[xs_slot<W>(c, v)]
                                                                 : ((const float4*)(a.x + (long)c * PER))[v];
            xv[4 * v] = t.x, xv[4 * v + 1] = t.y, xv[4 * v + 2] = t.z, xv[4 * v + 3] = t.w;
        }
#pragma unroll
        for (int q = 0; q < G; ++q) {
            u32 words[4] = {pk[q].x, pk[q].y, pk[q].z, pk[q].w};
            if (kIsNf4) {
                acc[q] += nf4_chunk_dot<W>(words, xv, (const char*)tab, lane_off) * scale[q];
            } else {
                float sum = 0.0f;
#pragma unroll
                for (int wd = 0; wd < 4; ++wd)
                    sum += __uint_as_float(words[wd] << 16) * xv[2 * wd] +
                           __uint_as_float(words[wd] & 0xffff0000u) * xv[2 * wd + 1];
                acc[q] += sum;
            }
        }
    };
    // The lane's first FC chunks of every row (codes and scales) are loaded into registers before the
    // wait on the previous kernel: weights never depend on it, so their DRAM latency overlaps its tail
    // (and the pair table's set-up). Two, not three: the kernel waited on runs faster under less DRAM
    // traffic from its dependent's loads (on an H100: H 1536 +2.3%, H 2560 +3.4% tok/s against three).
    // The fused MLP loads one: it follows a one-block ResNorm, and its 192-384 blocks' front loads
    // (megabytes) delayed that ResNorm's exit and the MLP's release (on an H200: H 1536 +0.8% / +0.9%,
    // H 2560 +0.2% / +0.3% tok/s at depth 16 / 4096 against two).
    // Later chunks (the gate/up of I 12288 at H 1536 and of H 2560: 4 and 8 a lane on sm_90, the down at H
    // 2560 3; bf16 rows of more than FC * L chunks) are loaded in the loop below, one chunk ahead of the
    // multiply. bf16 rows' later chunks are also pulled into L2 before the wait; NF4 rows' are not: the
    // post-wait prefetch of the whole rest of the matrix (the gate/up at H 2560: 24 MB at once) cost more
    // than it saved once the loop loaded a chunk ahead (on an H100: without it H 2560 +3.0%, H 1536 +0.3%
    // tok/s).
    uint4 pk0[FC][G];
    u32 raw0[FC][G];
#pragma unroll
    for (int i = 0; i < FC; ++i) {
        const int c = gl + i * L;
        if (c < C)
#pragma unroll
            for (int q = 0; q < G; ++q) {
                pk0[i][q]  = __ldcs(wrow[q] + c);
                raw0[i][q] = kIsNf4 ? raw_scale(q, c) : 0u;
            }
    }
    if (!kIsNf4) // bf16: the chunks past the registers' into L2
        for (int c = gl + FC * L; c < C; c += L)
#pragma unroll
            for (int q = 0; q < G; ++q)
                prefetch_l2(wrow[q] + c);
    if (kIsNf4) {
        nf4_pair_table_b<B, W>(tab);
        __syncthreads();
    }
    // bf16 (a gate with a multiplier, epilogue 2): the multiplier aux, written at the start
    // of the step, many launches before this one (complete once the previous kernel passed its wait), is
    // loaded before the wait too, so the epilogue has no dependent load. (NF4 kernels: registers.)
    float auxv[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
        auxv[r] = !kIsNf4 && a.epi == 2 && gl == 0 && o0 + r < n_out ? __ldcg(a.aux + o0 + r) : 0.0f;
    pdl_begin();
    if (XS) {
        const float4* x4 = (const float4*)a.x;
        const int n4     = W ? min(K / 4, GV_XS_EXT_CHUNKS * 8) : K / 4; // float4s staged
        for (int i0 = threadIdx.x; i0 < n4; i0 += 4 * B) {               // four loads in flight a thread
            float4 t[4];
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (i0 + j * B < n4) t[j] = x4[i0 + j * B];
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (i0 + j * B < n4) xs[xs_slot<W>((i0 + j * B) >> 3, (i0 + j * B) & 7)] = t[j];
        }
        __syncthreads();
    }
    G4_TRACE_MARK(0);
    float acc[G] = {};
#pragma unroll
    for (int i = 0; i < FC; ++i)
        if (gl + i * L < C) accumulate(gl + i * L, pk0[i], raw0[i], acc);
    G4_TRACE_MARK(1);
    if (U2 && gl + FC * L < C) { // the next chunk's codes and scales load while this one's multiply runs
        uint4 pa[G], pb[G];
        u32 ra[G], rb[G];
        auto load = [&](int c, uint4* pk, u32* raw) {
#pragma unroll
            for (int q = 0; q < G; ++q) {
                pk[q]  = __ldcs(wrow[q] + c);
                raw[q] = kIsNf4 ? raw_scale(q, c) : 0u;
            }
        };
        load(gl + FC * L, pa, ra);
        for (int c = gl + FC * L;; c += 2 * L) { // chunk c in pa / ra, c + L in pb / rb
            if (c + L < C) load(c + L, pb, rb);
            accumulate(c, pa, ra, acc);
            if (c + L >= C) break;
            if (c + 2 * L < C) load(c + 2 * L, pa, ra);
            accumulate(c + L, pb, rb, acc);
            if (c + 2 * L >= C) break;
        }
    } else if (gl + FC * L < C) {
        uint4 pk[G];
        u32 raw[G];
#pragma unroll
        for (int q = 0; q < G; ++q) {
            pk[q]  = __ldcs(wrow[q] + gl + FC * L);
            raw[q] = kIsNf4 ? raw_scale(q, gl + FC * L) : 0u;
        }
        for (int c = gl + FC * L; c < C; c += L) {
            uint4 pn[G];
            u32 rn[G];
            const int cn = c + L < C ? c + L : c;
#pragma unroll
            for (int q = 0; q < G; ++q) {
                pn[q] = __ldcs(wrow[q] + cn);
                rn[q] = kIsNf4 ? raw_scale(q, cn) : 0u;
            }
            accumulate(c, pk, raw, acc);
#pragma unroll
            for (int q = 0; q < G; ++q)
                pk[q] = pn[q], raw[q] = rn[q];
        }
    }
    gemv_group_sum<L, G, B>(acc, gl);
    G4_TRACE_MARK(2);
    if (gl != 0) return;
    gemv_epilogue<kIsNf4, M, G>(a, acc, mi, ln, auxv, o0, n_out);
}

// NF4 with K <= GV_XS_MAX stages x in shared memory (the compiler's lane choice assumes it). On sm_90
// the NF4 kernels take the wide pair table in GV_WIDE_BYTES of dynamic shared memory, and the first
// GV_XS_EXT_CHUNKS chunks of x (the launch passes the size for its K: cuda_rt::gemv_smem); elsewhere the 32
// KiB table is static (3-4 blocks an SM of 100 KiB).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GV_WIDE 1
#else
#define GV_WIDE 0
#endif
#define G4_GEMV(NAME, NF4, L, M)                                                                             \
    extern "C" __global__ void __launch_bounds__(128, M == 2 ? 4 : 3) NAME(const GemvArgs a) {               \
        if (NF4 && GV_WIDE) {                                                                                \
            extern __shared__ float4 gv_wide[];                                                              \
            gemv_body<NF4, L, M, GV_OUT, true, 128, true>(a, (float2*)gv_wide, gv_wide);                     \
        } else {                                                                                             \
            __shared__ float4 xs[NF4 ? GV_XS_MAX / 32 * 9 : 1];                                              \
            __shared__ float2 tab[NF4 && !GV_WIDE ? NF4_PAIRS : 1];                                          \
            if (NF4 && a.k <= GV_XS_MAX)                                                                     \
                gemv_body<NF4, L, M, GV_OUT, true>(a, tab, xs);                                              \
            else                                                                                             \
                gemv_body<NF4, L, M>(a, tab);                                                                \
        }                                                                                                    \
    }
G4_GEMV(g4_gemv_nf4_l8_m1, true, 8, 1)
G4_GEMV(g4_gemv_nf4_l16_m1, true, 16, 1)
G4_GEMV(g4_gemv_nf4_l32_m1, true, 32, 1)
G4_GEMV(g4_gemv_nf4_l64_m1, true, 64, 1)
G4_GEMV(g4_gemv_nf4_l128_m1, true, 128, 1)
G4_GEMV(g4_gemv_nf4_l8_m2, true, 8, 2)
G4_GEMV(g4_gemv_nf4_l16_m2, true, 16, 2)
G4_GEMV(g4_gemv_nf4_l32_m2, true, 32, 2)
G4_GEMV(g4_gemv_nf4_l64_m2, true, 64, 2)
G4_GEMV(g4_gemv_nf4_l128_m2, true, 128, 2)
G4_GEMV(g4_gemv_bf16_l8_m1, false, 8, 1)
G4_GEMV(g4_gemv_bf16_l16_m1, false, 16, 1)
G4_GEMV(g4_gemv_bf16_l32_m1, false, 32, 1)
G4_GEMV(g4_gemv_bf16_l64_m1, false, 64, 1)
G4_GEMV(g4_gemv_bf16_l128_m1, false, 128, 1)
G4_GEMV(g4_gemv_bf16_l8_m2, false, 8, 2)
G4_GEMV(g4_gemv_bf16_l16_m2, false, 16, 2)
G4_GEMV(g4_gemv_bf16_l32_m2, false, 32, 2)
G4_GEMV(g4_gemv_bf16_l64_m2, false, 64, 2)
G4_GEMV(g4_gemv_bf16_l128_m2, false, 128, 2)

// A tiled NF4 matrix [H, K] (plan kQuantTiled32) as the fused decode kernels (g4_mlp_nf4's down,
// g4_attn_o_nf4's o) read it: codes [K / 32][H][16 bytes], each 32-column slice contiguous, absmax [K /
// 64][H] (double quant: absmax2 still indexed by the row-major block r * K / 64 + c / 64).
struct Nf4Tiled {
    const u8* codes;
    const void* absmax; // u8 (double quant) or f32
    const float* absmax2;
    const float* offset;
    const float* code2;
    // The raw block scales of rows r0 .. r0 + 3 in 64-column block c64 (SM: the scale format, NF4_SCALES_*).
    template <int SM = NF4_SCALES_ANY>
    __device__ __forceinline__ void raw4(int c64, int H, int r0, u32* raw) const {
        if (SM == NF4_SCALES_DQ || (SM == NF4_SCALES_ANY && absmax2)) {
            const u32 r4 = __ldcs((const u32*)((const u8*)absmax + (long)c64 * H + r0));
#pragma unroll
            for (int k = 0; k < 4; ++k)
                raw[k] = (r4 >> (8 * k)) & 0xffu;
        } else {
            const uint4 r4 = __ldcs((const uint4*)((const float*)absmax + (long)c64 * H + r0));
            raw[0] = r4.x, raw[1] = r4.y, raw[2] = r4.z, raw[3] = r4.w;
        }
    }
    template <int SM = NF4_SCALES_ANY> __device__ __forceinline__ float scale(u32 raw, long b) const {
        return nf4_value<SM>(raw, absmax2, offset, code2, b);
    }
};
