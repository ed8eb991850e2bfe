// CUDA execution of a plan: device weights (engine), device arenas and a captured decode graph
// (session). All device memory is allocated at engine open / session creation.
#pragma once
#include "g4/g4.h"

#include <memory>
#include <string>

struct g4_engine;
struct g4_session;

namespace g4::cuda_rt {

struct EngineState;
struct SessionState;
struct DeviceCarve;

struct EngineDeleter {
    void operator()(EngineState* p) const;
};
struct SessionDeleter {
    void operator()(SessionState* p) const;
};
using EnginePtr  = std::unique_ptr<EngineState, EngineDeleter>;
using SessionPtr = std::unique_ptr<SessionState, SessionDeleter>;

// The CUDA state of an engine / session of a CUDA plan (owned by its backend, cuda_backend.cpp).
EngineState* engine_of(const g4_engine* e);
SessionState* session_of(const g4_session* s);

// Opens the CUDA side of a CUDA plan into *out: driver, device, architecture check, memory check, kernel
// module, weight upload. On failure returns a status and a message naming what is missing.
g4_status engine_open(g4_engine* e, EnginePtr* out, std::string* err);
void engine_close(EngineState* st);
uint64_t engine_device_bytes(const EngineState* st);

// Creates the session's CUDA side into *out (s->pool is set; with CPU-placed layers it is replaced by the
// host arenas' pool, and s->act / s->kv / s->ctx are bound to them).
g4_status session_create(g4_session* s, SessionPtr* out, std::string* err);
void session_destroy(SessionState* st);
// Runs one step (rows tokens in s->ids at positions pos0..); copies the last out_rows logits rows
// to the host buffer behind s->logits.
// Decode steps (1 row, 1 logits row) leave the logits on the device and copy only their argmax
// (computed in the decode graph): *logits_on_device is set, and fetch_logits() copies the row when
// the caller needs it (non-greedy sampling, g4_session_get_logits).
// ahead: the caller wants no logits rows besides the last (it may let a greedy decode step run the
// next step ahead: after a g4_session_sample that took the device argmax, the next decode step is
// enqueued, fed on the device, before this returns; run_step claims it when the host feeds that token
// at that position, and any other call waits for it first. Its KV row is the next position's, which
// the step that really runs there rewrites before anything reads it).
g4_status run_step(g4_session* s, int32_t rows, int32_t pos0, int32_t out_rows, bool ahead,
                   bool* logits_on_device, std::string* err);
// g4_session_reset: a new conversation may run ahead again.
void session_reset(g4_session* s);
// Copies the last decode step's logits row to the host buffer behind s->logits.
g4_status fetch_logits(g4_session* s, std::string* err);
// The greedy token of the last decode step (lowest index among equal maxima, as the CPU sampler).
// Marks the session as feeding greedy tokens (run_step may run ahead).
int32_t device_argmax(const g4_session* s);
// The k (1..cuda_ws::kTopkMax) best candidates of the last decode step's logits row, on the GPU:
// logits repetition-penalised for `tokens` (penalty != 1), divided by `temperature` (> 0; 0: not
// divided), sorted by value descending with ties to the lower index (the CPU sampler's order and
// arithmetic). *values / *indices point into the session's pinned buffers, valid until the next call.
// Blocks until the results are on the host. norm (temperature > 0; may be null): also the softmax's
// normalizer over the whole penalised, divided row: its maximum and the sum of exp(v - max).
struct RowNorm {
    float max;
    double sum;
};
g4_status device_topk(g4_session* s, int32_t k, float temperature, float penalty, const int32_t* tokens,
                      int32_t n_tokens, const float** values, const int32_t** indices, RowNorm* norm,
                      std::string* err);

// Encoder program `program` of the plan placed on its GPU (PlanProgram.device >= 0; encoder_launch.cpp): the
// pinned host staging of its input k (output: false) or output k, which encoder_run uploads from / copies
// back to; null when the session has no such program on the GPU.
void* encoder_staging(const g4_session* s, int program, bool output, int k);
// Runs it with its row counts (kMaxRowCounts of them): uploads in_rows[k] rows of each input from its staging
// (null: whole tensors), launches its ops on the plan's GPU, copies out_rows[k] rows of each output back
// (null: whole tensors). Blocks until they are there; a CUDA error names the program, the GPU and the step.
g4_status encoder_run(g4_session* s, int program, const int32_t* counts, const int32_t* in_rows,
                      const int32_t* out_rows, std::string* err);

// Session state (g4_session_save_state and the rest): waits for every lane's stream (a step run ahead
// included), then copies `bytes` of the KV arena at plan offset `offset` (rows of one cache: inside one
// GPU's part or the host part) to `host` (to_host) or from it. Blocks until the copy is done.
g4_status kv_transfer(g4_session* s, uint64_t offset, void* host, size_t bytes, bool to_host,
                      std::string* err);
// The same rows copied from session src's KV arena to dst's (sessions of one plan), device to device.
g4_status kv_copy(g4_session* src, g4_session* dst, uint64_t offset, size_t bytes, std::string* err);
// The session's position or KV cache changed outside a step (state loaded, rewound, forked into): no
// step run ahead or device logits row stays valid. Waits for a step run ahead.
g4_status state_changed(g4_session* s, std::string* err);

// Batched decode steps (batch_launch.cpp, runtime/src/batch.h): whether the engine's plan has them (its
// layers on one GPU), and one step: tokens[j] for session ss[j], j < n, run op by op on ss[0]'s arena and
// stream, the per-sequence ops once per session on its row, cache and position; each session's logits row in
// its last_logits. Waits for the step.
bool batched_steps(const g4_engine* e);
// How g4_sessions_decode groups the engine's sessions (EngineBackend::batch_group_rows / batch_min_rows):
// group, the most sessions one batched step takes (16, or 8 with older plans' modules); min, the fewest it
// runs as one batched step (2 with G4_CUDA_BATCH=1, else the first group size whose batched step is faster
// than the sessions' own decode graphs).
struct BatchRows {
    int32_t group, min;
};
BatchRows batch_rows(const EngineState* es);
// ss: one group of n <= batch_rows().group sessions.
g4_status run_batch(g4_session* const* ss, const int32_t* tokens, int32_t n, std::string* err);
// At session_create, where the engine has batched steps: batch_reserve adds the step records to the
// session's device allocation on the plan's GPU; batch_create, once it
// is placed, allocates the pinned step records.
void batch_reserve(const g4_engine* e, SessionState* st, DeviceCarve& cv);
g4_status batch_create(SessionState* st, std::string* err);
// Frees what the session's batched steps hold (its graph, pinned step records), at session_destroy.
void batch_destroy(SessionState* st);

inline void EngineDeleter::operator()(EngineState* p) const {
    engine_close(p);
}
inline void SessionDeleter::operator()(SessionState* p) const {
    session_destroy(p);
}

} // namespace g4::cuda_rt
