// How the compiler's tower builders (compiler/stage_towers.cpp) read a checkpoint's tower weights by name,
// and the towers' matmul precision (--tower-precision).
#pragma once
#include "kernels/ops.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

namespace g4::towers {

// One weight of the checkpoint: row-major, dims[0] outermost.
// 0-d scalars (ClippableLinear bounds) have ndim 0 and one element.
struct Tensor {
    const void* data = nullptr;
    DType dtype = DType::F32; // F32 or BF16 (towers are never NF4: a quantized vision tower sees grey shapes)
    int ndim    = 0;
    int64_t dims[4] = {};
    int64_t numel() const {
        int64_t n = 1;
        for (int i = 0; i < ndim; ++i)
            n *= dims[i];
        return n;
    }
};

// Resolves a Hugging Face tensor name relative to the multimodal model prefix "model." (for example
// "vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight",
// "embed_vision.embedding_projection.weight"). Returns nullptr when the tensor is absent. The returned memory
// outlives the lookup's user.
using Lookup = std::function<const Tensor*(const std::string& name)>;

// Arithmetic of the towers' matmuls. F32 (Hugging Face's float32 reference; the default with --weights f32):
// fp32 activations times widened weights. BF16 (the default otherwise, `--tower-precision bf16`): activations
// rounded to bf16 and bf16 weights, fp32 products and sums (cpu::matmul_gemm_bf16; CPUs without AVX-512
// BF16 run the fp32 GEMM instead); everything else stays fp32.
enum class Precision { F32, BF16 };
inline const char* precision_name(Precision p) {
    return p == Precision::BF16 ? "bf16" : "fp32";
}
// "fp32" | "bf16" -> *out; returns "" or an error naming the accepted values.
inline std::string parse_precision(const std::string& s, Precision* out) {
    if (s == "fp32")
        *out = Precision::F32;
    else if (s == "bf16")
        *out = Precision::BF16;
    else
        return "tower precision '" + s + "': expected fp32 or bf16";
    return "";
}

// Reads element i of a weight as float32 (bf16 widened exactly); well-defined at any alignment.
inline float tensor_at(const Tensor& t, int64_t i) {
    if (t.dtype == DType::BF16) {
        uint16_t h;
        std::memcpy(&h, static_cast<const uint8_t*>(t.data) + 2 * i, 2);
        return bf16_to_f32(h);
    }
    float f;
    std::memcpy(&f, static_cast<const uint8_t*>(t.data) + 4 * i, 4);
    return f;
}

} // namespace g4::towers
