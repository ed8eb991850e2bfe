// The plan's programs on the compiler side: encoder programs (an op graph of their own, run once per
// input) appended after the text program, and the PROGRAMS records written for them
// (runtime/plan/plan_format.h PlanProgram).
#pragma once
#include "models/gemma4/graph.h"
#include "runtime/plan/plan_format.h"

#include <array>
#include <string>
#include <vector>

namespace g4 {

// An encoder program as a model's graph builder emits it: tensor indices local to `graph`.
struct EncoderProgram {
    std::string name;      // "vision", ...
    int device = -1;       // -1 the CPU, else a CUDA device index
    gemma4::Program graph; // its tensors (weights, constants, inputs, activations) and ops
    std::vector<int> inputs, outputs;
    std::array<int32_t, plan::kMaxRowCounts> max_rows{};
    uint64_t thread_floats = 0; // per-thread scratch its CPU kernels need
};

// A program's place in the merged tensor and op lists.
struct ProgramRange {
    std::string name;
    int device      = -1;
    size_t op_begin = 0, op_end = 0, tensor_begin = 0, tensor_end = 0;
    std::vector<int> inputs, outputs; // tensor indices in the merged list
    std::array<int32_t, plan::kMaxRowCounts> max_rows{};
    uint64_t thread_floats = 0, arena_bytes = 0;
};

// Appends e's tensors and ops after prog's (indices shifted); returns where they went.
ProgramRange append_program(gemma4::Program& prog, const EncoderProgram& e);

// The PROGRAMS section's records, names interned by `intern`.
template <class Intern>
std::vector<plan::PlanProgram> program_records(const std::vector<ProgramRange>& ranges, Intern&& intern) {
    std::vector<plan::PlanProgram> out;
    for (const ProgramRange& r : ranges) {
        plan::PlanProgram g{};
        g.name         = intern(r.name);
        g.device       = r.device;
        g.op_begin     = (uint32_t)r.op_begin;
        g.op_end       = (uint32_t)r.op_end;
        g.tensor_begin = (uint32_t)r.tensor_begin;
        g.tensor_end   = (uint32_t)r.tensor_end;
        g.arena_bytes  = r.arena_bytes;
        for (int k = 0; k < 4; ++k)
            g.inputs[k] = k < (int)r.inputs.size() ? r.inputs[k] : -1;
        for (int k = 0; k < 2; ++k)
            g.outputs[k] = k < (int)r.outputs.size() ? r.outputs[k] : -1;
        for (int k = 0; k < plan::kMaxRowCounts; ++k)
            g.max_rows[k] = r.max_rows[k];
        g.thread_floats = r.thread_floats;
        out.push_back(g);
    }
    return out;
}

} // namespace g4
