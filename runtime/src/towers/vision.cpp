// Gemma 4 vision tower on the CPU (see vision.h). Float32 arithmetic throughout, weights widened on
// the fly. Where Hugging Face's bfloat16 run rounds, this code (like HF's float32 run) does not; those
// places are marked "HF bf16:".
#include "runtime/src/towers/vision.h"

#include "runtime/src/encoder_inputs.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

namespace g4::towers {

namespace {

using json   = nlohmann::json;
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapRM  = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;
using MapRMc = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;

constexpr int kAttnBlock =
    2 * cpu::kGemmMr;         // query rows per attention task: scores [kAttnBlock, np] per thread
constexpr int kMlpRows = 256; // patches per MLP pass: gate, up and the clamped input [kMlpRows, I] each

size_t round16(size_t n) {
    return (n + 15) / 16 * 16;
}
int64_t pad_keys(int64_t n) {
    return (n + cpu::kGemmNr - 1) / cpu::kGemmNr * cpu::kGemmNr;
} // row stride of K^T

std::string shape_str(const int64_t* d, int nd) {
    std::string s = "[";
    for (int i = 0; i < nd; ++i)
        s += (i ? ", " : "") + std::to_string(d[i]);
    return s + "]";
}

// Rows [0, rows) in parallel blocks (inline when small).
template <class F> void for_row_blocks(const cpu::Context& ctx, int rows, int64_t cols, F&& f) {
    constexpr int kBlock = 64;
    const int blocks     = (rows + kBlock - 1) / kBlock;
    if ((int64_t)rows * cols < (1 << 14) || ctx.pool->size() == 1 || blocks == 1) {
        f(0, rows);
        return;
    }
    ctx.pool->parallel_for(blocks, [&](int64_t b, int) {
        int r0 = (int)b * kBlock;
        f(r0, std::min(rows, r0 + kBlock));
    });
}

void rms(const cpu::Context& ctx, const float* x, int64_t ldx, const Tensor* w, float* y, int64_t ldy,
         int rows, int cols, int dim, float eps) {
    RmsNormArgs a{};
    a.x = x, a.ldx = ldx, a.w = w ? w->data : nullptr, a.wdt = w ? w->dtype : DType::F32;
    a.y = y, a.ldy = ldy, a.rows = rows, a.cols = cols, a.dim = dim, a.eps = eps;
    cpu::rms_norm(ctx, a);
}

void gemm(const cpu::Context& ctx, Precision prec, const MatmulArgs& m) {
    if (prec == Precision::BF16)
        cpu::matmul_gemm_bf16(ctx, m);
    else
        cpu::matmul_gemm(ctx, m);
}

} // namespace

// ---- config ----------------------------------------------------------------------------------------------

std::string parse_vision_hparams(const std::string& text, int text_hidden_size, VisionHParams* out) {
    json j;
    try {
        j = json::parse(text);
    } catch (const std::exception& e) {
        return std::string("vision_config: not valid JSON: ") + e.what();
    }
    if (!j.is_object()) return "vision_config: expected a JSON object";
    VisionHParams hp{};
    std::string err;
    auto get_int = [&](const char* key, int* dst, int lo) {
        if (!err.empty()) return;
        auto it = j.find(key);
        if (it == j.end()) {
            err = std::string("vision_config: missing key \"") + key + "\"";
        } else if (!it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > (1 << 30)) {
            err = std::string("vision_config: \"") + key + "\" must be an integer >= " + std::to_string(lo) +
                  ", got " + it->dump();
        } else {
            *dst = (int)it->get<int64_t>();
        }
    };
    get_int("hidden_size", &hp.hidden_size, 1);
    get_int("num_hidden_layers", &hp.num_hidden_layers, 0);
    get_int("num_attention_heads", &hp.num_attention_heads, 1);
    get_int("num_key_value_heads", &hp.num_key_value_heads, 1);
    get_int("head_dim", &hp.head_dim, 4);
    get_int("intermediate_size", &hp.intermediate_size, 1);
    get_int("patch_size", &hp.patch_size, 1);
    get_int("pooling_kernel_size", &hp.pooling_kernel_size, 1);
    get_int("position_embedding_size", &hp.position_embedding_size, 1);
    if (!err.empty()) return err;

    auto num_or = [&](const json& o, const char* key, double def, double* dst) -> bool {
        auto it = o.find(key);
        if (it == o.end() || it->is_null()) {
            *dst = def;
            return true;
        }
        if (!it->is_number()) return false;
        *dst = it->get<double>();
        return true;
    };
    double eps = 0, theta = 0;
    if (!num_or(j, "rms_norm_eps", 1e-6, &eps) || !(eps > 0))
        return "vision_config: \"rms_norm_eps\" must be a positive number";
    hp.rms_norm_eps = (float)eps;

    theta = 100.0; // Gemma4VisionConfig.default_theta
    if (auto rp = j.find("rope_parameters"); rp != j.end() && !rp->is_null()) {
        if (!rp->is_object()) return "vision_config: \"rope_parameters\" must be an object";
        if (auto rt = rp->find("rope_type");
            rt != rp->end() && !(rt->is_string() && rt->get<std::string>() == "axial"))
            return "vision_config: rope_parameters.rope_type " + rt->dump() +
                   " is not supported (only \"axial\")";
        if (!num_or(*rp, "rope_theta", 100.0, &theta))
            return "vision_config: rope_parameters.rope_theta must be a number";
    } else if (!num_or(j, "rope_theta", 100.0, &theta)) {
        return "vision_config: \"rope_theta\" must be a number";
    }
    if (!(theta > 0)) return "vision_config: rope theta must be positive";
    hp.rope_theta = (float)theta;

    auto flag = [&](const char* key, bool def, bool* dst) -> bool {
        auto it = j.find(key);
        if (it == j.end() || it->is_null()) {
            *dst = def;
            return true;
        }
        if (!it->is_boolean()) return false;
        *dst = it->get<bool>();
        return true;
    };
    if (!flag("use_clipped_linears", false, &hp.use_clipped_linears))
        return "vision_config: \"use_clipped_linears\" must be true or false";
    bool b = false;
    if (!flag("standardize", false, &b)) return "vision_config: \"standardize\" must be true or false";
    if (b) return "vision_config: \"standardize\": true is not supported (std_bias/std_scale towers)";
    if (!flag("attention_bias", false, &b)) return "vision_config: \"attention_bias\" must be true or false";
    if (b) return "vision_config: \"attention_bias\": true is not supported";
    if (auto it = j.find("hidden_activation");
        it != j.end() && !it->is_null() &&
        !(it->is_string() && it->get<std::string>() == "gelu_pytorch_tanh"))
        return "vision_config: \"hidden_activation\" " + it->dump() +
               " is not supported (only \"gelu_pytorch_tanh\")";

    if (hp.num_attention_heads % hp.num_key_value_heads)
        return "vision_config: num_attention_heads (" + std::to_string(hp.num_attention_heads) +
               ") must be a multiple of num_key_value_heads (" + std::to_string(hp.num_key_value_heads) + ")";
    if (hp.head_dim % 4)
        return "vision_config: head_dim (" + std::to_string(hp.head_dim) +
               ") must be a multiple of 4 (2-D RoPE)";
    if (text_hidden_size < 1) return "vision tower: text hidden size must be positive";
    hp.text_hidden_size = text_hidden_size;
    *out                = hp;
    return "";
}

std::vector<std::string> vision_weight_names(const VisionHParams& hp) {
    std::vector<std::string> n    = {"vision_tower.patch_embedder.input_proj.weight",
                                     "vision_tower.patch_embedder.position_embedding_table"};
    static const char* kLinears[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                     "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                     "mlp.down_proj"};
    static const char* kNorms[]   = {"input_layernorm",           "post_attention_layernorm",
                                     "pre_feedforward_layernorm", "post_feedforward_layernorm",
                                     "self_attn.q_norm",          "self_attn.k_norm"};
    for (int l = 0; l < hp.num_hidden_layers; ++l) {
        const std::string p = "vision_tower.encoder.layers." + std::to_string(l) + ".";
        for (const char* lin : kLinears) {
            n.push_back(p + lin + ".linear.weight");
            if (hp.use_clipped_linears)
                for (const char* b : {".input_min", ".input_max", ".output_min", ".output_max"})
                    n.push_back(p + lin + b);
        }
        for (const char* nm : kNorms)
            n.push_back(p + nm + ".weight");
    }
    n.push_back("embed_vision.embedding_projection.weight");
    return n;
}

// ---- init ------------------------------------------------------------------------------------------------

std::string VisionTower::init(const VisionHParams& hp, const Lookup& lookup, int max_patches) {
    ready_      = false;
    hp_         = hp;
    const int k = hp.pooling_kernel_size;
    if (max_patches < k * k || max_patches % (k * k))
        return "vision tower: max_patches " + std::to_string(max_patches) +
               " must be a positive multiple of " + std::to_string(k * k) +
               " (pooling_kernel_size^2; HF: max_soft_tokens * " + std::to_string(k * k) + ")";
    if (hp.text_hidden_size < 1 || hp.hidden_size < 1 || hp.head_dim % 4 || hp.num_key_value_heads < 1 ||
        hp.num_attention_heads % hp.num_key_value_heads)
        return "vision tower: inconsistent hyper-parameters (use parse_vision_hparams)";
    max_patches_ = max_patches;

    std::string err;
    auto get = [&](const std::string& name, std::initializer_list<int64_t> shape) -> const Tensor* {
        if (!err.empty()) return nullptr;
        const Tensor* t = lookup(name);
        if (!t) {
            err = "vision tower: missing weight '" + name +
                  "' (name relative to 'model.'; is this a Gemma 4 "
                  "checkpoint with a vision tower?)";
            return nullptr;
        }
        if (t->dtype != DType::F32 && t->dtype != DType::BF16) {
            err = "vision tower: weight '" + name + "' has dtype " + dtype_str(t->dtype) +
                  "; expected F32 or BF16";
            return nullptr;
        }
        const bool scalar = shape.size() == 0;
        bool ok           = scalar ? t->numel() == 1 && t->ndim <= 1 : t->ndim == (int)shape.size();
        if (ok && !scalar) {
            int i = 0;
            for (int64_t d : shape)
                ok = ok && t->dims[i++] == d;
        }
        if (!ok || !t->data) {
            std::vector<int64_t> want(shape);
            err = "vision tower: weight '" + name + "' has shape " + shape_str(t->dims, t->ndim) +
                  ", expected " + shape_str(want.data(), (int)want.size()) + (t->data ? "" : " (no data)");
            return nullptr;
        }
        return t;
    };

    const int64_t H = hp.hidden_size, D = hp.head_dim, I = hp.intermediate_size;
    const int64_t qw = (int64_t)hp.num_attention_heads * D, kvw = (int64_t)hp.num_key_value_heads * D;
    const int64_t pin = 3LL * hp.patch_size * hp.patch_size;
    patch_proj_       = get("vision_tower.patch_embedder.input_proj.weight", {H, pin});
    pos_table_ =
        get("vision_tower.patch_embedder.position_embedding_table", {2, hp.position_embedding_size, H});
    layers_.assign(hp.num_hidden_layers, Layer{});
    auto linear = [&](const std::string& p, int64_t out, int64_t in) {
        Linear l;
        l.w             = get(p + ".linear.weight", {out, in});
        const float inf = std::numeric_limits<float>::infinity();
        l.in_min = -inf, l.in_max = inf, l.out_min = -inf, l.out_max = inf;
        if (hp.use_clipped_linears) {
            float* dst[]     = {&l.in_min, &l.in_max, &l.out_min, &l.out_max};
            const char* nm[] = {".input_min", ".input_max", ".output_min", ".output_max"};
            for (int i = 0; i < 4; ++i)
                if (const Tensor* t = get(p + nm[i], {})) *dst[i] = tensor_at(*t, 0);
        }
        return l;
    };
    for (int li = 0; li < hp.num_hidden_layers; ++li) {
        const std::string p = "vision_tower.encoder.layers." + std::to_string(li) + ".";
        Layer& L            = layers_[li];
        L.q                 = linear(p + "self_attn.q_proj", qw, H);
        L.k                 = linear(p + "self_attn.k_proj", kvw, H);
        L.v                 = linear(p + "self_attn.v_proj", kvw, H);
        L.o                 = linear(p + "self_attn.o_proj", H, qw);
        L.gate              = linear(p + "mlp.gate_proj", I, H);
        L.up                = linear(p + "mlp.up_proj", I, H);
        L.down              = linear(p + "mlp.down_proj", H, I);
        L.ln_in             = get(p + "input_layernorm.weight", {H});
        L.ln_post_attn      = get(p + "post_attention_layernorm.weight", {H});
        L.ln_pre_ff         = get(p + "pre_feedforward_layernorm.weight", {H});
        L.ln_post_ff        = get(p + "post_feedforward_layernorm.weight", {H});
        L.q_norm            = get(p + "self_attn.q_norm.weight", {D});
        L.k_norm            = get(p + "self_attn.k_norm.weight", {D});
    }
    embed_proj_ = get("embed_vision.embedding_projection.weight", {hp.text_hidden_size, H});
    if (!err.empty()) return err;

    // 2-D RoPE tables (HF Gemma4VisionRotaryEmbedding, float32): head_dim/2 channels per axis, rotate-half
    // pairs (m, m + head_dim/4), inv_freq[m] = 1 / theta^(2m / (head_dim/2)).
    const int quarter = hp.head_dim / 4, P = hp.position_embedding_size;
    rope_cos_.resize((size_t)P * quarter);
    rope_sin_.resize((size_t)P * quarter);
    for (int m = 0; m < quarter; ++m) {
        const float inv = 1.0f / std::pow(hp.rope_theta, (float)(2 * m) / (float)(hp.head_dim / 2));
        for (int p = 0; p < P; ++p) {
            const float ang                    = (float)p * inv;
            rope_cos_[(size_t)p * quarter + m] = std::cos(ang);
            rope_sin_[(size_t)p * quarter + m] = std::sin(ang);
        }
    }

    // Scratch: z, a, t [n, H]; c [n, ldc] clamped q/k/v input, then the attention output; r: scaled pixels
    // [n, pin], then q|k|v [n, ldr], o_proj's clamped input, then per MLP pass gate, up [kMlpRows, I] and the
    // clamped input [kMlpRows, max(H, I)]; seen [n] int32 grid check; kv: attention's K^T and V per kv head.
    const size_t n = (size_t)max_patches;
    lay_.ldc       = std::max(H, qw);
    lay_.ldr       = std::max(pin, qw + 2 * kvw);
    size_t off     = 0;
    auto take      = [&](size_t floats) {
        size_t o = off;
        off += round16(floats);
        return o;
    };
    lay_.z = take(n * H);
    lay_.a = take(n * H);
    lay_.t = take(n * H);
    lay_.c = take(n * lay_.ldc);
    lay_.r = take(std::max(n * lay_.ldr, (size_t)(2 * I + std::max(H, I)) * std::min<size_t>(n, kMlpRows)));
    lay_.seen  = take(n);
    lay_.kv    = take((size_t)kvw * (pad_keys(max_patches) + max_patches));
    lay_.total = off;

    size_t b   = 0;
    auto bytes = [&](size_t n4) { // n4 four-byte values, 256-byte aligned (cuMemAlloc's alignment)
        size_t o = b;
        b += (n4 * 4 + 255) / 256 * 256;
        return o;
    };
    const size_t cells = n / ((size_t)k * k);
    gpu_.steps         = bytes(8);
    gpu_.pos           = bytes(n * 2);
    gpu_.idx           = bytes(n);
    gpu_.x             = bytes(n * pin);
    gpu_.z             = bytes(n * H);
    gpu_.a             = bytes(n * H);
    gpu_.t             = bytes(n * H);
    gpu_.c             = bytes(n * std::max({H, I, qw}));
    gpu_.q             = bytes(n * qw);
    gpu_.k             = bytes(n * kvw);
    gpu_.v             = bytes(n * kvw);
    gpu_.o             = bytes(n * qw);
    gpu_.g             = bytes(n * I);
    gpu_.u             = bytes(n * I);
    gpu_.out           = bytes(cells * hp.text_hidden_size);
    gpu_.total         = b;
    ready_             = true;
    return "";
}

size_t VisionTower::scratch_bytes() const {
    return lay_.total * sizeof(float);
}

size_t VisionTower::thread_scratch_floats() const {
    const int64_t max_k =
        std::max({(int64_t)3 * hp_.patch_size * hp_.patch_size, (int64_t)hp_.hidden_size,
                  (int64_t)hp_.intermediate_size, (int64_t)hp_.num_attention_heads * hp_.head_dim});
    return std::max({cpu::scratch_floats_per_thread(max_k, 0), cpu::gemm_scratch_floats(),
                     hp_.precision == Precision::BF16 ? cpu::gemm_bf16_scratch_floats() : 0,
                     round16((size_t)kAttnBlock * (pad_keys(max_patches_) + 1))});
}

// ---- forward ---------------------------------------------------------------------------------------------

// y[rows, outw] = clamp(clamp(x, in) . W^T, out). clamp_buf [rows, >= in] holds the clamped input.
void VisionTower::linear(const cpu::Context& ctx, const Linear& l, const float* x, int64_t ldx, int rows,
                         int64_t in, int64_t outw, float* clamp_buf, float* y, int64_t ldy) const {
    const bool clip_in = std::isfinite(l.in_min) || std::isfinite(l.in_max);
    if (clip_in) {
        for_row_blocks(ctx, rows, in, [&](int r0, int r1) {
            for (int r = r0; r < r1; ++r)
                for (int64_t i = 0; i < in; ++i)
                    clamp_buf[r * in + i] = std::min(std::max(x[r * ldx + i], l.in_min), l.in_max);
        });
        x = clamp_buf, ldx = in;
    }
    MatmulArgs m{};
    m.x = x, m.ldx = ldx, m.w = l.w->data, m.dt = l.w->dtype, m.n = outw, m.k = in, m.y = y, m.ldy = ldy;
    m.rows = rows;
    gemm(ctx, hp_.precision, m);
    if (std::isfinite(l.out_min) || std::isfinite(l.out_max))
        for_row_blocks(ctx, rows, outw, [&](int r0, int r1) {
            for (int r = r0; r < r1; ++r)
                for (int64_t i = 0; i < outw; ++i)
                    y[r * ldy + i] = std::min(std::max(y[r * ldy + i], l.out_min), l.out_max);
        });
}

// Bidirectional attention of n patches, scale 1.0, GQA. q [n, ldq] heads x D; k, v [n, ldkv]; o [n, heads*D].
// kv receives each kv head's K^T as panels [np / kGemmNr][D][kGemmNr] (np = n rounded up to kGemmNr, zero
// keys past n) followed by its V [n, D], so that both GEMMs read their right operand contiguously. Each task
// is kAttnBlock query rows of one head: scores [rows, np] in the thread's scratch.
void VisionTower::attention(const cpu::Context& ctx, const float* q, const float* k, const float* v,
                            int64_t ldq, int64_t ldkv, int n, float* o, float* kv) const {
    const int heads = hp_.num_attention_heads, D = hp_.head_dim, group = heads / hp_.num_key_value_heads;
    constexpr int P   = cpu::kGemmNr;
    const int64_t ldo = (int64_t)heads * D, np = pad_keys(n), head_floats = np * D + (int64_t)n * D;
    const int64_t panels = np / P;
    ctx.pool->parallel_for((int64_t)hp_.num_key_value_heads * panels, [&](int64_t task, int) {
        const int h = (int)(task / panels), j0 = (int)(task % panels) * P;
        float* kt = kv + h * head_floats + (int64_t)j0 * D; // [D][P]
        float* vp = kv + h * head_floats + np * D;          // [n][D]
        for (int j = j0; j < j0 + P; ++j) {
            const float* ks = k + (int64_t)j * ldkv + (int64_t)h * D;
            for (int d = 0; d < D; ++d)
                kt[d * P + (j - j0)] = j < n ? ks[d] : 0.0f;
            if (j < n)
                std::memcpy(vp + (int64_t)j * D, v + (int64_t)j * ldkv + (int64_t)h * D, sizeof(float) * D);
        }
    });
    const int blocks = (n + kAttnBlock - 1) / kAttnBlock;
    ctx.pool->parallel_for((int64_t)blocks * heads, [&](int64_t task, int th) {
        const int h = (int)(task % heads), r0 = (int)(task / heads) * kAttnBlock;
        const int rb    = std::min(kAttnBlock, n - r0);
        const float* kh = kv + (int64_t)(h / group) * head_floats;
        const float* qh = q + (int64_t)r0 * ldq + (int64_t)h * D;
        float* s        = ctx.thread_scratch(th); // [rb, np]
        for (int64_t p = 0; p < panels; ++p)
            cpu::gemm_block(rb, P, D, qh, ldq, kh + p * D * P, P, s + p * P, np, false);
        float* inv_sum = s + (size_t)rb * np; // [rb]
        for (int r = 0; r < rb; ++r) {
            Eigen::Map<Eigen::ArrayXf> row(s + (size_t)r * np, n);
            row        = (row - row.maxCoeff()).exp();
            inv_sum[r] = 1.0f / row.sum();
        }
        float* out = o + (int64_t)r0 * ldo + (int64_t)h * D;
        cpu::gemm_block(rb, D, n, s, np, kh + np * D, D, out, ldo, false);
        for (int r = 0; r < rb; ++r)
            Eigen::Map<Eigen::ArrayXf>(out + (int64_t)r * ldo, D) *= inv_sum[r];
    });
}

std::string VisionTower::check_grid(const int32_t* pos, int n_patches, int32_t* seen, Grid* g) const {
    rt::PatchGrid pg;
    std::string e = rt::check_patch_grid(pos, n_patches, max_patches_, hp_.pooling_kernel_size,
                                         hp_.position_embedding_size, seen, &pg);
    if (!e.empty()) return "vision tower: " + e;
    *g = {pg.n, pg.gw, pg.gh};
    return "";
}

void VisionTower::pool_index(const Grid& g, const int32_t* seen, int32_t* idx) const {
    rt::patch_pool_index({g.n, g.gw, g.gh}, hp_.pooling_kernel_size, seen, idx);
}

std::string VisionTower::forward(const cpu::Context& ctx, const float* patches, const int32_t* pos,
                                 int n_patches, void* scratch, float* out, int* n_soft) const {
    if (!ready_) return "vision tower: forward before a successful init";
    if (!patches || !pos || !scratch || !out || !n_soft) return "vision tower: null argument to forward";
    *n_soft = 0;
    if (!ctx.pool || !ctx.scratch || ctx.scratch_stride < thread_scratch_floats())
        return "vision tower: cpu::Context per-thread scratch has " + std::to_string(ctx.scratch_stride) +
               " floats, the tower needs " + std::to_string(thread_scratch_floats()) +
               " (thread_scratch_floats())";

    float* sp     = static_cast<float*>(scratch);
    int32_t* seen = reinterpret_cast<int32_t*>(sp + lay_.seen); // [n]
    Grid grid;
    if (std::string e = check_grid(pos, n_patches, seen, &grid); !e.empty()) return e;
    const int n = grid.n, gw = grid.gw, gh = grid.gh, k = hp_.pooling_kernel_size,
              P = hp_.position_embedding_size;

    const int64_t H = hp_.hidden_size, D = hp_.head_dim, I = hp_.intermediate_size;
    const int heads = hp_.num_attention_heads, kvh = hp_.num_key_value_heads;
    const int64_t qw = (int64_t)heads * D, kvw = (int64_t)kvh * D,
                  pin = 3LL * hp_.patch_size * hp_.patch_size;
    const float eps   = hp_.rms_norm_eps;
    float* z          = sp + lay_.z; // [n, H] residual stream
    float* a          = sp + lay_.a; // [n, H] normed input of a block
    float* t          = sp + lay_.t; // [n, H] block output
    float* c          = sp + lay_.c; // [n, ldc] clamped linear input
    float* r          = sp + lay_.r; // [n, ldr]
    const int64_t ldr = lay_.ldr;

    // Patch embedder: input_proj(2 * (p - 0.5)) + (pos_x_emb + pos_y_emb). HF bf16: the scaled pixels are
    // cast to bf16 before input_proj, and the projection and sum round to bf16.
    for_row_blocks(ctx, n, pin, [&](int r0, int r1) {
        for (int i = r0; i < r1; ++i)
            for (int64_t e = 0; e < pin; ++e)
                r[i * pin + e] = 2.0f * (patches[i * pin + e] - 0.5f);
    });
    MatmulArgs pm{};
    pm.x = r, pm.ldx = pin, pm.w = patch_proj_->data, pm.dt = patch_proj_->dtype, pm.n = H, pm.k = pin;
    pm.y = z, pm.ldy = H, pm.rows = n;
    gemm(ctx, hp_.precision, pm);
    for_row_blocks(ctx, n, H, [&](int r0, int r1) {
        for (int i = r0; i < r1; ++i) {
            const int64_t ox = (int64_t)pos[2 * i] * H, oy = ((int64_t)P + pos[2 * i + 1]) * H;
            for (int64_t e = 0; e < H; ++e)
                z[i * H + e] += tensor_at(*pos_table_, ox + e) + tensor_at(*pos_table_, oy + e);
        }
    });

    float* q           = r;            // [n, ldr] columns [0, qw)
    float* kk          = r + qw;       // columns [qw, qw + kvw)
    float* v           = r + qw + kvw; // columns [qw + kvw, qw + 2 kvw)
    float* o           = c;            // attention output [n, qw] (dense); c is free while attention runs
    const int mlp_rows = std::min(n, kMlpRows);
    float* g           = r;                         // MLP gate [mlp_rows, I]
    float* u           = r + (int64_t)mlp_rows * I; // MLP up [mlp_rows, I]
    float* mc          = u + (int64_t)mlp_rows * I; // MLP clamped input [mlp_rows, max(H, I)]
    const int quarter  = hp_.head_dim / 4;
    for (const Layer& L : layers_) {
        // Attention block. HF bf16: every linear, norm and the softmax output round to bf16.
        rms(ctx, z, H, L.ln_in, a, H, n, (int)H, (int)H, eps);
        linear(ctx, L.q, a, H, n, H, qw, c, q, ldr);
        linear(ctx, L.k, a, H, n, H, kvw, c, kk, ldr);
        linear(ctx, L.v, a, H, n, H, kvw, c, v, ldr);
        rms(ctx, q, ldr, L.q_norm, q, ldr, n, (int)qw, (int)D, eps);
        rms(ctx, kk, ldr, L.k_norm, kk, ldr, n, (int)kvw, (int)D, eps);
        rms(ctx, v, ldr, nullptr, v, ldr, n, (int)kvw, (int)D, eps);
        // 2-D RoPE: within each head, channels [0, D/2) rotate with x, [D/2, D) with y.
        for_row_blocks(ctx, n, (qw + kvw) * 4, [&](int r0, int r1) {
            for (int i = r0; i < r1; ++i)
                for (int axis = 0; axis < 2; ++axis) {
                    const float* cs = rope_cos_.data() + (size_t)pos[2 * i + axis] * quarter;
                    const float* sn = rope_sin_.data() + (size_t)pos[2 * i + axis] * quarter;
                    for (int hh = 0; hh < heads + kvh; ++hh) {
                        float* x = (hh < heads ? q + i * ldr + (int64_t)hh * D
                                               : kk + i * ldr + (int64_t)(hh - heads) * D) +
                                   axis * (D / 2);
                        for (int m = 0; m < quarter; ++m) {
                            const float x0 = x[m], x1 = x[m + quarter];
                            x[m]           = x0 * cs[m] - x1 * sn[m];
                            x[m + quarter] = x1 * cs[m] + x0 * sn[m];
                        }
                    }
                }
        });
        attention(ctx, q, kk, v, ldr, ldr, n, o, sp + lay_.kv);
        linear(ctx, L.o, o, qw, n, qw, H, r, t, H); // r is free again: o_proj's clamped input
        rms(ctx, t, H, L.ln_post_attn, t, H, n, (int)H, (int)H, eps);
        for_row_blocks(ctx, n, H, [&](int r0, int r1) {
            for (int64_t e = (int64_t)r0 * H; e < (int64_t)r1 * H; ++e)
                z[e] += t[e];
        });

        // MLP block: down(gelu_tanh(gate(f)) * up(f)).
        rms(ctx, z, H, L.ln_pre_ff, a, H, n, (int)H, (int)H, eps);
        for (int r0 = 0; r0 < n; r0 += mlp_rows) {
            const int rows = std::min(mlp_rows, n - r0);
            linear(ctx, L.gate, a + (int64_t)r0 * H, H, rows, H, I, mc, g, I);
            linear(ctx, L.up, a + (int64_t)r0 * H, H, rows, H, I, mc, u, I);
            for_row_blocks(ctx, rows, I * 16, [&](int q0, int q1) { // gelu_tanh(gate) * up, vectorised
                Eigen::Map<Eigen::ArrayXf> x(g + (int64_t)q0 * I, (q1 - q0) * I);
                Eigen::Map<const Eigen::ArrayXf> up(u + (int64_t)q0 * I, (q1 - q0) * I);
                x = 0.5f * x * (1.0f + (0.7978845608028654f * (x + 0.044715f * x.cube())).tanh()) * up;
            });
            linear(ctx, L.down, g, I, rows, I, H, mc, t + (int64_t)r0 * H, H);
        }
        rms(ctx, t, H, L.ln_post_ff, t, H, n, (int)H, (int)H, eps);
        for_row_blocks(ctx, n, H, [&](int r0, int r1) {
            for (int64_t e = (int64_t)r0 * H; e < (int64_t)r1 * H; ++e)
                z[e] += t[e];
        });
    }

    // Pooler: cell (x/k, y/k) -> row cx + (gw/k)*cy, each patch weighted by float(1/k^2) and summed in patch
    // order (HF: one_hot / k^2 @ hidden in float32); with k == 1 HF keeps the patch order instead.
    const int cells = (gw / k) * (gh / k);
    float* pooled   = a; // [cells, H]
    const float w   = 1.0f / (float)(k * k);
    std::memset(pooled, 0, sizeof(float) * (size_t)cells * H);
    for (int i = 0; i < n; ++i) {
        const int cell = k == 1 ? i : pos[2 * i] / k + (gw / k) * (pos[2 * i + 1] / k);
        float* dst     = pooled + (int64_t)cell * H;
        const float* s = z + (int64_t)i * H;
        for (int64_t e = 0; e < H; ++e)
            dst[e] += w * s[e];
    }
    // * sqrt(hidden) in float32 (HF: python float hidden**0.5, applied as a float32 scalar). HF bf16: the
    // scaled rows are cast back to bf16 here, before embed_vision.
    const float root = (float)std::sqrt((double)H);
    for (int64_t e = 0; e < (int64_t)cells * H; ++e)
        pooled[e] *= root;
    // embed_vision: RMS without scale (vision eps), then the projection to the text width.
    rms(ctx, pooled, H, nullptr, t, H, cells, (int)H, (int)H, eps);
    MatmulArgs em{};
    em.x = t, em.ldx = H, em.w = embed_proj_->data, em.dt = embed_proj_->dtype, em.n = hp_.text_hidden_size;
    em.k = H, em.y = out, em.ldy = hp_.text_hidden_size, em.rows = cells;
    gemm(ctx, hp_.precision, em);
    *n_soft = cells;
    return "";
}

} // namespace g4::towers
