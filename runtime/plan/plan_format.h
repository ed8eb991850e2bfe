// The g4 plan file, format v1.2: the only contract between compiler and runtime. Little-endian POD.
//
//   [PlanHeader 64 B][PlanSection x section_count][sections, each 4096-aligned]
//   META     JSON: hyper-parameters, program sizes, generation defaults, provenance
//   STRINGS  NUL-terminated names referenced by tensors and ops
//   TENSORS  PlanTensor records: weights (in WEIGHTS), activations (arena offsets), KV caches, inputs
//   OPS      PlanOp records: the program the runtime replays, in order
//   WEIGHTS  tensor bytes, each kWeightAlign (256) aligned (the reader requires kTensorAlign), used in place
//   from the mmap (CPU) or uploaded (CUDA) TOKENIZER tokenizer.json text; CUBIN/PTX the CUDA kernels compiled
//   for the plan's target CUDA_SCHEDULE CudaLaunch records: the launches of one decode step (fused kernels),
//   CUDA plans only
//
// Every section has its FNV-1a 64 checksum in the section table, and (from format 1.1) the table has its
// own in the header's reserved0. The header, the table and every section but WEIGHTS are verified at every
// load; WEIGHTS, gigabytes used in place from the mapping, on request (g4 inspect --verify,
// g4_engine_params.verify_weights). A 1.0 plan (no table checksum) still loads. Compatibility
// (docs/plan-format.md): plans of every minor version up to kFormatMinor of this major open; another major, a
// newer minor or a schema hash neither current nor in kReadableSchemas refuses the plan.
#pragma once
#include "kernels/ops.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace g4::plan {

inline constexpr char kMagic[8]         = {'G', '4', 'P', 'L', 'A', 'N', 0, 0};
inline constexpr uint16_t kFormatMajor  = 1;
inline constexpr uint16_t kFormatMinor  = 5; // docs/plan-format.md "Versions" says what each minor added
inline constexpr uint64_t kSectionAlign = 4096;
inline constexpr uint64_t kTensorAlign  = 64; // what the reader requires of every tensor's offset
// What the compiler gives each weight (in WEIGHTS; a GPU's copy keeps offsets modulo it, cuda/backend.cpp).
// At 64 bytes each text layer's tensors took up an odd number of 64-byte units (its one-float layer
// scalar), so every other layer's matrices started half a 128-byte line off; the fused decode MLP, whose
// 8-lane groups read 128 bytes of a row at a time, ran 2.4-4.6% slower on exactly those layers (on an
// H100, traced with bench/scripts/trace_lab.sh).
inline constexpr uint64_t kWeightAlign = 256;

enum class SectionKind : uint32_t {
    Meta         = 1,
    Strings      = 2,
    Tensors      = 3,
    Ops          = 4,
    Weights      = 5,
    Tokenizer    = 6,
    Cubin        = 7,
    Ptx          = 8,
    CudaSchedule = 9,
    Programs     = 10, // PlanProgram records (format >= 1.2; absent: one program "text", every op and tensor)
};

struct PlanHeader {
    char magic[8];
    uint16_t format_major;
    uint16_t format_minor;
    uint32_t header_size; // sizeof(PlanHeader)
    uint64_t file_size;   // whole file; a shorter file is truncated
    uint64_t section_table_offset;
    uint32_t section_count;
    uint32_t flags;
    uint64_t schema_hash; // schema_hash() of the writer
    uint64_t reserved0;   // format >= 1.1: FNV-1a 64 of the section table (0 in 1.0 plans)
    uint32_t reserved1;
    uint32_t header_checksum; // low 32 bits of FNV-1a over the header with this field zeroed
};
static_assert(sizeof(PlanHeader) == 64);

struct PlanSection {
    uint32_t kind; // SectionKind
    uint32_t reserved;
    uint64_t offset; // from file start, kSectionAlign-aligned
    uint64_t size;
    uint64_t checksum; // FNV-1a 64 of the section bytes
};
static_assert(sizeof(PlanSection) == 32);

enum class TensorKind : uint8_t { Weight = 0, Activation = 1, KvCache = 2, Input = 3 };

struct PlanTensor {
    uint32_t name; // offset into STRINGS
    uint8_t dtype; // g4::DType
    uint8_t kind;  // TensorKind
    uint8_t ndim;  // 1..4
    uint8_t flags;
    int64_t dims[4]; // Activation/Input: dims[0] = max rows of a step
    uint64_t offset; // Weight: in WEIGHTS; Activation/Input: in activation arena; KvCache (f32 or bf16): in
                     // KV arena
    uint64_t nbytes; // NF4: the whole blob (kernels/nf4.h)
    uint32_t quant_flags; // NF4: kQuantDoubleQuant
    uint32_t reserved;
};
static_assert(sizeof(PlanTensor) == 64);

inline constexpr uint32_t kQuantDoubleQuant = 1;
// NF4 [H, I] stored tiled for the fused decode MLP and attention-o (LaunchKind::Mlp / AttnO, CUDA sm_90
// plans): the same blob parts, codes as [I / 32][H][16 bytes] (slice j holds columns 32j..32j+31 of every
// row) and absmax as [I / 64][H]; absmax2 (double quant) keeps the row-major block index r * I / 64 + c / 64.
// For every other use (prefill) the CUDA runtime dequantizes it to bf16 in place (the cuBLAS tier) or first
// puts codes and absmax back in row-major order (g4_nf4_untile32, into scratch); CPU kernels refuse it.
inline constexpr uint32_t kQuantTiled32 = 2;
// What a weight is (PlanTensor.flags of weights): the compiler's storage policy decides per role. The runtime
// reads PleTable (a table gathered a few rows a step, which may stay in host memory: META placement.ple),
// Tower and TowerScalar.
enum class WeightRole : uint8_t {
    AttnProj    = 0,  // attention q/k/v/o projections
    MlpProj     = 1,  // gate/up/down
    Embedding   = 2,  // the token embedding (also a tied LM head)
    PleTable    = 3,  // the per-layer embedding table, gathered by token id
    PleProj     = 4,  // projections of the per-layer inputs
    Norm        = 5,  // RMSNorm weights
    Scalar      = 6,  // a layer's scalar
    Constant    = 7,  // computed by the compiler (RoPE inverse frequencies), always f32
    LoraBias    = 8,  // bias added by a LoRA adapter, f32 [N]
    Tower       = 9,  // vision/audio tower weight (read by runtime/src/towers on the CPU, never uploaded)
    TowerScalar = 10, // a tower's 0-d tensor, stored as [1]
};
inline constexpr uint8_t kRoleTower       = (uint8_t)WeightRole::Tower,
                         kRoleTowerScalar = (uint8_t)WeightRole::TowerScalar;

// Which rows an op processes in a step of T rows with R = out_rows logits requested.
enum class RowMode : int32_t {
    All     = 0, // rows 0..T-1
    TailIn  = 1, // inputs rows T-R..T-1, outputs rows 0..R-1 (final norm)
    OutRows = 2, // rows 0..R-1 (LM head, softcap)
};

struct PlanOp {
    uint16_t code;  // g4::OpCode
    uint16_t layer; // decoder layer, 0xFFFF for none
    uint32_t name;  // name of the op's result, offset into STRINGS
    int32_t in[4];  // tensor indices, -1 = unused
    int32_t out[2];
    int32_t in_col[4]; // column offset of each input view
    int32_t out_col[2];
    int32_t row_mode; // RowMode
    int32_t ip[7];    // integer parameters (see compiler/graph and runtime/executor)
    float fp[4];      // float parameters
};
static_assert(sizeof(PlanOp) == 104);

inline constexpr uint16_t kNoLayer = 0xFFFF;

// ---- Programs (section PROGRAMS, format >= 1.2) ----------------------------------------------------------
// A plan holds several op programs: "text" (the decoder, stepped by the runtime; always first) and one per
// media encoder, run once per input by name. Program i owns ops [op_begin, op_end) and tensors [tensor_begin,
// tensor_end), both contiguous and disjoint between programs, in order. Its activations and inputs have
// offsets in its own activation arena of arena_bytes on its device (the text program's arena is META
// program.act_arena_bytes). A run of a non-text program passes up to kMaxRowCounts row counts; an op with
// row_mode kRowCountBase + k runs over row count k (inputs and outputs; an op reading rows of another count
// names that count in its parameters), and every count is at most max_rows[k].
inline constexpr int kMaxRowCounts     = 4;
inline constexpr int32_t kRowCountBase = 16;
struct PlanProgram {
    uint32_t name;  // offset into STRINGS: "text", "vision", ...
    int32_t device; // -1 the CPU, else a CUDA device index
    uint32_t op_begin, op_end;
    uint32_t tensor_begin, tensor_end;
    uint64_t arena_bytes;
    int32_t inputs[4];               // Input tensors the caller fills before a run (-1 = none), in its rows
    int32_t outputs[2];              // Activation tensors the caller reads after a run (-1 = none)
    int32_t max_rows[kMaxRowCounts]; // bound of each row count (0: unused)
    uint64_t thread_floats;          // per-thread scratch its CPU kernels need (floats)
    uint64_t reserved;
};
static_assert(sizeof(PlanProgram) == 88);

// CUDA kernel variants chosen by the compiler for a matmul (PlanOp.ip[5] for decode steps of one
// row, ip[6] for prefill chunks); CPU plans ignore them.
enum class MatmulVariant : int32_t {
    PerRow     = 0, // one warp per output row (any shape, fp32 arithmetic)
    Gemv4      = 1, // decode: 4 rows per warp (NF4 K % 512 == 0, bf16 K % 256 == 0)
    Tiled64    = 2, // prefill: 64x64 tiles, fp32 arithmetic (K % 32 == 0)
    TensorCore = 3, // prefill: mma.sync bf16 operands, fp32 accumulate (K % 32 == 0)
    Cublas     = 4, // prefill: bf16 operands (NF4 dequantized to a scratch matrix), cuBLAS GEMM with
                    // fp32 accumulate; the runtime falls back to TensorCore where libcublas is absent
};

// The CUDA decode schedule (section CUDA_SCHEDULE): what one decode step launches, in order. The
// compiler (compiler/cuda_schedule.cpp) fuses op sequences into one kernel where it can; every op of
// OPS is covered by exactly one record. t[] are tensor indices (-1 = none), per kind:
enum class LaunchKind : uint16_t {
    Op      = 0, // op `op` with its own kernel
    ResNorm = 1, // x_out = (x + rms(d) * post_w) * fp1 * scalar; xn = rms(x_out) * pre_w
                 //   t: 0 x, 1 d (-1: no residual branch, x_out = x * fp1 * scalar), 2 post_w, 3 scalar,
                 //   4 x_out (-1: not written), 5 pre_w, 6 xn (-1: not computed), 7 zeroed after (the
                 //   next Mlp's y, or -1); ip0 cols; fp0 eps; ip1 1: folded into the GatedProj launch after
                 //   it (g4_resnorm_gated_proj runs it; nothing launched here; the Mlp before it, 256 threads
                 //   and one output, runs its _z kernel, which zeroes t7; no t3, t5, t6); ip1 2: folded into
                 //   the packed-f16 Mlp launch after it, whose input is t6 (its _r kernel runs it; nothing
                 //   launched here; t7 is that Mlp's output; no t3; mlp_res_fits); ip2 the tensor + 1 of a
                 //   second buffer zeroed (g4_resnorm_z2; 0: none): the output of an Mlp after it whose
                 //   ResNorm has ip1 2 (not on a ResNorm summing output replicas)
    Gemv = 2,    // ip0..2 matmul ops sharing x (ip3 of them); ip4 epilogue (0 store, 1 gelu(gate) * up,
                 //   2 gelu(y) * aux, 3 softcap); ip5 lanes per weight row (8..128); t0 aux, ip6 aux
                 //   column, t1 epilogue output; fp0 softcap
    QkvPost = 3, // q_norm, q_rope [, k_norm, k_rope, v_norm, kv_store] (count 2 or 6) in one kernel
    QkvAttn = 4, // QkvPost's ops and the decode Attention op after them (count 3 or 7) in the attention
                 //   kernel; QkvPost's fields, ip4 the number of QkvPost ops (2 or 6)
    Mlp = 5,     // gate, up, GeluMul, down (count 4) in g4_mlp_nf4 (sm_90; the down weight kQuantTiled32);
                 //   ip0 gate op, ip1 up op, ip3 down op, ip5 threads a block (128 | 256: g4_mlp_nf4_b256);
                 //   adds into the down's output, which the ResNorm launch before it zeroes (its t7);
                 //   ip6 output replicas R (1..kMlpReplicasMax): R > 1, block j adds into replica j % R
                 //   (0: the output itself, r > 0: the session's replica buffer [R - 1, H]) and the next
                 //   launch is the ResNorm whose d (t1) is that output, which sums and re-zeroes them
                 //   ip7 arithmetic: 0 f32 (g4_mlp_nf4*), 1 packed f16 products (g4_mlp_nf4*_h2: f32 block
                 //   scales only, H % 32 == 0, H <= kMlpF16MaxH)
    AttnO = 6, // the o projection (count 1, an NF4 Matmul of the attention's output, weight kQuantTiled32) in
               //   g4_attn_o_nf4_g* with the decode attention's merge (sm_90): ip1 the Attention op (run by
               //   the launch before, which then leaves its partials unmerged); adds into the o output, which
               //   the ResNorm launch before the layer's q/k/v projection zeroes (its t7)
    // a gate (bf16 Matmul), GeluMul with a multiplier (aux), projection (bf16 Matmul)
    // (count 3) in g4_gated_proj_bf16_g* (sm_90); adds into the projection's output, which the ResNorm launch
    // before it zeroes (its t7; when that ResNorm is folded in, ip1 = 1: g4_resnorm_gated_proj_bf16_g*, and
    // the Mlp before zeroes it)
    GatedProj = 7,
    // Scale(ctx), RmsNorm(ctx, groups of ip1 = P, weight t1), Add(ctx, tok t2) -> out t3, Scale(out) (count
    // 4; the scales' fp0 and the norm's eps read from the ops) in g4_group_norm_add; t0 ctx; ip0 N (a
    // multiple of P <= 1024)
    GroupNormAdd = 8,
};
struct CudaLaunch {
    uint16_t kind;  // LaunchKind
    uint16_t count; // ops covered: op .. op + count - 1
    int32_t op;     // first op covered (its name and layer identify the launch in errors)
    int32_t t[8];
    int32_t ip[8];
    float fp[2];
};
static_assert(sizeof(CudaLaunch) == 80);
// Most output replicas of a fused decode MLP (CudaLaunch ip6; kernels/cuda/decode_mlp.cu RN_MAX is one less).
inline constexpr int kMlpReplicasMax = 4;
// The packed-f16 MLP (Mlp ip7 = 1): H at most this (kernels/cuda/decode_gemv.cu GV_XS_EXT_CHUNKS * 32: the x
// chunks' powers of two).
inline constexpr int64_t kMlpF16MaxH = 10240;
inline bool mlp_f16_width_ok(int64_t H) {
    return H % 32 == 0 && H <= kMlpF16MaxH;
}
// Whether the packed-f16 MLP kernels of `threads` a block can run the ResNorm before them (ResNorm ip1 = 2,
// the _r kernels: each thread keeps up to decode_mlp.cu mlp_rv float4s of the input in registers, 5 at 128
// threads, 3 at 256): H <= 2560 at 128 threads, 3072 at 256.
inline bool mlp_res_fits(int64_t H, int threads) {
    const int rv = threads == 128 ? 5 : threads == 256 ? 3 : 0;
    return H > 0 && H % 4 == 0 && (H / 4 + 31) / 32 * 32 <= (int64_t)threads * rv;
}

// cuBLAS workspace a CUDA session preallocates when the plan has Cublas matmuls (NVIDIA's advice for Hopper).
inline constexpr uint64_t kCublasWorkspaceBytes = 32ull << 20;

inline uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

// The schema: everything whose drift between compiler and runtime would silently change meaning, as text
// derived from the record layouts (each field's name, offset and size), the enums the records hold, each op's
// parameter table (op_params.h) and the CUDA schedule's launch conventions (schema.cpp), and its FNV-1a 64
// hash, which every plan's header carries.
const std::string& schema_text();
uint64_t schema_hash();

// Schemas of earlier plans of this major that the reader still reads (docs/plan-format.md, "Compatibility"):
// a change to the schema string above that the reader can handle for plans written before it bumps
// kFormatMinor and appends the previous schema_hash() here with the minor that wrote it; a change it cannot
// handle bumps kFormatMajor and empties the list. Plans of every minor up to kFormatMinor carry the current
// hash until then.
struct ReadableSchema {
    uint16_t minor;
    uint64_t hash;
};
// 1.0 and 1.1: the schema strings typed by hand before the hash was derived from the layouts (same records;
// the second after the fused kernels were renamed by what they compute). A CUDA plan of an earlier schema is
// refused all the same (plan_reader.cpp): its kernels carry the names and arguments of the g4 that compiled
// it.
inline constexpr std::array<ReadableSchema, 6> kReadableSchemas{{{0, 0xe43b8582d95ce1bfull},
                                                                 {1, 0xe43b8582d95ce1bfull},
                                                                 {0, 0xd15d4690b9817fcfull},
                                                                 {1, 0xd15d4690b9817fcfull},
                                                                 {2, 0x5f060eb24fd09e26ull},
                                                                 {3, 0x5f060eb24fd09e26ull}}};

// True if a plan of minor version `minor` (<= kFormatMinor) with schema hash `hash` can be read.
inline bool schema_readable(uint64_t hash, uint16_t minor) {
    if (hash == schema_hash()) return true;
    for (const ReadableSchema& r : kReadableSchemas)
        if (r.hash == hash && r.minor == minor) return true;
    return false;
}

} // namespace g4::plan
