// Memory budgets and component placement (see placement.h and docs/placement.md).
#include "compiler/placement.h"

#include "compiler/error.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ostream>
#include <set>

namespace g4::placement {
namespace {

const char* kComponents = "vision, audio, ple, embed, lm_head, layers";
const char* kTargets    = "cpu, gpu, gpuN, cuda:N";
const char* kSizeHelp =
    "sizes look like 12GiB, 4GB, 512MiB, 3.5GiB or plain bytes (GiB/MiB/KiB are powers of 2, "
    "GB/MB/KB powers of 10)";

std::string trim(const std::string& s) {
    size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
    return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::string lower(std::string s) {
    for (char& c : s)
        c = (char)std::tolower((unsigned char)c);
    return s;
}

bool digits(const std::string& s) {
    return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

std::string cuda(int i) {
    return "cuda:" + std::to_string(i);
}

std::string span(int a, int b) {
    return a == b ? std::to_string(a) : std::to_string(a) + "-" + std::to_string(b);
}

int small_int(const std::string& s, const std::string& what) {
    if (!digits(s) || s.size() > 6) throw CompileError(what);
    return std::stoi(s);
}

Target parse_target(const std::string& text, const std::string& component, const std::string& item) {
    Target t;
    t.text                = text;
    std::string s         = lower(text);
    const std::string bad = "--place " + item + ": unknown target '" + text + "' for " + component +
                            "; expected " + kTargets + (component == "ple" ? ", or host" : "");
    if (s == "cpu")
        t.kind = Target::Kind::Cpu;
    else if (s == "host")
        t.kind = Target::Kind::Host;
    else if (s == "gpu" || s == "cuda")
        t.kind = Target::Kind::Gpu;
    else if (s.rfind("gpu", 0) == 0)
        t.gpu = small_int(s.substr(3), bad);
    else if (s.rfind("cuda:", 0) == 0)
        t.gpu = small_int(s.substr(5), bad);
    else
        throw CompileError(bad);
    if (t.kind == Target::Kind::Host && component != "ple")
        throw CompileError("--place " + item +
                           ": 'host' applies to ple only (the per-layer-embedding table kept in pinned " +
                           "host memory); use cpu, gpu, gpuN or cuda:N for " + component);
    return t;
}

LayerRange parse_range(const std::string& text) {
    const std::string how = " (expected A-B:TARGET or N:TARGET, e.g. layers=0-29:gpu0,30-34:cpu)";
    size_t colon          = text.find(':');
    if (colon == std::string::npos)
        throw CompileError("--place layers: range '" + text + "' has no target" + how);
    std::string r = trim(text.substr(0, colon));
    size_t dash   = r.find('-');
    LayerRange lr;
    lr.text               = text;
    const std::string bad = "--place layers: bad layer range '" + text + "'" + how;
    lr.first              = small_int(trim(r.substr(0, dash)), bad);
    lr.last               = dash == std::string::npos ? lr.first : small_int(trim(r.substr(dash + 1)), bad);
    if (lr.last < lr.first)
        throw CompileError("--place layers: range '" + text + "' ends before it starts; write it as " +
                           span(lr.last, lr.first) + ":" + text.substr(colon + 1));
    lr.target = parse_target(trim(text.substr(colon + 1)), "layers", "layers=" + text);
    return lr;
}

std::string parts_text(const DeviceMemory& d) {
    std::string s;
    for (const auto& [what, bytes] : d.parts)
        s += (s.empty() ? "" : " + ") + what + " " + human(bytes);
    const std::string each = d.sessions > 1 ? std::to_string(d.sessions) + " sessions x " : "";
    if (d.per_thread)
        s += (s.empty() ? "" : " + ") +
             (d.threads > 0
                  ? "scratch " + each + std::to_string(d.threads) + " threads x " + human(d.per_thread)
                  : "scratch " + human(d.per_thread) + " per thread" +
                        (d.sessions > 1 ? " per session (" + std::to_string(d.sessions) + ")" : ""));
    return s.empty() ? "nothing placed" : s;
}

std::vector<const DeviceMemory*> over_budget(const std::vector<DeviceMemory>& mem) {
    std::vector<const DeviceMemory*> out;
    for (const auto& d : mem)
        if (d.budget && d.need() > *d.budget) out.push_back(&d);
    return out;
}

std::string budget_flag_for(const DeviceMemory& d, uint64_t bytes) {
    return d.device.rfind("cuda:", 0) == 0 ? "--gpu-mem " + d.device.substr(5) + ":" + size_arg(bytes)
                                           : "--cpu-mem " + size_arg(bytes);
}

} // namespace

std::string human(uint64_t b) {
    char buf[64];
    if (b >= (1ull << 30))
        std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
    else if (b >= (1ull << 20))
        std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1048576.0);
    else if (b >= 1024)
        std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
    else
        std::snprintf(buf, sizeof buf, "%llu B", (unsigned long long)b);
    return buf;
}

uint64_t parse_size(const std::string& text, const std::string& flag) {
    const std::string s = trim(text);
    size_t i            = 0;
    while (i < s.size() && (std::isdigit((unsigned char)s[i]) || s[i] == '.'))
        ++i;
    const std::string num = s.substr(0, i), unit_text = trim(s.substr(i)), unit = lower(unit_text);
    const size_t dot     = num.find('.');
    const std::string ip = num.substr(0, dot), fp = dot == std::string::npos ? "" : num.substr(dot + 1);
    if (!digits(ip) || (dot != std::string::npos && !digits(fp)))
        throw CompileError(flag + " '" + text + "' is not a size; " + kSizeHelp);
    static const std::pair<const char*, uint64_t> kUnits[] = {{"", 1},
                                                              {"b", 1},
                                                              {"kib", 1ull << 10},
                                                              {"mib", 1ull << 20},
                                                              {"gib", 1ull << 30},
                                                              {"tib", 1ull << 40},
                                                              {"kb", 1000ull},
                                                              {"mb", 1000000ull},
                                                              {"gb", 1000000000ull},
                                                              {"tb", 1000000000000ull}};
    uint64_t mult                                          = 0;
    for (const auto& [name, m] : kUnits)
        if (unit == name) mult = m;
    if (!mult) throw CompileError(flag + " '" + text + "': unknown unit '" + unit_text + "'; " + kSizeHelp);
    if (mult == 1 && !fp.empty())
        throw CompileError(flag + " '" + text + "': a byte count must be a whole number");
    if (ip.size() > 15 || fp.size() > 9)
        throw CompileError(flag + " '" + text + "': too many digits; " + kSizeHelp);
    unsigned __int128 scale = 1;
    for (size_t k = 0; k < fp.size(); ++k)
        scale *= 10;
    unsigned __int128 bytes = (unsigned __int128)std::stoull(ip) * mult +
                              (fp.empty() ? 0 : (unsigned __int128)std::stoull(fp) * mult / scale);
    if (bytes > ((unsigned __int128)1 << 62)) throw CompileError(flag + " '" + text + "' is too large");
    if (bytes == 0) throw CompileError(flag + " '" + text + "' must be more than zero bytes");
    return (uint64_t)bytes;
}

std::string size_arg(uint64_t bytes) {
    uint64_t unit = 1;
    const char* name;
    if (bytes >= (1ull << 30))
        unit = 1ull << 30, name = "GiB";
    else if (bytes >= (1ull << 20))
        unit = 1ull << 20, name = "MiB";
    else if (bytes >= (1ull << 10))
        unit = 1ull << 10, name = "KiB";
    else
        return std::to_string(bytes);
    const unsigned __int128 hundredths = ((unsigned __int128)bytes * 100 + unit - 1) / unit;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%llu.%02llu%s", (unsigned long long)(hundredths / 100),
                  (unsigned long long)(hundredths % 100), name);
    return buf;
}

GpuBudget parse_gpu_mem(const std::string& arg) {
    GpuBudget b;
    b.arg        = arg;
    size_t colon = arg.find(':');
    if (colon != std::string::npos) {
        std::string idx = trim(arg.substr(0, colon));
        if (!digits(idx) || idx.size() > 3)
            throw CompileError("--gpu-mem '" + arg +
                               "': expected SIZE or IDX:SIZE with IDX a GPU number (e.g. --gpu-mem 12GiB " +
                               "or --gpu-mem 0:12GiB)");
        b.index = std::stoi(idx);
    }
    b.bytes = parse_size(colon == std::string::npos ? arg : arg.substr(colon + 1), "--gpu-mem");
    return b;
}

PlaceSpec parse_place(const std::string& list) {
    PlaceSpec spec;
    spec.text      = list;
    bool in_layers = false, layers_seen = false;
    size_t pos = 0;
    while (pos <= list.size()) {
        size_t comma     = std::min(list.find(',', pos), list.size());
        std::string item = trim(list.substr(pos, comma - pos));
        pos              = comma + 1;
        if (item.empty())
            throw CompileError(
                "--place '" + list +
                "': empty item; expected comma-separated component=target items (components: " + kComponents +
                ")");
        size_t eq = item.find('=');
        if (eq == std::string::npos) {
            if (in_layers && std::isdigit((unsigned char)item[0])) {
                spec.layers.push_back(parse_range(item));
                continue;
            }
            throw CompileError("--place: '" + item + "' is not component=target (components: " + kComponents +
                               "; layer ranges follow layers=, e.g. layers=0-29:gpu0,30-34:cpu)");
        }
        in_layers        = false;
        std::string comp = lower(trim(item.substr(0, eq))), val = trim(item.substr(eq + 1));
        if (comp != "vision" && comp != "audio" && comp != "ple" && comp != "embed" && comp != "lm_head" &&
            comp != "layers")
            throw CompileError("--place: unknown component '" + comp + "' in '" + item +
                               "'; valid components: " + kComponents);
        if (spec.components.count(comp) || (comp == "layers" && layers_seen))
            throw CompileError("--place names " + comp + " twice; give each component once");
        if (val.empty())
            throw CompileError("--place " + item + ": missing target; expected " + comp + "=TARGET (" +
                               kTargets + ")");
        if (comp != "layers") {
            spec.components[comp] = parse_target(val, comp, item);
            continue;
        }
        layers_seen = true;
        if (std::isdigit((unsigned char)val[0])) {
            spec.layers.push_back(parse_range(val));
            in_layers = true;
        } else {
            spec.layers_all = parse_target(val, "layers", item);
        }
    }
    return spec;
}

Request parse_request(const std::vector<std::string>& gpu_mem, const std::string& cpu_mem,
                      const std::string& place) {
    Request r;
    for (const auto& g : gpu_mem)
        r.gpu_mem.push_back(parse_gpu_mem(g));
    if (!cpu_mem.empty()) {
        r.cpu_mem     = parse_size(cpu_mem, "--cpu-mem");
        r.cpu_mem_arg = cpu_mem;
    }
    if (!place.empty()) r.place = parse_place(place);
    return r;
}

Placement resolve(const Request& req, int num_layers, int cuda_index, int gpu_count) {
    Placement p;
    p.cuda_index               = cuda_index;
    p.num_layers               = num_layers;
    p.cpu_budget               = req.cpu_mem;
    p.cpu_budget_arg           = req.cpu_mem_arg;
    const std::string plan_gpu = cuda_index >= 0 ? cuda(cuda_index) : "";
    auto exists                = [&](int gpu, const std::string& flag) {
        if (gpu_count > 0 && gpu >= gpu_count)
            throw CompileError(
                               flag + ": there is no GPU " + std::to_string(gpu) + " on this machine (" +
                               std::to_string(gpu_count) + " CUDA device(s), cuda:0" +
                               (gpu_count > 1 ? "..cuda:" + std::to_string(gpu_count - 1) : "") +
                               "); name a GPU that exists, or pass --target sm_XX to compile for another machine");
    };

    if (cuda_index >= 0) exists(cuda_index, "--device " + plan_gpu);
    for (const GpuBudget& b : req.gpu_mem) {
        if (cuda_index < 0)
            throw CompileError(
                "--gpu-mem " + b.arg +
                " was given, but --device cpu compiles a CPU plan that puts nothing on a GPU; " +
                "add --device cuda[:N] to run on a GPU, or drop --gpu-mem (--cpu-mem budgets host memory)");
        const int idx = b.index < 0 ? cuda_index : b.index;
        exists(idx, "--gpu-mem " + b.arg);
        auto [it, fresh] = p.gpu_budgets.emplace(idx, b);
        if (!fresh)
            throw CompileError(
                "--gpu-mem gives two budgets for " + cuda(idx) + " ('" + it->second.arg + "' and '" + b.arg +
                "'); give one per GPU (a SIZE without IDX: is for the --device GPU, " + plan_gpu + ")");
    }
    std::string budgeted;
    for (const auto& [i, b] : p.gpu_budgets)
        budgeted += (budgeted.empty() ? "" : ", ") + cuda(i);
    // Nothing ever lands on a GPU that was not given a budget.
    auto budget_for = [&](int gpu, const std::string& what) {
        if (p.gpu_budgets.empty() || p.gpu_budgets.count(gpu)) return;
        throw CompileError(what + " would go on " + cuda(gpu) +
                           ", which has no --gpu-mem budget (budgets given for " + budgeted +
                           "); nothing ever lands on a GPU that was not given a budget: add --gpu-mem " +
                           std::to_string(gpu) + ":SIZE or place it elsewhere");
    };
    // Device index of a target (-1: host memory / the CPU).
    auto device_of = [&](const Target& t, const std::string& item) {
        if (t.kind != Target::Kind::Gpu) return -1;
        if (cuda_index < 0)
            throw CompileError(
                "--place " + item +
                " puts it on a GPU, but --device cpu compiles a CPU plan; add --device cuda[:N] " +
                "or place it on cpu");
        const int gpu = t.gpu < 0 ? cuda_index : t.gpu;
        exists(gpu, "--place " + item);
        return gpu;
    };

    // Text layers: ranges must cover 0..num_layers-1 exactly once.
    std::vector<LayerRange> ranges = req.place.layers;
    std::string layers_item = "layers=" + (req.place.layers_all ? req.place.layers_all->text : std::string());
    if (!ranges.empty()) {
        layers_item = "layers=";
        for (size_t i = 0; i < ranges.size(); ++i)
            layers_item += (i ? "," : "") + ranges[i].text;
        for (const auto& r : ranges)
            if (r.last >= num_layers)
                throw CompileError("--place " + layers_item + ": range " + r.text +
                                   " goes past the model's last text layer (it has " +
                                   std::to_string(num_layers) + " layers, 0-" +
                                   std::to_string(num_layers - 1) + ")");
        std::stable_sort(ranges.begin(), ranges.end(),
                         [](const LayerRange& a, const LayerRange& b) { return a.first < b.first; });
        int next = 0;
        for (size_t i = 0; i < ranges.size(); ++i) {
            const LayerRange& r = ranges[i];
            if (r.first < next)
                throw CompileError("--place " + layers_item + ": ranges " + ranges[i - 1].text + " and " +
                                   r.text + " overlap (layer " + std::to_string(r.first) +
                                   " would have two targets); give each layer once");
            if (r.first > next)
                throw CompileError("--place " + layers_item + ": layer(s) " + span(next, r.first - 1) +
                                   " have no target; the ranges must cover 0-" +
                                   std::to_string(num_layers - 1) + " without gaps");
            next = r.last + 1;
        }
        if (next < num_layers)
            throw CompileError("--place " + layers_item + ": layer(s) " + span(next, num_layers - 1) +
                               " have no target; the ranges must cover 0-" + std::to_string(num_layers - 1) +
                               " without gaps");
    } else if (req.place.layers_all) {
        ranges.push_back({0, num_layers - 1, *req.place.layers_all, req.place.layers_all->text});
    }
    std::set<int> layer_devices;
    for (const auto& r : ranges) {
        int d = device_of(r.target, layers_item);
        if (d >= 0) budget_for(d, "text layers " + span(r.first, r.last) + " (--place " + layers_item + ")");
        layer_devices.insert(d);
    }
    if (ranges.empty()) {
        layer_devices.insert(cuda_index);
        if (cuda_index >= 0) budget_for(cuda_index, "the text layers (--device " + plan_gpu + ")");
    }
    // Layers on several devices: the copy steps of compiler/cross_device.h join them.
    if (layer_devices.size() > 1) {
        p.layer_device.assign(num_layers, cuda_index);
        for (const auto& r : ranges)
            for (int l = r.first; l <= r.last; ++l)
                p.layer_device[l] = device_of(r.target, layers_item);
    } else {
        const int layers_on = *layer_devices.begin();
        if (layers_on != cuda_index) {
            if (layers_on < 0)
                throw CompileError("--place " + layers_item +
                                   " puts the text layers on the CPU, but --device " + plan_gpu +
                                   " compiles a CUDA plan; use --device cpu to run them on the CPU");
            throw CompileError("--place " + layers_item + " puts the text layers on " + cuda(layers_on) +
                               ", but the plan's GPU is " + plan_gpu + "; use --device " + cuda(layers_on) +
                               " (the plan's GPU also runs the embeddings and the LM head)");
        }
    }

    for (const char* c : {"embed", "lm_head"}) {
        auto it = req.place.components.find(c);
        if (it == req.place.components.end()) continue;
        const std::string item = std::string(c) + "=" + it->second.text;
        int d                  = device_of(it->second, item);
        if (d >= 0) budget_for(d, std::string(c) + " (--place " + item + ")");
        if (d != cuda_index)
            throw CompileError("not supported by this build yet: --place " + item + " (the " +
                               (std::string(c) == "embed" ? "embedding lookup" : "LM head") +
                               " runs with the text layers, on " + plan_gpu + "); drop it or use " + c +
                               "=gpu");
    }

    auto ple = req.place.components.find("ple");
    if (ple != req.place.components.end()) {
        const Target& t        = ple->second;
        const std::string item = "ple=" + t.text;
        if (cuda_index < 0) {
            device_of(t, item);
            if (t.kind == Target::Kind::Host)
                p.notes.push_back("ple=host: a CPU plan keeps everything in host memory already");
        } else if (t.kind == Target::Kind::Host) {
            p.ple_host = true;
        } else if (t.kind == Target::Kind::Cpu) {
            throw CompileError(
                "not supported by this build yet: --place ple=cpu (the per-layer embeddings are computed "
                "on " +
                plan_gpu + "); use ple=host to keep the table in pinned host memory and gather from there");
        } else {
            int d = device_of(t, item);
            budget_for(d, "the PLE table (--place " + item + ")");
            if (d != cuda_index)
                throw CompileError("not supported by this build yet: --place " + item +
                                   " (the PLE table lives on the text layers' " + "GPU, " + plan_gpu +
                                   ", or in host memory with ple=host)");
        }
    } else {
        p.ple_auto = cuda_index >= 0 && p.gpu_budgets.count(cuda_index) > 0;
    }

    for (const char* c : {"vision", "audio"}) {
        auto it = req.place.components.find(c);
        if (it == req.place.components.end()) continue;
        const std::string item = std::string(c) + "=" + it->second.text;
        int d                  = device_of(it->second, item);
        if (d >= 0) budget_for(d, std::string("the ") + c + " tower (--place " + item + ")");
        if (d >= 0 && d != cuda_index)
            throw CompileError("not supported by this build: --place " + item + " (the " + c +
                               " tower runs on the plan's GPU, " + plan_gpu + ", or on the CPU: " + c +
                               "=gpu or " + c + "=cpu)");
        p.towers[c] = it->second.text;
        if (d >= 0) (std::string(c) == "vision" ? p.vision_gpu : p.audio_gpu) = true;
        p.notes.push_back(item + ": the " + c + " tower runs on " +
                          (d >= 0 ? plan_gpu : std::string("the CPU")));
    }
    p.vision_auto = cuda_index >= 0 && !req.place.components.count("vision");
    p.audio_auto  = cuda_index >= 0 && !req.place.components.count("audio");
    if (!p.gpu_budgets.empty()) {
        std::string unused;
        const std::vector<int> used = p.gpus();
        for (const auto& [i, b] : p.gpu_budgets)
            if (std::find(used.begin(), used.end(), i) == used.end())
                unused += (unused.empty() ? "" : ", ") + cuda(i) + " (--gpu-mem " + b.arg + ")";
        p.notes.push_back(
            "nothing is placed on a GPU without a --gpu-mem budget" +
            (unused.empty() ? std::string() : "; nothing is placed on " + unused) +
            (gpu_count < 0 ? "; GPU indices were not checked against this machine (no GPU queried)" : ""));
    }
    return p;
}

bool Placement::has_cpu_layers() const {
    return std::any_of(layer_device.begin(), layer_device.end(), [](int d) { return d < 0; });
}

std::vector<int> Placement::gpus() const {
    std::vector<int> out;
    if (cuda_index < 0) return out;
    out.push_back(cuda_index);
    std::set<int> rest(layer_device.begin(), layer_device.end());
    for (int d : rest)
        if (d >= 0 && d != cuda_index) out.push_back(d);
    return out;
}

uint64_t DeviceMemory::need() const {
    uint64_t n = per_thread * (uint64_t)std::max(0, threads) * (uint64_t)std::max(1, sessions);
    for (const auto& pr : parts)
        n += pr.second;
    return n;
}

std::vector<DeviceMemory> memory_plan(const Figures& f, const Placement& p, bool ple_host, int threads) {
    std::vector<DeviceMemory> out;
    const std::string kv = f.kv_dtype.empty() ? "KV cache" : "KV cache (" + f.kv_dtype + ")";
    const int n          = std::max(1, p.sessions);
    // A part every session holds: n times, named with the count.
    auto each = [&](const std::string& what, uint64_t bytes) {
        return std::pair<std::string, uint64_t>{n > 1 ? what + " (" + std::to_string(n) + " sessions)" : what,
                                                bytes * (uint64_t)n};
    };
    auto cpu_budget = [&](DeviceMemory& d) {
        if (p.cpu_budget) d.budget = p.cpu_budget, d.budget_flag = "--cpu-mem " + p.cpu_budget_arg;
    };
    if (p.cuda_index < 0) {
        DeviceMemory c;
        c.device = "cpu";
        c.parts  = {{"weights", f.weights - f.tower_weights},
                    each("activations", f.activations),
                    each(kv, f.kv_cache)};
        if (f.tower_weights)
            c.parts.push_back({"towers' weights", f.tower_weights}),
                c.parts.push_back(each("towers' buffers", f.tower_buffers));
        if (f.encoder_arenas) c.parts.push_back(each("encoder programs' activations", f.encoder_arenas));
        if (p.lm_screen && f.lm_screen) c.parts.push_back({"LM head screening copy", f.lm_screen});
        c.per_thread = f.scratch_per_thread;
        c.threads    = threads;
        c.sessions   = n;
        cpu_budget(c);
        return {c};
    }
    std::map<int, DeviceMemory> gpu;
    DeviceMemory& g = gpu[p.cuda_index];
    // Moved from the host to the plan's GPU; with both towers there, the alignment padding between their
    // ranges goes too (no host part is left).
    const uint64_t on_gpu = p.vision_gpu && p.audio_gpu
                                ? f.tower_weights
                                : (p.vision_gpu ? f.vision_weights : 0) + (p.audio_gpu ? f.audio_weights : 0);
    if (f.gpus.empty()) {
        g.parts = {{"weights", f.weights - f.host_weights - f.tower_weights - (ple_host ? f.ple_table : 0)},
                   each("activations", f.activations),
                   each(kv, f.kv_cache - f.host_kv),
                   each("workspaces", f.attention_workspace)};
    } else {
        for (const auto& [i, x] : f.gpus)
            gpu[i].parts = {{"weights", x.weights - (i == p.cuda_index && ple_host ? f.ple_table : 0)},
                            each("activations", f.activations),
                            each(kv, x.kv),
                            each("workspaces", x.workspace)};
    }
    // A tower on the GPU: its weights and a session's buffers as one part; with more sessions, the buffers
    // as a part of their own.
    auto tower = [&](const std::string& what, uint64_t weights, uint64_t buffers) {
        auto& parts = gpu[p.cuda_index].parts;
        if (n == 1) return parts.push_back({what, weights + buffers});
        parts.push_back({what, weights});
        parts.push_back(each(what + "'s buffers", buffers));
    };
    if (p.vision_gpu) tower("vision tower", f.vision_weights, f.vision_gpu_buffers);
    if (p.audio_gpu) tower("audio tower", f.audio_weights, f.audio_gpu_buffers);
    if (p.lm_screen && f.lm_screen) {
        gpu[p.cuda_index].parts.push_back({"LM head screening copy", f.lm_screen});
        if (f.lm_screen_session)
            gpu[p.cuda_index].parts.push_back(each("LM head screening bounds", f.lm_screen_session));
    }
    DeviceMemory h;
    h.device = "host";
    h.parts  = {each("pinned buffers", f.pinned)};
    if (ple_host) h.parts.push_back({"PLE table", f.ple_table});
    if (f.tower_weights > on_gpu) h.parts.push_back({"towers' weights", f.tower_weights - on_gpu});
    if (f.tower_weights) // queues, inputs and scratch stay on the host wherever the towers run
        h.parts.push_back(each("towers' buffers", p.vision_gpu && p.audio_gpu ? f.tower_buffers_both_gpu
                                                  : p.vision_gpu              ? f.tower_buffers_vision_gpu
                                                  : p.audio_gpu               ? f.tower_buffers_audio_gpu
                                                                              : f.tower_buffers));
    const uint64_t arenas =
        (p.vision_gpu ? f.audio_arena : f.encoder_arenas) - (p.audio_gpu ? f.audio_arena : 0);
    if (arenas) h.parts.push_back(each("encoder programs' activations", arenas));
    if (p.has_cpu_layers()) {
        h.parts.push_back({"CPU layers' weights", f.host_weights});
        h.parts.push_back(each("CPU layers' " + kv, f.host_kv));
        h.parts.push_back(each("activations (pinned)", f.host_activations));
        h.per_thread = f.host_scratch_per_thread;
        h.threads    = threads;
        h.sessions   = n;
    }
    cpu_budget(h);
    for (const auto& [i, b] : p.gpu_budgets) {
        gpu[i].budget      = b.bytes;
        gpu[i].budget_flag = "--gpu-mem " + b.arg;
    }
    for (auto& [i, d] : gpu)
        d.device = cuda(i);
    out.push_back(gpu[p.cuda_index]);
    for (const auto& [i, d] : gpu)
        if (i != p.cuda_index) out.push_back(d);
    out.push_back(h);
    return out;
}

namespace {
struct NoFit {}; // decide_fixed(quick): the placement does not fit (no message built)

Decision decide_fixed(const Placement& p, const Figures& f, int max_context,
                      const std::function<Figures(int)>& figures_at, int threads, bool quick);
} // namespace

// With vision_auto / audio_auto, a tower goes on the GPU when it fits there. The PLE table on the GPU comes
// first (it is read every token, a tower once an image or clip), then the vision tower, then the audio tower:
// the tower placements are tried in the order both, vision alone, audio alone, neither (varying only the
// automatic towers), first with the PLE table on the GPU, then with it in host memory.
namespace {
Decision decide_towers(const Placement& p, const Figures& f, int max_context,
                       const std::function<Figures(int)>& figures_at, int threads) {
    if (!p.vision_auto && !p.audio_auto) return decide_fixed(p, f, max_context, figures_at, threads, false);
    std::vector<Placement> tries;
    for (bool v : p.vision_auto ? std::vector<bool>{true, false} : std::vector<bool>{p.vision_gpu})
        for (bool a : p.audio_auto ? std::vector<bool>{true, false} : std::vector<bool>{p.audio_gpu}) {
            Placement q   = p;
            q.vision_gpu  = v;
            q.audio_gpu   = a;
            q.vision_auto = q.audio_auto = false;
            tries.push_back(q);
        }
    std::vector<std::optional<Decision>> fit(tries.size());
    for (size_t i = 0; i < tries.size(); ++i) {
        try {
            fit[i] = decide_fixed(tries[i], f, max_context, figures_at, threads, true);
        } catch (const NoFit&) {
        }
    }
    std::optional<Decision> d;
    for (size_t i = 0; i < tries.size() && !d; ++i) // the PLE table on the GPU where ple_auto lets it choose
        if (fit[i] && (!p.ple_auto || !fit[i]->placement.ple_host)) d = fit[i];
    for (size_t i = 0; i < tries.size() && !d; ++i)
        if (fit[i]) d = fit[i];
    if (!d)
        return decide_fixed(tries.back(), f, max_context, figures_at, threads,
                            false); // throws the refusal with its figures
    Placement& q = d->placement;
    // Why an automatic tower stayed on the CPU: what the chosen placement needs with it on the GPU too (the
    // vision tower goes first: an automatic audio tower is not counted beside it).
    auto why = [&](bool vision) {
        Placement w                           = q;
        (vision ? w.vision_gpu : w.audio_gpu) = true;
        if (vision && p.audio_auto) w.audio_gpu = false;
        const bool beside    = vision ? w.audio_gpu : w.vision_gpu;
        const DeviceMemory g = memory_plan(f, w, q.ple_host, threads)[0];
        const std::string on =
            "with it on " + g.device +
            (beside ? std::string(" beside the ") + (vision ? "audio" : "vision") + " tower" : "");
        return g.budget && g.need() > *g.budget
                   ? on + " the plan needs " + human(g.need()) + " but " + g.budget_flag + " was given"
                   : on + " the plan does not fit the budgets given";
    };
    for (bool vision : {true, false}) {
        if (!(vision ? p.vision_auto : p.audio_auto)) continue;
        const std::string c = vision ? "vision" : "audio";
        if (vision ? q.vision_gpu : q.audio_gpu)
            q.notes.push_back("the " + c + " tower runs on " + cuda(p.cuda_index) +
                              " (chosen automatically: it fits; --place " + c + "=cpu keeps it on the CPU)");
        else
            (vision ? q.vision_why : q.audio_why) = why(vision);
    }
    return *d;
}
} // namespace

// The placement first (decide_towers), then the LM head's screening copy where it fits beside it: it speeds
// up greedy decode steps but is the first thing to give up under a budget.
Decision decide(const Placement& p, const Figures& f, int max_context,
                const std::function<Figures(int)>& figures_at, int threads) {
    Decision d  = decide_towers(p, f, max_context, figures_at, threads);
    Placement q = d.placement;
    if (!f.lm_screen || q.has_cpu_layers() || q.gpus().size() > 1) return d;
    q.lm_screen                         = true;
    std::vector<DeviceMemory> with_copy = memory_plan(f, q, q.ple_host, threads);
    const DeviceMemory& g               = with_copy[0];
    if (g.budget && g.need() > *g.budget) {
        d.placement.notes.push_back("decode steps compute every logit: the LM head's int8 screening copy (" +
                                    human(f.lm_screen) + ") does not fit " + g.budget_flag +
                                    " beside the plan (" + budget_flag_for(g, g.need()) + " would fit it)");
        return d;
    }
    d.placement = q;
    d.memory    = std::move(with_copy);
    return d;
}

namespace {
Decision decide_fixed(const Placement& p, const Figures& f, int max_context,
                      const std::function<Figures(int)>& figures_at, int threads, bool quick) {
    const std::vector<bool> tries =
        p.ple_auto ? std::vector<bool>{false, true} : std::vector<bool>{p.ple_host};
    std::vector<std::vector<DeviceMemory>> tried;
    for (bool ph : tries) {
        auto mem = memory_plan(f, p, ph, threads);
        if (over_budget(mem).empty()) {
            Decision d{p, std::move(mem)};
            d.placement.ple_host = ph;
            if (p.ple_auto && ph) {
                const DeviceMemory& g = *over_budget(tried[0])[0];
                d.placement.ple_why   = "chosen automatically: with it on " + g.device + " the plan needs " +
                                      human(g.need()) + " but " + g.budget_flag + " was given";
            }
            return d;
        }
        tried.push_back(std::move(mem));
    }
    if (quick) throw NoFit{};

    // Refused: both figures, the smallest budget that fits, and the --max-context that would.
    std::string msg;
    for (const DeviceMemory* d : over_budget(tried[0]))
        msg += (msg.empty() ? "" : "; ") + d->device + " needs " + human(d->need()) + " (" + parts_text(*d) +
               ") but " + d->budget_flag + " was given";
    if (tried.size() > 1) {
        std::string alt;
        for (const DeviceMemory* d : over_budget(tried[1]))
            alt +=
                (alt.empty() ? "" : " and ") + d->device + " needs " + human(d->need()) +
                (d->device == "host" ? " (" + parts_text(*d) + ") but " + d->budget_flag + " was given" : "");
        msg += "; with the per-layer-embedding table in host memory (ple=host, tried automatically) " + alt;
    }
    // A try that fails on one device alone fits once that device's budget is raised to its need.
    std::map<std::string, std::pair<uint64_t, size_t>> best; // device -> (need, try)
    for (size_t t = 0; t < tried.size(); ++t) {
        auto over = over_budget(tried[t]);
        if (over.size() != 1) continue;
        auto it = best.find(over[0]->device);
        if (it == best.end() || over[0]->need() < it->second.first)
            best[over[0]->device] = {over[0]->need(), t};
    }
    auto with = [&](size_t t) {
        return !p.ple_auto ? "" : tries[t] ? " with ple=host" : " with the PLE table on the GPU";
    };
    std::string smallest;
    for (const auto& [dev, nb] : best) {
        const DeviceMemory* d = nullptr;
        for (const auto& m : tried[nb.second])
            if (m.device == dev) d = &m;
        smallest += (smallest.empty() ? "" : " or ") + budget_flag_for(*d, nb.first) + " (" +
                    std::to_string(nb.first) + " bytes)" + with(nb.second);
    }
    if (smallest.empty())
        for (const DeviceMemory* d : over_budget(tried.back()))
            smallest += (smallest.empty() ? "" : " and ") + budget_flag_for(*d, d->need()) + " (" +
                        std::to_string(d->need()) + " bytes)" + with(tried.size() - 1);
    msg += "; the smallest budget that fits this plan is " + smallest;

    const std::string dev0 = over_budget(tried.back())[0]->device;
    auto fits_at           = [&](int n, std::vector<DeviceMemory>* chosen, size_t* which) {
        Figures g = figures_at(n);
        for (size_t t = 0; t < tries.size(); ++t) {
            auto mem = memory_plan(g, p, tries[t], threads);
            if (over_budget(mem).empty()) {
                if (chosen) *chosen = std::move(mem), *which = t;
                return true;
            }
        }
        return false;
    };
    if (max_context > 1) {
        if (fits_at(1, nullptr, nullptr)) {
            int lo = 1, hi = max_context - 1;
            while (lo < hi) {
                int mid = lo + (hi - lo + 1) / 2;
                if (fits_at(mid, nullptr, nullptr))
                    lo = mid;
                else
                    hi = mid - 1;
            }
            if (lo >= 1024 && fits_at(lo / 256 * 256, nullptr, nullptr)) lo = lo / 256 * 256;
            std::vector<DeviceMemory> mem;
            size_t which = 0;
            fits_at(lo, &mem, &which);
            for (const auto& m : mem)
                if (m.device == dev0)
                    msg += " (or reduce --max-context: at --max-context " + std::to_string(lo) + " " + dev0 +
                           " needs " + human(m.need()) + with(which) + ")";
        } else {
            Figures g      = figures_at(1);
            uint64_t least = UINT64_MAX;
            for (bool ph : tries)
                for (const auto& m : memory_plan(g, p, ph, threads))
                    if (m.device == dev0) least = std::min(least, m.need());
            msg += " (reducing --max-context does not help: even at --max-context 1 " + dev0 + " needs " +
                   human(least) + ")";
        }
    }
    throw CompileError(msg);
}
} // namespace

bool layers_placed(const Request& req) {
    return !req.place.layers.empty() || req.place.layers_all.has_value();
}

std::optional<Placement> split_layers(const Placement& p,
                                      const std::function<Figures(const std::vector<int>&)>& figures_for,
                                      int threads) {
    std::vector<int> gpus{p.cuda_index};
    for (const auto& [i, b] : p.gpu_budgets)
        if (i != p.cuda_index) gpus.push_back(i);
    if (p.cuda_index < 0 || p.hybrid() || gpus.size() < 2 || !p.gpu_budgets.count(p.cuda_index))
        return std::nullopt;
    const int n = p.num_layers;
    for (bool ph : p.ple_auto ? std::vector<bool>{false, true} : std::vector<bool>{p.ple_host}) {
        auto fits = [&](const std::vector<int>& layer_device, int gpu) { // gpu: one GPU, or -2 every device
            Placement q    = p;
            q.layer_device = layer_device;
            for (const DeviceMemory& d : memory_plan(figures_for(layer_device), q, ph, threads))
                if ((gpu == -2 || d.device == cuda(gpu)) && d.budget && d.need() > *d.budget) return false;
            return true;
        };
        std::vector<int> ld(n, gpus[0]);
        int first = 0;
        bool ok   = true;
        for (size_t g = 0; g + 1 < gpus.size() && ok; ++g) {
            // The most layers [first, k) GPU g holds with the rest on the next GPU.
            auto with = [&](int k) {
                std::vector<int> v = ld;
                for (int l = first; l < n; ++l)
                    v[l] = l < k ? gpus[g] : gpus[g + 1];
                return v;
            };
            if (!fits(with(first), gpus[g])) {
                ok = false;
                break;
            }
            int lo = first, hi = n - 1; // with(lo) fits gpus[g]; at least one layer moves on
            while (lo < hi) {
                const int mid = lo + (hi - lo + 1) / 2;
                if (fits(with(mid), gpus[g]))
                    lo = mid;
                else
                    hi = mid - 1;
            }
            ld    = with(lo);
            first = lo;
        }
        if (ok && fits(ld, -2)) {
            Placement q    = p;
            q.layer_device = ld;
            q.ple_auto     = false;
            q.ple_host     = ph;
            std::string r;
            for (int l = 0; l < n;) {
                int e = l;
                while (e + 1 < n && ld[e + 1] == ld[l])
                    ++e;
                r += (r.empty() ? "" : ",") + span(l, e) + ":gpu" + std::to_string(ld[l]);
                l = e + 1;
            }
            for (std::string& note : q.notes) { // the GPUs that now hold layers are no longer unused
                const size_t a = note.find("; nothing is placed on cuda:");
                if (a == std::string::npos) continue;
                const size_t b = note.find("; GPU indices", a);
                std::string unused;
                for (const auto& [i, bud] : p.gpu_budgets)
                    if (std::find(ld.begin(), ld.end(), i) == ld.end() && i != p.cuda_index)
                        unused += (unused.empty() ? "" : ", ") + cuda(i) + " (--gpu-mem " + bud.arg + ")";
                note = note.substr(0, a) + (unused.empty() ? "" : "; nothing is placed on " + unused) +
                       (b == std::string::npos ? "" : note.substr(b));
            }
            q.notes.push_back(
                "the plan does not fit " + cuda(p.cuda_index) + "'s budget" +
                (ph ? " even with ple=host" : "") +
                ", so its text layers are split across the budgeted GPUs (as --place layers=" + r +
                (ph ? ",ple=host" : "") + "; the split costs a few percent of decode speed)");
            return q;
        }
    }
    return std::nullopt;
}

void Decision::to_meta(plan::Meta* m) const {
    const Placement& p    = placement;
    const std::string dev = p.cuda_index >= 0 ? cuda(p.cuda_index) : "cpu";
    plan::MetaPlacement pl;
    auto on = [&](int l) { return !p.hybrid() ? p.cuda_index : p.layer_device[l]; };
    for (int l = 0; l < p.num_layers;) { // maximal ranges of one device
        int e = l;
        while (e + 1 < p.num_layers && on(e + 1) == on(l))
            ++e;
        pl.layers.push_back({l, e, p.cuda_index < 0 ? "cpu" : on(l) < 0 ? "cpu" : cuda(on(l))});
        l = e + 1;
    }
    pl.device         = dev;
    pl.embed          = dev;
    pl.lm_head        = dev;
    pl.ple            = p.ple_host ? "host" : "device";
    pl.ple_auto       = p.ple_auto;
    pl.vision         = p.tower_where.count("vision") ? p.tower_where.at("vision") : "not compiled";
    pl.audio          = p.tower_where.count("audio") ? p.tower_where.at("audio") : "not compiled";
    pl.lm_head_screen = p.lm_screen;
    pl.sessions       = p.sessions;
    m->placement      = pl;
    m->memory.clear();
    for (const DeviceMemory& d : memory)
        m->memory.push_back({d.device, d.parts, d.per_thread, d.budget});
}

std::string Decision::placement_line() const {
    const Placement& p = placement;
    std::string layers = "text layers " + span(0, p.num_layers - 1);
    std::string s;
    if (p.cuda_index < 0) {
        s = "everything on the CPU (" + layers + ", embed, lm_head, PLE table)";
    } else {
        const std::string dev = cuda(p.cuda_index);
        if (p.hybrid()) {
            std::map<int, std::string> by; // device -> its layer ranges
            for (int l = 0; l < p.num_layers;) {
                int e = l;
                while (e + 1 < p.num_layers && p.layer_device[e + 1] == p.layer_device[l])
                    ++e;
                std::string& to = by[p.layer_device[l]];
                to += (to.empty() ? "" : ",") + span(l, e);
                l = e + 1;
            }
            layers.clear();
            for (const auto& [d, r] : by) // GPUs in index order, then the CPU
                if (d >= 0)
                    layers +=
                        (layers.empty() ? "" : ", ") + std::string("text layers ") + r + " on " + cuda(d);
            if (by.count(-1)) layers += ", text layers " + by[-1] + " on the CPU";
            layers += " (copy steps between them)";
        }
        s = layers + ", embed and lm_head on " + dev + "; PLE table " +
            (p.ple_host
                 ? "in pinned host memory (ple=host" + (p.ple_why.empty() ? "" : ", " + p.ple_why) + ")"
                 : "on " + dev + (p.ple_auto ? " (chosen automatically: it fits the budget)" : ""));
    }
    auto where = [&](const char* c) {
        return p.tower_where.count(c) ? p.tower_where.at(c) : std::string("not compiled");
    };
    return s + "; vision tower: " + where("vision") + ", audio tower: " + where("audio");
}

void print_memory(std::ostream& out, const std::vector<DeviceMemory>& mem, const std::string& indent) {
    char line[1024];
    std::snprintf(line, sizeof line, "%s%-8s %-12s %-12s %s\n", indent.c_str(), "device", "needs", "budget",
                  "holds");
    out << line;
    for (const DeviceMemory& d : mem) {
        std::string need   = human(d.need()) + (d.per_thread && d.threads <= 0 ? "+" : "");
        std::string budget = d.budget ? human(*d.budget) : "-";
        std::snprintf(line, sizeof line, "%s%-8s %-12s %-12s %s\n", indent.c_str(), d.device.c_str(),
                      need.c_str(), budget.c_str(), parts_text(d).c_str());
        out << line;
    }
}

} // namespace g4::placement
