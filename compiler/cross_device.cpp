// Copy steps and KV-cache mirrors for CUDA plans whose layers span devices (see cross_device.h).
#include "compiler/cross_device.h"
#include "compiler/error.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

namespace g4::cross_device {

using gemma4::OpDesc;
using gemma4::Program;
using gemma4::TensorDesc;
using plan::PlanOp;
using plan::TensorKind;

int op_device(const PlanOp& op, const std::vector<int>& layer_device, int primary) {
    return op.layer != plan::kNoLayer && op.layer < layer_device.size() ? layer_device[op.layer] : primary;
}

namespace {

// Columns [first, end) of a tensor, per device; a set of disjoint intervals.
struct Cols {
    std::vector<std::pair<int64_t, int64_t>> iv;
    bool has(int64_t a, int64_t b) const {
        for (auto [s, e] : iv)
            if (s <= a && b <= e) return true;
        return false;
    }
    void add(int64_t a, int64_t b) {
        iv.push_back({a, b});
        std::sort(iv.begin(), iv.end());
        std::vector<std::pair<int64_t, int64_t>> m;
        for (auto x : iv)
            if (!m.empty() && x.first <= m.back().second)
                m.back().second = std::max(m.back().second, x.second);
            else
                m.push_back(x);
        iv = std::move(m);
    }
    void remove(int64_t a, int64_t b) {
        std::vector<std::pair<int64_t, int64_t>> m;
        for (auto [s, e] : iv) {
            if (e <= a || b <= s) {
                m.push_back({s, e});
                continue;
            }
            if (s < a) m.push_back({s, a});
            if (b < e) m.push_back({b, e});
        }
        iv = std::move(m);
    }
};

// Columns op reads from input k / writes to output k (0 when the operand is not an activation view).
int64_t in_cols(const Program& p, const PlanOp& op, int k) {
    switch ((OpCode)op.code) {
    case OpCode::Matmul:
        return k == 0 ? p.tensors[op.in[1]].dims[1] : 0;
    case OpCode::RmsNorm:
        return k == 0 ? plan::params<plan::RmsNormParams>(op).cols : 0;
    case OpCode::Scale:
        return k == 0 ? plan::params<plan::ScaleParams>(op).cols : 0;
    case OpCode::Softcap:
        return k == 0 ? plan::params<plan::SoftcapParams>(op).cols : 0;
    case OpCode::Add:
        return k < 2 ? plan::params<plan::AddParams>(op).cols : 0;
    case OpCode::GeluMul:
        return k < 2 ? plan::params<plan::GeluMulParams>(op).cols : 0;
    case OpCode::KvStore:
        return k < 2 ? plan::params<plan::KvStoreParams>(op).width : 0;
    case OpCode::Rope: {
        const auto r = plan::params<plan::RopeParams>(op);
        return k == 0 ? (int64_t)r.heads * r.dim : 0;
    }
    case OpCode::Attention: {
        const auto a = plan::params<plan::AttentionParams>(op);
        return k == 0 ? (int64_t)a.heads * a.dim : 0;
    }
    default:
        return 0; // Embed reads ids and a table
    }
}
int64_t out_cols(const Program& p, const PlanOp& op) {
    switch ((OpCode)op.code) {
    case OpCode::Embed:
        return p.tensors[op.in[1]].dims[1];
    case OpCode::Matmul:
        return p.tensors[op.in[1]].dims[0];
    case OpCode::Attention:
        return in_cols(p, op, 0);
    case OpCode::KvStore:
        return 0; // caches: mirrored, not copied
    default:
        return in_cols(p, op, 0);
    }
}

} // namespace

static std::string device_suffix(int dev) {
    return dev == kHost ? "@cpu" : "@cuda" + std::to_string(dev);
}

Stats split(Program& p, const std::vector<int>& layer_device, int primary) {
    Stats st;
    auto dev_of = [&](const OpDesc& d) { return op_device(d.op, layer_device, primary); };

    // 1. KV caches read across devices: mirrors on the reader's device.
    std::map<int, size_t> writer; // cache tensor -> its KvStore op
    for (size_t i = 0; i < p.ops.size(); ++i)
        if (p.ops[i].op.code == (uint16_t)OpCode::KvStore) writer[p.ops[i].op.out[0]] = i;
    std::map<std::pair<int, int>, std::pair<int, int>>
        mirror; // (donor k cache, reader device) -> mirror k, v caches
    std::vector<OpDesc> ops;
    for (size_t i = 0; i < p.ops.size(); ++i) {
        OpDesc d = p.ops[i];
        if (d.op.code == (uint16_t)OpCode::Attention) {
            auto w = writer.find(d.op.in[1]);
            if (w == writer.end())
                throw CompileError("internal: attention '" + d.name + "' reads a cache no op writes");
            const OpDesc& store = p.ops[w->second];
            if (dev_of(store) != dev_of(d)) {
                auto key = std::make_pair(store.op.out[0], dev_of(d));
                auto m   = mirror.find(key);
                if (m == mirror.end()) {
                    int kv[2];
                    for (int c = 0; c < 2; ++c) {
                        TensorDesc t = p.tensors[store.op.out[c]];
                        t.name += device_suffix(dev_of(d));
                        p.tensors.push_back(t);
                        kv[c] = (int)p.tensors.size() - 1;
                    }
                    OpDesc ms    = store;
                    ms.op.layer  = d.op.layer; // runs where its readers run
                    ms.op.out[0] = kv[0];
                    ms.op.out[1] = kv[1];
                    ms.name      = store.name + "@" + std::to_string(d.op.layer);
                    ops.push_back(ms);
                    m = mirror.emplace(key, std::make_pair(kv[0], kv[1])).first;
                    st.mirrors++;
                }
                d.op.in[1] = m->second.first;
                d.op.in[2] = m->second.second;
            }
        }
        ops.push_back(d);
    }

    // 2. Copy steps: track which columns of each activation each device holds.
    std::map<int, std::map<int, Cols>> held; // device -> tensor -> columns
    std::vector<OpDesc> out;
    out.reserve(ops.size() + 64);
    for (OpDesc& d : ops) {
        const int dev = dev_of(d);
        for (int k = 0; k < 4; ++k) {
            const int t     = d.op.in[k];
            const int64_t n = in_cols(p, d.op, k);
            if (t < 0 || n == 0 || p.tensors[t].kind != TensorKind::Activation) continue;
            const int64_t a = d.op.in_col[k], b = a + n;
            if (held[dev][t].has(a, b)) continue;
            int src = dev;
            for (auto& [o, cols] : held) // any holder has the writer's values; a GPU is preferred to the host
                if (o != dev && cols[t].has(a, b) && (src == dev || src == kHost)) src = o;
            if (src == dev)
                throw CompileError("internal: op '" + d.name + "' reads columns " + std::to_string(a) + ".." +
                                   std::to_string(b) + " of '" + p.tensors[t].name +
                                   "', which no device holds");
            OpDesc c{};
            plan::set_params(c.op, plan::CopyParams{(int32_t)n, dev, src});
            c.op.layer = plan::kNoLayer;
            for (int j = 0; j < 4; ++j)
                c.op.in[j] = -1;
            c.op.out[1] = -1;
            c.op.in[0] = c.op.out[0] = t;
            c.op.in_col[0] = c.op.out_col[0] = (int32_t)a;
            c.op.row_mode                    = (int32_t)plan::RowMode::All;
            c.name                           = p.tensors[t].name + device_suffix(dev);
            out.push_back(c);
            (dev == kHost ? st.copies_to_host : src == kHost ? st.copies_to_device : st.copies_peer)++;
            held[dev][t].add(a, b);
        }
        const int o     = d.op.out[0];
        const int64_t n = out_cols(p, d.op);
        if (o >= 0 && n > 0 && p.tensors[o].kind == TensorKind::Activation) {
            const int64_t a = d.op.out_col[0];
            for (auto& [h, cols] : held)
                if (h != dev) cols[o].remove(a, a + n);
            held[dev][o].add(a, a + n);
        }
        out.push_back(std::move(d));
    }
    // Hoist each copy back over the destination device's ops that neither write its tensor nor read
    // its columns, so the copies of a boundary go out together and a CPU run is one host call; a copy
    // that meets one of the same tensor and devices with adjacent columns joins it.
    for (size_t j = 0; j < out.size(); ++j) {
        if (out[j].op.code != (uint16_t)OpCode::Copy) continue;
        const auto cp = plan::params<plan::CopyParams>(out[j].op);
        const int dst = cp.dst_device, src = cp.src_device;
        const int t     = out[j].op.in[0];
        const int64_t a = out[j].op.in_col[0], b = a + cp.cols;
        size_t i = j;
        while (i > 0) {
            const OpDesc& prev   = out[i - 1];
            const bool prev_copy = prev.op.code == (uint16_t)OpCode::Copy;
            if (!prev_copy && dev_of(prev) != dst) break;
            bool touches = false;
            for (int x : prev.op.out)
                touches |= x == t;
            for (int k = 0; k < 4; ++k) {
                if (prev.op.in[k] != t) continue;
                const int64_t pa = prev.op.in_col[k],
                              pb = pa + (prev_copy ? plan::params<plan::CopyParams>(prev.op).cols
                                                   : in_cols(p, prev.op, k));
                touches |= prev_copy || (pa < b && a < pb);
            }
            if (touches) break;
            std::swap(out[i - 1], out[i]);
            --i;
        }
        if (i == 0) continue;
        OpDesc& prev  = out[i - 1];
        const auto pc = plan::params<plan::CopyParams>(prev.op);
        if (prev.op.code == (uint16_t)OpCode::Copy && prev.op.in[0] == t && pc.dst_device == dst &&
            pc.src_device == src) {
            const int64_t pa = prev.op.in_col[0], pb = pa + pc.cols;
            if (pa <= b && a <= pb) {
                prev.op.in_col[0] = prev.op.out_col[0] = (int32_t)std::min(a, pa);
                plan::set_params(prev.op,
                                 plan::CopyParams{(int32_t)(std::max(b, pb) - std::min(a, pa)), dst, src});
                out.erase(out.begin() + (std::ptrdiff_t)i);
                (dst == kHost ? st.copies_to_host : src == kHost ? st.copies_to_device : st.copies_peer)--;
                j = i - 1;
            }
        }
    }
    p.ops = std::move(out);
    return st;
}

} // namespace g4::cross_device
