// Prompt caching through the C API: the time to compute a prompt (prefill) against the time to save its
// session state to a file and load it into a fresh session, and whether the loaded session's next-token
// logits are bit-identical. Medians of --reps runs. Driven by bench/e2e/state_bench.sh.
// Usage: state_bench PLAN [--tokens N] [--reps R] [--threads T] [--dir D]
#include "g4/g4.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int fail(const char* what) {
    std::fprintf(stderr, "state_bench: %s: %s\n", what, g4_last_error_message());
    return 1;
}

} // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: state_bench PLAN [--tokens N] [--reps R] [--threads T] [--dir D]\n");
        return 2;
    }
    int tokens = 2000, reps = 5, threads = 0;
    std::string dir = "/tmp";
    for (int i = 2; i + 1 < argc; i += 2) {
        std::string k = argv[i];
        if (k == "--tokens")
            tokens = std::atoi(argv[i + 1]);
        else if (k == "--reps")
            reps = std::atoi(argv[i + 1]);
        else if (k == "--threads")
            threads = std::atoi(argv[i + 1]);
        else if (k == "--dir")
            dir = argv[i + 1];
        else {
            std::fprintf(stderr, "state_bench: unknown option %s\n", k.c_str());
            return 2;
        }
    }
    if (tokens < 1 || reps < 1) {
        std::fprintf(stderr, "state_bench: --tokens and --reps must be positive\n");
        return 2;
    }
    g4_engine* e = nullptr;
    if (g4_engine_open(argv[1], nullptr, &e) != G4_OK) return fail(argv[1]);
    g4_engine_info info;
    g4_engine_get_info(e, &info);
    if (tokens > info.max_context - 1) {
        std::fprintf(stderr, "state_bench: --tokens %d does not fit the plan's max context %d\n", tokens,
                     info.max_context);
        return 2;
    }
    std::mt19937 rng(1);
    std::vector<int32_t> ids(tokens);
    ids[0] = info.bos_token_id;
    for (int i = 1; i < tokens; ++i)
        ids[i] = 3 + (int32_t)(rng() % (uint32_t)std::min(info.vocab_size - 3, 5000));
    g4_session_params sp   = g4_session_params_default();
    sp.n_threads           = threads;
    const std::string path = dir + "/state_bench.g4state";
    std::vector<double> prefill, save, load;
    size_t bytes = 0;
    bool same    = true;
    for (int r = 0; r < reps; ++r) {
        g4_session *a = nullptr, *b = nullptr;
        if (g4_session_create(e, &sp, &a) != G4_OK || g4_session_create(e, &sp, &b) != G4_OK)
            return fail("session");
        auto t0 = std::chrono::steady_clock::now();
        if (g4_session_append_tokens(a, ids.data(), ids.size(), nullptr, 0) != G4_OK) return fail("prefill");
        prefill.push_back(ms_since(t0));
        t0 = std::chrono::steady_clock::now();
        if (g4_session_save_state_file(a, path.c_str()) != G4_OK) return fail("save");
        save.push_back(ms_since(t0));
        g4_session_state_size(a, &bytes);
        t0 = std::chrono::steady_clock::now();
        if (g4_session_load_state_file(b, path.c_str()) != G4_OK) return fail("load");
        load.push_back(ms_since(t0));
        // The next token's logits, fed in both sessions.
        const int32_t next = ids[tokens / 2];
        const float *la = nullptr, *lb = nullptr;
        int32_t v = 0;
        if (g4_session_append_tokens(a, &next, 1, nullptr, 0) != G4_OK ||
            g4_session_append_tokens(b, &next, 1, nullptr, 0) != G4_OK)
            return fail("next token");
        g4_session_get_logits(a, &la, &v);
        g4_session_get_logits(b, &lb, &v);
        same = same && std::memcmp(la, lb, sizeof(float) * (size_t)v) == 0;
        g4_session_destroy(a);
        g4_session_destroy(b);
    }
    std::remove(path.c_str());
    const double p = median(prefill), s = median(save), l = median(load);
    std::printf("plan %s: %d-token prompt, %d layers, max context %d, medians of %d runs\n", argv[1], tokens,
                info.num_layers, info.max_context, reps);
    std::printf("  prefill (compute the prompt)   %9.2f ms\n", p);
    std::printf("  save state to a file           %9.2f ms  (%.2f MiB)\n", s, bytes / 1048576.0);
    std::printf("  load state from the file       %9.2f ms\n", l);
    std::printf("  time saved by loading          %9.2f ms  (%.1fx faster than prefill)\n", p - l, p / l);
    std::printf("  next-token logits after load   %s\n", same ? "bit-identical" : "DIFFER");
    g4_engine_close(e);
    return same ? 0 : 1;
}
