// Unit tests for the safetensors reader: files are written byte by byte here, then read back through
// g4::st::File / Checkpoint; every malformed input must raise a one-line g4::CompileError naming the file.
#include "compiler/error.h"
#include "compiler/safetensors.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace {

using g4::st::Checkpoint;
using g4::st::DType;
using g4::st::File;
using nlohmann::json;

std::string le64(uint64_t v) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i)
        s[i] = (char)((v >> (8 * i)) & 0xff);
    return s;
}

// A complete safetensors file from a raw header string and data section.
std::string st_file(const std::string& header, const std::string& data = "") {
    return le64(header.size()) + header + data;
}

template <class T> std::string raw(const std::vector<T>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// Lays tensors out back to back; header() and bytes() give a valid file.
struct Writer {
    json hdr = json::object();
    std::string data;
    Writer& add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                const std::string& bytes) {
        hdr[name] = {
            {"dtype", dtype}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + bytes.size()}}};
        data += bytes;
        return *this;
    }
    Writer& meta(const std::string& k, const std::string& v) {
        hdr["__metadata__"][k] = v;
        return *this;
    }
    std::string bytes() const { return st_file(hdr.dump(), data); }
    void write(const std::string& path) const { g4test::write_file(path, bytes()); }
};

std::string f32_bytes(std::vector<float> v) {
    return raw(v);
}

// Runs `fn`, which must throw g4::CompileError; returns its message.
std::string compile_error(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const g4::CompileError& e) {
        return e.what();
    } catch (const std::exception& e) {
        ADD_FAILURE() << "expected g4::CompileError, got another exception: " << e.what();
        return "";
    }
    ADD_FAILURE() << "expected g4::CompileError, nothing was thrown";
    return "";
}

// EXPECT_THROW plus checks that the message is one line and contains every given substring.
#define EXPECT_COMPILE_ERROR(stmt, ...)                                                                      \
    do {                                                                                                     \
        EXPECT_THROW(stmt, g4::CompileError);                                                                \
        const std::string msg_ = compile_error([&] { stmt; });                                               \
        EXPECT_EQ(msg_.find('\n'), std::string::npos) << "multi-line message: " << msg_;                     \
        for (const std::string& sub_ : std::initializer_list<std::string>{__VA_ARGS__})                      \
            EXPECT_NE(msg_.find(sub_), std::string::npos) << "message lacks '" << sub_ << "': " << msg_;     \
    } while (0)

// Writes `bytes` to DIR/bad.safetensors and expects File::open to reject it naming the file and `subs`.
#define EXPECT_BAD_FILE(bytes, ...)                                                                          \
    do {                                                                                                     \
        g4test::TempDir td_;                                                                                 \
        const std::string path_ = td_.file("bad.safetensors");                                               \
        g4test::write_file(path_, bytes);                                                                    \
        EXPECT_COMPILE_ERROR(File::open(path_), path_, ##__VA_ARGS__);                                       \
    } while (0)

// A valid one-tensor file whose "w" entry is replaced by `entry`, with 16 bytes of data.
std::string with_entry(const json& entry) {
    return st_file(json{{"w", entry}}.dump(), std::string(16, '\0'));
}

const json kGoodEntry = {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}};

std::vector<float> as_f32(const g4::st::TensorView& t) {
    std::vector<float> out(t.numel());
    g4::st::to_f32(t, out.data());
    return out;
}

uint32_t bits(float f) {
    return std::bit_cast<uint32_t>(f);
}

// ---------------------------------------------------------------------------------------------------------
// Basics

TEST(DType, NamesAndSizes) {
    struct Case {
        DType d;
        const char* name;
        size_t size;
    };
    const Case cases[] = {{DType::F32, "F32", 4},  {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2},
                          {DType::F64, "F64", 8},  {DType::I64, "I64", 8}, {DType::I32, "I32", 4},
                          {DType::I16, "I16", 2},  {DType::I8, "I8", 1},   {DType::U8, "U8", 1},
                          {DType::BOOL, "BOOL", 1}};
    for (const Case& c : cases) {
        EXPECT_STREQ(g4::st::dtype_name(c.d), c.name);
        EXPECT_EQ(g4::st::dtype_size(c.d), c.size) << c.name;
    }
}

TEST(TensorView, Numel) {
    g4::st::TensorView t;
    t.shape = {};
    EXPECT_EQ(t.numel(), 1);
    t.shape = {3, 4, 5};
    EXPECT_EQ(t.numel(), 60);
    t.shape = {7, 0};
    EXPECT_EQ(t.numel(), 0);
}

TEST(SafetensorsFile, ReadsF32TensorAndShape) {
    g4test::TempDir td;
    const std::vector<float> vals = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
    Writer().add("a.weight", "F32", {2, 3}, f32_bytes(vals)).write(td.file("m.safetensors"));
    auto f = File::open(td.file("m.safetensors"));
    EXPECT_EQ(f->path(), td.file("m.safetensors"));
    ASSERT_EQ(f->tensors().size(), 1u);
    const auto& t = f->tensors().at("a.weight");
    EXPECT_EQ(t.name, "a.weight");
    EXPECT_EQ(t.dtype, DType::F32);
    EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(t.nbytes, 24u);
    EXPECT_EQ(t.numel(), 6);
    EXPECT_EQ(t.file, td.file("m.safetensors"));
    EXPECT_EQ(std::memcmp(t.data, vals.data(), 24), 0);
    EXPECT_EQ(as_f32(t), vals);
    EXPECT_TRUE(f->metadata().empty());
}

TEST(SafetensorsFile, Bf16RoundTrip) {
    g4test::TempDir td;
    // Values exactly representable in bf16 (f32 with the low 16 bits zero).
    const std::vector<float> vals = {
        1.0f, -2.5f, 0.15625f, 3.0e38f, -0.0f, 1.0e-39f, std::numeric_limits<float>::infinity()};
    std::vector<uint16_t> bf;
    std::vector<float> expect;
    for (float v : vals) {
        bf.push_back((uint16_t)(bits(v) >> 16));
        expect.push_back(std::bit_cast<float>(bits(v) & 0xffff0000u));
    }
    bf.push_back(0x7fc0); // quiet NaN
    Writer().add("x", "BF16", {8}, raw(bf)).write(td.file("m.safetensors"));
    auto f         = File::open(td.file("m.safetensors"));
    const auto out = as_f32(f->tensors().at("x"));
    ASSERT_EQ(out.size(), 8u);
    for (size_t i = 0; i < expect.size(); ++i)
        EXPECT_EQ(bits(out[i]), bits(expect[i])) << i;
    EXPECT_EQ(out[0], 1.0f);
    EXPECT_EQ(out[1], -2.5f);
    EXPECT_TRUE(std::signbit(out[4]));
    EXPECT_TRUE(std::isinf(out[6]));
    EXPECT_TRUE(std::isnan(out[7]));
}

TEST(SafetensorsFile, F16RoundTripIncludingSubnormalsInfNan) {
    g4test::TempDir td;
    struct Case {
        uint16_t h;
        float f;
    };
    const Case cases[] = {
        {0x3c00, 1.0f},
        {0xc000, -2.0f},
        {0x3555, 0.333251953125f},
        {0x7bff, 65504.0f},
        {0x0400, 0x1p-14f}, // smallest normal
        {0x0001, 0x1p-24f},
        {0x8001, -0x1p-24f}, // smallest subnormal
        {0x03ff, 1023 * 0x1p-24f},
        {0x0200, 0x1p-15f}, // largest subnormal, mid subnormal
        {0x0000, 0.0f},
        {0x7c00, std::numeric_limits<float>::infinity()},
        {0xfc00, -std::numeric_limits<float>::infinity()},
    };
    std::vector<uint16_t> h;
    for (const Case& c : cases)
        h.push_back(c.h);
    h.push_back(0x8000); // -0
    h.push_back(0x7e00); // NaN
    h.push_back(0xfc01); // NaN with sign and payload
    Writer().add("h", "F16", {(int64_t)h.size()}, raw(h)).write(td.file("m.safetensors"));
    auto f         = File::open(td.file("m.safetensors"));
    const auto out = as_f32(f->tensors().at("h"));
    ASSERT_EQ(out.size(), h.size());
    const size_t n = std::size(cases);
    for (size_t i = 0; i < n; ++i)
        EXPECT_EQ(out[i], cases[i].f) << "f16 0x" << std::hex << cases[i].h;
    EXPECT_EQ(out[n], 0.0f);
    EXPECT_TRUE(std::signbit(out[n]));
    EXPECT_TRUE(std::isnan(out[n + 1]));
    EXPECT_TRUE(std::isnan(out[n + 2]));
}

TEST(SafetensorsFile, F16ExhaustiveAgainstReference) {
    // Every finite half value: normal = (1 + m/1024) * 2^(e-15), subnormal = m * 2^-24.
    std::vector<uint16_t> h(65536);
    for (uint32_t i = 0; i < 65536; ++i)
        h[i] = (uint16_t)i;
    g4test::TempDir td;
    Writer().add("all", "F16", {65536}, raw(h)).write(td.file("m.safetensors"));
    auto f         = File::open(td.file("m.safetensors"));
    const auto out = as_f32(f->tensors().at("all"));
    int mismatches = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
        const int e = (i >> 10) & 0x1f, m = i & 0x3ff;
        const double sign = (i & 0x8000) ? -1.0 : 1.0;
        if (e == 31) {
            mismatches +=
                m == 0 ? !(std::isinf(out[i]) && std::signbit(out[i]) == (sign < 0)) : !std::isnan(out[i]);
            continue;
        }
        const double ref =
            e == 0 ? sign * std::ldexp((double)m, -24) : sign * std::ldexp(1.0 + m / 1024.0, e - 15);
        mismatches += (double)out[i] != ref;
    }
    EXPECT_EQ(mismatches, 0);
}

TEST(SafetensorsFile, F64ConvertsToF32) {
    g4test::TempDir td;
    const std::vector<double> vals = {1.0, -0.5, 1e300, 3.141592653589793};
    Writer().add("d", "F64", {2, 2}, raw(vals)).write(td.file("m.safetensors"));
    auto f         = File::open(td.file("m.safetensors"));
    const auto out = as_f32(f->tensors().at("d"));
    EXPECT_EQ(out[0], 1.0f);
    EXPECT_EQ(out[1], -0.5f);
    EXPECT_TRUE(std::isinf(out[2]));
    EXPECT_EQ(out[3], (float)3.141592653589793);
}

TEST(SafetensorsFile, IntegerTensorsReadButNotConvertible) {
    g4test::TempDir td;
    const std::vector<int32_t> ids = {1, -2, 300000};
    const std::string path         = td.file("m.safetensors");
    Writer()
        .add("ids", "I32", {3}, raw(ids))
        .add("mask", "BOOL", {2}, std::string("\x01\x00", 2))
        .add("q", "I8", {4}, "\x01\x02\x03\x04")
        .write(path);
    auto f        = File::open(path);
    const auto& t = f->tensors().at("ids");
    EXPECT_EQ(t.dtype, DType::I32);
    int32_t back[3];
    std::memcpy(back, t.data, sizeof back);
    EXPECT_EQ(back[2], 300000);
    EXPECT_EQ(f->tensors().at("mask").dtype, DType::BOOL);
    EXPECT_EQ(f->tensors().at("q").data[3], 4);
    std::vector<float> out(3);
    EXPECT_COMPILE_ERROR(g4::st::to_f32(t, out.data()), "ids", "I32", path);
}

TEST(SafetensorsFile, ReadsMetadata) {
    g4test::TempDir td;
    Writer()
        .meta("format", "pt")
        .meta("note", "hello world")
        .add("w", "F32", {1}, f32_bytes({4.0f}))
        .write(td.file("m.safetensors"));
    auto f = File::open(td.file("m.safetensors"));
    EXPECT_EQ(f->metadata().size(), 2u);
    EXPECT_EQ(f->metadata().at("format"), "pt");
    EXPECT_EQ(f->metadata().at("note"), "hello world");
    EXPECT_EQ(f->tensors().size(), 1u); // __metadata__ is not a tensor
    EXPECT_EQ(f->tensors().count("__metadata__"), 0u);
}

TEST(SafetensorsFile, EmptyHeaderAndZeroSizeTensors) {
    g4test::TempDir td;
    g4test::write_file(td.file("empty.safetensors"), st_file("{}"));
    EXPECT_TRUE(File::open(td.file("empty.safetensors"))->tensors().empty());

    // Zero-element tensors share an offset without counting as overlap; scalars have numel 1.
    const std::string hdr = R"({"a":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},)"
                            R"("b":{"dtype":"BF16","shape":[0],"data_offsets":[0,0]},)"
                            R"("s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})";
    g4test::write_file(td.file("zero.safetensors"), st_file(hdr, f32_bytes({9.0f})));
    auto f = File::open(td.file("zero.safetensors"));
    ASSERT_EQ(f->tensors().size(), 3u);
    EXPECT_EQ(f->tensors().at("a").numel(), 0);
    EXPECT_EQ(f->tensors().at("a").nbytes, 0u);
    EXPECT_EQ(f->tensors().at("s").numel(), 1);
    EXPECT_EQ(as_f32(f->tensors().at("s")), std::vector<float>{9.0f});
}

TEST(SafetensorsFile, PaddedHeaderUnalignedDataAndGaps) {
    // Writers pad the header with spaces; an odd header length leaves the data unaligned.
    g4test::TempDir td;
    const std::string hdr = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})" + std::string(3, ' ');
    ASSERT_NE(hdr.size() % 4, 0u);
    g4test::write_file(td.file("m.safetensors"), st_file(hdr, f32_bytes({1.25f, -8.0f})));
    auto f        = File::open(td.file("m.safetensors"));
    const auto& t = f->tensors().at("w");
    EXPECT_EQ(as_f32(t), (std::vector<float>{1.25f, -8.0f}));
    // As the safetensors library: bytes that belong to no tensor make the file invalid.
    const std::string gap = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
    g4test::write_file(td.file("g.safetensors"), st_file(gap, "GAP!" + f32_bytes({1.25f, -8.0f})));
    EXPECT_COMPILE_ERROR(File::open(td.file("g.safetensors")), "g.safetensors",
                         "bytes [0, 4) of the data section belong to no tensor");
}

TEST(SafetensorsFile, DataOutlivesCheckpointMoves) {
    g4test::TempDir td;
    Writer().add("w", "F32", {2}, f32_bytes({5.0f, 6.0f})).write(td.file("model.safetensors"));
    Checkpoint moved = [&] {
        Checkpoint ck = Checkpoint::open(td.path);
        return ck;
    }();
    EXPECT_EQ(as_f32(moved.get("w")), (std::vector<float>{5.0f, 6.0f}));
}

// ---------------------------------------------------------------------------------------------------------
// Malformed files

TEST(SafetensorsFileErrors, MissingFile) {
    g4test::TempDir td;
    const std::string path = td.file("nope.safetensors");
    EXPECT_COMPILE_ERROR(File::open(path), path, "does not exist");
}

TEST(SafetensorsFileErrors, DirectoryInsteadOfFile) {
    g4test::TempDir td;
    EXPECT_COMPILE_ERROR(File::open(td.path), td.path, "not a regular file");
}

TEST(SafetensorsFileErrors, Unreadable) {
    g4test::TempDir td;
    const std::string path = td.file("locked.safetensors");
    Writer().add("w", "F32", {1}, f32_bytes({1.0f})).write(path);
    // A path through a regular file fails with ENOTDIR, even for root.
    EXPECT_COMPILE_ERROR(File::open(path + "/x.safetensors"), path + "/x.safetensors", "cannot open");
    if (geteuid() != 0) { // root can read mode-000 files
        ASSERT_EQ(chmod(path.c_str(), 0), 0);
        EXPECT_COMPILE_ERROR(File::open(path), path, "cannot open", "permissions");
    }
}

TEST(SafetensorsFileErrors, ShorterThanEightBytes) {
    EXPECT_BAD_FILE("", "too short");
    EXPECT_BAD_FILE("\x02\x00\x00", "too short");
    EXPECT_BAD_FILE(std::string(7, '\0'), "too short");
}

TEST(SafetensorsFileErrors, HeaderLengthBeyondFile) {
    const std::string hdr = kGoodEntry.dump();
    EXPECT_BAD_FILE(le64(hdr.size() + 1) + hdr, "truncated");
    EXPECT_BAD_FILE(le64(50), "truncated");
}

TEST(SafetensorsFileErrors, AbsurdHeaderLength) {
    EXPECT_BAD_FILE(le64(100'000'001) + "{}", "100 MB");
    EXPECT_BAD_FILE(le64(~0ull) + "{}", "100 MB");
}

TEST(SafetensorsFileErrors, HeaderNotJson) {
    EXPECT_BAD_FILE(st_file("{\"w\": {\"dtype\": \"F32\","), "not valid JSON");
    EXPECT_BAD_FILE(st_file("garbage\nwith newline"), "not valid JSON");
    EXPECT_BAD_FILE(st_file(""), "not valid JSON");
    EXPECT_BAD_FILE(st_file("{\"\xff\xfe\": 1}"), "not valid JSON"); // invalid UTF-8
}

TEST(SafetensorsFileErrors, HeaderNotObject) {
    EXPECT_BAD_FILE(st_file("[1, 2, 3]"), "expected a JSON object");
    EXPECT_BAD_FILE(st_file("42"), "expected a JSON object");
    EXPECT_BAD_FILE(st_file("\"w\""), "expected a JSON object");
}

TEST(SafetensorsFileErrors, EntryNotObject) {
    EXPECT_BAD_FILE(with_entry(json::array({1, 2})), "'w'", "expected an object");
    EXPECT_BAD_FILE(with_entry(nullptr), "'w'", "expected an object");
}

TEST(SafetensorsFileErrors, EntryMissingFields) {
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
        json e = kGoodEntry;
        e.erase(key);
        EXPECT_BAD_FILE(with_entry(e), "'w'", key);
    }
}

TEST(SafetensorsFileErrors, EntryFieldsOfWrongType) {
    json e     = kGoodEntry;
    e["dtype"] = 4;
    EXPECT_BAD_FILE(with_entry(e), "'w'", "dtype");
    e          = kGoodEntry;
    e["shape"] = "2x2";
    EXPECT_BAD_FILE(with_entry(e), "'w'", "shape");
    e          = kGoodEntry;
    e["shape"] = {2, 2.0};
    EXPECT_BAD_FILE(with_entry(e), "'w'", "non-integer");
    e          = kGoodEntry;
    e["shape"] = {"2", 2};
    EXPECT_BAD_FILE(with_entry(e), "'w'", "non-integer");
    e                 = kGoodEntry;
    e["data_offsets"] = "0-16";
    EXPECT_BAD_FILE(with_entry(e), "'w'", "data_offsets");
}

TEST(SafetensorsFileErrors, UnknownDtype) {
    for (const char* dt : {"F8_E4M3", "Q4_0", "f32", ""}) {
        json e     = kGoodEntry;
        e["dtype"] = dt;
        EXPECT_BAD_FILE(with_entry(e), "'w'", "unsupported dtype");
    }
}

TEST(SafetensorsFileErrors, NegativeDimension) {
    json e     = kGoodEntry;
    e["shape"] = {-2, -2};
    EXPECT_BAD_FILE(with_entry(e), "'w'", "negative");
    e["shape"] = {4, -1};
    EXPECT_BAD_FILE(with_entry(e), "'w'", "negative");
}

TEST(SafetensorsFileErrors, HugeShapeOverflow) {
    json e     = kGoodEntry;
    e["shape"] = {1ll << 40, 1ll << 40};
    EXPECT_BAD_FILE(with_entry(e), "'w'", "too large");
}

TEST(SafetensorsFileErrors, BadDataOffsets) {
    const json bad[] = {json::array({16}),
                        json::array({0, 8, 16}),
                        json::array({16, 0}),
                        json::array({-4, 12}),
                        json::array({0.0, 16.0}),
                        json::array({"0", "16"}),
                        json::array(),
                        json::object({{"begin", 0}, {"end", 16}})};
    for (const json& offs : bad) {
        json e            = kGoodEntry;
        e["data_offsets"] = offs;
        EXPECT_BAD_FILE(with_entry(e), "'w'", "data_offsets");
    }
}

TEST(SafetensorsFileErrors, EndBeyondDataSection) {
    // Header promises 16 bytes; only 12 are present.
    EXPECT_BAD_FILE(st_file(json{{"w", kGoodEntry}}.dump(), std::string(12, '\0')), "'w'", "truncated");
    json e            = kGoodEntry;
    e["data_offsets"] = {8, 24};
    EXPECT_BAD_FILE(with_entry(e), "'w'", "beyond the data section");
}

TEST(SafetensorsFileErrors, SizeMismatch) {
    json e     = kGoodEntry;
    e["shape"] = {2, 3}; // 24 bytes of F32, range is 16
    EXPECT_BAD_FILE(with_entry(e), "'w'", "24", "16");
    e          = kGoodEntry;
    e["dtype"] = "BF16"; // 8 bytes, range is 16
    EXPECT_BAD_FILE(with_entry(e), "'w'", "BF16");
    e                 = kGoodEntry;
    e["data_offsets"] = {0, 12};
    EXPECT_BAD_FILE(with_entry(e), "'w'", "needs 16 bytes");
}

TEST(SafetensorsFileErrors, OverlappingTensors) {
    const std::string hdr = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
    EXPECT_BAD_FILE(st_file(hdr, std::string(16, '\0')), "'a'", "'b'", "overlap");
    // Identical ranges overlap too.
    const std::string same = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("z":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})";
    EXPECT_BAD_FILE(st_file(same, std::string(8, '\0')), "'a'", "'z'", "overlap");
    // One range inside a bigger one that starts earlier, with a third in between in sort order.
    const std::string nested = R"({"big":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},)"
                               R"("mid":{"dtype":"U8","shape":[2],"data_offsets":[16,18]},)"
                               R"("in":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})";
    EXPECT_BAD_FILE(st_file(nested, std::string(18, '\0')), "'big'", "'in'", "overlap");
}

TEST(SafetensorsFileErrors, BadMetadata) {
    EXPECT_BAD_FILE(st_file(R"({"__metadata__": [1]})"), "__metadata__");
    EXPECT_BAD_FILE(st_file(R"({"__metadata__": {"n": 3}})"), "__metadata__", "'n'");
}

TEST(SafetensorsFileErrors, TensorNameWithNewlineStaysOneLine) {
    json e     = kGoodEntry;
    e["dtype"] = "NOPE";
    EXPECT_BAD_FILE(st_file(json{{"bad\nname", e}}.dump(), std::string(16, '\0')), "unsupported dtype");
}

// ---------------------------------------------------------------------------------------------------------
// Checkpoint directories

TEST(Checkpoint, SingleFile) {
    g4test::TempDir td;
    Writer()
        .add("b", "F32", {2}, f32_bytes({1.0f, 2.0f}))
        .add("a", "BF16", {1}, raw(std::vector<uint16_t>{0x4040}))
        .write(td.file("model.safetensors"));
    Checkpoint ck = Checkpoint::open(td.path);
    EXPECT_EQ(ck.dir(), td.path);
    EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(ck.files(), std::vector<std::string>{td.file("model.safetensors")});
    EXPECT_TRUE(ck.has("a"));
    EXPECT_FALSE(ck.has("c"));
    EXPECT_EQ(as_f32(ck.get("a")), std::vector<float>{3.0f});
    EXPECT_EQ(as_f32(ck.get("b")), (std::vector<float>{1.0f, 2.0f}));
    EXPECT_EQ(ck.get("b").file, td.file("model.safetensors"));
}

void write_index(const std::string& path, const json& weight_map) {
    g4test::write_file(path, json{{"metadata", {{"total_size", 28}}}, {"weight_map", weight_map}}.dump(2));
}

TEST(Checkpoint, ShardedOverTwoFiles) {
    g4test::TempDir td;
    const std::string s1 = td.file("model-00001-of-00002.safetensors");
    const std::string s2 = td.file("model-00002-of-00002.safetensors");
    Writer()
        .add("embed", "F32", {2, 2}, f32_bytes({1, 2, 3, 4}))
        .add("norm", "F32", {1}, f32_bytes({0.5f}))
        .write(s1);
    Writer().add("head", "BF16", {2}, raw(std::vector<uint16_t>{0x3f80, 0xc000})).write(s2);
    write_index(td.file("model.safetensors.index.json"), {{"embed", "model-00001-of-00002.safetensors"},
                                                          {"norm", "model-00001-of-00002.safetensors"},
                                                          {"head", "model-00002-of-00002.safetensors"}});
    Checkpoint ck = Checkpoint::open(td.path);
    EXPECT_EQ(ck.names(), (std::vector<std::string>{"embed", "head", "norm"}));
    EXPECT_EQ(ck.files(), (std::vector<std::string>{s1, s2}));
    EXPECT_EQ(ck.get("embed").file, s1);
    EXPECT_EQ(ck.get("head").file, s2);
    EXPECT_EQ(ck.get("embed").shape, (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(as_f32(ck.get("embed")), (std::vector<float>{1, 2, 3, 4}));
    EXPECT_EQ(as_f32(ck.get("head")), (std::vector<float>{1.0f, -2.0f}));
    EXPECT_EQ(as_f32(ck.get("norm")), std::vector<float>{0.5f});
}

TEST(Checkpoint, IndexTakesPrecedenceOverSingleFile) {
    g4test::TempDir td;
    Writer().add("stale", "F32", {1}, f32_bytes({0.0f})).write(td.file("model.safetensors"));
    Writer().add("w", "F32", {1}, f32_bytes({7.0f})).write(td.file("shard.safetensors"));
    write_index(td.file("model.safetensors.index.json"), {{"w", "shard.safetensors"}});
    Checkpoint ck = Checkpoint::open(td.path);
    EXPECT_EQ(ck.names(), std::vector<std::string>{"w"});
    EXPECT_FALSE(ck.has("stale"));
}

TEST(CheckpointErrors, DirectoryMissing) {
    g4test::TempDir td;
    const std::string dir = td.file("no-such-model");
    EXPECT_COMPILE_ERROR(Checkpoint::open(dir), dir, "does not exist");
}

TEST(CheckpointErrors, PathIsAFile) {
    g4test::TempDir td;
    g4test::write_file(td.file("plain"), "x");
    EXPECT_COMPILE_ERROR(Checkpoint::open(td.file("plain")), td.file("plain"), "not a directory");
}

TEST(CheckpointErrors, NoSafetensors) {
    g4test::TempDir td;
    g4test::write_file(td.file("config.json"), "{}");
    EXPECT_COMPILE_ERROR(Checkpoint::open(td.path), td.path,
                         "no model.safetensors or model.safetensors.index.json in");
}

TEST(CheckpointErrors, MissingTensor) {
    g4test::TempDir td;
    Writer().add("w", "F32", {1}, f32_bytes({1.0f})).write(td.file("model.safetensors"));
    Checkpoint ck = Checkpoint::open(td.path);
    EXPECT_COMPILE_ERROR(ck.get("model.lm_head.weight"), "missing tensor 'model.lm_head.weight'", td.path);
}

TEST(CheckpointErrors, CorruptSingleFileNamesIt) {
    g4test::TempDir td;
    g4test::write_file(td.file("model.safetensors"), st_file("{not json"));
    EXPECT_COMPILE_ERROR(Checkpoint::open(td.path), td.file("model.safetensors"), "not valid JSON");
}

TEST(CheckpointErrors, CorruptIndex) {
    g4test::TempDir td;
    const std::string index = td.file("model.safetensors.index.json");
    g4test::write_file(index, "{\"weight_map\": {");
    EXPECT_COMPILE_ERROR(Checkpoint::open(td.path), index, "not valid JSON");
    g4test::write_file(index, "[]");
    EXPECT_COMPILE_ERROR(Checkpoint::open(td.path), index, "expected a JSON object");
}

TEST(CheckpointErrors, IndexWithoutWeightMap) {
    g4test::TempDir td;
    const std::string index = td.file("model.safetensors.index.json");
    g4test::write_file(index, R"({"metadata": {"total_size": 4}})");
    EXPECT_COMPILE_ERROR(Checkpoint::open(td.path), index, "weight_map");
    g4test::write_file(index, R"({"weight_map": ["a"]})");
    EXPECT_COMPILE_ERROR(Checkpoint::open(td.path), index, "weight_map");
    g4test::write_file(index, R"({"weight_map": {}})");
    EXPECT_COMPILE_ERROR(Checkpoint::open(td.path), index, "weight_map is empty");
    g4test::write_file(index, R"({"weight_map": {"w": 1}})");
    EXPECT_COMPILE_ERROR(Checkpoint::open(td.path), index, "'w'");
    g4test::write_file(index, R"({"weight_map": {"w": "../escape.safetensors"}})");
    EXPECT_COMPILE_ERROR(Checkpoint::open(td.path), index, "'w'");
}

TEST(CheckpointErrors, ShardMissing) {
    g4test::TempDir td;
    const std::string index = td.file("model.safetensors.index.json");
    Writer().add("a", "F32", {1}, f32_bytes({1.0f})).write(td.file("s1.safetensors"));
    write_index(index, {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
    EXPECT_COMPILE_ERROR(Checkpoint::open(td.path), "s2.safetensors", index, "does not exist");
}

TEST(CheckpointErrors, TensorAbsentFromItsShard) {
    g4test::TempDir td;
    const std::string index = td.file("model.safetensors.index.json");
    Writer().add("a", "F32", {1}, f32_bytes({1.0f})).write(td.file("s1.safetensors"));
    Writer().add("b", "F32", {1}, f32_bytes({2.0f})).write(td.file("s2.safetensors"));
    write_index(index, {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}, {"ghost", "s2.safetensors"}});
    EXPECT_COMPILE_ERROR(Checkpoint::open(td.path), "'ghost'", "s2.safetensors", index);
}

TEST(CheckpointErrors, TensorInTwoShards) {
    g4test::TempDir td;
    Writer()
        .add("a", "F32", {1}, f32_bytes({1.0f}))
        .add("dup", "F32", {1}, f32_bytes({1.0f}))
        .write(td.file("s1.safetensors"));
    Writer().add("dup", "F32", {1}, f32_bytes({2.0f})).write(td.file("s2.safetensors"));
    write_index(td.file("model.safetensors.index.json"),
                {{"a", "s1.safetensors"}, {"dup", "s2.safetensors"}});
    EXPECT_COMPILE_ERROR(Checkpoint::open(td.path), "'dup'", "s1.safetensors", "s2.safetensors");
}

TEST(CheckpointErrors, CorruptShardNamesShard) {
    g4test::TempDir td;
    Writer().add("a", "F32", {1}, f32_bytes({1.0f})).write(td.file("s1.safetensors"));
    g4test::write_file(td.file("s2.safetensors"), "tiny");
    write_index(td.file("model.safetensors.index.json"), {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}});
    EXPECT_COMPILE_ERROR(Checkpoint::open(td.path), td.file("s2.safetensors"), "too short");
}

} // namespace
