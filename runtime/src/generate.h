// The generation loop of g4_session_generate, shared with callers that feed each token their own way
// (g4 serve's batched decode steps): sample, stop at an end-of-generation token or a full context, feed the
// token, hand the text it completes to the callback (text_stream.h), flush what was held back at the end.
#pragma once
#include "g4/g4.h"

#include <functional>
#include <string>
#include <vector>

namespace g4::rt {

// Generates up to params.max_tokens tokens of session s. feed(tok) runs the step that appends tok to s
// (g4_session_append_tokens for g4_session_generate). Sets s's time to first token after the first feed.
// Returns the first failing status (sampling, context full, feed; the thread's g4_last_error_message
// set by whichever failed) or G4_OK; *out_n: the tokens fed. stops: non-empty stop strings. Runs on the
// calling thread; s must not be used by another thread meanwhile.
g4_status generate_loop(g4_session* s, const g4_sampling_params* sampling, const g4_generate_params& params,
                        const std::vector<std::string>& stops, g4_token_callback cb, void* user,
                        int32_t* out_n, const std::function<g4_status(int32_t)>& feed);

} // namespace g4::rt
