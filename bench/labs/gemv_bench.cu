// Decode GEMV microbenchmark: times the g4_gemv_* kernels of kernels/cuda/decode_gemv.cu at Gemma 4's real
// decode shapes and reports achieved GB/s against this GPU's measured read bandwidth. Weights are
// random (valid NF4 blobs, double quant); several copies rotate so every launch reads from DRAM, not L2.
// A sample is one launch per copy, back to back between two events (per-launch time = sample / copies);
// "err" is each kernel's largest output difference from the compiler's choice, relative to its largest
// output (lab variants of other arithmetic show their rounding there).
// Build with the CUDA toolkit from the repo root (an sm_90 GPU runs it):
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. -o build/gemv_bench bench/labs/gemv_bench.cu
//   [-DG4_KERNELS='"path/to/other/all_kernels.cuh"' to time another version of the kernels]
// Usage: [G4_GEMV_L2=1] gemv_bench [reps [lab]]  (one line per shape and lane count; '*' marks the compiler's
// choice;
//        lab: also the variants of kVariants, named in the last column; -DG4_LAB='"file"' replaces
//        that list with one of your own, e.g. copies of gemv_body with a step removed)
#ifndef G4_KERNELS
#define G4_KERNELS "kernels/cuda/all_kernels.cuh"
#endif
#include G4_KERNELS
#include "compiler/cuda_schedule.h"
#include "runtime/src/cuda/kernel_args.h"
static_assert(GV_XS_MAX == g4::cuda::kGemvXsMax,
              "kernels.cu and cuda_schedule.h disagree on the x-in-shared-memory limit");

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <random>
#include <string>
#include <vector>

#include "bench/labs/bench_cuda.h"

typedef void (*GemvFn)(const GemvArgs);
static const GemvFn kGemvNf4[2][5] = {
    {g4_gemv_nf4_l8_m1, g4_gemv_nf4_l16_m1, g4_gemv_nf4_l32_m1, g4_gemv_nf4_l64_m1, g4_gemv_nf4_l128_m1},
    {g4_gemv_nf4_l8_m2, g4_gemv_nf4_l16_m2, g4_gemv_nf4_l32_m2, g4_gemv_nf4_l64_m2, g4_gemv_nf4_l128_m2}};
static const GemvFn kGemvBf16[2][5] = {
    {g4_gemv_bf16_l8_m1, g4_gemv_bf16_l16_m1, g4_gemv_bf16_l32_m1, g4_gemv_bf16_l64_m1, g4_gemv_bf16_l128_m1},
    {g4_gemv_bf16_l8_m2, g4_gemv_bf16_l16_m2, g4_gemv_bf16_l32_m2, g4_gemv_bf16_l64_m2,
     g4_gemv_bf16_l128_m2}};

// Variants of the body as it was before x went to shared memory (the kernels stage x for NF4 with
// K <= GV_XS_MAX): G weight rows per lane group (the kernels use GV_OUT), B threads a block.
template <bool NF4, int L, int M, int G, int B>
__global__ void __launch_bounds__(B, (M == 2 ? 512 : 384) / B) lab_gemv(const GemvArgs a) {
    __shared__ float2 tab[NF4 ? NF4_PAIRS : 1];
    gemv_body<NF4, L, M, G, false, B>(a, tab);
}
template <bool NF4, int M, int G, int B> static GemvFn lab_fn(int li) {
    switch (li) {
    case 0:
        return lab_gemv<NF4, 8, M, G, B>;
    case 1:
        return lab_gemv<NF4, 16, M, G, B>;
    case 2:
        return lab_gemv<NF4, 32, M, G, B>;
    case 3:
        return lab_gemv<NF4, 64, M, G, B>;
    default:
        return lab_gemv<NF4, 128, M, G, B>;
    }
}
struct Variant {
    const char* name;
    int g, b;
    GemvFn (*fn[2][2])(int); // [nf4][pairs]
    int kmax;                // largest K it takes (0: any)
    bool per_block = false;  // one group of g rows a block of b threads (no lane count to sweep)
};
#ifdef G4_LAB
#include G4_LAB
#else
static const Variant kVariants[] = {
    {"g4b128",
     4,
     128,
     {{lab_fn<false, 1, 4, 128>, lab_fn<false, 2, 4, 128>},
      {lab_fn<true, 1, 4, 128>, lab_fn<true, 2, 4, 128>}}},
    {"g2b128",
     2,
     128,
     {{lab_fn<false, 1, 2, 128>, lab_fn<false, 2, 2, 128>},
      {lab_fn<true, 1, 2, 128>, lab_fn<true, 2, 2, 128>}}},
    {"g2b256",
     2,
     256,
     {{lab_fn<false, 1, 2, 256>, lab_fn<false, 2, 2, 256>},
      {lab_fn<true, 1, 2, 256>, lab_fn<true, 2, 2, 256>}}},
    {"g4b256",
     4,
     256,
     {{lab_fn<false, 1, 4, 256>, lab_fn<false, 2, 4, 256>},
      {lab_fn<true, 1, 4, 256>, lab_fn<true, 2, 4, 256>}}},
    {"g1b128", 1, 128, {{lab_fn<false, 1, 1, 128>, nullptr}, {lab_fn<true, 1, 1, 128>, nullptr}}},
};
#endif

struct Case {
    const char* name;
    bool nf4;
    std::vector<int> n; // matrices sharing x; pairs: two equal halves (gate, up)
    int k;
    bool pairs;
};

// One weight matrix set on the device: NF4 blob parts (double quant) or bf16.
struct Mats {
    std::vector<GemvMat> m;
    size_t bytes = 0;
};

static Mats make(const Case& c, std::mt19937& rng) {
    Mats r;
    for (int n : c.n) {
        GemvMat g{};
        g.n          = n;
        size_t elems = (size_t)n * c.k;
        if (c.nf4) {
            size_t blocks = elems / 64, blocks2 = (blocks + 255) / 256;
            std::vector<unsigned char> codes(elems / 2), aq(blocks);
            for (auto& b : codes)
                b = (unsigned char)rng();
            for (auto& b : aq)
                b = (unsigned char)rng();
            std::vector<float> a2(blocks2, 0.02f), code2(256);
            for (int i = 0; i < 256; ++i)
                code2[i] = (i - 128) / 128.0f;
            float off = 0.01f;
            void *dc, *da, *da2, *doff, *dcode2;
            CK(cudaMalloc(&dc, codes.size()));
            CK(cudaMalloc(&da, aq.size()));
            CK(cudaMalloc(&da2, a2.size() * 4));
            CK(cudaMalloc(&doff, 4));
            CK(cudaMalloc(&dcode2, 1024));
            CK(cudaMemcpy(dc, codes.data(), codes.size(), cudaMemcpyHostToDevice));
            CK(cudaMemcpy(da, aq.data(), aq.size(), cudaMemcpyHostToDevice));
            CK(cudaMemcpy(da2, a2.data(), a2.size() * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(doff, &off, 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dcode2, code2.data(), 1024, cudaMemcpyHostToDevice));
            g.w = dc, g.absmax = da, g.absmax2 = (const float*)da2, g.offset = (const float*)doff,
            g.code2 = (const float*)dcode2;
            r.bytes += codes.size() + aq.size() + a2.size() * 4;
        } else {
            std::vector<unsigned short> w(elems);
            for (auto& v : w)
                v = (unsigned short)(0x3c00 + (rng() & 0x3ff));
            void* dw;
            CK(cudaMalloc(&dw, elems * 2));
            CK(cudaMemcpy(dw, w.data(), elems * 2, cudaMemcpyHostToDevice));
            g.w = dw;
            r.bytes += elems * 2;
        }
        r.m.push_back(g);
    }
    return r;
}

// Read bandwidth: each thread sums float4s of a buffer far larger than L2.
__global__ void read_kernel(const float4* p, size_t n, float* out) {
    float s = 0.0f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 v = __ldcs(p + i);
        s += v.x + v.y + v.z + v.w;
    }
    if (s == 123.456f) *out = s;
}

// Dynamic shared memory the timed kernels take on a GPU of compute capability sm (the wide NF4 pair
// table on sm_90; kernels.cu versions without it take none).
static unsigned kernel_smem(bool nf4, const void* fn, int sm, int k) {
#ifdef GV_WIDE_BYTES
    if (nf4 && sm >= 90) {
        // The runtime's size for K (x past the table's 256 chunks too); more than an older kernels.cu uses.
        const unsigned bytes = g4::cuda_rt::gemv_smem(nf4, sm, k);
        CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        return bytes;
    }
#endif
    (void)nf4, (void)fn, (void)sm, (void)k;
    return 0;
}

int main(int argc, char** argv) {
    const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
    const bool lab = argc > 2 && std::string(argv[2]) == "lab"; // also time the variants above
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    // Measured read bandwidth (1 GiB, median of 5).
    size_t nb = (size_t)1 << 30;
    float4* big;
    float* sink;
    CK(cudaMalloc(&big, nb));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(big, 0, nb));
    std::vector<float> bw;
    for (int i = 0; i < 6; ++i) {
        CK(cudaEventRecord(e0, st));
        read_kernel<<<prop.multiProcessorCount * 8, 512, 0, st>>>(big, nb / 16, sink);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i) bw.push_back(nb / (ms * 1e-3f) / 1e9f);
    }
    CK(cudaFree(big));
    const float peak = median(bw);
    std::printf("%s, %d SMs: measured read bandwidth %.0f GB/s\n", prop.name, prop.multiProcessorCount, peak);
    const int sm = prop.major * 10 + prop.minor;

    const std::vector<Case> cases = {
        {"e2b q/k/v (sliding)", true, {2048, 256, 256}, 1536, false},
        {"e2b q/k/v (full)", true, {4096, 512, 512}, 1536, false},
        {"e2b attn_o", true, {1536}, 2048, false},
        {"e2b gate/up", true, {6144, 6144}, 1536, true},
        {"e2b gate/up (wide)", true, {12288, 12288}, 1536, true},
        {"e2b down", true, {1536}, 6144, false},
        {"e2b down (wide)", true, {1536}, 12288, false},
        {"e4b q/k/v", true, {2048, 512, 512}, 2560, false},
        {"e4b gate/up", true, {10240, 10240}, 2560, true},
        {"e4b down", true, {2560}, 10240, false},
        {"e2b ple gate (bf16)", false, {256}, 1536, false},
        {"e2b ple proj (bf16)", false, {1536}, 256, false},
        // The tied LM head: bf16 in plans today (805 MB at E2B, the largest single read of a token), and
        // what an NF4 copy of it would cost.
        {"e2b lm head (bf16)", false, {262144}, 1536, false},
        {"e2b lm head (nf4)", true, {262144}, 1536, false},
        {"e4b lm head (bf16)", false, {262144}, 2560, false},
        {"e4b lm head (nf4)", true, {262144}, 2560, false},
    };
    std::mt19937 rng(1);
    std::printf("%-22s %6s %5s %10s %9s %8s\n", "shape", "MB", "lanes", "us/launch", "GB/s", "of peak");
    for (const Case& c : cases) {
        Mats first = make(c, rng);
        // G4_GEMV_L2=1: one weight set, so it stays in L2 between launches (what the decode graph's
        // kernels see after loading their weights before the wait: the arithmetic, not DRAM).
        const bool l2      = std::getenv("G4_GEMV_L2") && std::atoi(std::getenv("G4_GEMV_L2"));
        const int copies   = l2 ? 1 : (int)std::max<size_t>(2, (size_t)(256u << 20) / first.bytes + 1);
        const int launches = l2 ? 32 : copies; // a sample's back-to-back launches
        std::vector<Mats> sets{first};
        for (int i = 1; i < copies; ++i)
            sets.push_back(make(c, rng));
        int n_out = c.pairs ? c.n[0] : 0;
        if (!c.pairs)
            for (int n : c.n)
                n_out += n;
        float *x, *out, *y;
        CK(cudaMalloc(&x, c.k * 4));
        CK(cudaMalloc(&out, (size_t)n_out * 4));
        CK(cudaMalloc(&y, (size_t)n_out * 4));
        std::vector<float> hx(c.k);
        for (auto& v : hx)
            v = (float)(rng() % 1000) / 1000.0f - 0.5f;
        CK(cudaMemcpy(x, hx.data(), c.k * 4, cudaMemcpyHostToDevice));
        const long groups = c.pairs ? (n_out + 1) / 2 : (n_out + 3) / 4;
        const int pick    = g4::cuda::gemv_lanes(c.k, c.nf4, groups);
        // One launch on weight set 0; returns the outputs (out for pairs, y otherwise).
        auto once = [&](GemvFn fn, unsigned grid, int B, unsigned smem) {
            GemvArgs a{};
            for (size_t m = 0, off = 0; m < first.m.size(); off += first.m[m].n, ++m)
                a.m[m] = first.m[m], a.m[m].y = y + off;
            a.x = x, a.out = out, a.aux = y, a.nmat = (int)first.m.size(), a.k = c.k, a.epi = c.pairs ? 1 : 0,
            a.cap = 30.0f;
            CK(cudaMemset(out, 0, (size_t)n_out * 4));
            CK(cudaMemset(y, 0, (size_t)n_out * 4));
            fn<<<grid, B, smem, st>>>(a);
            CK(cudaStreamSynchronize(st));
            CK(cudaGetLastError());
            std::vector<float> h(n_out);
            CK(cudaMemcpy(h.data(), c.pairs ? out : y, (size_t)n_out * 4, cudaMemcpyDeviceToHost));
            return h;
        };
        int pli = 0;
        while ((8 << pli) != pick)
            ++pli;
        const GemvFn pick_fn = (c.nf4 ? kGemvNf4 : kGemvBf16)[c.pairs][pli];
        const std::vector<float> ref =
            once(pick_fn, (unsigned)(((c.pairs ? (n_out + 1) / 2 : (n_out + 3) / 4) * pick + 127) / 128), 128,
                 kernel_smem(c.nf4, (const void*)pick_fn, sm, c.k));
        for (int vi = -1; vi < (lab ? (int)(sizeof kVariants / sizeof kVariants[0]) : 0); ++vi)
            for (int li = 0; li < 5; ++li) {
                const int L        = 8 << li;
                const Variant* var = vi < 0 ? nullptr : &kVariants[vi];
                if (var && var->per_block ? li != 0 : L > c.k / (c.nf4 ? 32 : 8)) continue;
                if (var && (!var->fn[c.nf4][c.pairs] || (var->kmax && c.k > var->kmax))) continue;
                GemvFn fn   = var ? var->fn[c.nf4][c.pairs](li) : (c.nf4 ? kGemvNf4 : kGemvBf16)[c.pairs][li];
                const int G = var ? var->g : GV_OUT, B = var ? var->b : 128;
                const long vgroups = c.pairs ? (n_out + G / 2 - 1) / (G / 2) : (n_out + G - 1) / G;
                long threads       = var && var->per_block ? vgroups * B : vgroups * L;
                unsigned grid      = (unsigned)((threads + B - 1) / B);
#ifdef G4_LAB_SMEM
                const unsigned smem =
                    var ? (unsigned)G4_LAB_SMEM
                        : kernel_smem(c.nf4, (const void*)fn, sm, c.k); // the lab's dynamic shared memory
#else
                const unsigned smem = var ? 0u : kernel_smem(c.nf4, (const void*)fn, sm, c.k);
#endif
                std::vector<float> t;
                // Each sample: one launch per weight set, back to back (no event between launches).
                for (int r = 0; r < reps + 2; ++r) {
                    CK(cudaEventRecord(e0, st));
                    for (int si = 0; si < launches; ++si) {
                        GemvArgs a{};
                        const Mats& s = sets[si % copies];
                        for (size_t m = 0, off = 0; m < s.m.size(); off += s.m[m].n, ++m) {
                            a.m[m]   = s.m[m];
                            a.m[m].y = y + off;
                        }
                        a.x = x, a.out = out, a.aux = y, a.nmat = (int)s.m.size(), a.k = c.k,
                        a.epi = c.pairs ? 1 : 0, a.cap = 30.0f;
                        fn<<<grid, B, smem, st>>>(a);
                    }
                    CK(cudaEventRecord(e1, st));
                    CK(cudaEventSynchronize(e1));
                    CK(cudaGetLastError());
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    if (r >= 2) t.push_back(ms * 1e3f / launches);
                }
                float us  = median(t);
                float gbs = first.bytes / (us * 1e-6f) / 1e9f;
                // Max |difference| from the compiler's choice, relative to the largest |reference| output.
                const std::vector<float> got = once(fn, grid, B, smem);
                double dmax = 0, rmax = 0;
                for (int i = 0; i < n_out; ++i)
                    dmax = std::max(dmax, (double)std::fabs(got[i] - ref[i])),
                    rmax = std::max(rmax, (double)std::fabs(ref[i]));
                std::printf("%-22s %6.2f %4d%s %10.2f %9.0f %7.1f%%  err %.1e %s\n", c.name,
                            first.bytes / 1e6, var && var->per_block ? B : L, !var && L == pick ? "*" : " ",
                            us, gbs, 100.0f * gbs / peak, dmax / rmax, var ? var->name : "");
            }
        for (auto& s : sets)
            for (auto& m : s.m) {
                cudaFree((void*)m.w);
                if (c.nf4)
                    cudaFree((void*)m.absmax), cudaFree((void*)m.absmax2), cudaFree((void*)m.offset),
                        cudaFree((void*)m.code2);
            }
        cudaFree(x), cudaFree(out), cudaFree(y);
    }
    return 0;
}
