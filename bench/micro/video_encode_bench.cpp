// video_encode_bench: time to turn a video into soft tokens through the C API, as `g4 run --video` does: the
// processor's 32 sampled frames decoded (FFmpeg, runtime/src/media/video_decode.cpp) and each sent through
// the plan's vision tower (g4_session_add_video_frame) as it is decoded. Also the decode alone, and, given
// raw frames instead of a file (decoded elsewhere, e.g. where this build has no FFmpeg), the towers alone.
// Prints one JSON object a rep: {"decode_ms", "encode_ms" (decode + towers), "towers_ms", "frames",
// "vision_device"}. Threads: G4_THREADS, else all cores. The plan must queue a whole video's soft tokens
// (g4 compile --max-media-tokens 4096).
// Usage: video_encode_bench PLAN VIDEO [reps]
//        video_encode_bench PLAN --frames RAW WIDTH HEIGHT N [reps]   (RAW: N frames of RGB8, back to back)
#include "g4/g4.h"
#include "runtime/src/media/video_decode.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

int fail(const std::string& what) {
    std::fprintf(stderr, "video_encode_bench: %s\n", what.c_str());
    return 1;
}

} // namespace

int main(int argc, char** argv) {
    if (argc < 3) return fail("usage: video_encode_bench PLAN VIDEO [reps] | PLAN --frames RAW W H N [reps]");
    const bool raw = std::strcmp(argv[2], "--frames") == 0;
    if (raw && argc < 7) return fail("--frames needs RAW WIDTH HEIGHT N");
    const int reps = std::max(1, std::atoi(argv[raw ? 7 : 3] ? argv[raw ? 7 : 3] : "3"));
    g4_engine* e   = nullptr;
    if (g4_engine_open(argv[1], nullptr, &e) != G4_OK) return fail(g4_last_error_message());
    g4_media_info mi{};
    g4_engine_get_media_info(e, &mi);
    std::vector<g4::media::ImageRGB8> frames;
    if (raw) {
        const int w = std::atoi(argv[4]), h = std::atoi(argv[5]), n = std::atoi(argv[6]);
        if (w < 1 || h < 1 || n < 1 || w > 16384 || h > 16384 || n > 4096) return fail("bad --frames size");
        std::ifstream in(argv[3], std::ios::binary);
        for (int k = 0; k < n; ++k) {
            g4::media::ImageRGB8 f;
            f.width  = w;
            f.height = h;
            f.rgb.resize(size_t(w) * h * 3);
            if (!in.read(reinterpret_cast<char*>(f.rgb.data()), std::streamsize(f.rgb.size())))
                return fail(std::string(argv[3]) + ": fewer than " + std::to_string(n) + " frames");
            frames.push_back(std::move(f));
        }
    }
    g4_session_params sp = g4_session_params_default();
    for (int rep = 0; rep <= reps; ++rep) { // rep 0: warm-up, not printed
        g4_session* s = nullptr;
        if (g4_session_create(e, &sp, &s) != G4_OK) return fail(g4_last_error_message());
        int64_t soft = 0;
        auto encode  = [&](size_t, const g4::media::ImageRGB8& f) -> std::string {
            int32_t n = 0;
            if (g4_session_add_video_frame(s, f.rgb.data(), f.width, f.height, &n) != G4_OK)
                return g4_last_error_message();
            soft += n;
            return "";
        };
        double decode_ms = 0, encode_ms = 0, towers_ms = 0;
        size_t n_frames = 0;
        int64_t total   = 0;
        if (raw) {
            const double t0 = now_ms();
            for (size_t k = 0; k < frames.size(); ++k)
                if (std::string err = encode(k, frames[k]); !err.empty()) return fail(err);
            towers_ms = now_ms() - t0;
            n_frames  = frames.size();
        } else {
            g4::media::VideoFrames v;
            double t0 = now_ms();
            std::string err =
                g4::media::load_video(argv[2], g4::media::kVideoFrames, mi.max_image_pixels, &v,
                                      [](size_t, const g4::media::ImageRGB8&) { return std::string(); });
            decode_ms = now_ms() - t0;
            if (!err.empty()) return fail(err);
            t0  = now_ms();
            err = g4::media::load_video(argv[2], g4::media::kVideoFrames, mi.max_image_pixels, &v, encode);
            encode_ms = now_ms() - t0;
            if (!err.empty()) return fail(err);
            n_frames = v.indices.size();
            total    = v.total_frames;
        }
        g4_session_destroy(s);
        if (rep == 0) continue;
        std::printf("{\"rep\": %d, \"frames\": %zu, \"soft_tokens\": %lld, \"total_frames\": %lld, "
                    "\"frame_tokens\": %d, \"decode_ms\": %.1f, "
                    "\"encode_ms\": %.1f, \"towers_ms\": %.1f, \"vision_device\": %d}\n",
                    rep, n_frames, (long long)soft, (long long)total, mi.max_video_frame_tokens, decode_ms,
                    encode_ms, towers_ms, mi.vision_device);
        std::fflush(stdout);
    }
    g4_engine_close(e);
    return 0;
}
