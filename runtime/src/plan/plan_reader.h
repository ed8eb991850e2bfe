// Maps a plan file read-only and validates it (header, section table, checksums of the small
// sections, every tensor and op record) before anything uses it. No exceptions: load() returns a
// status and a one-line message naming the file and the defect.
#pragma once
#include "g4/g4.h"
#include "runtime/src/plan/plan_format.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace g4::plan {

struct ProgramInfo {
    int32_t max_rows = 0, max_context = 0, logits_rows = 0, sliding_slots = 0;
    uint64_t act_arena_bytes = 0, kv_arena_bytes = 0;
    int32_t ids_tensor = -1, logits_tensor = -1;
    int64_t max_k = 0, max_slots = 0;
    int32_t vocab_size = 0, embed_vocab_limit = 0;
    int32_t num_layers = 0, hidden_size = 0;
    int32_t bos_token_id = 2;
    std::vector<int32_t> eos_token_ids;
    // generation_config defaults
    bool do_sample = false;
    float temperature = 1, top_p = 1, min_p = 0, repetition_penalty = 1;
    int32_t top_k = 0;
    // CUDA plans with CPU-placed text layers (--place layers=...:cpu): which layers run on the CPU
    // (empty: none); the weights section's first weights_device_bytes go to the GPU (the rest, the CPU
    // layers' weights, are read from the mapped plan) and the KV arena's first kv_device_bytes are
    // device memory (the rest, the CPU layers' caches, host memory).
    std::vector<uint8_t> layer_on_cpu;
    uint64_t weights_device_bytes = 0, kv_device_bytes = 0;
};

class Plan {
public:
    Plan() = default;
    ~Plan();
    Plan(const Plan&)            = delete;
    Plan& operator=(const Plan&) = delete;

    // Opens and validates `path`. verify_weights also checks the WEIGHTS checksum.
    g4_status load(const std::string& path, bool verify_weights, std::string* err);

    const PlanHeader& header() const { return *header_; }
    const std::string& meta_json() const { return meta_; }
    const ProgramInfo& info() const { return info_; }
    const std::string& architecture() const { return arch_; }
    const std::vector<PlanSection>& sections() const { return sections_; }
    size_t n_tensors() const { return n_tensors_; }
    size_t n_ops() const { return n_ops_; }
    const PlanTensor& tensor(size_t i) const { return tensors_[i]; }
    const PlanOp& op(size_t i) const { return ops_[i]; }
    const char* str(uint32_t off) const { return strings_ + off; }
    const uint8_t* weight_data(const PlanTensor& t) const { return weights_ + t.offset; }
    uint64_t weights_bytes() const { return weights_size_; }
    const uint8_t* weights_base() const { return weights_; }
    // Tells the kernel that weight tensor t is read at random, a few rows a step (the per-layer-
    // embedding table): no read-ahead around its page faults, so only the pages of rows read become
    // resident. Advisory: a failure changes nothing else. Thread-safe (touches no plan state).
    void advise_random(size_t t) const;
    uint64_t file_size() const { return size_; }
    // The embedded tokenizer.json text; empty if the plan has none.
    std::string_view tokenizer_json() const { return tokenizer_; }
    // "cpu" or "cuda"; for CUDA plans the target ("sm_90"), device index and kernel binaries.
    const std::string& device() const { return device_; }
    const std::string& cuda_target() const { return cuda_target_; }
    int cuda_device() const { return cuda_device_; }
    std::string_view cubin() const { return cubin_; }
    std::string_view ptx() const { return ptx_; }
    // META placement.ple == "host" (--place ple=host, or chosen by the budget check): the PLE table
    // (the weight with role PleTable) stays in pinned host memory and is gathered from there.
    bool ple_on_host() const { return ple_on_host_; }
    // The decode schedule of a CUDA plan (validated: contiguous, covers every op once); empty otherwise.
    size_t n_launches() const { return n_launches_; }
    // A CUDA plan with CPU-placed text layers; op i runs on the CPU (its layer is CPU-placed).
    bool hybrid() const { return !info_.layer_on_cpu.empty(); }
    bool op_on_cpu(size_t i) const {
        const uint16_t l = ops_[i].layer;
        return l != kNoLayer && l < info_.layer_on_cpu.size() && info_.layer_on_cpu[l];
    }
    const CudaLaunch& launch(size_t i) const { return launches_[i]; }

private:
    g4_status fail(g4_status st, const std::string& msg, std::string* err) const;
    g4_status validate_records(std::string* err);

    std::string path_;
    void* map_ = nullptr;
    uint64_t size_ = 0;
    const PlanHeader* header_ = nullptr;
    std::vector<PlanSection> sections_;
    std::string meta_, arch_;
    const char* strings_ = nullptr;
    uint64_t strings_size_ = 0;
    const PlanTensor* tensors_ = nullptr;
    size_t n_tensors_ = 0;
    const PlanOp* ops_ = nullptr;
    size_t n_ops_ = 0;
    std::string_view tokenizer_, cubin_, ptx_;
    const CudaLaunch* launches_ = nullptr;
    size_t n_launches_ = 0;
    std::string device_ = "cpu", cuda_target_;
    int cuda_device_ = 0;
    bool ple_on_host_ = false;
    const uint8_t* weights_ = nullptr;
    uint64_t weights_size_ = 0;
    ProgramInfo info_;
};

} // namespace g4::plan
