// A session's binding of one encoder program of the plan (plan_format.h PlanProgram) on the device the plan
// places it on: on the CPU its activation arena and its ops bound there; on the plan's GPU the CUDA backend's
// buffers (runtime/src/cuda/encoder_launch.cpp) with host staging for its inputs and outputs. Either way the
// caller (the media front end) writes the inputs in host memory, runs it with its row counts and reads the
// output rows in host memory.
#pragma once
#include "g4/g4.h"
#include "kernels/cpu/cpu.h"

#include <cstdint>
#include <string>

struct g4_session;

namespace g4::plan {
class Plan;
}

namespace g4::rt {

struct EncoderRun {
    int program    = -1;      // index in the plan; -1: not bound
    uint8_t* arena = nullptr; // the CPU's activation arena (null on a GPU)
    bool gpu       = false;   // placed on the plan's GPU
    ~EncoderRun();
    EncoderRun()                             = default;
    EncoderRun(const EncoderRun&)            = delete;
    EncoderRun& operator=(const EncoderRun&) = delete;
};

// Binds the plan's program `name` into `r`: on the CPU allocating its arena, on the GPU taking the buffers
// the session's CUDA backend allocated at creation. G4_OK with r->program -1 when the plan has no such
// program.
g4_status encoder_bind(g4_session* s, const char* name, EncoderRun* r, std::string* err);

// Device bytes after an encoder program's arena on a GPU for its launch records (a Step per row count); the
// compiler's memory plan counts them with the arena.
inline constexpr uint64_t kEncoderStepBytes = 64;

// The bytes of the activations of program k (> 0) of the plan (encoder_bind allocates them on the CPU, the
// CUDA backend on the GPU); 0 for k <= 0.
uint64_t encoder_arena_bytes(const plan::Plan& p, int k);
// Input k / output k of the program in host memory: row 0 of its tensor in the arena, or its staging.
void* encoder_input(const g4_session* s, const EncoderRun& r, int k);
const float* encoder_output(const g4_session* s, const EncoderRun& r, int k);
// The per-thread scratch (floats) the program's CPU kernels need (0 for a program on a GPU).
uint64_t encoder_thread_floats(const g4_session* s, const char* name);
// Runs it with its row counts (kMaxRowCounts of them): on the CPU on `ctx`; on the GPU with in_rows[k] rows
// of input k uploaded and out_rows[k] rows of output k copied back (null: whole tensors).
g4_status encoder_run(g4_session* s, const EncoderRun& r, const cpu::Context& ctx, const int32_t* counts,
                      const int32_t* in_rows, const int32_t* out_rows, std::string* err);

} // namespace g4::rt
