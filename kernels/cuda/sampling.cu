// Sampling on the GPU: greedy argmax inside the decode graph, penalties, softmax normaliser and top-k
// candidates outside it.
// Greedy sampling on the device: index of the largest logit (ties: the lowest index, as the CPU
// sampler). Each block reduces a contiguous slice into ws[2 + 2b] (value bits, index); the last block
// to finish (counter ws[1]) reduces the partials, writes ws[0] and resets the counter.
// grid <= 512, block 1024; ws: int32 [2 + 2 * grid], ws[1] zero at the first launch.
__device__ __forceinline__ void argmax_pick(float& bv, int& bi, float ov, int oi) {
    if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
}
// Tree reduction of every thread's (value, index) in shared memory; the block's pick lands in [0].
__device__ void argmax_block(float* bv, int* bi, float best, int idx) {
    bv[threadIdx.x] = best, bi[threadIdx.x] = idx;
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (threadIdx.x < st)
            argmax_pick(bv[threadIdx.x], bi[threadIdx.x], bv[threadIdx.x + st], bi[threadIdx.x + st]);
        __syncthreads();
    }
}
// Every block's (best, idx) to ws; the last block to finish picks among them and writes the token.
__device__ bool argmax_finish(float* bv, int* bi, float best, int idx, int* ws, Step* step, int* ids,
                              volatile int* host_tok, int limit) {
    __shared__ bool last;
    argmax_block(bv, bi, best, idx);
    if (threadIdx.x == 0) {
        ws[2 + 2 * blockIdx.x] = __float_as_int(bv[0]), ws[3 + 2 * blockIdx.x] = bi[0];
        __threadfence();
        last = atomicAdd(&ws[1], 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return false;
    __threadfence();
    best = NEG_INF, idx = 0x7fffffff;
    for (int b = threadIdx.x; b < gridDim.x; b += blockDim.x)
        argmax_pick(best, idx, __int_as_float(__ldcg(&ws[2 + 2 * b])), __ldcg(&ws[3 + 2 * b]));
    argmax_block(bv, bi, best, idx);
    if (threadIdx.x == 0) {
        ws[0] = bi[0], ws[1] = 0;
        if (step) {
            host_tok[step->pos0 & 1] = bi[0];
            ids[0]                   = bi[0] < limit ? bi[0] : 0;
            step->pos0 += 1;
        }
    }
    return true;
}
// The decode step's greedy token (lowest index among equal maxima) in ws[0]; ws[1] is the blocks'
// counter, reset for the next call. Feed (step non-null): the token also goes to the host-mapped slot
// host_tok[step->pos0 & 1], becomes the next step's id (ids[0]; an id the embedding cannot take,
// >= limit, as 0: such a step is only ever a speculative one the host discards), and the step's
// position advances, so the next decode step can run before the host has read the token.
extern "C" __global__ void g4_argmax(const float* logits, int vocab, int* ws, Step* step, int* ids,
                                     volatile int* host_tok, int limit) {
    G4_TRACE_SCOPE(6, logits);
    pdl_begin();
    __shared__ float bv[1024];
    __shared__ int bi[1024];
    const int per = (vocab + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per, hi = min(vocab, lo + per);
    float best = NEG_INF;
    int idx    = 0x7fffffff;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x)
        argmax_pick(best, idx, logits[i], i);
    argmax_finish(bv, bi, best, idx, ws, step, ids, host_tok, limit);
}

// A batched step's greedy tokens: row j = blockIdx.y of logits [rows, vocab] as g4_argmax on its own with
// rows[j]'s session buffers (its argmax buffer ws, step record, next id, host slot), each block also copying
// its part of the row to rows[j].dst (the session's own logits row; null: none). grid (blocks, rows).
struct ArgmaxRow {
    float* dst;
    int* ws;
    Step* step;
    int* ids;
    int* host_tok;
};
extern "C" __global__ void g4_argmax_rows(const float* logits, int vocab, const ArgmaxRow* rows, int limit) {
    pdl_begin();
    __shared__ float bv[1024];
    __shared__ int bi[1024];
    const ArgmaxRow r = rows[blockIdx.y];
    const float* l    = logits + (long)blockIdx.y * vocab;
    const int per = (vocab + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per, hi = min(vocab, lo + per);
    float best = NEG_INF;
    int idx    = 0x7fffffff;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float v = l[i];
        if (r.dst) r.dst[i] = v;
        argmax_pick(best, idx, v, i);
    }
    argmax_finish(bv, bi, best, idx, r.ws, r.step, r.ids, r.host_tok, limit);
}

// ---- sampling on the GPU (outside the decode graph; the host draws from the candidates).
// Repetition penalty: y = logits (g4_copy_f32), then for each history token t, y[t] = logits[t] * p if
// negative, else / p (duplicates write the same value). grid ceil(n / 256), block 256.
extern "C" __global__ void g4_copy_f32(const float* x, float* y, long n) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
extern "C" __global__ void g4_penalize(const float* logits, float* y, const int* tokens, int n, int vocab,
                                       float penalty) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int t = tokens[i];
    if (t < 0 || t >= vocab) return;
    const float l = logits[t];
    y[t]          = l < 0.0f ? __fmul_rn(l, penalty) : __fdiv_rn(l, penalty);
}
// The softmax's normalizer over a row without top-k (GPU top-p / min-p): block b takes values
// [b * per, (b + 1) * per) of val[i] / temp (rounded as the host divides) and writes their maximum m
// and the sum of exp(v - m) in double, out[2b] = m, out[2b + 1] = sum; the host merges the blocks.
// grid kSoftmaxBlocks, block 256.
extern "C" __global__ void __launch_bounds__(256)
    g4_softmax_partial(const float* val, long n, float temp, double* out) {
    __shared__ float red[32];
    __shared__ double dred[256];
    const long per = (n + gridDim.x - 1) / gridDim.x, lo = (long)blockIdx.x * per, hi = min(n, lo + per);
    float m = NEG_INF;
    for (long i = lo + threadIdx.x; i < hi; i += blockDim.x)
        m = fmaxf(m, __fdiv_rn(val[i], temp));
    m          = block_max(m, red);
    double sum = 0.0;
    if (m > NEG_INF)
        for (long i = lo + threadIdx.x; i < hi; i += blockDim.x)
            sum += exp((double)__fdiv_rn(val[i], temp) - (double)m);
    dred[threadIdx.x] = sum;
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (threadIdx.x < st) dred[threadIdx.x] += dred[threadIdx.x + st];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[2 * blockIdx.x] = (double)m, out[2 * blockIdx.x + 1] = dred[0];
}

// One round of top-k: block b sorts pairs b * TK_BLOCK .. + TK_BLOCK (values val[i] / temp when temp
// > 0, indices idx[i] or i when idx is null; past n: -inf) by value descending, ties by the lower
// index (the host sampler's order), and writes its first `keep` to out[b * keep ..]. Bitonic sort in
// shared memory. grid ceil(n / TK_BLOCK), block 1024.
#define TK_BLOCK 2048
extern "C" __global__ void __launch_bounds__(1024)
    g4_topk_round(const float* val, const int* idx, long n, float temp, int keep, float* oval, int* oidx) {
    __shared__ float sv[TK_BLOCK];
    __shared__ int si[TK_BLOCK];
    const long base = (long)blockIdx.x * TK_BLOCK;
    for (int j = threadIdx.x; j < TK_BLOCK; j += blockDim.x) {
        const long i = base + j;
        float v      = NEG_INF;
        int id       = 0x7fffffff;
        if (i < n) {
            v  = temp > 0.0f ? __fdiv_rn(val[i], temp) : val[i];
            id = idx ? idx[i] : (int)i;
        }
        sv[j] = v, si[j] = id;
    }
    __syncthreads();
    for (int size = 2; size <= TK_BLOCK; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            const int t = threadIdx.x, i = 2 * t - (t & (stride - 1)), j = i + stride;
            const float a = sv[i], b = sv[j];
            const int ia = si[i], ib = si[j];
            const bool first = a > b || (a == b && ia < ib); // i's pair ranks before j's
            if (first != ((i & size) == 0)) sv[i] = b, sv[j] = a, si[i] = ib, si[j] = ia;
            __syncthreads();
        }
    for (int j = threadIdx.x; j < keep; j += blockDim.x)
        oval[(long)blockIdx.x * keep + j] = sv[j], oidx[(long)blockIdx.x * keep + j] = si[j];
}
