// NVRTC compilation of the embedded kernel source (see cuda_compile.h).
#include "compiler/cuda_compile.h"
#include "compiler/error.h"
#include "runtime/plan/plan_format.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sys/file.h>
#include <unistd.h>

#ifdef G4_HAVE_NVRTC
#include <nvrtc.h>
#endif

namespace g4::cuda {

extern const char* const kKernelSource; // generated from kernels/cuda/*.cu

KernelSpec kernel_spec(const std::vector<int>& heads_per_group) {
    KernelSpec s;
    if (heads_per_group.empty()) return s;
    const int h = heads_per_group[0];
    for (int x : heads_per_group)
        if (x != h) return s;
    if (h >= 1 && h <= 16 && (h & (h - 1)) == 0) s.attn_hpg = h;
    return s;
}

const std::vector<std::string>& supported_targets() {
    static const std::vector<std::string> t = {"sm_80", "sm_86", "sm_89", "sm_90"};
    return t;
}

std::string kernel_cache_dir() {
    if (const char* e = std::getenv("G4_KERNEL_CACHE")) {
        const std::string v = e;
        return v.empty() || v == "off" || v == "0" ? std::string() : v;
    }
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/g4/kernels";
    if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/g4/kernels";
    return "";
}

#ifdef G4_HAVE_NVRTC
bool nvrtc_available() {
    return true;
}

namespace {

using plan::fnv1a64;
std::string hex64(uint64_t v) {
    char b[17];
    std::snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
    return b;
}

// A cache entry: "G4KC1\n", the key text, '\0', the output's size (u64), the output, its FNV-1a (u64).
// The file is named by the key's hash; a read checks the whole key, the size and the checksum, so a
// stale, foreign or truncated file is a miss (and is rewritten).
constexpr char kCacheMagic[]   = "G4KC1\n";
constexpr size_t kCacheEntries = 32;

bool cache_read(const std::string& path, const std::string& key, std::string* out) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t head = sizeof kCacheMagic - 1 + key.size() + 1;
    if (data.size() < head + 16 || data.compare(0, sizeof kCacheMagic - 1, kCacheMagic) != 0 ||
        data.compare(sizeof kCacheMagic - 1, key.size(), key) != 0 || data[head - 1] != '\0')
        return false;
    uint64_t n = 0, sum = 0;
    std::memcpy(&n, data.data() + head, 8);
    if (n != data.size() - head - 16) return false;
    std::memcpy(&sum, data.data() + head + 8 + n, 8);
    if (sum != fnv1a64(data.data() + head + 8, n)) return false;
    out->assign(data, head + 8, n);
    return true;
}

// Written under a temporary name and renamed into place, so concurrent compiles never see half a file.
// A cache that cannot be written is skipped.
void cache_write(const std::string& dir, const std::string& path, const std::string& key,
                 const std::string& bytes) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return;
    const std::string tmp = path + ".tmp" + std::to_string((long)getpid());
    {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        if (!f) return;
        const uint64_t n = bytes.size(), sum = fnv1a64(bytes.data(), bytes.size());
        f.write(kCacheMagic, sizeof kCacheMagic - 1);
        f.write(key.c_str(), (std::streamsize)key.size() + 1);
        f.write((const char*)&n, 8);
        f.write(bytes.data(), (std::streamsize)bytes.size());
        f.write((const char*)&sum, 8);
        if (!f.flush()) {
            f.close();
            std::filesystem::remove(tmp, ec);
            return;
        }
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
        std::filesystem::remove(tmp, ec);
        return;
    }
    // At most kCacheEntries outputs (7-21 MB each) stay: the least recently used go (a hit refreshes its
    // time).
    try {
        std::vector<std::pair<std::filesystem::file_time_type, std::filesystem::path>> entries;
        for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
            std::error_code tec;
            const auto t = e.last_write_time(tec);
            if (!tec && e.path().extension() == ".bin" && e.path() != path) entries.emplace_back(t, e.path());
        }
        if (entries.size() + 1 <= kCacheEntries) return;
        std::sort(entries.begin(), entries.end());
        for (size_t i = 0; i + kCacheEntries < entries.size() + 1; ++i) {
            std::filesystem::remove(entries[i].second, ec);
            std::filesystem::remove(entries[i].second.string() + ".lock", ec); // a cubin entry's lock
        }
    } catch (const std::filesystem::filesystem_error&) { // a folder changing under us: prune next time
    }
}

// The cache entry of one output kind ("cubin" or "ptx") of an NVRTC run: the key (NVRTC's version, the kind,
// every option and the source text: its length and two hashes, made once) and the file it is kept in.
struct CacheEntry {
    std::string key, path;
};
CacheEntry cache_entry(const std::string& dir, const std::string& arch, const char* kind,
                       const std::vector<const char*>& opts) {
    static const std::string source_key = [] {
        const size_t n = std::strlen(kKernelSource);
        return " source " + std::to_string(n) + " " + hex64(fnv1a64(kKernelSource, n)) + " " +
               hex64(fnv1a64(kKernelSource, n, 0x84222325cbf29ce4ull));
    }();
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    CacheEntry e;
    e.key = "nvrtc " + std::to_string(major) + "." + std::to_string(minor) + " " + kind;
    for (const char* o : opts)
        e.key += std::string(" ") + o;
    e.key += source_key;
    if (!dir.empty())
        e.path = dir + "/" + arch + "-" + kind + "-" + hex64(fnv1a64(e.key.data(), e.key.size())) + ".bin";
    return e;
}

bool cache_hit(const CacheEntry& e, std::string* out) {
    if (e.path.empty() || !cache_read(e.path, e.key, out)) return false;
    std::error_code ec;
    std::filesystem::last_write_time(e.path, std::filesystem::file_time_type::clock::now(), ec);
    return true;
}

// An exclusive lock on one cache entry for as long as it lives, so that processes compiling the same kernels
// at once run NVRTC once and the others read its output. No lock (a cache folder that cannot be written) is
// no error: then each compiles.
class EntryLock {
public:
    explicit EntryLock(const std::string& dir, const std::string& path) {
        if (path.empty()) return;
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
        fd_ = ::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd_ >= 0 && ::flock(fd_, LOCK_EX) != 0) {
            ::close(fd_);
            fd_ = -1;
        }
    }
    ~EntryLock() {
        if (fd_ >= 0) ::close(fd_); // closing releases the lock
    }
    EntryLock(const EntryLock&)            = delete;
    EntryLock& operator=(const EntryLock&) = delete;

private:
    int fd_ = -1;
};

// NVVM's optimizer runs on this many threads (NVRTC --split-compile). A fixed count rather than the
// machine's: the partition depends on it, so a fixed count gives the same bytes on every machine.
constexpr int kNvrtcThreads = 8;

} // namespace

KernelBinary compile_kernels(const std::string& target, const KernelSpec& spec, bool with_ptx) {
    const auto& ts = supported_targets();
    if (std::find(ts.begin(), ts.end(), target) == ts.end())
        throw CompileError("unsupported --target '" + target + "': expected sm_80, sm_86, sm_89 or sm_90");
    if (spec.attn_hpg != 0 && kernel_spec({spec.attn_hpg}).attn_hpg != spec.attn_hpg)
        throw CompileError("kernel specialisation: " + std::to_string(spec.attn_hpg) +
                           " heads per KV group is not a power of two <= 16");
    if (spec.trace < 0 || spec.trace > 2)
        throw CompileError("kernel trace mode " + std::to_string(spec.trace) +
                           ": expected 0 (off), 1 (launches) or 2 (blocks)");
    KernelBinary kb;
    kb.target = target;
    // One NVRTC run for the real architecture gives its cubin and the PTX it was lowered from (byte for
    // byte what a run for the virtual compute_XX architecture gives), which drivers of newer GPUs compile.
    // spec.trace 1: the timeline lab's kernels (kernels/cuda/common.cu G4_TRACE; bench/scripts/trace_lab.sh),
    // never for plans that are meant to be used; 2: every block of a launch records (G4_TRACE_ALL,
    // bench/scripts/trace_blocks.py).
    const std::string arch        = "--gpu-architecture=sm_" + target.substr(3);
    const std::string hpg         = "-DG4_AD_HPG=" + std::to_string(spec.attn_hpg);
    const std::string threads     = "--split-compile=" + std::to_string(kNvrtcThreads);
    std::vector<const char*> opts = {arch.c_str(), "--std=c++17", "-default-device", "-lineinfo",
                                     threads.c_str()};
    if (spec.attn_hpg > 0) opts.push_back(hpg.c_str());
    if (spec.trace >= 1) opts.push_back("-DG4_TRACE");
    if (spec.trace == 2) opts.push_back("-DG4_TRACE_ALL");

    const std::string dir  = kernel_cache_dir();
    const CacheEntry cubin = cache_entry(dir, target, "cubin", opts);
    const CacheEntry ptx   = cache_entry(dir, target, "ptx", opts);
    auto from_cache        = [&] {
        std::string c, p;
        if (!cache_hit(cubin, &c) || (with_ptx && !cache_hit(ptx, &p))) return false;
        kb.cubin.assign(c.begin(), c.end());
        kb.ptx    = std::move(p);
        kb.cached = true;
        return true;
    };
    if (from_cache()) return kb;
    const EntryLock lock(dir, cubin.path);
    if (from_cache()) return kb; // another process compiled it while this one waited

    nvrtcProgram prog;
    if (nvrtcCreateProgram(&prog, kKernelSource, "g4_kernels.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS)
        throw CompileError("NVRTC: cannot create program");
    nvrtcResult r = nvrtcCompileProgram(prog, (int)opts.size(), opts.data());
    size_t n      = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string l(n, '\0');
    if (n) nvrtcGetProgramLog(prog, l.data());
    while (!l.empty() && (l.back() == '\0' || l.back() == '\n'))
        l.pop_back();
    if (r != NVRTC_SUCCESS) {
        nvrtcDestroyProgram(&prog);
        throw CompileError("NVRTC failed to compile the CUDA kernels for " + target + ": " + l);
    }
    kb.log = l;
    nvrtcGetCUBINSize(prog, &n);
    kb.cubin.resize(n);
    nvrtcGetCUBIN(prog, kb.cubin.data());
    std::string p;
    if (nvrtcGetPTXSize(prog, &n) == NVRTC_SUCCESS) {
        p.resize(n);
        nvrtcGetPTX(prog, p.data());
        while (!p.empty() && p.back() == '\0')
            p.pop_back();
    }
    nvrtcDestroyProgram(&prog);
    if (p.empty()) throw CompileError("NVRTC gave no PTX for " + target);
    if (!dir.empty()) {
        cache_write(dir, cubin.path, cubin.key, std::string(kb.cubin.begin(), kb.cubin.end()));
        cache_write(dir, ptx.path, ptx.key, p);
    }
    if (with_ptx) kb.ptx = std::move(p);
    return kb;
}
#else
bool nvrtc_available() {
    return false;
}
KernelBinary compile_kernels(const std::string& target, const KernelSpec&, bool) {
    throw CompileError(
        "this g4 was built without the CUDA toolkit (NVRTC), so it cannot compile --device cuda plans; "
        "install nvidia-cuda-toolkit and rebuild");
}
#endif

} // namespace g4::cuda
