// The C API (runtime/include/g4/g4.h) over the plan reader and the plan's backend (backend.h). Every entry
// point catches everything: no exception crosses the boundary.
#include "g4/g4.h"
#include "runtime/src/api_util.h"
#include "runtime/src/chat_template.h"
#include "runtime/src/encoder_program.h"
#include "runtime/src/engine.h"
#include "runtime/src/executor.h"
#include "runtime/src/generate.h"
#include "runtime/src/media/media_decode.h"
#include "runtime/src/media/video_decode.h"
#include "runtime/src/sampler.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <unordered_set>

using g4_clock = std::chrono::steady_clock;

namespace {

thread_local std::string t_last_error;

g4_status set_error(g4_status st, const std::string& msg) {
    t_last_error = msg;
    return st;
}

// Live handles, so a destroyed or foreign pointer is reported instead of dereferenced.
std::mutex g_handles_mu;
std::unordered_set<const void*> g_handles;
void handle_add(const void* h) {
    std::lock_guard<std::mutex> lk(g_handles_mu);
    g_handles.insert(h);
}
void handle_remove(const void* h) {
    std::lock_guard<std::mutex> lk(g_handles_mu);
    g_handles.erase(h);
}
bool handle_live(const void* h) {
    std::lock_guard<std::mutex> lk(g_handles_mu);
    return h && g_handles.count(h) > 0;
}
bool engine_ok(const g4_engine* e) {
    return handle_live(e) && e->magic == 0x67346531;
}
bool session_ok(const g4_session* s) {
    return handle_live(s) && s->magic == 0x67347331;
}

#define G4_GUARD_BEGIN try {
#define G4_GUARD_END                                                                                         \
    }                                                                                                        \
    catch (const std::bad_alloc&) {                                                                          \
        return set_error(G4_ERR_OUT_OF_MEMORY, "out of memory");                                             \
    }                                                                                                        \
    catch (const std::exception& ex) {                                                                       \
        return set_error(G4_ERR_INTERNAL, std::string("internal error: ") + ex.what());                      \
    }                                                                                                        \
    catch (...) {                                                                                            \
        return set_error(G4_ERR_INTERNAL, "internal error");                                                 \
    }

} // namespace

g4_status g4::rt::api_error(g4_status st, const std::string& msg) {
    return set_error(st, msg);
}
bool g4::rt::api_engine_ok(const g4_engine* e) {
    return engine_ok(e);
}
bool g4::rt::api_session_ok(const g4_session* s) {
    return session_ok(s);
}

// One tower call f(&n, &err): its time and soft tokens go to the session's stats.
template <class F> static g4_status media_call(double* ms, int64_t* tokens, int32_t* out_n_tokens, F&& f) {
    std::string err;
    int32_t n    = 0;
    auto t0      = g4_clock::now();
    g4_status st = f(&n, &err);
    if (st != G4_OK) return set_error(st, err);
    *ms += std::chrono::duration<double, std::milli>(g4_clock::now() - t0).count();
    *tokens += n;
    if (out_n_tokens) *out_n_tokens = n;
    return G4_OK;
}

extern "C" {

const char* g4_runtime_version(void) {
    return G4_VERSION_STRING;
}

uint32_t g4_api_version(void) {
    return G4_API_VERSION;
}

const char* g4_status_string(g4_status s) {
    switch (s) {
    case G4_OK:
        return "ok";
    case G4_ERR_INVALID_ARGUMENT:
        return "invalid argument";
    case G4_ERR_IO:
        return "i/o error";
    case G4_ERR_PLAN_VERSION:
        return "incompatible plan version";
    case G4_ERR_PLAN_CORRUPT:
        return "corrupt plan";
    case G4_ERR_OUT_OF_MEMORY:
        return "out of memory";
    case G4_ERR_CONTEXT_FULL:
        return "context full";
    case G4_ERR_CANCELLED:
        return "cancelled";
    case G4_ERR_UNSUPPORTED:
        return "unsupported";
    case G4_ERR_INTERNAL:
        return "internal error";
    case G4_ERR_BUFFER_TOO_SMALL:
        return "buffer too small";
    case G4_ERR_NO_TOKENIZER:
        return "no tokenizer in plan";
    case G4_ERR_BAD_STATE:
        return "bad session state";
    }
    return "unknown status";
}

const char* g4_last_error_message(void) {
    return t_last_error.c_str();
}

g4_engine_params g4_engine_params_default(void) {
    g4_engine_params p;
    p.verify_weights = 0;
    return p;
}

g4_status g4_engine_open(const char* path, const g4_engine_params* params, g4_engine** out_engine) {
    G4_GUARD_BEGIN
    if (!path || !out_engine)
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_engine_open: path and out_engine must not be NULL");
    *out_engine          = nullptr;
    auto t_open          = g4_clock::now();
    g4_engine_params prm = params ? *params : g4_engine_params_default();
    auto* e              = new g4_engine();
    std::string err;
    g4_status st = e->plan.load(path, prm.verify_weights != 0, &err); // validates every record
    if (st != G4_OK) {
        delete e;
        return set_error(st, err);
    }
    const std::string& cpu_precision = e->plan.meta().policy.cpu_precision;
    e->cpu_int16                     = cpu_precision == "fast" || cpu_precision == "bf16";
    e->cpu_bf16_rows                 = cpu_precision == "bf16";
    e->clamp_fusion                  = g4::rt::find_clamp_fusion(e->plan);
    st                               = g4::rt::open_backend(e, &e->backend, &err);
    if (st != G4_OK) {
        delete e;
        return set_error(st, std::string(path) + ": " + err);
    }
    if (!e->plan.tokenizer_json().empty()) {
        e->tokenizer = std::make_unique<g4::Tokenizer>();
        std::string terr;
        if (!g4::Tokenizer::load_from_json(e->plan.tokenizer_json(), e->tokenizer.get(), &terr)) {
            delete e;
            return set_error(G4_ERR_PLAN_CORRUPT,
                             std::string(path) + ": embedded tokenizer: " + terr + "; re-run g4 compile");
        }
    }
    const auto& in   = e->plan.info();
    int threads      = g4::cpu::default_thread_count();
    e->session_bytes = in.act_arena_bytes + in.kv_arena_bytes +
                       (uint64_t)threads * g4::cpu::scratch_floats_per_thread(in.max_k, in.max_slots) * 4 +
                       (uint64_t)in.vocab_size * 12 + (uint64_t)in.max_context * 4;
    if (!in.vision_config.empty() || !in.audio_config.empty())
        e->session_bytes +=
            in.tower_session_bytes +
            g4::rt::media_block({.thread_floats = in.tower_thread_floats, .threads = threads}).total();
    if (!in.vision_gpu) // the vision program's arena (encoder_bind), when the CPU runs it
        e->session_bytes += g4::rt::encoder_arena_bytes(e->plan, e->plan.find_program("vision"));
    if (!in.audio_gpu) // likewise the audio program's
        e->session_bytes += g4::rt::encoder_arena_bytes(e->plan, e->plan.find_program("audio"));
    e->load_ms = std::chrono::duration<double, std::milli>(g4_clock::now() - t_open).count();
    handle_add(e);
    *out_engine = e;
    return G4_OK;
    G4_GUARD_END
}

void g4_engine_close(g4_engine* engine) {
    if (!engine_ok(engine)) return;
    handle_remove(engine);
    engine->magic = 0;
    delete engine;
}

g4_status g4_engine_get_info(const g4_engine* e, g4_engine_info* out) {
    if (!engine_ok(e) || !out)
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_engine_get_info: invalid engine or NULL output");
    const auto& in = e->plan.info();
    std::memset(out, 0, sizeof *out);
    out->vocab_size      = in.vocab_size;
    out->max_context     = in.max_context;
    out->max_chunk       = in.max_rows;
    out->num_layers      = in.num_layers;
    out->hidden_size     = in.hidden_size;
    out->bos_token_id    = in.bos_token_id;
    out->n_eos_token_ids = (int32_t)std::min<size_t>(8, in.eos_token_ids.size());
    for (int i = 0; i < out->n_eos_token_ids; ++i)
        out->eos_token_ids[i] = in.eos_token_ids[i];
    out->weights_bytes = e->plan.weights_bytes();
    out->session_bytes = e->session_bytes;
    out->architecture  = e->plan.architecture().c_str();
    out->has_tokenizer = e->tokenizer != nullptr;
    out->load_ms       = e->load_ms;
    return G4_OK;
}

int32_t g4_engine_is_eos(const g4_engine* e, int32_t token) {
    if (!engine_ok(e)) return 0;
    for (int32_t id : e->plan.info().eos_token_ids)
        if (id == token) return 1;
    return 0;
}

g4_session_params g4_session_params_default(void) {
    g4_session_params p;
    p.n_threads = 0;
    return p;
}

g4_status g4_session_create(g4_engine* e, const g4_session_params* params, g4_session** out) {
    G4_GUARD_BEGIN
    if (!out) return set_error(G4_ERR_INVALID_ARGUMENT, "g4_session_create: out_session must not be NULL");
    *out = nullptr;
    if (!engine_ok(e))
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_session_create: invalid or closed engine");
    g4_session_params prm = params ? *params : g4_session_params_default();
    if (prm.n_threads < 0 || prm.n_threads > 1024)
        return set_error(G4_ERR_INVALID_ARGUMENT, "n_threads must be in 0..1024");
    const auto& in = e->plan.info();
    auto* s        = new g4_session();
    s->engine      = e;
    {
        std::string berr;
        g4_status bst = e->backend->create_session(s, prm.n_threads, &s->backend, &berr);
        if (bst != G4_OK) {
            delete s;
            return set_error(bst, berr);
        }
    }
    {
        std::string merr;
        g4_status mst = g4::rt::media_create(s, &merr);
        if (mst != G4_OK) {
            delete s;
            return set_error(mst, merr);
        }
        for (size_t i = 0; i < e->plan.n_ops(); ++i)
            if (e->plan.op(i).code == (uint16_t)g4::OpCode::Embed &&
                std::strcmp(e->plan.str(e->plan.op(i).name), "inp_embd") == 0)
                s->embed_op = (int32_t)i;
    }
    s->last_logits.assign(in.vocab_size, 0.0f);
    s->history.assign(in.max_context, 0);
    s->sample_buf.assign(in.vocab_size, 0.0f);
    s->sample_idx.assign(in.vocab_size, 0);
    s->sample_tmp.assign(in.vocab_size, 0);
    e->live_sessions++;
    handle_add(s);
    *out = s;
    return G4_OK;
    G4_GUARD_END
}

void g4_session_destroy(g4_session* s) {
    if (!session_ok(s)) return;
    handle_remove(s);
    s->magic = 0;
    s->engine->live_sessions--;
    delete s; // the backend frees its buffers, then the pool goes
}

g4_status g4_session_reset(g4_session* s) {
    if (!session_ok(s))
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_session_reset: invalid or destroyed session");
    s->position         = 0;
    s->have_logits      = false;
    s->logits_on_device = false;
    s->rng_seeded       = false;
    s->cancel           = false;
    s->stats            = {};
    g4::rt::media_clear(s);
    s->backend->reset();
    return G4_OK;
}

int32_t g4_session_position(const g4_session* s) {
    return session_ok(s) ? s->position : 0;
}

void g4_session_cancel(g4_session* s) {
    if (session_ok(s)) s->cancel.store(true);
}

g4_status g4_session_append_tokens(g4_session* s, const int32_t* ids, size_t n, float* out_logits,
                                   size_t cap) {
    G4_GUARD_BEGIN
    if (!session_ok(s))
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_session_append_tokens: invalid or destroyed session");
    if (n == 0) return G4_OK;
    if (!ids) return set_error(G4_ERR_INVALID_ARGUMENT, "g4_session_append_tokens: ids is NULL");
    const auto& in  = s->engine->plan.info();
    const int32_t V = in.vocab_size;
    for (size_t i = 0; i < n; ++i)
        if ((ids[i] < 0 || ids[i] >= in.embed_vocab_limit) && !g4::rt::media_is_placeholder(s, ids[i]))
            return set_error(G4_ERR_INVALID_ARGUMENT, "token id " + std::to_string(ids[i]) + " at index " +
                                                          std::to_string(i) +
                                                          " is outside the vocabulary (0.." +
                                                          std::to_string(in.embed_vocab_limit - 1) + ")");
    if ((uint64_t)s->position + n > (uint64_t)in.max_context)
        return set_error(G4_ERR_CONTEXT_FULL,
                         "the context would hold " + std::to_string((uint64_t)s->position + n) +
                             " tokens but the plan's max context is " + std::to_string(in.max_context) +
                             " (recompile with a larger --max-context)");
    if (out_logits && cap < n * (size_t)V)
        return set_error(G4_ERR_INVALID_ARGUMENT, "out_logits holds " + std::to_string(cap) + " floats; " +
                                                      std::to_string(n * (size_t)V) + " needed");
    {
        std::string merr;
        g4_status mst = g4::rt::media_check_tokens(s, ids, n, &merr);
        if (mst != G4_OK) return set_error(mst, merr);
    }
    auto t0 = g4_clock::now();
    if (n > 1) s->prefill_start = t0;
    // All logits wanted: steps of at most logits_rows tokens, each producing all its rows.
    const int32_t chunk = out_logits ? in.logits_rows : in.max_rows;
    size_t done         = 0;
    g4_status st        = G4_OK;
    std::string err;
    while (done < n) {
        if (s->cancel.load()) {
            st  = G4_ERR_CANCELLED;
            err = "cancelled";
            break;
        }
        int32_t rows = (int32_t)std::min<size_t>(chunk, n - done);
        bool last    = done + rows == n;
        int32_t outr = out_logits ? rows : (last ? 1 : 0);
        std::memcpy(s->ids, ids + done, sizeof(int32_t) * rows);
        g4::rt::media_prepare_step(s, ids + done, rows);
        g4::rt::LogitsAt at = g4::rt::LogitsAt::Host;
        st                  = s->backend->run_step(rows, s->position, outr, out_logits == nullptr, &at, &err);
        g4::rt::media_end_step(s, st == G4_OK);
        bool on_device = at == g4::rt::LogitsAt::Device;
        if (st == G4_OK && on_device && out_logits) {
            st        = s->backend->fetch_logits(&err);
            on_device = false;
        }
        if (st != G4_OK) break;
        for (int32_t r = 0; r < rows; ++r)
            s->history[s->position + r] = ids[done + r] < V ? ids[done + r] : in.pad_token_id;
        s->position += rows;
        if (out_logits) std::memcpy(out_logits + done * V, s->logits, sizeof(float) * (size_t)rows * V);
        s->logits_on_device = on_device;
        if (outr > 0 && !on_device)
            std::memcpy(s->last_logits.data(), s->logits + (size_t)(outr - 1) * V, sizeof(float) * V);
        s->have_logits = outr > 0;
        done += rows;
        if (s->progress && n > (size_t)chunk && s->progress(s->progress_user, (int64_t)done, (int64_t)n) &&
            done < n) {
            st  = G4_ERR_CANCELLED;
            err = "cancelled";
            break;
        }
    }
    double ms = std::chrono::duration<double, std::milli>(g4_clock::now() - t0).count();
    if (n == 1)
        s->stats.decode_ms += ms, s->stats.decode_tokens += (int64_t)done;
    else
        s->stats.prefill_ms += ms, s->stats.prefill_tokens += (int64_t)done;
    if (st == G4_ERR_CANCELLED) s->cancel.store(false); // a cancellation is reported once
    if (st != G4_OK)
        return set_error(st, st == G4_ERR_CANCELLED ? "cancelled after " + std::to_string(done) + " of " +
                                                          std::to_string(n) + " tokens"
                                                    : err);
    return G4_OK;
    G4_GUARD_END
}

// Copies the logits a step left on the device into last_logits.
static g4_status fetch_device_logits(g4_session* s) {
    std::string err;
    g4_status st = s->backend->fetch_logits(&err);
    if (st != G4_OK) return set_error(st, err);
    std::memcpy(s->last_logits.data(), s->logits, sizeof(float) * s->last_logits.size());
    s->logits_on_device = false;
    return G4_OK;
}

g4_status g4_session_get_logits(const g4_session* s, const float** out, int32_t* out_vocab) {
    if (!session_ok(s) || !out)
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_session_get_logits: invalid session or NULL output");
    if (!s->have_logits) return set_error(G4_ERR_INVALID_ARGUMENT, "no logits: feed tokens first");
    if (s->logits_on_device) {
        g4_status st = fetch_device_logits(const_cast<g4_session*>(s));
        if (st != G4_OK) return st;
    }
    *out = s->last_logits.data();
    if (out_vocab) *out_vocab = (int32_t)s->last_logits.size();
    return G4_OK;
}

g4_sampling_params g4_sampling_params_default(void) {
    g4_sampling_params p;
    p.temperature    = 0.0f;
    p.top_k          = 0;
    p.top_p          = 1.0f;
    p.min_p          = 0.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n  = 64;
    p.seed           = 0;
    return p;
}

g4_status g4_sampling_params_from_plan(const g4_engine* e, g4_sampling_params* out) {
    if (!engine_ok(e) || !out)
        return set_error(G4_ERR_INVALID_ARGUMENT,
                         "g4_sampling_params_from_plan: invalid engine or NULL output");
    const auto& in      = e->plan.info();
    *out                = g4_sampling_params_default();
    out->temperature    = in.do_sample ? in.temperature : 0.0f;
    out->top_k          = in.top_k;
    out->top_p          = in.top_p;
    out->min_p          = in.min_p;
    out->repeat_penalty = in.repetition_penalty;
    return G4_OK;
}

g4_status g4_sampling_params_check(const g4_sampling_params* params) {
    if (!params) return set_error(G4_ERR_INVALID_ARGUMENT, "g4_sampling_params_check: NULL params");
    const std::string bad = g4::rt::check_sampling(*params);
    if (!bad.empty()) return set_error(G4_ERR_INVALID_ARGUMENT, "sampling: " + bad);
    return G4_OK;
}

g4_status g4_session_sample(g4_session* s, const g4_sampling_params* params, int32_t* out_token) {
    G4_GUARD_BEGIN
    if (!session_ok(s) || !out_token)
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_session_sample: invalid session or NULL output");
    if (!s->have_logits)
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_session_sample: no logits: feed tokens first");
    g4_sampling_params p = params ? *params : g4_sampling_params_default();
    std::string bad      = g4::rt::check_sampling(p);
    if (!bad.empty()) return set_error(G4_ERR_INVALID_ARGUMENT, "sampling: " + bad);
    struct Timer { // sample_ms / sample_calls of every sampled token
        g4_session* s;
        g4_clock::time_point t0 = g4_clock::now();
        ~Timer() {
            s->stats.sample_ms += std::chrono::duration<double, std::milli>(g4_clock::now() - t0).count();
            s->stats.sample_calls++;
        }
    } timer{s};
    if (!s->rng_seeded) {
        s->rng.seed(p.seed);
        s->rng_seeded = true;
    }
    s->greedy_hint = p.temperature == 0.0f && g4::rt::penalty_window(p, s->position) == 0;
    if (s->logits_on_device) {
        // Greedy without a repetition penalty: the argmax the backend computed on the device.
        const int32_t n_hist = g4::rt::penalty_window(p, s->position);
        if (p.temperature == 0.0f && n_hist == 0) {
            *out_token = s->backend->device_argmax();
            return G4_OK;
        }
        // Greedy with a penalty (top-1) or top-k up to the backend's kmax: the candidates come from the
        // device and only they cross to the host. Top-p / min-p without top-k: the best kmax with the
        // row's softmax normalizer, enough whenever the nucleus ends among them. Other settings (or a
        // nucleus wider than that) copy the logits row and sample on the CPU.
        const int32_t vocab = (int32_t)s->last_logits.size();
        const int32_t k     = p.temperature == 0.0f ? 1 : p.top_k;
        const int32_t kmax  = s->backend->device_topk_max();
        if (k > 0 && k <= kmax && k < vocab) {
            const float* values = nullptr;
            const int32_t* ids  = nullptr;
            std::string err;
            g4_status st = s->backend->device_topk(k, p.temperature, n_hist ? p.repeat_penalty : 1.0f,
                                                   s->history.data() + (s->position - n_hist), n_hist,
                                                   &values, &ids, nullptr, &err);
            if (st != G4_OK) return set_error(st, err);
            *out_token = p.temperature == 0.0f ? ids[0] : g4::rt::sample_sorted(values, ids, k, p, s->rng);
            return G4_OK;
        }
        if (kmax > 0 && (p.top_k == 0 || p.top_k >= vocab) && (p.top_p < 1.0f || p.min_p > 0.0f)) {
            const int32_t kn    = std::min<int32_t>(kmax, vocab);
            const float* values = nullptr;
            const int32_t* ids  = nullptr;
            g4::rt::RowNorm z{};
            std::string err;
            g4_status st = s->backend->device_topk(kn, p.temperature, n_hist ? p.repeat_penalty : 1.0f,
                                                   s->history.data() + (s->position - n_hist), n_hist,
                                                   &values, &ids, &z, &err);
            if (st != G4_OK) return set_error(st, err);
            const int32_t tok = g4::rt::sample_prefix(values, ids, kn, vocab, z.max, z.sum, p, s->rng);
            if (tok >= 0) {
                *out_token = tok;
                return G4_OK;
            }
        }
        g4_status st = fetch_device_logits(s);
        if (st != G4_OK) return st;
    }
    *out_token = g4::rt::sample_token(s->last_logits.data(), (int32_t)s->last_logits.size(), p,
                                      s->history.data(), s->position, s->sample_buf.data(),
                                      s->sample_idx.data(), s->sample_tmp.data(), s->rng);
    return G4_OK;
    G4_GUARD_END
}

g4_status g4_session_get_stats(const g4_session* s, g4_session_stats* out) {
    if (!session_ok(s) || !out)
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_session_get_stats: invalid session or NULL output");
    *out = s->stats;
    return G4_OK;
}

} // extern "C"

// ---- text ------------------------------------------------------------------------------------

namespace {

template <class T> g4_status deliver(const T* data, size_t n, T* out, size_t cap, size_t* out_n) {
    if (out_n) *out_n = n;
    if (cap < n || (n > 0 && !out))
        return set_error(G4_ERR_BUFFER_TOO_SMALL, "output buffer holds " + std::to_string(cap) +
                                                      " elements; " + std::to_string(n) + " needed");
    if (n) std::memcpy(out, data, n * sizeof(T));
    return G4_OK;
}

g4_status need_tokenizer(const g4_engine* e, const char* fn) {
    if (!engine_ok(e))
        return set_error(G4_ERR_INVALID_ARGUMENT, std::string(fn) + ": invalid or closed engine");
    if (!e->tokenizer)
        return set_error(G4_ERR_NO_TOKENIZER,
                         std::string(fn) + ": the plan has no tokenizer (compile a checkpoint that has "
                                           "tokenizer.json, or pass --tokenizer FILE to g4 compile)");
    return G4_OK;
}

} // namespace

extern "C" {

g4_status g4_tokenize(const g4_engine* e, const char* text, size_t len, int32_t add_special, int32_t* out_ids,
                      size_t cap, size_t* out_n) {
    G4_GUARD_BEGIN
    if (g4_status st = need_tokenizer(e, "g4_tokenize")) return st;
    if (!text && len) return set_error(G4_ERR_INVALID_ARGUMENT, "g4_tokenize: text is NULL");
    std::vector<int32_t> ids;
    std::string err;
    if (!e->tokenizer->encode(std::string_view(text ? text : "", len), add_special != 0, &ids, &err))
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_tokenize: " + err);
    return deliver(ids.data(), ids.size(), out_ids, cap, out_n);
    G4_GUARD_END
}

g4_status g4_detokenize(const g4_engine* e, const int32_t* ids, size_t n, int32_t skip_special, char* out,
                        size_t cap, size_t* out_n) {
    G4_GUARD_BEGIN
    if (g4_status st = need_tokenizer(e, "g4_detokenize")) return st;
    if (!ids && n) return set_error(G4_ERR_INVALID_ARGUMENT, "g4_detokenize: ids is NULL");
    std::string text;
    if (!e->tokenizer->decode(ids, n, skip_special != 0, &text))
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_detokenize failed");
    return deliver(text.data(), text.size(), out, cap, out_n);
    G4_GUARD_END
}

g4_status g4_chat_render(const g4_engine* e, const g4_chat_message* msgs, size_t n,
                         int32_t add_generation_prompt, char* out, size_t cap, size_t* out_n) {
    G4_GUARD_BEGIN
    if (g4_status st = need_tokenizer(e, "g4_chat_render")) return st;
    if (!msgs && n) return set_error(G4_ERR_INVALID_ARGUMENT, "g4_chat_render: messages is NULL");
    std::vector<g4::ChatMessage> v;
    for (size_t i = 0; i < n; ++i) {
        if (!msgs[i].role || !msgs[i].content)
            return set_error(G4_ERR_INVALID_ARGUMENT,
                             "g4_chat_render: message " + std::to_string(i) + " has a NULL role or content");
        v.push_back({msgs[i].role, msgs[i].content});
    }
    g4::ChatOptions opt;
    opt.add_generation_prompt = add_generation_prompt != 0;
    std::string text, err;
    g4::ChatTemplate tpl;
    if (!g4::engine_chat_template(e, &tpl, &err))
        return set_error(G4_ERR_UNSUPPORTED, "g4_chat_render: " + err);
    if (!g4::render_chat(tpl, v, opt, &text, &err))
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_chat_render: " + err);
    return deliver(text.data(), text.size(), out, cap, out_n);
    G4_GUARD_END
}

g4_status g4_chat_render_ids(const g4_engine* e, const g4_chat_media_message* msgs, size_t n,
                             int32_t add_generation_prompt, int32_t* out_ids, size_t cap, size_t* out_n) {
    G4_GUARD_BEGIN
    if (g4_status st = need_tokenizer(e, "g4_chat_render_ids")) return st;
    if (!msgs && n) return set_error(G4_ERR_INVALID_ARGUMENT, "g4_chat_render_ids: messages is NULL");
    const auto& in = e->plan.info();
    std::vector<g4::ChatMessage> v;
    for (size_t i = 0; i < n; ++i) {
        const g4_chat_media_message& m = msgs[i];
        const std::string at           = "g4_chat_render_ids: message " + std::to_string(i);
        if (!m.role || !m.content)
            return set_error(G4_ERR_INVALID_ARGUMENT, at + " has a NULL role or content");
        if (m.n_media && !m.media) return set_error(G4_ERR_INVALID_ARGUMENT, at + ": media is NULL");
        v.push_back({m.role, m.content, {}});
        for (size_t k = 0; k < m.n_media; ++k) {
            const g4_chat_media& md = m.media[k];
            const std::string item  = at + " media " + std::to_string(k);
            if (md.kind != G4_MEDIA_IMAGE && md.kind != G4_MEDIA_AUDIO)
                return set_error(G4_ERR_INVALID_ARGUMENT, item + ": kind " + std::to_string(md.kind) +
                                                              " is not G4_MEDIA_IMAGE or _AUDIO");
            if (md.n_tokens < 0) return set_error(G4_ERR_INVALID_ARGUMENT, item + ": n_tokens < 0");
            const bool image = md.kind == G4_MEDIA_IMAGE;
            if (image ? in.vision_config.empty() : in.audio_config.empty())
                return set_error(G4_ERR_UNSUPPORTED,
                                 item + ": the plan has no " + (image ? "vision" : "audio") + " tower");
            v.back().media.push_back(image ? g4::ChatMedia::Image : g4::ChatMedia::Audio);
        }
    }
    g4::ChatOptions opt;
    opt.add_generation_prompt = add_generation_prompt != 0;
    std::string text, err;
    std::vector<g4::ChatMediaMark> marks;
    g4::ChatTemplate tpl;
    if (!g4::engine_chat_template(e, &tpl, &err))
        return set_error(G4_ERR_UNSUPPORTED, "g4_chat_render_ids: " + err);
    if (!g4::render_chat(tpl, v, opt, &text, &err, &marks))
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_chat_render_ids: " + err);
    std::vector<int32_t> ids, part;
    size_t at     = 0;
    auto add_text = [&](size_t end) {
        if (end == at) return true;
        part.clear();
        if (!e->tokenizer->encode(std::string_view(text).substr(at, end - at), false, &part, &err))
            return false;
        ids.insert(ids.end(), part.begin(), part.end());
        return true;
    };
    for (const g4::ChatMediaMark& m : marks) {
        if (!add_text(m.offset)) return set_error(G4_ERR_INVALID_ARGUMENT, "g4_chat_render_ids: " + err);
        const bool image = m.kind == g4::ChatMedia::Image;
        ids.push_back(image ? in.boi_token_id : in.boa_token_id);
        ids.insert(ids.end(), (size_t)msgs[m.message].media[m.item].n_tokens,
                   image ? in.image_token_id : in.audio_token_id);
        ids.push_back(image ? in.eoi_token_id : in.eoa_token_id);
        at = m.offset + m.length;
    }
    if (!add_text(text.size())) return set_error(G4_ERR_INVALID_ARGUMENT, "g4_chat_render_ids: " + err);
    return deliver(ids.data(), ids.size(), out_ids, cap, out_n);
    G4_GUARD_END
}

g4_generate_params g4_generate_params_default(void) {
    g4_generate_params p;
    p.max_tokens = 256;
    p.ignore_eos = 0;
    p.stop       = nullptr;
    p.n_stop     = 0;
    return p;
}

g4_status g4_session_generate(g4_session* s, const g4_sampling_params* sampling,
                              const g4_generate_params* params, g4_token_callback cb, void* user,
                              int32_t* out_n) {
    G4_GUARD_BEGIN
    if (out_n) *out_n = 0;
    if (!session_ok(s))
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_session_generate: invalid or destroyed session");
    g4_generate_params gp = params ? *params : g4_generate_params_default();
    if (gp.max_tokens < 0) return set_error(G4_ERR_INVALID_ARGUMENT, "max_tokens must be >= 0");
    if (gp.n_stop && !gp.stop) return set_error(G4_ERR_INVALID_ARGUMENT, "stop is NULL but n_stop > 0");
    // Checked before any work (the first sample would, after max_tokens steps of nothing).
    if (sampling && g4_sampling_params_check(sampling) != G4_OK) return G4_ERR_INVALID_ARGUMENT;
    std::vector<std::string> stops;
    for (size_t i = 0; i < gp.n_stop; ++i) {
        if (!gp.stop[i] || !*gp.stop[i])
            return set_error(G4_ERR_INVALID_ARGUMENT, "stop strings must be non-empty");
        stops.emplace_back(gp.stop[i]);
    }
    int32_t n_done     = 0;
    const g4_status st = g4::rt::generate_loop(s, sampling, gp, stops, cb, user, &n_done, [s](int32_t tok) {
        return g4_session_append_tokens(s, &tok, 1, nullptr, 0);
    });
    if (out_n) *out_n = n_done;
    return st;
    G4_GUARD_END
}

g4_status g4_engine_get_media_info(const g4_engine* e, g4_media_info* out) {
    if (!engine_ok(e) || !out)
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_engine_get_media_info: invalid engine or NULL out");
    const auto& in = e->plan.info();
    g4_media_info m{};
    m.has_vision        = !in.vision_config.empty();
    m.has_audio         = !in.audio_config.empty();
    m.image_token_id    = in.image_token_id;
    m.boi_token_id      = in.boi_token_id;
    m.eoi_token_id      = in.eoi_token_id;
    m.audio_token_id    = in.audio_token_id;
    m.boa_token_id      = in.boa_token_id;
    m.eoa_token_id      = in.eoa_token_id;
    m.max_image_tokens  = in.image_tokens;
    m.max_image_pixels  = in.max_image_pixels;
    m.audio_sample_rate = in.audio_sample_rate;
    m.max_audio_samples = in.max_audio_samples;
    m.max_queued_tokens = in.max_media_tokens;
    m.vision_device     = in.vision_gpu ? e->plan.cuda_device() : -1;
    m.audio_device      = in.audio_gpu ? e->plan.cuda_device() : -1;
    m.video_token_id    = m.has_vision ? in.video_token_id : -1;
    m.max_video_frame_tokens =
        m.video_token_id >= 0 ? std::min(g4::rt::kVideoFrameTokens, in.image_tokens) : 0;
    if (m.video_token_id >= 0) {
        // META towers.vision.video (checked by the codec); plans from before it was recorded: the defaults.
        const auto& tw = e->plan.meta().towers;
        const g4::plan::MetaVideo d{g4::media::kVideoFrames, g4::media::kMaxVideoSeconds,
                                    g4::media::kMaxVideoStreamFrames, in.max_image_pixels,
                                    g4::media::kMaxMediaFileBytes};
        const g4::plan::MetaVideo& v = tw && tw->vision && tw->vision->video ? *tw->vision->video : d;
        m.video_frames               = v.frames;
        m.max_video_seconds          = v.max_seconds;
        m.max_video_stream_frames    = v.max_stream_frames;
        m.max_video_pixels           = v.max_pixels;
        m.max_video_bytes            = v.max_file_bytes;
    }
    *out = m;
    return G4_OK;
}

g4_status g4_session_add_image(g4_session* s, const uint8_t* rgb, int32_t width, int32_t height,
                               int32_t* out_n_tokens) {
    G4_GUARD_BEGIN
    if (!session_ok(s))
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_session_add_image: invalid or destroyed session");
    return media_call(
        &s->stats.image_ms, &s->stats.image_tokens, out_n_tokens,
        [&](int32_t* n, std::string* err) { return g4::rt::media_add_image(s, rgb, width, height, n, err); });
    G4_GUARD_END
}

g4_status g4_session_add_video_frame(g4_session* s, const uint8_t* rgb, int32_t width, int32_t height,
                                     int32_t* out_n_tokens) {
    G4_GUARD_BEGIN
    if (!session_ok(s))
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_session_add_video_frame: invalid or destroyed session");
    return media_call(&s->stats.image_ms, &s->stats.image_tokens, out_n_tokens,
                      [&](int32_t* n, std::string* err) {
                          return g4::rt::media_add_video_frame(s, rgb, width, height, n, err);
                      });
    G4_GUARD_END
}

g4_status g4_session_add_audio(g4_session* s, const float* samples, int64_t n_samples,
                               int32_t* out_n_tokens) {
    G4_GUARD_BEGIN
    if (!session_ok(s))
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_session_add_audio: invalid or destroyed session");
    return media_call(
        &s->stats.audio_ms, &s->stats.audio_tokens, out_n_tokens,
        [&](int32_t* n, std::string* err) { return g4::rt::media_add_audio(s, samples, n_samples, n, err); });
    G4_GUARD_END
}

g4_status g4_session_clear_media(g4_session* s) {
    if (!session_ok(s))
        return set_error(G4_ERR_INVALID_ARGUMENT, "g4_session_clear_media: invalid or destroyed session");
    g4::rt::media_clear(s);
    return G4_OK;
}

} // extern "C"
