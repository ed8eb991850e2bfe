// Op names, dtype helpers and bf16 conversions shared by all kernel tiers.
#include "kernels/ops.h"

#include <cstring>

namespace g4 {

const char* dtype_str(DType d) {
    switch (d) {
    case DType::F32:
        return "f32";
    case DType::BF16:
        return "bf16";
    case DType::F16:
        return "f16";
    case DType::I32:
        return "i32";
    case DType::NF4:
        return "nf4";
    }
    return "?";
}

size_t dtype_bytes(DType d, int64_t n) {
    switch (d) {
    case DType::F32:
        return (size_t)n * 4;
    case DType::BF16:
        return (size_t)n * 2;
    case DType::F16:
        return (size_t)n * 2;
    case DType::I32:
        return (size_t)n * 4;
    case DType::NF4:
        return (size_t)(n + 1) / 2;
    }
    return 0;
}

const char* op_name(OpCode op) {
    for (const OpName& n : kOpNames)
        if (n.code == op) return n.name;
    return "unknown";
}

float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu)) return (uint16_t)((u >> 16) | 0x40); // NaN
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

} // namespace g4
