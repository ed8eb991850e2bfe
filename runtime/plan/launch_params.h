// Typed fields of the CUDA schedule's launch records (plan_format.h CudaLaunch, one struct per LaunchKind
// family) and the table that maps each field onto the record's tensor (t), integer (ip) and float (fp)
// slots. launch_params<P>(l) reads them, set_launch_params(l, p) writes them; the compiler's schedule, the
// plan reader's checks and the CUDA launch code use only these. The kind and the ops covered (kind, op,
// count) stay the record's own fields.
#pragma once
#include "runtime/plan/plan_format.h"

#include <array>
#include <cstdint>

namespace g4::plan {

// One field: its name, the member, and the slot: 't' a tensor index (-1 none), 'i' an integer, 'f' a float.
template <class P> struct LaunchField {
    const char* name;
    int32_t P::*i = nullptr;
    float P::*f   = nullptr;
    char where    = 'i';
    uint8_t slot  = 0;
};
template <class P> constexpr LaunchField<P> tensor_slot(const char* n, int32_t P::*m, uint8_t s) {
    return {n, m, nullptr, 't', s};
}
template <class P> constexpr LaunchField<P> int_slot(const char* n, int32_t P::*m, uint8_t s) {
    return {n, m, nullptr, 'i', s};
}
template <class P> constexpr LaunchField<P> float_slot(const char* n, float P::*m, uint8_t s) {
    return {n, nullptr, m, 'f', s};
}

template <class P> struct LaunchTable;

// ResNorm: x_out = (x + rms(d) * post_w) * scale * scalar; xn = rms(x_out) * pre_w.
struct ResNormLaunch {
    int32_t x = -1, d = -1; // d -1: no residual branch (x_out = x * scale * scalar)
    int32_t post_w = -1, scalar = -1;
    int32_t x_out  = -1; // -1: not written
    int32_t pre_w  = -1;
    int32_t xn     = -1; // -1: not computed
    int32_t zeroed = -1; // the next fused launch's output, zeroed after (-1: none)
    int32_t cols   = 0;
    int32_t folded = 0; // 1: run by the GatedProj launch after it, 2: by the packed-f16 Mlp after it
    int32_t zero2  = 0; // a second buffer zeroed: its tensor index + 1 (0: none)
    float eps = 0, scale = 1.0f;
};
template <> struct LaunchTable<ResNormLaunch> {
    using P                            = ResNormLaunch;
    static constexpr std::array fields = {
        tensor_slot("x", &P::x, 0),           tensor_slot("d", &P::d, 1),
        tensor_slot("post_w", &P::post_w, 2), tensor_slot("scalar", &P::scalar, 3),
        tensor_slot("x_out", &P::x_out, 4),   tensor_slot("pre_w", &P::pre_w, 5),
        tensor_slot("xn", &P::xn, 6),         tensor_slot("zeroed", &P::zeroed, 7),
        int_slot("cols", &P::cols, 0),        int_slot("folded", &P::folded, 1),
        int_slot("zero2", &P::zero2, 2),      float_slot("eps", &P::eps, 0),
        float_slot("scale", &P::scale, 1)};
};

// Gemv: up to three matmul ops sharing x, one epilogue.
struct GemvLaunch {
    int32_t mat0 = 0, mat1 = 0, mat2 = 0; // the matmul ops (mat0 the record's op), nmat of them
    int32_t nmat     = 0;
    int32_t epilogue = 0; // 0 store, 1 gelu(gate) * up, 2 gelu(y) * aux, 3 softcap
    int32_t lanes    = 0; // lanes a weight row (8..128)
    int32_t aux = -1, aux_col = 0;
    int32_t out = -1; // the epilogue's output (1, 2)
    float cap   = 0;
    int32_t mat(int m) const { return m == 0 ? mat0 : m == 1 ? mat1 : mat2; }
};
template <> struct LaunchTable<GemvLaunch> {
    using P                            = GemvLaunch;
    static constexpr std::array fields = {
        int_slot("mat0", &P::mat0, 0),         int_slot("mat1", &P::mat1, 1),
        int_slot("mat2", &P::mat2, 2),         int_slot("nmat", &P::nmat, 3),
        int_slot("epilogue", &P::epilogue, 4), int_slot("lanes", &P::lanes, 5),
        tensor_slot("aux", &P::aux, 0),        int_slot("aux_col", &P::aux_col, 6),
        tensor_slot("out", &P::out, 1),        float_slot("cap", &P::cap, 0)};
};

// QkvPost / QkvAttn: q norm + rope [, k norm + rope, v norm, kv store] [, the decode attention].
struct QkvLaunch {
    int32_t q = -1, q_norm_w = -1, inv_freq = -1;
    int32_t k = -1, k_norm_w = -1, v = -1, k_cache = -1, v_cache = -1;
    int32_t heads = 0, kv_heads = 0, dim = 0, slots = 0;
    int32_t post_ops = 0; // QkvAttn: the QkvPost ops before the attention (2 or 6)
    float eps        = 0;
};
template <> struct LaunchTable<QkvLaunch> {
    using P                            = QkvLaunch;
    static constexpr std::array fields = {tensor_slot("q", &P::q, 0),
                                          tensor_slot("q_norm_w", &P::q_norm_w, 1),
                                          tensor_slot("inv_freq", &P::inv_freq, 2),
                                          tensor_slot("k", &P::k, 3),
                                          tensor_slot("k_norm_w", &P::k_norm_w, 4),
                                          tensor_slot("v", &P::v, 5),
                                          tensor_slot("k_cache", &P::k_cache, 6),
                                          tensor_slot("v_cache", &P::v_cache, 7),
                                          int_slot("heads", &P::heads, 0),
                                          int_slot("kv_heads", &P::kv_heads, 1),
                                          int_slot("dim", &P::dim, 2),
                                          int_slot("slots", &P::slots, 3),
                                          int_slot("post_ops", &P::post_ops, 4),
                                          float_slot("eps", &P::eps, 0)};
};

// Mlp: gate, up, GeluMul, down in one kernel, adding into y.
struct MlpLaunch {
    int32_t gate = -1, up = -1, down = -1; // op indices
    int32_t threads  = 0;                  // 128 | 256
    int32_t replicas = 0;                  // output replicas (1..kMlpReplicasMax; 0 until scheduled)
    int32_t f16      = 0;                  // 1: packed f16 products
    int32_t y        = -1;
};
template <> struct LaunchTable<MlpLaunch> {
    using P                            = MlpLaunch;
    static constexpr std::array fields = {int_slot("gate", &P::gate, 0),
                                          int_slot("up", &P::up, 1),
                                          int_slot("down", &P::down, 3),
                                          int_slot("threads", &P::threads, 5),
                                          int_slot("replicas", &P::replicas, 6),
                                          int_slot("f16", &P::f16, 7),
                                          tensor_slot("y", &P::y, 0)};
};

// AttnO: the o projection with the attention's merge, adding into y.
struct AttnOLaunch {
    int32_t o = -1, attention = -1; // op indices
    int32_t y = -1;
};
template <> struct LaunchTable<AttnOLaunch> {
    using P                            = AttnOLaunch;
    static constexpr std::array fields = {int_slot("o", &P::o, 0), int_slot("attention", &P::attention, 1),
                                          tensor_slot("y", &P::y, 0)};
};

// GatedProj: gate, GeluMul with aux, projection in one kernel, adding into y.
struct GatedProjLaunch {
    int32_t y = -1;
};
template <> struct LaunchTable<GatedProjLaunch> {
    using P                            = GatedProjLaunch;
    static constexpr std::array fields = {tensor_slot("y", &P::y, 0)};
};

// GroupNormAdd: out = (rms_groups(ctx * s1) * w + tok) * s2 (the scales and eps read from the ops).
struct GroupNormAddLaunch {
    int32_t ctx = -1, w = -1, tok = -1, out = -1;
    int32_t cols = 0, group = 0;
};
template <> struct LaunchTable<GroupNormAddLaunch> {
    using P                            = GroupNormAddLaunch;
    static constexpr std::array fields = {tensor_slot("ctx", &P::ctx, 0), tensor_slot("w", &P::w, 1),
                                          tensor_slot("tok", &P::tok, 2), tensor_slot("out", &P::out, 3),
                                          int_slot("cols", &P::cols, 0),  int_slot("group", &P::group, 1)};
};

namespace detail {
template <class P> int32_t* slot_of(CudaLaunch& l, const LaunchField<P>& f) {
    return f.where == 't' ? &l.t[f.slot] : &l.ip[f.slot];
}
template <class P> const int32_t* slot_of(const CudaLaunch& l, const LaunchField<P>& f) {
    return f.where == 't' ? &l.t[f.slot] : &l.ip[f.slot];
}
} // namespace detail

// l's fields as P (the caller has checked l.kind).
template <class P> P launch_params(const CudaLaunch& l) {
    P p;
    for (const auto& f : LaunchTable<P>::fields) {
        if (f.f) {
            p.*f.f = l.fp[f.slot];
            continue;
        }
        p.*f.i = *detail::slot_of(l, f);
    }
    return p;
}

// Writes p's fields into l's slots (kind, op and count untouched).
template <class P> void set_launch_params(CudaLaunch& l, const P& p) {
    for (const auto& f : LaunchTable<P>::fields) {
        if (f.f) {
            l.fp[f.slot] = p.*f.f;
            continue;
        }
        *detail::slot_of(l, f) = p.*f.i;
    }
}

} // namespace g4::plan
