// WAV (RIFF) decoding for the runtime's media input (g4_session_add_audio_file / _encoded) and the CLI: PCM
// 16/24/32-bit integer or 32-bit float, any channel count (averaged to mono), 16 kHz only (media_decode.h
// resamples others).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace g4::media {

struct AudioPcm {
    int sample_rate = 0;
    int channels    = 1; // the file's (the samples are their average)
    std::vector<float> samples;
}; // mono, [-1, 1]

// Returns "" or an error naming the file and the reason (other sample rates: how to convert with ffmpeg).
// max_frames >= 0: a longer clip is rejected before its samples are converted.
std::string load_wav(const std::string& path, AudioPcm* out, int64_t max_frames = -1);
// The same for an in-memory WAV file; `what` names it in errors ("WHAT: problem").
std::string decode_wav(const uint8_t* data, size_t size, const std::string& what, AudioPcm* out,
                       int64_t max_frames = -1);

} // namespace g4::media
