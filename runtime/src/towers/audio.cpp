// The hand-written audio tower's weights, features and GPU buffer layout (see audio.h), for the GPU audio
// tower (runtime/src/cuda/audio.cpp).
#include "runtime/src/towers/audio.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace g4::towers {
namespace {

constexpr int kFrameLen         = 320; // 20 ms at 16 kHz
constexpr int kHop              = 160; // 10 ms
constexpr int kFft              = 512;
constexpr int kBins             = kFft / 2 + 1; // 257
constexpr int64_t kHfMaxSamples = 480000;       // HF feature extractor max_length (30 s), truncation on
constexpr int kHfMaxTokens      = 750;          // HF processor audio_seq_length
constexpr double kMelFloor      = 1e-3;

size_t align16(size_t n) {
    return (n + 15) / 16 * 16;
}
int64_t ceil_half(int64_t n) {
    return (n + 1) / 2;
}

std::string shape_str(const int64_t* d, int n) {
    std::string s = "[";
    for (int i = 0; i < n; ++i)
        s += (i ? ", " : "") + std::to_string(d[i]);
    return s + "]";
}

} // namespace

// ---- hyper-parameters ----------------------------------------------------------------------------------

std::string parse_audio_hparams(const std::string& audio_config_json, int text_hidden_size,
                                AudioHParams* out) {
    nlohmann::json j = nlohmann::json::parse(audio_config_json, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return "audio_config: not a JSON object";
    AudioHParams hp{};
    std::string err;
    auto num = [&](const char* key, double def) -> double { // HF Gemma4AudioConfig defaults when absent
        if (!j.contains(key) || j[key].is_null()) return def;
        if (!j[key].is_number()) {
            if (err.empty()) err = std::string("audio_config.") + key + ": expected a number";
            return def;
        }
        return j[key].get<double>();
    };
    auto integer = [&](const char* key, int def, int min) -> int {
        double v = num(key, def);
        if (v != std::floor(v) || v < min || v > 1e8) { // NaN fails the first test
            if (err.empty())
                err = std::string("audio_config.") + key + ": expected an integer >= " + std::to_string(min) +
                      ", got " + std::to_string(v);
            return def; // never converted: the value may not fit an int
        }
        return (int)v;
    };
    hp.hidden_size                    = integer("hidden_size", 1024, 2);
    hp.num_hidden_layers              = integer("num_hidden_layers", 12, 0);
    hp.num_attention_heads            = integer("num_attention_heads", 8, 1);
    hp.conv_kernel_size               = integer("conv_kernel_size", 5, 1);
    hp.attention_chunk_size           = integer("attention_chunk_size", 12, 1);
    hp.attention_context_left         = integer("attention_context_left", 13, 2);
    hp.attention_context_right        = integer("attention_context_right", 0, 0);
    hp.output_proj_dims               = integer("output_proj_dims", 1536, 1);
    hp.attention_logit_cap            = (float)num("attention_logit_cap", 50.0);
    hp.attention_invalid_logits_value = (float)num("attention_invalid_logits_value", -1e9);
    hp.residual_weight                = (float)num("residual_weight", 0.5);
    hp.rms_norm_eps                   = (float)num("rms_norm_eps", 1e-6);
    hp.gradient_clipping =
        (float)std::min(num("gradient_clipping", 1e10), (double)std::numeric_limits<float>::max());
    hp.use_clipped_linears = true;
    if (j.contains("use_clipped_linears") && !j["use_clipped_linears"].is_null()) {
        if (!j["use_clipped_linears"].is_boolean())
            return "audio_config.use_clipped_linears: expected true or false";
        hp.use_clipped_linears = j["use_clipped_linears"].get<bool>();
    }
    hp.subsampling_conv_channels[0] = 128;
    hp.subsampling_conv_channels[1] = 32;
    if (j.contains("subsampling_conv_channels")) {
        const auto& c = j["subsampling_conv_channels"];
        if (!c.is_array() || c.size() != 2 || !c[0].is_number_integer() || !c[1].is_number_integer() ||
            c[0].get<int64_t>() < 4 || c[1].get<int64_t>() < 1 || c[0].get<int64_t>() > (1 << 20) ||
            c[1].get<int64_t>() > (1 << 20))
            return "audio_config.subsampling_conv_channels: expected two integers [4 <= c0, 1 <= c1, both <= "
                   "1048576]";
        hp.subsampling_conv_channels[0] = int(c[0].get<int64_t>());
        hp.subsampling_conv_channels[1] = int(c[1].get<int64_t>());
    }
    if (!err.empty()) return err;
    if (j.contains("hidden_act") && j["hidden_act"] != "silu")
        return "audio_config.hidden_act: only \"silu\" is supported (Gemma 4), got " + j["hidden_act"].dump();
    if (hp.hidden_size % hp.num_attention_heads != 0)
        return "audio_config: hidden_size " + std::to_string(hp.hidden_size) +
               " is not a multiple of num_attention_heads " + std::to_string(hp.num_attention_heads);
    if (hp.hidden_size % 2 != 0)
        return "audio_config.hidden_size must be even (sin/cos relative position table)";
    if (hp.attention_context_right != 0)
        return "audio_config.attention_context_right = " + std::to_string(hp.attention_context_right) +
               " is not supported (Gemma 4 audio attention looks only at past frames: 0)";
    if (!(hp.attention_logit_cap > 0)) return "audio_config.attention_logit_cap must be > 0";
    if (!(hp.rms_norm_eps > 0)) return "audio_config.rms_norm_eps must be > 0";
    if (!(hp.gradient_clipping > 0)) return "audio_config.gradient_clipping must be > 0";
    if (text_hidden_size <= 0)
        return "audio tower: text hidden size must be > 0, got " + std::to_string(text_hidden_size);
    hp.text_hidden_size = text_hidden_size;
    hp.sample_rate      = 16000;
    hp.mel_bins         = 4 * (hp.subsampling_conv_channels[0] / 4);
    *out                = hp;
    return "";
}

std::vector<std::string> audio_weight_names(const AudioHParams& hp) {
    std::vector<std::string> v;
    const std::string s = "audio_tower.subsample_conv_projection.";
    for (const char* n : {"layer0.conv.weight", "layer0.norm.weight", "layer1.conv.weight",
                          "layer1.norm.weight", "input_proj_linear.weight"})
        v.push_back(s + n);
    auto clip = [&](const std::string& p) {
        v.push_back(p + ".linear.weight");
        if (hp.use_clipped_linears)
            for (const char* b : {".input_min", ".input_max", ".output_min", ".output_max"})
                v.push_back(p + b);
    };
    for (int l = 0; l < hp.num_hidden_layers; ++l) {
        const std::string p = "audio_tower.layers." + std::to_string(l) + ".";
        for (const char* ff : {"feed_forward1", "feed_forward2"}) {
            clip(p + ff + ".ffw_layer_1");
            clip(p + ff + ".ffw_layer_2");
            v.push_back(p + ff + ".pre_layer_norm.weight");
            v.push_back(p + ff + ".post_layer_norm.weight");
        }
        for (const char* n : {"q_proj", "k_proj", "v_proj", "post"})
            clip(p + "self_attn." + n);
        v.push_back(p + "self_attn.relative_k_proj.weight");
        v.push_back(p + "self_attn.per_dim_scale");
        clip(p + "lconv1d.linear_start");
        clip(p + "lconv1d.linear_end");
        v.push_back(p + "lconv1d.depthwise_conv1d.weight");
        v.push_back(p + "lconv1d.pre_layer_norm.weight");
        v.push_back(p + "lconv1d.conv_norm.weight");
        for (const char* n : {"norm_pre_attn", "norm_post_attn", "norm_out"})
            v.push_back(p + n + ".weight");
    }
    v.push_back("audio_tower.output_proj.weight");
    v.push_back("audio_tower.output_proj.bias");
    v.push_back("embed_audio.embedding_projection.weight");
    return v;
}

int64_t AudioTower::valid_frames(int64_t n_samples) {
    // Frame f covers padded samples [160 f, 160 f + 320] (160 zeros prepended); valid iff the last is real
    // audio.
    const int64_t first = kFrameLen + 1 - kFrameLen / 2; // 161: the end of frame 0's window
    if (n_samples < first) return 0;
    return (n_samples - first) / kHop + 1;
}

int audio_soft_tokens(const AudioHParams& hp, int64_t n_samples) {
    int64_t n = std::min(n_samples, kHfMaxSamples);
    int64_t t = ceil_half(ceil_half(AudioTower::valid_frames(n)));
    return (int)std::min<int64_t>(t, kHfMaxTokens);
}

// ---- init ----------------------------------------------------------------------------------------------

std::string AudioTower::init(const AudioHParams& hp, const Lookup& lookup, int64_t max_samples) {
    ready_ = false;
    hp_    = hp;
    layers_.clear();
    if (max_samples <= 0) return "audio tower: max_samples must be > 0";
    if (hp.sample_rate != 16000)
        return "audio tower: only 16000 Hz audio is supported, hparams say " + std::to_string(hp.sample_rate);
    if (hp.mel_bins < 1) return "audio tower: mel_bins must be >= 1";
    if (hp.hidden_size <= 0 || hp.num_attention_heads <= 0 || hp.hidden_size % hp.num_attention_heads ||
        hp.hidden_size % 2 || hp.attention_context_right != 0 || hp.attention_context_left < 2 ||
        hp.attention_chunk_size < 1 || hp.conv_kernel_size < 1 || hp.output_proj_dims < 1 ||
        hp.text_hidden_size < 1 || hp.num_hidden_layers < 0 || hp.subsampling_conv_channels[0] < 1 ||
        hp.subsampling_conv_channels[1] < 1)
        return "audio tower: inconsistent hyper-parameters (use parse_audio_hparams)";

    const int H = hp.hidden_size, C0 = hp.subsampling_conv_channels[0], C1 = hp.subsampling_conv_channels[1];
    const int P       = hp.output_proj_dims;
    head_dim_         = H / hp.num_attention_heads;
    f1_               = (int)ceil_half(hp.mel_bins);
    f2_               = (int)ceil_half(f1_);
    const int context = hp.attention_chunk_size + hp.attention_context_left - 1 + hp.attention_context_right;
    n_rel_            = context / 2 + 1;

    std::string err;
    auto get = [&](const std::string& name, std::initializer_list<int64_t> dims) -> const Tensor* {
        if (!err.empty()) return nullptr;
        const Tensor* t  = lookup("audio_tower." + name);
        std::string full = "model.audio_tower." + name;
        if (name.rfind("embed_audio.", 0) == 0) {
            t    = lookup(name);
            full = "model." + name;
        }
        if (!t) {
            err = "audio tower: missing tensor " + full;
            return nullptr;
        }
        if (t->dtype != DType::F32 && t->dtype != DType::BF16) {
            err = "audio tower: tensor " + full + " has dtype " + dtype_str(t->dtype) +
                  ", expected F32 or BF16";
            return nullptr;
        }
        bool ok = t->ndim == (int)dims.size() && t->data;
        int i   = 0;
        for (int64_t d : dims)
            ok = ok && t->dims[i++] == d;
        if (!ok) {
            std::vector<int64_t> e(dims);
            err = "audio tower: tensor " + full + " has shape " + shape_str(t->dims, t->ndim) +
                  ", expected " + shape_str(e.data(), (int)e.size()) +
                  " (audio_config and checkpoint disagree)";
            return nullptr;
        }
        return t;
    };
    auto scalar = [&](const std::string& name, float* v) {
        if (!err.empty()) return;
        const Tensor* t = lookup("audio_tower." + name);
        if (!t) {
            err = "audio tower: missing tensor model.audio_tower." + name;
            return;
        }
        if ((t->dtype != DType::F32 && t->dtype != DType::BF16) || t->numel() != 1 || !t->data) {
            err = "audio tower: tensor model.audio_tower." + name +
                  " must be one F32/BF16 value (a 0-d clip bound)";
            return;
        }
        *v = tensor_at(*t, 0);
    };
    auto clip = [&](const std::string& p, int64_t out, int64_t in) {
        Clip c;
        c.w       = get(p + ".linear.weight", {out, in});
        c.clipped = hp.use_clipped_linears;
        if (c.clipped) {
            scalar(p + ".input_min", &c.in_min);
            scalar(p + ".input_max", &c.in_max);
            scalar(p + ".output_min", &c.out_min);
            scalar(p + ".output_max", &c.out_max);
        }
        return c;
    };

    const std::string s = "subsample_conv_projection.";
    conv0_              = get(s + "layer0.conv.weight", {C0, 1, 3, 3});
    norm0_              = get(s + "layer0.norm.weight", {C0});
    conv1_              = get(s + "layer1.conv.weight", {C1, C0, 3, 3});
    norm1_              = get(s + "layer1.norm.weight", {C1});
    if (err.empty()) {
        const Tensor* ip = lookup("audio_tower." + s + "input_proj_linear.weight");
        if (ip && ip->ndim == 2 && ip->dims[1] != (int64_t)f2_ * C1)
            return "audio tower: model.audio_tower." + s + "input_proj_linear.weight takes " +
                   std::to_string(ip->dims[1]) + " inputs but " + std::to_string(hp.mel_bins) +
                   " mel bins give " + std::to_string(f2_) + " x " + std::to_string(C1) + " = " +
                   std::to_string(f2_ * C1) + " after the two stride-2 convs (mel_bins mismatch)";
    }
    in_proj_ = get(s + "input_proj_linear.weight", {H, (int64_t)f2_ * C1});
    for (int l = 0; l < hp.num_hidden_layers && err.empty(); ++l) {
        const std::string p = "layers." + std::to_string(l) + ".";
        Layer L;
        FeedForward* ffs[2] = {&L.ff1, &L.ff2};
        const char* ffn[2]  = {"feed_forward1", "feed_forward2"};
        for (int i = 0; i < 2; ++i) {
            ffs[i]->w1   = clip(p + ffn[i] + ".ffw_layer_1", 4 * (int64_t)H, H);
            ffs[i]->w2   = clip(p + ffn[i] + ".ffw_layer_2", H, 4 * (int64_t)H);
            ffs[i]->pre  = get(p + ffn[i] + ".pre_layer_norm.weight", {H});
            ffs[i]->post = get(p + ffn[i] + ".post_layer_norm.weight", {H});
        }
        L.q              = clip(p + "self_attn.q_proj", H, H);
        L.k              = clip(p + "self_attn.k_proj", H, H);
        L.v              = clip(p + "self_attn.v_proj", H, H);
        L.post           = clip(p + "self_attn.post", H, H);
        L.rel_k          = get(p + "self_attn.relative_k_proj.weight", {H, H});
        L.per_dim_scale  = get(p + "self_attn.per_dim_scale", {head_dim_});
        L.lstart         = clip(p + "lconv1d.linear_start", 2 * (int64_t)H, H);
        L.lend           = clip(p + "lconv1d.linear_end", H, H);
        L.dwconv         = get(p + "lconv1d.depthwise_conv1d.weight", {H, 1, hp.conv_kernel_size});
        L.lpre           = get(p + "lconv1d.pre_layer_norm.weight", {H});
        L.conv_norm      = get(p + "lconv1d.conv_norm.weight", {H});
        L.norm_pre_attn  = get(p + "norm_pre_attn.weight", {H});
        L.norm_post_attn = get(p + "norm_post_attn.weight", {H});
        L.norm_out       = get(p + "norm_out.weight", {H});
        layers_.push_back(L);
    }
    out_proj_w_ = get("output_proj.weight", {P, H});
    out_proj_b_ = get("output_proj.bias", {P});
    embed_      = get("embed_audio.embedding_projection.weight", {hp.text_hidden_size, P});
    if (!err.empty()) {
        layers_.clear();
        return err;
    }

    // Relative position sinusoids, as HF computes them in float32: positions context/2 .. 0.
    const int half  = H / 2;
    const float inc = (float)(-std::log(10000.0) / std::max(half - 1, 1));
    pe_.assign((size_t)n_rel_ * H, 0.0f);
    for (int p = 0; p < n_rel_; ++p) {
        float pos = (float)(n_rel_ - 1 - p);
        for (int i = 0; i < half; ++i) {
            float st                      = pos * std::exp((float)i * inc);
            pe_[(size_t)p * H + i]        = std::sin(st);
            pe_[(size_t)p * H + half + i] = std::cos(st);
        }
    }
    // Periodic Hann window (numpy hanning(321)[:320], cast to float32), FFT tables, HTK mel filters.
    window_.resize(kFrameLen);
    for (int n = 0; n < kFrameLen; ++n)
        window_[n] = (float)(0.5 - 0.5 * std::cos(2.0 * M_PI * n / kFrameLen));
    twiddle_.resize(kFft);
    for (int k = 0; k < kFft / 2; ++k) {
        twiddle_[2 * k]     = std::cos(2.0 * M_PI * k / kFft);
        twiddle_[2 * k + 1] = -std::sin(2.0 * M_PI * k / kFft);
    }
    bitrev_.resize(kFft);
    for (int i = 0; i < kFft; ++i) {
        int r = 0;
        for (int b = 0; b < 9; ++b)
            r |= ((i >> b) & 1) << (8 - b);
        bitrev_[i] = r;
    }
    const int M         = hp.mel_bins;
    auto hz_to_mel      = [](double f) { return 2595.0 * std::log10(1.0 + f / 700.0); };
    auto mel_to_hz      = [](double m) { return 700.0 * (std::pow(10.0, m / 2595.0) - 1.0); };
    const double mel_lo = hz_to_mel(0.0), mel_hi = hz_to_mel(hp.sample_rate / 2.0);
    std::vector<double> fpts(M + 2);
    for (int i = 0; i < M + 2; ++i)
        fpts[i] = mel_to_hz(i == M + 1 ? mel_hi : mel_lo + (mel_hi - mel_lo) / (M + 1) * i);
    mel_.assign((size_t)M * kBins, 0.0);
    mel_lo_.assign(M, 0);
    mel_hi_.assign(M, 0);
    for (int m = 0; m < M; ++m) {
        int lo = kBins, hi = 0;
        for (int k = 0; k < kBins; ++k) {
            double f                    = (double)(hp.sample_rate / 2) * k / (kBins - 1);
            double down                 = (f - fpts[m]) / (fpts[m + 1] - fpts[m]);
            double up                   = (fpts[m + 2] - f) / (fpts[m + 2] - fpts[m + 1]);
            double v                    = std::max(0.0, std::min(down, up));
            mel_[(size_t)m * kBins + k] = v;
            if (v > 0) {
                lo = std::min(lo, k);
                hi = k + 1;
            }
        }
        mel_lo_[m] = lo < hi ? lo : 0;
        mel_hi_[m] = lo < hi ? hi : 0;
    }

    // The GPU buffers, sized for the longest clip; the features' per-thread scratch.
    max_samples_    = max_samples;
    max_frames_     = (int)valid_frames(max_samples);
    max_t_          = (int)ceil_half(ceil_half(max_frames_));
    feature_floats_ = align16((size_t)2 * (2 * kFft + kBins) + 16); // FFT in doubles
    lay_out_gpu();
    ready_ = true;
    return "";
}

void AudioTower::lay_out_gpu() {
    const int64_t H = hp_.hidden_size, P = hp_.output_proj_dims, M = hp_.mel_bins;
    const int64_t C0 = hp_.subsampling_conv_channels[0], C1 = hp_.subsampling_conv_channels[1];
    const int64_t t1 = ceil_half(max_frames_);
    const size_t T   = (size_t)std::max(max_t_, 1);
    size_t b         = 0;
    auto bytes       = [&](size_t n4) { // n4 four-byte values, 256-byte aligned (cuMemAlloc's alignment)
        size_t at = b;
        b += (n4 * 4 + 255) / 256 * 256;
        return at;
    };
    gpu_.steps         = bytes(8);
    gpu_.pe            = bytes((size_t)n_rel_ * H);
    gpu_.x             = bytes(T * H);
    const size_t u     = b;
    gpu_.feat          = bytes((size_t)std::max(max_frames_, 1) * M);
    gpu_.l0            = bytes((size_t)std::max<int64_t>(t1, 1) * f1_ * C0);
    gpu_.l1            = bytes(T * f2_ * C1);
    const size_t front = b;
    b                  = u;
    gpu_.n             = bytes(T * H);
    gpu_.big           = bytes(T * std::max(4 * H, P));
    gpu_.q             = bytes(T * H);
    gpu_.k             = bytes(T * H);
    gpu_.v             = bytes(T * H);
    gpu_.o             = bytes(T * H);
    gpu_.rel           = bytes((size_t)n_rel_ * H);
    gpu_.out           = bytes(T * hp_.text_hidden_size);
    gpu_.total         = std::max(front, b);
}

size_t AudioTower::gpu_host_scratch_bytes() const {
    return (size_t)std::max(max_frames_, 1) * hp_.mel_bins * sizeof(float);
}

// ---- feature extraction ----------------------------------------------------------------------------------

std::string AudioTower::features(const cpu::Context& ctx, const float* pcm, int64_t n_samples,
                                 float* features, int* n_frames) const {
    if (!ready_) return "audio tower: init() did not succeed";
    if (!pcm || n_samples <= 0) return "audio clip is empty (0 samples)";
    if (n_samples > max_samples_)
        return "audio clip of " + std::to_string(n_samples) + " samples (" +
               std::to_string(n_samples / 16000.0) + " s) is longer than the " +
               std::to_string(max_samples_) + " samples (" + std::to_string(max_samples_ / 16000.0) +
               " s) this model accepts; trim or split it";
    const int64_t nf = valid_frames(n_samples);
    if (nf == 0)
        return "audio clip of " + std::to_string(n_samples) +
               " samples is shorter than one 20 ms analysis frame (161 samples at 16 kHz): it gives no audio "
               "tokens";
    if (!ctx.pool || !ctx.scratch || ctx.scratch_stride < feature_floats_)
        return "audio tower: the cpu::Context needs " + std::to_string(feature_floats_) +
               " scratch floats per thread";
    for (int64_t i = 0; i < n_samples; ++i)
        if (!std::isfinite(pcm[i]))
            return "audio clip: sample " + std::to_string(i) + " is not a finite number";

    const int M = hp_.mel_bins;
    ctx.pool->parallel_for(nf, [&](int64_t f, int th) {
        // [512] complex, then [257] magnitudes, in doubles (aligned up inside the thread's slice)
        double* buf = reinterpret_cast<double*>(((uintptr_t)ctx.thread_scratch(th) + 7) & ~(uintptr_t)7);
        double* mag = buf + 2 * kFft;
        for (int i = 0; i < kFft; ++i) {
            int n          = bitrev_[i];
            int64_t s      = f * kHop - kFrameLen / 2 + n; // 160 zeros prepended (semicausal padding)
            float v        = (n < kFrameLen && s >= 0) ? pcm[s] * window_[n] : 0.0f;
            buf[2 * i]     = v;
            buf[2 * i + 1] = 0.0;
        }
        for (int len = 2; len <= kFft; len <<= 1) {
            const int half = len >> 1, step = kFft / len;
            for (int b = 0; b < kFft; b += len)
                for (int j = 0; j < half; ++j) {
                    double wr = twiddle_[2 * j * step], wi = twiddle_[2 * j * step + 1];
                    double* a = buf + 2 * (b + j);
                    double* c = buf + 2 * (b + j + half);
                    double tr = c[0] * wr - c[1] * wi, ti = c[0] * wi + c[1] * wr;
                    c[0] = a[0] - tr;
                    c[1] = a[1] - ti;
                    a[0] += tr;
                    a[1] += ti;
                }
        }
        for (int k = 0; k < kBins; ++k)
            mag[k] = std::hypot(buf[2 * k], buf[2 * k + 1]);
        float* out = features + f * M;
        for (int m = 0; m < M; ++m) {
            const double* w = mel_.data() + (size_t)m * kBins;
            double acc      = 0;
            for (int k = mel_lo_[m]; k < mel_hi_[m]; ++k)
                acc += mag[k] * w[k];
            out[m] = (float)std::log(acc + kMelFloor);
        }
    });
    *n_frames = (int)nf;
    return "";
}

} // namespace g4::towers
