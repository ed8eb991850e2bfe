// Implementation of the shared test helpers (see test_util.h).
#include "test_util.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ops.h"
#include "runtime/plan/plan_format.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <random>
#include <sstream>
#include <stdexcept>
#include <sys/wait.h>

namespace g4test {
namespace fs = std::filesystem;

TempDir::TempDir() {
    std::random_device rd;
    for (int attempt = 0; attempt < 100; ++attempt) {
        fs::path p = fs::temp_directory_path() / ("g4test-" + std::to_string(rd()));
        if (fs::create_directory(p)) {
            path = p.string();
            return;
        }
    }
    throw std::runtime_error("cannot create a temporary directory");
}

TempDir::~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
}

std::string fixtures_dir() {
    return G4_FIXTURES_DIR;
}
std::string fixture(const std::string& rel) {
    return fixtures_dir() + "/" + rel;
}
std::string cli_path() {
    return G4_CLI_PATH;
}

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot read " + path);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

void write_file(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error("cannot write " + path);
    f.write(bytes.data(), (std::streamsize)bytes.size());
}

bool file_exists(const std::string& path) {
    return fs::exists(path);
}

std::vector<float> read_f32(const std::string& path) {
    std::string b = read_file(path);
    std::vector<float> v(b.size() / sizeof(float));
    std::memcpy(v.data(), b.data(), v.size() * sizeof(float));
    return v;
}

CmdResult run_cmd(const std::string& cmd) {
    TempDir td;
    std::string out = td.file("out"), err = td.file("err");
    std::string full = cmd + " >" + out + " 2>" + err + " </dev/null";
    int st           = std::system(full.c_str());
    CmdResult r;
    if (st == -1)
        r.exit_code = -1;
    else if (WIFEXITED(st))
        r.exit_code = WEXITSTATUS(st);
    else if (WIFSIGNALED(st))
        r.exit_code = 128 + WTERMSIG(st);
    r.out = file_exists(out) ? read_file(out) : "";
    r.err = file_exists(err) ? read_file(err) : "";
    return r;
}

CmdResult run_g4(const std::string& args) {
    return run_cmd("'" + cli_path() + "' " + args);
}

std::string cpu_level_missing() {
    const char* want = std::getenv("G4_CPU_LEVEL");
    if (!want || !*want) return "";
    if (std::string(want) == g4::cpu::level_name(g4::cpu::active_level())) return "";
    return std::string("G4_CPU_LEVEL=") + want + ": this CPU or build lacks it (it has " +
           g4::cpu::supported_levels() + ")";
}

bool on_cuda() {
    const char* v = std::getenv("G4_TEST_CUDA");
    return v && std::strcmp(v, "1") == 0 && g4::cuda::nvrtc_available();
}

namespace {
struct CpuLevelEnvironment : ::testing::Environment {
    void SetUp() override {
        if (std::string why = cpu_level_missing(); !why.empty()) GTEST_SKIP() << why;
    }
};
[[maybe_unused]] const auto* const kCpuLevelEnvironment =
    ::testing::AddGlobalTestEnvironment(new CpuLevelEnvironment);
} // namespace

double rel_l2(const float* a, const float* b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return std::sqrt(num / (den > 0 ? den : 1e-300));
}

std::vector<int32_t> parse_ids(const std::string& csv) {
    std::vector<int32_t> ids;
    std::stringstream ss(csv);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
        size_t b = tok.find_first_not_of(" \t\r\n"), e = tok.find_last_not_of(" \t\r\n");
        if (b == std::string::npos) continue;
        ids.push_back(std::stoi(tok.substr(b, e - b + 1)));
    }
    return ids;
}

std::vector<float> randn(size_t n, uint32_t seed, float sd) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(n);
    for (auto& x : v)
        x = d(g);
    return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
    std::vector<uint16_t> o(v.size());
    for (size_t i = 0; i < v.size(); ++i)
        o[i] = g4::f32_to_bf16(v[i]);
    return o;
}

std::pair<uint64_t, uint64_t> plan_section(const std::string& plan, uint32_t kind) {
    g4::plan::PlanHeader h;
    std::memcpy(&h, plan.data(), sizeof h);
    for (uint32_t k = 0; k < h.section_count; ++k) {
        g4::plan::PlanSection sec;
        std::memcpy(&sec, plan.data() + h.section_table_offset + k * sizeof sec, sizeof sec);
        if (sec.kind == kind) return {sec.offset, sec.size};
    }
    return {0, 0};
}

void reseal_plan(std::string* plan) {
    std::string& b = *plan;
    g4::plan::PlanHeader h;
    std::memcpy(&h, b.data(), sizeof h);
    char* table = b.data() + h.section_table_offset;
    for (uint32_t k = 0; k < h.section_count; ++k) {
        g4::plan::PlanSection sec;
        std::memcpy(&sec, table + k * sizeof sec, sizeof sec);
        sec.checksum = g4::plan::fnv1a64(b.data() + sec.offset, sec.size);
        std::memcpy(table + k * sizeof sec, &sec, sizeof sec);
    }
    h.reserved0       = g4::plan::fnv1a64(table, h.section_count * sizeof(g4::plan::PlanSection));
    h.header_checksum = 0;
    h.header_checksum = (uint32_t)g4::plan::fnv1a64(&h, sizeof h);
    std::memcpy(b.data(), &h, sizeof h);
}

} // namespace g4test
