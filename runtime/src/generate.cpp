// The generation loop shared by g4_session_generate and g4 serve's batched steps (see generate.h).
#include "runtime/src/generate.h"

#include "runtime/src/api_util.h"
#include "runtime/src/engine.h"
#include "runtime/src/text_stream.h"

#include <chrono>

namespace g4::rt {

g4_status generate_loop(g4_session* s, const g4_sampling_params* sampling, const g4_generate_params& gp,
                        const std::vector<std::string>& stops, g4_token_callback cb, void* user,
                        int32_t* out_n, const std::function<g4_status(int32_t)>& feed) {
    *out_n             = 0;
    const g4_engine* e = s->engine;
    const int32_t ctx  = e->plan.info().max_context;
    auto t0 =
        s->prefill_start.time_since_epoch().count() ? s->prefill_start : std::chrono::steady_clock::now();
    g4::TextStream stream(e->tokenizer ? e->tokenizer.get() : nullptr, stops);
    g4_status st = G4_OK;
    for (int32_t i = 0; i < gp.max_tokens; ++i) {
        int32_t tok;
        if ((st = g4_session_sample(s, sampling, &tok)) != G4_OK) break;
        if (!gp.ignore_eos && g4_engine_is_eos(e, tok)) break;
        if (s->position >= ctx) {
            st = api_error(G4_ERR_CONTEXT_FULL,
                           "context full: the plan's max context is " + std::to_string(ctx) + " tokens");
            break;
        }
        if ((st = feed(tok)) != G4_OK) break;
        if (*out_n == 0)
            s->stats.ttft_ms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        ++*out_n;
        // The newly completed text: an incomplete UTF-8 tail and anything that could still become a stop
        // string are held back.
        bool stop              = false;
        std::string_view piece = stream.push(tok, &stop);
        if (cb && cb(user, tok, piece.data(), piece.size())) break;
        if (stop) break;
    }
    if (st == G4_OK && cb) { // what was held back (an incomplete character or a partial stop string)
        std::string_view rest = stream.flush();
        if (!rest.empty()) cb(user, -1, rest.data(), rest.size());
    }
    return st;
}

} // namespace g4::rt
