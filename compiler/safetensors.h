// Memory-mapped safetensors reader: single file (model.safetensors) or sharded
// (model.safetensors.index.json + shards). Validates every header before use: JSON well-formed,
// dtype known, shape x dtype size == byte range, ranges inside the data section, no overlaps.
// Part of the compiler only; the runtime never reads safetensors.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace g4::st {

enum class DType { F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL };

const char* dtype_name(DType d); // "F32", "BF16", ... as spelled in safetensors headers
size_t dtype_size(DType d);      // bytes per element

struct TensorView {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;    // as in the header, row-major
    const uint8_t* data = nullptr; // points into the mmap; valid while the owning File lives
    size_t nbytes       = 0;
    std::string file; // path of the shard holding it (for error messages)
    int64_t numel() const;
};

// One mmapped .safetensors file. Throws g4::CompileError naming the file on any defect.
class File {
public:
    static std::unique_ptr<File> open(const std::string& path);
    ~File();
    const std::map<std::string, TensorView>& tensors() const { return tensors_; }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    const std::string& path() const { return path_; }
    File(const File&)            = delete;
    File& operator=(const File&) = delete;

private:
    File() = default;
    std::string path_;
    void* map_       = nullptr;
    size_t map_size_ = 0;
    std::map<std::string, TensorView> tensors_;
    std::map<std::string, std::string> metadata_;
};

// A checkpoint directory: model.safetensors, or model.safetensors.index.json naming shards.
// Every tensor listed in the index must be present in the shard it names.
class Checkpoint {
public:
    static Checkpoint open(const std::string& dir); // throws g4::CompileError
    bool has(const std::string& name) const;
    const TensorView& get(const std::string& name) const; // throws "missing tensor NAME in DIR"
    std::vector<std::string> names() const;               // sorted
    const std::string& dir() const { return dir_; }
    std::vector<std::string> files() const; // shard paths, sorted

private:
    std::string dir_;
    std::vector<std::shared_ptr<File>> files_;
    std::map<std::string, const TensorView*> index_;
};

// Converts any floating tensor (F32/F16/BF16/F64) to float32. `out` must hold numel() floats.
// Throws for non-floating dtypes.
void to_f32(const TensorView& t, float* out);

} // namespace g4::st
