// SHA-256 (FIPS 180-4) for plan provenance: digests of the base checkpoint and adapter files.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace g4 {

class Sha256 {
public:
    Sha256();
    void update(const void* data, size_t n);
    std::string hex(); // finalises; lowercase hex digest

private:
    void block(const uint8_t* p);
    uint32_t h_[8];
    uint8_t buf_[64];
    size_t buf_len_ = 0;
    uint64_t total_ = 0;
};

// Digest of a file's bytes; throws g4::CompileError if unreadable.
std::string sha256_file(const std::string& path);

} // namespace g4
