// g4: the command-line tool. `g4 compile` turns a Hugging Face checkpoint into a plan (compiler);
// `g4 run`, `chat`, `serve`, `bench` replay a plan through the C API (runtime/include/g4/g4.h); `g4 inspect`
// prints a plan; `g4 tokenize` prints token ids. Each subcommand lives in tools/cmd_*.cpp with its option
// table; `g4 CMD --help` prints it. Every failure prints one line "g4 CMD: error: ..." on stderr and exits
// non-zero.
#include "compiler/error.h"
#include "kernels/cpu/dispatch.h"
#include "tools/cli_common.h"

#include <cstdio>
#include <cstring>
#include <string>

namespace {

using g4::cli::Command;

const Command* const kCommands[]     = {&g4::cli::kCompile, &g4::cli::kRun,   &g4::cli::kChat,
                                        &g4::cli::kServe,   &g4::cli::kBench, &g4::cli::kTokenize,
                                        &g4::cli::kInspect};
int (*const kRunners[])(int, char**) = {g4::cli::cmd_compile, g4::cli::cmd_run,   g4::cli::cmd_chat,
                                        g4::cli::cmd_serve,   g4::cli::cmd_bench, g4::cli::cmd_tokenize,
                                        g4::cli::cmd_inspect};

void print_overview(std::FILE* f) {
    std::fprintf(
        f, "usage: g4 COMMAND [options]   (g4 COMMAND --help: its options and defaults)\n\ncommands:\n");
    for (const Command* c : kCommands)
        std::fprintf(f, "  %-9s %s\n", c->name, c->synopsis);
    std::fprintf(f, "  %-9s %s\n  %-9s %s\n\n", "help", "[COMMAND]", "version", "");
    std::fprintf(f, "Quick start: g4 compile --model DIR -o model.g4plan, then g4 chat model.g4plan "
                    "(README.md).\n");
}

} // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        print_overview(stderr);
        return 2;
    }
    std::string cmd = argv[1];
    if (cmd == "-h" || cmd == "--help" || cmd == "help") {
        if (cmd == "help" && argc > 2)
            for (const Command* c : kCommands)
                if (argv[2] == std::string(c->name)) {
                    g4::cli::print_help(*c);
                    return 0;
                }
        if (cmd == "help" && argc > 2) {
            std::fprintf(stderr, "g4 help: error: unknown command '%s'\n", argv[2]);
            print_overview(stderr);
            return 2;
        }
        print_overview(stdout);
        return 0;
    }
    if (cmd == "--version" || cmd == "version") {
        std::printf(
            "g4 %s\nCPU kernels: %s (this CPU and build: %s)\nTowers' bf16 matmuls on the CPU: %s GEMM\n",
            g4_runtime_version(), g4::cpu::level_name(g4::cpu::active_level()), g4::cpu::supported_levels(),
            g4::cpu::gemm_bf16_preferred() ? "bf16" : "fp32");
        return 0;
    }
    for (size_t i = 0; i < sizeof kCommands / sizeof kCommands[0]; ++i) {
        if (cmd != kCommands[i]->name) continue;
        if (g4::cli::wants_help(argc, argv, 2)) {
            g4::cli::print_help(*kCommands[i]);
            return 0;
        }
        try {
            return kRunners[i](argc, argv);
        } catch (const g4::cli::UsageError& e) {
            std::fprintf(stderr, "g4 %s: error: %s\nsee g4 %s --help\n", cmd.c_str(), e.what(), cmd.c_str());
            return 2;
        } catch (const std::exception& e) { // RunError, g4::CompileError, anything else: one line
            std::fprintf(stderr, "g4 %s: error: %s\n", cmd.c_str(), e.what());
            return 1;
        }
    }
    std::fprintf(stderr, "g4: error: unknown command '%s' (g4 --help lists the commands)\n", cmd.c_str());
    return 2;
}
