// g4._g4: the extension module. This file: error translation, the engine (an opened plan), its info and
// the tokenizer functions. compile.cpp binds the compiler, session.cpp the session.
#include "binding.h"
#include "runtime/plan/plan_reader.h"

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <vector>

namespace g4py {
namespace {

PyObject* g_error_classes = nullptr; // dict: status -> exception class (python/g4/_errors.py)

void translate(const std::exception_ptr& p, void*) {
    try {
        std::rethrow_exception(p);
    } catch (const Failure& f) {
        PyObject* cls = PyExc_RuntimeError;
        if (g_error_classes) {
            nb::object key = nb::int_(f.status);
            PyObject* c    = PyDict_GetItem(g_error_classes, key.ptr()); // borrowed
            if (c) cls = c;
        }
        PyErr_SetString(cls, f.what());
    }
}

nb::dict engine_info(const Engine& en) {
    g4_engine_info in{};
    check(g4_engine_get_info(en.e, &in));
    nb::dict d;
    d["vocab_size"]   = in.vocab_size;
    d["max_context"]  = in.max_context;
    d["max_chunk"]    = in.max_chunk;
    d["num_layers"]   = in.num_layers;
    d["hidden_size"]  = in.hidden_size;
    d["bos_token_id"] = in.bos_token_id;
    std::vector<int> eos(in.eos_token_ids, in.eos_token_ids + in.n_eos_token_ids);
    d["eos_token_ids"] = eos;
    d["weights_bytes"] = in.weights_bytes;
    d["session_bytes"] = in.session_bytes;
    d["architecture"]  = std::string(in.architecture ? in.architecture : "");
    d["has_tokenizer"] = in.has_tokenizer != 0;
    d["load_ms"]       = in.load_ms;
    return d;
}

nb::dict media_info(const Engine& en) {
    g4_media_info mi{};
    check(g4_engine_get_media_info(en.e, &mi));
    nb::dict d;
    d["has_vision"]        = mi.has_vision != 0;
    d["has_audio"]         = mi.has_audio != 0;
    d["image_token_id"]    = mi.image_token_id;
    d["boi_token_id"]      = mi.boi_token_id;
    d["eoi_token_id"]      = mi.eoi_token_id;
    d["audio_token_id"]    = mi.audio_token_id;
    d["boa_token_id"]      = mi.boa_token_id;
    d["eoa_token_id"]      = mi.eoa_token_id;
    d["max_image_tokens"]  = mi.max_image_tokens;
    d["max_image_pixels"]  = mi.max_image_pixels;
    d["audio_sample_rate"] = mi.audio_sample_rate;
    d["max_audio_samples"] = mi.max_audio_samples;
    d["max_queued_tokens"] = mi.max_queued_tokens;
    d["vision_device"]     = mi.vision_device;
    d["audio_device"]      = mi.audio_device;
    return d;
}

// The plan file's header and META (JSON text), as `g4 inspect` reads them.
nb::dict plan_header(const std::string& path) {
    g4::plan::Plan p;
    std::string err;
    g4_status st;
    {
        nb::gil_scoped_release nogil;
        st = p.load(path, false, &err);
    }
    if (st != G4_OK) throw Failure((int)st, err);
    nb::dict d;
    d["format"]    = std::to_string(p.header().format_major) + "." + std::to_string(p.header().format_minor);
    d["file_size"] = p.file_size();
    d["n_tensors"] = p.n_tensors();
    d["n_ops"]     = p.n_ops();
    d["meta_json"] = p.meta_json();
    return d;
}

std::vector<int32_t> tokenize(const Engine& en, const std::string& text, bool add_special) {
    nb::gil_scoped_release nogil;
    size_t n     = 0;
    g4_status st = g4_tokenize(en.e, text.data(), text.size(), add_special, nullptr, 0, &n);
    if (st != G4_ERR_BUFFER_TOO_SMALL) check(st);
    std::vector<int32_t> ids(n);
    if (n) check(g4_tokenize(en.e, text.data(), text.size(), add_special, ids.data(), ids.size(), &n));
    return ids;
}

// Runs a size-query call of the text API twice: once for the size, once into a buffer of that size.
template <class F> std::string sized_text(F&& call) {
    size_t n     = 0;
    g4_status st = call(nullptr, 0, &n);
    if (st != G4_ERR_BUFFER_TOO_SMALL) check(st);
    std::string out(n, '\0');
    if (n) check(call(out.data(), out.size(), &n));
    out.resize(n);
    return out;
}

nb::bytes detokenize(const Engine& en, const std::vector<int32_t>& ids, bool skip_special) {
    std::string s;
    {
        nb::gil_scoped_release nogil;
        s = sized_text([&](char* out, size_t cap, size_t* n) {
            return g4_detokenize(en.e, ids.data(), ids.size(), skip_special, out, cap, n);
        });
    }
    return nb::bytes(s.data(), s.size());
}

nb::bytes chat_render(const Engine& en, const std::vector<std::pair<std::string, std::string>>& msgs,
                      bool add_generation_prompt) {
    std::vector<g4_chat_message> cm;
    for (const auto& [role, content] : msgs)
        cm.push_back({role.c_str(), content.c_str()});
    std::string s;
    {
        nb::gil_scoped_release nogil;
        s = sized_text([&](char* out, size_t cap, size_t* n) {
            return g4_chat_render(en.e, cm.data(), cm.size(), add_generation_prompt, out, cap, n);
        });
    }
    return nb::bytes(s.data(), s.size());
}

} // namespace
} // namespace g4py

NB_MODULE(_g4, m) {
    using namespace g4py;
    m.doc() = "g4's compiled runtime and compiler (internal; use the g4 package)";
    nb::register_exception_translator(translate);
    m.def(
        "_set_error_classes",
        [](nb::dict d) {
            Py_XDECREF(g_error_classes);
            g_error_classes = d.ptr();
            Py_INCREF(g_error_classes);
        },
        "Registers the exception class raised for each g4 status (python/g4/_errors.py).");
    m.def("runtime_version", [] { return std::string(g4_runtime_version()); });
    m.def("status_string", [](int st) { return std::string(g4_status_string((g4_status)st)); });
    m.def("plan_header", &plan_header, nb::arg("path"));

    nb::class_<Engine>(m, "Engine")
        .def(
            "__init__",
            [](Engine* self, const std::string& path, bool verify) {
                g4_engine_params p = g4_engine_params_default();
                p.verify_weights   = verify;
                g4_engine* e       = nullptr;
                g4_status st;
                {
                    nb::gil_scoped_release nogil;
                    st = g4_engine_open(path.c_str(), &p, &e);
                }
                check(st);
                new (self) Engine();
                self->e    = e;
                self->path = path;
            },
            nb::arg("path"), nb::arg("verify_weights") = false)
        .def_ro("path", &Engine::path)
        .def("info", &engine_info)
        .def("media_info", &media_info)
        .def("tokenize", &tokenize, nb::arg("text"), nb::arg("add_special"))
        .def("detokenize", &detokenize, nb::arg("ids"), nb::arg("skip_special"))
        .def("chat_render", &chat_render, nb::arg("messages"), nb::arg("add_generation_prompt"))
        .def("is_eos", [](const Engine& en, int32_t t) { return g4_engine_is_eos(en.e, t) != 0; })
        .def("sampling_defaults", [](const Engine& en) {
            g4_sampling_params sp;
            check(g4_sampling_params_from_plan(en.e, &sp));
            nb::dict d;
            d["temperature"]    = sp.temperature;
            d["top_k"]          = sp.top_k;
            d["top_p"]          = sp.top_p;
            d["min_p"]          = sp.min_p;
            d["repeat_penalty"] = sp.repeat_penalty;
            d["repeat_last_n"]  = sp.repeat_last_n;
            d["seed"]           = sp.seed;
            return d;
        });

    bind_compile(m);
    bind_session(m);
}
