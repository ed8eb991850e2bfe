// LM-head screening for the CPU backend (cpu_backend.cpp): an int8 copy of the bf16 head, built at engine
// open where the plan asks for it (META placement.lm_head_screen, the copy counted in the plan's CPU
// memory), and the greedy token of a step whose head was left out, from that copy and the exact rows that
// can hold it (kernels/cpu/lm_screen.cpp has the bound). The token is the full head's argmax (the lowest
// index among equal maxima, as the sampler's greedy choice).
#pragma once
#include "kernels/cpu/cpu.h"
#include "runtime/src/engine.h"

#include <cstdint>
#include <memory>
#include <string>

namespace g4::rt {

struct CpuLmScreen {
    size_t head_op = 0; // the Matmul writing the logits; every op after it is a Softcap of them, in place
    float softcap  = 0; // 0: none
    int64_t n = 0, k = 0;
    std::unique_ptr<uint8_t, void (*)(void*)> buf{nullptr, nullptr};
    cpu::LmScreenCopy copy{};
    uint64_t bytes = 0;
};

// The plan's screening copy, built on `threads` threads (0: cpu::default_thread_count()); null where the
// plan does not ask for it (or asks for it on a head the CPU cannot screen: a bf16 head matmul of the
// `fast` precision followed only by its softcap), or G4_LM_SCREEN=0. *err set: it could not be allocated.
std::unique_ptr<CpuLmScreen> open_cpu_lm_screen(const g4_engine* e, int threads, std::string* err);

// One screened head: x [k] (the head's input row), w [n, k] bf16, bias [n] or null (the LoRA bias added
// after the product), the softcap (0: none), y [n] the logits row it may overwrite.
struct LmScreenStep {
    const float* x;
    const void* w;
    const float* bias;
    int64_t n, k;
    float softcap;
    float* y;
};
// The greedy token of the full head (softcap(x . w^T + bias), the lowest index among equal maxima) from the
// copy q of w and the exact rows that can hold it, or -1 where x does not allow screening. y then holds the
// exact pre-softcap products at the rows computed (*computed of them) and -infinity elsewhere.
int32_t lm_screen_argmax(const cpu::Context& c, const cpu::LmScreenCopy& q, const LmScreenStep& a,
                         int64_t* computed);

// After a step that ran ops [0, head_op) for `rows` rows with one row of logits: the greedy token, or -1
// where x does not allow screening (the caller computes the full head). Leaves the logits row of the
// session holding exact pre-softcap logits at the rows it computed and -infinity elsewhere: not logits;
// the caller recomputes the head before anyone reads them. *computed: the rows computed exactly.
int32_t cpu_lm_screen_argmax(g4_session* s, const CpuLmScreen& l, int64_t* computed);

} // namespace g4::rt
