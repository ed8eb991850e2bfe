// The CUDA backend behind the backend interface (runtime/src/backend.h): owns the engine's and each
// session's CUDA state and forwards to the CUDA functions of backend.h. Logits of a decode step stay on
// the GPU, where greedy and top-k sampling run; layers the plan places on the CPU run inside the step
// through the CPU executor.
#include "runtime/src/backend.h"
#include "runtime/src/cuda/backend.h"
#include "runtime/src/cuda/workspace.h"
#include "runtime/src/engine.h"
#include "runtime/src/env.h"

namespace g4::cuda_rt {

namespace {

class CudaSession final : public rt::SessionBackend {
public:
    CudaSession(g4_session* s, SessionPtr st) : s_(s), st_(std::move(st)) {}

    g4_status run_step(int32_t rows, int32_t pos0, int32_t out_rows, bool ahead, rt::LogitsAt* at,
                       std::string* err) override {
        bool on_device = false;
        g4_status st   = cuda_rt::run_step(s_, rows, pos0, out_rows, ahead, &on_device, err);
        *at            = on_device ? rt::LogitsAt::Device : rt::LogitsAt::Host;
        return st;
    }
    g4_status fetch_logits(std::string* err) override { return cuda_rt::fetch_logits(s_, err); }
    void reset() override { session_reset(s_); }
    // G4_GPU_SAMPLING=0: top-k and nucleus sampling on the CPU (greedy still takes the device argmax).
    int32_t device_topk_max() const override {
        static const bool off = rt::env::gpu_sampling_off();
        return off ? 0 : cuda_ws::kTopkMax;
    }
    int32_t device_argmax() override { return cuda_rt::device_argmax(s_); }
    g4_status device_topk(int32_t k, float temperature, float penalty, const int32_t* tokens,
                          int32_t n_tokens, const float** values, const int32_t** indices, rt::RowNorm* norm,
                          std::string* err) override {
        RowNorm z{};
        g4_status st = cuda_rt::device_topk(s_, k, temperature, penalty, tokens, n_tokens, values, indices,
                                            norm ? &z : nullptr, err);
        if (norm) *norm = {z.max, z.sum};
        return st;
    }
    g4_status kv_transfer(uint64_t offset, void* host, size_t bytes, bool to_host,
                          std::string* err) override {
        return cuda_rt::kv_transfer(s_, offset, host, bytes, to_host, err);
    }
    g4_status kv_copy(rt::SessionBackend& dst, uint64_t offset, size_t bytes, std::string* err) override {
        return cuda_rt::kv_copy(s_, static_cast<CudaSession&>(dst).s_, offset, bytes, err);
    }
    g4_status state_changed(std::string* err) override { return cuda_rt::state_changed(s_, err); }
    g4_status run_batch(g4_session* const* sessions, const int32_t* tokens, int32_t n,
                        std::string* err) override {
        return cuda_rt::run_batch(sessions, tokens, n, err);
    }

    SessionState* state() const { return st_.get(); }

private:
    g4_session* s_;
    SessionPtr st_;
};

class CudaEngine final : public rt::EngineBackend {
public:
    CudaEngine(EnginePtr st, bool batched)
        : st_(std::move(st)), batched_(batched), rows_(cuda_rt::batch_rows(st_.get())) {}

    // A CUDA session runs nothing on the CPU but its CPU-placed layers, whose pool session_create makes:
    // its own pool is one thread (the towers get their own, runtime/src/frontend/media.cpp).
    g4_status create_session(g4_session* s, int, std::unique_ptr<rt::SessionBackend>* out,
                             std::string* err) override {
        s->pool = std::make_unique<cpu::ThreadPool>(1);
        SessionPtr st;
        g4_status r = session_create(s, &st, err);
        if (r != G4_OK) return r;
        *out = std::make_unique<CudaSession>(s, std::move(st));
        return G4_OK;
    }

    bool batched_steps() const override { return batched_; }
    int32_t batch_group_rows() const override { return rows_.group; }
    int32_t batch_min_rows() const override { return rows_.min; }
    EngineState* state() const { return st_.get(); }

private:
    EnginePtr st_;
    bool batched_;
    cuda_rt::BatchRows rows_;
};

} // namespace

EngineState* engine_of(const g4_engine* e) {
    return static_cast<const CudaEngine*>(e->backend.get())->state();
}

SessionState* session_of(const g4_session* s) {
    return static_cast<const CudaSession*>(s->backend.get())->state();
}

} // namespace g4::cuda_rt

namespace g4::rt {

g4_status open_cuda_backend(g4_engine* e, std::unique_ptr<EngineBackend>* out, std::string* err) {
    cuda_rt::EnginePtr st;
    g4_status r = cuda_rt::engine_open(e, &st, err);
    if (r != G4_OK) return r;
    *out = std::make_unique<cuda_rt::CudaEngine>(std::move(st), cuda_rt::batched_steps(e));
    return G4_OK;
}

} // namespace g4::rt
