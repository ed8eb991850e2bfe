// Fuzz target: audio and video files through FFmpeg (runtime/src/media/media_decode.h, video_decode.h):
// container probing, decoding, resampling to 16 kHz mono, frame sampling and conversion to RGB, with the
// plan-style limits that bound what any file may cost. In a build without FFmpeg both calls refuse every
// input.
#include "fuzz_util.h"
#include "runtime/src/media/media_decode.h"
#include "runtime/src/media/video_decode.h"

#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path    = g4fuzz::write_scratch("media", data, size);
    const int64_t max_samples = 16000 * 5;
    g4::media::AudioPcm pcm;
    std::string err = g4::media::load_audio(path, 16000, max_samples, &pcm);
    if (err.empty() && (pcm.samples.empty() || (int64_t)pcm.samples.size() > max_samples)) std::abort();
    const int64_t max_pixels = int64_t(1) << 18;
    g4::media::VideoFrames v;
    err = g4::media::load_video(
        path, 4, max_pixels, &v, [&](size_t, const g4::media::ImageRGB8& f) -> std::string {
            if (f.width <= 0 || f.height <= 0 || (int64_t)f.width * f.height > max_pixels ||
                f.rgb.size() != (size_t)f.width * f.height * 3)
                std::abort(); // a frame must be within the bound and have the size it claims
            return "";
        });
    if (err.empty() && (v.indices.size() > 4 || v.times.size() != v.indices.size())) std::abort();
    return 0;
}
