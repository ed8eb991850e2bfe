// g4 serve: the /metrics counters (see metrics.h).
#include "tools/serve/metrics.h"

#include <cstdio>

namespace g4::serve {

const std::vector<double> Metrics::kBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

void Metrics::request_done(const std::string& endpoint, int status) {
    std::lock_guard<std::mutex> l(m_);
    ++requests_[{endpoint, status}];
}

void Metrics::cancelled() {
    std::lock_guard<std::mutex> l(m_);
    ++cancelled_;
}

void Metrics::generation(long prompt_tokens, long completion_tokens, long cached_tokens, double ttft_s,
                         double decode_s) {
    std::lock_guard<std::mutex> l(m_);
    prompt_tokens_ += prompt_tokens;
    cached_tokens_ += cached_tokens;
    completion_tokens_ += completion_tokens;
    ++generations_;
    ttft_sum_ += ttft_s;
    for (size_t i = 0; i < kBuckets.size(); ++i)
        if (ttft_s <= kBuckets[i]) ++ttft_buckets_[i];
    decode_s_ += decode_s;
    if (decode_s > 0 && completion_tokens > 1) last_tok_s_ = (double)(completion_tokens - 1) / decode_s;
}

std::string Metrics::render(int queue_depth, int busy_slots, int slots, long batch_steps,
                            long batch_tokens) const {
    std::lock_guard<std::mutex> l(m_);
    std::string o;
    char buf[256];
    auto line = [&](const char* fmt, auto... a) {
        std::snprintf(buf, sizeof buf, fmt, a...);
        o += buf;
    };
    o += "# HELP g4_requests_total HTTP requests answered, by endpoint and status code.\n"
         "# TYPE g4_requests_total counter\n";
    for (const auto& [k, n] : requests_)
        line("g4_requests_total{endpoint=\"%s\",code=\"%d\"} %ld\n", k.first.c_str(), k.second, n);
    o += "# HELP g4_requests_cancelled_total Generations stopped early: client gone or request timed out.\n"
         "# TYPE g4_requests_cancelled_total counter\n";
    line("g4_requests_cancelled_total %ld\n", cancelled_);
    o += "# HELP g4_queue_depth Requests waiting for a session slot.\n# TYPE g4_queue_depth gauge\n";
    line("g4_queue_depth %d\n", queue_depth);
    o += "# HELP g4_slots_busy Session slots running a request.\n# TYPE g4_slots_busy gauge\n";
    line("g4_slots_busy %d\n", busy_slots);
    o += "# HELP g4_slots Session slots (--max-sessions).\n# TYPE g4_slots gauge\n";
    line("g4_slots %d\n", slots);
    o +=
        "# HELP g4_batch_steps_total Batched decode steps (each feeds a token to every generating session).\n"
        "# TYPE g4_batch_steps_total counter\n";
    line("g4_batch_steps_total %ld\n", batch_steps);
    o += "# HELP g4_batch_tokens_total Tokens the batched decode steps fed.\n"
         "# TYPE g4_batch_tokens_total counter\n";
    line("g4_batch_tokens_total %ld\n", batch_tokens);
    o += "# HELP g4_prompt_tokens_total Prompt tokens, reused ones included.\n"
         "# TYPE g4_prompt_tokens_total counter\n";
    line("g4_prompt_tokens_total %ld\n", prompt_tokens_);
    o += "# HELP g4_prompt_tokens_cached_total Prompt tokens reused from a slot's session (not fed again).\n"
         "# TYPE g4_prompt_tokens_cached_total counter\n";
    line("g4_prompt_tokens_cached_total %ld\n", cached_tokens_);
    o += "# HELP g4_completion_tokens_total Tokens generated.\n# TYPE g4_completion_tokens_total counter\n";
    line("g4_completion_tokens_total %ld\n", completion_tokens_);
    o += "# HELP g4_decode_seconds_total Time spent generating after each request's first token.\n"
         "# TYPE g4_decode_seconds_total counter\n";
    line("g4_decode_seconds_total %.6f\n", decode_s_);
    o += "# HELP g4_decode_tokens_per_second Decode speed of the last finished request (tokens after the "
         "first / time).\n# TYPE g4_decode_tokens_per_second gauge\n";
    line("g4_decode_tokens_per_second %.3f\n", last_tok_s_);
    o += "# HELP g4_time_to_first_token_seconds From the request's arrival to its first generated token.\n"
         "# TYPE g4_time_to_first_token_seconds histogram\n";
    for (size_t i = 0; i < kBuckets.size(); ++i)
        line("g4_time_to_first_token_seconds_bucket{le=\"%g\"} %ld\n", kBuckets[i], ttft_buckets_[i]);
    line("g4_time_to_first_token_seconds_bucket{le=\"+Inf\"} %ld\n", generations_);
    line("g4_time_to_first_token_seconds_sum %.6f\n", ttft_sum_);
    line("g4_time_to_first_token_seconds_count %ld\n", generations_);
    return o;
}

} // namespace g4::serve
