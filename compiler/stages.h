// The stages of `g4 compile` (compile_plan in compiler/compile.cpp calls them in this order):
//   inputs     options, config, device, checkpoint, adapter, tokenizer, towers (stage_inputs.cpp,
//              stage_towers.cpp)
//   graph      the op program, split over devices, tower weights appended (stage_graph.cpp)
//   weights    storage policy, every weight resolved and validated (stage_weights.cpp)
//   memory     activation live ranges, weight / KV / activation arenas, session figures (stage_memory.cpp)
//   placement  budgets and devices decided from the memory plan's figures (stage_placement.cpp)
//   writer     records, META, sections, the weights merged / quantized and streamed (stage_writer.cpp,
//              stage_weights.cpp)
//   report     the compile report and --dry-run (stage_report.cpp)
//   fidelity   logits of the plan vs the full-precision model (stage_fidelity.cpp)
// Compiler-internal; the public entry point is compile.h.
#pragma once
#include "compiler/compile.h"
#include "compiler/config.h"
#include "compiler/cross_device.h"
#include "compiler/cuda_compile.h"
#include "compiler/cuda_schedule.h"
#include "compiler/error.h"
#include "compiler/lora.h"
#include "compiler/output_file.h"
#include "compiler/placement.h"
#include "compiler/programs.h"
#include "compiler/safetensors.h"
#include "models/gemma4/graph.h"
#include "runtime/plan/meta.h"
#include "runtime/plan/plan_format.h"
#include "runtime/src/frontend/media.h"

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace g4::stage {

using json = nlohmann::json;

inline uint64_t align_up(uint64_t v, uint64_t a) {
    return (v + a - 1) / a * a;
}
std::string shape_str(const std::vector<int64_t>& s); // "[2, 3]"
int64_t numel(const std::vector<int64_t>& d);
std::string human(uint64_t b); // "1.50 MiB"

// A plan being written (compiler/output_file.h): write failures throw; it replaces its path only on
// commit, and is deleted if never committed.
struct PlanFile {
    OutputFile f;
    explicit PlanFile(const std::string& path);
    void write_at(uint64_t off, const void* data, size_t n);
    void commit();
};

// The towers' session buffers and device figures, decided by the inputs stage (stage_towers.cpp) and
// read by the memory plan and placement.
struct TowerSizing {
    uint64_t vision_gpu_bytes = 0, audio_gpu_bytes = 0; // their device buffers on the plan's GPU
    std::string vision_gpu_no, audio_gpu_no;            // why one cannot run there ("" = it can)
    rt::MediaSizing z_cpu; // the towers' host buffers with both towers on the CPU (media_create's sizing)
    // Host buffers: the patch grid's cells (vision, on either device); per-thread scratch floats of the CPU
    // programs, of the log-mel front end (all the audio tower needs on the host when the GPU runs its
    // program) and of image preprocessing.
    size_t vision_host_bytes = 0, vision_thread_floats = 0, audio_thread_floats = 0, audio_feature_floats = 0,
           preprocess_floats = 0;
    // The host buffers with the vision / audio tower on the GPU.
    rt::MediaSizing sizing(bool vision_gpu, bool audio_gpu) const;
};

// Everything decided once per compile and shared by the plan and the fidelity reference plan.
struct Inputs {
    Inputs(const CompileOptions& o, ModelConfig m) : opt(o), mc(std::move(m)) {}
    const CompileOptions& opt;
    ModelConfig mc;
    std::unique_ptr<st::Checkpoint> ckpt;
    std::unique_ptr<lora::Adapter> adapter;
    int max_context   = 0;
    bool prequantized = false; // base checkpoint is bitsandbytes 4-bit
    // META's parts the stages fill (provenance and tokenizer: inputs; towers: check_towers and placement;
    // placement and memory: placement); plan_meta adds the rest.
    plan::Meta meta;
    std::string tokenizer_json; // embedded verbatim as the TOKENIZER section ("" = none)
    std::string kv_dtype_name;  // "bf16" | "f32"
    int cuda_index = -1;        // CUDA plans: device index, target and kernels
    std::string cuda_target;
    cuda::KernelSpec cuda_spec; // the model constants the kernels are compiled for
    std::vector<char> cubin;
    std::string ptx;
    bool kernels_cached = false;      // cubin and PTX came from the kernel cache (cuda_compile.h)
    DType kv_dtype      = DType::F32; // KV cache storage (the fidelity reference plan keeps f32)
    std::vector<int>
        layer_device; // CUDA plans: each text layer's device, -1 the CPU (empty: all on cuda_index)
    // Vision/audio towers compiled into the plan (Mode::Plan only; they run on the CPU): their weights'
    // HF names relative to "model.", host bytes a session adds (META "towers": meta.towers).
    std::vector<std::string> tower_names;
    std::vector<EncoderProgram> encoders; // encoder programs after the text program (Mode::Plan only)
    uint64_t tower_session_bytes = 0;
    TowerSizing towers;
};

// The compile report's figures, filled by the stages.
struct Report {
    struct Group {
        uint64_t before = 0, after = 0;
        int tensors = 0;
    };
    std::map<std::string, Group> groups;
    std::vector<std::string> merged; // adapter modules merged
    std::map<std::string, std::string> tensor_dtype;
    uint64_t weights_bytes = 0, act_arena = 0, kv_arena = 0, cuda_workspace = 0, cuda_pinned = 0,
             cpu_scratch_per_thread = 0;
    uint64_t ple_table_bytes        = 0; // part of weights_bytes; in host memory with --place ple=host
    uint64_t host_weights           = 0,
             host_kv       = 0; // CPU-placed layers: parts of weights_bytes / kv_arena in host memory
    uint64_t tower_weights = 0; // vision/audio towers: part of weights_bytes, host memory
    uint64_t vision_begin  = 0,
             vision_end    = 0; // the vision tower's weights within WEIGHTS (a GPU vision tower uploads them)
    uint64_t audio_begin = 0, audio_end = 0; // the audio tower's (likewise)
    uint64_t encoder_arenas = 0; // CPU encoder programs' activation arenas, as a session allocates them
    uint64_t audio_arena    = 0; // the audio program's part of them
    // The vision / audio program's device memory where it runs on the plan's GPU: its arena and launch
    // records.
    uint64_t vision_program_gpu = 0, audio_program_gpu = 0;
    uint64_t lm_screen         = 0; // the LM head's int8 screening copy where the schedule's head takes one
    uint64_t lm_screen_session = 0; // CUDA: a session's screening bounds and threshold (with lm_screen)
    std::map<int, placement::Figures::Gpu> gpus; // cross-device plans: per GPU
    cross_device::Stats cross;
    std::string kv_dtype;
    int sliding_slots = 0;
    size_t n_ops = 0, n_tensors = 0, ignored_text = 0, ignored_other = 0;
};

enum class Mode {
    Plan,
    Reference,
    CpuTwin
}; // CpuTwin: the plan's weights, for the CPU (fidelity of CUDA plans). Reference: every quantized or
   // merged weight as f32 (the full-precision model the fidelity figure compares against).

// One plan before it is written: the program, each tensor's storage and place, the records.
struct BuiltPlan {
    Mode mode = Mode::Plan;
    gemma4::BuildOptions bo;
    gemma4::Program prog;
    size_t n_text_tensors = 0;          // tower weights follow
    std::vector<ProgramRange> programs; // [0] text (with the tower weights), then the encoder programs
    size_t n_text_ops = 0;
    std::vector<plan::PlanProgram> program_table;
    bool hybrid = false;
    std::map<std::string, bool> targeted; // checkpoint names the adapter merges into or replaces
    std::vector<uint64_t> act_off, off, nbytes;
    uint64_t act_arena = 0, kv_arena = 0, weights_size = 0;
    int64_t max_k = 1;
    std::vector<int> op_dev; // per op: CUDA index or -1 (the CPU); cross-device plans only
    std::vector<int> gpus;   // GPUs that run ops, the plan's GPU first
    std::vector<int> group;  // layout group of each weight / cache
    int towers_group  = 0;
    size_t host_group = 0;
    std::vector<size_t> worder, kvorder;  // weights in WEIGHTS order; caches in KV-arena order
    std::vector<uint64_t> wstart, kstart; // where each layout group starts (and, last, the end)
    std::string strings;
    std::vector<plan::PlanTensor> tensors;
    std::vector<plan::PlanOp> ops;
    std::vector<plan::CudaLaunch> schedule;
};

// Inputs (stage_inputs.cpp, stage_towers.cpp).
struct CheckedOptions {
    int cuda_index = -1;
    placement::Request place_req;
};
CheckedOptions check_options(const CompileOptions& opt);
// KV dtype, CUDA target and kernel spec; returns the GPUs here (-1: not queried or none).
int resolve_device(Inputs& in, int cuda_index);
void resolve_context(Inputs& in);
void load_tokenizer(Inputs& in);
void open_checkpoint(Inputs& in); // and the adapter's shapes against it
void record_provenance(Inputs& in);
void compile_cuda_kernels(Inputs& in);
// META "towers" as the stages fill it (made on first use).
inline plan::MetaTowers& towers_meta(Inputs& in) {
    return in.meta.towers ? *in.meta.towers : in.meta.towers.emplace();
}
// Tower configs and weights checked, their buffers sized (in.towers, in.meta.towers), and where they
// may run recorded in `place`.
void check_towers(Inputs& in, placement::Placement& place);
// META's per-thread scratch and session figures of the towers' host buffers, sized as z.
void record_tower_sizing(Inputs& in, const rt::MediaSizing& z);

// Graph (stage_graph.cpp).
void build_graph(const Inputs& in, BuiltPlan& b, Report* rep);

// Weights (stage_weights.cpp).
bool is_tower(const gemma4::TensorDesc& d);
std::string tower_group_name(const std::string& name);
std::string source_of(const Inputs& in, const gemma4::TensorDesc& d);       // checkpoint name
std::string adapter_name_of(const Inputs& in, const gemma4::TensorDesc& d); // the adapter's name
bool is_targeted(const Inputs& in, const BuiltPlan& b, const std::string& hf);
void choose_storage(const Inputs& in, BuiltPlan& b, Report* rep);
void size_groups(const Inputs& in, const BuiltPlan& b, Report* rep); // report groups without reading
// Streams WEIGHTS at `wbase`: read, merge, convert, write; returns the section's checksum.
uint64_t stream_weights(const Inputs& in, const BuiltPlan& b, PlanFile& out, uint64_t wbase, Report* rep);

// Memory plan (stage_memory.cpp).
uint64_t plan_activations(gemma4::Program& p, std::vector<uint64_t>& offset);
// Every program's activations in its own arena (offset per tensor; ranges[k].arena_bytes set).
void plan_program_activations(const gemma4::Program& prog, std::vector<ProgramRange>& ranges,
                              std::vector<uint64_t>& offset);
void lay_out_memory(const Inputs& in, BuiltPlan& b, Report* rep);
void session_figures(const Inputs& in, const BuiltPlan& b, Report* rep);
// Graph, weights policy, memory plan and records of one plan (nothing read or written).
BuiltPlan build_plan(const Inputs& in, Mode mode, Report* rep);
// The exact memory plan of the plan to write, with the report's tensor groups (no weight read).
Report plan_memory(const Inputs& in);
placement::Figures figures_of(const Inputs& in, const Report& r, bool cpu_layers);
// The figures of the plan at another --max-context or layer split.
placement::Figures figures_with(Inputs& in, bool cpu_layers, int max_context,
                                const std::vector<int>& layer_device);

// Placement (stage_placement.cpp): the budgets checked against the memory plan, the layers split if
// needed, the towers placed; sets in.layer_device and in.placement_meta. `rep`: the plan's figures.
placement::Decision decide_placement(Inputs& in, placement::Placement& place,
                                     const placement::Request& place_req, Report& rep);

// Plan writer (stage_writer.cpp).
void make_records(const Inputs& in, BuiltPlan& b);
std::string plan_meta(const Inputs& in, const BuiltPlan& b, const Report& rep);
void write_plan(const Inputs& in, PlanFile* out_file, Mode mode, Report* rep);

// Report (stage_report.cpp).
struct DroppedModules {
    std::vector<std::string> shared, tower;
};
DroppedModules check_adapter_consumed(const Inputs& in);
void print_dry_run(std::ostream& log, const Inputs& in, const placement::Decision& mem, const Report& rep);
void print_report(std::ostream& log, const Inputs& in, const placement::Decision& mem, const Report& rep,
                  const DroppedModules& dropped);

// Fidelity (stage_fidelity.cpp): measured and printed for lossy plans.
void measure_fidelity(std::ostream& log, const Inputs& in, PlanFile& out, CompileReport* report);

} // namespace g4::stage
