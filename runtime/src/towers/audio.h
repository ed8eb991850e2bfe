// Gemma 4's hand-written audio tower as the GPU audio tower (runtime/src/cuda/audio.cpp) uses it: the
// hyper-parameters, every weight resolved and shape-checked, HF Gemma4AudioFeatureExtractor's log-mel
// features of 16 kHz PCM on the CPU and the layout of the GPU's buffers. The CPU runs the plan's audio
// program instead (runtime/src/frontend/media.cpp).
#pragma once
#include "kernels/cpu/cpu.h"
#include "runtime/src/towers/tower.h"

#include <cstdint>
#include <string>
#include <vector>

namespace g4::towers {

struct AudioHParams { // from config.json "audio_config" (+ the text hidden size); feature-extractor constants
                      // too
    int hidden_size, num_hidden_layers, num_attention_heads, conv_kernel_size, attention_chunk_size,
        attention_context_left, attention_context_right, output_proj_dims;
    int subsampling_conv_channels[2];
    float attention_logit_cap, attention_invalid_logits_value, residual_weight, rms_norm_eps,
        gradient_clipping;
    bool use_clipped_linears;
    int text_hidden_size;
    int sample_rate = 16000, mel_bins = 128; // feature extractor (HF Gemma4AudioFeatureExtractor defaults)
    Precision precision =
        Precision::F32; // not in config.json: set by the caller before init (plan META towers)
};

// Parses "audio_config". mel_bins: HF builds input_proj_linear for (subsampling_conv_channels[0] / 4)
// frequency rows after the two stride-2 convs, i.e. for channels[0] mel bins; that is 128 (the feature
// extractor's default) for the released models, and this value is what is set here (8 for the tiny test
// checkpoint). Errors name the key; attention_context_right != 0 is refused (Gemma 4 uses 0).
std::string parse_audio_hparams(const std::string& audio_config_json, int text_hidden_size,
                                AudioHParams* out);
std::vector<std::string>
audio_weight_names(const AudioHParams& hp); // relative to "model.", incl. embed_audio.*
// Soft tokens HF's processor inserts for a clip of n_samples (the valid frames after the two stride-2 convs,
// capped as HF caps it: clips over 30 s are truncated to 480000 samples, 750 tokens); equals forward's
// *n_soft. 0 for clips shorter than one frame (161 samples).
int audio_soft_tokens(const AudioHParams& hp, int64_t n_samples);

class AudioTower {
public:
    // Resolves and shape-checks every weight (errors name the tensor); fixes the longest clip: max_samples
    // (HF: 30 s = 480000).
    std::string init(const AudioHParams& hp, const Lookup& lookup, int64_t max_samples);

    // The feature extractor: features [n_frames, mel_bins] = HF input_features for the valid frames
    // (HF pads the batch to a multiple of 128 samples and zeroes the extra frames; those are not produced).
    // Returns the error or ""; *n_frames = valid frames.
    // Needs only the Context's per-thread scratch (gpu_thread_scratch_floats() floats a thread).
    std::string features(const cpu::Context& ctx, const float* pcm, int64_t n_samples, float* features,
                         int* n_frames) const;
    static int64_t valid_frames(int64_t n_samples); // valid log-mel frames of a clip (HF frame mask)

    const AudioHParams& hparams() const { return hp_; }
    int max_soft_tokens() const { return max_t_; } // soft tokens of a max_samples clip

    // The GPU forward (runtime/src/cuda/audio.cpp): the log-mel features stay on the CPU (features() into
    // gpu_host_scratch_bytes() of host memory, gpu_thread_scratch_floats() per thread), the rest runs from
    // the device buffer below, sized for max_samples. Byte offsets (256-aligned): steps (two Step structs:
    // rows T, rows n_rel), pe [n_rel, H], x [T, H]; then the front end: feat [max_frames, mel_bins],
    // l0 [T1, F1, C0], l1 [T, F2, C1]; reusing that memory once x is made, the conformer: n [T, H],
    // big [T, max(4H, P)], q / k / v / o [T, H], rel [n_rel, H], out [T, text_hidden]. The compiler
    // counts `total` in the GPU's memory plan.
    struct GpuLayout {
        size_t steps, pe, x, feat, l0, l1, n, big, q, k, v, o, rel, out, total;
    };
    const GpuLayout& gpu_layout() const { return gpu_; }
    size_t gpu_host_scratch_bytes() const;
    size_t gpu_thread_scratch_floats() const { return feature_floats_; }

    struct Clip { // ClippableLinear: weight [out, in] + optional activation bounds
        const Tensor* w = nullptr;
        float in_min = 0, in_max = 0, out_min = 0, out_max = 0;
        bool clipped = false;
    };
    struct FeedForward {
        Clip w1, w2;
        const Tensor *pre = nullptr, *post = nullptr;
    };
    struct Layer {
        FeedForward ff1, ff2;
        Clip q, k, v, post;
        const Tensor *rel_k = nullptr, *per_dim_scale = nullptr;
        Clip lstart, lend;
        const Tensor *dwconv = nullptr, *lpre = nullptr, *conv_norm = nullptr;
        const Tensor *norm_pre_attn = nullptr, *norm_post_attn = nullptr, *norm_out = nullptr;
    };
    const std::vector<Layer>& layers() const { return layers_; }
    const Tensor* conv0() const { return conv0_; }            // [C0, 1, 3, 3]
    const Tensor* norm0() const { return norm0_; }            // [C0]
    const Tensor* conv1() const { return conv1_; }            // [C1, C0, 3, 3]
    const Tensor* norm1() const { return norm1_; }            // [C1]
    const Tensor* input_proj() const { return in_proj_; }     // [H, F2 * C1]
    const Tensor* output_proj() const { return out_proj_w_; } // [P, H]
    const Tensor* output_bias() const { return out_proj_b_; } // [P]
    const Tensor* embed_proj() const { return embed_; }       // [text_hidden, P]
    const float* rel_pos_table() const { return pe_.data(); } // [n_rel, H]
    int n_rel() const { return n_rel_; }
    int head_dim() const { return head_dim_; }
    // F1, F2: frequency rows after conv 0 / 1.
    int freq_bins(int layer) const { return layer == 0 ? f1_ : f2_; }
    // Gemma4RMSNorm's default eps, used where HF does not pass the config's.
    static constexpr float kDefaultNormEps = 1e-6f;

private:
    void lay_out_gpu(); // gpu_ from hp_, max_frames_, max_t_, n_rel_ and the frequency rows
    AudioHParams hp_{};
    bool ready_          = false;
    int64_t max_samples_ = 0;
    int max_t_ = 0, max_frames_ = 0, f1_ = 0, f2_ = 0, head_dim_ = 0, n_rel_ = 0;
    const Tensor *conv0_ = nullptr, *norm0_ = nullptr, *conv1_ = nullptr, *norm1_ = nullptr,
                 *in_proj_    = nullptr;
    const Tensor *out_proj_w_ = nullptr, *out_proj_b_ = nullptr, *embed_ = nullptr;
    std::vector<Layer> layers_;
    std::vector<float> pe_;            // [n_rel, hidden] relative position sinusoids (HF float32 values)
    std::vector<float> window_;        // [320] periodic Hann, float32 as HF casts it
    std::vector<double> twiddle_;      // [256] complex e^{-2 pi i k / 512} (re, im)
    std::vector<int> bitrev_;          // [512]
    std::vector<double> mel_;          // [mel_bins, 257] triangular filters (HTK, no norm), row per mel bin
    std::vector<int> mel_lo_, mel_hi_; // non-zero bin range [lo, hi) of each filter
    GpuLayout gpu_{};
    size_t feature_floats_ = 0;
};

} // namespace g4::towers
