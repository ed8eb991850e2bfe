// `g4 bench`: llama-bench style prompt-processing and decode throughput of a plan, in one warm process.
#include "kernels/cpu/dispatch.h"
#include "tools/cli_common.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

namespace g4::cli {

namespace {

std::vector<int> parse_int_list(const std::string& opt, const std::string& v, long long lo, long long hi) {
    std::vector<int> out;
    std::stringstream ss(v);
    std::string t;
    while (std::getline(ss, t, ','))
        out.push_back((int)parse_int(opt, t, lo, hi));
    if (out.empty()) throw UsageError(opt + ": expected a comma-separated list of numbers");
    return out;
}

// llama-bench style measurement in one warm process: prompt processing (feed P tokens, pick the first
// greedy token) and greedy decode (N steps after a D-token prompt). Synthetic prompt ids cycle through
// the vocabulary; medians over the repetitions, each test warmed up once first.
} // namespace

const Command kBench = {
    "bench",
    "PLAN [options]",
    "Measures like llama-bench, in one warm process: ppP feeds a fresh P-token prompt and picks the first "
    "token "
    "(time to first token); tgN@dD times N greedy decode steps after a D-token prompt. Each test runs once "
    "to "
    "warm up, then -r times; medians are printed. Prompt ids are synthetic and cycle through the vocabulary.",
    {{"-p", "P,P,...", "prompt lengths to measure. Default: 512"},
     {"-n", "N", "greedy decode steps of each tg test (0: none). Default: 128"},
     {"-d", "D,D,...", "prompt depths the decode tests start from. Default: 0"},
     {"-r", "R", "repetitions of each test after the warm-up. Default: 3"},
     {"--threads", "N",
      "CPU worker threads, 1..1024 (more than the hardware threads: the hardware threads, with a note). "
      "Default: G4_THREADS, else every hardware thread"},
     {"--json", nullptr, "print every repetition as JSON instead of the table"}}};

int cmd_bench(int argc, char** argv) {
    Args a(argc, argv, 2, kBench);
    if (a.pos.size() != 1) throw UsageError("expected exactly one PLAN argument");
    Engine e;
    open_engine(a.pos[0], &e);
    const int maxc      = e.info.max_context;
    std::vector<int> pp = parse_int_list("-p", a.get("-p", "512"), 1, 1 << 30);
    std::vector<int> dd = parse_int_list("-d", a.get("-d", "0"), 0, 1 << 30);
    const int n         = (int)parse_int("-n", a.get("-n", "128"), 0, 1 << 30);
    const int reps      = (int)parse_int("-r", a.get("-r", "3"), 1, 1000);
    for (int p : pp)
        if (p >= maxc)
            throw RunError("-p " + std::to_string(p) + " does not fit the plan's max context " +
                           std::to_string(maxc));
    for (int d : dd)
        if (std::max(d, 1) + n > maxc)
            throw RunError("-d " + std::to_string(d) + " plus -n " + std::to_string(n) +
                           " does not fit the plan's max context " + std::to_string(maxc) +
                           " (recompile with a larger --max-context)");
    Session s;
    create_session(a, e.e, &s);
    auto ids_of = [&](int len) {
        std::vector<int32_t> ids(len);
        for (int i = 0; i < len; ++i)
            ids[i] = (int32_t)(((long long)i * 7919 + 13) % (e.info.vocab_size - 1) + 1);
        if (e.info.bos_token_id >= 0) ids[0] = e.info.bos_token_id;
        return ids;
    };
    using clk     = std::chrono::steady_clock;
    auto ms_since = [](clk::time_point t0) {
        return std::chrono::duration<double, std::milli>(clk::now() - t0).count();
    };
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    };
    struct Row {
        std::string test;
        int tokens, depth;
        double ms, tok_s;
        std::vector<double> all;
    };
    std::vector<Row> rows;
    int32_t tok = 0;
    for (int p : pp) { // prompt processing: time to the first token of a fresh P-token prompt
        std::vector<int32_t> ids = ids_of(p);
        std::vector<double> t;
        for (int r = 0; r <= reps; ++r) {
            check(g4_session_reset(s.s));
            auto t0 = clk::now();
            check(g4_session_append_tokens(s.s, ids.data(), ids.size(), nullptr, 0));
            check(g4_session_sample(s.s, nullptr, &tok));
            if (r) t.push_back(ms_since(t0));
        }
        double m = median(t);
        rows.push_back({"pp" + std::to_string(p), p, 0, m, p * 1000.0 / m, t});
    }
    if (n > 0)
        for (int d : dd) { // decode: N greedy steps after a D-token prompt
            std::vector<int32_t> ids = ids_of(std::max(d, 1));
            std::vector<double> t;
            for (int r = 0; r <= reps; ++r) {
                check(g4_session_reset(s.s));
                check(g4_session_append_tokens(s.s, ids.data(), ids.size(), nullptr, 0));
                check(g4_session_sample(s.s, nullptr, &tok));
                auto t0 = clk::now();
                for (int i = 0; i < n; ++i) {
                    check(g4_session_append_tokens(s.s, &tok, 1, nullptr, 0));
                    check(g4_session_sample(s.s, nullptr, &tok));
                }
                if (r) t.push_back(ms_since(t0));
            }
            double m = median(t);
            rows.push_back({"tg" + std::to_string(n) + "@d" + std::to_string(d), n, d, m, n * 1000.0 / m, t});
        }
    if (a.flag.count("--json")) {
        nlohmann::json j = nlohmann::json::array();
        for (const Row& r : rows)
            j.push_back({{"test", r.test},
                         {"tokens", r.tokens},
                         {"depth", r.depth},
                         {"median_ms", r.ms},
                         {"tok_s", r.tok_s},
                         {"ms", r.all},
                         {"cpu_kernels", g4::cpu::level_name(g4::cpu::active_level())}});
        std::printf("%s\n", j.dump().c_str());
        return 0;
    }
    std::printf("CPU kernels: %s\n", g4::cpu::level_name(g4::cpu::active_level()));
    std::printf("%-14s %8s %8s %12s %12s\n", "test", "tokens", "depth", "median ms", "tok/s");
    for (const Row& r : rows)
        std::printf("%-14s %8d %8d %12.2f %12.1f\n", r.test.c_str(), r.tokens, r.depth, r.ms, r.tok_s);
    return 0;
}

} // namespace g4::cli
