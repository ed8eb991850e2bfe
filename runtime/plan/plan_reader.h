// Maps a plan file read-only and validates it (header, section table, checksums of the small
// sections, every tensor and op record) before anything uses it. No exceptions: load() returns a
// status and a one-line message naming the file and the defect.
#pragma once
#include "g4/g4.h"
#include "runtime/plan/meta.h"
#include "runtime/plan/plan_format.h"

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
    int32_t pad_token_id = 0; // placeholder tokens of images/audio are looked up as this id
    std::vector<int32_t> eos_token_ids;
    // generation_config defaults
    bool do_sample    = false;
    float temperature = 1, top_p = 1, min_p = 0, repetition_penalty = 1;
    int32_t top_k = 0;
    // Cross-device CUDA plans (--place layers=... naming the CPU or other GPUs): each text layer's
    // device, -1 for the CPU or a CUDA index (empty: every layer on the plan's GPU).
    std::vector<int32_t> layer_device;
    // The GPUs of a CUDA plan, the plan's GPU first: the byte ranges of the weights section each one
    // uploads (CPU ops read every weight from the mapped plan) and the range [kv_begin, kv_end) of the
    // KV arena that is its device memory. A plan without layer_device has one GPU holding everything.
    // The KV arena from kv_host_begin on is host memory (the CPU-placed layers' caches).
    struct GpuPart {
        int32_t index = 0;
        std::vector<std::pair<uint64_t, uint64_t>> weights;
        uint64_t kv_begin = 0, kv_end = 0;
    };
    std::vector<GpuPart> gpus;
    uint64_t kv_host_begin = 0;
    // Vision/audio towers (META "towers"; none when absent). They run on the CPU from the mapped
    // weights [towers_begin, towers_end) of WEIGHTS, which the text layers' GPUs do not upload (towers_begin
    // = end of WEIGHTS without towers); a tower placed on the plan's GPU has its own range below. Config JSON
    // texts are parsed by runtime/src/towers; "" = no such tower.
    std::string vision_config, audio_config;
    int32_t image_tokens = 0, max_patches = 0; // soft tokens / patches of the largest image
    // The vision encoder program ("" = none) and its inputs: pixel normalisation (p - pixel_mean) / pixel_std
    // of values in [0, 1], patch size, pooling kernel, position table size.
    std::string vision_program;
    float pixel_mean = 0, pixel_std = 1;
    int32_t patch_size = 0, pooling_kernel_size = 0, position_size = 0;
    int64_t max_image_pixels = 0; // input width * height a session takes
    int32_t image_token_id = -1, boi_token_id = -1, eoi_token_id = -1;
    int32_t video_token_id    = -1; // -1: the checkpoint has none (or the plan predates video)
    int64_t max_audio_samples = 0;
    int32_t audio_sample_rate = 0;
    int32_t audio_token_id = -1, boa_token_id = -1, eoa_token_id = -1;
    int32_t max_media_tokens     = 0;     // soft tokens a session holds queued
    uint64_t tower_thread_floats = 0;     // per-thread scratch of the towers' CPU kernels
    bool tower_bf16              = false; // towers' matmuls in bf16 (META towers "precision": "bf16")
    uint64_t tower_session_bytes =
        0; // host bytes a session allocates for the towers, less their per-thread scratch
    uint64_t towers_begin = 0, towers_end = 0;
    // CUDA plans may place the vision tower on the plan's GPU (META towers.vision "device": "cuda:N"): its
    // weights are [vision_begin, vision_end) of WEIGHTS, its encoder program runs there (PlanProgram.device),
    // vision_gpu_bytes is the session's device memory for it (the program's arena and launch records).
    bool vision_gpu       = false;
    uint64_t vision_begin = 0, vision_end = 0, vision_gpu_bytes = 0;
    // Likewise the audio tower (META towers.audio "device"): weights [audio_begin, audio_end), its encoder
    // program on the plan's GPU, audio_gpu_bytes the session's device memory for it.
    bool audio_gpu       = false;
    uint64_t audio_begin = 0, audio_end = 0, audio_gpu_bytes = 0;
};

// "metadata (META)", "weights (WEIGHTS)", ...: a section kind as messages name it.
const char* section_name(uint32_t kind);

class Plan;
// Every op's operands, column views, shapes, dtypes and parameters against the tensor table, and the
// tensors' placement in the arenas; "" when valid, else the first defect ("op 12 'name' (kind): ...").
// Plan::load runs it; the records it reads were range-checked there first.
std::string check_program(const Plan& p);

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
    const Meta& meta() const { return meta_struct_; } // META, decoded
    const ProgramInfo& info() const { return info_; }
    const std::string& architecture() const { return arch_; }
    const std::vector<PlanSection>& sections() const { return sections_; }
    size_t n_tensors() const { return n_tensors_; }
    // Ops of the text program (program 0: ops 0..n_ops()-1, the decoder a step replays); n_ops_all() counts
    // the other programs' ops too, which follow it in OPS.
    size_t n_ops() const { return programs_.empty() ? n_ops_ : programs_[0].op_end; }
    size_t n_ops_all() const { return n_ops_; }
    // The plan's programs (section PROGRAMS; a plan without one has the single program "text"): index 0 is
    // "text". find_program returns the index of the program named `name`, or -1.
    size_t n_programs() const { return programs_.size(); }
    const PlanProgram& program(size_t i) const { return programs_[i]; }
    int find_program(std::string_view name) const;
    // The program that owns tensor t (its activations live in that program's arena).
    size_t tensor_program(size_t t) const;
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
    // Heads per KV group the plan's decode attention kernels were compiled for (G4_AD_HPG), 0 = any.
    int cuda_attn_hpg() const { return cuda_attn_hpg_; }
    std::string_view cubin() const { return cubin_; }
    std::string_view ptx() const { return ptx_; }
    // META placement.ple == "host" (--place ple=host, or chosen by the budget check): the PLE table
    // (the weight with role PleTable) stays in pinned host memory and is gathered from there.
    bool ple_on_host() const { return ple_on_host_; }
    // The decode schedule of a CUDA plan (validated: contiguous, covers every op once); empty otherwise.
    size_t n_launches() const { return n_launches_; }
    // A CUDA plan whose text layers span devices (other GPUs, the CPU); the device op i runs on: its
    // layer's, else the plan's GPU (-1: the CPU; CPU plans: always -1).
    bool hybrid() const { return !info_.layer_device.empty(); }
    int op_device(size_t i) const {
        if (i >= n_ops()) { // another program's op: that program's device
            for (const PlanProgram& g : programs_)
                if (i >= g.op_begin && i < g.op_end) return g.device;
        }
        if (device_ != "cuda") return -1;
        const uint16_t l = ops_[i].layer;
        return l != kNoLayer && l < info_.layer_device.size() ? info_.layer_device[l] : cuda_device_;
    }
    bool op_on_cpu(size_t i) const { return hybrid() && op_device(i) < 0; }
    bool has_cpu_layers() const;
    // Position of CUDA device `index` in info().gpus; -1 if the plan puts nothing on it.
    int gpu_slot(int index) const;
    const CudaLaunch& launch(size_t i) const { return launches_[i]; }

private:
    g4_status fail(g4_status st, const std::string& msg, std::string* err) const;
    g4_status validate_records(std::string* err);
    std::string program_info();
    g4_status validate_programs(const PlanSection* sec, std::string* err);
    std::string launch_operands(const CudaLaunch& l) const;
    std::string check_launch(size_t i, size_t next) const;

    std::string path_;
    void* map_                = nullptr;
    uint64_t size_            = 0;
    const PlanHeader* header_ = nullptr;
    std::vector<PlanSection> sections_;
    std::string meta_, arch_;
    Meta meta_struct_;
    const char* strings_       = nullptr;
    uint64_t strings_size_     = 0;
    const PlanTensor* tensors_ = nullptr;
    size_t n_tensors_          = 0;
    const PlanOp* ops_         = nullptr;
    size_t n_ops_              = 0;
    std::string_view tokenizer_, cubin_, ptx_;
    std::vector<PlanProgram> programs_;
    const CudaLaunch* launches_ = nullptr;
    size_t n_launches_          = 0;
    std::string device_         = "cpu", cuda_target_;
    int cuda_device_            = 0;
    int cuda_attn_hpg_          = 0;
    bool ple_on_host_           = false;
    const uint8_t* weights_     = nullptr;
    uint64_t weights_size_      = 0;
    ProgramInfo info_;
};

} // namespace g4::plan
