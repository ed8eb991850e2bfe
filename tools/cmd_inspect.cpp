// `g4 inspect`: a plan's summary (format, model, policy, placement, memory, schedule), and by flag every
// tensor and op.
#include "compiler/placement.h"
#include "runtime/plan/launch_params.h"
#include "runtime/plan/op_params.h"
#include "runtime/plan/plan_reader.h"
#include "tools/cli_common.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

namespace g4::cli {

const Command kInspect = {
    "inspect",
    "PLAN [--verify] [--tensors] [--ops] [--all]",
    "Prints a plan's summary: format and g4 version, model hyper-parameters, generation defaults, policy, "
    "tokenizer, provenance (the sha256 of every input file), weights by dtype, placement, memory by device, "
    "and the CUDA kernels and schedule of a CUDA plan.",
    {{"--verify", nullptr,
      "also check the weights' checksum (every other section's checksum and every record are checked "
      "whenever "
      "a plan is opened)"},
     {"--tensors", nullptr, "also list every tensor: kind, shape, bytes, dtype, name"},
     {"--ops", nullptr, "also list every op of the program with its inputs and outputs"},
     {"--all", nullptr, "both lists"}}};

namespace {

using g4::placement::human;

int inspect_plan(int argc, char** argv) {
    Args a(argc, argv, 2, kInspect);
    if (a.pos.size() != 1) throw UsageError("expected exactly one PLAN argument");
    bool verify = a.flag.count("--verify") > 0;
    g4::plan::Plan p;
    std::string err;
    if (p.load(a.pos[0], verify, &err) != G4_OK) throw RunError(err);
    const auto& h              = p.header();
    const g4::plan::Meta& meta = p.meta(); // decoded and type-checked by p.load
    std::printf("plan %s: format %u.%u, %s, %llu bytes%s\n", a.pos[0].c_str(), h.format_major, h.format_minor,
                meta.architecture.c_str(), (unsigned long long)p.file_size(),
                verify ? ", weights checksum ok" : "");
    std::printf("g4 version %s, device %s, weights %s, KV cache %s\n", meta.g4_version.c_str(),
                meta.device.c_str(), meta.weights_dtype.c_str(), meta.policy.kv_dtype.c_str());
    std::printf("hparams: %s\n", to_json(meta.hparams).dump().c_str());
    std::printf("program: %s\n", to_json(meta.program).dump().c_str());
    std::printf("generation: %s\n", to_json(meta.generation).dump().c_str());
    std::printf("policy: %s\n", to_json(meta.policy).dump().c_str());
    std::printf("tokenizer: %s\n", to_json(meta.tokenizer).dump().c_str());
    std::printf("provenance: %s\n", to_json(meta.provenance).dump(2).c_str());

    std::map<std::string, std::pair<uint64_t, int>> by_dtype, by_kind;
    const char* kinds[] = {"weight", "activation", "kv_cache", "input"};
    for (size_t i = 0; i < p.n_tensors(); ++i) {
        const auto& t = p.tensor(i);
        if (t.kind == (uint8_t)g4::plan::TensorKind::Weight) {
            auto& d = by_dtype[g4::dtype_str((g4::DType)t.dtype)];
            d.first += t.nbytes, d.second++;
        }
        auto& k = by_kind[kinds[t.kind]];
        k.first += t.nbytes, k.second++;
    }
    std::printf("weights by dtype:\n");
    for (auto& [k, v] : by_dtype)
        std::printf("  %-6s %5d tensors %12s\n", k.c_str(), v.second, human(v.first).c_str());
    const auto& in = p.info();
    if (meta.placement) {
        const g4::plan::MetaPlacement& pl = *meta.placement;
        std::string layers;
        for (const auto& r : pl.layers)
            layers += (layers.empty() ? "" : ", ") + std::to_string(r.first) + "-" + std::to_string(r.last) +
                      " on " + r.device;
        const std::string ple = pl.ple == "host" ? "in pinned host memory (ple=host)" : "on " + pl.device;
        std::printf(
            "placement: text layers %s; embed on %s, lm_head on %s; PLE table %s%s; vision %s; audio %s\n",
            layers.c_str(), pl.embed.c_str(), pl.lm_head.c_str(), ple.c_str(),
            pl.ple_auto ? " (decided by the budget check)" : "", pl.vision.c_str(), pl.audio.c_str());
        if (pl.lm_head_screen)
            std::printf("LM head screening: %s\n",
                        !*pl.lm_head_screen  ? "off (decode steps compute every logit)"
                        : pl.device == "cpu" ? "on (greedy decode steps; its int8 copy built in host memory)"
                                             : "on (its int8 copy on the plan's GPU)");
        std::vector<g4::placement::DeviceMemory> mem;
        for (const g4::plan::MetaDeviceMemory& d : meta.memory) {
            g4::placement::DeviceMemory m;
            m.device     = d.device;
            m.parts      = d.parts;
            m.per_thread = d.scratch_per_thread;
            m.budget     = d.budget;
            m.sessions   = meta.placement->sessions;
            mem.push_back(m);
        }
        std::ostringstream table;
        g4::placement::print_memory(table, mem, "  ");
        const std::string counted =
            pl.sessions > 1 ? "; " + std::to_string(pl.sessions) + " sessions (g4 compile --max-sessions)"
                            : "";
        std::printf("memory by device (exact bytes%s%s):\n%s",
                    meta.device == "cuda" ? "; CUDA context and allocator overhead not included" : "",
                    counted.c_str(), table.str().c_str());
    } else {
        std::printf(
            "memory by device:\n  cpu    weights %s (mapped from the plan), activations %s, KV cache %s\n",
            human(p.weights_bytes()).c_str(), human(in.act_arena_bytes).c_str(),
            human(in.kv_arena_bytes).c_str());
    }
    std::printf("tensors %zu, ops %zu\n", p.n_tensors(), p.n_ops());
    if (meta.cuda) {
        const int hpg           = meta.cuda->attn_hpg;
        const std::string trace = meta.cuda->kernel_trace.empty() ? "off" : meta.cuda->kernel_trace;
        std::printf(
            "CUDA kernels: %s cubin + PTX; decode attention %s%s\n", meta.cuda->target.c_str(),
            hpg ? ("specialised for " + std::to_string(hpg) + " heads per KV group").c_str()
                : "generic (any group size <= 16)",
            trace == "off"
                ? ""
                : ("; timeline trace of " + trace + " (G4_TRACE_OUT writes it; not for use)").c_str());
    }
    if (p.n_launches()) {
        int kinds_n[9] = {}, mlp_f16 = 0, ple_fold = 0, mlp_fold = 0;
        for (size_t i = 0; i < p.n_launches(); ++i) {
            kinds_n[std::min<int>(p.launch(i).kind, 8)]++;
            const g4::plan::CudaLaunch& l = p.launch(i);
            const int folded              = g4::plan::launch_params<g4::plan::ResNormLaunch>(l).folded;
            if (l.kind == (uint16_t)g4::plan::LaunchKind::Mlp &&
                g4::plan::launch_params<g4::plan::MlpLaunch>(l).f16)
                ++mlp_f16;
            if (l.kind == (uint16_t)g4::plan::LaunchKind::ResNorm && folded == 1) ++ple_fold;
            if (l.kind == (uint16_t)g4::plan::LaunchKind::ResNorm && folded == 2) ++mlp_fold;
        }
        std::printf(
            "CUDA decode schedule: %zu fused launches and %d single ops per token: %d GEMV, %d QkvPost, %d "
            "QkvPost+attention, "
            "%d ResNorm, %d MLP (gate/up + down in one kernel; %d with packed-f16 products, %d with the "
            "ResNorm before, which is then not launched), %d attention-o (the attention's merge + o "
            "in one kernel), %d PLE (gate + projection in one kernel; %d with the ResNorm before, which is "
            "then not launched), %d PLE "
            "input (scale, norm, add, scale in one kernel)\n",
            p.n_launches() - kinds_n[0], kinds_n[0], kinds_n[2], kinds_n[3], kinds_n[4], kinds_n[1],
            kinds_n[5], mlp_f16, mlp_fold, kinds_n[6], kinds_n[7], ple_fold, kinds_n[8]);
        // Prefill kernel variants the compiler recorded (runtime/plan/plan_format.h).
        int flash = 0, split = 0, mm[5] = {};
        for (size_t i = 0; i < p.n_ops(); ++i) {
            const auto& op = p.op(i);
            if (op.code == (uint16_t)g4::OpCode::Attention)
                (g4::plan::params<g4::plan::AttentionParams>(op).prefill_splits == 0 ? flash : split)++;
            const int v = g4::plan::params<g4::plan::MatmulParams>(op).prefill_variant;
            if (op.code == (uint16_t)g4::OpCode::Matmul && v >= 0 && v < 5) mm[v]++;
        }
        std::printf("CUDA prefill: attention %d flash (tensor cores), %d split over keys (fp32); matmul %d "
                    "cuBLAS tier, "
                    "%d tensor-core, %d tiled fp32, %d per-row\n",
                    flash, split, mm[(int)g4::plan::MatmulVariant::Cublas],
                    mm[(int)g4::plan::MatmulVariant::TensorCore], mm[(int)g4::plan::MatmulVariant::Tiled64],
                    mm[(int)g4::plan::MatmulVariant::PerRow]);
    }
    const bool all = a.on("--all");
    if (!all && !a.on("--ops") && !a.on("--tensors"))
        std::printf("(--tensors lists the %zu tensors, --ops the %zu ops, --all both)\n", p.n_tensors(),
                    p.n_ops());
    if (all || a.flag.count("--tensors")) {
        std::printf("tensors:\n");
        for (size_t i = 0; i < p.n_tensors(); ++i) {
            const auto& t = p.tensor(i);
            std::string shape;
            for (int d = 0; d < t.ndim; ++d) {
                if (d) shape.push_back('x');
                shape.append(std::to_string(t.dims[d]));
            }
            std::string dt = g4::dtype_str((g4::DType)t.dtype);
            if (t.dtype == (uint8_t)g4::DType::NF4 && (t.quant_flags & g4::plan::kQuantDoubleQuant))
                dt += "-dq";
            std::printf("  %4zu %-10s %-14s %10s  %-6s %s\n", i, kinds[t.kind], shape.c_str(),
                        human(t.nbytes).c_str(), dt.c_str(), p.str(t.name));
        }
    }
    if (all || a.flag.count("--ops")) {
        std::printf("ops:\n");
        for (size_t i = 0; i < p.n_ops(); ++i) {
            const auto& op = p.op(i);
            std::string ins, outs;
            for (int32_t t : op.in)
                if (t >= 0) ins += std::string(ins.empty() ? "" : ", ") + p.str(p.tensor(t).name);
            for (int32_t t : op.out)
                if (t >= 0) outs += std::string(outs.empty() ? "" : ", ") + p.str(p.tensor(t).name);
            std::printf("  %4zu %-10s %-22s (%s) -> %s\n", i, g4::op_name((g4::OpCode)op.code),
                        p.str(op.name), ins.c_str(), outs.c_str());
        }
    }
    return 0;
}

} // namespace

// `g4 inspect`: a META field of another type than g4 wrote is an error naming the plan and the field.
int cmd_inspect(int argc, char** argv) {
    try {
        return inspect_plan(argc, argv);
    } catch (const RunError&) {
        throw;
    } catch (const UsageError&) {
        throw;
    } catch (const std::exception& e) { // what the plan's printing throws
        const Args a(argc, argv, 2, kInspect);
        throw RunError("plan " + a.pos.at(0) + ": " + e.what() + "; re-run g4 compile to rebuild the plan");
    }
}

} // namespace g4::cli
