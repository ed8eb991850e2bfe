// g4._g4.compile: g4::compile_plan (compiler/compile.h) with the options of `g4 compile` given as a dict
// (python/g4/_compile.py builds it and documents each key), the GIL released while it runs, the compile
// log sent line by line to an optional callback, and the report's figures returned as a dict.
#include "compiler/compile.h"
#include "binding.h"
#include "compiler/error.h"

#include <map>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <optional>
#include <ostream>
#include <streambuf>

namespace g4py {
namespace {

// Thrown through the log stream when the progress callback raised: ends the compile (the plan's temporary
// file is removed as on any compile error), then the callback's exception is raised again.
struct ProgressAborted {};

// Collects the compile log and hands each complete line to `callback` (with the GIL held).
class LineSink : public std::streambuf {
public:
    explicit LineSink(nb::object callback) : callback_(std::move(callback)) {}
    std::string log;
    std::optional<nb::python_error> error;
    void flush_line() {
        if (line_.empty()) return;
        log += line_;
        if (callback_.is_valid() && !callback_.is_none() && !error) {
            nb::gil_scoped_acquire gil;
            std::string text = line_;
            if (!text.empty() && text.back() == '\n') text.pop_back();
            try {
                callback_(text);
            } catch (nb::python_error& e) {
                error.emplace(std::move(e));
            }
        }
        line_.clear();
        if (error) throw ProgressAborted{};
    }

protected:
    int overflow(int c) override {
        if (c == traits_type::eof()) return 0;
        line_.push_back((char)c);
        if (c == '\n') flush_line();
        return c;
    }
    std::streamsize xsputn(const char* s, std::streamsize n) override {
        for (std::streamsize i = 0; i < n; ++i)
            overflow((unsigned char)s[i]);
        return n;
    }

private:
    nb::object callback_;
    std::string line_;
};

g4::CompileOptions options_from(const nb::dict& d) {
    g4::CompileOptions o;
    std::map<std::string, std::string*> strs = {{"model_dir", &o.model_dir},
                                                {"adapter_dir", &o.adapter_dir},
                                                {"out_path", &o.out_path},
                                                {"weights", &o.weights},
                                                {"device", &o.device},
                                                {"quantize", &o.quantize_regex},
                                                {"keep", &o.keep_regex},
                                                {"target", &o.cuda_target},
                                                {"prefill_precision", &o.prefill_precision},
                                                {"mlp_precision", &o.mlp_precision},
                                                {"cpu_precision", &o.cpu_precision},
                                                {"kv_dtype", &o.kv_dtype},
                                                {"tokenizer", &o.tokenizer_path},
                                                {"cpu_mem", &o.cpu_mem},
                                                {"place", &o.place},
                                                {"tower_precision", &o.tower_precision}};
    std::map<std::string, int*> ints         = {
                {"max_context", &o.max_context},   {"chunk", &o.max_rows},
                {"logits_rows", &o.logits_rows},   {"max_sessions", &o.sessions},
                {"image_tokens", &o.image_tokens}, {"max_media_tokens", &o.max_media_tokens}};
    std::map<std::string, bool*> flags = {
        {"double_quant", &o.double_quant},   {"fidelity", &o.fidelity}, {"dry_run", &o.dry_run},
        {"deterministic", &o.deterministic}, {"vision", &o.vision},     {"audio", &o.audio},
        {"lm_screen", &o.lm_screen}};
    // As `g4 compile`: a CUDA plan's prefill chunk is 1024 rows unless given.
    if (d.contains("device") && nb::cast<std::string>(d["device"]).rfind("cuda", 0) == 0) o.max_rows = 1024;
    for (auto [k, v] : d) {
        const std::string key = nb::cast<std::string>(k);
        if (auto s = strs.find(key); s != strs.end())
            *s->second = nb::cast<std::string>(v);
        else if (auto i = ints.find(key); i != ints.end())
            *i->second = nb::cast<int>(v);
        else if (auto f = flags.find(key); f != flags.end())
            *f->second = nb::cast<bool>(v);
        else if (key == "gpu_mem")
            o.gpu_mem = nb::cast<std::vector<std::string>>(v);
        else if (key == "max_image_pixels")
            o.max_image_pixels = nb::cast<int64_t>(v);
        else if (key == "max_audio_seconds")
            o.max_audio_seconds = nb::cast<double>(v);
        else
            throw Failure(G4_ERR_INVALID_ARGUMENT, "compile: unknown option '" + key + "'");
    }
    if (o.logits_rows > o.max_rows) o.logits_rows = o.max_rows;
    return o;
}

nb::dict compile(const nb::dict& opts, nb::object progress) {
    const g4::CompileOptions o = options_from(opts);
    LineSink sink(std::move(progress));
    g4::CompileReport rep;
    std::string error;
    bool aborted = false;
    {
        nb::gil_scoped_release nogil;
        std::ostream log(&sink);
        log.exceptions(std::ios::badbit); // lets ProgressAborted through the stream
        try {
            g4::compile_plan(o, log, &rep);
            log.flush();
        } catch (const ProgressAborted&) {
            aborted = true;
        } catch (const std::exception& e) { // g4::CompileError, and the standard library's
            error = e.what();
        }
        if (!aborted) try {
                sink.flush_line(); // a last line without its newline
            } catch (const ProgressAborted&) {
                aborted = true;
            }
    }
    if (aborted) sink.error->restore(), throw nb::python_error();
    if (!error.empty()) throw Failure(kCompileFailed, error);
    nb::dict d;
    d["out"]                         = o.out_path;
    d["log"]                         = sink.log;
    d["fidelity_measured"]           = rep.fidelity_measured;
    d["fidelity_rel_l2"]             = rep.fidelity_rel_l2;
    d["fidelity_top1_agree"]         = rep.fidelity_top1_agree;
    d["fidelity_calibration_tokens"] = rep.fidelity_tokens;
    d["weights_bytes"]               = rep.weights_bytes;
    d["activation_bytes"]            = rep.act_arena_bytes;
    d["kv_cache_bytes"]              = rep.kv_arena_bytes;
    d["max_context"]                 = rep.max_context;
    d["adapter_weights_merged"]      = rep.adapter_merged;
    return d;
}

} // namespace

void bind_compile(nb::module_& m) {
    m.def("compile", &compile, nb::arg("options"), nb::arg("progress").none(),
          "Runs g4::compile_plan with the given options (a dict of CompileOptions fields).");
}

} // namespace g4py
