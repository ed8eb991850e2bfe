// Log-mel front end (see log_mel.h): a radix-2 FFT in doubles per frame, one frame per task.
#include "runtime/src/log_mel.h"

#include <algorithm>
#include <cmath>

namespace g4::media {

std::string LogMel::init(const LogMelParams& p) {
    if (p.sample_rate <= 0 || p.frame_length < 2 || p.hop_length < 1 || p.mel_bins < 1 ||
        p.fft_length < p.frame_length || p.fft_length > (1 << 16) ||
        (p.fft_length & (p.fft_length - 1)) != 0 || !(p.mel_floor > 0) || !(p.min_hz >= 0) ||
        !(p.max_hz > p.min_hz) || p.max_hz > p.sample_rate / 2.0)
        return "audio front end: inconsistent log-mel parameters in the plan (recompile it)";
    p_        = p;
    bins_     = p.fft_length / 2 + 1;
    log2_fft_ = 0;
    while ((1 << log2_fft_) < p.fft_length)
        ++log2_fft_;
    const int N = p.fft_length, L = p.frame_length, M = p.mel_bins;
    window_.resize(L);
    for (int n = 0; n < L; ++n)
        window_[n] = (float)(0.5 - 0.5 * std::cos(2.0 * M_PI * n / L));
    twiddle_.resize(N);
    for (int k = 0; k < N / 2; ++k) {
        twiddle_[2 * k]     = std::cos(2.0 * M_PI * k / N);
        twiddle_[2 * k + 1] = -std::sin(2.0 * M_PI * k / N);
    }
    bitrev_.resize(N);
    for (int i = 0; i < N; ++i) {
        int r = 0;
        for (int b = 0; b < log2_fft_; ++b)
            r |= ((i >> b) & 1) << (log2_fft_ - 1 - b);
        bitrev_[i] = r;
    }
    auto hz_to_mel      = [](double f) { return 2595.0 * std::log10(1.0 + f / 700.0); };
    auto mel_to_hz      = [](double m) { return 700.0 * (std::pow(10.0, m / 2595.0) - 1.0); };
    const double mel_lo = hz_to_mel(p.min_hz), mel_hi = hz_to_mel(p.max_hz);
    std::vector<double> fpts(M + 2);
    for (int i = 0; i < M + 2; ++i)
        fpts[i] = mel_to_hz(i == M + 1 ? mel_hi : mel_lo + (mel_hi - mel_lo) / (M + 1) * i);
    mel_.assign((size_t)M * bins_, 0.0);
    mel_lo_.assign(M, 0);
    mel_hi_.assign(M, 0);
    for (int m = 0; m < M; ++m) {
        int lo = bins_, hi = 0;
        for (int k = 0; k < bins_; ++k) {
            const double f              = (double)(p.sample_rate / 2) * k / (bins_ - 1);
            const double down           = (f - fpts[m]) / (fpts[m + 1] - fpts[m]);
            const double up             = (fpts[m + 2] - f) / (fpts[m + 2] - fpts[m + 1]);
            const double v              = std::max(0.0, std::min(down, up));
            mel_[(size_t)m * bins_ + k] = v;
            if (v > 0) {
                lo = std::min(lo, k);
                hi = k + 1;
            }
        }
        mel_lo_[m] = lo < hi ? lo : 0;
        mel_hi_[m] = lo < hi ? hi : 0;
    }
    thread_floats_ =
        ((size_t)2 * (2 * N + bins_) + 16 + 15) / 16 * 16; // complex frame and magnitudes, doubles
    return "";
}

int64_t LogMel::valid_frames(int64_t n_samples) const {
    const int64_t first = p_.frame_length + 1 - p_.frame_length / 2; // where frame 0's window ends
    if (n_samples < first) return 0;
    return (n_samples - first) / p_.hop_length + 1;
}

void LogMel::compute(const cpu::Context& ctx, const float* pcm, int64_t n_samples, float* features) const {
    const int N = p_.fft_length, L = p_.frame_length, M = p_.mel_bins, hop = p_.hop_length;
    ctx.pool->parallel_for(valid_frames(n_samples), [&](int64_t f, int th) {
        double* buf = reinterpret_cast<double*>(((uintptr_t)ctx.thread_scratch(th) + 7) & ~(uintptr_t)7);
        double* mag = buf + 2 * N;
        for (int i = 0; i < N; ++i) {
            const int n     = bitrev_[i];
            const int64_t s = f * hop - L / 2 + n;
            buf[2 * i]      = (n < L && s >= 0 && s < n_samples) ? pcm[s] * window_[n] : 0.0f;
            buf[2 * i + 1]  = 0.0;
        }
        for (int len = 2; len <= N; len <<= 1) {
            const int half = len >> 1, step = N / len;
            for (int b = 0; b < N; b += len)
                for (int j = 0; j < half; ++j) {
                    const double wr = twiddle_[2 * j * step], wi = twiddle_[2 * j * step + 1];
                    double* a       = buf + 2 * (b + j);
                    double* c       = buf + 2 * (b + j + half);
                    const double tr = c[0] * wr - c[1] * wi, ti = c[0] * wi + c[1] * wr;
                    c[0] = a[0] - tr;
                    c[1] = a[1] - ti;
                    a[0] += tr;
                    a[1] += ti;
                }
        }
        for (int k = 0; k < bins_; ++k)
            mag[k] = std::hypot(buf[2 * k], buf[2 * k + 1]);
        float* out = features + f * M;
        for (int m = 0; m < M; ++m) {
            const double* w = mel_.data() + (size_t)m * bins_;
            double acc      = 0;
            for (int k = mel_lo_[m]; k < mel_hi_[m]; ++k)
                acc += mag[k] * w[k];
            out[m] = (float)std::log(acc + p_.mel_floor);
        }
    });
}

} // namespace g4::media
