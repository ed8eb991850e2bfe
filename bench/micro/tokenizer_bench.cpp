// Tokenizer throughput: encode ~1 MB of mixed text (English, code, CJK, emoji, whitespace runs)
// with the real 262k-token Gemma tokenizer on one core; reports the median of 5 runs. Built with the project
// (build/bench/micro/tokenizer_bench).
// Usage: tokenizer_bench [tokenizer.json] (default: the build's G4_GEMMA_TOKENIZER_JSON)
#include "bench/micro/bench_tokenizer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    g4::Tokenizer tk;
    double load_ms = 0;
    if (!load_bench_tokenizer(argc, argv, "tokenizer_bench", &tk, &load_ms)) return 1;

    const char* pieces[] = {
        "The quick brown fox jumps over the lazy dog. ",
        "int main(int argc, char** argv) { return 0; }\n",
        "東京は日本の首都です。",
        "Привет, как дела? ",
        "مرحبا بالعالم ",
        "👩‍👩‍👧‍👦 👍🏽 🇯🇵 ",
        "    \t\t\n\n  ",
        "https://example.com/path?query=1&x=2 ",
        "Supercalifragilisticexpialidocious ",
        "1234567890 3.14159 ",
    };
    std::string text;
    for (size_t i = 0; text.size() < (1u << 20); ++i)
        text += pieces[(i * 7) % 10];
    std::vector<double> ms;
    std::vector<int32_t> ids;
    for (int r = 0; r < 5; ++r) {
        auto a = std::chrono::steady_clock::now();
        tk.encode(text, false, &ids);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
    }
    std::sort(ms.begin(), ms.end());
    std::string back;
    auto d0 = std::chrono::steady_clock::now();
    tk.decode(ids.data(), ids.size(), false, &back);
    double dec_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - d0).count();
    std::printf("tokenizer_bench: load %.0f ms; encode %.2f MB -> %zu ids: median %.1f ms (%.1f MB/s, 1 "
                "core); decode %.1f ms; "
                "round trip %s\n",
                load_ms, text.size() / 1048576.0, ids.size(), ms[2],
                text.size() / 1048576.0 / (ms[2] / 1000.0), dec_ms, back == text ? "exact" : "DIFFERS");
    return back == text ? 0 : 1;
}
