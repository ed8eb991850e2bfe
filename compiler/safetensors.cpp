// Memory-mapped safetensors reader (see safetensors.h): header validation, sharded checkpoints,
// and conversion of floating tensors to float32.
#include "compiler/safetensors.h"

#include "compiler/error.h"
#include "runtime/src/json_limits.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace g4::st {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;
constexpr const char* kRedownload  = "re-download or re-save the checkpoint";

// Messages are one line even when they quote header bytes or odd tensor names.
[[noreturn]] void fail(std::string msg) {
    for (char& c : msg)
        if ((unsigned char)c < 0x20 || c == 0x7f) c = ' ';
    throw CompileError(msg);
}

// "PATH: WHAT; re-download or re-save the checkpoint"
[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
    fail(path + ": " + what + "; " + kRedownload);
}

[[noreturn]] void corrupt_tensor(const std::string& path, const std::string& name, const std::string& what) {
    corrupt(path, "tensor '" + name + "': " + what);
}

bool parse_dtype(const std::string& s, DType& out) {
    static const std::pair<const char*, DType> table[] = {
        {"F32", DType::F32}, {"F16", DType::F16},   {"BF16", DType::BF16}, {"F64", DType::F64},
        {"I64", DType::I64}, {"I32", DType::I32},   {"I16", DType::I16},   {"I8", DType::I8},
        {"U8", DType::U8},   {"BOOL", DType::BOOL},
    };
    for (const auto& [name, d] : table) {
        if (s == name) {
            out = d;
            return true;
        }
    }
    return false;
}

// Compact, single-line rendering of a JSON value for error messages.
std::string brief(const json& j) {
    std::string s = j.dump(-1, ' ', true, json::error_handler_t::replace);
    if (s.size() > 80) s = s.substr(0, 77) + "...";
    return s;
}

struct Range {
    uint64_t begin, end;
    const std::string* name;
};

TensorView parse_entry(const std::string& path, const std::string& name, const json& e, const uint8_t* data,
                       uint64_t data_size, Range& range) {
    if (!e.is_object()) corrupt_tensor(path, name, "header entry is " + brief(e) + ", expected an object");
    for (const char* key : {"dtype", "shape", "data_offsets"})
        if (!e.contains(key)) corrupt_tensor(path, name, std::string("header entry lacks \"") + key + "\"");

    TensorView t;
    t.name = name;
    t.file = path;

    const json& jd = e["dtype"];
    if (!jd.is_string()) corrupt_tensor(path, name, "dtype is " + brief(jd) + ", expected a string");
    if (!parse_dtype(jd.get<std::string>(), t.dtype))
        fail(path + ": tensor '" + name + "': unsupported dtype " + brief(jd) +
             " (supported: F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL); re-save the checkpoint with a "
             "supported dtype");

    const json& js = e["shape"];
    if (!js.is_array())
        corrupt_tensor(path, name, "shape is " + brief(js) + ", expected an array of integers");
    uint64_t numel = 1;
    bool overflow  = false;
    for (const json& d : js) {
        if (!d.is_number_integer())
            corrupt_tensor(path, name, "shape " + brief(js) + " contains a non-integer dimension");
        if (d.is_number_unsigned()) {
            uint64_t v = d.get<uint64_t>();
            if (v > (uint64_t)INT64_MAX)
                corrupt_tensor(path, name, "shape " + brief(js) + " has a huge dimension");
            overflow |= __builtin_mul_overflow(numel, v, &numel);
            t.shape.push_back((int64_t)v);
        } else {
            int64_t v = d.get<int64_t>();
            if (v < 0) corrupt_tensor(path, name, "shape " + brief(js) + " has a negative dimension");
            overflow |= __builtin_mul_overflow(numel, (uint64_t)v, &numel);
            t.shape.push_back(v);
        }
    }
    uint64_t expected = 0;
    overflow |= __builtin_mul_overflow(numel, (uint64_t)dtype_size(t.dtype), &expected);
    if (overflow) corrupt_tensor(path, name, "shape " + brief(js) + " is too large");

    const json& jo = e["data_offsets"];
    bool ok = jo.is_array() && jo.size() == 2 && jo[0].is_number_unsigned() && jo[1].is_number_unsigned() &&
              jo[0].get<uint64_t>() <= jo[1].get<uint64_t>();
    if (!ok)
        corrupt_tensor(path, name,
                       "data_offsets " + brief(jo) +
                           " must be two non-negative integers [begin, end] with begin <= end");
    uint64_t begin = jo[0].get<uint64_t>(), end = jo[1].get<uint64_t>();
    if (end > data_size)
        corrupt_tensor(path, name,
                       "data_offsets end " + std::to_string(end) + " is beyond the data section (" +
                           std::to_string(data_size) + " bytes); the file is truncated");
    if (end - begin != expected)
        corrupt_tensor(path, name,
                       "shape " + brief(js) + " x " + dtype_name(t.dtype) + " needs " +
                           std::to_string(expected) + " bytes but data_offsets " + brief(jo) + " span " +
                           std::to_string(end - begin));

    t.data   = data + begin;
    t.nbytes = (size_t)(end - begin);
    range    = {begin, end, nullptr};
    return t;
}

// As the safetensors library's Metadata::validate and read_metadata: sorted by data_offsets, the tensors
// tile the data section exactly (each begins where the one before ends, empty ones too, and the last ends
// at the end of the file).
void check_layout(const std::string& path, std::vector<Range>& ranges, uint64_t data_size) {
    std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t at             = 0;
    const std::string* prev = nullptr;
    for (const Range& r : ranges) {
        const std::string span = "[" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")";
        if (r.begin < at)
            corrupt(path, "tensor '" + *r.name + "' data_offsets " + span + " overlap tensor '" + *prev +
                              "', which ends at " + std::to_string(at));
        if (r.begin > at)
            corrupt(path, "bytes [" + std::to_string(at) + ", " + std::to_string(r.begin) +
                              ") of the data section belong to no tensor (a gap before tensor '" + *r.name +
                              "' " + span + ")");
        at   = r.end;
        prev = r.name;
    }
    if (at != data_size)
        corrupt(path, "the data section after the header is " + std::to_string(data_size) +
                          " bytes but its tensors cover " + std::to_string(at) +
                          " (a wrong header length, or bytes appended to the file)");
}

json read_json_file(const std::string& path, const std::string& what_for) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("cannot read " + path + ": " + std::strerror(errno) + "; check the file's permissions");
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    if (std::string e = json_depth_error(text); !e.empty()) fail(path + ": " + what_for + ": " + e);
    try {
        return json::parse(text);
    } catch (const json::exception& e) {
        fail(path + ": " + what_for + " is not valid JSON (" + e.what() + "); " + kRedownload);
    }
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp  = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0) {
        float v = (float)mant * 0x1p-24f; // zero or subnormal; exact
        return sign ? -v : v;
    }
    uint32_t bits = exp == 0x1f ? sign | 0x7f800000u | (mant << 13) // inf / nan (payload kept)
                                : sign | ((exp + 112) << 23) | (mant << 13);
    return std::bit_cast<float>(bits);
}

} // namespace

const char* dtype_name(DType d) {
    switch (d) {
    case DType::F32:
        return "F32";
    case DType::F16:
        return "F16";
    case DType::BF16:
        return "BF16";
    case DType::F64:
        return "F64";
    case DType::I64:
        return "I64";
    case DType::I32:
        return "I32";
    case DType::I16:
        return "I16";
    case DType::I8:
        return "I8";
    case DType::U8:
        return "U8";
    case DType::BOOL:
        return "BOOL";
    }
    return "?";
}

size_t dtype_size(DType d) {
    switch (d) {
    case DType::F64:
    case DType::I64:
        return 8;
    case DType::F32:
    case DType::I32:
        return 4;
    case DType::F16:
    case DType::BF16:
    case DType::I16:
        return 2;
    case DType::I8:
    case DType::U8:
    case DType::BOOL:
        return 1;
    }
    return 0;
}

int64_t TensorView::numel() const {
    int64_t n = 1;
    for (int64_t d : shape)
        n *= d;
    return n;
}

std::unique_ptr<File> File::open(const std::string& path) {
    std::unique_ptr<File> f(new File());
    f->path_ = path;

    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        if (err == ENOENT) fail("safetensors file " + path + " does not exist; check the checkpoint path");
        fail("cannot open " + path + ": " + std::strerror(err) + "; check the file's permissions");
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        fail("cannot stat " + path + ": " + std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(path + " is not a regular file; pass the path of a .safetensors file");
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < 8) {
        ::close(fd);
        corrupt(path, "file is " + std::to_string(size) + " bytes, too short for a safetensors header");
    }
    void* map   = ::mmap(nullptr, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_err = errno;
    ::close(fd);
    if (map == MAP_FAILED) fail("cannot mmap " + path + ": " + std::strerror(map_err));
    f->map_      = map;
    f->map_size_ = (size_t)size;

    const uint8_t* bytes = static_cast<const uint8_t*>(map);
    uint64_t header_len  = 0;
    std::memcpy(&header_len, bytes, 8);
    if (header_len > kMaxHeaderBytes)
        corrupt(path, "header length " + std::to_string(header_len) +
                          " exceeds the 100 MB limit; not a safetensors file or corrupt");
    if (header_len > size - 8)
        corrupt(path, "header length " + std::to_string(header_len) + " exceeds the " +
                          std::to_string(size - 8) + " bytes after the length prefix; the file is truncated");

    const std::string_view header_text((const char*)bytes + 8, header_len);
    if (std::string e = json_depth_error(header_text); !e.empty()) corrupt(path, "header: " + e);
    json header;
    try {
        header = json::parse(header_text.begin(), header_text.end());
    } catch (const json::exception& e) {
        corrupt(path, std::string("header is not valid JSON (") + e.what() + ")");
    }
    if (!header.is_object()) corrupt(path, "header is " + brief(header) + ", expected a JSON object");

    const uint8_t* data = bytes + 8 + header_len;
    uint64_t data_size  = size - 8 - header_len;
    std::vector<Range> ranges;
    for (const auto& [name, entry] : header.items()) {
        if (name == "__metadata__") {
            if (!entry.is_object()) corrupt(path, "__metadata__ is " + brief(entry) + ", expected an object");
            for (const auto& [k, v] : entry.items()) {
                if (!v.is_string())
                    corrupt(path,
                            "__metadata__ value for '" + k + "' is " + brief(v) + ", expected a string");
                f->metadata_[k] = v.get<std::string>();
            }
            continue;
        }
        Range r{};
        TensorView t        = parse_entry(path, name, entry, data, data_size, r);
        auto [it, inserted] = f->tensors_.emplace(name, std::move(t));
        r.name              = &it->first;
        ranges.push_back(r);
    }
    check_layout(path, ranges, data_size);
    return f;
}

File::~File() {
    if (map_) ::munmap(map_, map_size_);
}

Checkpoint Checkpoint::open(const std::string& dir) {
    std::error_code ec;
    if (!fs::exists(dir, ec)) fail("checkpoint directory " + dir + " does not exist; check the path");
    if (!fs::is_directory(dir, ec))
        fail(dir + " is not a directory; pass the checkpoint directory holding model.safetensors");

    Checkpoint ck;
    ck.dir_                       = dir;
    const std::string index_path  = (fs::path(dir) / "model.safetensors.index.json").string();
    const std::string single_path = (fs::path(dir) / "model.safetensors").string();

    // Shard path -> tensors the index says it holds.
    std::map<std::string, std::vector<std::string>> shards;
    if (fs::exists(index_path, ec)) {
        json index = read_json_file(index_path, "index");
        if (!index.is_object()) corrupt(index_path, "index is " + brief(index) + ", expected a JSON object");
        if (!index.contains("weight_map")) corrupt(index_path, "index lacks \"weight_map\"");
        const json& wm = index["weight_map"];
        if (!wm.is_object()) corrupt(index_path, "weight_map is " + brief(wm) + ", expected an object");
        if (wm.empty()) corrupt(index_path, "weight_map is empty");
        for (const auto& [name, shard] : wm.items()) {
            if (!shard.is_string())
                corrupt(index_path, "weight_map entry for tensor '" + name + "' is " + brief(shard) +
                                        ", expected a shard file name");
            fs::path rel(shard.get<std::string>());
            if (rel.empty() || rel.is_absolute() ||
                std::find(rel.begin(), rel.end(), fs::path("..")) != rel.end())
                corrupt(index_path, "weight_map entry for tensor '" + name + "' names shard " + brief(shard) +
                                        ", expected a file name inside " + dir);
            shards[(fs::path(dir) / rel).string()].push_back(name);
        }
        for (const auto& [shard_path, names] : shards) {
            if (!fs::exists(shard_path, ec))
                fail("shard " + shard_path + " named in " + index_path + " does not exist; " + kRedownload);
        }
    } else if (fs::exists(single_path, ec)) {
        shards[single_path] = {};
    } else {
        fail("no model.safetensors or model.safetensors.index.json in " + dir +
             "; pass a Hugging Face checkpoint directory");
    }

    for (const auto& [shard_path, names] : shards) {
        std::shared_ptr<File> file = File::open(shard_path);
        for (const std::string& name : names) {
            if (!file->tensors().count(name))
                fail("tensor '" + name + "' is listed in " + index_path + " but missing from shard " +
                     shard_path + "; " + kRedownload);
        }
        for (const auto& [name, view] : file->tensors()) {
            auto [it, inserted] = ck.index_.emplace(name, &view);
            if (!inserted)
                fail("tensor '" + name + "' appears in both " + it->second->file + " and " + shard_path +
                     " in " + dir + "; " + kRedownload);
        }
        ck.files_.push_back(std::move(file));
    }
    return ck;
}

bool Checkpoint::has(const std::string& name) const {
    return index_.count(name) != 0;
}

const TensorView& Checkpoint::get(const std::string& name) const {
    auto it = index_.find(name);
    if (it == index_.end())
        fail("missing tensor '" + name + "' in checkpoint " + dir_ +
             "; the checkpoint is incomplete or not the expected model");
    return *it->second;
}

std::vector<std::string> Checkpoint::names() const {
    std::vector<std::string> out;
    out.reserve(index_.size());
    for (const auto& [name, view] : index_)
        out.push_back(name);
    return out;
}

std::vector<std::string> Checkpoint::files() const {
    std::vector<std::string> out;
    for (const auto& f : files_)
        out.push_back(f->path());
    std::sort(out.begin(), out.end());
    return out;
}

void to_f32(const TensorView& t, float* out) {
    const int64_t n  = t.numel();
    const uint8_t* p = t.data;
    if (t.nbytes != (size_t)n * dtype_size(t.dtype))
        fail("tensor '" + t.name + "' in " + t.file + ": " + std::to_string(t.nbytes) +
             " bytes do not match its shape");
    switch (t.dtype) {
    case DType::F32:
        if (n) std::memcpy(out, p, (size_t)n * 4);
        return;
    case DType::F64:
        for (int64_t i = 0; i < n; ++i) {
            double v;
            std::memcpy(&v, p + i * 8, 8);
            out[i] = (float)v;
        }
        return;
    case DType::BF16:
        for (int64_t i = 0; i < n; ++i) {
            uint16_t v;
            std::memcpy(&v, p + i * 2, 2);
            out[i] = std::bit_cast<float>((uint32_t)v << 16);
        }
        return;
    case DType::F16:
        for (int64_t i = 0; i < n; ++i) {
            uint16_t v;
            std::memcpy(&v, p + i * 2, 2);
            out[i] = f16_to_f32(v);
        }
        return;
    default:
        fail("tensor '" + t.name + "' in " + t.file + " has dtype " + dtype_name(t.dtype) +
             ", expected a floating dtype (F32, F16, BF16, F64)");
    }
}

} // namespace g4::st
