// Cross-device rewrite of a text program for a CUDA plan whose layers are split between the GPU and
// the CPU (--place layers=0-29:gpu,30-34:cpu): the explicit copy steps and the KV-cache mirrors that
// let each op read only memory of its own device.
#pragma once
#include "models/gemma4/graph.h"

#include <vector>

namespace g4::cross_device {

// Where op i runs: on the CPU when its layer is CPU-placed (layer_cpu[layer]); everything without a
// layer (embeddings, PLE projection, final norm, LM head) runs on the GPU.
bool op_on_cpu(const plan::PlanOp& op, const std::vector<char>& layer_cpu);

struct Stats {
    int copies_to_host = 0, copies_to_device = 0;   // copy steps inserted
    int mirrors = 0;                                // caches mirrored onto the other device
};

// Rewrites `p` in place:
//  - KV sharing across devices: an attention op that reads a cache written (KvStore) on the other
//    device reads a mirror of it on its own device instead; the mirror is written by a second KvStore
//    of the donor's k and v rows, placed just before the first attention that reads it.
//  - Copy steps: before an op reads columns of an activation that its device does not hold (written
//    on the other device since), one Copy op (OpCode::Copy, ip0 = columns, ip1 = 1 to the GPU, 0 to
//    the host) moves exactly those columns of the step's rows.
// Throws g4::CompileError if an op would read a value neither device holds (a malformed program).
Stats split(gemma4::Program& p, const std::vector<char>& layer_cpu);

} // namespace g4::cross_device
