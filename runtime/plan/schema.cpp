// The plan schema (plan_format.h schema_text / schema_hash): derived from the record layouts (each field's
// name, offset and size), the enums the records hold and the op parameter tables (op_params.h), plus the
// launch-record conventions of the CUDA schedule, which are not typed records yet.
#include "runtime/plan/op_params.h"
#include "runtime/plan/plan_format.h"

#include <cstddef>
#include <string>

namespace g4::plan {

namespace {

struct FieldLayout {
    const char* name;
    size_t offset, size;
};
#define G4_FIELD(T, f)                                                                                       \
    FieldLayout {                                                                                            \
#f, offsetof(T, f), sizeof(T::f)                                                                     \
    }

constexpr FieldLayout kHeader[] = {
    G4_FIELD(PlanHeader, magic),         G4_FIELD(PlanHeader, format_major),
    G4_FIELD(PlanHeader, format_minor),  G4_FIELD(PlanHeader, header_size),
    G4_FIELD(PlanHeader, file_size),     G4_FIELD(PlanHeader, section_table_offset),
    G4_FIELD(PlanHeader, section_count), G4_FIELD(PlanHeader, flags),
    G4_FIELD(PlanHeader, schema_hash),   G4_FIELD(PlanHeader, reserved0),
    G4_FIELD(PlanHeader, reserved1),     G4_FIELD(PlanHeader, header_checksum)};
constexpr FieldLayout kSection[] = {G4_FIELD(PlanSection, kind), G4_FIELD(PlanSection, reserved),
                                    G4_FIELD(PlanSection, offset), G4_FIELD(PlanSection, size),
                                    G4_FIELD(PlanSection, checksum)};
constexpr FieldLayout kTensor[]  = {G4_FIELD(PlanTensor, name),        G4_FIELD(PlanTensor, dtype),
                                    G4_FIELD(PlanTensor, kind),        G4_FIELD(PlanTensor, ndim),
                                    G4_FIELD(PlanTensor, flags),       G4_FIELD(PlanTensor, dims),
                                    G4_FIELD(PlanTensor, offset),      G4_FIELD(PlanTensor, nbytes),
                                    G4_FIELD(PlanTensor, quant_flags), G4_FIELD(PlanTensor, reserved)};
constexpr FieldLayout kOp[]      = {
         G4_FIELD(PlanOp, code), G4_FIELD(PlanOp, layer),  G4_FIELD(PlanOp, name),    G4_FIELD(PlanOp, in),
         G4_FIELD(PlanOp, out),  G4_FIELD(PlanOp, in_col), G4_FIELD(PlanOp, out_col), G4_FIELD(PlanOp, row_mode),
         G4_FIELD(PlanOp, ip),   G4_FIELD(PlanOp, fp)};
constexpr FieldLayout kProgram[] = {G4_FIELD(PlanProgram, name),          G4_FIELD(PlanProgram, device),
                                    G4_FIELD(PlanProgram, op_begin),      G4_FIELD(PlanProgram, op_end),
                                    G4_FIELD(PlanProgram, tensor_begin),  G4_FIELD(PlanProgram, tensor_end),
                                    G4_FIELD(PlanProgram, arena_bytes),   G4_FIELD(PlanProgram, inputs),
                                    G4_FIELD(PlanProgram, outputs),       G4_FIELD(PlanProgram, max_rows),
                                    G4_FIELD(PlanProgram, thread_floats), G4_FIELD(PlanProgram, reserved)};
constexpr FieldLayout kLaunch[]  = {G4_FIELD(CudaLaunch, kind), G4_FIELD(CudaLaunch, count),
                                    G4_FIELD(CudaLaunch, op),   G4_FIELD(CudaLaunch, t),
                                    G4_FIELD(CudaLaunch, ip),   G4_FIELD(CudaLaunch, fp)};
#undef G4_FIELD

template <size_t N> void record(std::string* s, const char* name, size_t size, const FieldLayout (&f)[N]) {
    *s += name + std::to_string(size) + "(";
    for (size_t i = 0; i < N; ++i)
        *s += std::string(i ? "," : "") + f[i].name + "@" + std::to_string(f[i].offset) + ":" +
              std::to_string(f[i].size);
    *s += ");";
}

template <class P> void op_schema(std::string* s) {
    using T = OpTable<P>;
    static_assert(sizeof(P) > 0);
    *s += std::string(op_name(T::code)) + std::to_string((int)T::code) + "(" + T::inout + ";";
    for (const auto& f : T::fields)
        *s += std::string(f.name) + (f.i ? ":ip" : ":fp") + std::to_string(f.slot) + ",";
    *s += "),";
}

// Every parameter in a slot its record has, no two fields in one slot.
template <class P> constexpr bool slots_ok() {
    const auto& fs = OpTable<P>::fields;
    for (size_t a = 0; a < fs.size(); ++a) {
        if ((fs[a].i != nullptr) == (fs[a].f != nullptr)) return false;
        if (fs[a].i && fs[a].lo > fs[a].hi) return false;
        if (fs[a].slot >= (fs[a].i ? std::size(PlanOp{}.ip) : std::size(PlanOp{}.fp))) return false;
        for (size_t b = 0; b < a; ++b)
            if ((fs[b].i != nullptr) == (fs[a].i != nullptr) && fs[b].slot == fs[a].slot) return false;
    }
    return true;
}
template <class... P> constexpr bool all_slots_ok(std::tuple<P...>*) {
    return (slots_ok<P>() && ...);
}
static_assert(all_slots_ok((AllOpParams*)nullptr),
              "an op parameter table names a slot twice or out of range, or an empty range");

// Every op code has one name (kernels/ops.h kOpNames, in code order) and one parameter table.
template <class P> constexpr bool named() {
    for (const OpName& n : kOpNames)
        if (n.code == OpTable<P>::code) return true;
    return false;
}
template <class... P> constexpr bool names_match_tables(std::tuple<P...>*) {
    for (size_t i = 1; i < std::size(kOpNames); ++i)
        if (kOpNames[i - 1].code >= kOpNames[i].code) return false;
    return sizeof...(P) == std::size(kOpNames) && (named<P>() && ...);
}
static_assert(names_match_tables((AllOpParams*)nullptr),
              "kOpNames and AllOpParams must list the same op codes, kOpNames in code order");

template <class... P> void ops_schema(std::string* s, std::tuple<P...>*) {
    (op_schema<P>(s), ...);
}

// The CUDA schedule's per-kind conventions (LaunchKind's comments) and the arguments the runtime passes to
// the plan's own fused kernels: not derivable from a layout, so kept here. Edit it with LaunchKind.
constexpr char kLaunchConventions[] =
    "launch(op0,resnorm1(t1|t4|t6:-1=none,t7:zero,ip1:folded_into_gated_proj|mlp,ip2:zero2+1),gemv2,qkvpost3,"
    "qkvattn4(ip4:post_ops),mlp5(ip0:gate,ip1:up,ip3:down,ip5:threads,ip6:replicas,ip7:f16x2),attn_o6(op:o,"
    "ip1:attention(its merge here),t0:y),gated_proj7(ops:gate,gelu_mul,proj;t0:y),group_norm_add8(t0:ctx,"
    "t1:w,t2:tok,t3:out;ip0:N,ip1:P));argmax(logits,vocab,ws,step,ids,host_tok,limit);"
    "kargs:group_norm_add9,resnorm14(..,zero),resnorm_rep16(..,zero,rep,nrep),mlp376(..,yr,nrep,zero,rx,rd,"
    "rpw,rprew,xo,rpwdt,rprewdt,eps),mlp_rep,mlp_h2,mlp_z,mlp_r,resnorm_z2,gated_proj104(..,rx,rd,rpw,xo,"
    "rpwdt,"
    "eps),resnorm_gated_proj;";

std::string build_schema() {
    std::string s = "g4plan-v" + std::to_string(kFormatMajor) + ";";
    record(&s, "header", sizeof(PlanHeader), kHeader);
    record(&s, "section", sizeof(PlanSection), kSection);
    record(&s, "tensor", sizeof(PlanTensor), kTensor);
    record(&s, "op", sizeof(PlanOp), kOp);
    record(&s, "launch", sizeof(CudaLaunch), kLaunch);
    record(&s, "program", sizeof(PlanProgram), kProgram);
    s += "programs" + std::to_string((int)SectionKind::Programs) + "(text0);";
    s += "ops:";
    ops_schema(&s, (AllOpParams*)nullptr);
    s += ";dtypes:";
    for (int d = 0; d <= (int)DType::NF4; ++d)
        s += std::string(dtype_str((DType)d)) + "=" + std::to_string(d) + ",";
    s += "nf4(blob:codes,absmax|dq;quant_flags:dq" + std::to_string(kQuantDoubleQuant) + ",tiled32_" +
         std::to_string(kQuantTiled32) + ");";
    s += "kinds:weight" + std::to_string((int)TensorKind::Weight) + ",act" +
         std::to_string((int)TensorKind::Activation) + ",kv" + std::to_string((int)TensorKind::KvCache) +
         "(dtype:f32|bf16,rne on store),input" + std::to_string((int)TensorKind::Input) + ";";
    s += "rowmode:all" + std::to_string((int)RowMode::All) + ",tailin" +
         std::to_string((int)RowMode::TailIn) + ",outrows" + std::to_string((int)RowMode::OutRows) +
         ",rowcount" + std::to_string(kRowCountBase) + "+k(k<" + std::to_string(kMaxRowCounts) + ");";
    s += "matmul_variant:cublas" + std::to_string((int)MatmulVariant::Cublas) + ";";
    s += "roles:tower" + std::to_string(kRoleTower) + ",tower_scalar" + std::to_string(kRoleTowerScalar) +
         ",ple_table" + std::to_string((int)WeightRole::PleTable) + ";";
    s += kLaunchConventions;
    return s;
}

} // namespace

std::string op_doc_row(const char* op_name_text, int code, const char* inout, const std::string& fields) {
    return "| `" + std::string(op_name_text) + "` (" + std::to_string(code) + ") | " + inout + " | " +
           fields + " |";
}

std::string param_range_text(int32_t lo, int32_t hi) {
    auto num = [](int32_t v) {
        for (int k = 16; k < 31; ++k)
            if (v == (1 << k)) return "2^" + std::to_string(k);
        return std::to_string(v);
    };
    return " [" + num(lo) + ", " + num(hi) + "]";
}

const std::string& schema_text() {
    static const std::string s = build_schema();
    return s;
}

uint64_t schema_hash() {
    static const uint64_t h = fnv1a64(schema_text().data(), schema_text().size());
    return h;
}

} // namespace g4::plan
