// The real 262k-token Gemma tokenizer for the CPU benchmarks: argv[1], else the file named by the compile
// definition G4_GEMMA_TOKENIZER (bench/CMakeLists.txt sets it from the CMake variable
// G4_GEMMA_TOKENIZER_JSON). Prints why on stderr and returns false if there is none or it cannot be read or
// loaded; *load_ms (may be null) gets the parse time.
#pragma once
#include "runtime/src/tokenizer.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

inline bool load_bench_tokenizer(int argc, char** argv, const char* prog, g4::Tokenizer* tk,
                                 double* load_ms = nullptr) {
#ifdef G4_GEMMA_TOKENIZER
    const std::string path = argc > 1 ? argv[1] : std::string(G4_GEMMA_TOKENIZER);
#else
    const std::string path = argc > 1 ? argv[1] : std::string();
#endif
    if (path.empty()) {
        std::fprintf(stderr,
                     "%s: no tokenizer: pass a Gemma tokenizer.json or configure with "
                     "-DG4_GEMMA_TOKENIZER_JSON=FILE\n",
                     prog);
        return false;
    }
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        std::fprintf(stderr, "%s: cannot read %s\n", prog, path.c_str());
        return false;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    const auto t0 = std::chrono::steady_clock::now();
    std::string err;
    if (!g4::Tokenizer::load_from_json(ss.str(), tk, &err)) {
        std::fprintf(stderr, "%s: %s\n", prog, err.c_str());
        return false;
    }
    if (load_ms)
        *load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return true;
}
