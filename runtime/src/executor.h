// CPU executor: binds the plan's ops to a session's arenas and replays them one step at a time.
#pragma once
#include "runtime/src/engine.h"

#include <cstdint>
#include <map>
#include <vector>

namespace g4::rt {

// Resolves every op's tensors to addresses in `s` (called once, at session creation).
void bind_ops(g4_session* s);
// Binds the ops of program `prog` (an encoder program on the CPU) against `arena`, its activation arena of
// plan.program(prog).arena_bytes.
void bind_program(g4_session* s, size_t prog, uint8_t* arena);
// Runs program `prog` (bound by bind_program) with its row counts (counts[k] <= its max_rows[k]) on the
// kernels of `ctx`, whose per-thread scratch holds the program's thread_floats.
g4_status run_program(g4_session* s, size_t prog, const cpu::Context& ctx, const int32_t* counts,
                      std::string* err);
// Clamp ops an encoder program's bf16 matmul or RMSNorm can apply while it reads its input or writes its
// output (MatmulArgs' and RmsNormArgs' clamps), saving a pass over memory each: per op of `p`,
// kClampIntoNext for a Clamp whose output only the next op reads, as that Matmul's input (no later op and
// not the program's caller); kClampIntoPrev for a Clamp of the previous Matmul's whole output in place (a
// matmul without a bias); kClampIntoNorm for a Clamp whose output the next op, an RmsNorm, takes as its
// input and either overwrites whole or is its last reader. run_program skips those ops where the matmul's
// kernel applies clamps (cpu::gemm_bf16_clamps), and always before a norm (cpu::rms_norm applies them).
inline constexpr uint8_t kClampIntoNext = 1, kClampIntoPrev = 2, kClampIntoNorm = 4;
std::vector<uint8_t> find_clamp_fusion(const plan::Plan& p);
// Runs the text program for `rows` tokens (already in s->ids) at positions pos0.., producing logits for
// the last `out_rows` of them. Checks the cancel flag between ops.
g4_status run_step(g4_session* s, int32_t rows, int32_t pos0, int32_t out_rows, std::string* err);
// Runs ops first..end-1 of such a step (bound by bind_ops): a CPU plan's whole program, or a run of
// CPU-placed ops of a hybrid CUDA plan (called on the CUDA stream's host-function thread). Not
// reentrant for one session.
g4_status run_ops(g4_session* s, size_t first, size_t end, int32_t rows, int32_t pos0, int32_t out_rows,
                  std::string* err);

// Reference execution of a cross-device CUDA plan on the CPU alone, for tests of the cross-device
// rewrite: each GPU's ops run on the CPU kernels against a stand-in of that GPU's memory (gpu_act
// [act_arena_bytes] and a KV part of its kv_end - kv_begin bytes), CPU-placed ops against s->act /
// s->kv (bound by bind_ops), and each copy step copies its columns of the step's rows between the
// two devices' activation arenas, as the CUDA backend does. A value an op reads that no copy step
// brought over is stale or zero, so the logits of a split plan equal those of the same plan on one
// GPU only if its copy steps and KV mirrors are complete. bind_gpu_ops binds GPU `gpu`'s ops once;
// the buffers outlive the session's use. gpu_act: CUDA index -> that GPU's stand-in arena.
void bind_gpu_ops(g4_session* s, int gpu, uint8_t* gpu_act, uint8_t* gpu_kv);
g4_status run_step_split(g4_session* s, const std::map<int, uint8_t*>& gpu_act, int32_t rows, int32_t pos0,
                         int32_t out_rows, std::string* err);

} // namespace g4::rt
