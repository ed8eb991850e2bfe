// Whole-file reading for the media decoders (image_io, audio_io): one-line errors naming the path
// and the problem (missing, a directory, unreadable, larger than the caller's bound).
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <sys/stat.h>
#include <vector>

namespace g4::media {

// Reads `path` into *out. Returns "" or "cannot open|read WHAT 'PATH': REASON".
inline std::string read_file_bytes(const std::string& path, const char* what, uint64_t max_bytes,
                                   std::vector<uint8_t>* out) {
    out->clear();
    const std::string open_err = std::string("cannot open ") + what + " '" + path + "': ";
    const std::string where    = std::string("cannot read ") + what + " '" + path + "': ";
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return open_err + std::strerror(errno);
    if (S_ISDIR(st.st_mode)) return where + "it is a directory, not a file";
    if (!S_ISREG(st.st_mode)) return where + "not a regular file";
    if ((uint64_t)st.st_size > max_bytes)
        return where + "the file is " + std::to_string((uint64_t)st.st_size) + " bytes, more than the " +
               std::to_string(max_bytes) + " this input can take";
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return open_err + std::strerror(errno);
    out->resize((size_t)st.st_size);
    const size_t got  = out->empty() ? 0 : std::fread(out->data(), 1, out->size(), f);
    const bool failed = std::ferror(f) != 0;
    const int err     = errno;
    std::fclose(f);
    if (failed) return where + std::strerror(err);
    if (got != out->size()) return where + "the file changed size while it was read";
    return "";
}

} // namespace g4::media
