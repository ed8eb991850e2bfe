// Fuzz target: a PEFT adapter, adapter_config.json NUL adapter_model.safetensors (compiler/lora.h): open and
// validate it, then apply every module it targets to a base weight of the shape it declares.
#include "compiler/error.h"
#include "compiler/lora.h"
#include "fuzz_util.h"

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto parts = g4fuzz::split_nul(data, size, 2);
    if (parts.size() != 2) return 0;
    g4fuzz::write_scratch("adapter_config.json", parts[0].data(), parts[0].size());
    g4fuzz::write_scratch("adapter_model.safetensors", parts[1].data(), parts[1].size());
    try {
        auto a = g4::lora::Adapter::open(g4fuzz::scratch_dir());
        std::vector<float> w, bias;
        for (const auto& m : a->merges()) {
            // The product's size comes from two tensor shapes, each bounded by the file, not their product.
            if (m.out <= 0 || m.in <= 0 || m.out * m.in > (1 << 18)) continue;
            w.assign((size_t)(m.out * m.in), 0.5f);
            bias.assign((size_t)m.out, 0.0f);
            bool has_bias = false;
            try {
                (void)a->apply(m.module + ".weight", {m.out, m.in}, w.data(), &bias, &has_bias);
            } catch (const g4::CompileError&) {
            }
        }
        (void)a->unconsumed();
    } catch (const g4::CompileError&) {
    }
    return 0;
}
