// The C API's images and audio from files and encoded bytes (g4_session_add_image_file, _image_encoded,
// _audio_file, _audio_encoded): decoded by runtime/src/media (the decoders the CLI uses) within the plan's
// limits, then fed through g4_session_add_image / g4_session_add_audio.
#include "g4/g4.h"
#include "runtime/src/api_util.h"
#include "runtime/src/engine.h"
#include "runtime/src/media/audio_io.h"
#include "runtime/src/media/image_io.h"
#include "runtime/src/media/media_decode.h"
#include "runtime/src/media/read_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <string>
#include <vector>

namespace {

using g4::rt::api_error;

// The session's media limits; G4_ERR_INVALID_ARGUMENT for a bad handle or NULL input.
g4_status media_limits(g4_session* s, const char* fn, const void* input, g4_media_info* info) {
    if (!g4::rt::api_session_ok(s))
        return api_error(G4_ERR_INVALID_ARGUMENT, std::string(fn) + ": invalid or destroyed session");
    if (!input) return api_error(G4_ERR_INVALID_ARGUMENT, std::string(fn) + ": NULL input");
    return g4_engine_get_media_info(s->engine, info);
}

// A file that cannot be opened (missing, a directory, unreadable): "" or one line naming it.
std::string unreadable(const char* path, const char* what) {
    const std::string where = std::string("cannot read ") + what + " '" + path + "': ";
    struct stat st {};
    if (::stat(path, &st) != 0)
        return std::string("cannot open ") + what + " '" + path + "': " + std::strerror(errno);
    if (S_ISDIR(st.st_mode)) return where + "it is a directory, not a file";
    if (!S_ISREG(st.st_mode)) return where + "not a regular file";
    if (::access(path, R_OK) != 0) return where + std::strerror(errno);
    return "";
}

// Feeds decoded pixels / samples; a failure's message is prefixed with the input's name.
g4_status add_image(g4_session* s, const g4::media::ImageRGB8& img, const std::string& what, int32_t* n) {
    const g4_status st = g4_session_add_image(s, img.rgb.data(), img.width, img.height, n);
    if (st != G4_OK) return api_error(st, what + ": " + g4_last_error_message());
    return G4_OK;
}

g4_status add_audio(g4_session* s, const g4::media::AudioPcm& pcm, const std::string& what, int32_t* n) {
    const g4_status st = g4_session_add_audio(s, pcm.samples.data(), (int64_t)pcm.samples.size(), n);
    if (st != G4_OK) return api_error(st, what + ": " + g4_last_error_message());
    return G4_OK;
}

// A plan without the tower: g4_session_add_image / _audio's own refusal, before anything is decoded.
g4_status no_tower(g4_session* s, bool vision, const std::string& what, int32_t* n) {
    const g4_status st =
        vision ? g4_session_add_image(s, nullptr, 0, 0, n) : g4_session_add_audio(s, nullptr, 0, n);
    return api_error(st, what + ": " + g4_last_error_message());
}

template <class F> g4_status guarded(F&& f) {
    try {
        return f();
    } catch (const std::bad_alloc&) {
        return api_error(G4_ERR_OUT_OF_MEMORY, "out of memory");
    } catch (const std::exception& ex) {
        return api_error(G4_ERR_INTERNAL, std::string("internal error: ") + ex.what());
    } catch (...) {
        return api_error(G4_ERR_INTERNAL, "internal error");
    }
}

} // namespace

extern "C" {

g4_status g4_session_add_image_file(g4_session* s, const char* path, int32_t* out_n_tokens) {
    return guarded([&] {
        g4_media_info info{};
        if (g4_status st = media_limits(s, "g4_session_add_image_file", path, &info); st != G4_OK) return st;
        const std::string what = std::string("image '") + path + "'";
        if (!info.has_vision) return no_tower(s, true, what, out_n_tokens);
        std::vector<uint8_t> bytes;
        if (std::string err = g4::media::read_file_bytes(path, "image", uint64_t(INT32_MAX), &bytes);
            !err.empty())
            return api_error(G4_ERR_IO, err);
        g4::media::ImageRGB8 img;
        std::string err = g4::media::decode_image(bytes.data(), bytes.size(), "'" + std::string(path) + "'",
                                                  &img, info.max_image_pixels);
        if (!err.empty()) return api_error(G4_ERR_INVALID_ARGUMENT, err);
        return add_image(s, img, what, out_n_tokens);
    });
}

g4_status g4_session_add_image_encoded(g4_session* s, const void* bytes, size_t len, int32_t* out_n_tokens) {
    return guarded([&] {
        g4_media_info info{};
        if (g4_status st = media_limits(s, "g4_session_add_image_encoded", bytes, &info); st != G4_OK)
            return st;
        const std::string name = "(" + std::to_string(len) + " bytes given to g4_session_add_image_encoded)";
        if (!info.has_vision) return no_tower(s, true, "image " + name, out_n_tokens);
        g4::media::ImageRGB8 img;
        std::string err =
            g4::media::decode_image((const uint8_t*)bytes, len, name, &img, info.max_image_pixels);
        if (!err.empty()) return api_error(G4_ERR_INVALID_ARGUMENT, err);
        return add_image(s, img, "image " + name, out_n_tokens);
    });
}

g4_status g4_session_add_audio_file(g4_session* s, const char* path, int32_t* out_n_tokens) {
    return guarded([&] {
        g4_media_info info{};
        if (g4_status st = media_limits(s, "g4_session_add_audio_file", path, &info); st != G4_OK) return st;
        const std::string what = std::string("audio file ") + path;
        if (!info.has_audio) return no_tower(s, false, what, out_n_tokens);
        if (std::string err = unreadable(path, "audio file"); !err.empty()) return api_error(G4_ERR_IO, err);
        g4::media::AudioPcm pcm;
        std::string err = g4::media::load_audio(path, info.audio_sample_rate, info.max_audio_samples, &pcm);
        if (!err.empty()) return api_error(G4_ERR_INVALID_ARGUMENT, err);
        return add_audio(s, pcm, what, out_n_tokens);
    });
}

g4_status g4_session_add_audio_encoded(g4_session* s, const void* bytes, size_t len, int32_t* out_n_tokens) {
    return guarded([&] {
        g4_media_info info{};
        if (g4_status st = media_limits(s, "g4_session_add_audio_encoded", bytes, &info); st != G4_OK)
            return st;
        const std::string what =
            "audio (" + std::to_string(len) + " bytes given to g4_session_add_audio_encoded)";
        if (!info.has_audio) return no_tower(s, false, what, out_n_tokens);
        g4::media::AudioPcm pcm;
        std::string err =
            g4::media::decode_wav((const uint8_t*)bytes, len, what, &pcm, info.max_audio_samples);
        if (err.empty() && pcm.sample_rate != info.audio_sample_rate)
            err = what + ": sample rate is " + std::to_string(pcm.sample_rate) + " Hz; the plan needs " +
                  std::to_string(info.audio_sample_rate) +
                  " Hz (resample it, or use g4_session_add_audio_file)";
        if (!err.empty()) return api_error(G4_ERR_INVALID_ARGUMENT, err);
        return add_audio(s, pcm, what, out_n_tokens);
    });
}

} // extern "C"
