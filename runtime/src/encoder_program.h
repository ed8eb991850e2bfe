// A session's binding of one encoder program of the plan (plan_format.h PlanProgram) on the CPU: its
// activation arena, its ops bound there, and its inputs and outputs addressed for the caller (the media
// front end writes the inputs, runs it with its row counts, reads the output rows).
#pragma once
#include "g4/g4.h"
#include "kernels/cpu/cpu.h"

#include <cstdint>
#include <string>

struct g4_session;

namespace g4::rt {

struct EncoderRun {
    int program    = -1; // index in the plan; -1: not bound
    uint8_t* arena = nullptr;
    ~EncoderRun();
    EncoderRun()                             = default;
    EncoderRun(const EncoderRun&)            = delete;
    EncoderRun& operator=(const EncoderRun&) = delete;
};

// Binds the plan's program `name` (run on the CPU) into `r`, allocating its arena. G4_OK with r->program -1
// when the plan has no such program.
g4_status encoder_bind(g4_session* s, const char* name, EncoderRun* r, std::string* err);
// Input k / output k of the program: row 0 of its tensor in the arena.
void* encoder_input(const g4_session* s, const EncoderRun& r, int k);
const float* encoder_output(const g4_session* s, const EncoderRun& r, int k);
// The per-thread scratch (floats) the program's CPU kernels need.
uint64_t encoder_thread_floats(const g4_session* s, const char* name);
// Runs it with its row counts (kMaxRowCounts of them) on `ctx`.
g4_status encoder_run(g4_session* s, const EncoderRun& r, const cpu::Context& ctx, const int32_t* counts,
                      std::string* err);

} // namespace g4::rt
