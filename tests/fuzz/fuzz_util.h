// Helpers shared by the fuzz targets: split an input into parts, and give path-based readers a file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

namespace g4fuzz {

// Splits `data` at NUL bytes into at most `max_parts` parts (the last part keeps any further NULs).
inline std::vector<std::string> split_nul(const uint8_t* data, size_t size, size_t max_parts) {
    std::vector<std::string> parts;
    std::string_view s(reinterpret_cast<const char*>(data), size);
    while (parts.size() + 1 < max_parts) {
        size_t z = s.find('\0');
        if (z == std::string_view::npos) break;
        parts.emplace_back(s.substr(0, z));
        s.remove_prefix(z + 1);
    }
    parts.emplace_back(s);
    return parts;
}

// A private directory for this process (under TMPDIR, else /tmp), removed at exit.
inline const std::string& scratch_dir() {
    static const std::string dir = [] {
        const char* t    = std::getenv("TMPDIR");
        std::string tmpl = std::string(t && *t ? t : "/tmp") + "/g4fuzz.XXXXXX";
        if (!mkdtemp(tmpl.data())) std::abort();
        static std::string keep = tmpl;
        std::atexit([] { std::system(("rm -rf '" + keep + "'").c_str()); });
        return tmpl;
    }();
    return dir;
}

// Writes `bytes` to scratch_dir()/name (replacing it) and returns the path.
inline std::string write_scratch(const std::string& name, const void* bytes, size_t n) {
    std::string path = scratch_dir() + "/" + name;
    FILE* f          = std::fopen(path.c_str(), "wb");
    if (!f) std::abort();
    if (n && std::fwrite(bytes, 1, n, f) != n) std::abort();
    std::fclose(f);
    return path;
}

} // namespace g4fuzz
