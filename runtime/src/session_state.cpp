// Session state through the C API: save and load (buffer or file), rewind, fork, and the progress
// callback. The state layout is in docs/runtime.md ("Session state").
#include "g4/g4.h"
#include "runtime/plan/op_params.h"
#include "runtime/src/api_util.h"
#include "runtime/src/engine.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

using g4::rt::api_error;
using g4::rt::api_session_ok;

namespace {

constexpr char kStateMagic[8]    = {'G', '4', 'S', 'T', 'A', 'T', 'E', 0};
constexpr uint32_t kStateVersion = 1;

// The state starts with this header; then history int32 [position], logits float [vocab] (if
// has_logits), the sampler's generator (rng_bytes), and each KV cache's first min(position, slots) rows
// in tensor-table order. checksum: state_checksum over the whole state with this field zeroed.
struct StateHeader {
    char magic[8];
    uint32_t version;
    uint32_t header_size;
    uint64_t plan_id;
    uint64_t total_size;
    int32_t position;
    int32_t vocab;
    int32_t n_caches;
    uint8_t kv_dtype;
    uint8_t has_logits;
    uint8_t rng_seeded;
    uint8_t reserved0;
    uint64_t kv_bytes;
    uint32_t rng_bytes;
    uint32_t reserved1;
    uint64_t checksum;
};
static_assert(sizeof(StateHeader) == 72 && sizeof(StateHeader) % 8 == 0);
static_assert(std::is_trivially_copyable_v<std::mt19937_64>);

// FNV-1a 64 over 64-bit little-endian words (a tail shorter than 8 bytes zero-padded): eight times fewer
// multiplications than the bytewise hash, for states of hundreds of megabytes.
uint64_t state_checksum(const uint8_t* p, size_t n, uint64_t h = 1469598103934665603ull) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, 8);
        h = (h ^ w) * 1099511628211ull;
    }
    if (i < n) {
        uint64_t w = 0;
        std::memcpy(&w, p + i, n - i);
        h = (h ^ w) * 1099511628211ull;
    }
    return h;
}

// The plan's identity: its schema hash and section table (each section's kind, place, size, checksum).
uint64_t plan_identity(const g4::plan::Plan& p) {
    const auto& secs = p.sections();
    uint64_t h       = g4::plan::fnv1a64(secs.data(), secs.size() * sizeof(g4::plan::PlanSection));
    return g4::plan::fnv1a64(&p.header().schema_hash, sizeof p.header().schema_hash, h);
}

// A KV cache: its KV-arena offset, slots and bytes per row.
struct Cache {
    uint64_t offset;
    int64_t slots;
    uint64_t row_bytes;
};

template <class F> void for_each_cache(const g4::plan::Plan& p, F&& f) {
    for (size_t t = 0; t < p.n_tensors(); ++t) {
        const auto& ten = p.tensor(t);
        if (ten.kind != (uint8_t)g4::plan::TensorKind::KvCache || ten.dims[0] <= 0) continue;
        f(Cache{ten.offset, ten.dims[0], ten.nbytes / (uint64_t)ten.dims[0]});
    }
}

struct Layout {
    int32_t n_caches  = 0;
    uint8_t kv_dtype  = 0;
    uint64_t kv_bytes = 0, total = 0;
};

Layout state_layout(const g4_session* s, int32_t position, bool has_logits) {
    const auto& p = s->engine->plan;
    Layout l;
    for_each_cache(p, [&](const Cache& c) {
        l.n_caches++;
        l.kv_bytes += (uint64_t)std::min<int64_t>(position, c.slots) * c.row_bytes;
    });
    for (size_t t = 0; t < p.n_tensors(); ++t)
        if (p.tensor(t).kind == (uint8_t)g4::plan::TensorKind::KvCache) l.kv_dtype = p.tensor(t).dtype;
    l.total = sizeof(StateHeader) + (uint64_t)position * 4 +
              (has_logits ? (uint64_t)p.info().vocab_size * 4 : 0) + sizeof(std::mt19937_64) + l.kv_bytes;
    return l;
}

// KV rows [0, rows) of cache c between the session and host memory.
g4_status kv_rows(g4_session* s, const Cache& c, uint64_t bytes, uint8_t* host, bool to_host,
                  std::string* err) {
    if (bytes == 0) return G4_OK;
    return s->backend->kv_transfer(c.offset, host, bytes, to_host, err);
}

// The last logits on the host (a step may leave them on the device).
g4_status host_logits(g4_session* s) {
    if (!s->logits_on_device) return G4_OK;
    const float* l = nullptr;
    return g4_session_get_logits(s, &l, nullptr);
}

// After the session's position or KV cache changed outside a step.
g4_status after_state_change(g4_session* s) {
    s->logits_on_device = false;
    s->cancel           = false;
    s->prefill_start    = {};
    g4_session_clear_media(s);
    std::string err;
    g4_status st = s->backend->state_changed(&err);
    return st == G4_OK ? st : api_error(st, err);
}

g4_status save_into(g4_session* s, uint8_t* out, size_t cap, size_t* out_n) {
    if (g4_status st = host_logits(s); st != G4_OK) return st;
    const auto& p  = s->engine->plan;
    const Layout l = state_layout(s, s->position, s->have_logits);
    if (out_n) *out_n = l.total;
    if (cap < l.total || !out)
        return api_error(G4_ERR_BUFFER_TOO_SMALL, "g4_session_save_state: the buffer holds " +
                                                      std::to_string(cap) + " bytes; the state needs " +
                                                      std::to_string(l.total));
    StateHeader h{};
    std::memcpy(h.magic, kStateMagic, 8);
    h.version     = kStateVersion;
    h.header_size = sizeof h;
    h.plan_id     = plan_identity(p);
    h.total_size  = l.total;
    h.position    = s->position;
    h.vocab       = p.info().vocab_size;
    h.n_caches    = l.n_caches;
    h.kv_dtype    = l.kv_dtype;
    h.has_logits  = s->have_logits;
    h.rng_seeded  = s->rng_seeded;
    h.kv_bytes    = l.kv_bytes;
    h.rng_bytes   = sizeof(std::mt19937_64);
    uint8_t* w    = out + sizeof h;
    std::memcpy(w, s->history.data(), (size_t)s->position * 4);
    w += (size_t)s->position * 4;
    if (s->have_logits) {
        std::memcpy(w, s->last_logits.data(), (size_t)h.vocab * 4);
        w += (size_t)h.vocab * 4;
    }
    std::memcpy(w, &s->rng, sizeof(std::mt19937_64));
    w += sizeof(std::mt19937_64);
    std::string err;
    g4_status st = G4_OK;
    for_each_cache(p, [&](const Cache& c) {
        const uint64_t bytes = (uint64_t)std::min<int64_t>(s->position, c.slots) * c.row_bytes;
        if (st == G4_OK) st = kv_rows(s, c, bytes, w, true, &err);
        w += bytes;
    });
    if (st != G4_OK) return api_error(st, err);
    std::memcpy(out, &h, sizeof h);
    h.checksum = state_checksum(out, l.total);
    std::memcpy(out + offsetof(StateHeader, checksum), &h.checksum, sizeof h.checksum);
    return G4_OK;
}

// Checks a state against the session's plan: "" when it can be loaded, else what is wrong.
std::string check_state(const g4_session* s, const uint8_t* data, size_t n, StateHeader* out) {
    StateHeader h;
    if (n < sizeof h)
        return "truncated: " + std::to_string(n) + " bytes, smaller than the " + std::to_string(sizeof h) +
               "-byte header";
    std::memcpy(&h, data, sizeof h);
    if (std::memcmp(h.magic, kStateMagic, 8) != 0) return "not a g4 session state (bad magic)";
    if (h.version != kStateVersion)
        return "state version " + std::to_string(h.version) + " but this runtime reads version " +
               std::to_string(kStateVersion) + " (save it again with this runtime)";
    if (h.header_size != sizeof h) return "bad header size " + std::to_string(h.header_size);
    if (h.total_size != n)
        return "truncated or extended: the header says " + std::to_string(h.total_size) +
               " bytes, there are " + std::to_string(n);
    // The header is a whole number of 64-bit words: the checksum runs on across it into the data.
    uint64_t sum = h.checksum;
    h.checksum   = 0;
    uint64_t c   = state_checksum((const uint8_t*)&h, sizeof h);
    c            = state_checksum(data + sizeof h, n - sizeof h, c);
    if (c != sum) return "checksum mismatch (the state is damaged)";
    h.checksum    = sum;
    const auto& p = s->engine->plan;
    if (h.plan_id != plan_identity(p))
        return "saved on another plan (plan identity differs; a state loads only into sessions of the plan "
               "that saved it)";
    if (h.position < 0 || h.position > p.info().max_context)
        return "position " + std::to_string(h.position) + " outside the plan's context (0.." +
               std::to_string(p.info().max_context) + ")";
    const Layout l = state_layout(s, h.position, h.has_logits != 0);
    if (h.vocab != p.info().vocab_size || h.n_caches != l.n_caches || h.kv_dtype != l.kv_dtype ||
        h.kv_bytes != l.kv_bytes || h.rng_bytes != sizeof(std::mt19937_64) || h.total_size != l.total ||
        h.has_logits > 1 || h.rng_seeded > 1)
        return "sizes do not match the plan (vocabulary, KV caches, KV dtype or generator)";
    *out = h;
    return "";
}

g4_status load_from(g4_session* s, const uint8_t* data, size_t n) {
    StateHeader h;
    const std::string bad = check_state(s, data, n, &h);
    if (!bad.empty()) return api_error(G4_ERR_BAD_STATE, "session state: " + bad);
    const auto& p    = s->engine->plan;
    const uint8_t* r = data + sizeof h;
    std::memcpy(s->history.data(), r, (size_t)h.position * 4);
    r += (size_t)h.position * 4;
    if (h.has_logits) {
        std::memcpy(s->last_logits.data(), r, (size_t)h.vocab * 4);
        r += (size_t)h.vocab * 4;
    }
    std::memcpy((void*)&s->rng, r, sizeof(std::mt19937_64));
    r += sizeof(std::mt19937_64);
    std::string err;
    g4_status st = G4_OK;
    for_each_cache(p, [&](const Cache& c) {
        const uint64_t bytes = (uint64_t)std::min<int64_t>(h.position, c.slots) * c.row_bytes;
        if (st == G4_OK) st = kv_rows(s, c, bytes, const_cast<uint8_t*>(r), false, &err);
        r += bytes;
    });
    if (st != G4_OK) {
        g4_session_reset(s); // the KV cache is partly overwritten: start over rather than mix
        return api_error(st, err);
    }
    s->position    = h.position;
    s->have_logits = h.has_logits != 0;
    s->rng_seeded  = h.rng_seeded != 0;
    return after_state_change(s);
}

// Positions a rewind to `position` from the current one may not go below: a sliding-window layer reads
// the window before each new token, which must still be in its ring (slots rows; position x in row x %
// slots, so the rows of [lo, position) are intact while no later token wrapped onto them).
int32_t earliest_rewind(const g4_session* s) {
    const auto& p = s->engine->plan;
    int32_t need  = 0;
    for (size_t i = 0; i < p.n_ops(); ++i) {
        const auto& op = p.op(i);
        if (op.code != (uint16_t)g4::OpCode::Attention) continue;
        const auto a        = g4::plan::params<g4::plan::AttentionParams>(op);
        const int32_t slots = a.slots, window = a.window;
        if (window <= 0 || s->position <= slots) continue;
        // lo(position) = position - window + 1 must satisfy s->position <= lo + slots.
        need = std::max(need, s->position - slots + window - 1);
    }
    return need;
}

} // namespace

extern "C" {

g4_status g4_session_state_size(const g4_session* s, size_t* out_bytes) {
    if (!api_session_ok(s) || !out_bytes)
        return api_error(G4_ERR_INVALID_ARGUMENT, "g4_session_state_size: invalid session or NULL output");
    *out_bytes = state_layout(s, s->position, s->have_logits).total;
    return G4_OK;
}

g4_status g4_session_save_state(g4_session* s, void* out, size_t cap, size_t* out_n) {
    try {
        if (!api_session_ok(s))
            return api_error(G4_ERR_INVALID_ARGUMENT, "g4_session_save_state: invalid or destroyed session");
        return save_into(s, (uint8_t*)out, cap, out_n);
    } catch (...) {
        return api_error(G4_ERR_INTERNAL, "g4_session_save_state: internal error");
    }
}

g4_status g4_session_load_state(g4_session* s, const void* data, size_t n) {
    try {
        if (!api_session_ok(s))
            return api_error(G4_ERR_INVALID_ARGUMENT, "g4_session_load_state: invalid or destroyed session");
        if (!data && n) return api_error(G4_ERR_INVALID_ARGUMENT, "g4_session_load_state: data is NULL");
        return load_from(s, (const uint8_t*)data, n);
    } catch (...) {
        return api_error(G4_ERR_INTERNAL, "g4_session_load_state: internal error");
    }
}

g4_status g4_session_save_state_file(g4_session* s, const char* path) {
    try {
        if (!api_session_ok(s) || !path)
            return api_error(G4_ERR_INVALID_ARGUMENT,
                             "g4_session_save_state_file: invalid session or NULL path");
        if (g4_status st = host_logits(s); st != G4_OK) return st;
        size_t n = state_layout(s, s->position, s->have_logits).total;
        std::vector<uint8_t> buf(n);
        if (g4_status st = save_into(s, buf.data(), n, &n); st != G4_OK) return st;
        const std::string tmp = std::string(path) + ".tmp";
        std::FILE* f          = std::fopen(tmp.c_str(), "wb");
        if (!f)
            return api_error(G4_ERR_IO, std::string(path) + ": cannot write the session state (" +
                                            std::strerror(errno) + ")");
        const bool ok = std::fwrite(buf.data(), 1, n, f) == n;
        if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path) != 0) {
            const std::string why = std::strerror(errno);
            std::remove(tmp.c_str());
            return api_error(G4_ERR_IO, std::string(path) + ": cannot write the session state (" + why + ")");
        }
        return G4_OK;
    } catch (const std::bad_alloc&) {
        return api_error(G4_ERR_OUT_OF_MEMORY, "g4_session_save_state_file: out of memory");
    } catch (...) {
        return api_error(G4_ERR_INTERNAL, "g4_session_save_state_file: internal error");
    }
}

g4_status g4_session_load_state_file(g4_session* s, const char* path) {
    try {
        if (!api_session_ok(s) || !path)
            return api_error(G4_ERR_INVALID_ARGUMENT,
                             "g4_session_load_state_file: invalid session or NULL path");
        std::FILE* f = std::fopen(path, "rb");
        if (!f)
            return api_error(G4_ERR_IO, std::string(path) + ": cannot read the session state (" +
                                            std::strerror(errno) + ")");
        std::unique_ptr<std::FILE, int (*)(std::FILE*)> closer(f, std::fclose);
        // The largest state this session can hold bounds what is read.
        const auto& in     = s->engine->plan.info();
        const size_t limit = state_layout(s, in.max_context, true).total;
        std::vector<uint8_t> buf;
        uint8_t chunk[1 << 16];
        size_t got;
        while ((got = std::fread(chunk, 1, sizeof chunk, f)) > 0) {
            if (buf.size() + got > limit)
                return api_error(G4_ERR_BAD_STATE, std::string(path) +
                                                       ": session state: larger than any state of "
                                                       "this plan (" +
                                                       std::to_string(limit) + " bytes at most)");
            buf.insert(buf.end(), chunk, chunk + got);
        }
        if (std::ferror(f))
            return api_error(G4_ERR_IO, std::string(path) + ": cannot read the session state");
        g4_status st = load_from(s, buf.data(), buf.size());
        if (st == G4_ERR_BAD_STATE) api_error(st, std::string(path) + ": " + g4_last_error_message());
        return st;
    } catch (const std::bad_alloc&) {
        return api_error(G4_ERR_OUT_OF_MEMORY, "g4_session_load_state_file: out of memory");
    } catch (...) {
        return api_error(G4_ERR_INTERNAL, "g4_session_load_state_file: internal error");
    }
}

g4_status g4_session_rewind(g4_session* s, int32_t position) {
    try {
        if (!api_session_ok(s))
            return api_error(G4_ERR_INVALID_ARGUMENT, "g4_session_rewind: invalid or destroyed session");
        if (position < 0 || position > s->position)
            return api_error(G4_ERR_INVALID_ARGUMENT, "g4_session_rewind: position " +
                                                          std::to_string(position) + " outside 0.." +
                                                          std::to_string(s->position));
        if (position == s->position) return G4_OK;
        const int32_t lo = earliest_rewind(s);
        if (position < lo)
            return api_error(
                G4_ERR_INVALID_ARGUMENT,
                "g4_session_rewind: the sliding-window caches no longer hold the tokens before " +
                    std::to_string(position) + " (later tokens overwrote them); rewind to " +
                    std::to_string(lo) + " or later, or reset and feed the tokens again");
        s->position    = position;
        s->have_logits = false;
        return after_state_change(s);
    } catch (...) {
        return api_error(G4_ERR_INTERNAL, "g4_session_rewind: internal error");
    }
}

g4_status g4_session_reseed(g4_session* s) {
    if (!api_session_ok(s))
        return api_error(G4_ERR_INVALID_ARGUMENT, "g4_session_reseed: invalid or destroyed session");
    s->rng_seeded = false;
    return G4_OK;
}

g4_status g4_session_fork(g4_session* src, g4_session* dst) {
    try {
        if (!api_session_ok(src) || !api_session_ok(dst))
            return api_error(G4_ERR_INVALID_ARGUMENT, "g4_session_fork: invalid or destroyed session");
        if (src == dst) return G4_OK;
        const auto& p = src->engine->plan;
        if (plan_identity(p) != plan_identity(dst->engine->plan))
            return api_error(G4_ERR_INVALID_ARGUMENT, "g4_session_fork: the sessions run different plans");
        if (g4_status st = host_logits(src); st != G4_OK) return st;
        std::string err;
        g4_status st = G4_OK;
        for_each_cache(p, [&](const Cache& c) {
            const uint64_t bytes = (uint64_t)std::min<int64_t>(src->position, c.slots) * c.row_bytes;
            if (st != G4_OK || bytes == 0) return;
            st = src->backend->kv_copy(*dst->backend, c.offset, bytes, &err);
        });
        if (st != G4_OK) {
            g4_session_reset(dst);
            return api_error(st, err);
        }
        std::copy(src->history.begin(), src->history.begin() + src->position, dst->history.begin());
        dst->last_logits = src->last_logits; // same size: no allocation
        dst->rng         = src->rng;
        dst->rng_seeded  = src->rng_seeded;
        dst->position    = src->position;
        dst->have_logits = src->have_logits;
        return after_state_change(dst);
    } catch (...) {
        return api_error(G4_ERR_INTERNAL, "g4_session_fork: internal error");
    }
}

g4_status g4_session_set_progress_callback(g4_session* s, g4_progress_callback cb, void* user) {
    if (!api_session_ok(s))
        return api_error(G4_ERR_INVALID_ARGUMENT,
                         "g4_session_set_progress_callback: invalid or destroyed session");
    s->progress      = cb;
    s->progress_user = user;
    return G4_OK;
}

} // extern "C"
