// Gemma 4's audio encoder configuration (config.json "audio_config", HF Gemma4AudioConfig) and its feature
// extractor's constants (HF Gemma4AudioFeatureExtractor), read by the compiler; the runtime's log-mel front
// end receives the latter through the plan.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace g4::gemma4 {

struct AudioHParams {
    int hidden_size = 0, num_hidden_layers = 0, num_attention_heads = 0, conv_kernel_size = 0,
        attention_chunk_size = 0, attention_context_left = 0, attention_context_right = 0,
        output_proj_dims             = 0;
    int subsampling_conv_channels[2] = {0, 0};
    float attention_logit_cap = 0, attention_invalid_logits_value = 0, residual_weight = 0, rms_norm_eps = 0,
          gradient_clipping  = 0;
    bool use_clipped_linears = true;
    int text_hidden_size     = 0;
    // mel_bins: HF builds input_proj_linear for (subsampling_conv_channels[0] / 4) frequency rows after the
    // two stride-2 convs, i.e. for channels[0] mel bins: 128 for the released models (the feature
    // extractor's default), 8 for the tiny test checkpoint.
    int mel_bins = 0;
};

// The log-mel front end (HF Gemma4AudioFeatureExtractor): 16 kHz mono, 20 ms periodic-Hann frames every
// 10 ms with frame_length / 2 zeros prepended, |FFT| through HTK triangular mel filters (no norm) over
// [0, sample_rate / 2], log(x + mel_floor). Clips are cut at max_samples and give at most max_tokens.
struct AudioFrontEnd {
    int sample_rate = 16000, frame_length = 320, hop_length = 160, fft_length = 512, mel_bins = 0;
    double min_hz = 0.0, max_hz = 8000.0, mel_floor = 1e-3;
    int64_t max_samples = 480000;
    int max_tokens      = 750;
};

// Parses "audio_config" (HF defaults for absent keys). Errors name the key; attention_context_right != 0
// is refused (Gemma 4 uses 0). Returns "" on success.
std::string parse_audio_hparams(const std::string& audio_config_json, int text_hidden_size,
                                AudioHParams* out);
AudioFrontEnd audio_front_end(const AudioHParams& hp);
// Every checkpoint tensor the encoder reads, relative to "model.", embed_audio.* included.
std::vector<std::string> audio_weight_names(const AudioHParams& hp);

// Valid log-mel frames of a clip (a frame is valid when its window ends inside the audio), and the soft
// tokens HF's processor inserts for it: the valid frames halved (rounding up) by each of the two stride-2
// convs, for at most max_samples samples and max_tokens tokens. 0 for clips shorter than one frame.
int64_t audio_valid_frames(const AudioFrontEnd& fe, int64_t n_samples);
int audio_soft_tokens(const AudioFrontEnd& fe, int64_t n_samples);

} // namespace g4::gemma4
