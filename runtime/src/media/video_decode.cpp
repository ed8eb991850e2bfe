// Video frame sampling and decoding through FFmpeg's libraries (see video_decode.h).
#include "runtime/src/media/video_decode.h"

#include "runtime/src/media/media_decode.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#if G4_HAVE_FFMPEG
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libswscale/swscale.h>
}
#endif

namespace g4::media {

std::vector<int64_t> video_sample_indices(int64_t total, int num_frames) {
    std::vector<int64_t> idx;
    if (total <= 0 || num_frames <= 0) return idx;
    const int64_t n   = std::min<int64_t>(num_frames, total);
    const double step = double(total) / double(n);
    // torch.arange(0, total, step): ceil(total / step) float32 values start + i * step, then .int()
    const int64_t count = (int64_t)std::ceil(double(total) / step);
    for (int64_t i = 0; i < count; ++i)
        idx.push_back((int64_t)(float)(double(i) * step));
    return idx;
}

std::string video_timestamp(int64_t index, double fps) {
    const double s = fps > 0 ? double(index) / fps : 0.0;
    char b[32];
    std::snprintf(b, sizeof b, "%02d:%02d", int(std::floor(s / 60)), int(std::fmod(s, 60.0)));
    return b;
}

#if G4_HAVE_FFMPEG
namespace {

std::string av_text(int err) {
    return av_error_text(err);
}

struct Video {
    AVFormatContext* fmt = nullptr;
    AVCodecContext* dec  = nullptr;
    SwsContext* sws      = nullptr;
    AVPacket* pkt        = nullptr;
    AVFrame* frame       = nullptr;
    ~Video() {
        sws_freeContext(sws);
        av_frame_free(&frame);
        av_packet_free(&pkt);
        avcodec_free_context(&dec);
        avformat_close_input(&fmt);
    }
};

// Opens `path` and finds its video stream: "" or what is wrong.
std::string open_video(const std::string& path, const std::string& where, Video* v, int* si,
                       const AVCodec** codec) {
    int r = open_media_input(&v->fmt, path);
    if (r < 0) return open_media_error(where, r);
    if ((r = avformat_find_stream_info(v->fmt, nullptr)) < 0)
        return where + "corrupt or truncated (" + av_text(r) + ")";
    *si = av_find_best_stream(v->fmt, AVMEDIA_TYPE_VIDEO, -1, -1, codec, 0);
    if (*si == AVERROR_STREAM_NOT_FOUND) return where + "has no video stream";
    if (*si < 0 || !*codec)
        return where + "its video codec is not supported by this FFmpeg (" + av_text(*si < 0 ? *si : 0) + ")";
    v->pkt   = av_packet_alloc();
    v->frame = av_frame_alloc();
    if (!v->pkt || !v->frame) return where + "out of memory";
    return "";
}

} // namespace

std::string load_video(const std::string& path, const VideoLimits& limits, VideoFrames* out,
                       const VideoFrameFn& on_frame) {
    *out                    = VideoFrames{};
    const std::string where = "video file " + path + ": ";
    if (std::string e = media_file_problem(path, where, limits.max_file_bytes, "--max-video-bytes");
        !e.empty())
        return e;
    const int64_t max_pixels = limits.max_pixels < 1 ? kMaxImagePixels : limits.max_pixels;
    const int num_frames     = limits.num_frames;
    if (num_frames < 1 || num_frames > kMaxVideoFrames)
        return where + std::to_string(num_frames) + " frames asked for, outside 1.." +
               std::to_string(kMaxVideoFrames);
    char secs[64];
    std::snprintf(secs, sizeof secs, "%g", limits.max_seconds);
    const std::string too_long = " (--max-video-seconds " + std::string(secs) + ")";
    av_log_set_level(AV_LOG_QUIET);
    // Pass 1: every packet of the stream counted, and the span of their presentation times.
    int64_t total = 0, first = std::numeric_limits<int64_t>::max(), end = std::numeric_limits<int64_t>::min();
    AVRational tb{0, 1};
    AVRational avg{0, 1};
    {
        Video v;
        int si               = -1;
        const AVCodec* codec = nullptr;
        if (std::string e = open_video(path, where, &v, &si, &codec); !e.empty()) return e;
        tb                          = v.fmt->streams[si]->time_base;
        avg                         = v.fmt->streams[si]->avg_frame_rate;
        const AVCodecParameters* cp = v.fmt->streams[si]->codecpar;
        if (cp->width <= 0 || cp->height <= 0 || int64_t(cp->width) > max_pixels / cp->height)
            return where + "frames of " + std::to_string(cp->width) + "x" + std::to_string(cp->height) +
                   " pixels, outside 1.." + std::to_string(max_pixels) + " (--max-video-pixels)";
        // The declared duration (the stream's, else the container's) and frame count, before reading.
        const AVStream* st = v.fmt->streams[si];
        double declared    = st->duration > 0 && tb.den > 0 ? double(st->duration) * av_q2d(tb) : 0.0;
        if (!(declared > 0) && v.fmt->duration > 0) declared = double(v.fmt->duration) / AV_TIME_BASE;
        if (declared > limits.max_seconds) {
            std::snprintf(secs, sizeof secs, "%.6g", declared);
            return where + "declares " + secs + " s, longer than the limit" + too_long;
        }
        if (st->nb_frames > limits.max_stream_frames)
            return where + "declares " + std::to_string(st->nb_frames) + " frames, more than the limit " +
                   std::to_string(limits.max_stream_frames) + " (--max-video-stream-frames)";
        int r;
        while ((r = av_read_frame(v.fmt, v.pkt)) >= 0) {
            if (v.pkt->stream_index == si) {
                ++total;
                const int64_t pts = v.pkt->pts != AV_NOPTS_VALUE ? v.pkt->pts : v.pkt->dts;
                if (pts != AV_NOPTS_VALUE) {
                    first = std::min(first, pts);
                    end   = std::max(end, pts + std::max<int64_t>(v.pkt->duration, 0));
                }
                if (total > limits.max_stream_frames)
                    return where + "has more than " + std::to_string(limits.max_stream_frames) +
                           " frames (--max-video-stream-frames)";
                if (end > first && tb.den > 0 && double(end - first) * av_q2d(tb) > limits.max_seconds)
                    return where + "runs longer than the limit" + too_long;
            }
            av_packet_unref(v.pkt);
        }
        if (r != AVERROR_EOF) return where + "corrupt or truncated (" + av_text(r) + ")";
    }
    if (total == 0) return where + "its video stream holds no frames";
    double fps = 0;
    if (end > first && tb.den > 0) fps = double(total) / (double(end - first) * av_q2d(tb));
    if (!(fps > 0) || !std::isfinite(fps)) fps = avg.num > 0 && avg.den > 0 ? av_q2d(avg) : 24.0;
    out->total_frames = total;
    out->fps          = fps;
    out->indices      = video_sample_indices(total, num_frames);
    // Pass 2: decode in order, keeping the sampled frames as RGB8.
    Video v;
    int si               = -1;
    const AVCodec* codec = nullptr;
    if (std::string e = open_video(path, where, &v, &si, &codec); !e.empty()) return e;
    if (!(v.dec = avcodec_alloc_context3(codec))) return where + "out of memory";
    v.dec->thread_count = 0; // one decoding thread a core (FFmpeg's choice; the frames are the same)
    int r;
    if ((r = avcodec_parameters_to_context(v.dec, v.fmt->streams[si]->codecpar)) < 0 ||
        (r = avcodec_open2(v.dec, codec, nullptr)) < 0)
        return where + "cannot open its " + codec->name + " decoder (" + av_text(r) + ")";
    int64_t k   = 0;
    size_t next = 0;
    std::string err;
    auto keep = [&](const AVFrame* f) -> bool {
        if (f->width <= 0 || f->height <= 0 || int64_t(f->width) > max_pixels / f->height) {
            err = where + "a frame of " + std::to_string(f->width) + "x" + std::to_string(f->height) +
                  " pixels, outside 1.." + std::to_string(max_pixels);
            return false;
        }
        v.sws = sws_getCachedContext(v.sws, f->width, f->height, AVPixelFormat(f->format), f->width,
                                     f->height, AV_PIX_FMT_RGB24, SWS_BICUBIC, nullptr, nullptr, nullptr);
        if (!v.sws) {
            err = where + "cannot convert its frames to RGB";
            return false;
        }
        const int cs = f->colorspace == AVCOL_SPC_UNSPECIFIED ? SWS_CS_DEFAULT : int(f->colorspace);
        sws_setColorspaceDetails(v.sws, sws_getCoefficients(cs), f->color_range == AVCOL_RANGE_JPEG,
                                 sws_getCoefficients(SWS_CS_DEFAULT), 1, 0, 1 << 16, 1 << 16);
        ImageRGB8 img;
        img.width  = f->width;
        img.height = f->height;
        img.rgb.resize(size_t(f->width) * f->height * 3);
        uint8_t* dst[1]     = {img.rgb.data()};
        const int stride[1] = {3 * f->width};
        sws_scale(v.sws, f->data, f->linesize, 0, f->height, dst, stride);
        out->times.push_back(video_timestamp(k, fps));
        if (on_frame) {
            if (std::string e = on_frame(out->times.size() - 1, img); !e.empty()) {
                err = e;
                return false;
            }
        } else {
            out->frames.push_back(std::move(img));
        }
        return true;
    };
    auto drain = [&]() {
        while (err.empty() && avcodec_receive_frame(v.dec, v.frame) >= 0) {
            while (next < out->indices.size() && out->indices[next] < k)
                ++next;
            if (next < out->indices.size() && out->indices[next] == k) keep(v.frame);
            ++k;
            av_frame_unref(v.frame);
        }
    };
    while (err.empty() && (r = av_read_frame(v.fmt, v.pkt)) >= 0) {
        if (v.pkt->stream_index == si) {
            const int sr = avcodec_send_packet(v.dec, v.pkt);
            if (sr < 0 && sr != AVERROR(EAGAIN)) err = where + "corrupt video data (" + av_text(sr) + ")";
            drain();
        }
        av_packet_unref(v.pkt);
    }
    if (err.empty()) {
        avcodec_send_packet(v.dec, nullptr);
        drain();
    }
    if (!err.empty()) {
        *out = VideoFrames{};
        return err;
    }
    if (out->times.size() != out->indices.size()) {
        const size_t got = out->times.size();
        *out             = VideoFrames{};
        return where + "decodes to " + std::to_string(k) + " frames, fewer than the " +
               std::to_string(total) + " its packets declare (corrupt or truncated; " + std::to_string(got) +
               " of the sampled kept)";
    }
    return "";
}
#else
std::string load_video(const std::string& path, const VideoLimits&, VideoFrames* out, const VideoFrameFn&) {
    *out = VideoFrames{};
    return "video file " + path +
           ": this g4 was built without FFmpeg's libraries, so it cannot read video (install libavformat-dev "
           "libavcodec-dev libswscale-dev libavutil-dev and rebuild)";
}
#endif

std::string load_video(const std::string& path, int num_frames, int64_t max_pixels, VideoFrames* out,
                       const VideoFrameFn& on_frame) {
    VideoLimits limits;
    limits.num_frames = num_frames;
    limits.max_pixels = max_pixels;
    return load_video(path, limits, out, on_frame);
}

} // namespace g4::media
