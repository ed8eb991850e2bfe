// Encoder programs appended to the text program (see programs.h).
#include "compiler/programs.h"

namespace g4 {

ProgramRange append_program(gemma4::Program& prog, const EncoderProgram& e) {
    ProgramRange r;
    r.name         = e.name;
    r.device       = e.device;
    r.tensor_begin = prog.tensors.size();
    r.op_begin     = prog.ops.size();
    const int base = (int)r.tensor_begin;
    for (const auto& t : e.graph.tensors)
        prog.tensors.push_back(t);
    for (gemma4::OpDesc o : e.graph.ops) {
        for (int32_t& t : o.op.in)
            if (t >= 0) t += base;
        for (int32_t& t : o.op.out)
            if (t >= 0) t += base;
        prog.ops.push_back(std::move(o));
    }
    r.tensor_end = prog.tensors.size();
    r.op_end     = prog.ops.size();
    for (int t : e.inputs)
        r.inputs.push_back(t + base);
    for (int t : e.outputs)
        r.outputs.push_back(t + base);
    r.max_rows      = e.max_rows;
    r.thread_floats = e.thread_floats;
    return r;
}

} // namespace g4
