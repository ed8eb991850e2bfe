// Fuzz target: WAV decoding (runtime/src/media/audio_io.h: RIFF chunks, PCM 16/24/32-bit and float, channel
// averaging).
#include "fuzz_util.h"
#include "runtime/src/media/audio_io.h"

#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = g4fuzz::write_scratch("clip.wav", data, size);
    g4::media::AudioPcm pcm;
    std::string err = g4::media::load_wav(path, &pcm);
    if (err.empty() && (pcm.sample_rate != 16000 || pcm.samples.empty())) std::abort();
    return 0;
}
