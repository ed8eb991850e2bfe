// g4: the command-line tool. `g4 compile` turns a Hugging Face checkpoint into a plan (compiler);
// `g4 run` replays a plan through the C API (runtime/include/g4/g4.h); `g4 inspect` prints a plan.
// Every failure prints one line "g4 <command>: error: ..." on stderr and exits non-zero.
#include "compiler/compile.h"
#include "compiler/error.h"
#include "compiler/output_file.h"
#include "compiler/placement.h"
#include "g4/g4.h"
#include "runtime/src/chat_template.h"
#include "runtime/src/json_fields.h"
#include "runtime/src/plan/plan_reader.h"
#include "runtime/src/tokenizer.h"
#include "tools/audio_io.h"
#include "tools/image_io.h"
#include "tools/media_decode.h"
#include "tools/prompt_media.h"
#include "tools/read_file.h"
#include "tools/video_decode.h"

#include <algorithm>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

std::string join_ids(const std::vector<int32_t>& ids) {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) line.push_back(',');
        line.append(std::to_string(ids[i]));
    }
    return line;
}

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

const char* kUsage =
    "usage:\n"
    "  g4 compile --model DIR [--adapter DIR] [--weights nf4|bf16|f32] [--device cpu|cuda[:N]] [--target "
    "sm_XX]\n"
    "             [--quantize REGEX] [--keep REGEX] [--double-quant] [--no-fidelity] [--prefill-precision "
    "bf16|fp32] [--dry-run]\n"
    "             [--deterministic]   (CUDA: decode sums in a fixed order, bit-identical runs; sm_90 decode "
    "~3-4% slower)\n"
    "             [--mlp-precision f16|f32]   (sm_90 decode MLP products: packed f16 (default; ~1e-3 "
    "relative error an\n"
    "              MLP, E2B decode ~5% faster) or f32 (~5e-7))\n"
    "             [--mlp-replicas auto|1|2|3|4] [--ple-fold on|off] [--mlp-fold one-wave|all|off]   (sm_90 "
    "decode schedule,\n"
    "              for measuring one form against another: the fused MLP's output replicas (auto: by shape), "
    "the ResNorm\n"
    "              before a PLE in the PLE's kernel, the one before a packed-f16 MLP in the MLP's kernel "
    "(one-wave: where\n"
    "              the MLP's blocks run in one wave); the defaults are the fastest measured)\n"
    "             [--kernel-trace off|launches|blocks]   (CUDA kernels that record timers for "
    "bench/scripts/trace_summary.py,\n"
    "              G4_TRACE_OUT names the file; ~8% slower, never for use)\n"
    "             [--kv-dtype bf16|f32] [--max-context N] [--chunk N] [--logits-rows N] [--gpu-mem "
    "[IDX:]SIZE]... [--cpu-mem SIZE]\n"
    "             [--place COMPONENT=TARGET,...] [--no-vision] [--no-audio] [--image-tokens "
    "70|140|280|560|1120]\n"
    "             [--max-image-pixels N] [--max-audio-seconds S] [--max-media-tokens N] [--tower-precision "
    "fp32|bf16] -o PLAN\n"
    "             (--place components: vision, audio, ple, embed, lm_head, layers; targets: cpu, gpu, gpuN, "
    "cuda:N,\n"
    "              host (ple only); layers=0-29:gpu0,30-34:cpu gives ranges; sizes: 12GiB, 4GB, 512MiB, "
    "3.5GiB)\n"
    "  g4 run PLAN (-p TEXT | --tokens 2,17,99 | --tokens @FILE) [-n N] [--temp T] [--top-k K] [--top-p P] "
    "[--min-p P]\n"
    "             [--repeat-penalty R] [--repeat-last-n N] [--seed S] [--stop STR]... [--ignore-eos]\n"
    "             [--print-ids] [--dump-logits FILE] [--dump-decode-logits FILE] [--truncate] [--threads N] "
    "[--stats]\n"
    "             (--dump-logits: the prompt's logits [prompt, vocab] f32; --dump-decode-logits: the logits "
    "each\n"
    "              generated token was chosen from [generated, vocab] f32; it turns off CUDA decode-ahead)\n"
    "             [--image FILE]... [--audio FILE]... [--video FILE]...   (plans with the vision / audio "
    "tower; with -p\n"
    "              each goes at the next <|image|> / <|audio|> / <|video|> of the text, else after <bos>)\n"
    "  g4 chat PLAN [--system TEXT] [-n N] [sampling options as for run] [--print-ids] [--stats] [--image "
    "FILE]...\n"
    "             [--audio FILE]...   (--image / --audio go with the first message; typed commands: "
    "/image FILE and\n"
    "              /audio FILE attach a file to the next message, /reset starts over, /exit quits)\n"
    "  g4 bench PLAN [-p 512,4096] [-n 128] [-d 0,4096] [-r 3] [--threads N] [--json]\n"
    "             (warm, one process: prompt processing of each -p length, then -n greedy decode steps after "
    "a\n"
    "              prompt of each -d depth; medians of -r repetitions after one warm-up of each)\n"
    "  g4 tokenize --tokenizer FILE|PLAN [--add-special] -- TEXT\n"
    "  g4 inspect PLAN [--verify] [--ops] [--tensors]\n"
    "             (--verify: the weights' checksum too; every other section's checksum and every\n"
    "              record are checked whenever a plan is opened)\n"
    "outputs (-o, --dump-logits, --dump-decode-logits): written to a temporary file beside the target,\n"
    "  then renamed over it; a symbolic link is followed (the file it names is replaced, the link stays);\n"
    "  a directory, device (/dev/null too), FIFO or socket is refused. A failing command leaves an\n"
    "  existing target as it was.\n";

// Minimal flag parser: flags with values, boolean flags, positionals.
struct Args {
    std::vector<std::string> pos;
    std::map<std::string, std::string> val;
    std::map<std::string, bool> flag;
    std::map<std::string, std::vector<std::string>> multi; // every value of a repeated option
    std::vector<std::pair<std::string, std::string>> seq;  // every valued option, in command-line order

    Args(int argc, char** argv, int first, const std::vector<std::string>& with_value,
         const std::vector<std::string>& bools) {
        auto is = [](const std::vector<std::string>& v, const std::string& s) {
            for (auto& x : v)
                if (x == s) return true;
            return false;
        };
        for (int i = first; i < argc; ++i) {
            std::string a = argv[i];
            if (a == "--") { // everything after is positional
                for (++i; i < argc; ++i)
                    pos.push_back(argv[i]);
                break;
            }
            if (a.size() > 1 && a[0] == '-') {
                std::string v;
                size_t eq        = a.find('=');
                bool inline_val  = eq != std::string::npos && a.rfind("--", 0) == 0;
                std::string name = inline_val ? a.substr(0, eq) : a;
                if (is(with_value, name)) {
                    if (inline_val)
                        v = a.substr(eq + 1);
                    else if (i + 1 < argc)
                        v = argv[++i];
                    else
                        throw UsageError("option " + name + " needs a value");
                    val[name] = v;
                    multi[name].push_back(v);
                    seq.emplace_back(name, v);
                } else if (is(bools, name) && !inline_val) {
                    flag[name] = true;
                } else {
                    throw UsageError("unknown option " + a);
                }
            } else {
                pos.push_back(a);
            }
        }
    }
    bool has(const std::string& k) const { return val.count(k) > 0; }
    std::string get(const std::string& k, const std::string& def = "") const {
        return has(k) ? val.at(k) : def;
    }
};

long long parse_int(const std::string& name, const std::string& s, long long lo, long long hi) {
    char* end   = nullptr;
    errno       = 0;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end || errno || v < lo || v > hi)
        throw UsageError(name + " must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                         " (got '" + s + "')");
    return v;
}

double parse_float(const std::string& name, const std::string& s) {
    char* end = nullptr;
    double v  = std::strtod(s.c_str(), &end);
    if (s.empty() || *end) throw UsageError(name + " must be a number (got '" + s + "')");
    return v;
}

std::vector<int32_t> parse_tokens(const std::string& s) {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i <= s.size()) {
        size_t j = s.find(',', i);
        if (j == std::string::npos) j = s.size();
        std::string t = s.substr(i, j - i);
        while (!t.empty() && t.front() == ' ')
            t.erase(t.begin());
        while (!t.empty() && t.back() == ' ')
            t.pop_back();
        if (t.empty())
            throw UsageError("--tokens: empty entry in '" + s +
                             "' (expected comma-separated ids like 2,17,99)");
        ids.push_back((int32_t)parse_int("--tokens entry", t, 0, 0x7FFFFFFF));
        i = j + 1;
    }
    return ids;
}

struct RunError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

std::string read_whole_file(const std::string& path, const char* what) {
    std::vector<uint8_t> bytes;
    if (std::string err = g4::tools::read_file_bytes(path, what, uint64_t(1) << 32, &bytes); !err.empty())
        throw RunError(err);
    return std::string(bytes.begin(), bytes.end());
}

int cmd_compile(int argc, char** argv) {
    Args a(argc, argv, 2,
           {"--model",
            "--adapter",
            "--weights",
            "--device",
            "-o",
            "--max-context",
            "--chunk",
            "--logits-rows",
            "--quantize",
            "--keep",
            "--tokenizer",
            "--target",
            "--prefill-precision",
            "--kv-dtype",
            "--gpu-mem",
            "--cpu-mem",
            "--place",
            "--image-tokens",
            "--max-image-pixels",
            "--max-audio-seconds",
            "--max-media-tokens",
            "--tower-precision",
            "--mlp-precision",
            "--mlp-replicas",
            "--ple-fold",
            "--mlp-fold",
            "--kernel-trace"},
           {"--double-quant", "--no-fidelity", "--dry-run", "--no-vision", "--no-audio", "--deterministic"});
    if (!a.pos.empty()) throw UsageError("unexpected argument '" + a.pos[0] + "'");
    if (!a.has("--model")) throw UsageError("missing --model DIR");
    if (!a.has("-o") && !a.flag.count("--dry-run")) throw UsageError("missing -o PLAN");
    g4::CompileOptions o;
    o.model_dir   = a.get("--model");
    o.adapter_dir = a.get("--adapter");
    o.out_path    = a.get("-o");
    o.weights     = a.get("--weights", o.weights);
    o.device      = a.get("--device", o.device);
    if (a.has("--max-context"))
        o.max_context = (int)parse_int("--max-context", a.get("--max-context"), 1, 1 << 30);
    // Prefill chunk: 64 rows on the CPU; 1024 on a GPU, where tensor cores and the per-chunk NF4
    // dequantisation want long chunks (E2B/E4B activations at 1024 rows: ~190 MiB).
    if (o.device.rfind("cuda", 0) == 0) o.max_rows = 1024;
    if (a.has("--chunk")) o.max_rows = (int)parse_int("--chunk", a.get("--chunk"), 1, 8192);
    if (a.has("--logits-rows"))
        o.logits_rows = (int)parse_int("--logits-rows", a.get("--logits-rows"), 1, 8192);
    if (o.logits_rows > o.max_rows) o.logits_rows = o.max_rows;
    o.quantize_regex    = a.get("--quantize");
    o.keep_regex        = a.get("--keep");
    o.double_quant      = a.flag.count("--double-quant") > 0;
    o.fidelity          = a.flag.count("--no-fidelity") == 0;
    o.tokenizer_path    = a.get("--tokenizer");
    o.dry_run           = a.flag.count("--dry-run") > 0;
    o.cuda_target       = a.get("--target");
    o.prefill_precision = a.get("--prefill-precision", o.prefill_precision);
    o.deterministic     = a.flag.count("--deterministic") > 0;
    o.mlp_precision     = a.get("--mlp-precision", o.mlp_precision);
    o.mlp_replicas      = a.get("--mlp-replicas", o.mlp_replicas);
    o.ple_fold          = a.get("--ple-fold", o.ple_fold);
    o.mlp_fold          = a.get("--mlp-fold", o.mlp_fold);
    o.kernel_trace      = a.get("--kernel-trace", o.kernel_trace);
    o.kv_dtype          = a.get("--kv-dtype");
    if (a.has("--kv-dtype") && o.kv_dtype.empty()) throw UsageError("--kv-dtype needs a value: bf16 or f32");
    if (a.multi.count("--gpu-mem")) o.gpu_mem = a.multi.at("--gpu-mem");
    o.cpu_mem = a.get("--cpu-mem");
    if (a.multi.count("--place"))
        for (const auto& p : a.multi.at("--place"))
            o.place += (o.place.empty() ? "" : ",") + p;
    o.vision = a.flag.count("--no-vision") == 0;
    o.audio  = a.flag.count("--no-audio") == 0;
    if (a.has("--image-tokens"))
        o.image_tokens = (int)parse_int("--image-tokens", a.get("--image-tokens"), 1, 1 << 20);
    if (a.has("--max-image-pixels"))
        o.max_image_pixels = parse_int("--max-image-pixels", a.get("--max-image-pixels"), 1, 1ll << 32);
    if (a.has("--max-audio-seconds"))
        o.max_audio_seconds = parse_float("--max-audio-seconds", a.get("--max-audio-seconds"));
    o.tower_precision = a.get("--tower-precision", o.tower_precision);
    if (a.has("--max-media-tokens"))
        o.max_media_tokens = (int)parse_int("--max-media-tokens", a.get("--max-media-tokens"), 1, 1 << 30);
    g4::compile_plan(o, std::cerr);
    return 0;
}

void check(g4_status st) {
    if (st != G4_OK) throw RunError(g4_last_error_message());
}

struct Engine {
    g4_engine* e = nullptr;
    g4_engine_info info{};
    ~Engine() { g4_engine_close(e); }
};
struct Session {
    g4_session* s = nullptr;
    ~Session() { g4_session_destroy(s); }
};

const std::vector<std::string> kSamplingOpts = {
    "-n",     "--temp",    "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--repeat-last-n",
    "--seed", "--threads", "--stop"};

void open_engine(const std::string& path, Engine* e) {
    check(g4_engine_open(path.c_str(), nullptr, &e->e));
    check(g4_engine_get_info(e->e, &e->info));
}

g4_sampling_params sampling_from_args(const Args& a, g4_engine* eng) {
    g4_sampling_params sp;
    check(g4_sampling_params_from_plan(eng, &sp));
    if (a.has("--temp")) sp.temperature = (float)parse_float("--temp", a.get("--temp"));
    if (a.has("--top-k")) sp.top_k = (int32_t)parse_int("--top-k", a.get("--top-k"), 0, 1 << 30);
    if (a.has("--top-p")) sp.top_p = (float)parse_float("--top-p", a.get("--top-p"));
    if (a.has("--min-p")) sp.min_p = (float)parse_float("--min-p", a.get("--min-p"));
    if (a.has("--repeat-penalty"))
        sp.repeat_penalty = (float)parse_float("--repeat-penalty", a.get("--repeat-penalty"));
    if (a.has("--repeat-last-n"))
        sp.repeat_last_n = (int32_t)parse_int("--repeat-last-n", a.get("--repeat-last-n"), -1, 1 << 30);
    if (a.has("--seed")) sp.seed = (uint64_t)parse_int("--seed", a.get("--seed"), 0, (long long)9e18);
    // Checked here, before any prompt runs or output is written (the plan's own defaults were checked when
    // it was opened, so a bad value came from an option).
    if (g4_sampling_params_check(&sp) != G4_OK) {
        static const std::pair<const char*, const char*> kFlag[] = {{"temperature", "--temp"},
                                                                    {"top_k", "--top-k"},
                                                                    {"top_p", "--top-p"},
                                                                    {"min_p", "--min-p"},
                                                                    {"repeat_penalty", "--repeat-penalty"},
                                                                    {"repeat_last_n", "--repeat-last-n"}};
        const std::string msg                                    = g4_last_error_message();
        for (const auto& [field, flag] : kFlag)
            if (msg.find(std::string(": ") + field + " ") != std::string::npos && a.has(flag))
                throw UsageError(std::string(flag) + " " + a.get(flag) + ": " + msg.substr(msg.find(field)));
        throw UsageError(msg);
    }
    return sp;
}

// Refuses, before any work, an output option naming something g4 does not replace (compiler/output_file.h).
void check_output_paths(const Args& a, std::initializer_list<const char*> opts) {
    for (const char* o : opts) {
        std::string err;
        if (a.has(o) && g4::output_target(a.get(o), &err).empty())
            throw UsageError(std::string(o) + " " + err);
    }
}

void create_session(const Args& a, g4_engine* eng, Session* s) {
    g4_session_params spp = g4_session_params_default();
    if (a.has("--threads")) spp.n_threads = (int32_t)parse_int("--threads", a.get("--threads"), 1, 1024);
    check(g4_session_create(eng, &spp, &s->s));
}

std::vector<int32_t> tokenize(g4_engine* eng, const std::string& text, bool add_special) {
    size_t n     = 0;
    g4_status st = g4_tokenize(eng, text.data(), text.size(), add_special, nullptr, 0, &n);
    if (st != G4_OK && st != G4_ERR_BUFFER_TOO_SMALL) check(st);
    std::vector<int32_t> ids(n);
    check(g4_tokenize(eng, text.data(), text.size(), add_special, ids.data(), ids.size(), &n));
    return ids;
}

struct StreamState {
    std::vector<int32_t> ids;
    std::string text;
    bool echo           = true;
    g4_session* session = nullptr; // set: each token's step logits are appended to decode_logits
    std::vector<float> decode_logits;
    g4_status logits_status = G4_OK;
};

// Appends the logits of the session's last fed token (the row the next token is chosen from).
g4_status append_last_logits(g4_session* s, std::vector<float>* out) {
    const float* l = nullptr;
    int32_t v      = 0;
    g4_status st   = g4_session_get_logits(s, &l, &v);
    if (st == G4_OK) out->insert(out->end(), l, l + v);
    return st;
}

int32_t on_token(void* user, int32_t token, const char* text, size_t len) {
    auto* st = static_cast<StreamState*>(user);
    if (token >= 0) st->ids.push_back(token);
    if (token >= 0 && st->session && st->logits_status == G4_OK) {
        st->logits_status = append_last_logits(st->session, &st->decode_logits);
        if (st->logits_status != G4_OK) return 1; // stop generating; reported after g4_session_generate
    }
    st->text.append(text, len);
    if (st->echo && len) {
        std::fwrite(text, 1, len, stdout);
        std::fflush(stdout);
    }
    return 0;
}

void print_stats(g4_session* s, const g4_engine* e, const g4_engine_info& info) {
    g4_session_stats st;
    check(g4_session_get_stats(s, &st));
    std::fprintf(
        stderr,
        "g4: load %.1f ms; prefill %lld tokens in %.2f ms (%.1f tok/s); time to first token %.2f ms; "
        "decode %lld tokens in %.2f ms (%.1f tok/s, %lld run ahead on the GPU, %lld of them with the LM head "
        "screened); sampling %lld calls in %.2f ms (%.1f us each)\n",
        info.load_ms, (long long)st.prefill_tokens, st.prefill_ms,
        st.prefill_ms > 0 ? st.prefill_tokens * 1000.0 / st.prefill_ms : 0.0, st.ttft_ms,
        (long long)st.decode_tokens, st.decode_ms,
        st.decode_ms > 0 ? st.decode_tokens * 1000.0 / st.decode_ms : 0.0, (long long)st.decode_ahead,
        (long long)st.lm_screened, (long long)st.sample_calls, st.sample_ms,
        st.sample_calls ? 1000.0 * st.sample_ms / st.sample_calls : 0.0);
    if (st.image_tokens || st.audio_tokens) {
        g4_media_info mi{};
        check(g4_engine_get_media_info(e, &mi));
        auto dev = [](int32_t d) { return d < 0 ? std::string("CPU") : "cuda:" + std::to_string(d); };
        std::fprintf(stderr,
                     "g4: images %lld soft tokens in %.2f ms (%s); audio %lld soft tokens in %.2f ms (%s)\n",
                     (long long)st.image_tokens, st.image_ms, dev(mi.vision_device).c_str(),
                     (long long)st.audio_tokens, st.audio_ms, dev(mi.audio_device).c_str());
    }
}

// --image / --audio: runs each file through its tower (queued in the session, in order) and puts its
// block into the prompt (tools/prompt_media.h): at its marker (<|image|> / <|audio|> in -p text, a lone
// placeholder id in --tokens), else after <bos> before the text, in command-line order. A --tokens list
// holding every block written out is fed as it is; any other count is an error (an image never goes
// silently unused).
void add_media(const Args& a, g4_engine* e, g4_session* s, std::vector<int32_t>* prompt) {
    std::vector<g4::tools::MediaBlock> blocks;
    for (const auto& [opt, f] : a.seq)
        if (opt == "--image" || opt == "--audio" || opt == "--video") {
            blocks.emplace_back();
            blocks.back().kind = opt == "--image"   ? g4::tools::MediaKind::Image
                                 : opt == "--audio" ? g4::tools::MediaKind::Audio
                                                    : g4::tools::MediaKind::Video;
            blocks.back().file = f;
        }
    g4_media_info mi{};
    check(g4_engine_get_media_info(e, &mi));
    for (g4::tools::MediaBlock& b : blocks) {
        int32_t n = 0;
        if (b.kind == g4::tools::MediaKind::Video) {
            if (!mi.has_vision || mi.video_token_id < 0)
                throw RunError(
                    "--video: the plan has no vision tower or no video placeholder id (compile a Gemma 4 "
                    "checkpoint with vision_config and video_token_id, without --no-vision)");
            // Each sampled frame goes through the tower as it is decoded (one frame's pixels held at a time).
            g4::tools::VideoFrames v;
            std::string err = g4::tools::load_video(
                b.file, g4::tools::kVideoFrames, mi.max_image_pixels, &v,
                [&](size_t f, const g4::tools::ImageRGB8& img) -> std::string {
                    if (g4_session_add_video_frame(s, img.rgb.data(), img.width, img.height, &n) != G4_OK)
                        return b.file + ": frame " + std::to_string(v.indices[f]) + ": " +
                               g4_last_error_message();
                    // "mm:ss <boi>...<eoi> mm:ss <boi>...": the text between two blocks is one segment
                    b.prefix.push_back(tokenize(e, (f ? " " : "") + v.times[f] + " ", false));
                    return "";
                });
            if (!err.empty()) throw RunError(err);
        } else if (b.kind == g4::tools::MediaKind::Image) {
            if (!mi.has_vision)
                throw RunError("--image: the plan has no vision tower (compile a Gemma 4 checkpoint with "
                               "vision_config, without --no-vision)");
            g4::tools::ImageRGB8 img;
            std::string err = g4::tools::load_image(b.file, &img, mi.max_image_pixels);
            if (!err.empty()) throw RunError(err);
            if (g4_session_add_image(s, img.rgb.data(), img.width, img.height, &n) != G4_OK)
                throw RunError(b.file + ": " + g4_last_error_message());
        } else {
            if (!mi.has_audio)
                throw RunError("--audio: the plan has no audio tower (compile a Gemma 4 checkpoint with "
                               "audio_config, without --no-audio)");
            g4::tools::AudioPcm pcm;
            std::string err = g4::tools::load_audio(b.file, mi.audio_sample_rate, mi.max_audio_samples, &pcm);
            if (!err.empty()) throw RunError(err);
            if (g4_session_add_audio(s, pcm.samples.data(), (int64_t)pcm.samples.size(), &n) != G4_OK)
                throw RunError(b.file + ": " + g4_last_error_message());
        }
        b.n = n;
    }
    g4_engine_info info{};
    check(g4_engine_get_info(e, &info));
    const g4::tools::MediaIds ids{.bos   = info.bos_token_id,
                                  .boi   = mi.boi_token_id,
                                  .image = mi.image_token_id,
                                  .eoi   = mi.eoi_token_id,
                                  .boa   = mi.boa_token_id,
                                  .audio = mi.audio_token_id,
                                  .eoa   = mi.eoa_token_id,
                                  .video = mi.video_token_id};
    std::string err = g4::tools::place_media(prompt, blocks, ids, a.has("--tokens"));
    if (!err.empty()) throw RunError(err);
}

// -p TEXT: its <|image|> / <|audio|> markers become lone placeholder ids (each then replaced by its file's
// block, as Hugging Face's processor expands them), whether or not the tokenizer knows the marker strings.
std::vector<int32_t> tokenize_prompt(g4_engine* e, const std::string& text) {
    const g4::tools::MarkedText m = g4::tools::split_media_markers(text);
    if (m.markers.empty()) return tokenize(e, text, true);
    g4_media_info mi{};
    check(g4_engine_get_media_info(e, &mi));
    std::vector<int32_t> ids;
    for (size_t i = 0; i < m.segments.size(); ++i) {
        std::vector<int32_t> t = tokenize(e, m.segments[i], i == 0);
        ids.insert(ids.end(), t.begin(), t.end());
        if (i == m.markers.size()) break;
        const g4::tools::MediaKind k = m.markers[i];
        const int32_t ph             = k == g4::tools::MediaKind::Image   ? mi.image_token_id
                                       : k == g4::tools::MediaKind::Audio ? mi.audio_token_id
                                                                          : mi.video_token_id;
        if (ph < 0)
            throw RunError(std::string("-p: the text has <|") + g4::tools::media_kind_name(k) +
                           "|> but the plan has no " +
                           (k == g4::tools::MediaKind::Image   ? "vision tower"
                            : k == g4::tools::MediaKind::Audio ? "audio tower"
                                                               : "video support") +
                           " to fill it");
        ids.push_back(ph);
    }
    return ids;
}

int cmd_run(int argc, char** argv) {
    std::vector<std::string> with_value = kSamplingOpts;
    with_value.insert(with_value.end(), {"--tokens", "-p", "--dump-logits", "--dump-decode-logits", "--image",
                                         "--audio", "--video"});
    Args a(argc, argv, 2, with_value, {"--ignore-eos", "--print-ids", "--stats", "--truncate"});
    if (a.pos.size() != 1) throw UsageError("expected exactly one PLAN argument");
    if (a.has("--tokens") == a.has("-p"))
        throw UsageError("give the prompt as -p TEXT or as --tokens ID,ID,...");
    int n_predict = (int)parse_int("-n", a.get("-n", "32"), 0, 1 << 30);
    check_output_paths(a, {"--dump-logits", "--dump-decode-logits"});

    Engine e;
    open_engine(a.pos[0], &e);
    g4_sampling_params sp = sampling_from_args(a, e.e);
    std::string tok_arg   = a.get("--tokens");
    if (!tok_arg.empty() && tok_arg[0] == '@') { // --tokens @FILE: ids from a file (long prompts)
        std::string text = read_whole_file(tok_arg.substr(1), "token file");
        while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r'))
            text.pop_back();
        tok_arg = text;
    }
    std::vector<int32_t> prompt = a.has("-p") ? tokenize_prompt(e.e, a.get("-p")) : parse_tokens(tok_arg);
    if (prompt.empty()) throw UsageError("the prompt is empty");
    if ((int64_t)prompt.size() >= e.info.max_context) {
        if (!a.flag.count("--truncate"))
            throw RunError(
                "the prompt has " + std::to_string(prompt.size()) + " tokens but the plan's max context is " +
                std::to_string(e.info.max_context) +
                " (use --truncate to keep the last tokens, or recompile with a larger --max-context)");
        size_t keep = (size_t)std::max(1, e.info.max_context -
                                              std::max(1, std::min(n_predict, e.info.max_context / 2)));
        std::vector<int32_t> cut(prompt.end() - (keep - 1), prompt.end());
        cut.insert(cut.begin(), prompt.front()); // keep <bos>
        std::fprintf(stderr, "g4 run: note: prompt truncated from %zu to %zu tokens\n", prompt.size(),
                     cut.size());
        prompt = cut;
    }

    Session s;
    create_session(a, e.e, &s);
    add_media(a, e.e, s.s, &prompt);
    std::vector<float> logits;
    float* dump = nullptr;
    if (a.has("--dump-logits")) {
        logits.resize(prompt.size() * (size_t)e.info.vocab_size);
        dump = logits.data();
    }
    check(g4_session_append_tokens(s.s, prompt.data(), prompt.size(), dump, logits.size()));
    if (dump) {
        std::string err;
        if (!g4::write_output_file(a.get("--dump-logits"), logits.data(), logits.size() * sizeof(float),
                                   &err))
            throw RunError(err);
    }

    g4_generate_params gp = g4_generate_params_default();
    gp.max_tokens         = n_predict;
    gp.ignore_eos         = a.flag.count("--ignore-eos") > 0;
    std::vector<const char*> stops;
    if (a.multi.count("--stop"))
        for (auto& v : a.multi.at("--stop"))
            stops.push_back(v.c_str());
    gp.stop   = stops.empty() ? nullptr : stops.data();
    gp.n_stop = stops.size();
    StreamState ss;
    ss.echo = a.has("-p") && !a.flag.count("--print-ids") && e.info.has_tokenizer;
    if (a.has("--dump-decode-logits")) { // row 0: the prompt's last token's logits, then one a token fed
        ss.session = s.s;
        check(append_last_logits(s.s, &ss.decode_logits));
    }
    int32_t n_gen = 0;
    g4_status st  = g4_session_generate(s.s, &sp, &gp, on_token, &ss, &n_gen);
    check(ss.logits_status);
    if (st == G4_ERR_CONTEXT_FULL)
        std::fprintf(stderr, "\ng4 run: note: %s; stopping\n", g4_last_error_message());
    else
        check(st);
    if (ss.session) { // the row after the last token chose nothing: [generated, vocab]
        ss.decode_logits.resize(ss.ids.size() * (size_t)e.info.vocab_size);
        std::string err;
        if (!g4::write_output_file(a.get("--dump-decode-logits"), ss.decode_logits.data(),
                                   ss.decode_logits.size() * sizeof(float), &err))
            throw RunError(err);
    }
    if (ss.echo) {
        std::printf("\n");
    } else {
        std::printf("%s\n", join_ids(ss.ids).c_str());
    }
    if (a.flag.count("--stats")) print_stats(s.s, e.e, e.info);
    return 0;
}

std::vector<int> parse_int_list(const std::string& opt, const std::string& v, long long lo, long long hi) {
    std::vector<int> out;
    std::stringstream ss(v);
    std::string t;
    while (std::getline(ss, t, ','))
        out.push_back((int)parse_int(opt, t, lo, hi));
    if (out.empty()) throw UsageError(opt + ": expected a comma-separated list of numbers");
    return out;
}

// llama-bench style measurement in one warm process: prompt processing (feed P tokens, pick the first
// greedy token) and greedy decode (N steps after a D-token prompt). Synthetic prompt ids cycle through
// the vocabulary; medians over the repetitions, each test warmed up once first.
int cmd_bench(int argc, char** argv) {
    Args a(argc, argv, 2, {"-p", "-n", "-d", "-r", "--threads"}, {"--json"});
    if (a.pos.size() != 1) throw UsageError("expected exactly one PLAN argument");
    Engine e;
    open_engine(a.pos[0], &e);
    const int maxc      = e.info.max_context;
    std::vector<int> pp = parse_int_list("-p", a.get("-p", "512"), 1, 1 << 30);
    std::vector<int> dd = parse_int_list("-d", a.get("-d", "0"), 0, 1 << 30);
    const int n         = (int)parse_int("-n", a.get("-n", "128"), 0, 1 << 30);
    const int reps      = (int)parse_int("-r", a.get("-r", "3"), 1, 1000);
    for (int p : pp)
        if (p >= maxc)
            throw RunError("-p " + std::to_string(p) + " does not fit the plan's max context " +
                           std::to_string(maxc));
    for (int d : dd)
        if (std::max(d, 1) + n > maxc)
            throw RunError("-d " + std::to_string(d) + " plus -n " + std::to_string(n) +
                           " does not fit the plan's max context " + std::to_string(maxc) +
                           " (recompile with a larger --max-context)");
    Session s;
    create_session(a, e.e, &s);
    auto ids_of = [&](int len) {
        std::vector<int32_t> ids(len);
        for (int i = 0; i < len; ++i)
            ids[i] = (int32_t)(((long long)i * 7919 + 13) % (e.info.vocab_size - 1) + 1);
        if (e.info.bos_token_id >= 0) ids[0] = e.info.bos_token_id;
        return ids;
    };
    using clk     = std::chrono::steady_clock;
    auto ms_since = [](clk::time_point t0) {
        return std::chrono::duration<double, std::milli>(clk::now() - t0).count();
    };
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    };
    struct Row {
        std::string test;
        int tokens, depth;
        double ms, tok_s;
        std::vector<double> all;
    };
    std::vector<Row> rows;
    int32_t tok = 0;
    for (int p : pp) { // prompt processing: time to the first token of a fresh P-token prompt
        std::vector<int32_t> ids = ids_of(p);
        std::vector<double> t;
        for (int r = 0; r <= reps; ++r) {
            check(g4_session_reset(s.s));
            auto t0 = clk::now();
            check(g4_session_append_tokens(s.s, ids.data(), ids.size(), nullptr, 0));
            check(g4_session_sample(s.s, nullptr, &tok));
            if (r) t.push_back(ms_since(t0));
        }
        double m = median(t);
        rows.push_back({"pp" + std::to_string(p), p, 0, m, p * 1000.0 / m, t});
    }
    if (n > 0)
        for (int d : dd) { // decode: N greedy steps after a D-token prompt
            std::vector<int32_t> ids = ids_of(std::max(d, 1));
            std::vector<double> t;
            for (int r = 0; r <= reps; ++r) {
                check(g4_session_reset(s.s));
                check(g4_session_append_tokens(s.s, ids.data(), ids.size(), nullptr, 0));
                check(g4_session_sample(s.s, nullptr, &tok));
                auto t0 = clk::now();
                for (int i = 0; i < n; ++i) {
                    check(g4_session_append_tokens(s.s, &tok, 1, nullptr, 0));
                    check(g4_session_sample(s.s, nullptr, &tok));
                }
                if (r) t.push_back(ms_since(t0));
            }
            double m = median(t);
            rows.push_back({"tg" + std::to_string(n) + "@d" + std::to_string(d), n, d, m, n * 1000.0 / m, t});
        }
    if (a.flag.count("--json")) {
        nlohmann::json j = nlohmann::json::array();
        for (const Row& r : rows)
            j.push_back({{"test", r.test},
                         {"tokens", r.tokens},
                         {"depth", r.depth},
                         {"median_ms", r.ms},
                         {"tok_s", r.tok_s},
                         {"ms", r.all}});
        std::printf("%s\n", j.dump().c_str());
        return 0;
    }
    std::printf("%-14s %8s %8s %12s %12s\n", "test", "tokens", "depth", "median ms", "tok/s");
    for (const Row& r : rows)
        std::printf("%-14s %8d %8d %12.2f %12.1f\n", r.test.c_str(), r.tokens, r.depth, r.ms, r.tok_s);
    return 0;
}

// An image or clip attached to a chat message: decoded when attached, encoded by its tower when the message
// is sent, and again only if the session has to be fed from the start (the history it holds changed).
struct ChatAttachment {
    g4::ChatMedia kind = g4::ChatMedia::Image;
    std::string path;
    g4::tools::ImageRGB8 image;
    g4::tools::AudioPcm audio;
    int32_t n = -1; // soft tokens, once encoded
};

struct ChatTurn {
    std::string role, text;
    std::vector<ChatAttachment>
        media; // before the text, as content [{"type": "image"}, ..., {"type": "text"}]
};

// A multi-turn conversation on one session: re-rendered each turn (the chat template, then each media
// marker replaced by <boi>/<boa>, n placeholders, <eoi>/<eoa>) and only the tokens the session does not
// already hold are fed, so an earlier image stays in the KV cache and its tower does not run again.
struct Chat {
    g4_engine* e  = nullptr;
    g4_session* s = nullptr;
    g4_engine_info info{};
    g4_media_info mi{};
    std::vector<ChatTurn> turns;         // (the system turn first, if any)
    std::vector<ChatAttachment> pending; // for the next user message
    std::vector<int32_t> fed;            // tokens the session holds

    struct Prompt {
        std::vector<int32_t> ids;
        struct Block {
            size_t begin, end, turn, item;
        }; // ids [begin, end) hold turns[turn].media[item]
        std::vector<Block> blocks;
    };

    // Decodes a file for the next message; "" or why it cannot be attached (`what`: "/image", "--audio",
    // ...).
    std::string attach(g4::ChatMedia kind, const std::string& path, const std::string& what) {
        ChatAttachment a;
        a.kind = kind;
        a.path = path;
        std::string err;
        if (kind == g4::ChatMedia::Image) {
            if (!mi.has_vision)
                return what + " " + path +
                       ": the plan has no vision tower (compiled with --no-vision, or from a checkpoint "
                       "without vision_config)";
            if (!(err = g4::tools::load_image(path, &a.image, mi.max_image_pixels)).empty()) return err;
            const int64_t px = (int64_t)a.image.width * a.image.height;
            if (px > mi.max_image_pixels)
                return path + ": " + std::to_string(a.image.width) + "x" + std::to_string(a.image.height) +
                       " is " + std::to_string(px) + " pixels but the plan takes at most " +
                       std::to_string(mi.max_image_pixels) + " (g4 compile --max-image-pixels)";
        } else {
            if (!mi.has_audio)
                return what + " " + path +
                       ": the plan has no audio tower (compiled with --no-audio, or from a checkpoint "
                       "without audio_config)";
            if (!(err = g4::tools::load_audio(path, mi.audio_sample_rate, mi.max_audio_samples, &a.audio))
                     .empty())
                return err;
            if ((int64_t)a.audio.samples.size() > mi.max_audio_samples) {
                char buf[160];
                std::snprintf(
                    buf, sizeof buf,
                    ": %.2f s of audio but the plan takes at most %.2f s (g4 compile --max-audio-seconds)",
                    (double)a.audio.samples.size() / mi.audio_sample_rate,
                    (double)mi.max_audio_samples / mi.audio_sample_rate);
                return path + buf;
            }
        }
        pending.push_back(std::move(a));
        return "";
    }

    void restart() {
        check(g4_session_reset(s));
        fed.clear();
    }

    // Starts over: only the system turn stays; pending attachments are dropped.
    void reset() {
        turns.erase(std::remove_if(turns.begin(), turns.end(), [](auto& t) { return t.role != "system"; }),
                    turns.end());
        pending.clear();
        restart();
    }

    Prompt render() const {
        std::vector<g4::ChatMessage> msgs;
        for (const ChatTurn& t : turns) {
            msgs.push_back({t.role, t.text, {}});
            for (const ChatAttachment& a : t.media)
                msgs.back().media.push_back(a.kind);
        }
        std::string text, err;
        std::vector<g4::ChatMediaMark> marks;
        if (!g4::render_chat(msgs, g4::ChatOptions{}, &text, &err, &marks)) throw RunError(err);
        Prompt p;
        size_t at     = 0;
        auto add_text = [&](size_t end) {
            if (end == at) return;
            std::vector<int32_t> ids = tokenize(e, text.substr(at, end - at), false);
            p.ids.insert(p.ids.end(), ids.begin(), ids.end());
        };
        for (const g4::ChatMediaMark& m : marks) {
            add_text(m.offset);
            const ChatAttachment& a = turns[m.message].media[m.item];
            const bool image        = a.kind == g4::ChatMedia::Image;
            const size_t begin      = p.ids.size();
            p.ids.push_back(image ? mi.boi_token_id : mi.boa_token_id);
            p.ids.insert(p.ids.end(), (size_t)std::max(a.n, 0),
                         image ? mi.image_token_id : mi.audio_token_id);
            p.ids.push_back(image ? mi.eoi_token_id : mi.eoa_token_id);
            p.blocks.push_back({begin, p.ids.size(), m.message, m.item});
            at = m.offset + (image ? g4::kChatImageMarker : g4::kChatAudioMarker).size();
        }
        add_text(text.size());
        return p;
    }

    // Runs a's tower; its soft tokens wait in the session's queue for the placeholders.
    void encode(ChatAttachment& a) {
        int32_t n = 0;
        const g4_status st =
            a.kind == g4::ChatMedia::Image
                ? g4_session_add_image(s, a.image.rgb.data(), a.image.width, a.image.height, &n)
                : g4_session_add_audio(s, a.audio.samples.data(), (int64_t)a.audio.samples.size(), &n);
        if (st != G4_OK) throw RunError(a.path + ": " + g4_last_error_message());
        if (a.n >= 0 && n != a.n)
            throw RunError(a.path + ": encoded again it gives " + std::to_string(n) + " soft tokens, not " +
                           std::to_string(a.n));
        a.n = n;
    }

    // Feeds p.ids [fed.size(), end); fed is a prefix of p.ids.
    void feed(const Prompt& p, size_t end) {
        if (end > fed.size())
            check(g4_session_append_tokens(s, p.ids.data() + fed.size(), end - fed.size(), nullptr, 0));
        fed.assign(p.ids.begin(), p.ids.begin() + (long)end);
    }

    // False (conversation reset, as a turn that does not fit always did) when p leaves no room for a reply.
    bool fits(const Prompt& p) {
        if (p.ids.size() + 1 < (size_t)info.max_context) return true;
        size_t soft   = 0;
        bool at_least = false; // media not encoded yet count no soft token
        for (const auto& b : p.blocks) {
            soft += b.end - b.begin - 2;
            at_least |= turns[b.turn].media[b.item].n < 0;
        }
        std::string of = soft ? " (" + std::to_string(soft) + " of them image and audio soft tokens)" : "";
        std::printf("[this turn does not fit: %s%zu prompt tokens%s, max context %d; conversation reset]\n",
                    at_least ? "at least " : "", p.ids.size(), of.c_str(), info.max_context);
        std::fflush(stdout);
        reset();
        return false;
    }

    // Adds a user turn with the pending attachments and feeds what the session lacks. False when it was
    // not sent (reported); the conversation is then as before.
    bool prepare(const std::string& text) {
        const size_t before = turns.size();
        turns.push_back({"user", text, std::move(pending)});
        pending.clear();
        try {
            Prompt p = render(); // the new media without their placeholders yet
            if (!fits(p)) return false;
            size_t common = 0;
            while (common < fed.size() && common < p.ids.size() && fed[common] == p.ids[common])
                ++common;
            for (const auto& b : p.blocks)
                if (b.begin < common && common < b.end) common = 0;
            if (common < fed.size())
                restart(); // history changed (e.g. a reply re-tokenized): start from scratch
            // Each image or clip the session lacks is encoded just before its placeholders are fed (the
            // session queues a bounded number of soft tokens): the new ones, and after a restart the earlier
            // ones again.
            for (size_t k = 0; k < p.blocks.size(); ++k) {
                if (p.blocks[k].begin < fed.size()) continue;
                ChatAttachment& a = turns[p.blocks[k].turn].media[p.blocks[k].item];
                const bool fresh  = a.n < 0;
                encode(a);
                if (fresh && !fits(p = render())) return false;
                feed(p, p.blocks[k].end);
            }
            feed(p, p.ids.size());
            return true;
        } catch (const RunError& err) {
            std::fprintf(stderr, "g4 chat: error: %s; the message was not sent\n", err.what());
            turns.resize(std::min(turns.size(), before));
            check(g4_session_clear_media(s));
            if (g4_session_position(s) != (int32_t)fed.size()) restart();
            return false;
        }
    }
};

// Interactive multi-turn chat on stdin/stdout; /image and /audio attach files to the next message.
int cmd_chat(int argc, char** argv) {
    std::vector<std::string> with_value = kSamplingOpts;
    with_value.insert(with_value.end(), {"--system", "--image", "--audio"});
    Args a(argc, argv, 2, with_value, {"--stats", "--print-ids"});
    if (a.pos.size() != 1) throw UsageError("expected exactly one PLAN argument");
    Engine e;
    open_engine(a.pos[0], &e);
    if (!e.info.has_tokenizer)
        throw RunError(a.pos[0] +
                       ": the plan has no tokenizer; chat needs one (compile with tokenizer.json)");
    g4_sampling_params sp = sampling_from_args(a, e.e);
    int n_predict         = (int)parse_int("-n", a.get("-n", "512"), 1, 1 << 30);
    const bool print_ids  = a.flag.count("--print-ids") > 0;
    Session s;
    create_session(a, e.e, &s);
    Chat chat;
    chat.e    = e.e;
    chat.s    = s.s;
    chat.info = e.info;
    check(g4_engine_get_media_info(e.e, &chat.mi));
    if (a.has("--system")) chat.turns.push_back({"system", a.get("--system"), {}});
    for (auto [opt, kind] :
         {std::pair{"--image", g4::ChatMedia::Image}, std::pair{"--audio", g4::ChatMedia::Audio}})
        if (a.multi.count(opt))
            for (const auto& f : a.multi.at(opt))
                if (std::string err = chat.attach(kind, f, opt); !err.empty()) throw RunError(err);

    const bool tty = ::isatty(0);
    if (tty) {
        std::string media = std::string(chat.mi.has_vision ? "/image FILE" : "") +
                            (chat.mi.has_vision && chat.mi.has_audio ? " and " : "") +
                            (chat.mi.has_audio ? "/audio FILE" : "");
        std::fprintf(stderr, "g4 chat: %s%s/reset starts over, /exit quits\n", media.c_str(),
                     media.empty() ? "" : " attach a file to the next message, ");
    }
    // "/image PATH" (PATH may be quoted) -> PATH; nullopt when line is not that command.
    auto command_arg = [](const std::string& line, const std::string& cmd) -> std::optional<std::string> {
        if (line.rfind(cmd, 0) != 0 ||
            (line.size() > cmd.size() && line[cmd.size()] != ' ' && line[cmd.size()] != '\t'))
            return std::nullopt;
        std::string arg(g4::strip_python_whitespace(std::string_view(line).substr(cmd.size())));
        if (arg.size() >= 2 && (arg[0] == '\'' || arg[0] == '"') && arg.back() == arg[0])
            arg = arg.substr(1, arg.size() - 2);
        return arg;
    };
    std::string line;
    for (;;) {
        if (tty) std::fprintf(stderr, "> ");
        if (!std::getline(std::cin, line)) break;
        if (line == "/exit") break;
        if (line == "/reset") {
            chat.reset();
            std::printf("[conversation reset]\n");
            std::fflush(stdout);
            continue;
        }
        std::optional<std::string> img = command_arg(line, "/image"),
                                   aud = img ? std::nullopt : command_arg(line, "/audio");
        if (img || aud) {
            const std::string what = img ? "/image" : "/audio", path = img ? *img : *aud;
            std::string err =
                path.empty() ? what + " needs a file: " + what + (img ? " photo.png" : " clip.wav")
                             : chat.attach(img ? g4::ChatMedia::Image : g4::ChatMedia::Audio, path, what);
            if (!err.empty()) {
                std::fprintf(stderr, "g4 chat: error: %s\n", err.c_str());
            } else if (img) {
                const auto& im = chat.pending.back().image;
                std::fprintf(stderr, "[image %s attached to the next message: %dx%d]\n", path.c_str(),
                             im.width, im.height);
            } else {
                std::fprintf(stderr, "[audio %s attached to the next message: %.2f s]\n", path.c_str(),
                             (double)chat.pending.back().audio.samples.size() / chat.mi.audio_sample_rate);
            }
            continue;
        }
        if (line.empty() && chat.pending.empty()) continue;
        if (!chat.prepare(line)) continue;

        g4_generate_params gp = g4_generate_params_default();
        gp.max_tokens         = n_predict;
        StreamState ss;
        ss.echo      = !print_ids;
        g4_status st = g4_session_generate(s.s, &sp, &gp, on_token, &ss, nullptr);
        if (print_ids) std::printf("%s", join_ids(ss.ids).c_str());
        std::printf("\n");
        std::fflush(stdout);
        chat.fed.insert(chat.fed.end(), ss.ids.begin(), ss.ids.end());
        if (st == G4_ERR_CONTEXT_FULL) {
            std::printf("[context full: conversation reset]\n");
            std::fflush(stdout);
            chat.reset();
            continue;
        }
        if (st != G4_OK) {
            std::fprintf(stderr, "g4 chat: error: %s\n", g4_last_error_message());
            if (g4_session_position(s.s) != (int32_t)chat.fed.size()) chat.restart();
        }
        chat.turns.push_back({"model", ss.text, {}});
        if (a.flag.count("--stats")) print_stats(s.s, e.e, e.info);
    }
    return 0;
}

int cmd_tokenize(int argc, char** argv) {
    Args a(argc, argv, 2, {"--tokenizer"}, {"--add-special"});
    if (!a.has("--tokenizer")) throw UsageError("missing --tokenizer FILE|PLAN");
    if (a.pos.size() != 1) throw UsageError("expected the text to tokenize after --");
    std::string path = a.get("--tokenizer");
    std::string head(8, '\0');
    if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
        head.resize(std::fread(head.data(), 1, 8, f));
        std::fclose(f);
    } else {
        throw RunError("cannot open " + path);
    }
    std::vector<int32_t> ids;
    bool add = a.flag.count("--add-special") > 0;
    if (head == std::string("G4PLAN\0\0", 8)) {
        Engine e;
        open_engine(path, &e);
        ids = tokenize(e.e, a.pos[0], add);
    } else {
        std::string json = read_whole_file(path, "tokenizer"), err;
        g4::Tokenizer tk;
        if (!g4::Tokenizer::load_from_json(json, &tk, &err)) throw RunError(path + ": " + err);
        if (!tk.encode(a.pos[0], add, &ids, &err)) throw RunError(err);
    }
    std::printf("%s\n", join_ids(ids).c_str());
    return 0;
}

using g4::placement::human;

int inspect_plan(int argc, char** argv) {
    Args a(argc, argv, 2, {}, {"--verify", "--ops", "--tensors"});
    if (a.pos.size() != 1) throw UsageError("expected exactly one PLAN argument");
    bool verify = a.flag.count("--verify") > 0;
    g4::plan::Plan p;
    std::string err;
    if (p.load(a.pos[0], verify, &err) != G4_OK) throw RunError(err);
    const auto& h   = p.header();
    namespace jsonf = g4::jsonf;
    // META was parsed and depth-checked by p.load; a field of the wrong type is an error naming it.
    auto jv   = [](const nlohmann::json& o, const char* k) { return jsonf::value<std::string>(o, k, "?"); };
    auto meta = nlohmann::json::parse(p.meta_json());
    std::printf("plan %s: format %u.%u, %s, %llu bytes%s\n", a.pos[0].c_str(), h.format_major, h.format_minor,
                jv(meta, "architecture").c_str(), (unsigned long long)p.file_size(),
                verify ? ", weights checksum ok" : "");
    std::printf(
        "g4 version %s, device %s, weights %s, KV cache %s\n", jv(meta, "g4_version").c_str(),
        jv(meta, "device").c_str(), jv(meta, "weights_dtype").c_str(),
        jsonf::value<std::string>(meta.value("policy", nlohmann::json::object()), "kv_dtype", "f32").c_str());
    std::printf("hparams: %s\n", meta["hparams"].dump().c_str());
    std::printf("program: %s\n", meta["program"].dump().c_str());
    std::printf("generation: %s\n", meta["generation"].dump().c_str());
    if (meta.contains("policy")) std::printf("policy: %s\n", meta["policy"].dump().c_str());
    if (meta.contains("tokenizer")) std::printf("tokenizer: %s\n", meta["tokenizer"].dump().c_str());
    if (meta.contains("provenance")) std::printf("provenance: %s\n", meta["provenance"].dump(2).c_str());

    std::map<std::string, std::pair<uint64_t, int>> by_dtype, by_kind;
    const char* kinds[] = {"weight", "activation", "kv_cache", "input"};
    for (size_t i = 0; i < p.n_tensors(); ++i) {
        const auto& t = p.tensor(i);
        if (t.kind == (uint8_t)g4::plan::TensorKind::Weight) {
            auto& d = by_dtype[g4::dtype_str((g4::DType)t.dtype)];
            d.first += t.nbytes, d.second++;
        }
        auto& k = by_kind[kinds[t.kind]];
        k.first += t.nbytes, k.second++;
    }
    std::printf("weights by dtype:\n");
    for (auto& [k, v] : by_dtype)
        std::printf("  %-6s %5d tensors %12s\n", k.c_str(), v.second, human(v.first).c_str());
    const auto& in = p.info();
    if (meta.contains("placement")) {
        const auto& pl = meta["placement"];
        std::string layers;
        for (const auto& r : pl.value("layers", nlohmann::json::array()))
            layers += (layers.empty() ? "" : ", ") + std::to_string(jsonf::value<int>(r, "first", 0)) + "-" +
                      std::to_string(jsonf::value<int>(r, "last", 0)) + " on " + jv(r, "device");
        std::string dev = jv(pl, "device");
        std::string ple = jsonf::value<std::string>(pl, "ple", "device") == "host"
                              ? "in pinned host memory (ple=host)"
                              : "on " + dev;
        std::printf(
            "placement: text layers %s; embed on %s, lm_head on %s; PLE table %s%s; vision %s; audio %s\n",
            layers.c_str(), jv(pl, "embed").c_str(), jv(pl, "lm_head").c_str(), ple.c_str(),
            jsonf::value<bool>(pl, "ple_auto", false) ? " (decided by the budget check)" : "",
            jv(pl, "vision").c_str(), jv(pl, "audio").c_str());
    }
    if (meta.contains("memory")) {
        std::ostringstream table;
        g4::placement::print_memory(table, g4::placement::memory_from_json(meta["memory"]), "  ");
        std::printf("memory by device (exact bytes%s):\n%s",
                    jsonf::value<std::string>(meta, "device", "cpu") == "cuda"
                        ? "; CUDA context and allocator overhead not included"
                        : "",
                    table.str().c_str());
    } else {
        std::printf(
            "memory by device:\n  cpu    weights %s (mapped from the plan), activations %s, KV cache %s\n",
            human(p.weights_bytes()).c_str(), human(in.act_arena_bytes).c_str(),
            human(in.kv_arena_bytes).c_str());
    }
    std::printf("tensors %zu, ops %zu\n", p.n_tensors(), p.n_ops());
    if (meta.contains("cuda")) {
        const int hpg           = jsonf::value<int>(meta["cuda"], "attn_hpg", 0);
        const std::string trace = jsonf::value<std::string>(meta["cuda"], "kernel_trace", "off");
        std::printf(
            "CUDA kernels: %s cubin + PTX; decode attention %s%s\n", jv(meta["cuda"], "target").c_str(),
            hpg ? ("specialised for " + std::to_string(hpg) + " heads per KV group").c_str()
                : "generic (any group size <= 16)",
            trace == "off"
                ? ""
                : ("; timeline trace of " + trace + " (G4_TRACE_OUT writes it; not for use)").c_str());
    }
    if (p.n_launches()) {
        int kinds_n[9] = {}, mlp_f16 = 0, ple_fold = 0, mlp_fold = 0;
        for (size_t i = 0; i < p.n_launches(); ++i) {
            kinds_n[std::min<int>(p.launch(i).kind, 8)]++;
            if (p.launch(i).kind == (uint16_t)g4::plan::LaunchKind::Mlp && p.launch(i).ip[7] == 1) ++mlp_f16;
            if (p.launch(i).kind == (uint16_t)g4::plan::LaunchKind::ResNorm && p.launch(i).ip[1] == 1)
                ++ple_fold;
            if (p.launch(i).kind == (uint16_t)g4::plan::LaunchKind::ResNorm && p.launch(i).ip[1] == 2)
                ++mlp_fold;
        }
        std::printf(
            "CUDA decode schedule: %zu fused launches and %d single ops per token: %d GEMV, %d QkvPost, %d "
            "QkvPost+attention, "
            "%d ResNorm, %d MLP (gate/up + down in one kernel; %d with packed-f16 products, %d with the "
            "ResNorm before, which is then not launched), %d attention-o (the attention's merge + o "
            "in one kernel), %d PLE (gate + projection in one kernel; %d with the ResNorm before, which is "
            "then not launched), %d PLE "
            "input (scale, norm, add, scale in one kernel)\n",
            p.n_launches() - kinds_n[0], kinds_n[0], kinds_n[2], kinds_n[3], kinds_n[4], kinds_n[1],
            kinds_n[5], mlp_f16, mlp_fold, kinds_n[6], kinds_n[7], ple_fold, kinds_n[8]);
        // Prefill kernel variants the compiler recorded (runtime/src/plan/plan_format.h).
        int flash = 0, split = 0, mm[5] = {};
        for (size_t i = 0; i < p.n_ops(); ++i) {
            const auto& op = p.op(i);
            if (op.code == (uint16_t)g4::OpCode::Attention) (op.ip[5] == 0 ? flash : split)++;
            if (op.code == (uint16_t)g4::OpCode::Matmul && op.ip[6] >= 0 && op.ip[6] < 5) mm[op.ip[6]]++;
        }
        std::printf("CUDA prefill: attention %d flash (tensor cores), %d split over keys (fp32); matmul %d "
                    "cuBLAS tier, "
                    "%d tensor-core, %d tiled fp32, %d per-row\n",
                    flash, split, mm[(int)g4::plan::MatmulVariant::Cublas],
                    mm[(int)g4::plan::MatmulVariant::TensorCore], mm[(int)g4::plan::MatmulVariant::Tiled64],
                    mm[(int)g4::plan::MatmulVariant::PerRow]);
    }
    bool all = !a.flag.count("--ops") && !a.flag.count("--tensors");
    if (all || a.flag.count("--tensors")) {
        std::printf("tensors:\n");
        for (size_t i = 0; i < p.n_tensors(); ++i) {
            const auto& t = p.tensor(i);
            std::string shape;
            for (int d = 0; d < t.ndim; ++d) {
                if (d) shape.push_back('x');
                shape.append(std::to_string(t.dims[d]));
            }
            std::string dt = g4::dtype_str((g4::DType)t.dtype);
            if (t.dtype == (uint8_t)g4::DType::NF4 && (t.quant_flags & g4::plan::kQuantDoubleQuant))
                dt += "-dq";
            std::printf("  %4zu %-10s %-14s %10s  %-6s %s\n", i, kinds[t.kind], shape.c_str(),
                        human(t.nbytes).c_str(), dt.c_str(), p.str(t.name));
        }
    }
    if (all || a.flag.count("--ops")) {
        std::printf("ops:\n");
        for (size_t i = 0; i < p.n_ops(); ++i) {
            const auto& op = p.op(i);
            std::string ins, outs;
            for (int32_t t : op.in)
                if (t >= 0) ins += std::string(ins.empty() ? "" : ", ") + p.str(p.tensor(t).name);
            for (int32_t t : op.out)
                if (t >= 0) outs += std::string(outs.empty() ? "" : ", ") + p.str(p.tensor(t).name);
            std::printf("  %4zu %-10s %-22s (%s) -> %s\n", i, g4::op_name((g4::OpCode)op.code),
                        p.str(op.name), ins.c_str(), outs.c_str());
        }
    }
    return 0;
}

// `g4 inspect`: a META field of another type than g4 wrote is an error naming the plan and the field.
int cmd_inspect(int argc, char** argv) {
    try {
        return inspect_plan(argc, argv);
    } catch (const RunError&) {
        throw;
    } catch (const UsageError&) {
        throw;
    } catch (const std::exception& e) { // g4::jsonf's errors, and nlohmann's from placement::memory_from_json
        const Args a(argc, argv, 2, {}, {"--verify", "--ops", "--tensors"});
        throw RunError("plan " + a.pos.at(0) + ": " + e.what() + "; re-run g4 compile to rebuild the plan");
    }
}

} // namespace

int main(int argc, char** argv) {
    if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
        std::fputs(kUsage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    std::string cmd = argv[1];
    try {
        if (cmd == "compile") return cmd_compile(argc, argv);
        if (cmd == "run") return cmd_run(argc, argv);
        if (cmd == "inspect") return cmd_inspect(argc, argv);
        if (cmd == "chat") return cmd_chat(argc, argv);
        if (cmd == "bench") return cmd_bench(argc, argv);
        if (cmd == "tokenize") return cmd_tokenize(argc, argv);
        if (cmd == "--version" || cmd == "version") {
            std::printf("g4 %s\n", g4_runtime_version());
            return 0;
        }
        std::fprintf(stderr, "g4: error: unknown command '%s'\n%s", cmd.c_str(), kUsage);
        return 2;
    } catch (const UsageError& e) {
        std::fprintf(stderr, "g4 %s: error: %s\n%s", cmd.c_str(), e.what(), kUsage);
        return 2;
    } catch (const g4::CompileError& e) {
        std::fprintf(stderr, "g4 %s: error: %s\n", cmd.c_str(), e.what());
        return 1;
    } catch (const RunError& e) {
        std::fprintf(stderr, "g4 %s: error: %s\n", cmd.c_str(), e.what());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "g4 %s: error: %s\n", cmd.c_str(), e.what());
        return 1;
    }
}
