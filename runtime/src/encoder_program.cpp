// Binding and running an encoder program of the plan on its device (see encoder_program.h).
#include "runtime/src/encoder_program.h"

#include "runtime/src/cuda/backend.h"
#include "runtime/src/engine.h"
#include "runtime/src/executor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace g4::rt {

EncoderRun::~EncoderRun() {
    std::free(arena);
}

uint64_t encoder_arena_bytes(const plan::Plan& p, int k) {
    if (k <= 0) return 0;
    return (std::max<uint64_t>(p.program(k).arena_bytes, 64) + 63) / 64 * 64;
}

g4_status encoder_bind(g4_session* s, const char* name, EncoderRun* r, std::string* err) {
    const plan::Plan& p = s->engine->plan;
    const int k         = p.find_program(name);
    if (k <= 0) return G4_OK;
    if (p.program(k).device != -1) {
        if (p.device() != "cuda" || !cuda_rt::encoder_staging(s, k, false, 0)) {
            *err = std::string("the plan's program '") + name +
                   "' is placed on a GPU the session has not set up";
            return G4_ERR_INTERNAL;
        }
        r->program = k;
        r->gpu     = true;
        return G4_OK;
    }
    const uint64_t bytes = encoder_arena_bytes(p, k);
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
    if (r.gpu) return cuda_rt::encoder_staging(s, r.program, false, k);
    const plan::Plan& p = s->engine->plan;
    return r.arena + p.tensor(p.program(r.program).inputs[k]).offset;
}

const float* encoder_output(const g4_session* s, const EncoderRun& r, int k) {
    if (r.gpu) return (const float*)cuda_rt::encoder_staging(s, r.program, true, k);
    const plan::Plan& p = s->engine->plan;
    return (const float*)(r.arena + p.tensor(p.program(r.program).outputs[k]).offset);
}

uint64_t encoder_thread_floats(const g4_session* s, const char* name) {
    const int k = s->engine->plan.find_program(name);
    return k > 0 && s->engine->plan.program(k).device < 0 ? s->engine->plan.program(k).thread_floats : 0;
}

g4_status encoder_run(g4_session* s, const EncoderRun& r, const cpu::Context& ctx, const int32_t* counts,
                      const int32_t* in_rows, const int32_t* out_rows, std::string* err) {
    if (r.gpu) {
        const plan::PlanProgram& g = s->engine->plan.program(r.program);
        for (int k = 0; k < plan::kMaxRowCounts; ++k)
            if (counts[k] < 0 || counts[k] > g.max_rows[k]) {
                *err = std::string("program '") + s->engine->plan.str(g.name) + "': row count " +
                       std::to_string(k) + " is " + std::to_string(counts[k]) + ", at most " +
                       std::to_string(g.max_rows[k]);
                return G4_ERR_INVALID_ARGUMENT;
            }
        return cuda_rt::encoder_run(s, r.program, counts, in_rows, out_rows, err);
    }
    return run_program(s, (size_t)r.program, ctx, counts, err);
}

} // namespace g4::rt
