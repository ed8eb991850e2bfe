// Log-mel spectrogram front end for audio encoders, parameterised by the values the compiler records in the
// plan: frames of frame_length samples every hop_length (frame_length / 2 zeros prepended), a periodic Hann
// window, the magnitude of a fft_length-point FFT, HTK triangular mel filters (no norm) over [min_hz,
// max_hz], log(x + mel_floor). Only valid frames (whose window ends inside the clip) are produced.
#pragma once
#include "kernels/cpu/cpu.h"

#include <cstdint>
#include <string>
#include <vector>

namespace g4::media {

struct LogMelParams {
    int sample_rate = 0, frame_length = 0, hop_length = 0, fft_length = 0, mel_bins = 0;
    double min_hz = 0, max_hz = 0, mel_floor = 0;
};

class LogMel {
public:
    // Checks the parameters (fft_length a power of two >= frame_length, ...) and builds the tables.
    std::string init(const LogMelParams& p);
    const LogMelParams& params() const { return p_; }
    int64_t valid_frames(int64_t n_samples) const;
    // Per-thread scratch floats compute() needs in the Context.
    size_t thread_floats() const { return thread_floats_; }
    // features [valid_frames(n), mel_bins]. Samples must be finite (checked by the caller).
    void compute(const cpu::Context& ctx, const float* pcm, int64_t n_samples, float* features) const;

private:
    LogMelParams p_{};
    int bins_ = 0, log2_fft_ = 0;
    size_t thread_floats_ = 0;
    std::vector<float> window_;        // [frame_length] periodic Hann, float32
    std::vector<double> twiddle_;      // [fft/2] complex e^{-2 pi i k / fft}
    std::vector<int> bitrev_;          // [fft]
    std::vector<double> mel_;          // [mel_bins, bins] filters, one row per mel bin
    std::vector<int> mel_lo_, mel_hi_; // non-zero bin range [lo, hi) of each filter
};

} // namespace g4::media
