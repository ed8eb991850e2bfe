// Internal definitions behind the C API handles: g4_engine (validated plan, its backend) and g4_session
// (host views of the arenas, bound op list, sampler state, its backend). Device state lives in the
// backends (runtime/src/backend.h). See runtime/include/g4/g4.h for the public contract.
#pragma once
#include "g4/g4.h"
#include "kernels/cpu/cpu.h"
#include "runtime/plan/plan_reader.h"
#include "runtime/src/backend.h"
#include "runtime/src/cpu_profile.h"
#include "runtime/src/frontend/media.h"
#include "runtime/src/tokenizer.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

struct g4_engine {
    uint32_t magic = 0x67346531; // "g4e1"; cleared on close to catch use after close
    g4::plan::Plan plan;
    uint64_t session_bytes = 0;
    std::atomic<int> live_sessions{0};
    std::unique_ptr<g4::Tokenizer> tokenizer; // null if the plan has none
    double load_ms = 0;
    std::unique_ptr<g4::rt::EngineBackend> backend; // the plan's device side (backend.h)
    // META policy.cpu_precision "fast" or "bf16": CPU NF4 matmuls with int16 x (kernels/q16.h), GeluMul
    // through cpu::gelu_mul_vec (Eigen's vectorised tanh)
    bool cpu_int16 = false;
    // "bf16": and the NF4 matmuls of prefill chunks with bf16 operands on AMX tiles where the CPU has them
    // (MatmulArgs::bf16_rows)
    bool cpu_bf16_rows = false;
    // Per plan op: the Clamp ops of CPU encoder programs that their neighbouring bf16 matmul applies
    // instead (rt::find_clamp_fusion, executor.h).
    std::vector<uint8_t> clamp_fusion;
};

namespace g4::rt {

// One op with its tensors resolved to addresses of the session's arenas and the plan's weights.
struct BoundOp {
    const plan::PlanOp* op;
    void* in[4];      // row 0 of each input view (column offset applied), nullptr if unused
    int64_t in_ld[4]; // leading dimension (elements) of each input
    DType in_dt[4];
    void* out[2];
    int64_t out_ld[2];
    int64_t in_cols[4]; // columns in the viewed tensor after the column offset
    int64_t in_rows[4]; // capacity in rows of each input tensor
    int64_t out_cols[2];
    int64_t out_rows[2];
};

// plan::check_program (Plan::load has run it on every plan it opened): "" when the ops are valid.
std::string check_ops(const plan::Plan& p);

} // namespace g4::rt

struct g4_session {
    uint32_t magic    = 0x67347331; // "g4s1"
    g4_engine* engine = nullptr;
    std::unique_ptr<g4::cpu::ThreadPool> pool;
    g4::cpu::Context ctx;
    // The host arenas the CPU executor binds the program to (owned by the backend): per-thread scratch, the
    // activation arena and the KV arena (or, for a plan with layers on a GPU and the CPU, its host part:
    // plan KV offsets from kv_offset0 on).
    float* scratch      = nullptr;
    uint8_t* act        = nullptr;
    uint8_t* kv         = nullptr;
    uint64_t kv_offset0 = 0;
    std::vector<g4::rt::BoundOp> ops;
    std::unique_ptr<g4::rt::TextProfile> profile; // G4_CPU_PROFILE=1 on a CPU plan: run_ops' op times
    int32_t* ids          = nullptr;              // [max_rows] input of the program
    const float* logits   = nullptr;              // [logits_rows, vocab] output of the program
    int32_t position      = 0;
    bool have_logits      = false;
    bool logits_on_device = false;   // the step left its row on the device: last_logits not filled yet
    bool greedy_hint      = true;    // the last g4_session_sample was greedy without a repetition penalty
    std::vector<float> last_logits;  // [vocab]
    std::vector<int32_t> history;    // [max_context] tokens fed so far
    std::vector<float> sample_buf;   // [vocab]
    std::vector<int32_t> sample_idx; // [vocab]
    std::vector<int32_t> sample_tmp; // [vocab]
    std::mt19937_64 rng;
    bool rng_seeded = false;
    std::atomic<bool> cancel{false};
    g4_session_stats stats{};
    std::chrono::steady_clock::time_point prefill_start{};
    std::unique_ptr<g4::rt::SessionBackend> backend; // the session's device side (backend.h)
    std::unique_ptr<g4::rt::MediaState> media;       // plans with a vision/audio tower only
    int32_t embed_op              = -1; // the op computing inp_embd (placeholder rows are replaced after it)
    g4_progress_callback progress = nullptr; // g4_session_set_progress_callback
    void* progress_user           = nullptr;
};
