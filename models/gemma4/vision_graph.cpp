// The Gemma 4 vision encoder as an op program (see vision_graph.h). Reads top to bottom like the
// model: patch embedding, 2-D position embeddings, encoder blocks (ClippableLinear projections, q/k/v
// norms, 2-D RoPE, bidirectional attention with scale 1, gated GELU MLP, sandwich norms), k x k average
// pooling, * sqrt(hidden), and the embed_vision projection (weightless RMSNorm, linear) into the text width.
#include "models/gemma4/vision_graph.h"

#include <cmath>
#include <limits>
#include <tuple>

namespace g4::gemma4 {

namespace {

using plan::PlanOp;
using plan::TensorKind;

constexpr int32_t kPatchRows = plan::kRowCountBase + 0; // ops over the image's patches
constexpr int32_t kCellRows  = plan::kRowCountBase + 1; // ops over its pooled cells

class VisionBuilder {
public:
    VisionBuilder(const VisionHParams& hp, const VisionBuildOptions& o, Program& p) : hp(hp), o(o), p(p) {}

    int tensor(const std::string& name, TensorKind kind, DType dt, std::vector<int64_t> dims,
               WeightRole role = WeightRole::Tower) {
        TensorDesc d;
        d.name  = name;
        d.kind  = kind;
        d.dtype = dt;
        d.dims  = std::move(dims);
        d.role  = role;
        p.tensors.push_back(std::move(d));
        return (int)p.tensors.size() - 1;
    }
    int weight(const std::string& name, std::vector<int64_t> dims) {
        return tensor(name, TensorKind::Weight, DType::F32, std::move(dims));
    }
    int act(const std::string& name, int64_t rows, int64_t cols) {
        return tensor(name, TensorKind::Activation, DType::F32, {rows, cols});
    }
    int64_t cols(int t) const { return p.tensors[t].dims[1]; }

    PlanOp& emit(OpCode code, const std::string& name, int layer, std::initializer_list<int> in,
                 std::initializer_list<int> out, int32_t rows = kPatchRows) {
        OpDesc d{};
        d.op.code  = (uint16_t)code;
        d.op.layer = layer < 0 ? plan::kNoLayer : (uint16_t)layer;
        for (int i = 0; i < 4; ++i)
            d.op.in[i] = -1;
        for (int i = 0; i < 2; ++i)
            d.op.out[i] = -1;
        int i = 0;
        for (int t : in)
            d.op.in[i++] = t;
        i = 0;
        for (int t : out)
            d.op.out[i++] = t;
        d.op.row_mode = rows;
        d.name        = layer < 0 ? name : name + "-" + std::to_string(layer);
        p.ops.push_back(d);
        return p.ops.back().op;
    }
    void clamp(int x, int y, float lo, float hi, const std::string& name, int layer) {
        PlanOp& op = emit(OpCode::Clamp, name, layer, {x}, {y});
        op.ip[0]   = (int32_t)cols(x);
        op.fp[0] = lo, op.fp[1] = hi;
    }
    int matmul(int x, int w, const std::string& name, int layer, int64_t rows,
               int32_t row_count = kPatchRows) {
        const int y = act(layer < 0 ? name : name + "-" + std::to_string(layer), rows, p.tensors[w].dims[0]);
        emit(OpCode::Matmul, name, layer, {x, w}, {y}, row_count).ip[4] = o.matmul_kernel;
        return y;
    }
    // Gemma4ClippableLinear: clamp(clamp(x, input bounds) . W^T, output bounds); a clamp only where a bound
    // is finite.
    int linear(int x, const std::string& module, int64_t out, const std::string& name, int layer) {
        const int w     = weight(module + ".linear.weight", {out, cols(x)});
        const float inf = std::numeric_limits<float>::infinity();
        float b[4]      = {-inf, inf, -inf, inf};
        if (hp.use_clipped_linears) {
            const char* nm[] = {".input_min", ".input_max", ".output_min", ".output_max"};
            for (int i = 0; i < 4; ++i)
                if (auto v = o.scalar(module + nm[i])) b[i] = *v;
        }
        const int64_t n = o.max_patches;
        if (std::isfinite(b[0]) || std::isfinite(b[1])) {
            const int c = act(name + "_in-" + std::to_string(layer), n, cols(x));
            clamp(x, c, b[0], b[1], name + "_clamp_in", layer);
            x = c;
        }
        const int y = matmul(x, w, name, layer, n);
        if (std::isfinite(b[2]) || std::isfinite(b[3])) clamp(y, y, b[2], b[3], name + "_clamp_out", layer);
        return y;
    }
    void rms_norm(int x, int w, int y, int dim, const std::string& name, int layer,
                  int32_t rows = kPatchRows) {
        PlanOp& op = emit(OpCode::RmsNorm, name, layer, {x, w}, {y}, rows);
        op.ip[0]   = (int32_t)cols(x);
        op.ip[1]   = dim;
        op.fp[0]   = hp.rms_norm_eps;
    }
    void add(int a, int b, int y, const std::string& name, int layer) {
        emit(OpCode::Add, name, layer, {a, b}, {y}).ip[0] = (int32_t)cols(a);
    }

    const VisionHParams& hp;
    const VisionBuildOptions& o;
    Program& p;
};

} // namespace

VisionProgram build_vision_program(const VisionHParams& hp, const VisionBuildOptions& opt) {
    VisionProgram v;
    VisionBuilder b(hp, opt, v.graph);
    const int k = hp.pooling_kernel_size, heads = hp.num_attention_heads, kvh = hp.num_key_value_heads;
    const int64_t n = opt.max_patches, cells = n / ((int64_t)k * k), H = hp.hidden_size, D = hp.head_dim,
                  I = hp.intermediate_size, qw = heads * D, kvw = kvh * D,
                  pin = 3LL * hp.patch_size * hp.patch_size;
    v.max_patches = (int)n, v.max_cells = (int)cells;
    v.pixels     = b.tensor("v.pixels", TensorKind::Input, DType::F32, {n, pin});
    v.positions  = b.tensor("v.positions", TensorKind::Input, DType::I32, {n, 2});
    v.pool_index = b.tensor("v.pool_index", TensorKind::Input, DType::I32, {cells, (int64_t)k * k});

    // Patch embedder: input_proj(2 * (p - 0.5)) + (table[0][x] + table[1][y]); the front end normalises.
    const int z = b.matmul(v.pixels, b.weight("vision_tower.patch_embedder.input_proj.weight", {H, pin}),
                           "v.patch_embd", -1, n);
    const int table =
        b.weight("vision_tower.patch_embedder.position_embedding_table", {2, hp.position_embedding_size, H});
    b.emit(OpCode::AddPosition2D, "v.pos_embd", -1, {z, table, v.positions}, {z}).ip[0] = (int32_t)H;

    // 2-D RoPE (HF Gemma4VisionRotaryEmbedding): head_dim/2 channels per axis, rotate-half pairs (m, m +
    // D/4), inv_freq[m] = 1 / theta^(2m / (D/2)) in float32.
    std::vector<float> inv(D / 4);
    for (int m = 0; m < D / 4; ++m)
        inv[m] = 1.0f / std::pow(hp.rope_theta, (float)(2 * m) / (float)(D / 2));
    const int inv_freq =
        b.tensor("vision_tower.rope_inv_freq", TensorKind::Weight, DType::F32, {D / 4}, WeightRole::Constant);
    v.graph.tensors[inv_freq].constant = inv;
    const int work                     = b.act("v.attn_work", 1, self_attention_work_floats(n, kvh, D));

    for (int l = 0; l < hp.num_hidden_layers; ++l) {
        const std::string pre = "vision_tower.encoder.layers." + std::to_string(l) + ".";
        const std::string L   = std::to_string(l);
        auto norm_w = [&](const char* nm, int64_t dim) { return b.weight(pre + nm + ".weight", {dim}); };
        // Attention block.
        const int a = b.act("v.attn_norm-" + L, n, H);
        b.rms_norm(z, norm_w("input_layernorm", H), a, (int)H, "v.attn_norm", l);
        const int q  = b.linear(a, pre + "self_attn.q_proj", qw, "v.attn_q", l);
        const int kk = b.linear(a, pre + "self_attn.k_proj", kvw, "v.attn_k", l);
        const int vv = b.linear(a, pre + "self_attn.v_proj", kvw, "v.attn_v", l);
        b.rms_norm(q, norm_w("self_attn.q_norm", D), q, (int)D, "v.attn_q_norm", l);
        b.rms_norm(kk, norm_w("self_attn.k_norm", D), kk, (int)D, "v.attn_k_norm", l);
        b.rms_norm(vv, -1, vv, (int)D, "v.attn_v_norm", l);
        for (auto [x, nh, nm] :
             {std::tuple{q, heads, "v.attn_q_rope"}, std::tuple{kk, kvh, "v.attn_k_rope"}}) {
            PlanOp& op = b.emit(OpCode::Rope2D, nm, l, {x, inv_freq, v.positions}, {x});
            op.ip[0] = nh, op.ip[1] = (int32_t)D;
        }
        const int o = b.act("v.attn_out-" + L, n, qw);
        PlanOp& at  = b.emit(OpCode::SelfAttention, "v.attn", l, {q, kk, vv}, {o, work});
        at.ip[0] = heads, at.ip[1] = kvh, at.ip[2] = (int32_t)D, at.fp[0] = 1.0f;
        at.ip[3]    = opt.matmul_kernel == 2 ? 1 : 0; // bf16 attention on the CPU with the bf16 GEMM
        const int t = b.linear(o, pre + "self_attn.o_proj", H, "v.attn_o", l);
        b.rms_norm(t, norm_w("post_attention_layernorm", H), t, (int)H, "v.attn_post_norm", l);
        b.add(z, t, z, "v.attn_res", l);

        // MLP block: down(gelu_tanh(gate(f)) * up(f)).
        const int f = b.act("v.ffn_norm-" + L, n, H);
        b.rms_norm(z, norm_w("pre_feedforward_layernorm", H), f, (int)H, "v.ffn_norm", l);
        const int g = b.linear(f, pre + "mlp.gate_proj", I, "v.ffn_gate", l);
        const int u = b.linear(f, pre + "mlp.up_proj", I, "v.ffn_up", l);
        b.emit(OpCode::GeluMul, "v.ffn_gelu", l, {g, u}, {g}).ip[0] = (int32_t)I;
        const int d = b.linear(g, pre + "mlp.down_proj", H, "v.ffn_down", l);
        b.rms_norm(d, norm_w("post_feedforward_layernorm", H), d, (int)H, "v.ffn_post_norm", l);
        b.add(z, d, z, "v.ffn_res", l);
    }

    // Pooler: each k x k cell's patches weighted by float(1/k^2), summed in patch order; then * sqrt(hidden)
    // (a float32 scalar, as HF applies it).
    const int pooled = b.act("v.pooled", cells, H);
    PlanOp& pool     = b.emit(OpCode::PoolRows, "v.pool", -1, {z, v.pool_index}, {pooled}, kCellRows);
    pool.ip[0] = (int32_t)H, pool.ip[1] = k * k, pool.ip[2] = 0, pool.fp[0] = 1.0f / (float)(k * k);
    PlanOp& sc = b.emit(OpCode::Scale, "v.pool_scale", -1, {pooled}, {pooled}, kCellRows);
    sc.ip[0] = (int32_t)H, sc.fp[0] = (float)std::sqrt((double)H);
    // embed_vision: RMSNorm without scale (the vision eps), then the projection to the text width.
    const int pn = b.act("v.proj_norm", cells, H);
    b.rms_norm(pooled, -1, pn, (int)H, "v.proj_norm", -1, kCellRows);
    v.output = b.matmul(pn, b.weight("embed_vision.embedding_projection.weight", {hp.text_hidden_size, H}),
                        "v.proj", -1, cells, kCellRows);
    return v;
}

} // namespace g4::gemma4
