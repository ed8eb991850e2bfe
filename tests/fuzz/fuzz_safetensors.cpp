// Fuzz target: a .safetensors file (header JSON, dtypes, shapes, offsets), then every floating tensor's
// conversion to float32 (compiler/safetensors.h). Defects must be a g4::CompileError, never a crash.
#include "compiler/error.h"
#include "compiler/safetensors.h"
#include "fuzz_util.h"

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = g4fuzz::write_scratch("model.safetensors", data, size);
    try {
        auto f = g4::st::File::open(path);
        std::vector<float> buf;
        for (const auto& [name, t] : f->tensors()) {
            if (t.dtype != g4::st::DType::F32 && t.dtype != g4::st::DType::F16 &&
                t.dtype != g4::st::DType::BF16 && t.dtype != g4::st::DType::F64)
                continue;
            buf.resize((size_t)t.numel()); // bounded: the header's byte range lies inside the file
            g4::st::to_f32(t, buf.data());
        }
    } catch (const g4::CompileError&) {
    }
    return 0;
}
