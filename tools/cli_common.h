// Shared pieces of the g4 CLI's subcommands (tools/cmd_*.cpp): each command's option table (the parser and
// `g4 <cmd> --help` read the same table, so the help cannot miss an option), argument parsing, the errors a
// command throws (main turns them into one line on stderr), and helpers over the C API.
#pragma once
#include "g4/g4.h"
#include "runtime/src/media/video_decode.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace g4::cli {

// A usage mistake: main prints "g4 CMD: error: ..." and "see g4 CMD --help", exit 2.
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
// A failure of the work itself: main prints "g4 CMD: error: ...", exit 1.
struct RunError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct Option {
    const char* name;  // "--temp", "-n"
    const char* value; // placeholder of the value ("T"), nullptr for a switch
    const char* help;  // meaning and default, one or more sentences
};

struct Command {
    const char* name;     // "run"
    const char* synopsis; // "PLAN (-p TEXT | --tokens IDS) [options]"
    const char* summary;  // one line for `g4 --help`
    std::vector<Option> options;
    const char* notes = ""; // printed after the options
};

// Prints `g4 NAME --help` to stdout.
void print_help(const Command& c);

// The parsed command line of one subcommand; unknown options and missing values are UsageErrors.
struct Args {
    std::vector<std::string> pos;
    std::map<std::string, std::string> val;
    std::map<std::string, bool> flag;
    std::map<std::string, std::vector<std::string>> multi; // every value of a repeated option
    std::vector<std::pair<std::string, std::string>> seq;  // every valued option, in command-line order

    Args(int argc, char** argv, int first, const Command& c);
    bool has(const std::string& k) const { return val.count(k) > 0; }
    bool on(const std::string& k) const { return flag.count(k) > 0; }
    std::string get(const std::string& k, const std::string& def = "") const {
        return has(k) ? val.at(k) : def;
    }
};

// True when argv (after the command) asks for help: -h or --help before any "--".
bool wants_help(int argc, char** argv, int first);

long long parse_int(const std::string& name, const std::string& s, long long lo, long long hi);
// --threads N: 1..1024, clamped with one line on stderr to the hardware threads when more (a worker waits for
// every other at each parallel op: threads beyond the cores only add waits); 0 when absent (the default).
int32_t parse_threads(const Args& a);
double parse_float(const std::string& name, const std::string& s);
std::vector<int32_t> parse_tokens(const std::string& s);
std::string join_ids(const std::vector<int32_t>& ids);
std::string read_whole_file(const std::string& path, const char* what);

void check(g4_status st); // RunError with g4_last_error_message() unless G4_OK

struct Engine {
    g4_engine* e = nullptr;
    g4_engine_info info{};
    Engine()              = default;
    Engine(const Engine&) = delete;
    ~Engine() { g4_engine_close(e); }
};
struct Session {
    g4_session* s           = nullptr;
    Session()               = default;
    Session(const Session&) = delete;
    ~Session() { g4_session_destroy(s); }
};

void open_engine(const std::string& path, Engine* e);
void create_session(const Args& a, g4_engine* eng, Session* s);
// The plan's sampling defaults with the options of kSamplingOptions applied (and checked).
g4_sampling_params sampling_from_args(const Args& a, g4_engine* eng);
std::vector<int32_t> tokenize(g4_engine* eng, const std::string& text, bool add_special);
// RunError explaining why a plan without a tokenizer cannot take text (`what`: "-p", "chat").
void require_tokenizer(const g4_engine_info& info, const std::string& plan, const char* what);
// RunError when the plan's media marker ids (<boi>, <eoi>, <boa>, <eoa>) lie outside its vocabulary.
void check_media_ids(const g4_engine_info& info, const g4_media_info& mi, bool image);
void print_stats(g4_session* s, const g4_engine* e, const g4_engine_info& info);

// The sampling and session options run and chat share (-n's default differs: given by each command).
std::vector<Option> sampling_options(const char* n_help);

// The media limits run and chat take at run time: --video-frames, --max-video-seconds,
// --max-video-stream-frames, --max-video-bytes (defaults: the plan's), and --max-video-pixels,
// --max-image-pixels, --max-audio-seconds, which may only lower the plan's (its session buffers are sized
// for them).
std::vector<Option> media_limit_options();
// Applies them: lowers mi's max_image_pixels / max_audio_samples, returns the video limits (the plan's
// with the flags applied).
g4::media::VideoLimits media_limits(const Args& a, g4_media_info* mi);

// Token streaming into a string (and stdout when echo).
struct StreamState {
    std::vector<int32_t> ids;
    std::string text;
    bool echo           = true;
    g4_session* session = nullptr; // set: each token's step logits are appended to decode_logits
    std::vector<float> decode_logits;
    g4_status logits_status           = G4_OK;
    const std::atomic<int>* stop_flag = nullptr; // non-zero: stop generating (chat's Ctrl-C)
};
int32_t on_token(void* user, int32_t token, const char* text, size_t len);
g4_status append_last_logits(g4_session* s, std::vector<float>* out);

// Progress of a long stage on stderr: a bar on a terminal, a line every 10% otherwise; nothing for a stage
// that ends (or fails) within its first second, so quick commands and their one-line errors stay as they are.
class Progress {
public:
    explicit Progress(std::string label);
    ~Progress(); // ends a bar's line (a failure's error then starts on a line of its own)
    Progress(const Progress&) = delete;
    void update(double fraction); // 0..1
    void done();

private:
    std::string label_;
    bool tty_;
    double start_;
    int last_      = -1;
    bool finished_ = false;
};

// The subcommands (tools/cmd_*.cpp) and their tables.
extern const Command kCompile, kRun, kChat, kServe, kBench, kTokenize, kInspect;
int cmd_compile(int argc, char** argv);
int cmd_run(int argc, char** argv);
int cmd_chat(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_inspect(int argc, char** argv);

} // namespace g4::cli
