// WAV (RIFF) loading for the g4 CLI: PCM 16/24/32-bit integer or 32-bit float, any channel count (averaged
// to mono), 16 kHz only. Not part of the runtime library: embedders hand the runtime float samples.
#pragma once
#include <string>
#include <vector>

namespace g4::tools {

struct AudioPcm { int sample_rate = 0; std::vector<float> samples; };   // mono, [-1, 1]

// Returns "" or an error naming the file and the reason (other sample rates: how to convert with ffmpeg).
std::string load_wav(const std::string& path, AudioPcm* out);

} // namespace g4::tools
