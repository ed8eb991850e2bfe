// Video files for the g4 CLI (runtime/src/media, beside the audio and image decoders): the frames
// transformers 5.17's video processor samples, decoded through FFmpeg's libraries
// (libavformat/libavcodec; libswscale to RGB, bicubic chroma upsampling, as OpenCV's FFmpeg backend
// converts), with the timestamps its prompt writes.
#pragma once

#include "runtime/src/media/image_io.h"
#include "runtime/src/media/media_decode.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace g4::media {

// The processor's default number of frames (the video processor's num_frames).
constexpr int kVideoFrames = 32;
// Frames a video may give at most (g4 run --video-frames), and the default limits on a stream: its
// duration (declared, and as its packets are read) and its frame count (every frame up to the last
// sampled one is decoded), an hour at 60 frames a second.
constexpr int kMaxVideoFrames           = 1024;
constexpr double kMaxVideoSeconds       = 3600;
constexpr int64_t kMaxVideoStreamFrames = 216000;

// What load_video accepts. A plan records its own (g4 compile --video-frames, --max-video-seconds,
// --max-video-stream-frames, --max-video-pixels, --max-video-bytes; g4_media_info), which g4 run / g4 chat
// take as defaults and the same flags override at run time.
struct VideoLimits {
    int num_frames            = kVideoFrames;          // frames sampled, 1..kMaxVideoFrames
    int64_t max_pixels        = kMaxImagePixels;       // a frame's width x height
    double max_seconds        = kMaxVideoSeconds;      // the stream's duration
    int64_t max_stream_frames = kMaxVideoStreamFrames; // frames in the stream
    int64_t max_file_bytes    = kMaxMediaFileBytes;    // the file's size
};

struct VideoFrames {
    int64_t total_frames = 0;       // frames in the stream (every packet counted, as torchcodec's exact mode)
    double fps           = 0;       // total_frames / the stream's span, as torchcodec's average_fps
    std::vector<int64_t> indices;   // the sampled frames' indices
    std::vector<ImageRGB8> frames;  // the sampled frames, RGB8 (none when load_video is given on_frame)
    std::vector<std::string> times; // "mm:ss" of each, as the processor writes them
};

// The indices the processor samples: torch.arange(0, total, total / n).int() with n = min(num_frames,
// total) (transformers refuses n > total; g4 then takes every frame, what num_frames=total gives there).
std::vector<int64_t> video_sample_indices(int64_t total, int num_frames);
// "mm:ss" of index / fps, as the processor's replace_video_token formats it.
std::string video_timestamp(int64_t index, double fps);

// Called with each sampled frame (k-th of out->indices) as it is decoded: "" to go on, or an error that
// load_video returns. With it, frames are not kept: one frame's pixels are held at a time.
using VideoFrameFn = std::function<std::string(size_t k, const ImageRGB8& frame)>;

// Decodes the sampled frames of `path`'s first video stream. Anything outside `limits`, files over
// kMaxMediaFileBytes, no video stream or an empty one, a codec this FFmpeg lacks, corrupt or truncated data:
// "" or one line naming the file and the problem.
std::string load_video(const std::string& path, const VideoLimits& limits, VideoFrames* out,
                       const VideoFrameFn& on_frame = nullptr);
// The same with the default limits but num_frames and max_pixels (< 1: kMaxImagePixels).
std::string load_video(const std::string& path, int num_frames, int64_t max_pixels, VideoFrames* out,
                       const VideoFrameFn& on_frame = nullptr);

} // namespace g4::media
