// Streaming detokenization cost per generated token (g4_session_generate's TextStream): random ids
// from the real 262k-token Gemma tokenizer pushed one at a time, with the incremental path and with
// whole-generation decodes of every token so far, alternated; the median time of the 64 pushes before 1K, 4K
// and 16K tokens, per side. CPU only; built with the project (build/bench/micro/text_stream_bench).
// Usage: text_stream_bench [tokenizer.json] (default: the build's G4_GEMMA_TOKENIZER_JSON)
#include "bench/micro/bench_tokenizer.h"
#include "runtime/src/text_stream.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    g4::Tokenizer tk;
    if (!load_bench_tokenizer(argc, argv, "text_stream_bench", &tk)) return 1;
    const int marks[] = {1024, 4096, 16384};
    std::mt19937 rng(1);
    std::vector<int32_t> ids(16384);
    for (auto& i : ids)
        i = 1000 + (int32_t)(rng() % 200000);
    std::printf("%-22s %14s %14s %14s\n", "us a token at", "1K tokens", "4K tokens", "16K tokens");
    for (bool incremental : {true, false}) {
        g4::TextStream ts(&tk, {"<end_of_turn>"}, incremental);
        std::vector<double> window;
        double med[3] = {};
        int m         = 0;
        for (int i = 0; i < (int)ids.size(); ++i) {
            bool stop = false;
            auto t0   = std::chrono::steady_clock::now();
            ts.push(ids[i], &stop);
            const double us =
                std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
            if (i >= marks[m] - 64) window.push_back(us);
            if (i == marks[m] - 1) {
                std::nth_element(window.begin(), window.begin() + window.size() / 2, window.end());
                med[m++] = window[window.size() / 2];
                window.clear();
                if (m == 3) break;
            }
        }
        std::printf("%-22s %14.1f %14.1f %14.1f\n", incremental ? "incremental" : "whole decodes", med[0],
                    med[1], med[2]);
    }
    return 0;
}
