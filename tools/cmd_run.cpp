// `g4 run`: feeds a prompt (text, ids, images, audio) to a plan through the C API and streams what it
// generates.
#include "runtime/src/chat_template.h"
#include "runtime/src/media/audio_io.h"
#include "runtime/src/media/image_io.h"
#include "runtime/src/media/media_decode.h"
#include "runtime/src/media/video_decode.h"
#include "tools/cli_common.h"
#include "tools/prompt_media.h"

#include "compiler/output_file.h"

#include <algorithm>
#include <cstdio>

namespace g4::cli {

namespace {

// --image / --audio / --video: runs each file through its tower (queued in the session, in order) and puts
// its block into the prompt (tools/prompt_media.h): at its marker (<|image|> / <|audio|> / <|video|> in -p
// text, a lone placeholder id in --tokens), else after <bos> before the text, in command-line order. A
// --tokens list holding every block written out is fed as it is; any other count is an error (an image
// never goes silently unused).
void add_media(const Args& a, g4_engine* e, g4_session* s, std::vector<int32_t>* prompt) {
    std::vector<g4::tools::MediaBlock> blocks;
    for (const auto& [opt, f] : a.seq)
        if (opt == "--image" || opt == "--audio" || opt == "--video") {
            blocks.emplace_back();
            blocks.back().kind = opt == "--image"   ? g4::tools::MediaKind::Image
                                 : opt == "--audio" ? g4::tools::MediaKind::Audio
                                                    : g4::tools::MediaKind::Video;
            blocks.back().file = f;
            if (opt == "--video" && a.on("--video-audio")) {
                blocks.emplace_back();
                blocks.back().kind = g4::tools::MediaKind::Audio;
                blocks.back().file = f;
            }
        }
    if (a.on("--video-audio") && !a.has("--video")) throw UsageError("--video-audio needs a --video file");
    if (blocks.empty()) return;
    g4_media_info mi{};
    check(g4_engine_get_media_info(e, &mi));
    const g4::media::VideoLimits limits = media_limits(a, &mi);
    g4_engine_info info{};
    check(g4_engine_get_info(e, &info));
    for (g4::tools::MediaBlock& b : blocks) {
        int32_t n        = 0;
        const int32_t ph = b.kind == g4::tools::MediaKind::Image   ? mi.image_token_id
                           : b.kind == g4::tools::MediaKind::Audio ? mi.audio_token_id
                                                                   : mi.video_token_id;
        // g4 writes the markers unless --tokens holds the placeholders: they must then be token ids.
        const bool g4_writes = !a.has("--tokens") || !std::count(prompt->begin(), prompt->end(), ph);
        if (b.kind == g4::tools::MediaKind::Video) {
            if (!mi.has_vision || mi.video_token_id < 0)
                throw RunError(
                    "--video: the plan has no vision tower or no video placeholder id (compile a Gemma 4 "
                    "checkpoint with vision_config and video_token_id, without --no-vision)");
            if (g4_writes) check_media_ids(info, mi, true);
            // Each sampled frame goes through the tower as it is decoded (one frame's pixels held at a time).
            g4::media::VideoFrames v;
            std::string err = g4::media::load_video(
                b.file, limits, &v, [&](size_t f, const g4::media::ImageRGB8& img) -> std::string {
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
            g4::media::ImageRGB8 img;
            std::string err = g4::media::load_image(b.file, &img, mi.max_image_pixels);
            if (!err.empty()) throw RunError(err);
            if (g4_writes) check_media_ids(info, mi, true);
            if (g4_session_add_image(s, img.rgb.data(), img.width, img.height, &n) != G4_OK)
                throw RunError(b.file + ": " + g4_last_error_message());
        } else {
            if (!mi.has_audio)
                throw RunError("--audio: the plan has no audio tower (compile a Gemma 4 checkpoint with "
                               "audio_config, without --no-audio)");
            g4::media::AudioPcm pcm;
            std::string err = g4::media::load_audio(b.file, mi.audio_sample_rate, mi.max_audio_samples, &pcm);
            if (!err.empty()) throw RunError(err);
            if (g4_writes) check_media_ids(info, mi, false);
            if (g4_session_add_audio(s, pcm.samples.data(), (int64_t)pcm.samples.size(), &n) != G4_OK)
                throw RunError(b.file + ": " + g4_last_error_message());
        }
        b.n = n;
    }
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

// Text as prompt ids: its <|image|> / <|audio|> / <|video|> markers become lone placeholder ids (each then
// replaced by its file's block, as Hugging Face's processor expands them), whether or not the tokenizer
// knows the marker strings.
std::vector<int32_t> tokenize_prompt(g4_engine* e, const std::string& text, bool add_bos) {
    const g4::tools::MarkedText m = g4::tools::split_media_markers(text);
    if (m.markers.empty()) return tokenize(e, text, add_bos);
    g4_media_info mi{};
    check(g4_engine_get_media_info(e, &mi));
    std::vector<int32_t> ids;
    for (size_t i = 0; i < m.segments.size(); ++i) {
        std::vector<int32_t> t = tokenize(e, m.segments[i], add_bos && i == 0);
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

// Feeds the prompt; a long one in pieces of whole prefill chunks (the same steps as one call) with a
// progress bar on stderr.
void feed_prompt(g4_session* s, const g4_engine_info& info, const std::vector<int32_t>& prompt, float* dump) {
    const size_t step =
        (size_t)std::max(1, info.max_chunk) * std::max<size_t>(1, 512 / std::max(1, info.max_chunk));
    if (prompt.size() < 4 * step) {
        check(g4_session_append_tokens(s, prompt.data(), prompt.size(), dump,
                                       dump ? prompt.size() * (size_t)info.vocab_size : 0));
        return;
    }
    Progress bar("prefill " + std::to_string(prompt.size()) + " tokens");
    for (size_t at = 0; at < prompt.size(); at += step) {
        const size_t n = std::min(step, prompt.size() - at);
        float* out     = dump ? dump + at * (size_t)info.vocab_size : nullptr;
        check(g4_session_append_tokens(s, prompt.data() + at, n, out, out ? n * (size_t)info.vocab_size : 0));
        bar.update((double)(at + n) / (double)prompt.size());
    }
    bar.done();
}

// -p TEXT as the prompt: with --chat, one user turn rendered with the plan's chat template.
std::vector<int32_t> text_prompt(const Args& a, g4_engine* e) {
    if (!a.on("--chat")) return tokenize_prompt(e, a.get("-p"), true);
    std::string text, err;
    g4::ChatTemplate tpl;
    if (!g4::engine_chat_template(e, &tpl, &err) ||
        !g4::render_chat(tpl, {{"user", a.get("-p"), {}}}, g4::ChatOptions{}, &text, &err))
        throw RunError(err);
    return tokenize_prompt(e, text, false);
}

} // namespace

const Command kRun = {
    "run", "PLAN (-p TEXT | --tokens IDS | --tokens @FILE) [options]",
    "Feeds a prompt to a compiled plan and prints what the model generates: the text with -p, the token ids "
    "with --tokens.",
    [] {
        std::vector<Option> o = {
            {"-p", "TEXT",
             "the prompt as text, tokenized with the plan's tokenizer (<bos> added); the generated text "
             "streams to stdout"},
            {"--chat", nullptr,
             "with -p: render TEXT as one user turn of the plan's chat template (<bos><|turn>user ... "
             "<turn|><|turn>model), as an instruction-tuned model expects. Default: TEXT as it is"},
            {"--tokens", "IDS",
             "the prompt as comma-separated token ids (2,17,99), fed verbatim (no <bos> added), or @FILE to "
             "read them from a file; the generated ids are printed"},
        };
        for (Option s : sampling_options("tokens to generate at most; when the limit stops the reply, a note "
                                         "on stderr says so. Default: 32"))
            o.push_back(s);
        for (Option s : std::vector<Option>{
                 {"--ignore-eos", nullptr,
                  "do not stop at the plan's end-of-generation ids (<turn|>, <eos>)"},
                 {"--print-ids", nullptr, "with -p: print the generated token ids instead of the text"},
                 {"--image", "FILE",
                  "an image (PNG/JPEG/BMP/GIF/PPM) for a plan with the vision tower (repeatable): put at the "
                  "next <|image|> of the prompt, else after <bos>, in command-line order"},
                 {"--audio", "FILE",
                  "an audio clip (WAV; MP3, FLAC, Ogg/Opus, M4A, a video's sound track through FFmpeg) for a "
                  "plan with the audio tower (repeatable): put at the next <|audio|>, else after <bos>"},
                 {"--video", "FILE",
                  "a video (MP4, WebM, MKV, MOV through FFmpeg): 32 frames sampled as transformers' Gemma 4 "
                  "processor does, each through the vision tower (repeatable): put at the next <|video|>, "
                  "else after <bos>"},
                 {"--video-audio", nullptr,
                  "also give each --video's sound track, as an audio clip right after it (placed as an "
                  "--audio file: at the next <|audio|>, else after the video)"},
                 {"--truncate", nullptr,
                  "keep the last tokens of a prompt longer than the plan's max context. Default: such a "
                  "prompt is an error"},
                 {"--dump-logits", "FILE",
                  "write the prompt's logits, little-endian float32 [prompt tokens, vocab]"},
                 {"--dump-decode-logits", "FILE",
                  "write the logits each generated token was chosen from, float32 [generated tokens, vocab] "
                  "(turns off CUDA decode-ahead)"},
                 {"--stats", nullptr, "print load, prefill, decode and sampling timings on stderr"},
             })
            o.push_back(s);
        for (Option s : media_limit_options())
            o.push_back(s);
        return o;
    }(),
    "Without sampling options the checkpoint's generation_config decides. A prompt longer than ~2,000 "
    "tokens shows a progress bar on stderr while it is fed. Output files (--dump-*) are written to a "
    "temporary file beside the target, then renamed over it; a failing command leaves an existing target as "
    "it was."};

int cmd_run(int argc, char** argv) {
    Args a(argc, argv, 2, kRun);
    if (a.pos.size() != 1) throw UsageError("expected exactly one PLAN argument");
    if (a.has("--tokens") == a.has("-p"))
        throw UsageError("give the prompt as -p TEXT or as --tokens ID,ID,...");
    if (a.on("--chat") && !a.has("-p")) throw UsageError("--chat applies the chat template to -p TEXT");
    int n_predict = (int)parse_int("-n", a.get("-n", "32"), 0, 1 << 30);
    for (const char* o : {"--dump-logits", "--dump-decode-logits"}) {
        std::string err;
        if (a.has(o) && g4::output_target(a.get(o), &err).empty())
            throw UsageError(std::string(o) + " " + err);
    }

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
    if (a.has("-p")) require_tokenizer(e.info, a.pos[0], "-p");
    std::vector<int32_t> prompt = a.has("-p") ? text_prompt(a, e.e) : parse_tokens(tok_arg);
    if (prompt.empty()) throw UsageError("the prompt is empty");
    if ((int64_t)prompt.size() >= e.info.max_context) {
        if (!a.on("--truncate"))
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
    if (a.has("--dump-logits")) logits.resize(prompt.size() * (size_t)e.info.vocab_size);
    feed_prompt(s.s, e.info, prompt, logits.empty() ? nullptr : logits.data());
    if (!logits.empty()) {
        std::string err;
        if (!g4::write_output_file(a.get("--dump-logits"), logits.data(), logits.size() * sizeof(float),
                                   &err))
            throw RunError(err);
    }

    g4_generate_params gp = g4_generate_params_default();
    gp.max_tokens         = n_predict;
    gp.ignore_eos         = a.on("--ignore-eos");
    std::vector<const char*> stops;
    if (a.multi.count("--stop"))
        for (auto& v : a.multi.at("--stop"))
            stops.push_back(v.c_str());
    gp.stop   = stops.empty() ? nullptr : stops.data();
    gp.n_stop = stops.size();
    StreamState ss;
    ss.echo = a.has("-p") && !a.on("--print-ids");
    if (a.has("--dump-decode-logits")) { // row 0: the prompt's last token's logits, then one a token fed
        ss.session = s.s;
        check(append_last_logits(s.s, &ss.decode_logits));
    }
    int32_t n_gen = 0;
    g4_status st  = g4_session_generate(s.s, &sp, &gp, on_token, &ss, &n_gen);
    check(ss.logits_status);
    bool context_full    = st == G4_ERR_CONTEXT_FULL;
    std::string full_msg = context_full ? g4_last_error_message() : "";
    if (!context_full) check(st);
    if (ss.session) { // the row after the last token chose nothing: [generated, vocab]
        ss.decode_logits.resize(ss.ids.size() * (size_t)e.info.vocab_size);
        std::string err;
        if (!g4::write_output_file(a.get("--dump-decode-logits"), ss.decode_logits.data(),
                                   ss.decode_logits.size() * sizeof(float), &err))
            throw RunError(err);
    }
    std::printf(ss.echo ? "\n" : "%s\n", join_ids(ss.ids).c_str());
    std::fflush(stdout);
    if (context_full)
        std::fprintf(stderr, "g4 run: note: %s; stopping\n", full_msg.c_str());
    else if (n_predict > 0 && n_gen >= n_predict)
        std::fprintf(stderr, "g4 run: note: stopped at the -n limit of %d tokens (-n N to generate more)\n",
                     n_predict);
    if (a.on("--stats")) print_stats(s.s, e.e, e.info);
    return 0;
}

} // namespace g4::cli
