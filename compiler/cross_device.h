// Cross-device rewrite of a text program for a CUDA plan whose layers are split between devices: the
// plan's GPU, other GPUs and the CPU (--place layers=0-17:gpu0,18-29:gpu1,30-34:cpu): the explicit
// copy steps and the KV-cache mirrors that let each op read only memory of its own device.
#pragma once
#include "models/gemma4/graph.h"

#include <vector>

namespace g4::cross_device {

inline constexpr int kHost = -1; // device code of the CPU / host memory; GPUs are their CUDA index

// Where an op runs: layer_device[layer] (kHost or a CUDA index); everything without a layer
// (embeddings, PLE projection, final norm, LM head) runs on the plan's GPU, `primary`.
int op_device(const plan::PlanOp& op, const std::vector<int>& layer_device, int primary);

struct Stats {
    int copies_to_host = 0, copies_to_device = 0, copies_peer = 0; // copy steps inserted (peer: GPU to GPU)
    int mirrors = 0;                                               // caches mirrored onto another device
};

// Rewrites `p` in place:
//  - KV sharing across devices: an attention op that reads a cache written (KvStore) on another
//    device reads a mirror of it on its own device instead; the mirror is written by a second KvStore
//    of the donor's k and v rows, placed just before the first attention that reads it.
//  - Copy steps: before an op reads columns of an activation that its device does not hold (written
//    on another device since), one Copy op (OpCode::Copy, ip0 = columns, ip1 = destination device,
//    ip2 = source device, kHost for host memory) moves exactly those columns of the step's rows.
// Throws g4::CompileError if an op would read a value no device holds (a malformed program).
Stats split(gemma4::Program& p, const std::vector<int>& layer_device, int primary);

} // namespace g4::cross_device
