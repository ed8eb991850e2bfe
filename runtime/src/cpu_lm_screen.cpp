// LM-head screening for the CPU backend: the int8 copy built at engine open and the screened greedy token
// (cpu_lm_screen.h).
#include "runtime/src/cpu_lm_screen.h"
#include "runtime/src/cpu_lm_head.h"
#include "runtime/src/env.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <thread>
#include <vector>

namespace g4::rt {

std::unique_ptr<CpuLmScreen> open_cpu_lm_screen(const g4_engine* e, int threads, std::string* err) {
    const plan::Plan& p = e->plan;
    const auto& pl      = p.meta().placement;
    if (!pl || !pl->lm_head_screen.value_or(false) || env::lm_screen_off() || !e->cpu_int16 || p.hybrid())
        return nullptr;
    CpuLmHead h;
    if (!find_cpu_lm_head(&p.op(0), p.n_ops(), &p.tensor(0), p.info().logits_tensor, &h)) return nullptr;
    auto l     = std::make_unique<CpuLmScreen>();
    l->head_op = h.op, l->softcap = h.softcap, l->n = h.n, l->k = h.k;
    const plan::PlanTensor& w = p.tensor(p.op(h.op).in[1]);
    const uint64_t qb         = ((uint64_t)l->n * l->k + 63) / 64 * 64;
    l->bytes                  = h.copy_bytes();
    l->buf                    = {(uint8_t*)std::aligned_alloc(64, (l->bytes + 63) / 64 * 64), std::free};
    if (!l->buf) {
        *err = "cannot allocate " + std::to_string(l->bytes) + " bytes for the LM head's screening copy";
        return nullptr;
    }
    uint8_t* b         = l->buf.get();
    l->copy            = {(int8_t*)b, (float*)(b + qb), (float*)(b + qb) + l->n, (float*)(b + qb) + 2 * l->n,
                          (int32_t*)((float*)(b + qb) + 3 * l->n)};
    const uint16_t* wd = (const uint16_t*)p.weight_data(w);
    const int nt       = (int)std::clamp<int64_t>(threads > 0 ? threads : cpu::default_thread_count(), 1,
                                            std::max<int64_t>(1, l->n / 64));
    const int64_t per  = (l->n + nt - 1) / nt;
    auto part          = [&](int t) {
        cpu::lm_screen_build(wd, l->k, std::min(l->n, t * per), std::min(l->n, (t + 1) * per), l->copy);
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < nt; ++t)
        pool.emplace_back(part, t);
    part(0);
    for (auto& th : pool)
        th.join();
    return l;
}

int32_t lm_screen_argmax(const cpu::Context& c, const cpu::LmScreenCopy& q, const LmScreenStep& a,
                         int64_t* computed) {
    *computed = 0;
    const cpu::LmScreenResult r =
        cpu::lm_screen(c, {a.x, q.q, q.scale, q.bound, q.qnorm, q.qsum, a.bias, a.n, a.k, a.y});
    if (!r.screened) return -1;
    // Rows left out are below the best row's lower bound by the margin; after the softcap (monotone, slope
    // >= sech^2(4) where |logit| <= 4 cap) they stay strictly below it through float32 rounding. Past that
    // range the softcap flattens: no screening.
    const float T = r.max_lo;
    if (a.softcap > 0 && std::fabs(T) > 4.0f * a.softcap) return -1;
    const float margin = 0.05f + 1e-4f * std::fabs(T);
    MatmulArgs ma{a.x, a.k, a.w, DType::BF16, a.n, a.k, a.y, a.n, 1};
    ma.int16_x   = true;
    *computed    = cpu::matmul_bf16_gemv_where(c, ma, T - margin);
    int32_t best = -1;
    float bv     = 0;
    for (int64_t n = 0; n < a.n; ++n) {
        if (a.y[n] == -INFINITY) continue;
        float v = a.bias ? a.y[n] + a.bias[n] : a.y[n]; // the LoRA bias, added after the product as in a step
        if (a.softcap > 0) cpu::softcap(c, {&v, 1, &v, 1, 1, 1, 1.0f, nullptr, DType::F32, a.softcap});
        if (best < 0 || v > bv) best = (int32_t)n, bv = v;
    }
    return best;
}

int32_t cpu_lm_screen_argmax(g4_session* s, const CpuLmScreen& l, int64_t* computed) {
    const BoundOp& b = s->ops[l.head_op];
    return lm_screen_argmax(
        s->ctx, l.copy,
        {(const float*)b.in[0], b.in[1], (const float*)b.in[2], l.n, l.k, l.softcap, (float*)b.out[0]},
        computed);
}

} // namespace g4::rt
