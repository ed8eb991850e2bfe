// Decode throughput of N sessions of one engine: batched steps (g4_sessions_decode, each step one token for
// every session) against the same sessions stepping one after another (g4_session_append_tokens), the two
// alternated, greedy tokens. Prints per N the median aggregate tokens/s of each and their ratio.
//   batch_decode_bench PLAN [--streams 1,2,4,8,16] [--steps 16] [--reps 3] [--threads T] [--prompt 16]
#include "g4/g4.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

int fail(const char* what) {
    std::fprintf(stderr, "batch_decode_bench: %s: %s\n", what, g4_last_error_message());
    return 1;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: batch_decode_bench PLAN [--streams 1,2,4,8,16] [--steps N] [--reps R] "
                             "[--threads T] [--prompt N]\n");
        return 2;
    }
    std::string streams = "1,2,4,8,16";
    int steps = 16, reps = 3, threads = 0, prompt = 16;
    for (int i = 2; i + 1 < argc; i += 2) {
        const std::string k = argv[i];
        if (k == "--streams")
            streams = argv[i + 1];
        else if (k == "--steps")
            steps = std::atoi(argv[i + 1]);
        else if (k == "--reps")
            reps = std::atoi(argv[i + 1]);
        else if (k == "--threads")
            threads = std::atoi(argv[i + 1]);
        else if (k == "--prompt")
            prompt = std::atoi(argv[i + 1]);
        else {
            std::fprintf(stderr, "batch_decode_bench: unknown option %s\n", k.c_str());
            return 2;
        }
    }
    if (steps < 1 || reps < 1 || prompt < 1) {
        std::fprintf(stderr, "batch_decode_bench: --steps, --reps and --prompt must be positive\n");
        return 2;
    }
    g4_engine* e = nullptr;
    if (g4_engine_open(argv[1], nullptr, &e) != G4_OK) return fail(argv[1]);
    g4_engine_info info{};
    g4_engine_get_info(e, &info);
    const int lim = g4_engine_max_batch(e);
    std::printf("plan %s: max batch %d, %d threads a session\n", argv[1], lim, threads);
    std::printf("| streams | batched tok/s | one by one tok/s | ratio |\n|---|---|---|---|\n");
    for (size_t at = 0; at < streams.size();) {
        const size_t comma = streams.find(',', at);
        const int n        = std::atoi(streams.substr(at, comma - at).c_str());
        at                 = comma == std::string::npos ? streams.size() : comma + 1;
        if (n < 1) continue;
        g4_session_params sp = g4_session_params_default();
        sp.n_threads         = threads;
        std::vector<g4_session*> ss(n, nullptr);
        for (int i = 0; i < n; ++i)
            if (g4_session_create(e, &sp, &ss[i]) != G4_OK) return fail("g4_session_create");
        if (prompt + (steps + 1) * 2 * reps > info.max_context) {
            std::fprintf(stderr, "batch_decode_bench: the plan's context is too short for these settings\n");
            return 1;
        }
        std::vector<int32_t> toks(n);
        for (int i = 0; i < n; ++i) {
            std::vector<int32_t> p(prompt);
            for (int k = 0; k < prompt; ++k)
                p[k] = 2 + (i * 131 + k * 17) % std::max(1, info.vocab_size - 2);
            if (g4_session_append_tokens(ss[i], p.data(), p.size(), nullptr, 0) != G4_OK)
                return fail("prefill");
        }
        auto next = [&] {
            for (int i = 0; i < n; ++i)
                if (g4_session_sample(ss[i], nullptr, &toks[i]) != G4_OK) return false;
            return true;
        };
        auto batched = [&] {
            if (!next()) return false;
            for (int j = 0; j < n; j += lim)
                if (g4_sessions_decode(ss.data() + j, std::min(lim, n - j), toks.data() + j) != G4_OK)
                    return false;
            return true;
        };
        auto alone = [&] {
            if (!next()) return false;
            for (int i = 0; i < n; ++i)
                if (g4_session_append_tokens(ss[i], &toks[i], 1, nullptr, 0) != G4_OK) return false;
            return true;
        };
        if (!batched() || !alone()) return fail("warm-up step");
        std::vector<double> tb, ta;
        for (int r = 0; r < reps; ++r)
            for (int side = 0; side < 2; ++side) {
                const auto t0 = std::chrono::steady_clock::now();
                for (int k = 0; k < steps; ++k)
                    if (!(side == 0 ? batched() : alone())) return fail("step");
                const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                (side == 0 ? tb : ta).push_back((double)n * steps / s);
            }
        const double b = median(tb), a = median(ta);
        std::printf("| %d | %.2f | %.2f | %.2fx |\n", n, b, a, b / a);
        std::fflush(stdout);
        for (g4_session* s : ss)
            g4_session_destroy(s);
    }
    g4_engine_close(e);
    return 0;
}
