// Memory budgets and component placement for `g4 compile` (--gpu-mem, --cpu-mem, --place): parsing,
// validation against the model and the plan's device, the per-device memory plan, and the budget
// check that refuses a plan that does not fit (naming the smallest budget that would). Grammar and
// behaviour: docs/placement.md.
//
//   --gpu-mem [IDX:]SIZE   repeatable; no IDX: the plan's GPU (--device cuda[:N])
//   --cpu-mem SIZE         host memory (CPU plans: everything; CUDA plans: pinned buffers, ple=host)
//   --place LIST           LIST  := ITEM (',' ITEM)*
//                          ITEM  := COMPONENT '=' TARGET | 'layers=' LAYERS
//                          LAYERS:= TARGET | RANGE (',' RANGE)*      (an item that starts with a digit
//                          RANGE := N ['-' M] ':' TARGET               continues the layers= before it)
//                          COMPONENT := vision | audio | ple | embed | lm_head
//                          TARGET := cpu | gpu | gpuN | cuda | cuda:N | host (ple only)
//   SIZE := DIGITS ['.' DIGITS] [B | KiB | MiB | GiB | TiB | KB | MB | GB | TB]   (units case-insensitive)
#pragma once
#include "runtime/plan/meta.h"

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace g4::placement {

// "12GiB", "4GB", "512MiB", "3.5GiB", "1000000" -> bytes (rounded down). Throws g4::CompileError naming
// `flag`.
uint64_t parse_size(const std::string& text, const std::string& flag);
// The shortest "7.32GiB"-style value (two decimals) that parse_size reads back as at least `bytes`.
std::string size_arg(uint64_t bytes);
std::string human(uint64_t bytes); // "7.31 GiB"

struct GpuBudget {
    int index      = -1; // -1: the plan's GPU
    uint64_t bytes = 0;
    std::string arg; // as given ("0:6GiB")
};
GpuBudget parse_gpu_mem(const std::string& arg);

struct Target {
    enum class Kind { Cpu, Gpu, Host };
    Kind kind = Kind::Gpu;
    int gpu   = -1;   // Kind::Gpu: device index; -1: the plan's GPU
    std::string text; // as written
};

struct LayerRange {
    int first = 0, last = 0; // inclusive
    Target target;
    std::string text; // "0-29:gpu0"
};

// What --place said; components it does not name keep their defaults.
struct PlaceSpec {
    std::map<std::string, Target> components; // vision, audio, ple, embed, lm_head
    std::optional<Target> layers_all;         // layers=TARGET
    std::vector<LayerRange> layers;           // layers=A-B:TARGET,...
    std::string text;                         // the whole list, for messages
};
PlaceSpec parse_place(const std::string& list);

// The options, parsed (syntax only); throws g4::CompileError.
struct Request {
    PlaceSpec place;
    std::vector<GpuBudget> gpu_mem;
    std::optional<uint64_t> cpu_mem;
    std::string cpu_mem_arg;
};
Request parse_request(const std::vector<std::string>& gpu_mem, const std::string& cpu_mem,
                      const std::string& place);

// Where everything goes, validated against the model and the plan's device.
struct Placement {
    int cuda_index = -1; // the plan's GPU; -1: CPU plan
    int num_layers = 0;
    int sessions   = 1; // sessions the memory plan counts (memory_plan: per-session parts that many times)
    std::map<int, GpuBudget> gpu_budgets; // by device index
    std::optional<uint64_t> cpu_budget;
    std::string cpu_budget_arg;
    bool ple_host = false;                     // the PLE table stays in pinned host memory (CUDA plans)
    bool ple_auto = false;                     // ple not placed by --place: the budget check decides
    std::string ple_why;                       // why ple_host was chosen automatically
    std::map<std::string, std::string> towers; // vision/audio -> what --place asked for
    // vision/audio -> where the compiled plan has it: "cpu", "not in the checkpoint", "left out
    // (--no-vision)" (set by the compiler once it knows the checkpoint; META placement and the report line)
    std::map<std::string, std::string> tower_where;
    // The vision / audio tower on the plan's GPU (CUDA plans): *_gpu where it is (--place vision=gpu, or
    // decided by decide()), *_auto: decide() puts it there when it fits beside everything else (no vision= /
    // audio= in --place and the tower can run there); *_why says why it stayed on the CPU.
    bool vision_gpu  = false;
    bool vision_auto = false;
    std::string vision_why;
    bool audio_gpu  = false;
    bool audio_auto = false;
    std::string audio_why;
    // CUDA plans whose text layers span devices: each layer's device, -1 for the CPU or a CUDA index
    // (empty: every layer on the plan's GPU). Embeddings, PLE and LM head stay on the plan's GPU.
    std::vector<int> layer_device;
    // Decode steps screen the LM head with its int8 copy on the plan's GPU (decide(): where the schedule's
    // head takes one, the plan runs on that GPU alone, and the copy fits its budget beside everything else).
    bool lm_screen = false;
    bool hybrid() const { return !layer_device.empty(); }
    bool layer_on_cpu(int l) const { return hybrid() && layer_device[l] < 0; }
    bool has_cpu_layers() const;
    std::vector<int> gpus() const;  // GPUs that run something, the plan's GPU first
    std::vector<std::string> notes; // report lines
};
// gpu_count: GPUs on this machine, or -1 when they cannot be (or are not to be) queried.
Placement resolve(const Request& req, int num_layers, int cuda_index, int gpu_count);

// Exact bytes of one plan, from the compiler's memory plan.
struct Figures {
    uint64_t weights = 0, ple_table = 0, activations = 0, kv_cache = 0, attention_workspace = 0;
    uint64_t scratch_per_thread = 0; // CPU plans, per worker thread
    uint64_t pinned             = 0; // CUDA plans: pinned host buffers (ids, logits, step)
    uint64_t lm_screen          = 0; // the LM head's int8 screening copy (0: the head takes none)
    uint64_t lm_screen_session  = 0; // CUDA plans: a session's screening bounds (with lm_screen)
    std::string kv_dtype;            // "f32" | "bf16": named in the KV cache's label when set
    // CUDA plans with CPU-placed layers (part of the totals above, held in host memory): the CPU
    // layers' weights and KV caches (mirrors of GPU donors' caches included), the host copy of the
    // activation arena, and the CPU kernels' scratch per worker thread.
    uint64_t host_weights = 0, host_kv = 0, host_activations = 0, host_scratch_per_thread = 0;
    // Vision/audio towers (host memory, CPU plans included): their weights (part of `weights`) and the
    // buffers a session allocates for them (scratch, image/audio input, queued soft tokens, thread scratch).
    uint64_t tower_weights = 0, tower_buffers = 0;
    // The activation arenas of the encoder programs the CPU runs (host memory; the vision program's is not
    // allocated when the vision tower runs on the GPU).
    uint64_t encoder_arenas = 0;
    uint64_t audio_arena = 0; // the audio program's part (not allocated when the audio tower runs on the GPU)
    // A tower on the plan's GPU instead: its weights (part of tower_weights) and device buffer move there,
    // and the towers' host buffers shrink to tower_buffers_vision_gpu (the vision tower there),
    // tower_buffers_audio_gpu (the audio tower) or tower_buffers_both_gpu (both).
    uint64_t vision_weights = 0, vision_gpu_buffers = 0, tower_buffers_vision_gpu = 0;
    uint64_t audio_weights = 0, audio_gpu_buffers = 0, tower_buffers_audio_gpu = 0,
             tower_buffers_both_gpu = 0;
    // Cross-device CUDA plans, per GPU (CUDA index): the weights it uploads (the PLE table included),
    // its part of the KV arena and its workspaces; each GPU also holds a whole activation arena.
    // Empty: the plan's GPU holds weights - host_weights, kv_cache - host_kv, attention_workspace.
    struct Gpu {
        uint64_t weights = 0, kv = 0, workspace = 0;
    };
    std::map<int, Gpu> gpus;
};

struct DeviceMemory {
    std::string device;                                  // cuda:N | host (CUDA plans) | cpu (CPU plans)
    std::vector<std::pair<std::string, uint64_t>> parts; // what it holds
    uint64_t per_thread = 0;                             // cpu: scratch per worker thread
    int threads         = 0;                             // worker threads counted (0: not known)
    int sessions        = 1;                             // per_thread is each session's threads'
    std::optional<uint64_t> budget;
    std::string budget_flag; // "--gpu-mem 0:6GiB"
    uint64_t need() const;   // parts + per_thread * threads * sessions
};
// Each session's parts (activations, KV cache, workspaces, pinned and tower buffers, scratch) count
// p.sessions times, labelled "(N sessions)"; weights, the PLE table and the screening copy once.
std::vector<DeviceMemory> memory_plan(const Figures& f, const Placement& p, bool ple_host, int threads);

struct Decision {
    Placement placement;
    std::vector<DeviceMemory> memory;
    void to_meta(plan::Meta* m) const;  // META "placement" and "memory"
    std::string placement_line() const; // one report line
};
// Fits the plan into the budgets: with ple_auto, everything on the GPU if it fits, else the PLE table
// in host memory; with vision_auto / audio_auto, the towers on the GPU where they fit beside the PLE table
// (the PLE table first, then the vision tower, then the audio tower). Otherwise throws g4::CompileError with
// both figures, the smallest budget that fits and the largest --max-context that would fit (figures_at(n):
// the plan's figures at --max-context n).
Decision decide(const Placement& p, const Figures& f, int max_context,
                const std::function<Figures(int)>& figures_at, int threads);

// Automatic layer split (no layers= in --place, budgets for several GPUs) for a plan that does not
// fit on its GPU: contiguous ranges over the budgeted GPUs, the plan's GPU first, each GPU taking as
// many layers as fit in its budget (the PLE table on the GPU, else with ple_auto in host memory).
// figures_for(layer_device): the plan's figures with that split. Returns the placement (layer_device
// set, an unsplit result never) or nothing when no such split fits.
std::optional<Placement> split_layers(const Placement& p,
                                      const std::function<Figures(const std::vector<int>&)>& figures_for,
                                      int threads);
bool layers_placed(const Request& req); // --place names the text layers

// The per-device table (compile report, --dry-run, g4 inspect).
void print_memory(std::ostream& out, const std::vector<DeviceMemory>& mem, const std::string& indent);

} // namespace g4::placement
