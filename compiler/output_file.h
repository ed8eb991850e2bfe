// Output files of the g4 tool (plans, logits dumps), replaced atomically: written to a temporary file in
// the target's folder, flushed to disk (fsync), then renamed over the target, so a reader sees the old
// file or the complete new one, never half of one. The temporary file is removed on every failure path.
//
// What the path may name:
//   - nothing yet, or a regular file: replaced as above;
//   - a symbolic link (or a chain of them): followed; the file it finally names is replaced atomically
//     (created, if the link dangles) and the link itself stays;
//   - anything else (a directory, a character or block device such as /dev/null, a FIFO, a socket):
//     refused with an error, before any work; g4 writes only regular files.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace g4 {

// The regular file that writing `path` replaces (symlinks followed), or "" with *err set when the path
// names something g4 refuses to replace (see above). Nothing is created.
std::string output_target(const std::string& path, std::string* err);

class OutputFile {
public:
    OutputFile() = default;
    ~OutputFile(); // removes the temporary file unless committed
    OutputFile(const OutputFile&)            = delete;
    OutputFile& operator=(const OutputFile&) = delete;

    // Checks `path` (output_target) and creates the temporary file beside its target. False with *err set.
    bool open(const std::string& path, std::string* err);
    bool write_at(uint64_t offset, const void* data, size_t n, std::string* err);
    // fsync, close and rename over the target (then fsync of the folder). False with *err set: the
    // temporary file is gone and the target untouched.
    bool commit(std::string* err);
    // The temporary file (readable while open; e.g. to measure a plan before it replaces the old one).
    const std::string& temp_path() const { return tmp_; }
    const std::string& path() const { return path_; }

private:
    std::string path_, target_, tmp_;
    int fd_         = -1;
    bool committed_ = false;
};

// Writes n bytes to `path` as one OutputFile. False with *err set.
bool write_output_file(const std::string& path, const void* data, size_t n, std::string* err);

} // namespace g4
