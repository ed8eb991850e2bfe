// Shared helpers for the GoogleTest suite: temporary directories, file I/O, running the g4 CLI, gating the
// CUDA tests.
#pragma once
#include "compiler/cuda_compile.h"

#include <cstdint>
#include <gtest/gtest.h>
#include <string>
#include <utility>
#include <vector>

namespace g4test {

// A fresh empty directory under the system temp dir, removed (recursively) when the object dies.
struct TempDir {
    TempDir();
    ~TempDir();
    std::string path;
    std::string file(const std::string& name) const { return path + "/" + name; }
};

std::string fixtures_dir();                  // tests/fixtures in the source tree
std::string fixture(const std::string& rel); // fixtures_dir() + "/" + rel
std::string cli_path();                      // the built g4 binary

std::string read_file(const std::string& path); // throws std::runtime_error if unreadable
void write_file(const std::string& path, const std::string& bytes);
bool file_exists(const std::string& path);
std::vector<float> read_f32(const std::string& path); // raw little-endian float32

struct CmdResult {
    int exit_code = -1; // the process exit status; 128+signal if killed by a signal
    std::string out;    // stdout
    std::string err;    // stderr
};
// Runs `cmd` through /bin/sh with stdout and stderr captured separately.
CmdResult run_cmd(const std::string& cmd);
// Runs the g4 CLI with the given argument string (already shell-quoted where needed).
CmdResult run_g4(const std::string& args);

// Empty, or why tests should skip: G4_CPU_LEVEL names a CPU kernel level (kernels/cpu/dispatch.h) that this
// CPU or build lacks, so another level runs. ctest repeats the CPU kernel tests once per level with it set;
// every test executable (test_util.cpp registers a global gtest environment) then skips all its tests.
std::string cpu_level_missing();

// Whether the tests run their CUDA variants: G4_TEST_CUDA=1 in a build with the CUDA toolkit (NVRTC). A build
// without it compiles no CUDA plan, so the tests run as without G4_TEST_CUDA.
bool on_cuda();

// n samples of N(0, sd^2) from a fixed seed (std::mt19937), and their bf16 bits (round to nearest even).
std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f);
std::vector<uint16_t> to_bf16(const std::vector<float>& v);

// Plan files (runtime/plan/plan_format.h) patched in place by tests: the [offset, size) of the first
// section of `kind` ({0, 0} if none), and every checksum (sections, section table, header) recomputed so a
// patched record passes the integrity checks and only the plan validation can refuse it.
std::pair<uint64_t, uint64_t> plan_section(const std::string& plan, uint32_t kind);
void reseal_plan(std::string* plan);

// Relative L2 error ||a-b|| / ||b||, in double precision.
double rel_l2(const float* a, const float* b, size_t n);
std::vector<int32_t> parse_ids(const std::string& csv); // "1,2,3" -> {1,2,3}

} // namespace g4test

// Skips the current test in a build without the CUDA toolkit (NVRTC), which compiles no CUDA plan.
#define G4_SKIP_WITHOUT_NVRTC()                                                                              \
    do {                                                                                                     \
        if (!g4::cuda::nvrtc_available()) GTEST_SKIP() << "this build has no CUDA toolkit (NVRTC)";          \
    } while (0)
