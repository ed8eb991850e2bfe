// G4_CPU_PROFILE=1: wall time per op kind of CPU program runs, with the GFLOP/s of the ops whose arithmetic
// is counted (matmuls, also by weight shape, and the attentions' two products). The text program's prefill
// chunks and decode steps are summed over a session's life and printed when it is destroyed; each encoder
// program run (vision, audio) is printed on its own.
#pragma once
#include "runtime/plan/plan_reader.h"

#include <cstdint>

namespace g4::rt {

class CpuProfile {
public:
    // One op of `rows` rows at positions pos0.. that took `ms` milliseconds (wall).
    void add(const plan::PlanOp& op, const plan::Plan& p, int32_t rows, int32_t pos0, double ms);
    // A text-program step of `rows` rows (one per run_step or screened decode step, its ops added before).
    void step(int32_t rows) {
        steps_++;
        rows_ += rows;
    }
    bool empty() const { return steps_ == 0 && total_ms() == 0; }
    // Prints "g4 profile: <title>, ..." and a line per op kind and per matmul shape to stderr.
    void print(const char* title) const;

private:
    double total_ms() const;
    static constexpr int kShapes = 24;
    struct Row {
        int64_t k = 0, n = 0, calls = 0, rows = 0;
        double ms = 0, flop = 0;
    };
    Row ops_[64], matmuls_[kShapes];
    int64_t steps_ = 0, rows_ = 0;
};

// A session's text-program profiles: prefill steps (more than one row) and decode steps (one row).
struct TextProfile {
    CpuProfile prefill, decode;
    CpuProfile& of(int32_t rows) { return rows > 1 ? prefill : decode; }
    void print() const; // the non-empty ones
};

} // namespace g4::rt
