// The META codec (meta.h): each key is written and read here only. Keys are written sorted (nlohmann's
// object order), so the text depends on the values alone.
#include "runtime/plan/meta.h"

#include "runtime/src/json_fields.h"
#include "runtime/src/json_limits.h"

#include <cmath>
#include <stdexcept>

namespace g4::plan {

using json   = nlohmann::json;
namespace jf = g4::jsonf;

uint64_t MetaDeviceMemory::total() const {
    uint64_t t = 0;
    for (const auto& p : parts)
        t += p.second;
    return t;
}

namespace {

json range_json(const ByteRange& r) {
    return json::array({r[0], r[1]});
}
ByteRange read_range(const json& o, const char* key) {
    const json& a = o.at(key);
    return {jf::get<uint64_t>(a, 0, key), jf::get<uint64_t>(a, 1, key)};
}
const json& object_at(const json& o, const char* key) {
    auto it = o.find(key);
    if (it == o.end()) throw std::runtime_error(std::string("META field ") + key + " is missing");
    if (!it->is_object()) throw std::runtime_error(std::string("META field ") + key + ": expected an object");
    return *it;
}
json files_json(const std::vector<MetaFile>& fs) {
    json a = json::array();
    for (const MetaFile& f : fs)
        a.push_back({{"file", f.file}, {"sha256", f.sha256}});
    return a;
}
std::vector<MetaFile> read_files(const json& o) {
    std::vector<MetaFile> fs;
    if (o.contains("files"))
        for (const json& f : o.at("files"))
            fs.push_back({jf::value<std::string>(f, "file", ""), jf::value<std::string>(f, "sha256", "")});
    return fs;
}

json cuda_json(const MetaCuda& c) {
    json j = {{"target", c.target}, {"device_index", c.device_index}, {"attn_hpg", c.attn_hpg}};
    if (!c.kernel_trace.empty()) j["kernel_trace"] = c.kernel_trace;
    return j;
}
MetaCuda read_cuda(const json& j) {
    MetaCuda c;
    c.target       = jf::get<std::string>(j, "target");
    c.device_index = jf::value<int32_t>(j, "device_index", 0);
    c.attn_hpg     = jf::value<int32_t>(j, "attn_hpg", 0);
    c.kernel_trace = jf::value<std::string>(j, "kernel_trace", "");
    return c;
}

MetaPolicy read_policy(const json& j) {
    MetaPolicy p;
    p.weights       = jf::value<std::string>(j, "weights", "");
    p.double_quant  = jf::value<bool>(j, "double_quant", false);
    p.quantize      = jf::value<std::string>(j, "quantize", "");
    p.keep          = jf::value<std::string>(j, "keep", "");
    p.nf4_blocksize = jf::value<int32_t>(j, "nf4_blocksize", 0);
    p.kv_dtype      = jf::value<std::string>(j, "kv_dtype", "f32");
    if (j.contains("deterministic")) p.deterministic = jf::get<bool>(j, "deterministic");
    p.prefill_precision = jf::value<std::string>(j, "prefill_precision", "");
    p.mlp_precision     = jf::value<std::string>(j, "mlp_precision", "");
    p.mlp_replicas      = jf::value<int32_t>(j, "mlp_replicas", -1);
    p.ple_fold          = jf::value<std::string>(j, "ple_fold", "");
    p.mlp_fold          = jf::value<std::string>(j, "mlp_fold", "");
    p.cpu_precision     = jf::value<std::string>(j, "cpu_precision", "");
    return p;
}

MetaHParams read_hparams(const json& j) {
    MetaHParams h;
    h.num_hidden_layers = jf::get<int32_t>(j, "num_hidden_layers");
    h.hidden_size       = jf::get<int32_t>(j, "hidden_size");
    h.model             = j;
    h.model.erase("num_hidden_layers");
    h.model.erase("hidden_size");
    return h;
}

MetaProgram read_program(const json& j) {
    MetaProgram p;
    p.max_rows          = jf::get<int32_t>(j, "max_rows");
    p.max_context       = jf::get<int32_t>(j, "max_context");
    p.logits_rows       = jf::get<int32_t>(j, "logits_rows");
    p.sliding_slots     = jf::get<int32_t>(j, "sliding_slots");
    p.act_arena_bytes   = jf::get<uint64_t>(j, "act_arena_bytes");
    p.kv_arena_bytes    = jf::get<uint64_t>(j, "kv_arena_bytes");
    p.ids_tensor        = jf::get<int32_t>(j, "ids_tensor");
    p.logits_tensor     = jf::get<int32_t>(j, "logits_tensor");
    p.max_k             = jf::get<int64_t>(j, "max_k");
    p.max_slots         = jf::get<int64_t>(j, "max_slots");
    p.vocab_size        = jf::get<int32_t>(j, "vocab_size");
    p.embed_vocab_limit = jf::get<int32_t>(j, "embed_vocab_limit");
    if (j.contains("layer_devices")) {
        p.layer_devices = jf::get<std::vector<int32_t>>(j, "layer_devices");
        p.kv_host_begin = jf::get<uint64_t>(j, "kv_host_begin");
        for (const json& g : j.at("gpus")) {
            MetaGpuPart part;
            part.index = jf::get<int32_t>(g, "index");
            for (const json& r : g.at("weights"))
                part.weights.push_back(
                    {jf::get<uint64_t>(r, 0, "weights"), jf::get<uint64_t>(r, 1, "weights")});
            part.kv = read_range(g, "kv");
            p.gpus.push_back(part);
        }
    }
    return p;
}

MetaGeneration read_generation(const json& j) {
    MetaGeneration g;
    g.eos_token_ids      = jf::get<std::vector<int32_t>>(j, "eos_token_ids");
    g.bos_token_id       = jf::get<int32_t>(j, "bos_token_id");
    g.pad_token_id       = jf::value<int32_t>(j, "pad_token_id", 0);
    g.do_sample          = jf::value<bool>(j, "do_sample", false);
    g.temperature        = jf::value<float>(j, "temperature", 1.0f);
    g.top_k              = jf::value<int32_t>(j, "top_k", 0);
    g.top_p              = jf::value<float>(j, "top_p", 1.0f);
    g.min_p              = jf::value<float>(j, "min_p", 0.0f);
    g.repetition_penalty = jf::value<float>(j, "repetition_penalty", 1.0f);
    return g;
}

MetaProvenance read_provenance(const json& j) {
    MetaProvenance p;
    if (j.contains("base")) {
        const json& b = object_at(j, "base");
        p.base_dir    = jf::value<std::string>(b, "dir", "");
        p.base_files  = read_files(b);
    }
    if (j.contains("adapter")) {
        const json& a   = object_at(j, "adapter");
        p.has_adapter   = true;
        p.adapter_dir   = jf::value<std::string>(a, "dir", "");
        p.adapter_files = read_files(a);
        if (a.contains("merges"))
            for (const json& m : a.at("merges"))
                p.merges.push_back({jf::value<std::string>(m, "module", ""), jf::value<int32_t>(m, "r", 0),
                                    jf::value<float>(m, "alpha", 0), jf::value<float>(m, "scale", 0),
                                    jf::value<bool>(m, "dora", false)});
    }
    p.g4_version = jf::value<std::string>(j, "g4_version", "");
    return p;
}

MetaTokenizer read_tokenizer(const json& j) {
    MetaTokenizer t;
    t.present       = jf::value<bool>(j, "present", false);
    t.vocab_size    = jf::value<int32_t>(j, "vocab_size", 0);
    t.add_bos_token = jf::value<bool>(j, "add_bos_token", false);
    t.chat_template = jf::value<std::string>(j, "chat_template", "");
    t.sha256        = jf::value<std::string>(j, "sha256", "");
    return t;
}

json placement_json(const MetaPlacement& p) {
    json layers = json::array();
    for (const MetaLayerRange& r : p.layers)
        layers.push_back({{"first", r.first}, {"last", r.last}, {"device", r.device}});
    json j = {{"device", p.device}, {"layers", layers},       {"embed", p.embed},   {"lm_head", p.lm_head},
              {"ple", p.ple},       {"ple_auto", p.ple_auto}, {"vision", p.vision}, {"audio", p.audio}};
    if (p.lm_head_screen) j["lm_head_screen"] = *p.lm_head_screen;
    j["sessions"] = p.sessions;
    return j;
}
MetaPlacement read_placement(const json& j) {
    MetaPlacement p;
    p.device = jf::value<std::string>(j, "device", "?");
    if (j.contains("layers"))
        for (const json& r : j.at("layers"))
            p.layers.push_back({jf::value<int32_t>(r, "first", 0), jf::value<int32_t>(r, "last", 0),
                                jf::value<std::string>(r, "device", "?")});
    p.embed    = jf::value<std::string>(j, "embed", "?");
    p.lm_head  = jf::value<std::string>(j, "lm_head", "?");
    p.ple      = jf::value<std::string>(j, "ple", "device");
    p.ple_auto = jf::value<bool>(j, "ple_auto", false);
    p.vision   = jf::value<std::string>(j, "vision", "?");
    p.audio    = jf::value<std::string>(j, "audio", "?");
    if (j.contains("lm_head_screen")) p.lm_head_screen = jf::get<bool>(j, "lm_head_screen");
    p.sessions = jf::value<int32_t>(j, "sessions", 1);
    if (p.sessions < 1 || p.sessions > 256)
        throw std::runtime_error("META field placement.sessions: expected 1..256, got " +
                                 std::to_string(p.sessions));
    return p;
}

json memory_json(const std::vector<MetaDeviceMemory>& mem) {
    json a = json::array();
    for (const MetaDeviceMemory& d : mem) {
        json parts = json::array();
        for (const auto& [what, bytes] : d.parts)
            parts.push_back({{"what", what}, {"bytes", bytes}});
        json e = {{"device", d.device}, {"parts", parts}, {"total", d.total()}};
        if (d.scratch_per_thread) e["scratch_per_thread"] = d.scratch_per_thread;
        if (d.budget) e["budget"] = *d.budget;
        a.push_back(e);
    }
    return a;
}
std::vector<MetaDeviceMemory> read_memory(const json& a) {
    std::vector<MetaDeviceMemory> out;
    for (const json& e : a) {
        MetaDeviceMemory d;
        d.device = jf::get<std::string>(e, "device");
        for (const json& pr : e.at("parts"))
            d.parts.push_back({jf::get<std::string>(pr, "what"), jf::get<uint64_t>(pr, "bytes")});
        d.scratch_per_thread = jf::value<uint64_t>(e, "scratch_per_thread", 0);
        if (e.contains("budget")) d.budget = jf::get<uint64_t>(e, "budget");
        out.push_back(d);
    }
    return out;
}

// A tower's device fields: "device" and "gpu_bytes" when it runs on a GPU, its weight range when recorded.
void tower_common_json(json& j, const std::string& device, uint64_t gpu_bytes,
                       const std::optional<ByteRange>& weights) {
    if (!device.empty()) {
        j["device"]    = device;
        j["gpu_bytes"] = gpu_bytes;
    }
    if (weights) j["weights"] = range_json(*weights);
}
void read_tower_common(const json& j, std::string* device, uint64_t* gpu_bytes,
                       std::optional<ByteRange>* weights) {
    *device = jf::value<std::string>(j, "device", ""); // absent in older plans: the CPU
    if (!device->empty() && *device != "cpu") *gpu_bytes = jf::get<uint64_t>(j, "gpu_bytes");
    if (*device == "cpu") device->clear();
    if (j.contains("weights")) *weights = read_range(j, "weights");
}

json towers_json(const MetaTowers& t) {
    json j = {{"weights", range_json(t.weights)},
              {"max_media_tokens", t.max_media_tokens},
              {"thread_scratch_floats", t.thread_scratch_floats},
              {"session_bytes", t.session_bytes},
              {"precision", t.precision}};
    if (t.vision) {
        const MetaVision& v = *t.vision;
        json o              = {{"config", json::parse(v.config)},    {"image_tokens", v.image_tokens},
                               {"max_patches", v.max_patches},       {"max_image_pixels", v.max_image_pixels},
                               {"image_token_id", v.image_token_id}, {"boi_token_id", v.boi_token_id},
                               {"eoi_token_id", v.eoi_token_id},     {"video_token_id", v.video_token_id}};
        if (!v.program.empty()) {
            o["program"]             = v.program;
            o["patch_size"]          = v.patch_size;
            o["pooling_kernel_size"] = v.pooling_kernel_size;
            o["position_size"]       = v.position_size;
            o["pixel_mean"]          = v.pixel_mean;
            o["pixel_std"]           = v.pixel_std;
        }
        if (v.video)
            o["video"] = {{"frames", v.video->frames},
                          {"max_seconds", v.video->max_seconds},
                          {"max_stream_frames", v.video->max_stream_frames},
                          {"max_pixels", v.video->max_pixels},
                          {"max_file_bytes", v.video->max_file_bytes}};
        tower_common_json(o, v.device, v.gpu_bytes, v.weights);
        j["vision"] = o;
    }
    if (t.audio) {
        const MetaAudio& a = *t.audio;
        json o             = {{"config", json::parse(a.config)}, {"max_samples", a.max_samples},
                              {"sample_rate", a.sample_rate},    {"audio_token_id", a.audio_token_id},
                              {"boa_token_id", a.boa_token_id},  {"eoa_token_id", a.eoa_token_id}};
        if (!a.program.empty()) {
            o["program"]      = a.program;
            o["frame_length"] = a.frame_length;
            o["hop_length"]   = a.hop_length;
            o["fft_length"]   = a.fft_length;
            o["mel_bins"]     = a.mel_bins;
            o["min_hz"]       = a.min_hz;
            o["max_hz"]       = a.max_hz;
            o["mel_floor"]    = a.mel_floor;
        }
        tower_common_json(o, a.device, a.gpu_bytes, a.weights);
        j["audio"] = o;
    }
    return j;
}
// A field 1.2 writers always write, defaulted in older plans.
template <class T> T since_1_2(const json& o, const char* key, uint16_t minor, const T& dflt) {
    return minor >= 2 ? jf::get<T>(o, key) : jf::value<T>(o, key, dflt);
}

MetaTowers read_towers(const json& j, uint16_t minor) {
    MetaTowers t;
    t.weights               = read_range(j, "weights");
    t.max_media_tokens      = jf::get<int32_t>(j, "max_media_tokens");
    t.thread_scratch_floats = jf::get<uint64_t>(j, "thread_scratch_floats");
    t.session_bytes         = since_1_2<uint64_t>(j, "session_bytes", minor, 0);
    t.precision             = since_1_2<std::string>(j, "precision", minor, "fp32");
    if (j.contains("vision")) {
        const json& o = object_at(j, "vision");
        MetaVision v;
        v.config           = o.at("config").dump();
        v.image_tokens     = jf::get<int32_t>(o, "image_tokens");
        v.max_patches      = jf::get<int32_t>(o, "max_patches");
        v.max_image_pixels = jf::get<int64_t>(o, "max_image_pixels");
        v.image_token_id   = jf::get<int32_t>(o, "image_token_id");
        v.boi_token_id     = jf::get<int32_t>(o, "boi_token_id");
        v.eoi_token_id     = jf::get<int32_t>(o, "eoi_token_id");
        v.video_token_id   = since_1_2<int32_t>(o, "video_token_id", minor, -1);
        if (o.contains("program")) {
            v.program             = jf::get<std::string>(o, "program");
            v.patch_size          = jf::get<int32_t>(o, "patch_size");
            v.pooling_kernel_size = jf::get<int32_t>(o, "pooling_kernel_size");
            v.position_size       = jf::get<int32_t>(o, "position_size");
            v.pixel_mean          = jf::get<float>(o, "pixel_mean");
            v.pixel_std           = jf::get<float>(o, "pixel_std");
        }
        if (o.contains("video")) {
            const json& vo       = object_at(o, "video");
            MetaVideo& mv        = v.video.emplace();
            mv.frames            = jf::get<int32_t>(vo, "frames");
            mv.max_seconds       = jf::get<double>(vo, "max_seconds");
            mv.max_stream_frames = jf::get<int64_t>(vo, "max_stream_frames");
            mv.max_pixels        = jf::get<int64_t>(vo, "max_pixels");
            mv.max_file_bytes    = jf::get<int64_t>(vo, "max_file_bytes");
            if (mv.frames < 1 || !(mv.max_seconds > 0) || !std::isfinite(mv.max_seconds) ||
                mv.max_stream_frames < 1 || mv.max_pixels < 1 || mv.max_pixels > v.max_image_pixels ||
                mv.max_file_bytes < 1)
                throw std::runtime_error(
                    "META field video: a limit is out of range (each positive, max_pixels "
                    "at most max_image_pixels)");
        }
        read_tower_common(o, &v.device, &v.gpu_bytes, &v.weights);
        t.vision = v;
    }
    if (j.contains("audio")) {
        const json& o = object_at(j, "audio");
        MetaAudio a;
        a.config         = o.at("config").dump();
        a.max_samples    = jf::get<int64_t>(o, "max_samples");
        a.sample_rate    = jf::get<int32_t>(o, "sample_rate");
        a.audio_token_id = jf::get<int32_t>(o, "audio_token_id");
        a.boa_token_id   = jf::get<int32_t>(o, "boa_token_id");
        a.eoa_token_id   = jf::get<int32_t>(o, "eoa_token_id");
        if (o.contains("program")) {
            a.program      = jf::get<std::string>(o, "program");
            a.frame_length = jf::get<int32_t>(o, "frame_length");
            a.hop_length   = jf::get<int32_t>(o, "hop_length");
            a.fft_length   = jf::get<int32_t>(o, "fft_length");
            a.mel_bins     = jf::get<int32_t>(o, "mel_bins");
            a.min_hz       = jf::get<double>(o, "min_hz");
            a.max_hz       = jf::get<double>(o, "max_hz");
            a.mel_floor    = jf::get<double>(o, "mel_floor");
        }
        read_tower_common(o, &a.device, &a.gpu_bytes, &a.weights);
        t.audio = a;
    }
    return t;
}

void collect_keys(const json& j, const std::string& path, std::vector<std::string>* out) {
    if (j.is_object()) {
        for (auto it = j.begin(); it != j.end(); ++it) {
            const std::string p = path.empty() ? it.key() : path + "." + it.key();
            out->push_back(p);
            if (p.find(".config") == std::string::npos && p != "chat")
                collect_keys(*it, p, out); // a config's and the chat template's keys are their own codecs
        }
    } else if (j.is_array() && !j.empty()) {
        collect_keys(j[0], path, out);
    }
}

} // namespace

json to_json(const MetaPolicy& p) {
    json j = {{"weights", p.weights}, {"double_quant", p.double_quant},   {"quantize", p.quantize},
              {"keep", p.keep},       {"nf4_blocksize", p.nf4_blocksize}, {"kv_dtype", p.kv_dtype}};
    if (p.deterministic) j["deterministic"] = *p.deterministic;
    if (!p.prefill_precision.empty()) j["prefill_precision"] = p.prefill_precision;
    if (!p.mlp_precision.empty()) j["mlp_precision"] = p.mlp_precision;
    if (p.mlp_replicas >= 0) j["mlp_replicas"] = p.mlp_replicas;
    if (!p.ple_fold.empty()) j["ple_fold"] = p.ple_fold;
    if (!p.mlp_fold.empty()) j["mlp_fold"] = p.mlp_fold;
    if (!p.cpu_precision.empty()) j["cpu_precision"] = p.cpu_precision;
    return j;
}

json to_json(const MetaHParams& h) {
    json j                 = h.model;
    j["num_hidden_layers"] = h.num_hidden_layers;
    j["hidden_size"]       = h.hidden_size;
    return j;
}

json to_json(const MetaProgram& p) {
    json j = {{"max_rows", p.max_rows},
              {"max_context", p.max_context},
              {"logits_rows", p.logits_rows},
              {"sliding_slots", p.sliding_slots},
              {"act_arena_bytes", p.act_arena_bytes},
              {"kv_arena_bytes", p.kv_arena_bytes},
              {"ids_tensor", p.ids_tensor},
              {"logits_tensor", p.logits_tensor},
              {"max_k", p.max_k},
              {"max_slots", p.max_slots},
              {"vocab_size", p.vocab_size},
              {"embed_vocab_limit", p.embed_vocab_limit}};
    if (p.kv_host_begin) {
        json parts = json::array();
        for (const MetaGpuPart& g : p.gpus) {
            json w = json::array();
            for (const ByteRange& r : g.weights)
                w.push_back(range_json(r));
            parts.push_back({{"index", g.index}, {"weights", w}, {"kv", range_json(g.kv)}});
        }
        j["layer_devices"] = p.layer_devices;
        j["gpus"]          = parts;
        j["kv_host_begin"] = *p.kv_host_begin;
    }
    return j;
}

json to_json(const MetaGeneration& g) {
    return {{"eos_token_ids", g.eos_token_ids},
            {"bos_token_id", g.bos_token_id},
            {"pad_token_id", g.pad_token_id},
            {"do_sample", g.do_sample},
            {"temperature", g.temperature},
            {"top_k", g.top_k},
            {"top_p", g.top_p},
            {"min_p", g.min_p},
            {"repetition_penalty", g.repetition_penalty}};
}

json to_json(const MetaProvenance& p) {
    json j = json::object();
    if (!p.base_dir.empty() || !p.base_files.empty())
        j["base"] = {{"dir", p.base_dir}, {"files", files_json(p.base_files)}};
    if (p.has_adapter) {
        json merges = json::array();
        for (const MetaMerge& m : p.merges)
            merges.push_back(
                {{"module", m.module}, {"r", m.r}, {"alpha", m.alpha}, {"scale", m.scale}, {"dora", m.dora}});
        j["adapter"] = {{"dir", p.adapter_dir}, {"files", files_json(p.adapter_files)}, {"merges", merges}};
    }
    if (!p.g4_version.empty()) j["g4_version"] = p.g4_version;
    return j;
}

json to_json(const MetaTokenizer& t) {
    if (!t.present) return json::object();
    return {{"present", true},
            {"vocab_size", t.vocab_size},
            {"add_bos_token", t.add_bos_token},
            {"chat_template", t.chat_template},
            {"sha256", t.sha256}};
}

json to_json(const Meta& m) {
    json j;
    j["format"]        = m.format;
    j["g4_version"]    = m.g4_version;
    j["architecture"]  = m.architecture;
    j["head_dim_form"] = m.head_dim_form;
    j["device"]        = m.device;
    if (m.cuda) j["cuda"] = cuda_json(*m.cuda);
    j["weights_dtype"]  = m.weights_dtype;
    j["policy"]         = to_json(m.policy);
    j["reference_plan"] = m.reference_plan;
    j["hparams"]        = to_json(m.hparams);
    j["program"]        = to_json(m.program);
    j["generation"]     = to_json(m.generation);
    j["provenance"]     = to_json(m.provenance);
    j["tokenizer"]      = to_json(m.tokenizer);
    if (m.chat.is_object() && !m.chat.empty()) j["chat"] = m.chat;
    if (m.placement) {
        j["placement"] = placement_json(*m.placement);
        j["memory"]    = memory_json(m.memory);
    }
    if (m.towers) j["towers"] = towers_json(*m.towers);
    return j;
}

std::string write_meta(const Meta& m) {
    return to_json(m).dump(1);
}

bool read_meta(std::string_view text, uint16_t minor, Meta* m, std::string* err) {
    try {
        if (std::string e = json_depth_error(text); !e.empty()) throw std::runtime_error(e);
        const json j = json::parse(text);
        if (!j.is_object()) throw std::runtime_error("not a JSON object");
        Meta r;
        r.format        = jf::value<std::string>(j, "format", "g4plan");
        r.g4_version    = jf::value<std::string>(j, "g4_version", "?");
        r.architecture  = jf::get<std::string>(j, "architecture");
        r.head_dim_form = jf::value<std::string>(j, "head_dim_form", "");
        r.device        = jf::value<std::string>(j, "device", "cpu");
        if (j.contains("cuda")) r.cuda = read_cuda(object_at(j, "cuda"));
        r.weights_dtype  = jf::value<std::string>(j, "weights_dtype", "?");
        r.policy         = j.contains("policy") ? read_policy(object_at(j, "policy")) : MetaPolicy{};
        r.reference_plan = jf::value<bool>(j, "reference_plan", false);
        r.hparams        = read_hparams(object_at(j, "hparams"));
        r.program        = read_program(object_at(j, "program"));
        r.generation     = read_generation(object_at(j, "generation"));
        if (j.contains("provenance")) r.provenance = read_provenance(object_at(j, "provenance"));
        if (j.contains("tokenizer")) r.tokenizer = read_tokenizer(object_at(j, "tokenizer"));
        if (j.contains("chat")) r.chat = object_at(j, "chat");
        if (j.contains("placement")) r.placement = read_placement(object_at(j, "placement"));
        if (j.contains("memory")) r.memory = read_memory(j.at("memory"));
        if (j.contains("towers")) r.towers = read_towers(object_at(j, "towers"), minor);
        *m = std::move(r);
        return true;
    } catch (const std::exception& e) { // jsonf's "META field ...", nlohmann's parse and type errors
        const std::string what = e.what();
        if (err) *err = what.rfind("META", 0) == 0 ? what : "META: " + what;
        return false;
    }
}

std::vector<std::string> meta_keys() {
    Meta m;
    m.cuda                     = MetaCuda{"sm_90", 0, 0, "all"};
    m.policy.deterministic     = true;
    m.policy.prefill_precision = m.policy.mlp_precision = m.policy.ple_fold = m.policy.mlp_fold = "x";
    m.policy.cpu_precision                                                                      = "x";
    m.policy.mlp_replicas                                                                       = 1;
    m.program.layer_devices                                                                     = {0};
    m.program.gpus             = {MetaGpuPart{0, {{0, 1}}, {0, 1}}};
    m.program.kv_host_begin    = 0;
    m.provenance.base_dir      = "x";
    m.provenance.base_files    = {{"x", "x"}};
    m.provenance.has_adapter   = true;
    m.provenance.adapter_files = {{"x", "x"}};
    m.provenance.merges        = {MetaMerge{}};
    m.provenance.g4_version    = "x";
    m.tokenizer.present        = true;
    m.chat                     = {{"x", 1}};
    m.placement                = MetaPlacement{};
    m.placement->layers        = {MetaLayerRange{}};
    m.memory                   = {MetaDeviceMemory{"x", {{"x", 1}}, 1, 1}};
    MetaTowers t;
    t.vision         = MetaVision{};
    t.audio          = MetaAudio{};
    t.vision->config = t.audio->config = "{}";
    t.vision->program = t.audio->program = "x";
    t.vision->video                      = MetaVideo{};
    t.vision->device = t.audio->device = "cuda:0";
    t.vision->weights = t.audio->weights = ByteRange{0, 1};
    m.towers                             = t;
    std::vector<std::string> keys;
    collect_keys(to_json(m), "", &keys);
    return keys;
}

} // namespace g4::plan
