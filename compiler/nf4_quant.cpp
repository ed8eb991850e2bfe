// NF4 quantization (bitsandbytes' reference definition) and bitsandbytes checkpoint dequantization.
// See nf4_quant.h for the exact rules; tools/nf4_ref.py is the independent numpy reference the tests use.
#include "compiler/nf4_quant.h"

#include "compiler/error.h"
#include "compiler/workers.h"
#include "runtime/src/json_limits.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

namespace g4::nf4 {

namespace {

// torch clamp(min=1e-38) on float32: the scalar rounded to fp32 (a subnormal).
const float kClampMin = static_cast<float>(1e-38);

inline float load_f32(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, sizeof f);
    return f;
}

inline void store_f32(uint8_t* p, float f) {
    std::memcpy(p, &f, sizeof f);
}

// Scales one block as bitsandbytes' reference quantize_blockwise / quantize_4bit does and returns the absmax
// it stores. `full`: a whole block (absmax stored unclamped, x * (1 / clamp(absmax))); otherwise the tail
// block (absmax stored clamped, x / absmax).
float scale_block(const float* x, int64_t len, bool full, float* scaled) {
    float am = 0.0f;
    for (int64_t i = 0; i < len; ++i)
        am = std::max(am, std::fabs(x[i]));
    if (full) {
        const float inv = 1.0f / std::max(am, kClampMin);
        for (int64_t i = 0; i < len; ++i)
            scaled[i] = std::min(std::max(x[i] * inv, -1.0f), 1.0f);
        return am;
    }
    am = std::max(am, kClampMin);
    for (int64_t i = 0; i < len; ++i)
        scaled[i] = std::min(std::max(x[i] / am, -1.0f), 1.0f);
    return am;
}

// fp32 midpoints between neighbours of an ascending code, as torch computes (code[:-1] + code[1:]) / 2.
std::vector<float> midpoints(const float* code, int ncode) {
    std::vector<float> b(ncode - 1);
    for (int i = 0; i + 1 < ncode; ++i)
        b[i] = (code[i] + code[i + 1]) / 2.0f;
    return b;
}

// torch.bucketize(v, bounds, right=False) = number of bounds strictly below v.
inline uint8_t bucketize(float v, const std::vector<float>& bounds) {
    return (uint8_t)(std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin());
}

// The same for the 15 NF4 midpoints, branch-free.
inline uint8_t bucketize_nf4(float v, const float* b15) {
    int c = 0;
    for (int j = 0; j < 15; ++j)
        c += (b15[j] < v);
    return (uint8_t)c;
}

// torch.linspace(start, end, steps, dtype=float32) on CPU: start + step*i for the first half, end -
// step*(steps-1-i) for the rest, each one fused multiply-add in fp32 (what torch's vectorized CPU kernels
// evaluate).
std::vector<float> linspace_f32(double start_d, double end_d, int steps) {
    const float start = (float)start_d, end = (float)end_d;
    std::vector<float> out(steps);
    if (steps == 1) {
        out[0] = start;
        return out;
    }
    const float step = (end - start) / (float)(steps - 1);
    const int half   = steps / 2;
    for (int i = 0; i < steps; ++i)
        out[i] = i < half ? std::fmaf(step, (float)i, start) : std::fmaf(-step, (float)(steps - 1 - i), end);
    return out;
}

std::array<float, 256> make_dynamic_map() {
    // create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for i in 0..6, the midpoints of
    // linspace(0.1, 1, 2^i + 1) times +-10^(i-6) (a Python float, rounded to fp32 by torch), then 0 and 1.
    static const double kPow10[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
    std::vector<float> data;
    for (int i = 0; i < 7; ++i) {
        std::vector<float> b = linspace_f32(0.1, 1.0, (1 << i) + 1);
        const float scale    = (float)kPow10[i];
        for (size_t j = 0; j + 1 < b.size(); ++j) {
            float mean = (b[j] + b[j + 1]) / 2.0f;
            data.push_back(scale * mean);
            data.push_back(-scale * mean);
        }
    }
    data.push_back(0.0f);
    data.push_back(1.0f);
    std::sort(data.begin(), data.end());
    std::array<float, 256> m{};
    std::copy(data.begin(), data.end(), m.begin()); // exactly 256 values
    return m;
}

[[noreturn]] void fail(const std::string& name, const std::string& what) {
    throw CompileError("bitsandbytes NF4 tensor " + (name.empty() ? std::string("<unnamed>") : name) + ": " +
                       what);
}

bool is_bnb_blocksize(int64_t b) {
    return b == 32 || b == 64 || b == 128 || b == 256 || b == 512 || b == 1024 || b == 2048 || b == 4096;
}

bool is_float_dtype_name(const std::string& s) {
    return s == "bfloat16" || s == "float16" || s == "float32";
}

void check_view(const BnbNf4& t, const ByteView& v, uint64_t want, const char* what) {
    if (!v.data && v.size) fail(t.name, std::string(what) + " has a size but no data");
    if (!v.data) fail(t.name, std::string("missing ") + what);
    if (v.size != want)
        fail(t.name, std::string(what) + " has " + std::to_string(v.size) + " bytes, expected " +
                         std::to_string(want) + " for the quant_state shape");
}

struct Checked {
    BnbQuantState qs;
    int64_t n = 0, nblocks = 0, nblocks2 = 0;
};

Checked check_bnb(const BnbNf4& t) {
    Checked c;
    c.qs                    = parse_bnb_quant_state(t.quant_state, t.name);
    const BnbQuantState& qs = c.qs;
    if (!t.quant_state_key.empty() && t.quant_state_key != "bitsandbytes__" + qs.quant_type)
        fail(t.name,
             "quant_state key '" + t.quant_state_key + "' disagrees with quant_type '" + qs.quant_type + "'");
    bool has_nested_tensors = t.nested_absmax.data || t.nested_quant_map.data;
    if (has_nested_tensors != qs.nested)
        fail(t.name,
             qs.nested
                 ? "quant_state is nested (double quant) but nested_absmax / nested_quant_map are missing"
                 : "nested_absmax / nested_quant_map present but quant_state has no nested_* entries");
    c.n = 1;
    for (int64_t d : qs.shape) {
        if (d < 0) fail(t.name, "negative dimension in quant_state shape");
        if (d && c.n > std::numeric_limits<int64_t>::max() / 4 / d)
            fail(t.name, "quant_state shape is too large");
        c.n *= d;
    }
    if (c.n <= 0) fail(t.name, "quant_state shape has no elements");
    c.nblocks = (c.n + qs.blocksize - 1) / qs.blocksize;
    check_view(t, t.weight, (uint64_t)(c.n + 1) / 2, "weight (packed 4-bit codes)");
    if (qs.nested) {
        if (!t.absmax_dtype.empty() && t.absmax_dtype != "U8")
            fail(t.name, "absmax is " + t.absmax_dtype + ", expected U8 for a nested (double-quant) state");
        check_view(t, t.absmax, (uint64_t)c.nblocks, "absmax (u8, nested)");
        c.nblocks2 = (c.nblocks + qs.nested_blocksize - 1) / qs.nested_blocksize;
        check_view(t, t.nested_absmax, 4 * (uint64_t)c.nblocks2, "nested_absmax (f32)");
        check_view(t, t.nested_quant_map, 4 * 256, "nested_quant_map (f32[256])");
        for (int i = 0; i < 256; ++i)
            if (!std::isfinite(load_f32(t.nested_quant_map.data + 4 * i)))
                fail(t.name, "nested_quant_map is not finite");
    } else {
        if (!t.absmax_dtype.empty() && t.absmax_dtype != "F32")
            fail(t.name, "absmax is " + t.absmax_dtype + ", expected F32 (not nested)");
        check_view(t, t.absmax, 4 * (uint64_t)c.nblocks, "absmax (f32)");
    }
    check_view(t, t.quant_map, 4 * 16, "quant_map (f32[16])");
    for (int i = 0; i < 16; ++i) {
        float v = load_f32(t.quant_map.data + 4 * i);
        if (!(std::fabs(v - kCodebook[i]) <= 1e-6f))
            fail(t.name, "quant_map[" + std::to_string(i) + "] = " + std::to_string(v) +
                             " is not the NF4 table (bitsandbytes dequantizes with its built-in table)");
    }
    return c;
}

} // namespace

const std::array<float, 256>& dynamic_map() {
    static const std::array<float, 256> m = make_dynamic_map();
    return m;
}

void quantize_blockwise(const float* x, int64_t n, int64_t blocksize, const float* code, int ncode,
                        uint8_t* codes, float* absmax) {
    const std::vector<float> bounds = midpoints(code, ncode);
    std::vector<float> scaled((size_t)blocksize);
    for (int64_t b = 0, lo = 0; lo < n; ++b, lo += blocksize) {
        int64_t len = std::min(blocksize, n - lo);
        absmax[b]   = scale_block(x + lo, len, len == blocksize, scaled.data());
        for (int64_t i = 0; i < len; ++i)
            codes[lo + i] = bucketize(scaled[i], bounds);
    }
}

std::vector<uint8_t> quantize(const float* w, int64_t n, bool double_quant) {
    const Layout l = layout(n, double_quant);
    std::vector<uint8_t> blob(l.total, 0);
    const std::vector<float> b15 = midpoints(kCodebook, 16);
    std::vector<float> absmax((size_t)l.nblocks);
    uint8_t* packed = blob.data() + l.codes_off;
    // Blocks [c * kChunk, (c + 1) * kChunk): each writes only its own codes and absmax, so chunks run on the
    // compiler's thread pool in any order with the same bytes.
    constexpr int64_t kChunk = 4096;
    float* am                = absmax.data();
    const float* bounds      = b15.data();
    const int64_t nblocks    = l.nblocks;
    auto chunk               = [=](int64_t c, int) {
        float scaled[kBlock];
        uint8_t q[kBlock + 1];
        for (int64_t b = c * kChunk; b < std::min(nblocks, (c + 1) * kChunk); ++b) {
            const int64_t lo = b * kBlock, len = std::min<int64_t>(kBlock, n - lo);
            am[b] = scale_block(w + lo, len, len == kBlock, scaled);
            for (int64_t i = 0; i < len; ++i)
                q[i] = bucketize_nf4(scaled[i], bounds);
            q[len] = 7; // odd tail: bitsandbytes pads with 0.0, whose code is 7 (blocks are even otherwise)
            for (int64_t i = 0; i < len; i += 2)
                packed[(lo + i) / 2] = (uint8_t)((q[i] << 4) | q[i + 1]);
        }
    };
    const int64_t nchunks = (l.nblocks + kChunk - 1) / kChunk;
    compiler::parallel_for(nchunks, chunk);
    if (!double_quant) {
        std::memcpy(blob.data() + l.absmax_off, absmax.data(), 4 * absmax.size());
        return blob;
    }
    // offset = mean(absmax): fp32 of the float64 running sum, divided in fp32.
    double sum = 0;
    for (float a : absmax)
        sum += a;
    const float offset = (float)sum / (float)l.nblocks;
    std::vector<float> shifted(absmax.size()), absmax2((size_t)l.nblocks2);
    for (size_t i = 0; i < absmax.size(); ++i)
        shifted[i] = absmax[i] - offset;
    const std::array<float, 256>& code2 = dynamic_map();
    quantize_blockwise(shifted.data(), l.nblocks, kBlock2, code2.data(), 256, blob.data() + l.absmax_off,
                       absmax2.data());
    std::memcpy(blob.data() + l.absmax2_off, absmax2.data(), 4 * absmax2.size());
    store_f32(blob.data() + l.offset_off, offset);
    std::memcpy(blob.data() + l.code2_off, code2.data(), 4 * 256);
    return blob;
}

BnbQuantState parse_bnb_quant_state(std::string_view text, const std::string& name) {
    using nlohmann::json;
    if (text.empty()) fail(name, "quant_state.bitsandbytes__nf4 is missing or empty");
    if (std::string e = g4::json_depth_error(text); !e.empty()) fail(name, "quant_state: " + e);
    json j;
    try {
        j = json::parse(text.begin(), text.end());
    } catch (const std::exception& e) {
        fail(name, std::string("quant_state JSON is malformed: ") + e.what());
    }
    if (!j.is_object()) fail(name, "quant_state JSON is not an object");
    static const char* kKnown[] = {"quant_type",       "blocksize",     "dtype",           "shape",
                                   "nested_blocksize", "nested_dtype",  "nested_offset",   "absmax",
                                   "quant_map",        "nested_absmax", "nested_quant_map"};
    for (auto it = j.begin(); it != j.end(); ++it)
        if (std::find_if(std::begin(kKnown), std::end(kKnown),
                         [&](const char* k) { return it.key() == k; }) == std::end(kKnown))
            fail(name, "unknown quant_state key '" + it.key() + "'");
    auto need = [&](const char* key) -> const json& {
        if (!j.contains(key)) fail(name, std::string("quant_state has no '") + key + "'");
        return j[key];
    };
    auto need_int = [&](const char* key) -> int64_t {
        const json& v = need(key);
        if (!v.is_number_integer()) fail(name, std::string("quant_state '") + key + "' is not an integer");
        return v.get<int64_t>();
    };
    auto need_str = [&](const char* key) -> std::string {
        const json& v = need(key);
        if (!v.is_string()) fail(name, std::string("quant_state '") + key + "' is not a string");
        return v.get<std::string>();
    };
    BnbQuantState qs;
    qs.quant_type = need_str("quant_type");
    if (qs.quant_type == "fp4")
        fail(name, "quant_type fp4 is not supported (only nf4); re-quantize the model with "
                   "bnb_4bit_quant_type=\"nf4\"");
    if (qs.quant_type != "nf4") fail(name, "unknown quant_type '" + qs.quant_type + "' (expected nf4)");
    qs.blocksize = need_int("blocksize");
    if (!is_bnb_blocksize(qs.blocksize))
        fail(name, "blocksize " + std::to_string(qs.blocksize) +
                       " is not a bitsandbytes block size (32..4096, power of 2)");
    qs.dtype = need_str("dtype");
    if (!is_float_dtype_name(qs.dtype))
        fail(name, "dtype '" + qs.dtype + "' is not bfloat16, float16 or float32");
    const json& sh = need("shape");
    if (!sh.is_array() || sh.empty()) fail(name, "quant_state shape is not a non-empty list of integers");
    for (const json& d : sh) {
        if (!d.is_number_integer()) fail(name, "quant_state shape is not a non-empty list of integers");
        qs.shape.push_back(d.get<int64_t>());
    }
    bool any_nested =
        j.contains("nested_blocksize") || j.contains("nested_dtype") || j.contains("nested_offset");
    if (any_nested) {
        qs.nested           = true;
        qs.nested_blocksize = need_int("nested_blocksize");
        if (qs.nested_blocksize <= 0 || qs.nested_blocksize > (1 << 20))
            fail(name, "nested_blocksize " + std::to_string(qs.nested_blocksize) + " is out of range");
        qs.nested_dtype = need_str("nested_dtype");
        if (qs.nested_dtype != "float32") fail(name, "nested_dtype '" + qs.nested_dtype + "' is not float32");
        const json& off = need("nested_offset");
        if (!off.is_number()) fail(name, "quant_state 'nested_offset' is not a number");
        qs.nested_offset = (float)off.get<double>(); // torch.tensor(float(...)): fp32
        if (!std::isfinite(qs.nested_offset)) fail(name, "nested_offset is not finite");
    }
    return qs;
}

std::vector<float> dequantize_bnb(const BnbNf4& t, std::vector<int64_t>* shape) {
    const Checked c         = check_bnb(t);
    const BnbQuantState& qs = c.qs;
    std::vector<float> out((size_t)c.n);
    const uint8_t* codes = t.weight.data;
    for (int64_t b = 0; b < c.nblocks; ++b) {
        float s;
        if (qs.nested)
            s = mul_then_add(load_f32(t.nested_quant_map.data + 4 * (size_t)t.absmax.data[b]),
                             load_f32(t.nested_absmax.data + 4 * (size_t)(b / qs.nested_blocksize)),
                             qs.nested_offset);
        else
            s = load_f32(t.absmax.data + 4 * (size_t)b);
        const int64_t lo = b * qs.blocksize, hi = std::min(c.n, lo + qs.blocksize);
        for (int64_t j = lo; j < hi; ++j) {
            uint8_t byte   = codes[j >> 1];
            out[(size_t)j] = kCodebook[(j & 1) ? (byte & 15) : (byte >> 4)] * s;
        }
    }
    if (shape) *shape = qs.shape;
    return out;
}

std::vector<uint8_t> blob_from_bnb(const BnbNf4& t, bool* double_quant, std::vector<int64_t>* shape) {
    const Checked c         = check_bnb(t);
    const BnbQuantState& qs = c.qs;
    if (qs.blocksize != kBlock)
        fail(t.name, "blocksize " + std::to_string(qs.blocksize) +
                         " cannot be kept as is (g4 NF4 uses 64); dequantize and re-quantize");
    if (qs.nested && qs.nested_blocksize != kBlock2)
        fail(t.name, "nested_blocksize " + std::to_string(qs.nested_blocksize) +
                         " cannot be kept as is (g4 NF4 uses 256); dequantize and re-quantize");
    const Layout l = layout(c.n, qs.nested);
    std::vector<uint8_t> blob(l.total, 0);
    std::memcpy(blob.data() + l.codes_off, t.weight.data, l.codes_bytes);
    if (qs.nested) {
        std::memcpy(blob.data() + l.absmax_off, t.absmax.data, (size_t)l.nblocks);
        std::memcpy(blob.data() + l.absmax2_off, t.nested_absmax.data, 4 * (size_t)l.nblocks2);
        store_f32(blob.data() + l.offset_off, qs.nested_offset);
        std::memcpy(blob.data() + l.code2_off, t.nested_quant_map.data, 4 * 256);
    } else {
        std::memcpy(blob.data() + l.absmax_off, t.absmax.data, 4 * (size_t)l.nblocks);
    }
    if (double_quant) *double_quant = qs.nested;
    if (shape) *shape = qs.shape;
    return blob;
}

std::vector<uint8_t> tile32(const std::vector<uint8_t>& blob, int64_t rows, int64_t cols, bool double_quant) {
    const Layout l = layout(rows * cols, double_quant);
    if (cols % 64 != 0 || blob.size() != l.total)
        throw CompileError("internal: NF4 tile32 of a [" + std::to_string(rows) + ", " +
                           std::to_string(cols) + "] blob of " + std::to_string(blob.size()) + " bytes");
    std::vector<uint8_t> out(blob);
    const int64_t slices = cols / 32, blocks = cols / 64, absmax_bytes = double_quant ? 1 : 4;
    for (int64_t j = 0; j < slices; ++j)
        for (int64_t r = 0; r < rows; ++r)
            std::memcpy(&out[l.codes_off + (j * rows + r) * 16], &blob[l.codes_off + (r * cols + j * 32) / 2],
                        16);
    for (int64_t b = 0; b < blocks; ++b)
        for (int64_t r = 0; r < rows; ++r)
            std::memcpy(&out[l.absmax_off + (b * rows + r) * absmax_bytes],
                        &blob[l.absmax_off + (r * blocks + b) * absmax_bytes], absmax_bytes);
    return out;
}

} // namespace g4::nf4
