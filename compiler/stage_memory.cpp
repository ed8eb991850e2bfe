// The memory-plan stage of `g4 compile` (compiler/stages.h): activations laid out by live range in one
// arena, weights and KV caches grouped by the devices that touch them, the session's workspaces and
// scratch; and the plan's figures for placement (compiler/placement.h), from the memory plan alone.
#include "compiler/stages.h"
#include "kernels/nf4.h"
#include "runtime/src/cpu_lm_head.h"
#include "runtime/src/cuda/workspace.h"
#include "runtime/src/encoder_program.h"

#include <algorithm>
#include <set>

namespace g4::stage {

using gemma4::Program;
using gemma4::TensorDesc;
using gemma4::WeightRole;
using plan::TensorKind;

// Greedy first-fit placement of activations by live range [first op, last op] over one arena.
uint64_t plan_activations(Program& p, std::vector<uint64_t>& offset) {
    const int nt = (int)p.tensors.size();
    std::vector<int> first(nt, -1), last(nt, -1);
    auto touch = [&](int t, int i) {
        if (t < 0) return;
        if (first[t] < 0) first[t] = i;
        last[t] = i;
    };
    for (int i = 0; i < (int)p.ops.size(); ++i) {
        for (int t : p.ops[i].op.in)
            touch(t, i);
        for (int t : p.ops[i].op.out)
            touch(t, i);
    }
    // A fused CUDA kernel (compiler/cuda_schedule.cpp) reads an op's inputs while it writes what the
    // next ops make of that op's outputs (gate/up GEMV + GeluMul writes the product while blocks still
    // read x), so every input lives until the first op that consumes the op's outputs.
    for (int i = (int)p.ops.size() - 1; i >= 0; --i)
        for (int o : p.ops[i].op.out) {
            if (o < 0) continue;
            int r = -1;
            for (int j = i + 1; j < (int)p.ops.size() && r < 0; ++j)
                for (int t : p.ops[j].op.in)
                    if (t == o) r = j;
            for (int t : p.ops[i].op.in)
                if (t >= 0 && r > last[t]) last[t] = r;
        }
    auto first_reader = [&](int t, int after) {
        for (int j = after + 1; j < (int)p.ops.size(); ++j)
            for (int x : p.ops[j].op.in)
                if (x == t) return j;
        return -1;
    };
    auto code     = [&](int j) { return (OpCode)p.ops[j].op.code; };
    auto producer = [&](int t, int before) {
        for (int j = before - 1; j >= 0; --j)
            for (int o : p.ops[j].op.out)
                if (o == t) return j;
        return -1;
    };
    // The fused decode MLP (g4_mlp_nf4, sm_90 plans) still reads the gate/up input while it adds into the
    // down projection's output: that input lives until the down's output is consumed.
    // Where it runs the ResNorm before it (cuda_schedule.cpp mlp_fold), every block reads that ResNorm's
    // residual x and attention output d while block 0 writes x1 and the blocks add into the MLP's output y,
    // which the ResNorm making the layer's q/k/v input zeroes. So x and d live until y is consumed too, and y
    // lives from the residual add before the layer's q/k/v input on. Chain: x, d -> Add -> x1 -> RmsNorm ->
    // xn -> gate Matmul -> GeluMul -> down Matmul -> y; the layer's Attention op reads q, made by a Matmul of
    // the q/k/v input.
    for (int k = 0; k < (int)p.ops.size(); ++k) {
        if (code(k) != OpCode::GeluMul) continue;
        const int m = first_reader(p.ops[k].op.out[0], k);
        if (m < 0 || code(m) != OpCode::Matmul) continue;
        const int r = std::max(m, first_reader(p.ops[m].op.out[0], m));
        for (int pi = k - 1; pi >= 0 && pi >= k - 2; --pi)
            if (code(pi) == OpCode::Matmul && p.ops[pi].op.in[0] >= 0)
                last[p.ops[pi].op.in[0]] = std::max(last[p.ops[pi].op.in[0]], r);
        const int ga = producer(p.ops[k].op.in[0], k), y = p.ops[m].op.out[0];
        if (ga < 0 || code(ga) != OpCode::Matmul || y < 0 || first[y] < 0) continue;
        const int pn = producer(p.ops[ga].op.in[0], ga),
                  ad = pn >= 0 && code(pn) == OpCode::RmsNorm ? producer(p.ops[pn].op.in[0], pn) : -1;
        if (ad < 0 || code(ad) != OpCode::Add) continue;
        for (int t : {p.ops[ad].op.in[0], p.ops[ad].op.in[1]})
            if (t >= 0) last[t] = std::max(last[t], r);
        for (int a = ad - 1; a >= 0; --a) {
            if (code(a) != OpCode::Attention || p.ops[a].op.layer != p.ops[m].op.layer) continue;
            const int q = p.ops[a].op.in[0], qm = q >= 0 ? first[q] : -1;
            if (qm < 0 || code(qm) != OpCode::Matmul || p.ops[qm].op.in[0] < 0) break;
            const int qn = producer(p.ops[qm].op.in[0], qm);
            const int x2 = qn >= 0 && code(qn) == OpCode::RmsNorm ? p.ops[qn].op.in[0] : p.ops[qm].op.in[0];
            if (x2 >= 0 && first[x2] >= 0) first[y] = std::min(first[y], first[x2]);
            break;
        }
    }
    // The decode attention's merge + o projection (g4_attn_o_nf4, sm_90 plans) adds into the o output, which
    // the ResNorm making the layer's q/k/v input zeroes: the o output lives from that input's making on.
    for (int a = 0; a < (int)p.ops.size(); ++a) {
        if (p.ops[a].op.code != (uint16_t)OpCode::Attention || p.ops[a].op.in[0] < 0) continue;
        const int m = first_reader(p.ops[a].op.out[0], a), qm = first[p.ops[a].op.in[0]];
        if (m < 0 || p.ops[m].op.code != (uint16_t)OpCode::Matmul || qm < 0 ||
            p.ops[qm].op.code != (uint16_t)OpCode::Matmul)
            continue;
        const int y = p.ops[m].op.out[0], xn = p.ops[qm].op.in[0];
        if (y >= 0 && xn >= 0 && first[xn] >= 0 && first[y] >= 0) first[y] = std::min(first[y], first[xn]);
    }
    // The per-layer-input projection after a ResNorm folded into its kernel (cuda_schedule.cpp ple_fold): the
    // MLP before zeroes its output y while blocks still read the MLP's input xn, and the projection adds into
    // y while its blocks read the residual and the MLP's output: y lives from xn's making on. Chain: xn ->
    // gate/up Matmul -> GeluMul -> down Matmul -> d [in-place RmsNorm] -> Add -> PLE gate Matmul -> GeluMul
    // -> projection.
    for (int k = 0; k < (int)p.ops.size(); ++k) {
        if (code(k) != OpCode::GeluMul) continue;
        const int pr = first_reader(p.ops[k].op.out[0], k), g = producer(p.ops[k].op.in[0], k);
        if (pr < 0 || code(pr) != OpCode::Matmul || g < 0 || code(g) != OpCode::Matmul) continue;
        const int a = producer(p.ops[g].op.in[0], g);
        if (a < 0 || code(a) != OpCode::Add) continue;
        for (int d : {p.ops[a].op.in[0], p.ops[a].op.in[1]}) {
            int dn = producer(d, a);
            if (dn >= 0 && code(dn) == OpCode::RmsNorm && p.ops[dn].op.in[0] == d && p.ops[dn].op.out[0] == d)
                dn = producer(d, dn);
            if (dn < 0 || code(dn) != OpCode::Matmul) continue;
            const int u = producer(p.ops[dn].op.in[0], dn);
            if (u < 0 || code(u) != OpCode::GeluMul) continue;
            const int ga = producer(p.ops[u].op.in[0], u);
            if (ga < 0 || code(ga) != OpCode::Matmul) continue;
            const int y = p.ops[pr].op.out[0], xn = p.ops[ga].op.in[0];
            if (y >= 0 && xn >= 0 && first[xn] >= 0 && first[y] >= 0)
                first[y] = std::min(first[y], first[xn]);
        }
    }
    // Inputs and logits live for the whole step (written before / read after the program).
    const int n_ops = (int)p.ops.size();
    if (p.ids >= 0) first[p.ids] = 0, last[p.ids] = n_ops;
    if (p.logits >= 0) last[p.logits] = n_ops;
    for (int t = 0; t < nt; ++t) // (an encoder program's inputs, like the ids)
        if (p.tensors[t].kind == TensorKind::Input && first[t] >= 0) first[t] = 0, last[t] = n_ops;

    struct Block {
        uint64_t off, size;
        int first, last;
    };
    std::vector<Block> placed;
    std::vector<int> order;
    for (int t = 0; t < nt; ++t) {
        auto k = p.tensors[t].kind;
        if ((k == TensorKind::Activation || k == TensorKind::Input) && first[t] >= 0) order.push_back(t);
    }
    auto bytes = [&](int t) { return dtype_bytes(p.tensors[t].dtype, numel(p.tensors[t].dims)); };
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return bytes(a) > bytes(b); });
    uint64_t arena = 0;
    offset.assign(nt, 0);
    for (int t : order) {
        uint64_t size = align_up(bytes(t), plan::kTensorAlign);
        std::vector<std::pair<uint64_t, uint64_t>> busy;
        for (const Block& b : placed)
            if (!(b.last < first[t] || last[t] < b.first)) busy.push_back({b.off, b.off + b.size});
        std::sort(busy.begin(), busy.end());
        uint64_t off = 0;
        for (auto& [b0, b1] : busy) {
            if (off + size <= b0) break;
            off = std::max(off, b1);
        }
        placed.push_back({off, size, first[t], last[t]});
        offset[t] = off;
        arena     = std::max(arena, off + size);
    }
    return arena;
}

// Each program's activations in its own arena: plan_activations over that program's ops (tensors keep their
// indices); sets r.arena_bytes. The text program is ranges[0] (its ids and logits live for the whole step).
void plan_program_activations(const Program& prog, std::vector<ProgramRange>& ranges,
                              std::vector<uint64_t>& offset) {
    offset.assign(prog.tensors.size(), 0);
    for (size_t k = 0; k < ranges.size(); ++k) {
        ProgramRange& r = ranges[k];
        Program sub;
        sub.tensors = prog.tensors;
        sub.ops.assign(prog.ops.begin() + r.op_begin, prog.ops.begin() + r.op_end);
        sub.ids    = k == 0 ? prog.ids : -1;
        sub.logits = k == 0 ? prog.logits : r.outputs.empty() ? -1 : r.outputs[0];
        std::vector<uint64_t> off;
        r.arena_bytes = plan_activations(sub, off);
        for (size_t t = r.tensor_begin; t < r.tensor_end; ++t)
            offset[t] = off[t];
    }
}

// Byte sizes and memory plan.
void lay_out_memory(const Inputs& in, BuiltPlan& b, Report* rep) {
    const CompileOptions& opt   = in.opt;
    auto& prog                  = b.prog;
    const bool hybrid           = b.hybrid;
    const size_t n_text_tensors = b.n_text_tensors;
    auto& act_off               = b.act_off;
    auto& off                   = b.off;
    auto& nbytes                = b.nbytes;
    auto& act_arena             = b.act_arena;
    auto& kv_arena              = b.kv_arena;
    auto& weights_size          = b.weights_size;
    auto& max_k                 = b.max_k;
    auto& op_dev                = b.op_dev;
    auto& gpus                  = b.gpus;
    auto& group                 = b.group;
    auto& towers_group          = b.towers_group;
    auto& host_group            = b.host_group;
    auto& worder                = b.worder;
    auto& kvorder               = b.kvorder;
    auto& wstart                = b.wstart;
    auto& kstart                = b.kstart;
    const bool dq               = opt.double_quant;
    plan_program_activations(prog, b.programs, act_off);
    act_arena = b.programs[0].arena_bytes;
    off.assign(prog.tensors.size(), 0);
    nbytes.assign(prog.tensors.size(), 0);
    // Cross-device plans: weights and caches are grouped by the devices whose ops touch them, so each
    // GPU uploads at most two ranges of the weights section (those several GPUs read, then its own)
    // and owns one range of the KV arena; what no GPU touches (CPU-placed layers) goes last. Relative
    // order is kept within a group (a LoRA bias follows its weight).
    op_dev.assign(hybrid ? prog.ops.size() : 0, 0);
    group.assign(prog.tensors.size(), 0);
    if (hybrid) {
        gpus.push_back(in.cuda_index);
        std::vector<std::set<int>> touched(prog.tensors.size());
        for (size_t i = 0; i < prog.ops.size(); ++i) {
            const auto& op = prog.ops[i].op;
            op_dev[i]      = cross_device::op_device(op, in.layer_device, in.cuda_index);
            if (op_dev[i] >= 0 && std::find(gpus.begin(), gpus.end(), op_dev[i]) == gpus.end())
                gpus.push_back(op_dev[i]);
            if (op.code == (uint16_t)OpCode::Copy) continue;
            for (int32_t t : {op.in[0], op.in[1], op.in[2], op.in[3], op.out[0], op.out[1]})
                if (t >= 0) touched[t].insert(op_dev[i]);
        }
        // Groups: 0 weights read by several GPUs, 1 + g GPU g's own, 1 + gpus.size() no GPU's.
        for (size_t t = 0; t < prog.tensors.size(); ++t) {
            std::set<int> g = touched[t];
            g.erase(cross_device::kHost);
            if (g.size() > 1 && prog.tensors[t].kind == TensorKind::KvCache)
                throw CompileError("internal: KV cache '" + prog.tensors[t].name +
                                   "' is touched by ops on several GPUs");
            group[t] = g.empty() ? 1 + (int)gpus.size()
                       : g.size() > 1
                           ? 0
                           : 1 + (int)(std::find(gpus.begin(), gpus.end(), *g.begin()) - gpus.begin());
        }
    }
    towers_group = 2 + (int)gpus.size(); // after the host group
    for (size_t t = n_text_tensors; t < prog.tensors.size(); ++t)
        group[t] = towers_group;
    for (size_t t = 0; t < prog.tensors.size(); ++t) {
        const TensorDesc& d = prog.tensors[t];
        nbytes[t]           = d.dtype == DType::NF4 ? nf4::layout(numel(d.dims), dq).total
                                                    : dtype_bytes(d.dtype, numel(d.dims));
        if (d.kind == TensorKind::Weight && d.dims.size() == 2 && t < n_text_tensors)
            max_k = std::max(max_k, d.dims[1]);
        if (d.kind != TensorKind::Weight && d.kind != TensorKind::KvCache) off[t] = act_off[t];
    }
    // Lays out the tensors of `kind` group by group, each aligned (weights plan::kWeightAlign, caches
    // kTensorAlign), in `order`; returns where each group starts (and, last, the end).
    auto lay_out = [&](TensorKind kind, uint64_t& size, std::vector<size_t>& order) {
        const uint64_t align = kind == TensorKind::Weight ? plan::kWeightAlign : plan::kTensorAlign;
        std::vector<uint64_t> starts;
        for (int g = 0; g <= towers_group; ++g) {
            starts.push_back(size);
            for (size_t t = 0; t < prog.tensors.size(); ++t) {
                if (prog.tensors[t].kind != kind || group[t] != g) continue;
                size   = align_up(size, align);
                off[t] = size;
                size += nbytes[t];
                order.push_back(t);
            }
        }
        starts.push_back(size);
        return starts;
    };
    wstart             = lay_out(TensorKind::Weight, weights_size, worder);
    kstart             = lay_out(TensorKind::KvCache, kv_arena, kvorder);
    host_group         = 1 + gpus.size();
    rep->host_weights  = wstart[host_group + 1] - wstart[host_group];
    rep->tower_weights = wstart[towers_group + 1] - wstart[towers_group];
    for (size_t t = n_text_tensors; t < prog.tensors.size(); ++t) { // each tower's weights contiguous
        if (prog.tensors[t].kind != TensorKind::Weight) continue;
        const bool vision = tower_group_name(prog.tensors[t].name) == "vision tower";
        uint64_t& b       = vision ? rep->vision_begin : rep->audio_begin;
        uint64_t& e       = vision ? rep->vision_end : rep->audio_end;
        if (e == 0) b = off[t];
        e = off[t] + nbytes[t];
    }
    rep->host_kv = kv_arena - kstart[host_group];
}

void session_figures(const Inputs& in, const BuiltPlan& b, Report* rep) {
    const CompileOptions& opt = in.opt;
    const auto& hp            = in.mc.text;
    auto& bo                  = b.bo;
    auto& prog                = b.prog;
    auto& nbytes              = b.nbytes;
    auto& act_arena           = b.act_arena;
    auto& kv_arena            = b.kv_arena;
    auto& weights_size        = b.weights_size;
    auto& max_k               = b.max_k;
    auto& op_dev              = b.op_dev;
    auto& gpus                = b.gpus;
    auto& wstart              = b.wstart;
    auto& kstart              = b.kstart;
    auto& tensors             = b.tensors;
    auto& ops                 = b.ops;
    auto& schedule            = b.schedule;
    // Session memory beyond the arenas: CUDA workspaces (runtime/src/cuda/workspace.h, which the
    // runtime allocates from), CPU per-thread scratch.
    {
        rep->cuda_workspace =
            cuda_ws::workspace(ops.data(), b.n_text_ops, tensors.data(), opt.max_rows, in.max_context,
                               hp.vocab_size, true, nullptr, 0, schedule.data(), schedule.size())
                .device_bytes();
        for (size_t g = 0; g < gpus.size(); ++g) {
            auto& f     = rep->gpus[gpus[g]];
            f.workspace = cuda_ws::workspace(ops.data(), b.n_text_ops, tensors.data(), opt.max_rows,
                                             in.max_context, hp.vocab_size, g == 0, op_dev.data(), gpus[g],
                                             schedule.data(), schedule.size())
                              .device_bytes();
            f.weights = (wstart[1] - wstart[0]) + (wstart[2 + g] - wstart[1 + g]);
            f.kv      = kstart[2 + g] - kstart[1 + g];
        }
        rep->cuda_pinned =
            cuda_ws::pinned_bytes(opt.max_rows, opt.logits_rows, hp.vocab_size, in.max_context);
        rep->cpu_scratch_per_thread = (uint64_t)std::max<int64_t>(32 * max_k, in.max_context + 64) * 4;
        const int li = cuda_ws::lm_screen_launch(schedule.data(), schedule.size(), ops.data(), tensors.data(),
                                                 prog.logits);
        if (li >= 0 && gpus.size() <= 1) {
            const plan::PlanTensor& head =
                tensors[ops[plan::launch_params<plan::GemvLaunch>(schedule[li]).mat0].in[1]];
            rep->lm_screen         = cuda_ws::lm_screen_bytes(head);
            rep->lm_screen_session = cuda_ws::lm_screen_session_bytes(head);
        }
        rt::CpuLmHead head; // CPU plans of the fast precision: the bf16 head's int8 copy (cpu_lm_head.h)
        if (in.cuda_index < 0 && opt.cpu_precision != "f32" &&
            rt::find_cpu_lm_head(ops.data(), b.n_text_ops, tensors.data(), prog.logits, &head))
            rep->lm_screen = head.copy_bytes();
        if (!opt.lm_screen) rep->lm_screen = rep->lm_screen_session = 0;
    }
    rep->weights_bytes = weights_size;
    for (size_t t = 0; t < prog.tensors.size(); ++t)
        if (prog.tensors[t].kind == TensorKind::Weight && prog.tensors[t].role == WeightRole::PleTable)
            rep->ple_table_bytes += nbytes[t];
    for (size_t k = 1; k < b.programs.size(); ++k) { // runtime/src/encoder_program.cpp encoder_arena_bytes
        const uint64_t arena = (std::max<uint64_t>(b.programs[k].arena_bytes, 64) + 63) / 64 * 64;
        if (b.programs[k].device < 0) rep->encoder_arenas += arena;
        if (b.programs[k].device < 0 && b.programs[k].name == "audio") rep->audio_arena = arena;
        if (b.programs[k].name == "vision") rep->vision_program_gpu = arena + rt::kEncoderStepBytes;
        if (b.programs[k].name == "audio") rep->audio_program_gpu = arena + rt::kEncoderStepBytes;
    }
    rep->act_arena     = act_arena;
    rep->kv_arena      = kv_arena;
    rep->kv_dtype      = dtype_str(bo.kv_dtype);
    rep->sliding_slots = prog.sliding_slots;
    rep->n_ops         = ops.size();
    rep->n_tensors     = tensors.size();
}

BuiltPlan build_plan(const Inputs& in, Mode mode, Report* rep) {
    BuiltPlan b;
    b.mode = mode;
    build_graph(in, b, rep);
    choose_storage(in, b, rep);
    lay_out_memory(in, b, rep);
    make_records(in, b);
    session_figures(in, b, rep);
    return b;
}

placement::Figures figures_of(const Inputs& in, const Report& r, bool cpu_layers) {
    placement::Figures f;
    f.weights             = r.weights_bytes;
    f.ple_table           = r.ple_table_bytes;
    f.activations         = r.act_arena;
    f.kv_cache            = r.kv_arena;
    f.attention_workspace = r.cuda_workspace;
    f.scratch_per_thread  = r.cpu_scratch_per_thread;
    f.pinned              = r.cuda_pinned;
    f.kv_dtype            = r.kv_dtype;
    f.host_weights        = r.host_weights;
    f.host_kv             = r.host_kv;
    f.gpus                = r.gpus;
    f.tower_weights       = r.tower_weights;
    f.tower_buffers       = in.tower_session_bytes;
    f.encoder_arenas      = r.encoder_arenas;
    f.audio_arena         = r.audio_arena;
    f.vision_weights      = r.vision_end - r.vision_begin;
    f.vision_gpu_buffers  = r.vision_program_gpu;
    f.lm_screen           = r.lm_screen;
    f.lm_screen_session   = r.lm_screen_session;
    f.audio_weights       = r.audio_end - r.audio_begin;
    f.audio_gpu_buffers   = r.audio_program_gpu;
    if (!in.tower_names.empty() || !in.encoders.empty()) {
        f.tower_buffers_vision_gpu = rt::media_block(in.towers.sizing(true, false)).total();
        f.tower_buffers_audio_gpu  = rt::media_block(in.towers.sizing(false, true)).total();
        f.tower_buffers_both_gpu   = rt::media_block(in.towers.sizing(true, true)).total();
    }
    if (cpu_layers) {
        f.host_activations        = r.act_arena;
        f.host_scratch_per_thread = r.cpu_scratch_per_thread;
    }
    return f;
}

placement::Figures figures_with(Inputs& in, bool cpu_layers, int max_context,
                                const std::vector<int>& layer_device) {
    const int keep_context = in.max_context;
    const auto keep_layers = in.layer_device;
    in.max_context         = max_context;
    in.layer_device        = layer_device;
    Report r;
    build_plan(in, Mode::Plan, &r);
    in.max_context  = keep_context;
    in.layer_device = keep_layers;
    return figures_of(in, r, cpu_layers);
}

Report plan_memory(const Inputs& in) {
    Report rep;
    const BuiltPlan b = build_plan(in, Mode::Plan, &rep);
    size_groups(in, b, &rep);
    return rep;
}

} // namespace g4::stage
