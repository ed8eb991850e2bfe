// Binding and running an encoder program of the plan on the CPU (see encoder_program.h).
#include "runtime/src/encoder_program.h"

#include "runtime/src/engine.h"
#include "runtime/src/executor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace g4::rt {

EncoderRun::~EncoderRun() {
    std::free(arena);
}

g4_status encoder_bind(g4_session* s, const char* name, EncoderRun* r, std::string* err) {
    const plan::Plan& p = s->engine->plan;
    const int k         = p.find_program(name);
    if (k <= 0) return G4_OK;
    if (p.program(k).device != -1) {
        *err = std::string("the plan's program '") + name +
               "' runs on a GPU; this runtime runs it on the CPU only";
        return G4_ERR_UNSUPPORTED;
    }
    const uint64_t bytes = (std::max<uint64_t>(p.program(k).arena_bytes, 64) + 63) / 64 * 64;
    r->arena             = (uint8_t*)std::aligned_alloc(64, bytes);
    if (!r->arena) {
        *err = "cannot allocate " + std::to_string(bytes) + " bytes for the activations of program '" + name +
               "'";
        return G4_ERR_OUT_OF_MEMORY;
    }
    std::memset(r->arena, 0, bytes);
    bind_program(s, (size_t)k, r->arena);
    r->program = k;
    return G4_OK;
}

void* encoder_input(const g4_session* s, const EncoderRun& r, int k) {
    const plan::Plan& p = s->engine->plan;
    return r.arena + p.tensor(p.program(r.program).inputs[k]).offset;
}

const float* encoder_output(const g4_session* s, const EncoderRun& r, int k) {
    const plan::Plan& p = s->engine->plan;
    return (const float*)(r.arena + p.tensor(p.program(r.program).outputs[k]).offset);
}

uint64_t encoder_thread_floats(const g4_session* s, const char* name) {
    const int k = s->engine->plan.find_program(name);
    return k > 0 ? s->engine->plan.program(k).thread_floats : 0;
}

g4_status encoder_run(g4_session* s, const EncoderRun& r, const cpu::Context& ctx, const int32_t* counts,
                      std::string* err) {
    return run_program(s, (size_t)r.program, ctx, counts, err);
}

} // namespace g4::rt
