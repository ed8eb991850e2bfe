// One op test table (the pattern of llama.cpp's test-backend-ops): every row of kCases runs on every backend
// present (the Eigen CPU kernels always; the CUDA kernels where the build and a GPU allow) and is compared
// with the scalar reference (kernels/ref) under one tolerance per op and dtype (tolerance()). A backend is a
// table of per-op entry points taking the host argument structs of kernels/ops.h; a missing entry means the
// backend does not run that op here, and the row is skipped for it. Adding an op: a row in kCases, a case in
// run_case, and an entry per backend. Adding a backend: one more Backend in backends().
#include "compiler/nf4_quant.h"
#include "cuda/cuda_test_util.h"
#include "kernels/cpu/cpu.h"
#include "kernels/nf4.h"
#include "kernels/ref/ref.h"
#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <gtest/gtest.h>
#include <string>
#include <vector>

namespace {

using namespace g4;
using g4test::randn;
using g4test::to_bf16;

// One row: the op, its sizes (meaning per op, see run_case) and the dtype of its weight or cache.
struct OpCase {
    const char* name;
    OpCode op;
    int rows;
    int64_t a, b, c; // op-specific sizes
    DType dt = DType::F32;
};

// Gemma 4's real sizes (hidden 1536/2560, q widths 2048/4096, MLP 6144/10240, head dims 256/512, PLE 35x256)
// and small edge sizes (one row, odd widths, partial tiles).
const OpCase kCases[] = {
    {"embed_hidden_bf16", OpCode::Embed, 3, 1000, 1536, 0, DType::BF16},
    {"embed_ple_bf16", OpCode::Embed, 2, 300, 35 * 256, 0, DType::BF16},
    {"embed_odd_f32", OpCode::Embed, 1, 17, 2047, 0, DType::F32},
    // decode (1 row), a partial tile, and prefill chunks at the projection shapes
    {"matmul_q_f32", OpCode::Matmul, 1, 2048, 1536, 0, DType::F32},
    {"matmul_q_bf16", OpCode::Matmul, 1, 2048, 1536, 0, DType::BF16},
    {"matmul_down_f32", OpCode::Matmul, 1, 1536, 12288, 0, DType::F32},
    {"matmul_down_bf16", OpCode::Matmul, 1, 1536, 12288, 0, DType::BF16},
    {"matmul_q4096_rows3_bf16", OpCode::Matmul, 3, 4096, 1536, 0, DType::BF16},
    {"matmul_kv_2560_f32", OpCode::Matmul, 1, 512, 2560, 0, DType::F32},
    {"matmul_down10240_rows5_bf16", OpCode::Matmul, 5, 2560, 10240, 0, DType::BF16},
    {"matmul_rows17_f32", OpCode::Matmul, 17, 8960, 1536, 0, DType::F32},
    {"matmul_rows70_bf16", OpCode::Matmul, 70, 256, 1536, 0, DType::BF16},
    {"matmul_odd_f32", OpCode::Matmul, 2, 1537, 257, 0, DType::F32},
    {"matmul_odd_bf16", OpCode::Matmul, 2, 1537, 257, 0, DType::BF16},
    {"matmul_q_nf4", OpCode::Matmul, 1, 2048, 1536, 0, DType::NF4},
    {"matmul_rows3_nf4", OpCode::Matmul, 3, 1536, 6144, 0, DType::NF4},
    // NF4 x int16 (MatmulArgs::int16_x): decode projections of E2B (gate/up, down, k/v; down with 5 rows: a
    // group of 4 and 1) and E4B (o), and a K that is not whole blocks (the fp32 path)
    {"matmul_int16_gate_e2b_nf4", OpCode::Matmul, 1, 6144, 1536, 0, DType::NF4},
    {"matmul_int16_down_e2b_nf4", OpCode::Matmul, 1, 1536, 6144, 0, DType::NF4},
    {"matmul_int16_kv_e2b_nf4", OpCode::Matmul, 1, 256, 1536, 0, DType::NF4},
    {"matmul_int16_o_e4b_nf4", OpCode::Matmul, 1, 2560, 2048, 0, DType::NF4},
    {"matmul_int16_down_e2b_rows5_nf4", OpCode::Matmul, 5, 1536, 6144, 0, DType::NF4},
    {"matmul_int16_odd_nf4", OpCode::Matmul, 2, 130, 100, 0, DType::NF4},
    // ... and prefill chunks (more than 8 rows: cpu::matmul_nf4_gemm_int16): E2B q with 9 rows (a tile of 9),
    // E2B down with 64 and E4B o with 33 (whole tiles and a tail of one row), E2B k/v with 512, and a column
    // count that leaves a partial group of columns
    {"matmul_int16_q_e2b_rows9_nf4", OpCode::Matmul, 9, 2048, 1536, 0, DType::NF4},
    {"matmul_int16_down_e2b_rows64_nf4", OpCode::Matmul, 64, 1536, 6144, 0, DType::NF4},
    {"matmul_int16_o_e4b_rows33_nf4", OpCode::Matmul, 33, 2560, 2048, 0, DType::NF4},
    {"matmul_int16_kv_e2b_rows512_nf4", OpCode::Matmul, 512, 256, 1536, 0, DType::NF4},
    {"matmul_int16_cols_rows20_nf4", OpCode::Matmul, 20, 130, 128, 0, DType::NF4},
    // bf16 with int16_x: the bf16 GEMV of decode steps (kernels/cpu/gemv_bf16.cpp): E2B's per-layer
    // projection, slices of the E2B / E4B LM heads (1 and 5 rows: a group of 4 and 1), a K of whole chunks
    // and a tail
    {"matmul_int16_ple_e2b_bf16", OpCode::Matmul, 1, 8960, 1536, 0, DType::BF16},
    {"matmul_int16_head_e2b_bf16", OpCode::Matmul, 1, 4099, 1536, 0, DType::BF16},
    {"matmul_int16_head_e4b_rows5_bf16", OpCode::Matmul, 5, 1031, 2560, 0, DType::BF16},
    {"matmul_int16_odd_bf16", OpCode::Matmul, 8, 67, 1000, 0, DType::BF16},
    {"rmsnorm_hidden_bf16", OpCode::RmsNorm, 3, 2560, 2560, 0, DType::BF16},
    {"rmsnorm_heads_f32", OpCode::RmsNorm, 2, 8 * 256, 256, 0, DType::F32},
    {"rmsnorm_noscale", OpCode::RmsNorm, 1, 512, 512, 0, DType::F32},
    {"add_hidden", OpCode::Add, 4, 1536, 0, 0},
    {"add_odd", OpCode::Add, 1, 13, 0, 0},
    {"add_tower_rows", OpCode::Add, 97, 1024, 0, 0}, // rows in blocks over the pool (kernels/cpu/row_tasks.h)
    {"gelu_mul_mlp", OpCode::GeluMul, 2, 6144, 0, 0},
    {"gelu_mul_odd", OpCode::GeluMul, 3, 31, 0, 0},
    {"gelu_mul_rows", OpCode::GeluMul, 19, 1536, 0, 0},
    {"scale_hidden", OpCode::Scale, 3, 2560, 0, 0},
    {"scale_tensor_bf16", OpCode::Scale, 2, 1536, 0, 0, DType::BF16},
    {"scale_rows", OpCode::Scale, 33, 768, 0, 0},
    {"softcap_logits", OpCode::Softcap, 1, 4099, 0, 0},
    {"rope_q256", OpCode::Rope, 3, 8, 256, 100},
    {"rope_q512", OpCode::Rope, 2, 8, 512, 4000},
    {"kv_store_f32", OpCode::KvStore, 5, 256, 64, 61, DType::F32},
    {"kv_store_bf16", OpCode::KvStore, 3, 512, 16, 14, DType::BF16},
    {"attention_causal_f32", OpCode::Attention, 3, 8, 256, 40, DType::F32},
    {"attention_window_bf16", OpCode::Attention, 4, 4, 512, 90, DType::BF16},
    {"clamp_odd", OpCode::Clamp, 3, 1025, 0, 0},
    {"pool_rows_4", OpCode::PoolRows, 7, 768, 4, 0},
    {"pool_rows_9_odd", OpCode::PoolRows, 11, 40, 9, 0},
    {"add_position_2d_bf16", OpCode::AddPosition2D, 50, 768, 16, 0, DType::BF16},
    {"add_position_2d_f32", OpCode::AddPosition2D, 70, 48, 12, 0, DType::F32},
    {"add_position_2d_odd_bf16", OpCode::AddPosition2D, 3, 33, 4, 0, DType::BF16},
    {"rope_2d_h12_d64", OpCode::Rope2D, 40, 12, 64, 0},
    {"rope_2d_h3_d72", OpCode::Rope2D, 45, 3, 72, 0},
    {"rope_2d_one_row", OpCode::Rope2D, 1, 2, 8, 0},
    {"self_attention_gqa", OpCode::SelfAttention, 33, 4, 2, 72},
    {"self_attention_mqa", OpCode::SelfAttention, 100, 6, 1, 64},
    {"self_attention_one_row", OpCode::SelfAttention, 1, 2, 2, 64},
    // The vision tower's heads (12 x 64) over 300 patches; BF16 rows run the op with bf16 = 1 (the
    // --tower-precision bf16 kernel; the reference stays fp32).
    {"self_attention_vision", OpCode::SelfAttention, 300, 12, 12, 64},
    {"self_attention_vision_bf16", OpCode::SelfAttention, 300, 12, 12, 64, DType::BF16},
    {"self_attention_gqa_bf16", OpCode::SelfAttention, 33, 4, 2, 72, DType::BF16},
    {"self_attention_d16_bf16", OpCode::SelfAttention, 5, 2, 2, 16, DType::BF16},
};

// Per op and dtype: the largest relative L2 error a backend may show against the reference.
double tolerance(OpCode op, DType dt) {
    switch (op) {
    case OpCode::Embed:
    case OpCode::KvStore:
    case OpCode::Add:
    case OpCode::Clamp:
        return 0.0; // a copy, a rounding or one add per element: bit for bit
    case OpCode::Scale:
    case OpCode::GeluMul:
    case OpCode::Softcap:
    case OpCode::AddPosition2D:
    case OpCode::Rope2D:
    case OpCode::PoolRows:
        return 1e-6;
    case OpCode::SelfAttention:
        return dt == DType::BF16 ? 1e-2 : 2e-6; // bf16: q, k, v and the probabilities rounded (~3e-3)
    default:
        return dt == DType::NF4 ? 1e-4 : 1e-5;
    }
}

// A backend: its name, whether it can run here (and why not), and its entry points. Null = not wired.
struct Backend {
    std::string name;
    std::function<std::string()> unavailable; // "" when present
    std::function<bool(const OpCase&)> runs;  // null: every row whose op has an entry point
    std::function<void(const EmbedArgs&)> embed;
    std::function<void(const MatmulArgs&)> matmul;
    std::function<void(const RmsNormArgs&)> rms_norm;
    std::function<void(const BinaryArgs&)> add, gelu_mul;
    std::function<void(const ScaleArgs&)> scale, softcap;
    std::function<void(const RopeArgs&)> rope;
    std::function<void(const KvStoreArgs&)> kv_store;
    std::function<void(const AttentionArgs&)> attention;
    std::function<void(const ClampArgs&)> clamp;
    std::function<void(const PoolRowsArgs&)> pool_rows;
    std::function<void(const AddPosition2DArgs&)> add_position_2d;
    std::function<void(const Rope2DArgs&)> rope_2d;
    std::function<void(const SelfAttentionArgs&)> self_attention;
};

Backend reference() {
    Backend b;
    b.name        = "ref";
    b.unavailable = [] { return std::string(); };
    b.embed = ref::embed, b.matmul = ref::matmul, b.rms_norm = ref::rms_norm, b.add = ref::add;
    b.gelu_mul = ref::gelu_mul, b.scale = ref::scale, b.softcap = ref::softcap, b.rope = ref::rope;
    b.kv_store = ref::kv_store, b.attention = ref::attention, b.clamp = ref::clamp,
    b.pool_rows       = ref::pool_rows;
    b.add_position_2d = ref::add_position_2d, b.rope_2d = ref::rope_2d,
    b.self_attention = ref::self_attention;
    return b;
}

// The Eigen CPU kernels on two threads, scratch sized for the largest row of the table.
Backend cpu_backend() {
    static cpu::ThreadPool pool{2};
    static const size_t stride =
        std::max(cpu::scratch_floats_per_thread(16384, 4096), cpu::self_attention_thread_floats(1024));
    static std::vector<float> scratch(stride * pool.size());
    static const cpu::Context c{&pool, scratch.data(), stride};
    Backend b;
    b.name            = "cpu";
    b.unavailable     = [] { return std::string(); };
    b.embed           = [](const EmbedArgs& a) { cpu::embed(c, a); };
    b.matmul          = [](const MatmulArgs& a) { cpu::matmul(c, a); };
    b.rms_norm        = [](const RmsNormArgs& a) { cpu::rms_norm(c, a); };
    b.add             = [](const BinaryArgs& a) { cpu::add(c, a); };
    b.gelu_mul        = [](const BinaryArgs& a) { cpu::gelu_mul(c, a); };
    b.scale           = [](const ScaleArgs& a) { cpu::scale(c, a); };
    b.softcap         = [](const ScaleArgs& a) { cpu::softcap(c, a); };
    b.rope            = [](const RopeArgs& a) { cpu::rope(c, a); };
    b.kv_store        = [](const KvStoreArgs& a) { cpu::kv_store(c, a); };
    b.attention       = [](const AttentionArgs& a) { cpu::attention(c, a); };
    b.clamp           = [](const ClampArgs& a) { cpu::clamp(c, a); };
    b.pool_rows       = [](const PoolRowsArgs& a) { cpu::pool_rows(c, a); };
    b.add_position_2d = [](const AddPosition2DArgs& a) { cpu::add_position_2d(c, a); };
    b.rope_2d         = [](const Rope2DArgs& a) { cpu::rope_2d(c, a); };
    b.self_attention  = [](const SelfAttentionArgs& a) {
        std::vector<float> work(self_attention_work_floats(a.rows, a.kv_heads, a.dim));
        SelfAttentionArgs w = a;
        w.work              = work.data();
        cpu::self_attention(c, w);
    };
    return b;
}

// The CUDA kernels (NVRTC-compiled for the GPU present, cuda_test_util.h): host arguments uploaded, the
// kernel launched, the outputs copied back into the host buffers.
Backend cuda_backend() {
    using namespace g4test_cuda;
    Backend b;
    b.name        = "cuda";
    b.unavailable = [] { return gpu().d ? std::string() : "no NVIDIA GPU here: " + gpu().why; };
    b.embed       = [](const EmbedArgs& a) {
        Dev dev;
        const size_t ny = (size_t)a.rows * a.ldy;
        std::vector<int> ids(a.ids, a.ids + a.rows);
        const size_t tab_bytes = dtype_bytes(a.dt, a.vocab * a.n);
        std::vector<uint8_t> table((const uint8_t*)a.table, (const uint8_t*)a.table + tab_bytes);
        CUdeviceptr step = dev.step(a.rows, 0, 1), gids = dev.up(ids), gtab = dev.up(table),
                    gy = dev.up(std::vector<float>(a.y, a.y + ny));
        int dt         = a.dt == DType::BF16 ? 1 : 0; // the kernels' loadw: 0 f32, 1 bf16
        long n = a.n, ldy = a.ldy;
        float s = a.scale;
        launch("g4_embed", a.rows, (unsigned)((a.n + 2047) / 2048), 256,
                     {&step, &gids, &gtab, &dt, &n, &s, &gy, &ldy});
        std::vector<float> y = dev.down<float>(gy, ny);
        std::copy(y.begin(), y.end(), a.y);
    };
    b.kv_store = [](const KvStoreArgs& a) {
        Dev dev;
        const size_t bytes = (size_t)a.slots * a.width * (a.cache_dt == DType::BF16 ? 2 : 4);
        std::vector<float> k(a.k, a.k + (size_t)a.rows * a.ldk), v(a.v, a.v + (size_t)a.rows * a.ldv);
        std::vector<uint8_t> kc((const uint8_t*)a.k_cache, (const uint8_t*)a.k_cache + bytes),
            vc((const uint8_t*)a.v_cache, (const uint8_t*)a.v_cache + bytes);
        CUdeviceptr step = dev.step(a.rows, a.pos0, 1), gk = dev.up(k), gv = dev.up(v), gkc = dev.up(kc),
                    gvc = dev.up(vc);
        int width = a.width, slots = a.slots, kvdt = kvdt_arg(a.cache_dt);
        long ldk = a.ldk, ldv = a.ldv;
        launch("g4_kv_store", a.rows, 1, 256,
               {&step, &gk, &ldk, &gv, &ldv, &gkc, &gvc, &width, &slots, &kvdt});
        kc = dev.down<uint8_t>(gkc, bytes), vc = dev.down<uint8_t>(gvc, bytes);
        std::copy(kc.begin(), kc.end(), (uint8_t*)a.k_cache);
        std::copy(vc.begin(), vc.end(), (uint8_t*)a.v_cache);
    };
    b.attention = [](const AttentionArgs& a) {
        ASSERT_EQ(a.ldq, a.ldy) << "the CUDA attention kernels take one row stride";
        Dev dev;
        const size_t cache = (size_t)a.slots * a.kv_heads * a.dim, ny = (size_t)a.rows * a.ldy;
        const size_t bytes = cache * (a.cache_dt == DType::BF16 ? 2 : 4);
        std::vector<uint8_t> kc((const uint8_t*)a.k_cache, (const uint8_t*)a.k_cache + bytes),
            vc((const uint8_t*)a.v_cache, (const uint8_t*)a.v_cache + bytes);
        CUdeviceptr step = dev.step(a.rows, a.pos0, a.rows), gq = dev.up(std::vector<float>(a.q, a.q + ny)),
                    gkc = dev.up(kc), gvc = dev.up(vc), gy = dev.alloc(ny * 4);
        int heads = a.heads, kvh = a.kv_heads, dim = a.dim, slots = a.slots, window = a.window,
            kvdt       = kvdt_arg(a.cache_dt);
        float scale    = a.scale;
        long ld        = a.ldq;
        const int span = window > 0 ? std::min(window, slots) : slots;
        int splits = std::max(1, std::min(32, (span + 63) / 64)), max_span = span;
        CUdeviceptr part = dev.alloc((size_t)a.rows * heads * splits * (dim + 2) * 4);
        CUdeviceptr sc = dev.alloc((size_t)a.rows * heads * splits * ((span + splits - 1) / splits + 1) * 4);
        launch("g4_attention_partial", a.rows * heads, splits, 256,
               {&step, &gq, &ld, &gkc, &gvc, &heads, &kvh, &dim, &slots, &window, &scale, &splits, &part, &sc,
                &max_span, &kvdt});
        int all = -1;
        launch("g4_attention_merge", a.rows * heads, (dim + 63) / 64, 256,
               {&step, &part, &heads, &dim, &splits, &gy, &ld, &all});
        std::vector<float> y = dev.down<float>(gy, ny);
        std::copy(y.begin(), y.end(), a.y);
    };
    // The encoder-program kernels (kernels/cuda/encoder_ops.cu), launched as
    // runtime/src/cuda/encoder_launch.cpp launches them.
    b.clamp = [](const ClampArgs& a) {
        Dev dev;
        const size_t nx = (size_t)a.rows * a.ldx, ny = (size_t)a.rows * a.ldy;
        CUdeviceptr gx = dev.up(std::vector<float>(a.x, a.x + nx)),
                    gy = dev.up(std::vector<float>(a.y, a.y + ny));
        long ldx = a.ldx, ldy = a.ldy;
        int cols = a.cols;
        float lo = a.lo, hi = a.hi;
        launch("g4_clamp", a.rows, (unsigned)((cols + 255) / 256), 256,
               {&gx, &ldx, &gy, &ldy, &cols, &lo, &hi});
        std::vector<float> y = dev.down<float>(gy, ny);
        std::copy(y.begin(), y.end(), a.y);
    };
    b.pool_rows = [](const PoolRowsArgs& a) {
        Dev dev;
        std::vector<int32_t> index(a.index, a.index + (size_t)a.rows * a.taps);
        const int32_t xrows = *std::max_element(index.begin(), index.end()) + 1;
        const size_t nx = (size_t)xrows * a.ldx, ny = (size_t)a.rows * a.ldy;
        CUdeviceptr gx = dev.up(std::vector<float>(a.x, a.x + nx)), gi = dev.up(index),
                    gy = dev.up(std::vector<float>(a.y, a.y + ny));
        long ldx = a.ldx, ldy = a.ldy;
        int taps = a.taps, cols = a.cols;
        float w = a.w;
        launch("g4_pool_rows", a.rows, (unsigned)((cols + 255) / 256), 256,
               {&gx, &ldx, &gi, &taps, &w, &gy, &ldy, &cols});
        std::vector<float> y = dev.down<float>(gy, ny);
        std::copy(y.begin(), y.end(), a.y);
    };
    b.add_position_2d = [](const AddPosition2DArgs& a) {
        Dev dev;
        const size_t nx = (size_t)a.rows * a.ldx, ny = (size_t)a.rows * a.ldy;
        const size_t tab_bytes = dtype_bytes(a.dt, 2 * a.positions * a.cols);
        std::vector<uint8_t> table((const uint8_t*)a.table, (const uint8_t*)a.table + tab_bytes);
        CUdeviceptr gx = dev.up(std::vector<float>(a.x, a.x + nx)), gt = dev.up(table),
                    gp = dev.up(std::vector<int32_t>(a.pos, a.pos + 2 * (size_t)a.rows)),
                    gy = dev.up(std::vector<float>(a.y, a.y + ny));
        long ldx = a.ldx, ldy = a.ldy, P = a.positions;
        int tdt = a.dt == DType::BF16 ? 1 : 0, cols = a.cols;
        launch("g4_add_position_2d", a.rows, (unsigned)((cols + 255) / 256), 256,
               {&gx, &ldx, &gt, &tdt, &P, &gp, &gy, &ldy, &cols});
        std::vector<float> y = dev.down<float>(gy, ny);
        std::copy(y.begin(), y.end(), a.y);
    };
    b.rope_2d = [](const Rope2DArgs& a) {
        Dev dev;
        const size_t nx = (size_t)a.rows * a.ldx;
        CUdeviceptr gx  = dev.up(std::vector<float>(a.x, a.x + nx)),
                    gf  = dev.up(std::vector<float>(a.inv_freq, a.inv_freq + a.dim / 4)),
                    gp  = dev.up(std::vector<int32_t>(a.pos, a.pos + 2 * (size_t)a.rows));
        long ldx        = a.ldx;
        int D           = a.dim;
        launch("g4_rope_2d", a.rows, a.heads, std::max(32, D / 2), {&gx, &ldx, &gf, &gp, &D});
        std::vector<float> x = dev.down<float>(gx, nx);
        std::copy(x.begin(), x.end(), a.x);
    };
    return b;
}

std::vector<Backend> backends() {
    return {cpu_backend(), cuda_backend()};
}

// Output buffers of one run, compared element-wise as floats (bf16 caches widened).
using Outputs = std::vector<std::vector<float>>;

std::vector<float> widen(const std::vector<uint16_t>& v) {
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); ++i)
        f[i] = bf16_to_f32(v[i]);
    return f;
}

// The encoder ops (12-16), as run_case.
bool run_encoder_case(const OpCase& c, const Backend& be, Outputs* out) {
    const int T     = c.rows;
    const auto fill = [](size_t n, float v) { return std::vector<float>(n, v); };
    switch (c.op) {
    case OpCode::Clamp: {
        if (!be.clamp) return false;
        const int64_t n = c.a;
        auto x = randn((size_t)T * n, 15, 3.0f), y = fill((size_t)T * n, 0.0f);
        be.clamp({x.data(), n, y.data(), n, T, (int32_t)n, -1.5f, 2.0f});
        *out = {y};
        return true;
    }
    case OpCode::PoolRows: {
        if (!be.pool_rows) return false;
        const int64_t n = c.a;
        const int taps = (int)c.b, xrows = T * taps;
        auto x = randn((size_t)xrows * n, 16), y = fill((size_t)T * n, 0.0f);
        std::vector<int32_t> index((size_t)T * taps);
        for (size_t i = 0; i < index.size(); ++i)
            index[i] = (int32_t)((i * 5 + 3) % xrows);
        be.pool_rows({x.data(), n, index.data(), y.data(), n, T, (int32_t)n, taps, 1.0f / taps});
        *out = {y};
        return true;
    }
    case OpCode::AddPosition2D: {
        if (!be.add_position_2d) return false;
        const int64_t n = c.a, P = c.b;
        auto x = randn((size_t)T * n, 17), tf = randn((size_t)2 * P * n, 18), y = fill((size_t)T * n, 0.0f);
        auto tb = to_bf16(tf);
        std::vector<int32_t> pos(2 * T);
        for (int r = 0; r < T; ++r)
            pos[2 * r] = (int32_t)(r % P), pos[2 * r + 1] = (int32_t)((r / P) % P);
        const void* tab = c.dt == DType::BF16 ? (const void*)tb.data() : (const void*)tf.data();
        be.add_position_2d({x.data(), n, tab, c.dt, P, pos.data(), y.data(), n, T, (int32_t)n});
        *out = {y};
        return true;
    }
    case OpCode::Rope2D: {
        if (!be.rope_2d) return false;
        const int heads = (int)c.a, D = (int)c.b;
        const int64_t ld = (int64_t)heads * D + 5;
        auto x           = randn((size_t)T * ld, 19);
        std::vector<float> inv(D / 4);
        for (int i = 0; i < D / 4; ++i)
            inv[i] = std::pow(100.0f, -4.0f * i / D);
        std::vector<int32_t> pos(2 * T);
        for (int r = 0; r < T; ++r)
            pos[2 * r] = r % 7, pos[2 * r + 1] = r / 7;
        be.rope_2d({x.data(), ld, inv.data(), pos.data(), T, heads, D});
        *out = {x};
        return true;
    }
    case OpCode::SelfAttention: {
        if (!be.self_attention) return false;
        const int heads = (int)c.a, kv = (int)c.b, D = (int)c.c;
        const int64_t qw = (int64_t)heads * D, kvw = (int64_t)kv * D, ld = qw + 2 * kvw + 4;
        auto qkv = randn((size_t)T * ld, 20, 0.5f), y = fill((size_t)T * qw, -7.0f);
        be.self_attention({qkv.data(), ld, qkv.data() + qw, ld, qkv.data() + qw + kvw, ld, y.data(), qw, T,
                           heads, kv, D, 1.0f / std::sqrt((float)D), nullptr, c.dt == DType::BF16});
        *out = {y};
        return true;
    }
    default:
        ADD_FAILURE() << c.name << ": no inputs for this op in run_case";
        return false;
    }
}

// Builds the row's inputs (the same seeds for every backend), runs it on `be`; false when `be` lacks the op.
bool run_case(const OpCase& c, const Backend& be, Outputs* out) {
    const int T     = c.rows;
    const auto fill = [](size_t n, float v) { return std::vector<float>(n, v); };
    switch (c.op) {
    case OpCode::Embed: {
        if (!be.embed) return false;
        const int64_t V = c.a, N = c.b, ldy = N + 3;
        auto tf = randn((size_t)V * N, 1);
        auto tb = to_bf16(tf);
        std::vector<int32_t> ids(T);
        for (int t = 0; t < T; ++t)
            ids[t] = (int32_t)((t * 7919 + 13) % V);
        auto y          = fill((size_t)T * ldy, -7.0f);
        const void* tab = c.dt == DType::BF16 ? (const void*)tb.data() : (const void*)tf.data();
        be.embed({ids.data(), tab, c.dt, V, N, 39.1918f, y.data(), ldy, T});
        *out = {y};
        return true;
    }
    case OpCode::Matmul: {
        if (!be.matmul) return false;
        const int64_t N = c.a, K = c.b;
        auto x = randn((size_t)T * K, 2), wf = randn((size_t)N * K, 3, 0.05f);
        auto wb = to_bf16(wf);
        auto y  = fill((size_t)T * N, 0.0f);
        std::vector<uint8_t> blob;
        if (c.dt == DType::NF4) blob = nf4::quantize(wf.data(), N * K, true);
        const void* w = c.dt == DType::BF16  ? (const void*)wb.data()
                        : c.dt == DType::NF4 ? (const void*)blob.data()
                                             : (const void*)wf.data();
        MatmulArgs a{x.data(), K, w, c.dt, N, K, y.data(), N, T};
        a.nf4_double_quant = c.dt == DType::NF4;
        a.int16_x          = std::string(c.name).find("int16") != std::string::npos;
        be.matmul(a);
        *out = {y};
        return true;
    }
    case OpCode::RmsNorm: {
        if (!be.rms_norm) return false;
        const int cols = (int)c.a, dim = (int)c.b;
        const bool noscale = std::string(c.name).find("noscale") != std::string::npos;
        auto x = randn((size_t)T * cols, 4), wf = randn(dim, 5, 0.3f);
        auto wb       = to_bf16(wf);
        auto y        = fill((size_t)T * cols, 0.0f);
        const void* w = noscale               ? nullptr
                        : c.dt == DType::BF16 ? (const void*)wb.data()
                                              : (const void*)wf.data();
        be.rms_norm({x.data(), cols, w, c.dt, y.data(), cols, T, cols, dim, 1e-6f});
        *out = {y};
        return true;
    }
    case OpCode::Add:
    case OpCode::GeluMul: {
        const auto& f = c.op == OpCode::Add ? be.add : be.gelu_mul;
        if (!f) return false;
        const int64_t n = c.a;
        auto a = randn((size_t)T * n, 6), b = randn((size_t)T * n, 7);
        auto y = fill((size_t)T * n, 0.0f);
        f({a.data(), n, b.data(), n, y.data(), n, T, (int32_t)n});
        *out = {y};
        return true;
    }
    case OpCode::Scale:
    case OpCode::Softcap: {
        const auto& f = c.op == OpCode::Scale ? be.scale : be.softcap;
        if (!f) return false;
        const int64_t n          = c.a;
        auto x                   = randn((size_t)T * n, 8, 20.0f);
        auto y                   = fill((size_t)T * n, 0.0f);
        std::vector<uint16_t> st = to_bf16({0.73f});
        const bool tensor        = c.op == OpCode::Scale && c.dt == DType::BF16;
        f({x.data(), n, y.data(), n, T, (int32_t)n, 0.0625f, tensor ? st.data() : nullptr, c.dt, 30.0f});
        *out = {y};
        return true;
    }
    case OpCode::Rope: {
        if (!be.rope) return false;
        const int heads = (int)c.a, D = (int)c.b;
        auto x = randn((size_t)T * heads * D, 9);
        std::vector<float> inv(D / 2);
        for (int i = 0; i < D / 2; ++i)
            inv[i] = std::pow(10000.0f, -2.0f * i / D);
        be.rope({x.data(), (int64_t)heads * D, inv.data(), T, heads, D, (int32_t)c.c});
        *out = {x};
        return true;
    }
    case OpCode::KvStore: {
        if (!be.kv_store) return false;
        const int width = (int)c.a, slots = (int)c.b;
        const int64_t ld = width + 64;
        auto k = randn((size_t)T * ld, 10), v = randn((size_t)T * ld, 11);
        const size_t n = (size_t)slots * width;
        if (c.dt == DType::BF16) {
            std::vector<uint16_t> kc(n, 0), vc(n, 0);
            be.kv_store(
                {k.data(), ld, v.data(), ld, kc.data(), vc.data(), T, width, slots, (int32_t)c.c, c.dt});
            *out = {widen(kc), widen(vc)};
        } else {
            auto kc = fill(n, 0.0f), vc = fill(n, 0.0f);
            be.kv_store(
                {k.data(), ld, v.data(), ld, kc.data(), vc.data(), T, width, slots, (int32_t)c.c, c.dt});
            *out = {kc, vc};
        }
        return true;
    }
    case OpCode::Attention: {
        if (!be.attention) return false;
        const int heads = (int)c.a, D = (int)c.b, kv = 1, pos0 = (int)c.c, slots = 128;
        const int window = c.dt == DType::BF16 ? 32 : 0;
        auto q           = randn((size_t)T * heads * D, 12);
        auto kf = randn((size_t)slots * kv * D, 13), vf = randn((size_t)slots * kv * D, 14);
        auto kb = to_bf16(kf), vb = to_bf16(vf);
        const bool bf = c.dt == DType::BF16;
        auto y = fill((size_t)T * heads * D, 0.0f), scratch = fill(slots * 4, 0.0f);
        AttentionArgs a{q.data(),
                        (int64_t)heads * D,
                        bf ? (const void*)kb.data() : kf.data(),
                        bf ? (const void*)vb.data() : vf.data(),
                        y.data(),
                        (int64_t)heads * D,
                        T,
                        heads,
                        kv,
                        D,
                        slots,
                        window,
                        pos0,
                        1.0f,
                        scratch.data(),
                        c.dt};
        be.attention(a);
        *out = {y};
        return true;
    }
    default:
        return run_encoder_case(c, be, out);
    }
}

class OpTable : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpTable, EveryBackendMatchesReference) {
    const OpCase& c = GetParam();
    Outputs want;
    ASSERT_TRUE(run_case(c, reference(), &want)) << c.name << ": the reference lacks this op";
    const double tol = tolerance(c.op, c.dt);
    int ran          = 0;
    for (const Backend& be : backends()) {
        if (std::string why = be.unavailable(); !why.empty()) {
            std::printf("%s: %s skipped (%s)\n", c.name, be.name.c_str(), why.c_str());
            continue;
        }
        Outputs got;
        if ((be.runs && !be.runs(c)) || !run_case(c, be, &got)) continue;
        ++ran;
        ASSERT_EQ(got.size(), want.size()) << be.name;
        for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_EQ(got[i].size(), want[i].size()) << be.name;
            const double e = g4test::rel_l2(got[i].data(), want[i].data(), want[i].size());
            EXPECT_LE(e, tol) << c.name << " on " << be.name << ", output " << i;
        }
    }
    EXPECT_GE(ran, 1) << c.name << ": no backend runs this op";
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTable, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<OpCase>& i) { return std::string(i.param.name); });

} // namespace
