// g4._g4.Session: one g4_session (runtime/include/g4/g4.h). Every call that computes (prefill, decode,
// towers) releases the GIL; logits() is a read-only NumPy view of the session's own buffer (no copy).
#include "binding.h"
#include "runtime/src/media/audio_io.h"
#include "runtime/src/media/image_io.h"
#include "runtime/src/media/media_decode.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <optional>
#include <vector>

namespace g4py {
namespace {

struct Session {
    g4_session* s = nullptr;
    g4_engine* e  = nullptr;
    int32_t vocab = 0;
    nb::object engine; // the Engine, kept alive while the session lives
    Session()                          = default;
    Session(const Session&)            = delete;
    Session& operator=(const Session&) = delete;
    ~Session() { g4_session_destroy(s); }
};

using IdArray   = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using RgbArray  = nb::ndarray<const uint8_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using PcmArray  = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using OutMatrix = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

g4_sampling_params sampling_from(const Session& s, const nb::dict& d) {
    g4_sampling_params sp;
    check(g4_sampling_params_from_plan(s.e, &sp));
    for (auto [k, v] : d) {
        if (v.is_none()) continue;
        const std::string key = nb::cast<std::string>(k);
        if (key == "temperature")
            sp.temperature = nb::cast<float>(v);
        else if (key == "top_k")
            sp.top_k = nb::cast<int32_t>(v);
        else if (key == "top_p")
            sp.top_p = nb::cast<float>(v);
        else if (key == "min_p")
            sp.min_p = nb::cast<float>(v);
        else if (key == "repeat_penalty")
            sp.repeat_penalty = nb::cast<float>(v);
        else if (key == "repeat_last_n")
            sp.repeat_last_n = nb::cast<int32_t>(v);
        else if (key == "seed")
            sp.seed = nb::cast<uint64_t>(v);
        else
            throw Failure(G4_ERR_INVALID_ARGUMENT, "sampling: unknown parameter '" + key + "'");
    }
    check(g4_sampling_params_check(&sp));
    return sp;
}

// Feeds ids; with all_logits, returns the logits of every fed token as a new [n, vocab] array.
std::optional<OutMatrix> append(Session& s, IdArray ids, bool all_logits) {
    const size_t n = ids.shape(0);
    float* out     = nullptr;
    size_t cap     = 0;
    if (all_logits) {
        cap = n * (size_t)s.vocab;
        out = new float[cap];
    }
    g4_status st;
    std::string msg;
    {
        nb::gil_scoped_release nogil;
        st = g4_session_append_tokens(s.s, ids.data(), n, out, cap);
        if (st != G4_OK) msg = g4_last_error_message();
    }
    if (st != G4_OK) {
        delete[] out;
        throw Failure((int)st, msg);
    }
    if (!all_logits) return std::nullopt;
    nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
    return OutMatrix(out, {n, (size_t)s.vocab}, owner);
}

nb::ndarray<nb::numpy, const float, nb::ndim<1>> logits(nb::handle self) {
    Session& s     = nb::cast<Session&>(self);
    const float* l = nullptr;
    int32_t vocab  = 0;
    g4_status st;
    {
        nb::gil_scoped_release nogil; // a CUDA plan may finish a decode step here
        st = g4_session_get_logits(s.s, &l, &vocab);
    }
    check(st);
    return nb::ndarray<nb::numpy, const float, nb::ndim<1>>(l, {(size_t)vocab}, self);
}

int32_t sample(Session& s, const nb::dict& params) {
    g4_sampling_params sp = sampling_from(s, params);
    int32_t tok           = -1;
    g4_status st;
    std::string msg;
    {
        nb::gil_scoped_release nogil;
        st = g4_session_sample(s.s, &sp, &tok);
        if (st != G4_OK) msg = g4_last_error_message();
    }
    if (st != G4_OK) throw Failure((int)st, msg);
    return tok;
}

struct GenerateState {
    nb::object callback; // (token, text bytes) -> true to stop; may be None
    std::string text;
    std::vector<int32_t> ids;
    std::optional<nb::python_error> error;
};

int32_t on_token(void* user, int32_t token, const char* text, size_t len) {
    auto* g = static_cast<GenerateState*>(user);
    if (token >= 0) g->ids.push_back(token);
    g->text.append(text, len);
    if (g->callback.is_none()) return 0;
    nb::gil_scoped_acquire gil;
    try {
        return nb::cast<bool>(g->callback(token, nb::bytes(text, len))) ? 1 : 0;
    } catch (nb::python_error& e) {
        g->error.emplace(std::move(e));
        return 1;
    }
}

// Returns (text, ids, status, message): status G4_OK, G4_ERR_CONTEXT_FULL or G4_ERR_CANCELLED (the tokens
// so far stay fed); other failures raise.
std::tuple<nb::bytes, std::vector<int32_t>, int, std::string> generate(Session& s, const nb::dict& sampling,
                                                                       int32_t max_tokens, bool ignore_eos,
                                                                       const std::vector<std::string>& stop,
                                                                       nb::object callback) {
    g4_sampling_params sp = sampling_from(s, sampling);
    g4_generate_params gp = g4_generate_params_default();
    gp.max_tokens         = max_tokens;
    gp.ignore_eos         = ignore_eos;
    std::vector<const char*> stops;
    for (const auto& x : stop)
        stops.push_back(x.c_str());
    gp.stop   = stops.empty() ? nullptr : stops.data();
    gp.n_stop = stops.size();
    GenerateState g;
    g.callback = std::move(callback);
    g4_status st;
    std::string msg;
    {
        nb::gil_scoped_release nogil;
        st = g4_session_generate(s.s, &sp, &gp, on_token, &g, nullptr);
        if (st != G4_OK) msg = g4_last_error_message();
    }
    if (g.error) g.error->restore(), throw nb::python_error();
    if (st != G4_OK && st != G4_ERR_CONTEXT_FULL && st != G4_ERR_CANCELLED) throw Failure((int)st, msg);
    return {nb::bytes(g.text.data(), g.text.size()), g.ids, (int)st, msg};
}

g4_media_info media(const Session& s) {
    g4_media_info mi{};
    check(g4_engine_get_media_info(s.e, &mi));
    return mi;
}

int32_t add_image_rgb(Session& s, const uint8_t* rgb, int32_t w, int32_t h, const std::string& what) {
    int32_t n = 0;
    g4_status st;
    std::string msg;
    {
        nb::gil_scoped_release nogil;
        st = g4_session_add_image(s.s, rgb, w, h, &n);
        if (st != G4_OK) msg = g4_last_error_message();
    }
    if (st != G4_OK) throw Failure((int)st, what.empty() ? msg : what + ": " + msg);
    return n;
}

int32_t add_image(Session& s, RgbArray rgb) {
    if (rgb.shape(2) != 3)
        throw Failure(G4_ERR_INVALID_ARGUMENT, "image array: expected [height, width, 3] RGB, got " +
                                                   std::to_string(rgb.shape(2)) + " channels");
    return add_image_rgb(s, rgb.data(), (int32_t)rgb.shape(1), (int32_t)rgb.shape(0), "");
}

int32_t add_image_file(Session& s, const std::string& path) {
    const g4_media_info mi = media(s);
    g4::media::ImageRGB8 img;
    std::string err;
    {
        nb::gil_scoped_release nogil;
        err = g4::media::load_image(
            path, &img, mi.max_image_pixels > 0 ? mi.max_image_pixels : g4::media::kMaxImagePixels);
    }
    if (!err.empty()) throw Failure(G4_ERR_IO, err);
    return add_image_rgb(s, img.rgb.data(), img.width, img.height, path);
}

int32_t add_audio_pcm(Session& s, const float* pcm, int64_t n, const std::string& what) {
    int32_t tokens = 0;
    g4_status st;
    std::string msg;
    {
        nb::gil_scoped_release nogil;
        st = g4_session_add_audio(s.s, pcm, n, &tokens);
        if (st != G4_OK) msg = g4_last_error_message();
    }
    if (st != G4_OK) throw Failure((int)st, what.empty() ? msg : what + ": " + msg);
    return tokens;
}

int32_t add_audio_file(Session& s, const std::string& path) {
    const g4_media_info mi = media(s);
    g4::media::AudioPcm pcm;
    std::string err;
    {
        nb::gil_scoped_release nogil;
        // Any format the build decodes (WAV; through FFmpeg MP3, FLAC, Ogg, M4A, sound tracks), resampled to
        // the tower's rate as the CLI does. Without a tower the WAV reader's samples reach the session, which
        // refuses them with its own message.
        err = mi.has_audio ? g4::media::load_audio(path, mi.audio_sample_rate, mi.max_audio_samples, &pcm)
                           : g4::media::load_wav(path, &pcm, mi.max_audio_samples);
    }
    if (!err.empty()) throw Failure(G4_ERR_IO, err);
    return add_audio_pcm(s, pcm.samples.data(), (int64_t)pcm.samples.size(), path);
}

nb::dict stats(const Session& s) {
    g4_session_stats st{};
    check(g4_session_get_stats(s.s, &st));
    nb::dict d;
    d["prefill_ms"]     = st.prefill_ms;
    d["prefill_tokens"] = st.prefill_tokens;
    d["decode_ms"]      = st.decode_ms;
    d["decode_tokens"]  = st.decode_tokens;
    d["ttft_ms"]        = st.ttft_ms;
    d["sample_ms"]      = st.sample_ms;
    d["sample_calls"]   = st.sample_calls;
    d["image_ms"]       = st.image_ms;
    d["image_tokens"]   = st.image_tokens;
    d["audio_ms"]       = st.audio_ms;
    d["audio_tokens"]   = st.audio_tokens;
    d["decode_ahead"]   = st.decode_ahead;
    return d;
}

} // namespace

void bind_session(nb::module_& m) {
    nb::class_<Session>(m, "Session")
        .def(
            "__init__",
            [](Session* self, nb::object engine, int32_t n_threads) {
                Engine& en            = nb::cast<Engine&>(engine);
                g4_session_params spp = g4_session_params_default();
                spp.n_threads         = n_threads;
                g4_session* s         = nullptr;
                g4_status st;
                std::string msg;
                {
                    nb::gil_scoped_release nogil;
                    st = g4_session_create(en.e, &spp, &s);
                    if (st != G4_OK) msg = g4_last_error_message();
                }
                if (st != G4_OK) throw Failure((int)st, msg);
                g4_engine_info info{};
                check(g4_engine_get_info(en.e, &info));
                new (self) Session();
                self->s      = s;
                self->e      = en.e;
                self->vocab  = info.vocab_size;
                self->engine = engine;
            },
            nb::arg("engine"), nb::arg("n_threads") = 0)
        .def("append", &append, nb::arg("ids"), nb::arg("all_logits") = false)
        .def("logits", &logits)
        .def("sample", &sample, nb::arg("sampling"))
        .def(
            "check_sampling", [](const Session& s, const nb::dict& d) { sampling_from(s, d); },
            nb::arg("sampling"))
        .def("generate", &generate, nb::arg("sampling"), nb::arg("max_tokens"), nb::arg("ignore_eos"),
             nb::arg("stop"), nb::arg("callback").none())
        .def("reset", [](Session& s) { check(g4_session_reset(s.s)); })
        .def("clear_media", [](Session& s) { check(g4_session_clear_media(s.s)); })
        .def("position", [](const Session& s) { return g4_session_position(s.s); })
        .def("cancel", [](Session& s) { g4_session_cancel(s.s); })
        .def("add_image", &add_image, nb::arg("rgb"))
        .def("add_image_file", &add_image_file, nb::arg("path"))
        .def(
            "add_audio",
            [](Session& s, PcmArray pcm) { return add_audio_pcm(s, pcm.data(), (int64_t)pcm.shape(0), ""); },
            nb::arg("pcm"))
        .def("add_audio_file", &add_audio_file, nb::arg("path"))
        .def("stats", &stats);
}

} // namespace g4py
