// Audio file decoding through g4's WAV reader or FFmpeg's libraries (see media_decode.h).
#include "runtime/src/media/media_decode.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#if G4_HAVE_FFMPEG
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/channel_layout.h>
#include <libavutil/opt.h>
#include <libswresample/swresample.h>
}
#endif

namespace g4::media {

namespace {

std::string seconds_text(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2f s", s);
    return b;
}

std::string too_long(const std::string& path, double secs, int64_t max_samples, int rate) {
    return "audio file " + path + ": " + seconds_text(secs) + " of audio but the plan takes at most " +
           seconds_text(double(max_samples) / rate) + " (g4 compile --max-audio-seconds)";
}

#if G4_HAVE_FFMPEG
std::string av_text(int err) {
    return av_error_text(err);
}

// Everything FFmpeg allocates for one decode, freed on every path.
struct Decoder {
    AVFormatContext* fmt = nullptr;
    AVCodecContext* dec  = nullptr;
    SwrContext* swr      = nullptr;
    AVPacket* pkt        = nullptr;
    AVFrame* frame       = nullptr;
    ~Decoder() {
        swr_free(&swr);
        av_frame_free(&frame);
        av_packet_free(&pkt);
        avcodec_free_context(&dec);
        avformat_close_input(&fmt);
    }
};
#endif

} // namespace

bool have_ffmpeg() {
    return G4_HAVE_FFMPEG != 0;
}

std::string media_file_problem(const std::string& path, const std::string& where, int64_t max_bytes,
                               const std::string& flag) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return where + "cannot be read (" + std::strerror(errno) + ")";
    if (!S_ISREG(st.st_mode)) return where + "not a regular file";
    if (st.st_size == 0) return where + "is empty (0 bytes)";
    if (st.st_size > max_bytes)
        return where + std::to_string(st.st_size) + " bytes, more than the limit of " +
               std::to_string(max_bytes) + (flag.empty() ? "" : " (" + flag + ")");
    return "";
}

#if G4_HAVE_FFMPEG
std::string av_error_text(int err) {
    char b[AV_ERROR_MAX_STRING_SIZE] = {0};
    av_strerror(err, b, sizeof b);
    return b;
}

int open_media_input(AVFormatContext** fmt, const std::string& path) {
    // No single FFmpeg allocation above kMaxFfmpegAlloc: a demuxer sizes tables from the header's counts, and
    // a 7.6 KB MP4 whose sample table declares 1.4 GB would otherwise get it (FFmpeg then fails with ENOMEM).
    // Real media need less in one block: an 8K frame's luma plane is 33 MB, a 60 fps video's sample sizes
    // reach 64 MiB after 74 hours.
    static std::once_flag cap;
    std::call_once(cap, [] { av_max_alloc(kMaxFfmpegAlloc); });
    // Demuxer names as FFmpeg gives them (a name list such as "mov,mp4,m4a,..." matches any of its names).
    static const char* kDemuxers =
        "mov,matroska,webm,avi,wav,w64,mp3,flac,ogg,aac,asf,flv,mpegts,mpeg,aiff,caf,amr,"
        "ac3,eac3,dts,truehd,wv,ape,tta,au,voc,rm,ivf,h264,hevc,m4v,mpegvideo,obu";
    *fmt = avformat_alloc_context();
    if (!*fmt) return AVERROR(ENOMEM);
    (*fmt)->format_whitelist   = av_strdup(kDemuxers);
    (*fmt)->protocol_whitelist = av_strdup("file");
    if (!(*fmt)->format_whitelist || !(*fmt)->protocol_whitelist) {
        avformat_free_context(*fmt);
        *fmt = nullptr;
        return AVERROR(ENOMEM);
    }
    return avformat_open_input(fmt, path.c_str(), nullptr, nullptr); // frees *fmt on failure
}

std::string open_media_error(const std::string& where, int r) {
    if (r == AVERROR(ENOMEM))
        return where + "its header asks for more than " + std::to_string(kMaxFfmpegAlloc >> 20) +
               " MiB at once (a corrupt file, or not a real media file)";
    return where + "not a media file FFmpeg recognises (" + av_error_text(r) + ")";
}

std::string decode_audio_ffmpeg(const std::string& path, int rate, int64_t max_samples, AudioPcm* out) {
    *out                    = AudioPcm{};
    const std::string where = "audio file " + path + ": ";
    if (std::string e = media_file_problem(path, where); !e.empty()) return e;
    av_log_set_level(AV_LOG_QUIET);
    Decoder d;
    int r = open_media_input(&d.fmt, path);
    if (r < 0) return open_media_error(where, r);
    if ((r = avformat_find_stream_info(d.fmt, nullptr)) < 0)
        return where + "corrupt or truncated (" + av_text(r) + ")";
    const AVCodec* codec = nullptr;
    const int si         = av_find_best_stream(d.fmt, AVMEDIA_TYPE_AUDIO, -1, -1, &codec, 0);
    if (si == AVERROR_STREAM_NOT_FOUND) return where + "has no audio stream";
    if (si < 0 || !codec)
        return where + "its audio codec is not supported by this FFmpeg (" + av_text(si < 0 ? si : 0) + ")";
    AVStream* s = d.fmt->streams[si];
    // The declared duration, where there is one, is checked before anything is decoded.
    double declared = -1;
    if (s->duration > 0 && s->time_base.den > 0)
        declared = double(s->duration) * av_q2d(s->time_base);
    else if (d.fmt->duration > 0)
        declared = double(d.fmt->duration) / AV_TIME_BASE;
    if (max_samples >= 0 && declared > double(max_samples) / rate + 1.0)
        return too_long(path, declared, max_samples, rate);
    if (!(d.dec = avcodec_alloc_context3(codec))) return where + "out of memory";
    if ((r = avcodec_parameters_to_context(d.dec, s->codecpar)) < 0 ||
        (r = avcodec_open2(d.dec, codec, nullptr)) < 0)
        return where + "cannot open its " + codec->name + " decoder (" + av_text(r) + ")";
    if (d.dec->sample_rate <= 0 || d.dec->sample_rate > 1000000 || d.dec->ch_layout.nb_channels <= 0 ||
        d.dec->ch_layout.nb_channels > 64)
        return where + "declares " + std::to_string(d.dec->ch_layout.nb_channels) + " channels at " +
               std::to_string(d.dec->sample_rate) + " Hz (corrupt file)";
    d.pkt   = av_packet_alloc();
    d.frame = av_frame_alloc();
    if (!d.pkt || !d.frame) return where + "out of memory";
    std::vector<float>& o = out->samples;
    const int64_t limit   = max_samples >= 0 ? max_samples : int64_t(rate) * 3600 * 4;
    std::string err;
    // Converts one decoded frame (nullptr: flushes the resampler) into o.
    int in_channels = 0, in_format = -1, in_rate = 0; // what the resampler was set up for
    auto convert = [&](const AVFrame* f) -> bool {
        if (f && d.swr &&
            (f->ch_layout.nb_channels != in_channels || f->format != in_format ||
             f->sample_rate != in_rate)) {
            err =
                where + "changes its channels, sample format or rate mid-stream (corrupt, or not supported)";
            return false;
        }
        if (f && (!f->extended_data || f->nb_samples < 0)) {
            err = where + "is corrupt (a decoded frame has no samples)";
            return false;
        }
        if (!d.swr) {
            in_channels = f->ch_layout.nb_channels;
            in_format   = f->format;
            in_rate     = f->sample_rate;
            AVChannelLayout in{}, mono = AV_CHANNEL_LAYOUT_MONO;
            if (f->ch_layout.order == AV_CHANNEL_ORDER_UNSPEC)
                av_channel_layout_default(&in, f->ch_layout.nb_channels);
            else
                av_channel_layout_copy(&in, &f->ch_layout);
            r = swr_alloc_set_opts2(&d.swr, &mono, AV_SAMPLE_FMT_FLT, rate, &in, AVSampleFormat(f->format),
                                    f->sample_rate, 0, nullptr);
            av_channel_layout_uninit(&in);
            // The mean of the channels, as the reference's loaders downmix (numpy / torch mean over the
            // channel axis); libswresample's own matrix would weight a stereo pair by 1/sqrt(2) each.
            if (r >= 0) {
                const std::vector<double> mean(size_t(in_channels), 1.0 / in_channels);
                r = swr_set_matrix(d.swr, mean.data(), in_channels);
            }
            if (r < 0 || (r = swr_init(d.swr)) < 0) {
                err = where + "cannot convert its samples (" + av_text(r) + ")";
                return false;
            }
        }
        const int in_n = f ? f->nb_samples : 0;
        const int cap  = swr_get_out_samples(d.swr, in_n);
        if (cap < 0) return true;
        if (int64_t(o.size()) + cap > limit + 2 * int64_t(rate)) {
            err = too_long(path, double(o.size() + cap) / rate, max_samples < 0 ? limit : max_samples, rate);
            return false;
        }
        const size_t at = o.size();
        o.resize(at + size_t(cap));
        uint8_t* dst = reinterpret_cast<uint8_t*>(o.data() + at);
        const int n =
            swr_convert(d.swr, &dst, cap, f ? const_cast<const uint8_t**>(f->extended_data) : nullptr, in_n);
        if (n < 0) {
            err = where + "cannot convert its samples (" + av_text(n) + ")";
            return false;
        }
        o.resize(at + size_t(n));
        return true;
    };
    auto drain = [&]() -> int {
        for (;;) {
            int rr = avcodec_receive_frame(d.dec, d.frame);
            if (rr == AVERROR(EAGAIN) || rr == AVERROR_EOF) return rr;
            if (rr < 0) {
                err = where + "corrupt audio data (" + av_text(rr) + ")";
                return rr;
            }
            const bool ok = convert(d.frame);
            av_frame_unref(d.frame);
            if (!ok) return -1;
        }
    };
    while ((r = av_read_frame(d.fmt, d.pkt)) >= 0) {
        if (d.pkt->stream_index == si) {
            int sr = avcodec_send_packet(d.dec, d.pkt);
            if (sr < 0 && sr != AVERROR(EAGAIN)) {
                av_packet_unref(d.pkt);
                return where + "corrupt audio data (" + av_text(sr) + ")";
            }
            sr = drain();
            if (!err.empty()) {
                av_packet_unref(d.pkt);
                return err;
            }
        }
        av_packet_unref(d.pkt);
    }
    if (r != AVERROR_EOF) return where + "corrupt or truncated (" + av_text(r) + ")";
    avcodec_send_packet(d.dec, nullptr);
    drain();
    if (!err.empty()) return err;
    if (d.swr && !convert(nullptr)) return err;
    if (o.empty()) return where + "its audio stream holds no samples";
    if (max_samples >= 0 && int64_t(o.size()) > max_samples) {
        const double secs = double(o.size()) / rate;
        *out              = AudioPcm{};
        return too_long(path, secs, max_samples, rate);
    }
    for (float v : o)
        if (!std::isfinite(v)) {
            *out = AudioPcm{};
            return where + "decodes to samples that are not finite numbers (corrupt file)";
        }
    out->sample_rate = rate;
    return "";
}
#else
std::string decode_audio_ffmpeg(const std::string& path, int rate, int64_t, AudioPcm* out) {
    *out = AudioPcm{};
    return "audio file " + path +
           ": this g4 was built without FFmpeg's libraries, so it reads only PCM WAV at " +
           std::to_string(rate) +
           " Hz (install libavformat-dev libavcodec-dev libswresample-dev libavutil-dev and rebuild, or "
           "convert it: ffmpeg -i " +
           path + " -ar " + std::to_string(rate) + " -ac 1 out.wav)";
}
#endif

std::string load_audio(const std::string& path, int rate, int64_t max_samples, AudioPcm* out) {
    std::string err = load_wav(path, out, max_samples);
    if (err.empty() && out->sample_rate == rate && (out->channels == 1 || !have_ffmpeg())) return "";
    // FFmpeg gets what g4's reader does not handle: other files, other encodings, sizes and rates, and
    // good WAVs to downmix. A file that cannot be read, a WAV too long for the plan or a corrupt WAV is
    // refused with the reader's line.
    const bool ffmpeg_may = err.empty() || err.find("not a WAV file") != std::string::npos ||
                            err.find("unsupported WAV encoding") != std::string::npos ||
                            err.find("unsupported sample size") != std::string::npos ||
                            err.find("sample rate is") != std::string::npos;
    struct stat st {};
    if (!ffmpeg_may || ::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return err;
    return decode_audio_ffmpeg(path, rate, max_samples, out);
}

} // namespace g4::media
