// Tokenizer throughput: encode ~1 MB of mixed text (English, code, CJK, emoji, whitespace runs)
// with the real 262k-token Gemma tokenizer on one core; reports the median of 5 runs.
// Usage: tokenizer_bench [tokenizer.json] (default ../shared/tokenizers/gemma3/tokenizer.json)
#include "runtime/src/tokenizer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    std::string path = argc > 1 ? argv[1] : std::string(G4_SOURCE_DIR) + "/../shared/tokenizers/gemma3/tokenizer.json";
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        std::fprintf(stderr, "tokenizer_bench: cannot read %s\n", path.c_str());
        return 1;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    auto t0 = std::chrono::steady_clock::now();
    g4::Tokenizer tk;
    std::string err;
    if (!g4::Tokenizer::load_from_json(ss.str(), &tk, &err)) {
        std::fprintf(stderr, "tokenizer_bench: %s\n", err.c_str());
        return 1;
    }
    double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    const char* pieces[] = {
        "The quick brown fox jumps over the lazy dog. ", "int main(int argc, char** argv) { return 0; }\n",
        "東京は日本の首都です。", "Привет, как дела? ", "مرحبا بالعالم ", "👩‍👩‍👧‍👦 👍🏽 🇯🇵 ", "    \t\t\n\n  ",
        "https://example.com/path?query=1&x=2 ", "Supercalifragilisticexpialidocious ", "1234567890 3.14159 ",
    };
    std::string text;
    for (size_t i = 0; text.size() < (1u << 20); ++i) text += pieces[(i * 7) % 10];
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
    std::printf("tokenizer_bench: load %.0f ms; encode %.2f MB -> %zu ids: median %.1f ms (%.1f MB/s, 1 core); decode %.1f ms; "
                "round trip %s\n", load_ms, text.size() / 1048576.0, ids.size(), ms[2], text.size() / 1048576.0 / (ms[2] / 1000.0),
                dec_ms, back == text ? "exact" : "DIFFERS");
    return back == text ? 0 : 1;
}
