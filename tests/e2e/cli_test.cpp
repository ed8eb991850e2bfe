// The g4 CLI's own behaviour on the tiny fixtures: --help of every subcommand, short usage errors, run's
// notes and --chat, statistics on stderr, inspect's summary and detail flags, a plan without a tokenizer,
// and the media-id error of the setup demo's checkpoint.
#include "test_util.h"

#include <algorithm>
#include <cstdio>
#include <gtest/gtest.h>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace g4test;

size_t count_lines(const std::string& s) {
    return (size_t)std::count(s.begin(), s.end(), '\n');
}

// Every option each subcommand took before the option tables: --help must list all of them.
const std::map<std::string, std::vector<std::string>> kOptions = {
    {"compile",
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
      "--kernel-trace",
      "--double-quant",
      "--no-fidelity",
      "--dry-run",
      "--no-vision",
      "--no-audio",
      "--deterministic"}},
    {"run", {"-n",
             "--temp",
             "--top-k",
             "--top-p",
             "--min-p",
             "--repeat-penalty",
             "--repeat-last-n",
             "--seed",
             "--threads",
             "--stop",
             "--tokens",
             "-p",
             "--dump-logits",
             "--dump-decode-logits",
             "--image",
             "--audio",
             "--ignore-eos",
             "--print-ids",
             "--stats",
             "--truncate",
             "--chat"}},
    {"chat",
     {"-n", "--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--repeat-last-n", "--seed",
      "--threads", "--stop", "--system", "--image", "--audio", "--stats", "--print-ids", "--ignore-eos"}},
    {"serve",
     {"--host", "--port", "--max-sessions", "--threads", "--max-queue", "--api-key-file", "--api-key",
      "--model-name", "--max-body", "--timeout", "--max-tokens", "--media-dir"}},
    {"bench", {"-p", "-n", "-d", "-r", "--threads", "--json"}},
    {"tokenize", {"--tokenizer", "--add-special"}},
    {"inspect", {"--verify", "--ops", "--tensors", "--all"}},
};

TEST(Cli, HelpOfEverySubcommand) {
    for (const auto& [cmd, opts] : kOptions) {
        for (const char* flag : {"--help", "-h"}) {
            CmdResult r = run_g4(cmd + " " + flag);
            ASSERT_EQ(r.exit_code, 0) << cmd << " " << flag << ": " << r.err;
            EXPECT_EQ(r.out.rfind("usage: g4 " + cmd + " ", 0), 0u) << r.out;
            for (const std::string& o : opts) {
                // "  --temp T" on its own line, then an indented description.
                std::regex line("\n  " + std::regex_replace(o, std::regex("[-]"), "\\-") +
                                "( [^\n]*)?\n      \\S");
                EXPECT_TRUE(std::regex_search(r.out, line)) << cmd << ": " << o << " missing in:\n" << r.out;
            }
        }
        // `g4 help CMD` is the same text; --help after other arguments too.
        EXPECT_EQ(run_g4("help " + cmd).out, run_g4(cmd + " --help").out);
        EXPECT_EQ(run_g4(cmd + " some.plan -n 3 --help").exit_code, 0);
    }
    CmdResult top = run_g4("--help");
    EXPECT_EQ(top.exit_code, 0);
    for (const auto& [cmd, opts] : kOptions)
        EXPECT_NE(top.out.find("  " + cmd + " "), std::string::npos) << top.out;
    const std::string run_help = std::regex_replace(run_g4("run --help").out, std::regex("\\s+"), " ");
    EXPECT_NE(run_help.find("-n N tokens to generate at most"), std::string::npos) << run_help;
    EXPECT_NE(run_help.find("Default: 32"), std::string::npos) << run_help;
}

TEST(Cli, UsageErrorsAreShort) {
    for (const std::string& args : {std::string("run plan.g4plan --bogus"), std::string("compile --model"),
                                    std::string("run"), std::string("inspect a b"), std::string("bench")}) {
        CmdResult r     = run_g4(args);
        std::string cmd = args.substr(0, args.find(' '));
        EXPECT_EQ(r.exit_code, 2) << args;
        EXPECT_EQ(count_lines(r.err), 2u) << args << ":\n" << r.err;
        EXPECT_EQ(r.err.rfind("g4 " + cmd + ": error: ", 0), 0u) << r.err;
        EXPECT_NE(r.err.find("\nsee g4 " + cmd + " --help\n"), std::string::npos) << r.err;
    }
    CmdResult u = run_g4("frobnicate");
    EXPECT_EQ(u.exit_code, 2);
    EXPECT_EQ(count_lines(u.err), 1u) << u.err;
}

class CliPlan : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_  = new TempDir();
        plan_ = dir_->file("tiny.g4plan");
        CmdResult r =
            run_g4("compile --model '" + fixture("e2b_tiny") + "' --weights f32 -o '" + plan_ + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    static void TearDownTestSuite() { delete dir_; }
    static TempDir* dir_;
    static std::string plan_;
};
TempDir* CliPlan::dir_     = nullptr;
std::string CliPlan::plan_ = "";

TEST_F(CliPlan, RunSaysWhenTheLimitStoppedIt) {
    CmdResult r = run_g4("run '" + plan_ + "' --tokens 2,17,99 -n 3 --temp 0 --ignore-eos");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("stopped at the -n limit of 3 tokens (-n N"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), ','), 2) << r.out; // three ids
    // --stats: the figures on stderr, stdout only the generated ids.
    CmdResult s = run_g4("run '" + plan_ + "' --tokens 2,17,99 -n 3 --temp 0 --ignore-eos --stats");
    ASSERT_EQ(s.exit_code, 0) << s.err;
    EXPECT_EQ(s.out, r.out);
    EXPECT_NE(s.err.find("g4: load "), std::string::npos) << s.err;
    // -n 0 generates nothing and has no note.
    CmdResult z = run_g4("run '" + plan_ + "' --tokens 2,17,99 -n 0");
    EXPECT_EQ(z.err.find("-n limit"), std::string::npos) << z.err;
}

// --threads: 0, negative or over 1024 is a usage error of one line; more than the hardware threads runs on
// the hardware threads, with a note; the ids do not depend on the thread count.
TEST_F(CliPlan, ThreadsAreCheckedAndClampedToTheHardware) {
    const std::string run = "run '" + plan_ + "' --tokens 2,17,99 -n 4 --temp 0 --ignore-eos";
    for (const char* bad : {"0", "-2", "1025", "two"}) {
        CmdResult r = run_g4(run + " --threads " + bad);
        EXPECT_EQ(r.exit_code, 2) << bad;
        EXPECT_NE(r.err.find("--threads must be an integer in 1..1024"), std::string::npos) << r.err;
    }
    CmdResult one = run_g4(run + " --threads 1");
    ASSERT_EQ(one.exit_code, 0) << one.err;
    const unsigned hw = std::thread::hardware_concurrency();
    if (hw == 0 || hw >= 1024) GTEST_SKIP() << "hardware threads unknown or >= 1024";
    CmdResult over = run_g4(run + " --threads " + std::to_string(hw + 1));
    ASSERT_EQ(over.exit_code, 0) << over.err;
    EXPECT_NE(over.err.find("--threads " + std::to_string(hw + 1) + " is more than the " +
                            std::to_string(hw) + " hardware threads of this machine: using " +
                            std::to_string(hw)),
              std::string::npos)
        << over.err;
    EXPECT_EQ(over.out, one.out);
}

// A long prompt is fed in whole prefill chunks with a progress display (G4_PROGRESS=always: from the start);
// the ids generated are those of the same prompt without the display.
TEST_F(CliPlan, LongPrefillShowsProgress) {
    std::string ids = "2";
    for (int i = 1; i < 2100; ++i)
        ids += "," + std::to_string(3 + (i * 37) % 500);
    const std::string file = dir_->file("long.ids");
    std::FILE* f           = std::fopen(file.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs(ids.c_str(), f);
    std::fclose(f);
    const std::string args = " run '" + plan_ + "' --tokens @'" + file + "' -n 4 --temp 0";
    CmdResult on           = run_cmd("G4_PROGRESS=always '" + std::string(G4_CLI_PATH) + "'" + args);
    CmdResult off          = run_cmd("G4_PROGRESS=off '" + std::string(G4_CLI_PATH) + "'" + args);
    ASSERT_EQ(on.exit_code, 0) << on.err;
    EXPECT_NE(on.err.find("prefill 2100 tokens: 100%"), std::string::npos) << on.err;
    EXPECT_EQ(off.err.find("prefill"), std::string::npos) << off.err;
    EXPECT_EQ(on.out, off.out);
}

TEST_F(CliPlan, RunChatAppliesTheTemplate) {
    // The same ids as the rendered one-user-turn conversation fed verbatim.
    CmdResult ids = run_g4("tokenize --tokenizer '" + plan_ +
                           "' -- '<bos><|turn>user\nHello there<turn|>\n<|turn>model\n'");
    ASSERT_EQ(ids.exit_code, 0) << ids.err;
    std::string csv = ids.out.substr(0, ids.out.find('\n'));
    CmdResult a     = run_g4("run '" + plan_ + "' --chat -p 'Hello there' -n 6 --temp 0 --print-ids");
    CmdResult b     = run_g4("run '" + plan_ + "' --tokens " + csv + " -n 6 --temp 0");
    ASSERT_EQ(a.exit_code, 0) << a.err;
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_EQ(a.out, b.out);
    CmdResult plain = run_g4("run '" + plan_ + "' -p 'Hello there' -n 6 --temp 0 --print-ids");
    EXPECT_NE(plain.out, a.out); // without --chat the text is fed as it is
    EXPECT_EQ(run_g4("run '" + plan_ + "' --chat --tokens 2,3").exit_code, 2);
}

TEST_F(CliPlan, InspectSummaryByDefaultDetailByFlag) {
    CmdResult s = run_g4("inspect '" + plan_ + "'");
    ASSERT_EQ(s.exit_code, 0) << s.err;
    EXPECT_EQ(s.out.find("\ntensors:\n"), std::string::npos);
    EXPECT_EQ(s.out.find("\nops:\n"), std::string::npos);
    EXPECT_NE(s.out.find("--all both"), std::string::npos) << s.out;
    CmdResult all = run_g4("inspect '" + plan_ + "' --all");
    EXPECT_NE(all.out.find("\ntensors:\n"), std::string::npos);
    EXPECT_NE(all.out.find("\nops:\n"), std::string::npos);
    EXPECT_GT(count_lines(all.out), 4 * count_lines(s.out));
    EXPECT_EQ(run_g4("inspect '" + plan_ + "' --ops").out.find("\ntensors:\n"), std::string::npos);
}

// The setup demo's checkpoint keeps Gemma 4's media ids, outside its 512-token vocabulary: the error says so
// and names the fixture that works.
TEST_F(CliPlan, MediaIdsOutsideTheVocabularyAreExplained) {
    CmdResult r = run_g4("run '" + plan_ + "' -p 'Look: <|image|>' --image '" +
                         fixture("towers/image/grey_50x90.png") + "' -n 2");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(count_lines(r.err), 1u) << r.err;
    EXPECT_NE(r.err.find("outside its 512-token vocabulary"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("e2b_tiny_mm"), std::string::npos) << r.err;
}

// A checkpoint without tokenizer.json compiles with a warning saying what it means; `run -p` then says why
// it cannot tokenize; ids still work.
TEST(Cli, PlanWithoutTokenizer) {
    TempDir td;
    const std::string plan = td.file("notok.g4plan");
    CmdResult c =
        run_g4("compile --model '" + fixture("e2b_tiny_text") + "' --weights f32 -o '" + plan + "'");
    ASSERT_EQ(c.exit_code, 0) << c.err;
    EXPECT_NE(c.err.find("warning: " + fixture("e2b_tiny_text") + " has no tokenizer.json"),
              std::string::npos)
        << c.err;
    CmdResult r = run_g4("run '" + plan + "' -p hello -n 2");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(count_lines(r.err), 1u) << r.err;
    EXPECT_NE(r.err.find("has no tokenizer"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--tokenizer FILE"), std::string::npos) << r.err;
    EXPECT_EQ(run_g4("run '" + plan + "' --tokens 2,3 -n 2").exit_code, 0);
}

// Off a terminal, the long stages of compile report percent lines on stderr (G4_PROGRESS=always: from their
// start; unset, a stage as short as the tiny model's shows none); the fidelity figure is explained.
TEST(Cli, CompileProgressAndFidelityExplained) {
    TempDir td;
    const std::string args = "compile --model '" + fixture("e2b_tiny") + "' -o '" + td.file("p.g4plan") + "'";
    CmdResult c            = run_cmd("G4_PROGRESS=always '" + std::string(G4_CLI_PATH) + "' " + args);
    ASSERT_EQ(c.exit_code, 0) << c.err;
    for (const char* s :
         {"g4 compile: weights: 0%\n", "g4 compile: weights: 100%\n", "g4 compile: fidelity: 100%\n",
          "fidelity: relative L2 logit error", "0 = identical"})
        EXPECT_NE(c.err.find(s), std::string::npos) << s << " missing in:\n" << c.err;
    CmdResult quiet = run_cmd("G4_PROGRESS=off '" + std::string(G4_CLI_PATH) + "' " + args);
    ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
    EXPECT_EQ(quiet.err.find("g4 compile: weights:"), std::string::npos) << quiet.err;
}

} // namespace
