// Validation of a plan's program (see plan_reader.h check_program): every op's operands, column views,
// shapes, dtypes and parameters against the tensor table, as the CPU executor and the CUDA backend read
// them; and the tensors' placement in the arenas (inputs overlap nothing, KV caches overlap each other
// nowhere). Run once by Plan::load, before any session exists. Each op's own checks are its definition's
// (runtime/plan/op_params.h OpTable<P>::check, through OpChecker); nothing here names an op but Copy's device
// rules for cross-device plans.
#include "runtime/plan/op_params.h"
#include "runtime/plan/plan_reader.h"

#include <algorithm>
#include <string>
#include <vector>

namespace g4::plan {

namespace {

int64_t numel(const PlanTensor& t) {
    int64_t n = 1;
    for (int i = 0; i < t.ndim; ++i)
        n *= t.dims[i];
    return n;
}

const char* kind_name(uint8_t k) {
    switch ((TensorKind)k) {
    case TensorKind::Weight:
        return "a weight";
    case TensorKind::Activation:
        return "an activation";
    case TensorKind::KvCache:
        return "a KV cache";
    case TensorKind::Input:
        return "an input";
    }
    return "an unknown kind";
}

// What an op's check (OpTable<P>::check) sees: the plan, the op, its program and the rows its inputs (rin)
// and outputs (rout) need; defects go to fail (the first one is kept).
struct OpChecker {
    const Plan& p;
    const PlanOp& op;
    const ProgramInfo& info;
    const PlanProgram& g;
    bool text   = true;
    int64_t rin = 0, rout = 0;
    std::string err;

    bool fail(const std::string& m) {
        if (err.empty()) err = m;
        return false;
    }
    std::string tname(int32_t idx) const { return "'" + std::string(p.str(p.tensor(idx).name)) + "'"; }
    int64_t numel(int32_t idx) const { return g4::plan::numel(p.tensor(idx)); }
    bool need(int32_t idx, TensorKind k, const char* what) {
        if (idx < 0) return fail(std::string("missing ") + what);
        if (p.tensor(idx).kind != (uint8_t)k)
            return fail(std::string(what) + " " + tname(idx) + " is " + kind_name(p.tensor(idx).kind) +
                        ", not " + kind_name((uint8_t)k));
        return true;
    }
    // A view of `cols` columns from column `col` of a 2-D tensor's rows: within the row.
    bool cols_ok(int32_t idx, int64_t col, int64_t cols, const char* what) {
        const PlanTensor& x = p.tensor(idx);
        const int64_t row   = x.ndim == 2 ? x.dims[1] : 0;
        if (col < 0 || cols < 0 || col + cols > row)
            return fail(std::string(what) + " column " + std::to_string(col) + "+" + std::to_string(cols) +
                        " exceeds the row of " + std::to_string(row));
        return true;
    }
    // Activation view of `cols` columns starting at col, with at least `rows` rows.
    bool act_view(int32_t idx, int32_t col, int64_t cols, int64_t rows, const char* what) {
        if (!need(idx, TensorKind::Activation, what)) return false;
        if (!cols_ok(idx, col, cols, what)) return false;
        if (p.tensor(idx).dims[0] < rows)
            return fail(std::string(what) + " " + tname(idx) + " has " +
                        std::to_string(p.tensor(idx).dims[0]) + " rows, the op needs " +
                        std::to_string(rows));
        return true;
    }
    // Input k / output k as an activation view of `cols` columns with the rows the op's row mode needs.
    bool in_act(int k, int64_t cols, const char* what) {
        return act_view(op.in[k], op.in_col[k], cols, rin, what);
    }
    bool out_act(int k, int64_t cols, const char* what) {
        return act_view(op.out[k], op.out_col[k], cols, rout, what);
    }
    // An op's input view: an activation, or an encoder program's f32 input or 2-D f32 weight (a table the
    // compiler computed: read, never written).
    bool src_view(int32_t idx, int32_t col, int64_t cols, int64_t rows, const char* what) {
        const bool fixed = idx >= 0 && (p.tensor(idx).kind == (uint8_t)TensorKind::Input ||
                                        p.tensor(idx).kind == (uint8_t)TensorKind::Weight);
        if (fixed) {
            if (p.tensor(idx).dtype != (uint8_t)DType::F32 || p.tensor(idx).ndim != 2)
                return fail(std::string(what) + " " + tname(idx) + " is not a 2-D f32 input or weight");
            if (!cols_ok(idx, col, cols, what)) return false;
            if (p.tensor(idx).dims[0] < rows)
                return fail(std::string(what) + " " + tname(idx) + " has too few rows");
            return true;
        }
        return act_view(idx, col, cols, rows, what);
    }
    // Input (out false) or output k of an op over frame sequences: a 2-D f32 activation or program input of
    // cols columns from the op's column, with at least `rows` rows.
    bool frame(int k, bool out, int64_t cols, int64_t rows, const char* what) {
        const int32_t i   = out ? op.out[k] : op.in[k];
        const int32_t col = out ? op.out_col[k] : op.in_col[k];
        if (i < 0 || (size_t)i >= p.n_tensors()) return fail(std::string("missing ") + what);
        const PlanTensor& t = p.tensor(i);
        if (t.kind != (uint8_t)TensorKind::Activation && t.kind != (uint8_t)TensorKind::Input)
            return fail(std::string(what) + " " + tname(i) + " is not an activation");
        if (t.dtype != (uint8_t)DType::F32 || t.ndim != 2)
            return fail(std::string(what) + " " + tname(i) + " is not a 2-D f32 activation");
        if (col < 0 || cols < 0 || col + cols > t.dims[1])
            return fail(std::string(what) + " " + tname(i) + ": columns " + std::to_string(col) + "+" +
                        std::to_string(cols) + " exceed its " + std::to_string(t.dims[1]));
        if (t.dims[0] < rows)
            return fail(std::string(what) + " " + tname(i) + " has " + std::to_string(t.dims[0]) +
                        " rows, the op needs " + std::to_string(rows));
        return true;
    }
    // A KV cache of `slots` rows read or written `width` columns from column col.
    bool cache_view(int32_t idx, int32_t col, int64_t width, int64_t slots, const char* what) {
        if (!need(idx, TensorKind::KvCache, what)) return false;
        if (!cols_ok(idx, col, width, what)) return false;
        if (p.tensor(idx).dims[0] != slots)
            return fail(std::string(what) + " " + tname(idx) + " has " +
                        std::to_string(p.tensor(idx).dims[0]) + " slots, the op " + std::to_string(slots));
        return true;
    }
    // An input an encoder program's caller fills: 2-D `dt` with >= rows rows of `cols` columns.
    bool input_view(int32_t idx, DType dt, int64_t cols, int64_t rows, const char* what) {
        if (!need(idx, TensorKind::Input, what)) return false;
        const PlanTensor& x = p.tensor(idx);
        if (x.ndim != 2 || x.dtype != (uint8_t)dt || x.dims[1] != cols || x.dims[0] < rows)
            return fail(std::string(what) + " " + tname(idx) + " must be " + dtype_str(dt) +
                        " [>= " + std::to_string(rows) + ", " + std::to_string(cols) + "]");
        return true;
    }
    bool matmul_weight(int32_t idx, const char* what) {
        if (!need(idx, TensorKind::Weight, what)) return false;
        if (p.tensor(idx).dtype == (uint8_t)DType::NF4) return true;
        return dense_weight(idx, what);
    }
    bool dense_weight(int32_t idx, const char* what) {
        if (!need(idx, TensorKind::Weight, what)) return false;
        uint8_t d = p.tensor(idx).dtype;
        if (d != (uint8_t)DType::F32 && d != (uint8_t)DType::BF16 && d != (uint8_t)DType::F16)
            return fail(std::string(what) + " " + tname(idx) + " has an unsupported dtype");
        return true;
    }
    // Input k: a dense F32/BF16 weight of exactly n values.
    bool sized_weight(int k, int64_t n, const char* what) {
        const int32_t i = op.in[k];
        if (i < 0 || (size_t)i >= p.n_tensors()) return fail(std::string("missing ") + what);
        const PlanTensor& t = p.tensor(i);
        if (t.kind != (uint8_t)TensorKind::Weight)
            return fail(std::string(what) + " " + tname(i) + " is not a weight");
        if (t.dtype != (uint8_t)DType::F32 && t.dtype != (uint8_t)DType::BF16)
            return fail(std::string(what) + " " + tname(i) + " is not F32 or BF16");
        if (numel(i) != n)
            return fail(std::string(what) + " " + tname(i) + " has " + std::to_string(numel(i)) +
                        " values, the op " + std::to_string(n));
        return true;
    }
    // The per-thread scratch floats the op's CPU kernel takes fit the program's.
    bool scratch(uint64_t need_floats) {
        if (need_floats > g.thread_floats)
            return fail("needs " + std::to_string(need_floats) +
                        " scratch floats a thread, the program gives " + std::to_string(g.thread_floats));
        return true;
    }
};

// Each op code's checks: its parameters' ranges, the programs it may be in, then its definition's check.
struct OpRules {
    OpUse use                 = OpUse::Any;
    void (*check)(OpChecker&) = nullptr;
};
template <class P> void check_with_table(OpChecker& c) {
    const std::string range = param_range_error<P>(c.op);
    if (!range.empty()) return (void)c.fail(range);
    OpTable<P>::check(c, params<P>(c.op));
}
template <class... P> constexpr std::array<OpRules, 256> make_rules(std::tuple<P...>*) {
    std::array<OpRules, 256> r{};
    ((r[(size_t)OpTable<P>::code] = OpRules{OpTable<P>::use, &check_with_table<P>}), ...);
    return r;
}
constexpr std::array<OpRules, 256> kRules = make_rules((AllOpParams*)nullptr);

// One op's operands, views and parameters in its program g (text: the text program); defects into c. An
// encoder program's op runs over one of its row counts and names only its program's tensors.
void check_op(OpChecker& c) {
    const Plan& p        = c.p;
    const PlanOp& op     = c.op;
    const PlanProgram& g = c.g;
    const RowMode rm     = (RowMode)op.row_mode;
    c.rin  = rm == RowMode::OutRows ? c.info.logits_rows : c.info.max_rows; // the rows inputs need
    c.rout = rm == RowMode::All ? c.info.max_rows : c.info.logits_rows;     // and outputs
    if (!c.text) {
        const int32_t count = op.row_mode - kRowCountBase;
        if (count < 0 || count >= kMaxRowCounts || g.max_rows[count] <= 0)
            c.fail("bad row count " + std::to_string(op.row_mode));
        else
            c.rin = c.rout = g.max_rows[count];
        for (int32_t t : {op.in[0], op.in[1], op.in[2], op.in[3], op.out[0], op.out[1]})
            if (t >= 0 && ((uint32_t)t < g.tensor_begin || (uint32_t)t >= g.tensor_end))
                c.fail("tensor " + std::to_string(t) + " belongs to another program");
    }
    const OpRules& r = kRules[op.code < kRules.size() ? op.code : 0];
    if (!r.check) return (void)c.fail("unknown op");
    if (!((uint8_t)r.use & (uint8_t)(c.text ? OpUse::Text : OpUse::Encoder)))
        c.fail(std::string("op of ") + (c.text ? "an encoder program" : "the text program") +
               " in program '" + p.str(g.name) + "'");
    if (c.err.empty()) r.check(c);
}

} // namespace

std::string check_program(const Plan& p) {
    const auto& in = p.info();
    size_t prog    = 0;
    for (size_t i = 0; i < p.n_ops_all(); ++i) {
        const PlanOp& op = p.op(i);
        while (i >= p.program(prog).op_end)
            ++prog;
        const PlanProgram& g = p.program(prog);
        const bool text      = prog == 0;
        OpChecker c{p, op, in, g, text, 0, 0, ""};
        // Weights and KV caches are read from their first column (the runtime adds no offset to weights).
        for (int k = 0; k < 4 && c.err.empty(); ++k)
            if (op.in[k] >= 0 && p.tensor(op.in[k]).kind == (uint8_t)TensorKind::Weight && op.in_col[k] != 0)
                c.fail("weight " + c.tname(op.in[k]) + " viewed from column " + std::to_string(op.in_col[k]));
        check_op(c);
        // Cross-device plans: an op's caches lie in its device's part of the KV arena (the host part
        // for CPU-placed layers), and a GPU op's weights in the ranges its GPU uploads.
        if (c.err.empty() && text && p.hybrid() && (OpCode)op.code != OpCode::Copy) {
            const int dev = p.op_device(i);
            const auto* g = dev >= 0 ? &in.gpus[p.gpu_slot(dev)] : nullptr;
            for (int32_t t : {op.in[0], op.in[1], op.in[2], op.in[3], op.out[0], op.out[1]}) {
                if (t < 0) continue;
                const PlanTensor& x = p.tensor(t);
                if (x.kind == (uint8_t)TensorKind::KvCache &&
                    (g ? x.offset < g->kv_begin || x.offset + x.nbytes > g->kv_end
                       : x.offset < in.kv_host_begin))
                    c.fail(std::string("KV cache '") + p.str(x.name) + "' is not in the " +
                           (g ? "cuda:" + std::to_string(dev) : std::string("host")) +
                           " part of the KV arena");
                if (x.kind == (uint8_t)TensorKind::Weight && g) {
                    bool in_range = false;
                    for (const auto& [b, e] : g->weights)
                        in_range = in_range || (x.offset >= b && x.offset + x.nbytes <= e);
                    if (!in_range)
                        c.fail(std::string("weight '") + p.str(x.name) + "' of an op on cuda:" +
                               std::to_string(dev) + " is not in the weights uploaded to that GPU");
                }
            }
        }
        if (!c.err.empty())
            return "op " + std::to_string(i) + " '" + p.str(op.name) + "' (" + op_name((OpCode)op.code) +
                   "): " + c.err;
    }

    // Placement in the arenas. Inputs (the ids) are written before a step and read through it, and every
    // KV cache holds its layer's keys for the whole session: none of them may share bytes with another
    // tensor of its arena (activations reuse each other's bytes by design: the compiler's live ranges).
    struct Range {
        uint64_t b, e;
        size_t t;
    };
    auto same_program = [&](size_t a, size_t b) { return p.tensor_program(a) == p.tensor_program(b); };
    std::vector<Range> inputs, acts, caches;
    for (size_t t = 0; t < p.n_tensors(); ++t) {
        const PlanTensor& x = p.tensor(t);
        const Range r{x.offset, x.offset + x.nbytes, t};
        if (x.kind == (uint8_t)TensorKind::Input)
            inputs.push_back(r);
        else if (x.kind == (uint8_t)TensorKind::Activation)
            acts.push_back(r);
        else if (x.kind == (uint8_t)TensorKind::KvCache)
            caches.push_back(r);
    }
    auto overlap = [](const Range& a, const Range& b) { return a.b < b.e && b.b < a.e; };
    auto name    = [&](size_t t) { return "'" + std::string(p.str(p.tensor(t).name)) + "'"; };
    for (const Range& a : inputs) {
        for (const Range& b : inputs)
            if (b.t != a.t && same_program(a.t, b.t) && overlap(a, b))
                return "input " + name(a.t) + " overlaps input " + name(b.t) + " in the activation arena";
        for (const Range& b : acts)
            if (same_program(a.t, b.t) && overlap(a, b))
                return "input " + name(a.t) + " (bytes " + std::to_string(a.b) + ".." + std::to_string(a.e) +
                       ") overlaps activation " + name(b.t) + " (bytes " + std::to_string(b.b) + ".." +
                       std::to_string(b.e) + ") in the activation arena";
    }
    std::sort(caches.begin(), caches.end(), [](const Range& a, const Range& b) { return a.b < b.b; });
    for (size_t k = 1; k < caches.size(); ++k)
        if (caches[k].b < caches[k - 1].e)
            return "KV cache " + name(caches[k].t) + " overlaps KV cache " + name(caches[k - 1].t) +
                   " in the KV arena";
    // Each encoder program's inputs and outputs: its own tensors of the kinds a caller fills / reads.
    for (size_t k = 1; k < p.n_programs(); ++k) {
        const PlanProgram& g = p.program(k);
        auto mine            = [&](int32_t t, TensorKind kind) {
            return t >= (int32_t)g.tensor_begin && t < (int32_t)g.tensor_end &&
                   p.tensor(t).kind == (uint8_t)kind;
        };
        for (int32_t t : g.inputs)
            if (t != -1 && !mine(t, TensorKind::Input))
                return std::string("program '") + p.str(g.name) + "': input " + std::to_string(t) +
                       " is not one of its input tensors";
        for (int32_t t : g.outputs)
            if (t != -1 && !mine(t, TensorKind::Activation))
                return std::string("program '") + p.str(g.name) + "': output " + std::to_string(t) +
                       " is not one of its activations";
    }
    return "";
}

int Plan::find_program(std::string_view name) const {
    for (size_t i = 0; i < programs_.size(); ++i)
        if (name == str(programs_[i].name)) return (int)i;
    return -1;
}

size_t Plan::tensor_program(size_t t) const {
    for (size_t i = 1; i < programs_.size(); ++i)
        if (t >= programs_[i].tensor_begin && t < programs_[i].tensor_end) return i;
    return 0;
}

// The PROGRAMS section (absent: one program "text" of every op and tensor): contiguous, disjoint op and
// tensor ranges in order from 0, "text" first with the META activation arena, devices the plan's, row
// counts bounded. The programs' ops and tensors are checked by validate_records and check_program.
g4_status Plan::validate_programs(const PlanSection* sec, std::string* err) {
    const g4_status CORRUPT = G4_ERR_PLAN_CORRUPT;
    const int text_device   = device_ == "cuda" ? cuda_device_ : -1;
    programs_.clear();
    if (!sec) {
        PlanProgram text{};
        text.device      = text_device;
        text.op_end      = (uint32_t)n_ops_;
        text.tensor_end  = (uint32_t)n_tensors_;
        text.arena_bytes = info_.act_arena_bytes;
        for (int32_t& t : text.inputs)
            t = -1;
        for (int32_t& t : text.outputs)
            t = -1;
        programs_.push_back(text);
        return G4_OK;
    }
    if (sec->size % sizeof(PlanProgram) || sec->offset % 8 || sec->size == 0 ||
        sec->size / sizeof(PlanProgram) > 64)
        return fail(CORRUPT, "malformed program table", err);
    const auto* recs = (const PlanProgram*)((const uint8_t*)map_ + sec->offset);
    programs_.assign(recs, recs + sec->size / sizeof(PlanProgram));
    uint32_t op = 0, tensor = 0;
    for (size_t i = 0; i < programs_.size(); ++i) {
        const PlanProgram& g   = programs_[i];
        const std::string what = "program " + std::to_string(i);
        if (g.name >= strings_size_) return fail(CORRUPT, what + ": name out of bounds", err);
        if (i == 0 && std::string_view(str(g.name)) != "text")
            return fail(CORRUPT, "the first program is not \"text\"", err);
        if (find_program(str(g.name)) != (int)i) return fail(CORRUPT, what + ": duplicate name", err);
        if (g.op_begin != op || g.op_end < g.op_begin || g.op_end > n_ops_ || g.tensor_begin != tensor ||
            g.tensor_end < g.tensor_begin || g.tensor_end > n_tensors_)
            return fail(CORRUPT, what + " '" + str(g.name) + "': op or tensor range out of order", err);
        op = g.op_end, tensor = g.tensor_end;
        if (g.device != -1 && g.device != text_device)
            return fail(CORRUPT, what + ": device " + std::to_string(g.device) + " is not the plan's", err);
        if (i == 0 ? g.arena_bytes != info_.act_arena_bytes : g.arena_bytes > (1ull << 40))
            return fail(CORRUPT, what + ": bad activation arena size", err);
        if (g.thread_floats > (1ull << 32)) return fail(CORRUPT, what + ": bad per-thread scratch", err);
        for (int32_t r : g.max_rows)
            if (r < 0 || r > (1 << 24)) return fail(CORRUPT, what + ": bad row count bound", err);
        for (int32_t t : g.inputs)
            if (t < -1 || t >= (int32_t)n_tensors_) return fail(CORRUPT, what + ": bad input tensor", err);
        for (int32_t t : g.outputs)
            if (t < -1 || t >= (int32_t)n_tensors_) return fail(CORRUPT, what + ": bad output tensor", err);
    }
    if (op != n_ops_ || tensor != n_tensors_)
        return fail(CORRUPT, "the programs do not cover every op and tensor", err);
    return G4_OK;
}

} // namespace g4::plan
