// `g4 chat`: an interactive multi-turn conversation. Lines come through GNU readline (editing, history) on a
// terminal when the build found it, else from stdin as they are; Ctrl-C during a reply stops it through
// g4_session_cancel and keeps the conversation; typed /commands manage attachments and the conversation.
#include "tools/chat_state.h"
#include "tools/cli_common.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <optional>
#include <semaphore.h>
#include <sys/select.h>
#include <thread>
#include <unistd.h>

#ifdef G4_HAVE_READLINE
#include <readline/history.h>
#include <readline/readline.h>
#endif

namespace g4::cli {

namespace {

// Lock-free atomics: safe in the signal handler and between the threads (any thread may take the signal).
static_assert(std::atomic<int>::is_always_lock_free);
std::atomic<int> g_interrupted{0}; // Ctrl-C seen, not yet handled
std::atomic<int> g_busy{0};        // a message or reply is being computed
std::atomic<int> g_quit_on_int{0}; // at the prompt without readline: Ctrl-C quits as it always did
sem_t g_wake;                      // posted by the handler: the canceller thread calls the C API
int g_wake_fd[2] = {-1,
                    -1}; // written by the handler: wakes the prompt's select (any thread may take a signal)

void on_sigint(int) {
    if (g_quit_on_int && !g_busy) {
        std::signal(SIGINT, SIG_DFL);
        std::raise(SIGINT);
        return;
    }
    g_interrupted = 1;
    if (g_wake_fd[1] >= 0) {
        const ssize_t w = ::write(g_wake_fd[1], "x", 1);
        (void)w;
    }
    sem_post(&g_wake); // async-signal-safe; g4_session_cancel (it takes a lock) runs on the canceller thread
}

// Calls g4_session_cancel for each Ctrl-C while a message or reply is being computed.
class Canceller {
public:
    explicit Canceller(g4_session* s) : s_(s) {
        sem_init(&g_wake, 0, 0);
        if (::pipe(g_wake_fd) != 0) g_wake_fd[0] = g_wake_fd[1] = -1;
        thread_ = std::thread([this] {
            for (;;) {
                while (sem_wait(&g_wake) != 0 && errno == EINTR) {
                }
                if (stop_) return;
                if (g_busy) g4_session_cancel(s_);
            }
        });
        struct sigaction sa {};
        sa.sa_handler = on_sigint;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        sigaction(SIGINT, &sa, &old_);
    }
    ~Canceller() {
        sigaction(SIGINT, &old_, nullptr);
        stop_ = true;
        sem_post(&g_wake);
        thread_.join();
        sem_destroy(&g_wake);
        for (int& fd : g_wake_fd) {
            if (fd >= 0) ::close(fd);
            fd = -1;
        }
    }

private:
    g4_session* s_;
    std::thread thread_;
    std::atomic<bool> stop_{false};
    struct sigaction old_ {};
};

// One line of input at a time. False at the end: end of input, Ctrl-D, or Ctrl-C twice in a row at an empty
// prompt (*streak counts the Ctrl-Cs in a row, the one that stopped a reply included).
class LineReader {
public:
    explicit LineReader(bool tty) : tty_(tty) {
#ifdef G4_HAVE_READLINE
        readline_ = tty;
        if (readline_) {
            rl_catch_signals = 0; // Ctrl-C is handled here (on_sigint), not by readline
            rl_outstream     = stderr;
        }
#endif
        g_quit_on_int = readline_ ? 0 : 1;
    }
    bool read(std::string* line, int* streak) {
#ifdef G4_HAVE_READLINE
        if (readline_) return read_readline(line, streak);
#endif
        (void)streak;
        if (tty_) std::fprintf(stderr, "> ");
        return (bool)std::getline(std::cin, *line);
    }

private:
    bool tty_, readline_ = false;
#ifdef G4_HAVE_READLINE
    static inline std::optional<std::string> got_;
    static inline bool done_ = false;

    static void on_line(char* l) {
        got_ = l ? std::optional<std::string>(l) : std::nullopt;
        std::free(l);
        done_ = true;
        rl_callback_handler_remove();
    }

    bool read_readline(std::string* line, int* streak) {
        done_ = false;
        rl_callback_handler_install("> ", on_line);
        while (!done_) {
            fd_set fds;
            FD_ZERO(&fds);
            FD_SET(0, &fds);
            if (g_wake_fd[0] >= 0) FD_SET(g_wake_fd[0], &fds);
            const int r = select(std::max(0, g_wake_fd[0]) + 1, &fds, nullptr, nullptr, nullptr);
            if (r > 0 && g_wake_fd[0] >= 0 && FD_ISSET(g_wake_fd[0], &fds)) {
                char buf[64];
                const ssize_t n = ::read(g_wake_fd[0], buf, sizeof buf);
                (void)n;
            }
            if (g_interrupted) {
                g_interrupted    = 0;
                const bool empty = rl_end == 0;
                if (empty && *streak > 0) {
                    rl_callback_handler_remove();
                    std::fprintf(stderr, "\n");
                    return false;
                }
                *streak = empty ? *streak + 1 : 0;
                rl_free_line_state();
                rl_callback_sigcleanup();
                rl_replace_line("", 0);
                rl_crlf();
                if (empty) std::fprintf(stderr, "[Ctrl-C again or Ctrl-D quits]\n");
                rl_on_new_line();
                rl_redisplay();
                continue;
            }
            if (r > 0 && FD_ISSET(0, &fds)) {
                rl_callback_read_char();
                if (!done_ && rl_end > 0) *streak = 0;
            }
        }
        if (!got_) {
            std::fprintf(stderr, "\n");
            return false;
        }
        *line = *got_;
        if (!line->empty()) {
            add_history(line->c_str());
            *streak = 0; // (readline may take a whole typed-ahead line in one call)
        }
        return true;
    }
#endif
};

const char* kChatHelp =
    "commands:\n"
    "  /image FILE      attach an image to the next message\n"
    "  /audio FILE      attach an audio clip (WAV, MP3, FLAC, Ogg, M4A, a video's sound) to the next "
    "message\n"
    "  /video FILE      attach a video (MP4, WebM, MKV, MOV: 32 frames sampled) to the next message;\n"
    "                   /video FILE --audio attaches its sound track too\n"
    "  /save FILE       write the conversation to FILE (JSON messages)\n"
    "  /load FILE       replace the conversation with the one in FILE\n"
    "  /reset           start over (the --system text stays)\n"
    "  /exit, /quit     quit (Ctrl-D too)\n"
    "  /help            this list\n"
    "  //TEXT           send /TEXT as a message\n"
    "Ctrl-C stops a reply and keeps the conversation; Ctrl-C twice at an empty prompt quits.\n";

// "/image PATH" (PATH may be quoted) -> PATH; nullopt when line is not that command.
std::optional<std::string> command_arg(const std::string& line, const std::string& cmd) {
    if (line.rfind(cmd, 0) != 0 ||
        (line.size() > cmd.size() && line[cmd.size()] != ' ' && line[cmd.size()] != '\t'))
        return std::nullopt;
    std::string arg(g4::strip_python_whitespace(std::string_view(line).substr(cmd.size())));
    if (arg.size() >= 2 && (arg[0] == '\'' || arg[0] == '"') && arg.back() == arg[0])
        arg = arg.substr(1, arg.size() - 2);
    return arg;
}

// "/video FILE [--audio]" (or --video FILE with --video-audio): the video, and its sound track as an audio
// clip after it when asked. Reports what was attached; "" or the error (then nothing is attached).
std::string attach_video(Chat& chat, std::string arg, const std::string& what, bool sound = false) {
    constexpr std::string_view kAudio = "--audio";
    if (arg.size() > kAudio.size() && arg.compare(arg.size() - kAudio.size(), kAudio.size(), kAudio) == 0 &&
        (arg[arg.size() - kAudio.size() - 1] == ' ' || arg[arg.size() - kAudio.size() - 1] == '\t')) {
        sound = true;
        arg   = std::string(
              g4::strip_python_whitespace(std::string_view(arg).substr(0, arg.size() - kAudio.size())));
        if (arg.size() >= 2 && (arg[0] == '\'' || arg[0] == '"') && arg.back() == arg[0])
            arg = arg.substr(1, arg.size() - 2);
    }
    std::string err = arg.empty() ? what + " needs a file: " + what + " clip.mp4 [--audio]"
                                  : chat.attach(ChatKind::Video, arg, what);
    if (err.empty() && sound && !(err = chat.attach(ChatKind::Audio, arg, what + " --audio")).empty())
        chat.pending.pop_back(); // not the video without the sound asked for
    if (!err.empty()) return err;
    const g4::media::VideoFrames& v = chat.pending[chat.pending.size() - (sound ? 2 : 1)].video;
    std::fprintf(stderr, "[video %s attached to the next message: %zu of its %lld frames (%.2f fps)%s]\n",
                 arg.c_str(), v.indices.size(), (long long)v.total_frames, v.fps,
                 sound ? ", with its sound track" : "");
    return "";
}

// Handles a typed /command; false when `line` is a message to send.
bool run_command(Chat& chat, const std::string& line) {
    if (line.empty() || line[0] != '/' || line.rfind("//", 0) == 0) return false;
    if (line == "/help") {
        std::fputs(kChatHelp, stderr);
        return true;
    }
    if (line == "/reset") {
        chat.reset();
        std::printf("[conversation reset]\n");
        std::fflush(stdout);
        return true;
    }
    for (const char* cmd : {"/save", "/load"})
        if (std::optional<std::string> path = command_arg(line, cmd)) {
            const bool save = cmd[1] == 's';
            if (path->empty()) {
                std::fprintf(stderr, "g4 chat: error: %s needs a file: %s chat.json\n", cmd, cmd);
            } else if (std::string err = save ? chat.save(*path) : chat.load(*path); !err.empty()) {
                std::fprintf(stderr, "g4 chat: error: %s\n", err.c_str());
            } else {
                std::fprintf(stderr, "[conversation %s %s: %zu messages]\n",
                             save ? "saved to" : "loaded from", path->c_str(), chat.turns.size());
            }
            return true;
        }
    if (std::optional<std::string> vid = command_arg(line, "/video")) {
        if (std::string err = attach_video(chat, *vid, "/video"); !err.empty())
            std::fprintf(stderr, "g4 chat: error: %s\n", err.c_str());
        return true;
    }
    std::optional<std::string> img = command_arg(line, "/image"),
                               aud = img ? std::nullopt : command_arg(line, "/audio");
    if (!img && !aud) {
        const std::string name = line.substr(0, line.find_first_of(" \t"));
        std::fprintf(stderr,
                     "g4 chat: unknown command %s (not sent; /help lists the commands, //TEXT sends /TEXT)\n",
                     name.c_str());
        return true;
    }
    const std::string what = img ? "/image" : "/audio", path = img ? *img : *aud;
    std::string err = path.empty() ? what + " needs a file: " + what + (img ? " photo.png" : " clip.wav")
                                   : chat.attach(img ? ChatKind::Image : ChatKind::Audio, path, what);
    if (!err.empty()) {
        std::fprintf(stderr, "g4 chat: error: %s\n", err.c_str());
    } else if (img) {
        const auto& im = chat.pending.back().image;
        std::fprintf(stderr, "[image %s attached to the next message: %dx%d]\n", path.c_str(), im.width,
                     im.height);
    } else {
        std::fprintf(stderr, "[audio %s attached to the next message: %.2f s]\n", path.c_str(),
                     (double)chat.pending.back().audio.samples.size() / chat.mi.audio_sample_rate);
    }
    return true;
}

} // namespace

const Command kChat = {
    "chat", "PLAN [options]",
    "An interactive conversation with a plan: one message a line, the replies streamed. Each turn is "
    "rendered "
    "with the plan's chat template; only the tokens the session does not hold yet are fed.",
    [] {
        std::vector<Option> o = {
            {"--system", "TEXT", "a system turn before the conversation (kept by /reset)"},
            {"--image", "FILE", "an image for the first message (repeatable)"},
            {"--audio", "FILE",
             "an audio clip (WAV, or any format FFmpeg decodes) for the first message (repeatable)"},
            {"--video", "FILE",
             "a video (MP4, WebM, MKV, MOV through FFmpeg) for the first message (repeatable)"},
            {"--video-audio", nullptr, "also give each --video's sound track, as an audio clip after it"},
        };
        for (Option s : sampling_options("tokens a reply has at most. Default: 512"))
            o.push_back(s);
        o.push_back(
            {"--ignore-eos", nullptr, "do not end a reply at the plan's end-of-generation ids (-n ends it)"});
        o.push_back({"--print-ids", nullptr, "print each reply's token ids instead of its text"});
        o.push_back({"--stats", nullptr, "print timings on stderr after each reply"});
        for (Option s : media_limit_options())
            o.push_back(s);
        return o;
    }(),
    "On a terminal, lines are edited with GNU readline (arrows, history with up/down) when g4 was built with "
    "it. Typed commands: /image FILE, /audio FILE, /video FILE [--audio], /save FILE, /load FILE, /reset, "
    "/exit, /help (a line "
    "starting with another /word is reported, not sent; //TEXT sends /TEXT). Ctrl-C stops a reply and keeps "
    "the conversation; Ctrl-C twice at an empty prompt, or Ctrl-D, quits."};

int cmd_chat(int argc, char** argv) {
    Args a(argc, argv, 2, kChat);
    if (a.pos.size() != 1) throw UsageError("expected exactly one PLAN argument");
    Engine e;
    open_engine(a.pos[0], &e);
    require_tokenizer(e.info, a.pos[0], "chat");
    g4_sampling_params sp = sampling_from_args(a, e.e);
    int n_predict         = (int)parse_int("-n", a.get("-n", "512"), 1, 1 << 30);
    const bool print_ids  = a.on("--print-ids");
    Session s;
    create_session(a, e.e, &s);
    Chat chat;
    chat.e           = e.e;
    chat.s           = s.s;
    chat.info        = e.info;
    chat.interrupted = &g_interrupted;
    check(g4_engine_get_media_info(e.e, &chat.mi));
    chat.video_limits = media_limits(a, &chat.mi);
    if (a.has("--system")) chat.turns.push_back({"system", a.get("--system"), {}});
    for (auto [opt, kind] : {std::pair{"--image", ChatKind::Image}, std::pair{"--audio", ChatKind::Audio}})
        if (a.multi.count(opt))
            for (const auto& f : a.multi.at(opt))
                if (std::string err = chat.attach(kind, f, opt); !err.empty()) throw RunError(err);
    if (a.multi.count("--video"))
        for (const auto& f : a.multi.at("--video"))
            if (std::string err = attach_video(chat, f, "--video", a.on("--video-audio")); !err.empty())
                throw RunError(err);

    const bool tty = ::isatty(0);
    if (tty) std::fprintf(stderr, "g4 chat: /help lists the commands; Ctrl-C stops a reply, Ctrl-D quits\n");
    Canceller canceller(s.s);
    LineReader reader(tty);
    std::string line;
    int streak = 0;
    while (reader.read(&line, &streak)) {
        if (line == "/exit" || line == "/quit") break;
        if (run_command(chat, line)) continue;
        if (line.rfind("//", 0) == 0) line.erase(0, 1);
        if (line.empty() && chat.pending.empty()) continue;
        g_interrupted = 0;
        g_busy        = 1;
        if (!chat.prepare(line)) {
            g_busy        = 0;
            streak        = g_interrupted ? 1 : 0;
            g_interrupted = 0;
            continue;
        }
        g4_generate_params gp = g4_generate_params_default();
        gp.max_tokens         = n_predict;
        gp.ignore_eos         = a.on("--ignore-eos");
        StreamState ss;
        ss.echo      = !print_ids;
        ss.stop_flag = &g_interrupted;
        g4_status st = g4_session_generate(s.s, &sp, &gp, on_token, &ss, nullptr);
        g_busy       = 0;
        if (print_ids) std::printf("%s", join_ids(ss.ids).c_str());
        std::printf("\n");
        std::fflush(stdout);
        const bool stopped = g_interrupted != 0;
        g_interrupted      = 0;
        streak             = stopped ? 1 : 0;
        if (stopped) std::fprintf(stderr, "[reply stopped; the conversation goes on]\n");
        chat.fed.insert(chat.fed.end(), ss.ids.begin(), ss.ids.end());
        if (st == G4_ERR_CONTEXT_FULL) {
            std::printf("[context full: conversation reset]\n");
            std::fflush(stdout);
            chat.reset();
            continue;
        }
        if (st != G4_OK && st != G4_ERR_CANCELLED)
            std::fprintf(stderr, "g4 chat: error: %s\n", g4_last_error_message());
        if (st != G4_OK && g4_session_position(s.s) != (int32_t)chat.fed.size()) chat.restart();
        chat.turns.push_back({"model", ss.text, {}});
        if (a.on("--stats")) print_stats(s.s, e.e, e.info);
    }
    return 0;
}

} // namespace g4::cli
