// g4 serve: counters for GET /metrics (Prometheus text format 0.0.4): requests by endpoint and status, queue
// depth, busy slots, prompt tokens (and those reused) and generated tokens, time to first token (a histogram)
// and decode speed.
#pragma once
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace g4::serve {

class Metrics {
public:
    void request_done(const std::string& endpoint, int status);
    void cancelled();
    // One finished generation: tokens in (of them, reused from the slot's session) and out, time to first
    // token, time spent generating after it.
    void generation(long prompt_tokens, long completion_tokens, long cached_tokens, double ttft_s,
                    double decode_s);
    // The exposition text; the gauges are read by the caller (the scheduler's figures, its batcher's steps
    // and the tokens they fed: 0 without batching).
    std::string render(int queue_depth, int busy_slots, int slots, long batch_steps = 0,
                       long batch_tokens = 0) const;

private:
    mutable std::mutex m_;
    std::map<std::pair<std::string, int>, long> requests_;
    long cancelled_ = 0, prompt_tokens_ = 0, cached_tokens_ = 0, completion_tokens_ = 0, generations_ = 0;
    double decode_s_ = 0, ttft_sum_ = 0, last_tok_s_ = 0;
    std::vector<long> ttft_buckets_ = std::vector<long>(kBuckets.size(), 0);
    static const std::vector<double> kBuckets;
};

} // namespace g4::serve
