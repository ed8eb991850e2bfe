// Gemma 4 audio encoder as straight-line graph code (transformers' Gemma4AudioModel.forward and
// Gemma4MultimodalEmbedder): two stride-2 conv layers over the log-mel features, the input projection, the
// conformer blocks (macaron feed-forwards, chunked local attention with relative positions, light conv),
// the output projection and the projection into the text model's space. Only the clip's valid frames are
// computed: HF's padding frames are zero going into the convs, masked as attention keys and come after
// every valid frame of the causal conv, so they never reach a valid output row.
#include "models/gemma4/audio_graph.h"

#include "kernels/cpu/cpu.h"
#include "runtime/plan/op_params.h"

#include <algorithm>
#include <cmath>

namespace g4::gemma4 {

namespace {

using plan::PlanOp;
using plan::TensorKind;

constexpr int32_t kRowCountBase = 16;    // plan::kRowCountBase: row_mode of an op over row count k
constexpr float kDefaultNormEps = 1e-6f; // Gemma4RMSNorm's default, where HF does not pass the config's

struct View {
    int t;
    int col = 0;
};

class AudioBuilder {
public:
    AudioBuilder(const AudioHParams& hp, const AudioBuildOptions& o, const AudioTensorReader& read,
                 AudioProgram& ap)
        : hp(hp), o(o), read(read), p(ap.graph), ap(ap) {}

    int weight(const std::string& name, std::vector<int64_t> dims) {
        TensorDesc d;
        d.name = name;
        d.kind = TensorKind::Weight;
        d.dims = std::move(dims);
        d.role = WeightRole::Tower;
        p.tensors.push_back(std::move(d));
        return (int)p.tensors.size() - 1;
    }
    int constant(const std::string& name, std::vector<int64_t> dims, std::vector<float> data) {
        int t                 = weight(name, std::move(dims));
        p.tensors[t].role     = WeightRole::Constant;
        p.tensors[t].constant = std::move(data);
        return t;
    }
    int act(const std::string& name, int count, int64_t cols, TensorKind kind = TensorKind::Activation) {
        TensorDesc d;
        d.name = "audio." + name;
        d.kind = kind;
        d.dims = {ap.max_rows[count], cols};
        p.tensors.push_back(std::move(d));
        return (int)p.tensors.size() - 1;
    }
    int64_t cols(int t) const { return p.tensors[t].dims[1]; }

    PlanOp& emit(OpCode code, const std::string& name, int layer, int count, std::initializer_list<View> in,
                 std::initializer_list<View> out) {
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
        d.op.row_mode = kRowCountBase + count;
        d.name        = "audio_" + (layer < 0 ? name : name + "-" + std::to_string(layer));
        p.ops.push_back(d);
        return p.ops.back().op;
    }

    // y = x . W^T over row count `count`, bias (f32) added when given.
    int matmul(View x, int w, int y, int count, const std::string& name, int layer, int bias = -1) {
        plan::MatmulParams mp;
        mp.cpu_kernel = o.bf16_matmuls ? 2 : 1; // the CPU kernel: bf16 GEMM or the fp32 GEMM
        plan::set_params(emit(OpCode::Matmul, name, layer, count, {x, {w}, {bias}}, {{y}}), mp);
        return y;
    }
    void clamp(View x, int y, int64_t n, float lo, float hi, const std::string& name, int layer) {
        plan::set_params(emit(OpCode::Clamp, name, layer, kAudioTokens, {x}, {{y}}),
                         plan::ClampParams{(int32_t)n, lo, hi});
    }
    // y = RMSNorm(clip(x)) * w, clip to +-gradient_clipping first when `clip` (HF clamps before the norm).
    int norm(int x, int y, int w, float eps, bool clip, const std::string& name, int layer,
             int count = kAudioTokens) {
        const int64_t n = cols(x);
        if (clip) {
            clamp({x}, y, n, -hp.gradient_clipping, hp.gradient_clipping, name + "_clip", layer);
            x = y;
        }
        plan::set_params(emit(OpCode::RmsNorm, name, layer, count, {{x}, {w}}, {{y}}),
                         plan::RmsNormParams{(int32_t)n, (int32_t)n, eps});
        return y;
    }

    // HF ClippableLinear: y = clamp(clamp(x, in_min, in_max) . W^T, out_min, out_max). The clamped input
    // goes to xc (which may be x when x is a temporary).
    int linear(const std::string& prefix, View x, int xc, int64_t n_out, int y, const std::string& name,
               int layer) {
        const int64_t n_in = p.tensors[xc].dims[1];
        const int w        = weight(prefix + ".linear.weight", {n_out, n_in});
        if (hp.use_clipped_linears) {
            float b[4];
            const char* suffix[4] = {".input_min", ".input_max", ".output_min", ".output_max"};
            for (int i = 0; i < 4 && err.empty(); ++i)
                b[i] = scalar(prefix + suffix[i]);
            if (!err.empty()) return y;
            clamp(x, xc, n_in, b[0], b[1], name + "_in", layer);
            matmul({xc}, w, y, kAudioTokens, name, layer);
            clamp({y}, y, n_out, b[2], b[3], name + "_out", layer);
        } else {
            matmul(x, w, y, kAudioTokens, name, layer);
        }
        return y;
    }
    float scalar(const std::string& name) {
        std::vector<float> v;
        if (std::string e = read(name, &v); !e.empty()) {
            err = e;
            return 0;
        }
        if (v.size() != 1) err = "tensor model." + name + " must hold one value (a clip bound)";
        return v.empty() ? 0.0f : v[0];
    }

    const AudioHParams& hp;
    const AudioBuildOptions& o;
    const AudioTensorReader& read;
    Program& p;
    AudioProgram& ap;
    std::string err;
};

int64_t ceil_half(int64_t n) {
    return (n + 1) / 2;
}

} // namespace

std::vector<float> audio_relative_positions(const AudioHParams& hp, int* n_rel) {
    const int H       = hp.hidden_size;
    const int context = hp.attention_chunk_size + hp.attention_context_left - 1 + hp.attention_context_right;
    const int nr      = context / 2 + 1;
    const int half    = H / 2;
    const float inc   = (float)(-std::log(10000.0) / std::max(half - 1, 1));
    std::vector<float> pe((size_t)nr * H, 0.0f);
    for (int r = 0; r < nr; ++r) {
        const float pos = (float)(nr - 1 - r);
        for (int i = 0; i < half; ++i) {
            const float st               = pos * std::exp((float)i * inc);
            pe[(size_t)r * H + i]        = std::sin(st);
            pe[(size_t)r * H + half + i] = std::cos(st);
        }
    }
    *n_rel = nr;
    return pe;
}

std::string build_audio_program(const AudioHParams& hp, const AudioBuildOptions& opt,
                                const AudioTensorReader& read, AudioProgram* out) {
    AudioProgram ap;
    const AudioFrontEnd fe = audio_front_end(hp);
    const int64_t H = hp.hidden_size, M = hp.mel_bins, P = hp.output_proj_dims, TH = hp.text_hidden_size;
    const int C0 = hp.subsampling_conv_channels[0], C1 = hp.subsampling_conv_channels[1];
    const int NH = hp.num_attention_heads, D = (int)H / NH, K = hp.conv_kernel_size;
    const int F1 = (int)ceil_half(M), F2 = (int)ceil_half(F1);
    const int64_t frames =
        std::max<int64_t>(audio_valid_frames(fe, std::min(opt.max_samples, fe.max_samples)), 1);
    int n_rel             = 0;
    std::vector<float> pe = audio_relative_positions(hp, &n_rel);
    ap.max_rows = {(int32_t)frames, (int32_t)ceil_half(frames), (int32_t)ceil_half(ceil_half(frames)),
                   (int32_t)n_rel};
    AudioBuilder b(hp, opt, read, ap);
    Program& p            = ap.graph;
    const std::string sub = "audio_tower.subsample_conv_projection.";

    // Subsampling: two Conv2d 3x3 stride 2 + LayerNorm over channels + ReLU, then input_proj_linear.
    ap.features = b.act("features", kAudioFrames, M, TensorKind::Input);
    auto conv   = [&](int x, int count_in, int count_out, int f_in, int c_in, int f_out, int c_out, int li) {
        const std::string l = sub + "layer" + std::to_string(li) + ".";
        const int w         = b.weight(l + "conv.weight", {c_out, c_in, 3, 3});
        const int n         = b.weight(l + "norm.weight", {c_out});
        const int y         = b.act("conv" + std::to_string(li), count_out, (int64_t)f_out * c_out);
        plan::set_params(b.emit(OpCode::Conv2dNormRelu, "conv" + std::to_string(li), -1, count_out,
                                  {{x}, {w}, {n}}, {{y}}),
                           plan::Conv2dNormReluParams{f_in, c_in, f_out, c_out, count_in, hp.rms_norm_eps});
        return y;
    };
    const int l0   = conv(ap.features, kAudioFrames, kAudioHalfFrames, (int)M, 1, F1, C0, 0);
    const int l1   = conv(l0, kAudioHalfFrames, kAudioTokens, F1, C0, F2, C1, 1);
    int x          = b.matmul({l1}, b.weight(sub + "input_proj_linear.weight", {H, (int64_t)F2 * C1}),
                              b.act("input_proj", kAudioTokens, H), kAudioTokens, "input_proj", -1);
    const int w_pe = b.constant("audio.relative_positions", {n_rel, H}, std::move(pe));

    const float q_scale = (float)(std::pow((double)D, -0.5) / std::log(2.0));
    const float k_scale = (float)(std::log1p(std::exp(1.0)) / std::log(2.0));
    for (int il = 0; il < hp.num_hidden_layers && b.err.empty(); ++il) {
        const std::string L = "audio_tower.layers." + std::to_string(il) + ".";
        auto a              = [&](const char* name, int64_t cols, int count = kAudioTokens) {
            return b.act(std::string(name) + "-" + std::to_string(il), count, cols);
        };
        // Macaron feed-forward: x += residual_weight * RMS(clip(W2 silu(W1 RMS(clip(x); pre))); post).
        auto feed_forward = [&](const std::string& ff, int xin) {
            const std::string f = L + ff + ".";
            const std::string n = ff == "feed_forward1" ? "ff1" : "ff2";
            int h = b.norm(xin, a((n + "_norm").c_str(), H), b.weight(f + "pre_layer_norm.weight", {H}),
                           kDefaultNormEps, true, n + "_norm", il);
            int u = b.linear(f + "ffw_layer_1", {h}, h, 4 * H, a((n + "_up").c_str(), 4 * H), n + "_up", il);
            plan::set_params(b.emit(OpCode::Silu, n + "_silu", il, kAudioTokens, {{u}}, {{u}}),
                             plan::SiluParams{(int32_t)(4 * H)});
            int dn = b.linear(f + "ffw_layer_2", {u}, u, H, a((n + "_down").c_str(), H), n + "_down", il);
            b.norm(dn, dn, b.weight(f + "post_layer_norm.weight", {H}), kDefaultNormEps, true,
                   n + "_post_norm", il);
            int y = a((n + "_out").c_str(), H);
            plan::set_params(b.emit(OpCode::AddScaled, n + "_out", il, kAudioTokens, {{xin}, {dn}}, {{y}}),
                             plan::AddScaledParams{(int32_t)H, hp.residual_weight});
            return y;
        };
        x = feed_forward("feed_forward1", x);

        // Chunked local attention: x += RMS(clip(post(attn(RMS(clip(x); norm_pre_attn)))); norm_post_attn).
        {
            const std::string s = L + "self_attn.";
            int h   = b.norm(x, a("attn_norm", H), b.weight(L + "norm_pre_attn.weight", {H}), kDefaultNormEps,
                             true, "attn_norm", il);
            int q   = b.linear(s + "q_proj", {h}, a("attn_q_in", H), H, a("attn_q", H), "attn_q", il);
            int k   = b.linear(s + "k_proj", {h}, a("attn_k_in", H), H, a("attn_k", H), "attn_k", il);
            int v   = b.linear(s + "v_proj", {h}, a("attn_v_in", H), H, a("attn_v", H), "attn_v", il);
            int rel = b.matmul({w_pe}, b.weight(s + "relative_k_proj.weight", {H, H}),
                               a("attn_rel", H, kAudioRelPositions), kAudioRelPositions, "attn_rel", il);
            plan::set_params(b.emit(OpCode::SoftplusScale, "attn_q_scale", il, kAudioTokens,
                                    {{q}, {b.weight(s + "per_dim_scale", {D})}}, {{q}}),
                             plan::SoftplusScaleParams{(int32_t)H, D, q_scale});
            plan::set_params(b.emit(OpCode::Scale, "attn_k_scale", il, kAudioTokens, {{k}}, {{k}}),
                             plan::ScaleParams{(int32_t)H, k_scale});
            int o = a("attn_o", H);
            plan::set_params(
                b.emit(OpCode::LocalAttention, "attn", il, kAudioTokens, {{q}, {k}, {v}, {rel}}, {{o}}),
                plan::LocalAttentionParams{NH, D, hp.attention_context_left - 1, n_rel,
                                           hp.attention_logit_cap});
            int po = b.linear(s + "post", {o}, o, H, a("attn_post", H), "attn_post", il);
            b.norm(po, po, b.weight(L + "norm_post_attn.weight", {H}), kDefaultNormEps, true,
                   "attn_post_norm", il);
            int y = a("attn_out", H);
            plan::set_params(b.emit(OpCode::Add, "attn_out", il, kAudioTokens, {{x}, {po}}, {{y}}),
                             plan::AddParams{(int32_t)H});
            x = y;
        }

        // Light conv: x += linear_end(silu(RMS(clip(causal_conv(GLU(linear_start(RMS(x; pre)))));
        // conv_norm))).
        {
            const std::string c = L + "lconv1d.";
            int h = b.norm(x, a("lconv_norm", H), b.weight(c + "pre_layer_norm.weight", {H}), hp.rms_norm_eps,
                           false, "lconv_norm", il);
            int st = b.linear(c + "linear_start", {h}, h, 2 * H, a("lconv_start", 2 * H), "lconv_start", il);
            int g  = a("lconv_glu", H);
            plan::set_params(
                b.emit(OpCode::SigmoidMul, "lconv_glu", il, kAudioTokens, {{st, 0}, {st, (int)H}}, {{g}}),
                plan::SigmoidMulParams{(int32_t)H});
            int cv = a("lconv_conv", H);
            plan::set_params(b.emit(OpCode::CausalConv1d, "lconv_conv", il, kAudioTokens,
                                    {{g}, {b.weight(c + "depthwise_conv1d.weight", {H, 1, K})}}, {{cv}}),
                             plan::CausalConv1dParams{(int32_t)H, K});
            b.norm(cv, cv, b.weight(c + "conv_norm.weight", {H}), hp.rms_norm_eps, true, "lconv_conv_norm",
                   il);
            plan::set_params(b.emit(OpCode::Silu, "lconv_silu", il, kAudioTokens, {{cv}}, {{cv}}),
                             plan::SiluParams{(int32_t)H});
            int e = b.linear(c + "linear_end", {cv}, cv, H, a("lconv_end", H), "lconv_end", il);
            int y = a("lconv_out", H);
            plan::set_params(b.emit(OpCode::Add, "lconv_out", il, kAudioTokens, {{x}, {e}}, {{y}}),
                             plan::AddParams{(int32_t)H});
            x = y;
        }
        x = feed_forward("feed_forward2", x);
        x = b.norm(x, a("block_out", H), b.weight(L + "norm_out.weight", {H}), kDefaultNormEps, true,
                   "block_out", il);
    }

    // output_proj (+ bias), then embed_audio: RMS without scale and the projection to the text hidden size.
    std::vector<float> bias;
    if (b.err.empty()) b.err = read("audio_tower.output_proj.bias", &bias);
    if (b.err.empty() && (int64_t)bias.size() != P)
        b.err = "tensor model.audio_tower.output_proj.bias has " + std::to_string(bias.size()) +
                " values, expected " + std::to_string(P) + " (audio_config.output_proj_dims)";
    if (!b.err.empty()) return b.err;
    const int w_bias = b.constant("audio_tower.output_proj.bias", {P}, std::move(bias));
    int proj         = b.matmul({x}, b.weight("audio_tower.output_proj.weight", {P, H}),
                                b.act("output_proj", kAudioTokens, P), kAudioTokens, "output_proj", -1, w_bias);
    plan::set_params(b.emit(OpCode::RmsNorm, "embed_norm", -1, kAudioTokens, {{proj}, {-1}}, {{proj}}),
                     plan::RmsNormParams{(int32_t)P, (int32_t)P, hp.rms_norm_eps});
    ap.output = b.matmul({proj}, b.weight("embed_audio.embedding_projection.weight", {TH, P}),
                         b.act("soft_tokens", kAudioTokens, TH), kAudioTokens, "soft_tokens", -1);

    // Per-thread CPU scratch: the largest of the matmuls' and the sequence ops'.
    const int64_t max_k = std::max<int64_t>({4 * H, (int64_t)F2 * C1, P, H});
    size_t need         = std::max(cpu::scratch_floats_per_thread(max_k, 0), cpu::gemm_scratch_floats());
    if (opt.bf16_matmuls) need = std::max(need, cpu::gemm_bf16_scratch_floats());
    need = std::max({need, cpu::conv2d_scratch_floats(F1, 1, C0), cpu::conv2d_scratch_floats(F2, C0, C1),
                     cpu::causal_conv1d_scratch_floats((int32_t)H, K),
                     cpu::local_attention_scratch_floats(hp.attention_context_left - 1),
                     cpu::softplus_scale_scratch_floats(D)});
    ap.thread_floats = need;
    (void)p;
    *out = std::move(ap);
    return "";
}

} // namespace g4::gemma4
