// NF4 quantization for the plan compiler, and dequantization of pre-quantized bitsandbytes checkpoints.
//
// quantize() follows bitsandbytes' quantize_4bit(quant_type="nf4", blocksize=64) reference definition
// (bitsandbytes/backends/default/ops.py) bit for bit, tested against tools/nf4_ref.py:
//   * blocks of 64 over the row-major flattened array; absmax = max|x| (fp32);
//     full block: scaled = clamp(x * (1 / max(absmax, 1e-38f)), -1, 1), absmax stored as is;
//     partial tail block: absmax = max(max|x|, 1e-38f) (stored clamped), scaled = clamp(x / absmax, -1, 1);
//   * code = number of fp32 midpoints (code[i] + code[i+1]) / 2 strictly below `scaled` (torch.bucketize,
//     right=False): a value exactly on a midpoint takes the LOWER code, as CUDA's `x > threshold` tree does;
//     an all-zero block (absmax 0) gives code 7 (0.0) everywhere; an odd count is padded with code 7;
//   * double quant (bnb_4bit_use_double_quant): offset = fp32(sum of absmax, float64) / nblocks in fp32;
//     absmax_q, absmax2 = quantize_blockwise(absmax - offset, create_dynamic_map(), 256) with the same
//     scaling/tie rules on the 256-entry signed dynamic map.
// The result is one blob in the kernels/nf4.h layout.
#pragma once
#include "kernels/nf4.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace g4::nf4 {

// NF4 blob (kernels/nf4.h layout, nf4::layout(n, double_quant).total bytes) of n float32 values.
std::vector<uint8_t> quantize(const float* w, int64_t n, bool double_quant);

// The blob of an NF4 [rows, cols] matrix laid out for the fused decode MLP (plan kQuantTiled32): codes as
// [cols / 32][rows][16 bytes], absmax as [cols / 64][rows]; absmax2, offset and code2 unchanged. cols % 64 ==
// 0.
std::vector<uint8_t> tile32(const std::vector<uint8_t>& blob, int64_t rows, int64_t cols, bool double_quant);

// bitsandbytes.functional.create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8), ascending,
// reproduced exactly as torch evaluates it (linspace in fp32 fused multiply-add form).
const std::array<float, 256>& dynamic_map();

// bitsandbytes' reference quantize_blockwise(x, code, blocksize) for an ascending `code` of ncode <= 256
// values: codes[n] (indices into code) and absmax[ceil(n / blocksize)].
void quantize_blockwise(const float* x, int64_t n, int64_t blocksize, const float* code, int ncode,
                        uint8_t* codes, float* absmax);

// --- pre-quantized bitsandbytes checkpoints ----------------------------------------------------------------
struct ByteView {
    const uint8_t* data = nullptr;
    size_t size         = 0;
};

// The serialized entries of one bnb Linear4bit weight at prefix P (transformers / bitsandbytes
// Linear4bit._save_to_state_dict). Dtype strings are the safetensors spellings ("U8", "F32", ...); an empty
// one is not checked. `name` (e.g. "model.layers.0.mlp.up_proj.weight") only labels error messages.
struct BnbNf4 {
    std::string name;
    ByteView weight; // P.weight: packed codes, ceil(n/2) bytes (any quant_storage dtype)
    ByteView absmax; // P.weight.absmax: u8[nblocks] if nested, else f32[nblocks]
    std::string absmax_dtype;
    ByteView quant_map;           // P.weight.quant_map: f32[16], must be the NF4 table
    ByteView nested_absmax;       // P.weight.nested_absmax: f32[ceil(nblocks / nested_blocksize)] (nested)
    ByteView nested_quant_map;    // P.weight.nested_quant_map: f32[256] (nested)
    std::string_view quant_state; // bytes of P.weight.quant_state.bitsandbytes__nf4 (UTF-8 JSON)
    std::string quant_state_key;  // optional: the key's last component, e.g. "bitsandbytes__nf4"
};

// Parsed P.weight.quant_state JSON.
struct BnbQuantState {
    std::string quant_type; // "nf4"
    int64_t blocksize = 0;
    std::string dtype; // e.g. "bfloat16": what bitsandbytes casts the dequantized weight to
    std::vector<int64_t> shape;
    bool nested              = false;
    int64_t nested_blocksize = 0;
    std::string nested_dtype;
    float nested_offset = 0;
};
BnbQuantState parse_bnb_quant_state(std::string_view json_text, const std::string& name);

// float32 values (row-major, product of `shape` elements) of a bitsandbytes NF4 tensor, computed as
// bitsandbytes' dequantize_4bit does before its final cast to quant_state.dtype:
//   absmax[b] = fp32(nested_quant_map[absmax_u8[b]] * nested_absmax[b / nested_blocksize]) + nested_offset
//   w[j]      = fp32(NF4[code(j)] * absmax[j / blocksize])
// Any bnb block size (32..4096, power of two) is accepted. Throws g4::CompileError naming the tensor and what
// is wrong (fp4 is "not supported", sizes that disagree with the shape, malformed JSON, missing entries).
std::vector<float> dequantize_bnb(const BnbNf4& t, std::vector<int64_t>* shape = nullptr);

// The same tensor re-laid out, without requantizing, as a g4 NF4 blob (kernels/nf4.h), when its geometry
// matches g4's (blocksize 64; nested_blocksize 256 when nested). *double_quant tells which variant it is.
// Throws g4::CompileError otherwise (callers then dequantize_bnb() and quantize()).
std::vector<uint8_t> blob_from_bnb(const BnbNf4& t, bool* double_quant,
                                   std::vector<int64_t>* shape = nullptr);

} // namespace g4::nf4
