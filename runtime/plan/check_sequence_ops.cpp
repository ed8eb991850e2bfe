// Validation of the ops over frame sequences (see check_sequence_ops.h).
#include "runtime/plan/check_sequence_ops.h"

#include "kernels/cpu/cpu.h"
#include "runtime/plan/op_params.h"

namespace g4::plan {

namespace {

constexpr int kRowCounts = 4; // plan::kMaxRowCounts

struct Check {
    const Plan& p;
    const PlanOp& op;
    int64_t rows;
    std::string err;

    bool fail(const std::string& m) {
        if (err.empty()) err = m;
        return false;
    }
    std::string name(int32_t i) const { return "'" + std::string(p.str(p.tensor(i).name)) + "'"; }
    bool exists(int32_t i, const char* what) {
        if (i < 0 || (size_t)i >= p.n_tensors()) return fail(std::string("missing ") + what);
        return true;
    }
    // An activation (or input) view of cols columns from the op's column, with at least `need` rows.
    bool act(int k, bool out, int64_t cols, int64_t need, const char* what) {
        const int32_t i   = out ? op.out[k] : op.in[k];
        const int32_t col = out ? op.out_col[k] : op.in_col[k];
        if (!exists(i, what)) return false;
        const PlanTensor& t = p.tensor(i);
        if (t.kind != (uint8_t)TensorKind::Activation && t.kind != (uint8_t)TensorKind::Input)
            return fail(std::string(what) + " " + name(i) + " is not an activation");
        if (t.dtype != (uint8_t)DType::F32 || t.ndim != 2)
            return fail(std::string(what) + " " + name(i) + " is not a 2-D f32 activation");
        if (col < 0 || cols < 0 || col + cols > t.dims[1])
            return fail(std::string(what) + " " + name(i) + ": columns " + std::to_string(col) + "+" +
                        std::to_string(cols) + " exceed its " + std::to_string(t.dims[1]));
        if (t.dims[0] < need)
            return fail(std::string(what) + " " + name(i) + " has " + std::to_string(t.dims[0]) +
                        " rows, the op needs " + std::to_string(need));
        return true;
    }
    // A dense F32/BF16 weight of exactly n values.
    bool weight(int k, int64_t n, const char* what) {
        const int32_t i = op.in[k];
        if (!exists(i, what)) return false;
        const PlanTensor& t = p.tensor(i);
        if (t.kind != (uint8_t)TensorKind::Weight)
            return fail(std::string(what) + " " + name(i) + " is not a weight");
        if (t.dtype != (uint8_t)DType::F32 && t.dtype != (uint8_t)DType::BF16)
            return fail(std::string(what) + " " + name(i) + " is not F32 or BF16");
        int64_t numel = 1;
        for (int d = 0; d < t.ndim; ++d)
            numel *= t.dims[d];
        if (numel != n)
            return fail(std::string(what) + " " + name(i) + " has " + std::to_string(numel) +
                        " values, the op " + std::to_string(n));
        return true;
    }
    bool positive(std::initializer_list<int32_t> v) {
        for (int32_t x : v)
            if (x <= 0) return fail("a size parameter is not positive");
        return true;
    }
    bool scratch(uint64_t need, uint64_t have) {
        if (need > have)
            return fail("needs " + std::to_string(need) + " scratch floats a thread, the program gives " +
                        std::to_string(have));
        return true;
    }
};

} // namespace

bool is_sequence_op(uint16_t code) {
    return code >= (uint16_t)OpCode::Conv2dNormRelu && code <= (uint16_t)OpCode::AddScaled;
}

std::string check_sequence_op(const Plan& p, const PlanOp& op, int64_t rows, const int32_t* max_rows,
                              uint64_t thread_floats) {
    Check c{p, op, rows, ""};
    switch ((OpCode)op.code) {
    case OpCode::Conv2dNormRelu: {
        const auto a = params<Conv2dNormReluParams>(op);
        if (!c.positive({a.f_in, a.c_in, a.f_out, a.c_out})) break;
        if (a.f_in > (1 << 16) || a.c_in > (1 << 16) || a.c_out > (1 << 16)) {
            c.fail("more than 65536 frequency rows or channels");
            break;
        }
        if (a.f_out != (a.f_in + 1) / 2) {
            c.fail("output frequency rows are not half the input's");
            break;
        }
        if (a.src_count < 0 || a.src_count >= kRowCounts) {
            c.fail("input row count out of range");
            break;
        }
        // The output covers at least half the input's rows (stride 2), rounding up.
        if ((int64_t)rows < ((int64_t)max_rows[a.src_count] + 1) / 2)
            c.fail("fewer output rows than the stride gives");
        c.act(0, false, (int64_t)a.f_in * a.c_in, max_rows[a.src_count], "input") &&
            c.weight(1, (int64_t)a.c_out * a.c_in * 9, "conv weight") &&
            c.weight(2, a.c_out, "norm weight") &&
            c.act(0, true, (int64_t)a.f_out * a.c_out, rows, "output") &&
            c.scratch(cpu::conv2d_scratch_floats(a.f_out, a.c_in, a.c_out), thread_floats);
        break;
    }
    case OpCode::Silu: {
        const int32_t cols = params<SiluParams>(op).cols;
        c.positive({cols}) && c.act(0, false, cols, rows, "input") && c.act(0, true, cols, rows, "output");
        break;
    }
    case OpCode::SigmoidMul:
    case OpCode::AddScaled: {
        const int32_t cols = (OpCode)op.code == OpCode::SigmoidMul ? params<SigmoidMulParams>(op).cols
                                                                   : params<AddScaledParams>(op).cols;
        c.positive({cols}) && c.act(0, false, cols, rows, "a") && c.act(1, false, cols, rows, "b") &&
            c.act(0, true, cols, rows, "output");
        break;
    }
    case OpCode::CausalConv1d: {
        const auto a = params<CausalConv1dParams>(op);
        if (op.out[0] >= 0 && op.out[0] == op.in[0]) {
            c.fail("output aliases its input");
            break;
        }
        if (c.positive({a.cols, a.k}) && a.k > 4096) c.fail("more than 4096 taps");
        c.err.empty() && c.act(0, false, a.cols, rows, "input") &&
            c.weight(1, (int64_t)a.cols * a.k, "conv weight") && c.act(0, true, a.cols, rows, "output") &&
            c.scratch(cpu::causal_conv1d_scratch_floats(a.cols, a.k), thread_floats);
        break;
    }
    case OpCode::LocalAttention: {
        const auto a = params<LocalAttentionParams>(op);
        if (!c.positive({a.heads, a.dim, a.window, a.n_rel})) break;
        if (a.heads > 4096 || a.dim > 4096 || a.window > 4096) {
            c.fail("heads, dim or window out of range");
            break;
        }
        const int64_t width = (int64_t)a.heads * a.dim;
        if (!(a.cap > 0)) {
            c.fail("logit cap must be > 0");
            break;
        }
        c.act(0, false, width, rows, "q") && c.act(1, false, width, rows, "k") &&
            c.act(2, false, width, rows, "v") && c.act(3, false, width, a.n_rel, "relative keys") &&
            c.act(0, true, width, rows, "output") &&
            c.scratch(cpu::local_attention_scratch_floats(a.window), thread_floats);
        break;
    }
    case OpCode::SoftplusScale: {
        const auto a = params<SoftplusScaleParams>(op);
        if (!c.positive({a.cols, a.dim})) break;
        if (a.cols % a.dim != 0) {
            c.fail("columns are not a multiple of the scale's length");
            break;
        }
        c.act(0, false, a.cols, rows, "input") && c.weight(1, a.dim, "scale") &&
            c.act(0, true, a.cols, rows, "output") &&
            c.scratch(cpu::softplus_scale_scratch_floats(a.dim), thread_floats);
        break;
    }
    default:
        c.fail("not an op over frame sequences");
    }
    return c.err;
}

} // namespace g4::plan
