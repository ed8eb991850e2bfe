// Shared pieces of the g4 CLI (tools/cli_common.h): help printing, argument parsing, C API helpers, progress.
#include "tools/cli_common.h"

#include "runtime/src/media/read_file.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unistd.h>
#include <utility>

namespace g4::cli {

namespace {

// Writes `text` wrapped at `width` columns, every line indented by `indent` spaces.
void print_wrapped(const std::string& text, size_t indent, size_t width) {
    std::string line;
    size_t i        = 0;
    auto flush_line = [&] {
        std::printf("%*s%s\n", (int)indent, "", line.c_str());
        line.clear();
    };
    while (i < text.size()) {
        if (text[i] == '\n') {
            flush_line();
            ++i;
            continue;
        }
        size_t j = text.find_first_of(" \n", i);
        if (j == std::string::npos) j = text.size();
        std::string word = text.substr(i, j - i);
        if (!line.empty() && indent + line.size() + 1 + word.size() > width) flush_line();
        line += (line.empty() ? "" : " ") + word;
        i = j < text.size() && text[j] == ' ' ? j + 1 : j;
    }
    if (!line.empty()) flush_line();
}

} // namespace

void print_help(const Command& c) {
    std::printf("usage: g4 %s %s\n\n", c.name, c.synopsis);
    print_wrapped(c.summary, 0, 100);
    std::printf("\noptions:\n");
    for (const Option& o : c.options) {
        std::string head = std::string(o.name) + (o.value ? std::string(" ") + o.value : "");
        std::printf("  %s\n", head.c_str());
        print_wrapped(o.help, 6, 100);
    }
    std::printf("  -h, --help\n      this help\n");
    if (*c.notes) {
        std::printf("\n");
        print_wrapped(c.notes, 0, 100);
    }
}

bool wants_help(int argc, char** argv, int first) {
    for (int i = first; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--")) return false;
        if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) return true;
    }
    return false;
}

Args::Args(int argc, char** argv, int first, const Command& c) {
    auto find = [&](const std::string& s) -> const Option* {
        for (const Option& o : c.options)
            if (s == o.name) return &o;
        return nullptr;
    };
    for (int i = first; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--") { // everything after is positional
            for (++i; i < argc; ++i)
                pos.push_back(argv[i]);
            break;
        }
        if (a.size() > 1 && a[0] == '-') {
            size_t eq        = a.find('=');
            bool inline_val  = eq != std::string::npos && a.rfind("--", 0) == 0;
            std::string name = inline_val ? a.substr(0, eq) : a;
            const Option* o  = find(name);
            if (!o || (!o->value && inline_val)) throw UsageError("unknown option " + a);
            if (!o->value) {
                flag[name] = true;
                continue;
            }
            std::string v;
            if (inline_val)
                v = a.substr(eq + 1);
            else if (i + 1 < argc)
                v = argv[++i];
            else
                throw UsageError("option " + name + " needs a value (" + o->value + ")");
            val[name] = v;
            multi[name].push_back(v);
            seq.emplace_back(name, v);
        } else {
            pos.push_back(a);
        }
    }
}

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

std::string join_ids(const std::vector<int32_t>& ids) {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) line.push_back(',');
        line.append(std::to_string(ids[i]));
    }
    return line;
}

std::string read_whole_file(const std::string& path, const char* what) {
    std::vector<uint8_t> bytes;
    if (std::string err = g4::media::read_file_bytes(path, what, uint64_t(1) << 32, &bytes); !err.empty())
        throw RunError(err);
    return std::string(bytes.begin(), bytes.end());
}

void check(g4_status st) {
    if (st != G4_OK) throw RunError(g4_last_error_message());
}

void open_engine(const std::string& path, Engine* e) {
    check(g4_engine_open(path.c_str(), nullptr, &e->e));
    check(g4_engine_get_info(e->e, &e->info));
}

int32_t parse_threads(const Args& a) {
    if (!a.has("--threads")) return 0;
    const long long n = parse_int("--threads", a.get("--threads"), 1, 1024);
    const unsigned hw = std::thread::hardware_concurrency();
    if (hw == 0 || n <= (long long)hw) return (int32_t)n;
    std::fprintf(stderr,
                 "g4: --threads %lld is more than the %u hardware threads of this machine: using %u\n", n, hw,
                 hw);
    return (int32_t)hw;
}

void create_session(const Args& a, g4_engine* eng, Session* s) {
    g4_session_params spp = g4_session_params_default();
    spp.n_threads         = parse_threads(a);
    check(g4_session_create(eng, &spp, &s->s));
}

std::vector<Option> media_limit_options() {
    return {
        {"--video-frames", "N",
         "frames a --video gives (sampled as the processor does). Default: the plan's (g4 compile "
         "--video-frames, 32)"},
        {"--max-video-seconds", "S",
         "longest video stream (its declared and its read duration). Default: the plan's (3600)"},
        {"--max-video-stream-frames", "N",
         "most frames a video stream may hold (each is decoded up to the last one sampled). Default: the "
         "plan's (216000)"},
        {"--max-video-pixels", "N",
         "largest video frame (width x height); at most the plan's --max-image-pixels. Default: the plan's"},
        {"--max-video-bytes", "N", "largest video file. Default: the plan's (2147483648)"},
        {"--max-image-pixels", "N", "largest image or video frame (width x height); at most the plan's"},
        {"--max-audio-seconds", "S",
         "longest audio clip; at most the plan's (g4 compile --max-audio-seconds)"},
    };
}

g4::media::VideoLimits media_limits(const Args& a, g4_media_info* mi) {
    g4::media::VideoLimits v; // the plan's (g4_media_info), else the defaults
    if (mi->video_frames > 0) {
        v.num_frames        = std::min(mi->video_frames, g4::media::kMaxVideoFrames);
        v.max_seconds       = mi->max_video_seconds;
        v.max_stream_frames = mi->max_video_stream_frames;
        v.max_pixels        = mi->max_video_pixels;
        v.max_file_bytes    = mi->max_video_bytes;
    }
    if (a.has("--video-frames"))
        v.num_frames =
            (int)parse_int("--video-frames", a.get("--video-frames"), 1, g4::media::kMaxVideoFrames);
    if (a.has("--max-video-seconds")) {
        v.max_seconds = parse_float("--max-video-seconds", a.get("--max-video-seconds"));
        if (!(v.max_seconds > 0)) throw UsageError("--max-video-seconds must be > 0");
    }
    if (a.has("--max-video-stream-frames"))
        v.max_stream_frames =
            parse_int("--max-video-stream-frames", a.get("--max-video-stream-frames"), 1, int64_t(1) << 40);
    if (a.has("--max-video-bytes"))
        v.max_file_bytes = parse_int("--max-video-bytes", a.get("--max-video-bytes"), 1, int64_t(1) << 50);
    if (a.has("--max-image-pixels")) {
        const int64_t px = parse_int("--max-image-pixels", a.get("--max-image-pixels"), 1, int64_t(1) << 40);
        if (px > mi->max_image_pixels)
            throw UsageError("--max-image-pixels " + std::to_string(px) + " is over the plan's " +
                             std::to_string(mi->max_image_pixels) + " (g4 compile --max-image-pixels)");
        mi->max_image_pixels = px;
    }
    // A frame is at most the plan's image size: the session's buffers are sized for it.
    if (a.has("--max-video-pixels")) {
        const int64_t px = parse_int("--max-video-pixels", a.get("--max-video-pixels"), 1, int64_t(1) << 40);
        if (px > mi->max_image_pixels)
            throw UsageError("--max-video-pixels " + std::to_string(px) + " is over the plan's " +
                             std::to_string(mi->max_image_pixels) +
                             " image pixels (g4 compile --max-image-pixels)");
        v.max_pixels = px;
    }
    v.max_pixels = std::min(v.max_pixels, mi->max_image_pixels);
    if (a.has("--max-audio-seconds")) {
        const double s  = parse_float("--max-audio-seconds", a.get("--max-audio-seconds"));
        const int64_t n = (int64_t)(s * mi->audio_sample_rate);
        if (!(s > 0) || n > mi->max_audio_samples)
            throw UsageError(
                "--max-audio-seconds " + a.get("--max-audio-seconds") + " is outside 0.." +
                std::to_string((double)mi->max_audio_samples / std::max(1, mi->audio_sample_rate)) +
                ", the plan's (g4 compile --max-audio-seconds)");
        mi->max_audio_samples = n;
    }
    return v;
}

std::vector<Option> sampling_options(const char* n_help) {
    return {
        {"-n", "N", n_help},
        {"--temp", "T",
         "sampling temperature; 0 is greedy. Default: the checkpoint's generation_config (Gemma 4: 1)"},
        {"--top-k", "K", "keep the K most likely tokens (0: all). Default: generation_config (Gemma 4: 64)"},
        {"--top-p", "P", "nucleus sampling mass in (0, 1]. Default: generation_config (Gemma 4: 0.95)"},
        {"--min-p", "P", "drop tokens below P times the top probability. Default: generation_config, else 0"},
        {"--repeat-penalty", "R",
         "penalty on recently generated tokens (1: none). Default: generation_config, "
         "else 1"},
        {"--repeat-last-n", "N", "how many recent tokens the penalty looks at (-1: all). Default: 64"},
        {"--seed", "S", "random seed of the sampler. Default: the plan's (0)"},
        {"--stop", "STR", "stop when the generated text contains STR (repeatable; the STR is not printed)"},
        {"--threads", "N",
         "CPU worker threads, 1..1024 (more than the hardware threads: the hardware threads, with a note). "
         "Default: G4_THREADS, else every hardware thread"},
    };
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

std::vector<int32_t> tokenize(g4_engine* eng, const std::string& text, bool add_special) {
    size_t n     = 0;
    g4_status st = g4_tokenize(eng, text.data(), text.size(), add_special, nullptr, 0, &n);
    if (st != G4_OK && st != G4_ERR_BUFFER_TOO_SMALL) check(st);
    std::vector<int32_t> ids(n);
    check(g4_tokenize(eng, text.data(), text.size(), add_special, ids.data(), ids.size(), &n));
    return ids;
}

void require_tokenizer(const g4_engine_info& info, const std::string& plan, const char* what) {
    if (info.has_tokenizer) return;
    throw RunError(plan + ": the plan has no tokenizer, so " + what +
                   " cannot turn text into tokens: it was compiled from a checkpoint without tokenizer.json "
                   "(with --no-tokenizer); recompile with the model's tokenizer.json in --model DIR or "
                   "--tokenizer FILE, or give the prompt as ids (--tokens)");
}

void check_media_ids(const g4_engine_info& info, const g4_media_info& mi, bool image) {
    const int32_t open  = image ? mi.boi_token_id : mi.boa_token_id,
                  close = image ? mi.eoi_token_id : mi.eoa_token_id;
    for (int32_t id : {open, close})
        if (id < 0 || id >= info.vocab_size)
            throw RunError(std::string("the plan's ") + (image ? "image" : "audio") + " marker token id " +
                           std::to_string(id) + " is outside its " + std::to_string(info.vocab_size) +
                           "-token vocabulary: the checkpoint's config.json (boi/eoi/boa/eoa_token_id) names "
                           "ids its text model does not have, so no " +
                           (image ? "image" : "audio") +
                           " prompt can be built (the tiny demo model tests/fixtures/e2b_tiny is such a "
                           "checkpoint; tests/fixtures/e2b_tiny_mm has the same weights with ids that fit)");
}

void print_stats(g4_session* s, const g4_engine* e, const g4_engine_info& info) {
    g4_session_stats st;
    check(g4_session_get_stats(s, &st));
    std::fflush(stdout); // the generated text first, then the figures on their own line of stderr
    std::fprintf(
        stderr,
        "g4: load %.1f ms; prefill %lld tokens in %.2f ms (%.1f tok/s); time to first token %.2f ms; "
        "decode %lld tokens in %.2f ms (%.1f tok/s, %lld run ahead on the GPU, %lld with the LM head "
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
    return st->stop_flag && *st->stop_flag ? 1 : 0;
}

namespace {
double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
} // namespace

// G4_PROGRESS (docs/environment.md): "always" shows every stage from its start, "off" none.
Progress::Progress(std::string label) : label_(std::move(label)), tty_(::isatty(2) != 0), start_(now_s()) {
    const char* env = std::getenv("G4_PROGRESS");
    if (env && !std::strcmp(env, "always")) start_ -= 1.0;
    if (env && !std::strcmp(env, "off")) finished_ = true;
}

Progress::~Progress() {
    if (tty_ && last_ >= 0 && !finished_) std::fprintf(stderr, "\n");
}

void Progress::update(double fraction) {
    if (finished_ || (last_ < 0 && now_s() - start_ < 1.0)) return;
    const int pct = (int)std::clamp(fraction * 100.0, 0.0, 100.0);
    if (tty_) {
        if (pct == last_) return;
        const int width = 30, fill = pct * width / 100;
        std::fprintf(stderr, "\r%s [%s%s] %3d%%", label_.c_str(), std::string((size_t)fill, '#').c_str(),
                     std::string((size_t)(width - fill), '.').c_str(), pct);
    } else {
        if (last_ >= 0 && pct / 10 == last_ / 10) return;
        std::fprintf(stderr, "%s: %d%%\n", label_.c_str(), pct / 10 * 10);
    }
    std::fflush(stderr);
    last_ = pct;
}

void Progress::done() {
    if (finished_) return;
    if (last_ >= 0) {
        update(1.0);
        if (tty_) std::fprintf(stderr, "\n");
    }
    finished_ = true;
}

} // namespace g4::cli
