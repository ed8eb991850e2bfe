// The backend interface: what the C API, session state and media code ask of the device a plan runs on.
// A backend opens a plan's device side with the engine (EngineBackend) and gives each session its arenas,
// its step runner, its logits, its KV cache and, where the device has it, sampling on the device
// (SessionBackend). The runtime above it holds no device state and does not branch on the device.
//
// Implementations: runtime/src/cpu_backend.cpp (the CPU executor, runtime/src/executor.cpp) and
// runtime/src/cuda/cuda_backend.cpp (the CUDA backend, runtime/src/cuda/backend.h; a plan whose layers are
// split between GPUs and the CPU is one CUDA backend, which runs the CPU-placed ops through the executor).
// open_backend picks one by the plan's device. Adding a backend: CONTRIBUTING.md.
//
// Ownership: g4_engine owns its EngineBackend; g4_session owns its SessionBackend, which owns every buffer
// of the session on its device (and the host arenas it binds into the session) and is destroyed before the
// session's thread pool. Memory: an EngineBackend allocates at open, a SessionBackend at create_session;
// nothing here allocates afterwards.
// Threads: an EngineBackend is immutable after open; create_session may run on several threads at once
// (sessions of one engine created concurrently). A SessionBackend is called by one thread at a time, the
// thread calling its session (g4_session_cancel only sets the session's flag, which run_step reads between
// ops). Errors are status codes with a one-line message in *err; nothing throws out of a backend.
#pragma once
#include "g4/g4.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

struct g4_engine;
struct g4_session;

namespace g4::rt {

class SessionBackend;

class EngineBackend {
public:
    virtual ~EngineBackend() = default;
    // Gives the session `s` (its engine is this backend's) its device side: the session's thread pool and
    // scratch (s->pool, s->ctx), the host view of its ids and logits (s->ids [max_rows],
    // s->logits [logits_rows, vocab]), its arenas and KV cache, the program bound to them. n_threads: the
    // CPU threads asked for (0: all hardware threads; a backend that runs nothing on the CPU may use fewer).
    virtual g4_status create_session(g4_session* s, int n_threads, std::unique_ptr<SessionBackend>* out,
                                     std::string* err) = 0;
    // True when its sessions run batched decode steps (SessionBackend::run_batch).
    virtual bool batched_steps() const { return false; }
    // g4_sessions_decode takes a call's sessions in groups of batch_group_rows() (the last one smaller) and
    // runs a group of fewer than batch_min_rows() sessions as each session's own decode step (where the
    // backend's batched step of so few rows is slower than that), every other group as one batched step.
    virtual int32_t batch_group_rows() const { return INT32_MAX; }
    virtual int32_t batch_min_rows() const { return 2; }
};

// Where the logits of a step are after run_step.
enum class LogitsAt {
    Host,   // s->logits holds the step's out_rows rows
    Device, // a decode step's row stayed on the device: fetch_logits copies it to s->logits[0..vocab)
};

// The softmax normalizer of a logits row (device_topk): its maximum and the sum of exp(v - max).
struct RowNorm {
    float max;
    double sum;
};

class SessionBackend {
public:
    virtual ~SessionBackend() = default;

    // Runs the plan's program for `rows` tokens (their ids in s->ids, media rows prepared by
    // media_prepare_step) at positions pos0.., producing the logits of the last out_rows of them.
    // ahead: the caller wants no logits rows but the last and may sample it greedily; a backend may then
    // start the next decode step before the host asks for it (it must give the same results as running it
    // when asked). Returns G4_ERR_CANCELLED when the session's cancel flag was seen between ops.
    virtual g4_status run_step(int32_t rows, int32_t pos0, int32_t out_rows, bool ahead, LogitsAt* at,
                               std::string* err) = 0;
    // After a step that left its row on the device (LogitsAt::Device): copies it to s->logits[0..vocab).
    virtual g4_status fetch_logits(std::string* err) = 0;
    // g4_session_reset: the conversation starts over (position 0, no logits).
    virtual void reset() = 0;

    // Sampling on the device, for a step that left its logits there (a backend whose steps never do, as the
    // CPU's, is never asked). device_topk_max: the largest k device_topk takes (0: none; the runtime fetches
    // the row and samples on the CPU).
    virtual int32_t device_topk_max() const = 0;
    // The greedy token of the last step (the lowest index among equal maxima, as the CPU sampler); tells the
    // backend the host is feeding greedy tokens (it may run the next step ahead).
    virtual int32_t device_argmax() = 0;
    // The k best of the last step's row: repetition-penalised for tokens[0..n_tokens) (penalty != 1),
    // divided by temperature (> 0; 0: not divided), sorted by value descending with ties to the lower index,
    // as the CPU sampler. *values / *indices stay valid until the next call. norm (temperature > 0; may be
    // null): also the softmax normalizer of the whole penalised, divided row.
    virtual g4_status device_topk(int32_t k, float temperature, float penalty, const int32_t* tokens,
                                  int32_t n_tokens, const float** values, const int32_t** indices,
                                  RowNorm* norm, std::string* err) = 0;

    // Session state hooks (runtime/src/session_state.cpp). kv_transfer copies `bytes` of the KV arena at
    // plan offset `offset` (rows of one cache) to `host` (to_host) or from it, after any work in flight;
    // kv_copy copies them into another session of the same plan (same backend), device to device.
    virtual g4_status kv_transfer(uint64_t offset, void* host, size_t bytes, bool to_host,
                                  std::string* err)                                                 = 0;
    virtual g4_status kv_copy(SessionBackend& dst, uint64_t offset, size_t bytes, std::string* err) = 0;
    // The position or KV cache changed outside a step (state loaded, rewound, forked into): nothing
    // computed ahead or left on the device stays valid.
    virtual g4_status state_changed(std::string* err) = 0;

    // A batched decode step (runtime/src/batch.h): tokens[j] for session sessions[j], j < n (distinct
    // sessions of this backend's engine, this session being sessions[0]; n <= batch_limit; no media rows),
    // each at its own position. Leaves each session's logits row in its last_logits, or on the device with
    // the session's logits_on_device set (then read as after its own decode step: fetch_logits,
    // device_argmax, device_topk); positions and histories are the caller's to advance. Called only where the
    // engine's backend has batched_steps().
    virtual g4_status run_batch(g4_session* const* sessions, const int32_t* tokens, int32_t n,
                                std::string* err) {
        (void)sessions, (void)tokens, (void)n;
        *err = "this backend has no batched decode steps";
        return G4_ERR_UNSUPPORTED;
    }
};

// Opens the backend of the engine's plan (e->plan loaded and validated) by its device. A plan for a
// device this runtime has no backend for is G4_ERR_UNSUPPORTED.
g4_status open_backend(g4_engine* e, std::unique_ptr<EngineBackend>* out, std::string* err);

// The backends open_backend chooses between (cpu_backend.cpp, cuda/cuda_backend.cpp).
g4_status open_cpu_backend(g4_engine* e, std::unique_ptr<EngineBackend>* out, std::string* err);
g4_status open_cuda_backend(g4_engine* e, std::unique_ptr<EngineBackend>* out, std::string* err);

} // namespace g4::rt
