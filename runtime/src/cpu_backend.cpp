// The CPU backend (backend.h): a session's arenas in host memory, its program bound to them and replayed by
// the CPU executor (executor.cpp) on the session's thread pool. Logits are on the host, but for steps ahead
// of a greedy token on an engine with the LM head's screening copy (cpu_lm_screen.h): those run the head only
// when the logits are asked for. Sampling is the runtime's (sampler.cpp).
#include "runtime/src/backend.h"
#include "runtime/src/batch.h"
#include "runtime/src/cpu_lm_screen.h"
#include "runtime/src/engine.h"
#include "runtime/src/env.h"
#include "runtime/src/executor.h"

#include <cstdlib>
#include <cstring>

namespace g4::rt {

namespace {

void* aligned_zalloc(size_t n) {
    size_t sz = (n + 63) / 64 * 64;
    void* p   = std::aligned_alloc(64, sz ? sz : 64);
    if (p) std::memset(p, 0, sz ? sz : 64);
    return p;
}

class CpuSession final : public SessionBackend {
public:
    CpuSession(g4_session* s, const CpuLmScreen* screen) : s_(s), screen_(screen) {}
    ~CpuSession() override {
        if (s_->profile) s_->profile->print();
        std::free(s_->scratch);
        std::free(s_->act);
        std::free(s_->kv);
        s_->scratch = nullptr, s_->act = s_->kv = nullptr;
    }

    // A step whose caller may take its token greedily (ahead: it wants no logits rows but the last one; and
    // the session's last token was greedy, s->greedy_hint) stops before the LM head where the engine has the
    // screening copy; its logits are then "on the device": device_argmax screens them, fetch_logits runs the
    // head's ops as the whole step would have (the same bits).
    g4_status run_step(int32_t rows, int32_t pos0, int32_t out_rows, bool ahead, LogitsAt* at,
                       std::string* err) override {
        head_pending_ = false, token_ = -1;
        if (screen_ && ahead && out_rows == 1 && s_->greedy_hint) {
            g4_status st = run_ops(s_, 0, screen_->head_op, rows, pos0, out_rows, err);
            if (st != G4_OK) return st;
            *at           = LogitsAt::Device;
            head_pending_ = true, rows_ = rows, pos0_ = pos0;
            return G4_OK;
        }
        *at = LogitsAt::Host;
        return rt::run_step(s_, rows, pos0, out_rows, err);
    }
    g4_status fetch_logits(std::string* err) override {
        if (!head_pending_) return G4_OK;
        g4_status st = run_ops(s_, screen_->head_op, s_->engine->plan.n_ops(), rows_, pos0_, 1, err);
        if (st == G4_OK) head_pending_ = false;
        return st;
    }
    void reset() override { head_pending_ = false, token_ = -1; }
    int32_t device_topk_max() const override { return 0; }
    int32_t device_argmax() override {
        if (token_ >= 0 || !head_pending_) return token_;
        int64_t computed = 0;
        token_           = cpu_lm_screen_argmax(s_, *screen_, &computed);
        if (token_ >= 0) {
            s_->stats.lm_screened++;
            return token_;
        }
        std::string err; // not screened: the whole head, and the sampler's greedy choice on it
        if (fetch_logits(&err) != G4_OK) return -1;
        const float* l = s_->logits;
        int32_t best   = 0;
        for (int32_t i = 1; i < (int32_t)screen_->n; ++i)
            if (l[i] > l[best]) best = i;
        return token_ = best;
    }
    g4_status device_topk(int32_t, float, float, const int32_t*, int32_t, const float**, const int32_t**,
                          RowNorm*, std::string* err) override {
        *err = "internal: the CPU backend does not sample on a device";
        return G4_ERR_INTERNAL;
    }
    g4_status kv_transfer(uint64_t offset, void* host, size_t bytes, bool to_host, std::string*) override {
        uint8_t* kv = s_->kv + (offset - s_->kv_offset0);
        to_host ? std::memcpy(host, kv, bytes) : std::memcpy(kv, host, bytes);
        return G4_OK;
    }
    g4_status kv_copy(SessionBackend& dst, uint64_t offset, size_t bytes, std::string*) override {
        g4_session* d = static_cast<CpuSession&>(dst).s_;
        std::memcpy(d->kv + (offset - d->kv_offset0), s_->kv + (offset - s_->kv_offset0), bytes);
        return G4_OK;
    }
    g4_status state_changed(std::string*) override {
        reset();
        return G4_OK;
    }
    g4_status run_batch(g4_session* const* sessions, const int32_t* tokens, int32_t n,
                        std::string* err) override {
        return run_batch_cpu(sessions, tokens, n, err);
    }

private:
    g4_session* s_;
    const CpuLmScreen* screen_; // the engine's, or null
    bool head_pending_ = false; // the last step stopped before the LM head
    int32_t rows_ = 0, pos0_ = 0, token_ = -1;
};

class CpuEngine final : public EngineBackend {
public:
    explicit CpuEngine(std::unique_ptr<CpuLmScreen> screen) : screen_(std::move(screen)) {}
    bool batched_steps() const override { return true; }
    g4_status create_session(g4_session* s, int n_threads, std::unique_ptr<SessionBackend>* out,
                             std::string* err) override {
        const plan::Plan& p = s->engine->plan;
        const auto& in      = p.info();
        const int threads   = n_threads > 0 ? n_threads : cpu::default_thread_count();
        s->pool             = std::make_unique<cpu::ThreadPool>(threads);
        auto be = std::make_unique<CpuSession>(s, screen_.get()); // frees the arenas below on failure
        const size_t stride = cpu::scratch_floats_per_thread(in.max_k, in.max_slots);
        s->scratch          = (float*)aligned_zalloc(stride * threads * sizeof(float));
        s->act              = (uint8_t*)aligned_zalloc(in.act_arena_bytes);
        s->kv               = (uint8_t*)aligned_zalloc(in.kv_arena_bytes);
        if (!s->scratch || !s->act || !s->kv) {
            *err = "cannot allocate " + std::to_string(s->engine->session_bytes) + " bytes for the session";
            return G4_ERR_OUT_OF_MEMORY;
        }
        s->ctx = {s->pool.get(), s->scratch, stride};
        if (env::cpu_profile()) s->profile = std::make_unique<TextProfile>();
        bind_ops(s);
        s->ids    = (int32_t*)(s->act + p.tensor(in.ids_tensor).offset);
        s->logits = (const float*)(s->act + p.tensor(in.logits_tensor).offset);
        *out      = std::move(be);
        return G4_OK;
    }

private:
    std::unique_ptr<CpuLmScreen> screen_;
};

} // namespace

g4_status open_cpu_backend(g4_engine* e, std::unique_ptr<EngineBackend>* out, std::string* err) {
    // A step gathers one row of each random-access weight (an embedding table read per token): read-ahead
    // around those faults would make megabytes of the table resident for each token seen.
    for (size_t t = 0; t < e->plan.n_tensors(); ++t)
        if (e->plan.tensor(t).kind == (uint8_t)plan::TensorKind::Weight &&
            e->plan.tensor(t).flags == (uint8_t)plan::WeightRole::PleTable)
            e->plan.advise_random(t);
    std::string serr;
    std::unique_ptr<CpuLmScreen> screen = open_cpu_lm_screen(e, 0, &serr);
    if (!serr.empty()) {
        *err = serr;
        return G4_ERR_OUT_OF_MEMORY;
    }
    *out = std::make_unique<CpuEngine>(std::move(screen));
    return G4_OK;
}

g4_status open_backend(g4_engine* e, std::unique_ptr<EngineBackend>* out, std::string* err) {
    const std::string& dev = e->plan.device();
    if (dev == "cpu") return open_cpu_backend(e, out, err);
    if (dev == "cuda") return open_cuda_backend(e, out, err);
    *err = "plan for unknown device '" + dev + "' (this runtime runs cpu and cuda plans)";
    return G4_ERR_UNSUPPORTED;
}

} // namespace g4::rt
