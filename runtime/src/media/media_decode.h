// Audio (and, through FFmpeg, any container's sound track) for the runtime and the CLI: 16 kHz mono float
// samples as transformers' load_audio gives them. PCM WAV at the target rate and mono is read by g4's own
// reader (runtime/src/media/audio_io.h); everything else goes through FFmpeg's libraries when the build has
// them (G4_WITH_FFMPEG): libavformat/libavcodec decode, libswresample averages the channels (the mean, as
// transformers' librosa and torchaudio loaders downmix) and resamples with its default filter (the one
// torchcodec's AudioDecoder uses); docs/towers.md gives its measured difference from torchaudio's resampler.
#pragma once

#include "runtime/src/media/audio_io.h"

#include <cstddef>
#include <cstdint>
#include <string>

struct AVFormatContext;

namespace g4::media {

// Files larger than this are refused before they are opened (a clip of 30 s is far smaller in any codec).
constexpr int64_t kMaxMediaFileBytes = int64_t(2) << 30;

// True when this build decodes through FFmpeg.
bool have_ffmpeg();

// Decodes `path` to mono float at `rate` Hz. max_samples >= 0: a longer clip is refused (its declared
// duration before decoding where the container gives one, else as soon as decoding passes it). Returns "" or
// one line naming the file and the problem.
std::string load_audio(const std::string& path, int rate, int64_t max_samples, AudioPcm* out);

// What stops `path` (named by `where`, e.g. "audio file X: ") from being opened as media: missing, not a
// regular file, empty or over max_bytes (its error then ends with `flag`, the option that sets the limit);
// "" when it may be opened.
std::string media_file_problem(const std::string& path, const std::string& where,
                               int64_t max_bytes = kMaxMediaFileBytes, const std::string& flag = "");

// FFmpeg's text for one of its error codes (FFmpeg builds only).
std::string av_error_text(int err);

// avformat_open_input of a local media file, fail-closed: the "file" protocol only, and only the demuxers of
// plain audio and video containers (no playlists, concat lists or image sequences, which open the further
// files or URLs their text names). FFmpeg builds only; returns FFmpeg's status (*fmt null on failure). Its
// first call caps every single FFmpeg allocation of the process at kMaxFfmpegAlloc (av_max_alloc).
inline constexpr size_t kMaxFfmpegAlloc = size_t(64) << 20;
int open_media_input(AVFormatContext** fmt, const std::string& path);
// The one-line error for open_media_input's failure r (where: "audio file X: " and the like).
std::string open_media_error(const std::string& where, int r);

// FFmpeg's decode of any audio file or sound track (load_audio's path for non-WAV files).
std::string decode_audio_ffmpeg(const std::string& path, int rate, int64_t max_samples, AudioPcm* out);

} // namespace g4::media
