// Gemma 4 text decoder as straight-line graph code (transformers' Gemma4TextModel.forward; the model op
// by op: docs/gemma4.md). Each intermediate is named "<name>" or "<name>-<layer>".
#include "models/gemma4/graph.h"

#include <cmath>

namespace g4::gemma4 {

const char* weight_role_name(WeightRole r) {
    switch (r) {
    case WeightRole::AttnProj:
        return "attn_proj";
    case WeightRole::MlpProj:
        return "mlp_proj";
    case WeightRole::Embedding:
        return "embedding";
    case WeightRole::PleTable:
        return "ple_table";
    case WeightRole::PleProj:
        return "ple_proj";
    case WeightRole::Norm:
        return "norm";
    case WeightRole::Scalar:
        return "scalar";
    case WeightRole::Constant:
        return "constant";
    case WeightRole::LoraBias:
        return "lora_bias";
    case WeightRole::Tower:
        return "tower";
    case WeightRole::TowerScalar:
        return "tower_scalar";
    }
    return "?";
}

namespace {

using plan::PlanOp;
using plan::RowMode;
using plan::TensorKind;

// A column view of an activation: tensor index plus first column.
struct View {
    int t;
    int col = 0;
};

class Builder {
public:
    Builder(const TextHParams& hp, const BuildOptions& o, Program& p) : hp(hp), o(o), p(p) {}

    int weight(const std::string& name, std::vector<int64_t> dims, WeightRole role) {
        TensorDesc d;
        d.name = name;
        d.kind = TensorKind::Weight;
        d.dims = std::move(dims);
        d.role = role;
        p.tensors.push_back(std::move(d));
        return (int)p.tensors.size() - 1;
    }
    int constant(const std::string& name, std::vector<float> data) {
        int t                 = weight(name, {(int64_t)data.size()}, WeightRole::Constant);
        p.tensors[t].constant = std::move(data);
        return t;
    }
    int act(const std::string& name, int64_t cols, int64_t rows = -1) {
        TensorDesc d;
        d.name = name;
        d.kind = TensorKind::Activation;
        d.dims = {rows < 0 ? o.max_rows : rows, cols};
        p.tensors.push_back(std::move(d));
        return (int)p.tensors.size() - 1;
    }
    int kv(const std::string& name, int64_t slots, int64_t width) {
        TensorDesc d;
        d.name  = name;
        d.kind  = TensorKind::KvCache;
        d.dtype = o.kv_dtype;
        d.dims  = {slots, width};
        p.tensors.push_back(std::move(d));
        return (int)p.tensors.size() - 1;
    }
    int64_t cols(int t) const { return p.tensors[t].dims[1]; }

    PlanOp& emit(OpCode code, const std::string& name, int layer, std::initializer_list<View> in,
                 std::initializer_list<View> out, RowMode rm = RowMode::All) {
        OpDesc d{};
        d.op.code  = (uint16_t)code;
        d.op.layer = layer < 0 ? plan::kNoLayer : (uint16_t)layer;
        for (int i = 0; i < 4; ++i)
            d.op.in[i] = -1;
        for (int i = 0; i < 2; ++i)
            d.op.out[i] = -1;
        int i = 0;
        for (View v : in)
            d.op.in[i] = v.t, d.op.in_col[i++] = v.col;
        i = 0;
        for (View v : out)
            d.op.out[i] = v.t, d.op.out_col[i++] = v.col;
        d.op.row_mode = (int32_t)rm;
        d.name        = layer < 0 ? name : name + "-" + std::to_string(layer);
        p.ops.push_back(d);
        return p.ops.back().op;
    }

    // y = x . W^T  (x: [T, K] activation, W: [N, K] weight)
    int matmul(View x, int w, const std::string& name, int layer, RowMode rm = RowMode::All,
               int64_t rows = -1) {
        int y    = act(layer < 0 ? name : name + "-" + std::to_string(layer), p.tensors[w].dims[0], rows);
        int bias = -1;
        if (o.biased.count(p.tensors[w].name)) {
            bias = weight(p.tensors[w].name + ".lora_bias", {p.tensors[w].dims[0]}, WeightRole::LoraBias);
            p.tensors[bias].bias_of = p.tensors[w].name;
        }
        emit(OpCode::Matmul, name, layer, {x, {w}, {bias}}, {{y}}, rm);
        return y;
    }
    // RMSNorm over groups of `dim` columns of the first `cols` columns; w < 0 = no scale. In place if y == x.
    int rms_norm(View x, int w, int64_t ncols, int dim, int y, const std::string& name, int layer,
                 RowMode rm = RowMode::All) {
        plan::set_params(emit(OpCode::RmsNorm, name, layer, {x, {w}}, {{y}}, rm),
                         plan::RmsNormParams{(int32_t)ncols, dim, hp.rms_norm_eps});
        return y;
    }
    int norm_new(int x, int w, const std::string& name, int layer, int dim = 0) {
        int y = act(layer < 0 ? name : name + "-" + std::to_string(layer), cols(x));
        return rms_norm({x}, w, cols(x), dim ? dim : (int)cols(x), y, name, layer);
    }
    int add(int a, int b, const std::string& name, int layer) {
        int y = act(layer < 0 ? name : name + "-" + std::to_string(layer), cols(a));
        plan::set_params(emit(OpCode::Add, name, layer, {{a}, {b}}, {{y}}),
                         plan::AddParams{(int32_t)cols(a)});
        return y;
    }
    int gelu_mul(View a, View b, int64_t ncols, const std::string& name, int layer) {
        int y = act(layer < 0 ? name : name + "-" + std::to_string(layer), ncols);
        plan::set_params(emit(OpCode::GeluMul, name, layer, {a, b}, {{y}}),
                         plan::GeluMulParams{(int32_t)ncols});
        return y;
    }
    // In place: x *= s * scalar_tensor
    void scale(int x, float s, int scalar, const std::string& name, int layer) {
        plan::set_params(emit(OpCode::Scale, name, layer, {{x}, {scalar}}, {{x}}),
                         plan::ScaleParams{(int32_t)cols(x), s});
    }
    void rope(int x, int inv_freq, int heads, int dim, const std::string& name, int layer) {
        plan::set_params(emit(OpCode::Rope, name, layer, {{x}, {inv_freq}}, {{x}}),
                         plan::RopeParams{heads, dim});
    }

    const TextHParams& hp;
    const BuildOptions& o;
    Program& p;
};

std::string lt(int il, const char* s) {
    return layer_tensor(il, s);
}

} // namespace

Program build_text_program(const TextHParams& hp, const BuildOptions& opt) {
    Program prog;
    Builder b(hp, opt, prog);
    const int64_t H = hp.hidden_size, V = hp.vocab_size, L = hp.num_layers, P = hp.ple_dim;
    const int nh = hp.num_heads;
    // Sliding caches hold the window plus one chunk, so a chunk never overwrites keys its first row needs.
    prog.sliding_slots = std::min(opt.max_context, hp.sliding_window + opt.max_rows - 1);

    // Inputs and shared weights.
    {
        TensorDesc ids;
        ids.name  = "ids";
        ids.kind  = TensorKind::Input;
        ids.dtype = DType::I32;
        ids.dims  = {opt.max_rows};
        prog.tensors.push_back(ids);
        prog.ids = (int)prog.tensors.size() - 1;
    }
    const int w_embed          = b.weight("embed_tokens.weight", {V, H}, WeightRole::Embedding);
    const int inv_freq_sliding = b.constant("rope_inv_freq.sliding", rope_inv_freq(hp, LayerType::Sliding));
    const int inv_freq_full    = b.constant("rope_inv_freq.full", rope_inv_freq(hp, LayerType::Full));

    // inp_embd = embed_tokens[ids] * sqrt(H)   (HF casts the scale to the weight dtype; f32 here).
    // docs/gemma4.md "Embeddings and scaling".
    int x = b.act("inp_embd", H);
    {
        plan::set_params(b.emit(OpCode::Embed, "inp_embd", -1, {{prog.ids}, {w_embed}}, {{x}}),
                         plan::EmbedParams{embed_scale(hp, false)});
    }

    // Per-layer embeddings: ple[T, L*P] = (norm_P(inp_embd . W_plp^T * H^-1/2) + E_pl[ids] * sqrt(P)) *
    // 2^-1/2 (docs/gemma4.md "Per-layer embeddings").
    int ple = -1;
    if (P > 0) {
        const int w_ple_table =
            b.weight("embed_tokens_per_layer.weight", {hp.ple_vocab_size, L * P}, WeightRole::PleTable);
        const int w_ple_proj = b.weight("per_layer_model_projection.weight", {L * P, H}, WeightRole::PleProj);
        const int w_ple_norm = b.weight("per_layer_projection_norm.weight", {P}, WeightRole::Norm);
        int ple_tok          = b.act("ple_tok", L * P);
        plan::set_params(b.emit(OpCode::Embed, "ple_tok", -1, {{prog.ids}, {w_ple_table}}, {{ple_tok}}),
                         plan::EmbedParams{std::sqrt((float)P)});
        int ple_ctx = b.matmul({x}, w_ple_proj, "ple_ctx", -1);
        b.scale(ple_ctx, (float)(1.0 / std::sqrt((double)H)), -1, "ple_ctx_scaled", -1);
        b.rms_norm({ple_ctx}, w_ple_norm, L * P, (int)P, ple_ctx, "ple_ctx_norm", -1);
        ple = b.add(ple_ctx, ple_tok, "ple", -1);
        b.scale(ple, (float)(1.0 / std::sqrt(2.0)), -1, "ple_scaled", -1);
    }

    std::vector<int> k_cache(L, -1), v_cache(L, -1), slots(L, 0);
    for (int il = 0; il < L; ++il) {
        const LayerInfo li = layer_info(hp, il);
        const int d = li.head_dim, nkv = li.num_kv_heads;
        const bool full    = li.type == LayerType::Full;
        const int inv_freq = full ? inv_freq_full : inv_freq_sliding;

        // Attention block: x = x + post_attn_norm(o_proj(attn(rope(q_norm(q)), K, V)))
        // (docs/gemma4.md "Attention", "RoPE").
        int w_in_norm = b.weight(lt(il, "input_layernorm.weight"), {H}, WeightRole::Norm);
        int attn_norm = b.norm_new(x, w_in_norm, "attn_norm", il);
        int w_q = b.weight(lt(il, "self_attn.q_proj.weight"), {(int64_t)nh * d, H}, WeightRole::AttnProj);
        int w_q_norm = b.weight(lt(il, "self_attn.q_norm.weight"), {d}, WeightRole::Norm);
        // q, k, v projections first (one grouped launch on CUDA), then their norms, RoPE and the cache store.
        int q = b.matmul({attn_norm}, w_q, "q", il), k = -1, v = -1, w_k_norm = -1;
        if (!li.kv_shared) {
            int w_k =
                b.weight(lt(il, "self_attn.k_proj.weight"), {(int64_t)nkv * d, H}, WeightRole::AttnProj);
            int w_v =
                b.weight(lt(il, "self_attn.v_proj.weight"), {(int64_t)nkv * d, H}, WeightRole::AttnProj);
            w_k_norm = b.weight(lt(il, "self_attn.k_norm.weight"), {d}, WeightRole::Norm);
            k        = b.matmul({attn_norm}, w_k, "k", il);
            v        = b.matmul({attn_norm}, w_v, "v", il);
        }
        b.rms_norm({q}, w_q_norm, (int64_t)nh * d, d, q, "q_norm", il);
        b.rope(q, inv_freq, nh, d, "q_rope", il);
        if (!li.kv_shared) {
            b.rms_norm({k}, w_k_norm, (int64_t)nkv * d, d, k, "k_norm", il);
            b.rope(k, inv_freq, nkv, d, "k_rope", il);
            b.rms_norm({v}, -1, (int64_t)nkv * d, d, v, "v_norm", il);
            slots[il]   = full ? opt.max_context : prog.sliding_slots;
            k_cache[il] = b.kv("cache_k-" + std::to_string(il), slots[il], (int64_t)nkv * d);
            v_cache[il] = b.kv("cache_v-" + std::to_string(il), slots[il], (int64_t)nkv * d);
            plan::set_params(
                b.emit(OpCode::KvStore, "kv_store", il, {{k}, {v}}, {{k_cache[il]}, {v_cache[il]}}),
                plan::KvStoreParams{nkv * d, slots[il]});
        }
        // KV-shared layers read the donor's cache: a static table, no copy, no memory of their own
        // (docs/gemma4.md "KV sharing").
        const int src = li.kv_source;
        int attn      = b.act("attn-" + std::to_string(il), (int64_t)nh * d);
        {
            plan::AttentionParams a;
            a.heads    = nh;
            a.kv_heads = nkv;
            a.dim      = d;
            a.slots    = slots[src];
            // A window of max_context or more hides no key any position can have (HF's mask then masks
            // nothing either): clamped, the plan's caches and the runtime's checks see a window that fits.
            a.window = full ? 0 : std::min(hp.sliding_window, opt.max_context);
            a.scale  = 1.0f; // Gemma 4: q/k norms replace 1/sqrt(d)
            plan::set_params(
                b.emit(OpCode::Attention, "attn", il, {{q}, {k_cache[src]}, {v_cache[src]}}, {{attn}}), a);
        }
        int w_o = b.weight(lt(il, "self_attn.o_proj.weight"), {H, (int64_t)nh * d}, WeightRole::AttnProj);
        int w_post_attn = b.weight(lt(il, "post_attention_layernorm.weight"), {H}, WeightRole::Norm);
        int attn_o      = b.matmul({attn}, w_o, "attn_o", il);
        b.rms_norm({attn_o}, w_post_attn, H, (int)H, attn_o, "attn_post_norm", il);
        x = b.add(x, attn_o, "attn_out", il);

        // MLP block: x = x + post_ffw_norm(down(gelu(gate(f)) * up(f))), f = pre_ffw_norm(x)
        int w_pre_ffw  = b.weight(lt(il, "pre_feedforward_layernorm.weight"), {H}, WeightRole::Norm);
        int w_gate     = b.weight(lt(il, "mlp.gate_proj.weight"), {li.ff_dim, H}, WeightRole::MlpProj);
        int w_up       = b.weight(lt(il, "mlp.up_proj.weight"), {li.ff_dim, H}, WeightRole::MlpProj);
        int w_down     = b.weight(lt(il, "mlp.down_proj.weight"), {H, li.ff_dim}, WeightRole::MlpProj);
        int w_post_ffw = b.weight(lt(il, "post_feedforward_layernorm.weight"), {H}, WeightRole::Norm);
        int ffn_inp    = b.norm_new(x, w_pre_ffw, "ffn_norm", il);
        int gate       = b.matmul({ffn_inp}, w_gate, "ffn_gate", il);
        int up         = b.matmul({ffn_inp}, w_up, "ffn_up", il);
        int gu         = b.gelu_mul({gate}, {up}, li.ff_dim, "ffn_gelu_mul", il);
        int down       = b.matmul({gu}, w_down, "ffn_down", il);
        b.rms_norm({down}, w_post_ffw, H, (int)H, down, "ffn_post_norm", il);
        x = b.add(x, down, "ffn_out", il);

        // PLE block: x = x + post_ple_norm(proj(gelu(gate(x)) * ple[:, il]))
        if (P > 0) {
            int w_pg    = b.weight(lt(il, "per_layer_input_gate.weight"), {P, H}, WeightRole::PleProj);
            int w_pp    = b.weight(lt(il, "per_layer_projection.weight"), {H, P}, WeightRole::PleProj);
            int w_pnorm = b.weight(lt(il, "post_per_layer_input_norm.weight"), {H}, WeightRole::Norm);
            int pg      = b.matmul({x}, w_pg, "ple_gate", il);
            int pgm     = b.gelu_mul({pg}, {ple, (int)(il * P)}, P, "ple_gelu_mul", il);
            int pp      = b.matmul({pgm}, w_pp, "ple_proj", il);
            b.rms_norm({pp}, w_pnorm, H, (int)H, pp, "ple_post_norm", il);
            x = b.add(x, pp, "ple_out", il);
        }
        int w_scalar = b.weight(lt(il, "layer_scalar"), {1}, WeightRole::Scalar);
        b.scale(x, 1.0f, w_scalar, "layer_out", il);
    }

    // Head: logits = softcap(norm(x[last rows]) . embed_tokens^T)  (tied LM head;
    // docs/gemma4.md "Final norm, LM head and softcap").
    int w_norm = b.weight("norm.weight", {H}, WeightRole::Norm);
    int h      = b.act("result_norm", H, opt.logits_rows);
    b.rms_norm({x}, w_norm, H, (int)H, h, "result_norm", -1, RowMode::TailIn);
    const int w_head =
        opt.separate_lm_head ? b.weight("lm_head.weight", {V, H}, WeightRole::Embedding) : w_embed;
    prog.logits = b.matmul({h}, w_head, "result_output", -1, RowMode::OutRows, opt.logits_rows);
    if (hp.final_logit_softcap > 0) {
        plan::set_params(
            b.emit(OpCode::Softcap, "result_softcap", -1, {{prog.logits}}, {{prog.logits}}, RowMode::OutRows),
            plan::SoftcapParams{(int32_t)V, hp.final_logit_softcap});
    }
    return prog;
}

} // namespace g4::gemma4
