// g4: the command-line tool. `g4 compile` turns a Hugging Face checkpoint into a plan (compiler);
// `g4 run` replays a plan through the C API (runtime/include/g4/g4.h); `g4 inspect` prints a plan.
// Every failure prints one line "g4 <command>: error: ..." on stderr and exits non-zero.
#include "compiler/compile.h"
#include "compiler/error.h"
#include "g4/g4.h"
#include "runtime/src/plan/plan_reader.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

const char* kUsage =
    "usage:\n"
    "  g4 compile --model DIR [--adapter DIR] [--weights nf4|bf16|f32] [--device cpu|cuda[:N]]\n"
    "             [--max-context N] [--chunk N] [--logits-rows N] -o PLAN\n"
    "  g4 run PLAN --tokens 2,17,99 [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]\n"
    "             [--repeat-penalty R] [--repeat-last-n N] [--seed S] [--ignore-eos] [--print-ids]\n"
    "             [--dump-logits FILE] [--threads N] [--stats]\n"
    "  g4 inspect PLAN [--verify] [--ops] [--tensors]\n";

// Minimal flag parser: flags with values, boolean flags, positionals.
struct Args {
    std::vector<std::string> pos;
    std::map<std::string, std::string> val;
    std::map<std::string, bool> flag;

    Args(int argc, char** argv, int first, const std::vector<std::string>& with_value, const std::vector<std::string>& bools) {
        auto is = [](const std::vector<std::string>& v, const std::string& s) {
            for (auto& x : v)
                if (x == s) return true;
            return false;
        };
        for (int i = first; i < argc; ++i) {
            std::string a = argv[i];
            if (a.size() > 1 && a[0] == '-') {
                std::string v;
                size_t eq = a.find('=');
                bool inline_val = eq != std::string::npos && a.rfind("--", 0) == 0;
                std::string name = inline_val ? a.substr(0, eq) : a;
                if (is(with_value, name)) {
                    if (inline_val) v = a.substr(eq + 1);
                    else if (i + 1 < argc) v = argv[++i];
                    else throw UsageError("option " + name + " needs a value");
                    val[name] = v;
                } else if (is(bools, name) && !inline_val) {
                    flag[name] = true;
                } else {
                    throw UsageError("unknown option " + a);
                }
            } else {
                pos.push_back(a);
            }
        }
    }
    bool has(const std::string& k) const { return val.count(k) > 0; }
    std::string get(const std::string& k, const std::string& def = "") const { return has(k) ? val.at(k) : def; }
};

long long parse_int(const std::string& name, const std::string& s, long long lo, long long hi) {
    char* end = nullptr;
    errno     = 0;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end || errno || v < lo || v > hi)
        throw UsageError(name + " must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi) + " (got '" + s + "')");
    return v;
}

double parse_float(const std::string& name, const std::string& s) {
    char* end = nullptr;
    double v  = std::strtod(s.c_str(), &end);
    if (s.empty() || *end) throw UsageError(name + " must be a number (got '" + s + "')");
    return v;
}

std::vector<int32_t> parse_tokens(const std::string& s) {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i <= s.size()) {
        size_t j = s.find(',', i);
        if (j == std::string::npos) j = s.size();
        std::string t = s.substr(i, j - i);
        while (!t.empty() && t.front() == ' ') t.erase(t.begin());
        while (!t.empty() && t.back() == ' ') t.pop_back();
        if (t.empty()) throw UsageError("--tokens: empty entry in '" + s + "' (expected comma-separated ids like 2,17,99)");
        ids.push_back((int32_t)parse_int("--tokens entry", t, 0, 0x7FFFFFFF));
        i = j + 1;
    }
    return ids;
}

// Writes a file under a temporary name and renames it into place.
bool write_file_atomic(const std::string& path, const void* data, size_t n, std::string* err) {
    std::string tmp = path + ".tmp." + std::to_string(::getpid());
    std::FILE* f    = std::fopen(tmp.c_str(), "wb");
    if (!f) {
        *err = "cannot create " + tmp + " (" + std::strerror(errno) + ")";
        return false;
    }
    bool ok = std::fwrite(data, 1, n, f) == n;
    ok      = (std::fclose(f) == 0) && ok;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        *err = "cannot write " + path;
        return false;
    }
    return true;
}

int cmd_compile(int argc, char** argv) {
    Args a(argc, argv, 2, {"--model", "--adapter", "--weights", "--device", "-o", "--max-context", "--chunk", "--logits-rows"}, {});
    if (!a.pos.empty()) throw UsageError("unexpected argument '" + a.pos[0] + "'");
    if (!a.has("--model")) throw UsageError("missing --model DIR");
    if (!a.has("-o")) throw UsageError("missing -o PLAN");
    g4::CompileOptions o;
    o.model_dir   = a.get("--model");
    o.adapter_dir = a.get("--adapter");
    o.out_path    = a.get("-o");
    o.weights     = a.get("--weights", o.weights);
    o.device      = a.get("--device", o.device);
    if (a.has("--max-context")) o.max_context = (int)parse_int("--max-context", a.get("--max-context"), 1, 1 << 30);
    if (a.has("--chunk")) o.max_rows = (int)parse_int("--chunk", a.get("--chunk"), 1, 8192);
    if (a.has("--logits-rows")) o.logits_rows = (int)parse_int("--logits-rows", a.get("--logits-rows"), 1, 8192);
    if (o.logits_rows > o.max_rows) o.logits_rows = o.max_rows;
    g4::compile_plan(o, std::cerr);
    return 0;
}

struct RunError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

void check(g4_status st) {
    if (st != G4_OK) throw RunError(g4_last_error_message());
}

int cmd_run(int argc, char** argv) {
    Args a(argc, argv, 2,
           {"--tokens", "-n", "--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--repeat-last-n", "--seed",
            "--dump-logits", "--threads"},
           {"--ignore-eos", "--print-ids", "--stats"});
    if (a.pos.size() != 1) throw UsageError("expected exactly one PLAN argument");
    if (!a.has("--tokens")) throw UsageError("missing --tokens (comma-separated token ids, e.g. --tokens 2,17,99)");
    std::vector<int32_t> prompt = parse_tokens(a.get("--tokens"));
    int n_predict = (int)parse_int("-n", a.get("-n", "32"), 0, 1 << 30);

    g4_engine* eng = nullptr;
    check(g4_engine_open(a.pos[0].c_str(), nullptr, &eng));
    struct EngineGuard { g4_engine* e; ~EngineGuard() { g4_engine_close(e); } } eg{eng};
    g4_engine_info info;
    check(g4_engine_get_info(eng, &info));

    g4_sampling_params sp;
    check(g4_sampling_params_from_plan(eng, &sp));
    if (a.has("--temp")) sp.temperature = (float)parse_float("--temp", a.get("--temp"));
    if (a.has("--top-k")) sp.top_k = (int32_t)parse_int("--top-k", a.get("--top-k"), 0, 1 << 30);
    if (a.has("--top-p")) sp.top_p = (float)parse_float("--top-p", a.get("--top-p"));
    if (a.has("--min-p")) sp.min_p = (float)parse_float("--min-p", a.get("--min-p"));
    if (a.has("--repeat-penalty")) sp.repeat_penalty = (float)parse_float("--repeat-penalty", a.get("--repeat-penalty"));
    if (a.has("--repeat-last-n")) sp.repeat_last_n = (int32_t)parse_int("--repeat-last-n", a.get("--repeat-last-n"), -1, 1 << 30);
    if (a.has("--seed")) sp.seed = (uint64_t)parse_int("--seed", a.get("--seed"), 0, (long long)9e18);

    g4_session_params spp = g4_session_params_default();
    if (a.has("--threads")) spp.n_threads = (int32_t)parse_int("--threads", a.get("--threads"), 1, 1024);
    g4_session* s = nullptr;
    check(g4_session_create(eng, &spp, &s));
    struct SessionGuard { g4_session* s; ~SessionGuard() { g4_session_destroy(s); } } sg{s};

    std::vector<float> logits;
    float* dump = nullptr;
    if (a.has("--dump-logits")) {
        logits.resize(prompt.size() * (size_t)info.vocab_size);
        dump = logits.data();
    }
    check(g4_session_append_tokens(s, prompt.data(), prompt.size(), dump, logits.size()));
    if (dump) {
        std::string err;
        if (!write_file_atomic(a.get("--dump-logits"), logits.data(), logits.size() * sizeof(float), &err)) throw RunError(err);
    }

    bool ignore_eos = a.flag.count("--ignore-eos") > 0;
    std::vector<int32_t> out;
    for (int i = 0; i < n_predict; ++i) {
        int32_t tok;
        check(g4_session_sample(s, &sp, &tok));
        if (!ignore_eos && g4_engine_is_eos(eng, tok)) break;
        out.push_back(tok);
        if (i + 1 == n_predict) break;
        if (g4_session_position(s) >= info.max_context) {
            std::cerr << "g4 run: note: context full (" << info.max_context << " tokens); stopping\n";
            break;
        }
        check(g4_session_append_tokens(s, &tok, 1, nullptr, 0));
    }
    std::string line;
    for (size_t i = 0; i < out.size(); ++i) line += (i ? "," : "") + std::to_string(out[i]);
    std::cout << line << "\n";
    if (a.flag.count("--stats")) {
        g4_session_stats st;
        check(g4_session_get_stats(s, &st));
        std::fprintf(stderr, "g4 run: prefill %lld tokens in %.2f ms (%.1f tok/s); decode %lld tokens in %.2f ms (%.1f tok/s)\n",
                     (long long)st.prefill_tokens + (prompt.size() == 1 ? 1 : 0), st.prefill_ms,
                     st.prefill_ms > 0 ? st.prefill_tokens * 1000.0 / st.prefill_ms : 0.0, (long long)st.decode_tokens,
                     st.decode_ms, st.decode_ms > 0 ? st.decode_tokens * 1000.0 / st.decode_ms : 0.0);
    }
    return 0;
}

std::string human(uint64_t b) {
    char buf[64];
    if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
    else if (b >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1048576.0);
    else if (b >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
    else std::snprintf(buf, sizeof buf, "%llu B", (unsigned long long)b);
    return buf;
}

int cmd_inspect(int argc, char** argv) {
    Args a(argc, argv, 2, {}, {"--verify", "--ops", "--tensors"});
    if (a.pos.size() != 1) throw UsageError("expected exactly one PLAN argument");
    bool verify = a.flag.count("--verify") > 0;
    g4::plan::Plan p;
    std::string err;
    if (p.load(a.pos[0], verify, &err) != G4_OK) throw RunError(err);
    const auto& h = p.header();
    auto meta     = nlohmann::json::parse(p.meta_json());
    std::printf("plan %s: format %u.%u, %s, %llu bytes%s\n", a.pos[0].c_str(), h.format_major, h.format_minor,
                meta.value("architecture", "?").c_str(), (unsigned long long)p.file_size(), verify ? ", weights checksum ok" : "");
    std::printf("g4 version %s, device %s, weights %s\n", meta.value("g4_version", "?").c_str(), meta.value("device", "?").c_str(),
                meta.value("weights_dtype", "?").c_str());
    std::printf("hparams: %s\n", meta["hparams"].dump().c_str());
    std::printf("program: %s\n", meta["program"].dump().c_str());
    std::printf("generation: %s\n", meta["generation"].dump().c_str());

    std::map<std::string, std::pair<uint64_t, int>> by_dtype, by_kind;
    const char* kinds[] = {"weight", "activation", "kv_cache", "input"};
    for (size_t i = 0; i < p.n_tensors(); ++i) {
        const auto& t = p.tensor(i);
        if (t.kind == (uint8_t)g4::plan::TensorKind::Weight) {
            auto& d = by_dtype[g4::dtype_str((g4::DType)t.dtype)];
            d.first += t.nbytes, d.second++;
        }
        auto& k = by_kind[kinds[t.kind]];
        k.first += t.nbytes, k.second++;
    }
    std::printf("weights by dtype:\n");
    for (auto& [k, v] : by_dtype) std::printf("  %-6s %5d tensors %12s\n", k.c_str(), v.second, human(v.first).c_str());
    const auto& in = p.info();
    std::printf("memory by device:\n  cpu    weights %s (mapped from the plan), activations %s, KV cache %s\n",
                human(p.weights_bytes()).c_str(), human(in.act_arena_bytes).c_str(), human(in.kv_arena_bytes).c_str());
    std::printf("tensors %zu, ops %zu\n", p.n_tensors(), p.n_ops());
    bool all = !a.flag.count("--ops") && !a.flag.count("--tensors");
    if (all || a.flag.count("--tensors")) {
        std::printf("tensors:\n");
        for (size_t i = 0; i < p.n_tensors(); ++i) {
            const auto& t = p.tensor(i);
            std::string shape;
            for (int d = 0; d < t.ndim; ++d) shape += (d ? "x" : "") + std::to_string(t.dims[d]);
            std::printf("  %4zu %-10s %-5s %-14s %10s  %s\n", i, kinds[t.kind], g4::dtype_str((g4::DType)t.dtype), shape.c_str(),
                        human(t.nbytes).c_str(), p.str(t.name));
        }
    }
    if (all || a.flag.count("--ops")) {
        std::printf("ops:\n");
        for (size_t i = 0; i < p.n_ops(); ++i) {
            const auto& op = p.op(i);
            std::string ins, outs;
            for (int32_t t : op.in)
                if (t >= 0) ins += std::string(ins.empty() ? "" : ", ") + p.str(p.tensor(t).name);
            for (int32_t t : op.out)
                if (t >= 0) outs += std::string(outs.empty() ? "" : ", ") + p.str(p.tensor(t).name);
            std::printf("  %4zu %-10s %-22s (%s) -> %s\n", i, g4::op_name((g4::OpCode)op.code), p.str(op.name), ins.c_str(), outs.c_str());
        }
    }
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
        std::fputs(kUsage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    std::string cmd = argv[1];
    try {
        if (cmd == "compile") return cmd_compile(argc, argv);
        if (cmd == "run") return cmd_run(argc, argv);
        if (cmd == "inspect") return cmd_inspect(argc, argv);
        if (cmd == "--version" || cmd == "version") {
            std::printf("g4 %s\n", g4_runtime_version());
            return 0;
        }
        std::fprintf(stderr, "g4: error: unknown command '%s'\n%s", cmd.c_str(), kUsage);
        return 2;
    } catch (const UsageError& e) {
        std::fprintf(stderr, "g4 %s: error: %s\n%s", cmd.c_str(), e.what(), kUsage);
        return 2;
    } catch (const g4::CompileError& e) {
        std::fprintf(stderr, "g4 %s: error: %s\n", cmd.c_str(), e.what());
        return 1;
    } catch (const RunError& e) {
        std::fprintf(stderr, "g4 %s: error: %s\n", cmd.c_str(), e.what());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "g4 %s: error: %s\n", cmd.c_str(), e.what());
        return 1;
    }
}
