// Compiler-only graph builder for the Gemma 4 text decoder: emits the op program the runtime
// replays, naming every intermediate (llama.cpp style). Weights are referenced by their Hugging Face
// names relative to the text-model prefix; the compiler resolves, converts and places them.
#pragma once
#include "kernels/ops.h"
#include "models/gemma4/model.h"
#include "runtime/plan/op_params.h"
#include "runtime/plan/plan_format.h"

#include <set>
#include <string>
#include <vector>

namespace g4::gemma4 {

// What a weight is, so the compiler's dtype/quantization policy can decide per tensor (recorded in the plan).
using WeightRole = plan::WeightRole;
const char* weight_role_name(WeightRole r);

struct TensorDesc {
    std::string name; // plan name; for checkpoint weights the HF name (relative)
    plan::TensorKind kind;
    DType dtype =
        DType::F32; // activations f32; KV caches BuildOptions::kv_dtype; weights decided by the compiler
    std::vector<int64_t> dims;
    WeightRole role = WeightRole::Constant;
    std::vector<float> constant; // data of Constant weights
    std::string bias_of;         // LoraBias: the weight whose matmul it follows
};

struct OpDesc {
    plan::PlanOp op; // name field unused here; `name` below
    std::string name;
};

struct BuildOptions {
    int max_rows    = 256;         // tokens per step (prefill chunk)
    int max_context = 4096;        // positions held by full-attention caches
    int logits_rows = 16;          // rows of logits one step can produce
    DType kv_dtype  = DType::F32;  // KV cache storage: F32 or BF16
    std::set<std::string> biased;  // weights (relative HF names) whose matmul gets a LoRA bias
    bool separate_lm_head = false; // LM head as its own tensor "lm_head.weight" (untied from the input
                                   // embedding, e.g. when an adapter replaces embed_tokens)
};

struct Program {
    std::vector<TensorDesc> tensors;
    std::vector<OpDesc> ops;
    int ids           = -1; // Input tensor [max_rows] i32
    int logits        = -1; // Activation [logits_rows, V]
    int sliding_slots = 0;  // ring size of sliding-layer caches
};

// Builds the full prefill/decode program. hp must pass validate().
Program build_text_program(const TextHParams& hp, const BuildOptions& opt);

} // namespace g4::gemma4
