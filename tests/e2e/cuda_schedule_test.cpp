// The fused decode schedule of sm_90 plans (compiler/cuda_schedule.cpp), checked from the compiled plan
// itself (no GPU needed): each kernel that adds into an output it does not zero itself (Mlp, AttnO, Ple) has
// a ResNorm launch before it that zeroes exactly that output, no launch in between touches the output's
// arena bytes, the Mlp and AttnO weights are stored tiled and no other weight is; --deterministic plans
// fuse none of them. The fused MLPs' output replicas: the compiler's choice by shape, the --mlp-replicas
// option, the reader's checks and the workspace they take. Their arithmetic (--mlp-precision).
#include "compiler/cuda_schedule.h"
#include "runtime/plan/plan_reader.h"
#include "runtime/src/cuda/workspace.h"
#include "test_util.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <gtest/gtest.h>
#include <set>

namespace {

using namespace g4test;
using g4::plan::CudaLaunch;
using g4::plan::LaunchKind;
using g4::plan::PlanTensor;

// Whether tensors a and b share arena bytes (activations and inputs live in one arena; other kinds never do).
bool overlap(const g4::plan::Plan& p, int32_t a, int32_t b) {
    if (a < 0 || b < 0) return false;
    const PlanTensor &x = p.tensor(a), &y = p.tensor(b);
    auto arena = [](const PlanTensor& t) {
        return t.kind == (uint8_t)g4::plan::TensorKind::Activation ||
               t.kind == (uint8_t)g4::plan::TensorKind::Input;
    };
    if (!arena(x) || !arena(y)) return false;
    return x.offset < y.offset + y.nbytes && y.offset < x.offset + x.nbytes;
}

void compile_sm90(TempDir& td, const std::string& fx, const std::string& flags, g4::plan::Plan* p) {
    std::string path = td.file(fx + (flags.empty() ? "" : "_det") + ".g4plan");
    CmdResult r =
        run_g4("compile --model '" + fixture(fx) +
               "' --device cuda --target sm_90 --weights nf4 --no-fidelity " + flags + " -o '" + path + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::string err;
    ASSERT_EQ(p->load(path, false, &err), G4_OK) << err;
}

// The sm_90 plan of fixture fx compiled to td's `name`.g4plan with the extra `g4 compile` flags, loaded into
// p; returns its path.
std::string compile_sm90_with(TempDir& td, const std::string& fx, const std::string& name,
                              const std::string& flags, g4::plan::Plan* p) {
    const std::string path = td.file(name + ".g4plan");
    CmdResult r =
        run_g4("compile --model '" + fixture(fx) +
               "' --device cuda --target sm_90 --weights nf4 --no-fidelity " + flags + " -o '" + path + "'");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::string err;
    EXPECT_EQ(p->load(path, false, &err), G4_OK) << err;
    return path;
}

// Compiling e2b_tiny for sm_90 with `option val` must fail, name the option and its value, and leave no plan;
// returns the compiler's error.
std::string expect_option_refused(TempDir& td, const std::string& option, const std::string& val) {
    const std::string path = td.file("bad" + option + ".g4plan");
    CmdResult r            = run_g4("compile --model '" + fixture("e2b_tiny") +
                                    "' --device cuda --target sm_90 --weights nf4 --no-fidelity " + option + " '" + val +
                                    "' -o '" + path + "'");
    EXPECT_NE(r.exit_code, 0) << option << " " << val;
    EXPECT_NE(r.err.find(option + " '" + val + "'"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(path)) << option << " " << val;
    return r.err;
}

// A copy of the plan at `path` whose CUDA schedule records `edit` changes, with the checksums recomputed
// (reseal_plan) so that only the records are wrong: loading it must fail with `want` in the message.
template <class Edit>
void expect_corrupt(TempDir& td, const std::string& path, const std::string& name, Edit edit,
                    const std::string& want) {
    std::string b = read_file(path);
    g4::plan::PlanHeader h;
    std::memcpy(&h, b.data(), sizeof h);
    bool found = false;
    for (uint32_t k = 0; k < h.section_count; ++k) {
        g4::plan::PlanSection sec;
        char* at = b.data() + h.section_table_offset + k * sizeof sec;
        std::memcpy(&sec, at, sizeof sec);
        if (sec.kind != (uint32_t)g4::plan::SectionKind::CudaSchedule) continue;
        edit(reinterpret_cast<CudaLaunch*>(b.data() + sec.offset));
        found = true;
    }
    ASSERT_TRUE(found) << name << ": no CUDA schedule section";
    reseal_plan(&b);
    const std::string bad = td.file(name + ".g4plan");
    write_file(bad, b);
    g4::plan::Plan c;
    std::string e;
    EXPECT_NE(c.load(bad, false, &e), G4_OK) << name;
    EXPECT_NE(e.find(want), std::string::npos) << name << ": " << e;
}

TEST(CudaSchedule, ZeroedOutputsStayUntouchedUntilTheirKernel) {
    G4_SKIP_WITHOUT_NVRTC();
    TempDir td;
    for (const std::string fx : {"e2b_tiny", "e4b_tiny"}) {
        g4::plan::Plan p;
        compile_sm90(td, fx, "", &p);
        ASSERT_GT(p.n_launches(), 0u) << fx;
        int fused[3] = {0, 0, 0}; // Mlp, AttnO, Ple
        std::set<int32_t> tiled;  // the weights the fused kernels read tiled
        for (size_t li = 0; li < p.n_launches(); ++li) {
            const CudaLaunch& l = p.launch(li);
            const bool mlp = l.kind == (uint16_t)LaunchKind::Mlp, ao = l.kind == (uint16_t)LaunchKind::AttnO;
            const bool ple = l.kind == (uint16_t)LaunchKind::GatedProj;
            if (!mlp && !ao && !ple) continue;
            ++fused[ple ? 2 : ao];
            const int32_t wop = mlp ? l.ip[3] : ple ? l.op + 2 : l.op, y = p.op(wop).out[0];
            if (!ple) tiled.insert(p.op(wop).in[1]);
            EXPECT_EQ(!ple, (p.tensor(p.op(wop).in[1]).quant_flags & g4::plan::kQuantTiled32) != 0)
                << fx << " launch " << li;
            size_t z = li; // the ResNorm launch that zeroes y
            while (z-- > 0 && !(p.launch(z).kind == (uint16_t)LaunchKind::ResNorm && p.launch(z).t[7] == y)) {
            }
            ASSERT_LT(z, li) << fx << " launch " << li << ": no ResNorm zeroes its output";
            const CudaLaunch& rn = p.launch(z);
            EXPECT_FALSE(overlap(p, y, rn.t[4])) << fx << " launch " << li;
            EXPECT_FALSE(overlap(p, y, rn.t[6])) << fx << " launch " << li;
            // Every op between the ResNorm and the fused kernel, and the input the fused MLP still reads
            // while it adds (its intermediates are never written).
            for (int32_t j = rn.op + rn.count; j < l.op; ++j) {
                for (int32_t t : p.op(j).in)
                    EXPECT_FALSE(overlap(p, y, t)) << fx << " launch " << li << " op " << p.str(p.op(j).name);
                for (int32_t t : p.op(j).out)
                    EXPECT_FALSE(overlap(p, y, t)) << fx << " launch " << li << " op " << p.str(p.op(j).name);
            }
            if (mlp) {
                EXPECT_FALSE(overlap(p, y, p.op(l.ip[0]).in[0])) << fx << " launch " << li;
            }
            if (ple) { // the gate's input and the per-layer input
                EXPECT_FALSE(overlap(p, y, p.op(l.op).in[0])) << fx << " launch " << li;
                EXPECT_FALSE(overlap(p, y, p.op(l.op + 1).in[1])) << fx << " launch " << li;
            }
        }
        EXPECT_GT(fused[0], 0) << fx;
        EXPECT_GT(fused[1], 0) << fx;
        EXPECT_GT(fused[2], 0) << fx;
        for (size_t t = 0; t < p.n_tensors(); ++t)
            if (p.tensor(t).quant_flags & g4::plan::kQuantTiled32) {
                EXPECT_TRUE(tiled.count((int32_t)t)) << fx << " " << p.str(p.tensor(t).name);
            }

        g4::plan::Plan d;
        compile_sm90(td, fx, "--deterministic", &d);
        for (size_t li = 0; li < d.n_launches(); ++li)
            EXPECT_TRUE(d.launch(li).kind != (uint16_t)LaunchKind::Mlp &&
                        d.launch(li).kind != (uint16_t)LaunchKind::AttnO &&
                        d.launch(li).kind != (uint16_t)LaunchKind::GatedProj)
                << fx;
        for (size_t t = 0; t < d.n_tensors(); ++t)
            EXPECT_FALSE(d.tensor(t).quant_flags & g4::plan::kQuantTiled32) << fx;
    }
}

// The first layer's input norm (no residual add before it) is a ResNorm launch without the residual branch:
// x and the weight in, xn out, nothing else; it is the only such launch, the first after the step's
// preamble, and the CPU ops' norm it covers is that layer's.
// A fused launch names the tensors of the ops it covers, where its kernel reads them: a record naming other
// tensors (here a cache, a zeroed buffer, an epilogue output, a q/k/v operand) is refused at open, before a
// kernel could write through it.
TEST(CudaSchedule, LaunchOperandsAreTheirOpsTensors) {
    G4_SKIP_WITHOUT_NVRTC();
    TempDir td;
    g4::plan::Plan p;
    compile_sm90(td, "e2b_tiny", "", &p);
    const std::string path = td.file("e2b_tiny.g4plan");
    int qkv = -1, rn = -1, gemv = -1, pin = -1;
    for (size_t i = 0; i < p.n_launches(); ++i) {
        const CudaLaunch& l = p.launch(i);
        if (qkv < 0 && (l.kind == (uint16_t)LaunchKind::QkvPost || l.kind == (uint16_t)LaunchKind::QkvAttn) &&
            l.t[6] >= 0)
            qkv = (int)i;
        if (rn < 0 && l.kind == (uint16_t)LaunchKind::ResNorm && l.t[1] >= 0 && l.t[7] >= 0) rn = (int)i;
        if (gemv < 0 && l.kind == (uint16_t)LaunchKind::Gemv && l.ip[4] != 0) gemv = (int)i;
        if (pin < 0 && l.kind == (uint16_t)LaunchKind::GroupNormAdd) pin = (int)i;
    }
    ASSERT_GE(qkv, 0);
    ASSERT_GE(rn, 0);
    ASSERT_GE(gemv, 0);
    ASSERT_GE(pin, 0);
    int32_t other_cache = -1, weight = -1; // a cache the record's store does not write; a weight
    for (size_t t = 0; t < p.n_tensors(); ++t) {
        if (p.tensor(t).kind == (uint8_t)g4::plan::TensorKind::KvCache && (int32_t)t != p.launch(qkv).t[6] &&
            (int32_t)t != p.launch(qkv).t[7] && other_cache < 0)
            other_cache = (int32_t)t;
        if (p.tensor(t).kind == (uint8_t)g4::plan::TensorKind::Weight && weight < 0) weight = (int32_t)t;
    }
    ASSERT_GE(other_cache, 0);
    const std::string rec = "CUDA schedule record ";
    expect_corrupt(
        td, path, "qkv_cache", [&](CudaLaunch* r) { r[qkv].t[6] = other_cache; },
        rec + std::to_string(qkv) + ": the k/v norms");
    expect_corrupt(
        td, path, "qkv_q", [&](CudaLaunch* r) { r[qkv].t[0] = r[qkv].t[3]; },
        rec + std::to_string(qkv) + ": the q norm");
    expect_corrupt(
        td, path, "qkv_slots", [&](CudaLaunch* r) { r[qkv].ip[3] += 7; }, rec + std::to_string(qkv));
    expect_corrupt(
        td, path, "rn_zero", [&](CudaLaunch* r) { r[rn].t[7] = weight; },
        rec + std::to_string(rn) + ": the buffer it zeroes");
    expect_corrupt(
        td, path, "rn_x", [&](CudaLaunch* r) { r[rn].t[4] = weight; }, rec + std::to_string(rn));
    expect_corrupt(
        td, path, "gemv_out", [&](CudaLaunch* r) { r[gemv].t[1] = weight; }, rec + std::to_string(gemv));
    expect_corrupt(
        td, path, "ple_in_out", [&](CudaLaunch* r) { r[pin].t[3] = r[pin].t[2]; },
        rec + std::to_string(pin) + ": the per-layer-input");
}

TEST(CudaSchedule, FirstInputNormIsAResNorm) {
    G4_SKIP_WITHOUT_NVRTC();
    TempDir td;
    for (const std::string fx : {"e2b_tiny", "e4b_tiny"}) {
        g4::plan::Plan p;
        compile_sm90(td, fx, "", &p);
        int lone = 0;
        for (size_t li = 0; li < p.n_launches(); ++li) {
            const CudaLaunch& l = p.launch(li);
            if (l.kind != (uint16_t)LaunchKind::ResNorm || l.t[1] >= 0) continue;
            ++lone;
            EXPECT_EQ(l.count, 1) << fx;
            EXPECT_EQ(p.op(l.op).code, (uint16_t)g4::OpCode::RmsNorm) << fx;
            EXPECT_EQ(p.op(l.op).layer, 0) << fx;
            EXPECT_EQ(l.t[0], p.op(l.op).in[0]) << fx;
            EXPECT_EQ(l.t[5], p.op(l.op).in[1]) << fx;
            EXPECT_EQ(l.t[6], p.op(l.op).out[0]) << fx;
            EXPECT_EQ(l.t[2], -1) << fx;
            EXPECT_EQ(l.t[3], -1) << fx;
            EXPECT_EQ(l.t[4], -1) << fx;
            EXPECT_EQ(l.fp[1], 1.0f) << fx;
            EXPECT_EQ(l.ip[0], p.op(l.op).ip[0]) << fx;
            for (size_t k = 0; k < li; ++k)
                EXPECT_NE(p.launch(k).kind, (uint16_t)LaunchKind::ResNorm) << fx << " launch " << k;
        }
        EXPECT_EQ(lone, 1) << fx;
    }
}

// The per-layer inputs' combination (scale, grouped norm, add, scale) is one GroupNormAdd launch on every
// CUDA target: the four ops, in order, with their tensors; a record with a group size that does not divide N
// is refused at load.
TEST(CudaSchedule, PerLayerInputsInOneLaunch) {
    G4_SKIP_WITHOUT_NVRTC();
    TempDir td;
    for (const std::string fx : {"e2b_tiny", "e4b_tiny"}) {
        g4::plan::Plan p;
        compile_sm90(td, fx, "", &p);
        size_t at = 0;
        int n     = 0;
        for (size_t li = 0; li < p.n_launches(); ++li)
            if (p.launch(li).kind == (uint16_t)LaunchKind::GroupNormAdd) at = li, ++n;
        ASSERT_EQ(n, 1) << fx;
        const CudaLaunch& l = p.launch(at);
        ASSERT_EQ(l.count, 4) << fx;
        const g4::plan::PlanOp &s1 = p.op(l.op), &nm = p.op(l.op + 1), &ad = p.op(l.op + 2),
                               &s2 = p.op(l.op + 3);
        EXPECT_EQ(s1.code, (uint16_t)g4::OpCode::Scale) << fx;
        EXPECT_EQ(nm.code, (uint16_t)g4::OpCode::RmsNorm) << fx;
        EXPECT_EQ(ad.code, (uint16_t)g4::OpCode::Add) << fx;
        EXPECT_EQ(s2.code, (uint16_t)g4::OpCode::Scale) << fx;
        EXPECT_EQ(l.t[0], s1.in[0]) << fx;
        EXPECT_EQ(l.t[1], nm.in[1]) << fx;
        EXPECT_EQ(l.t[2], ad.in[0] == l.t[0] ? ad.in[1] : ad.in[0]) << fx;
        EXPECT_EQ(l.t[3], s2.out[0]) << fx;
        EXPECT_EQ(l.ip[0], s1.ip[0]) << fx;
        EXPECT_EQ(l.ip[1], nm.ip[1]) << fx;
        EXPECT_EQ(l.ip[0] % l.ip[1], 0) << fx;
        expect_corrupt(
            td, td.file(fx + ".g4plan"), fx + "_ple_in",
            [&](CudaLaunch* recs) { recs[at].ip[1] = l.ip[0] + 1; },
            "bad per-layer-input combination record");
    }
}

// Output replicas by shape: 4 at E2B's wide MLPs (I = 12288, 384 blocks), 1 at its narrow ones (6144) and
// at E4B's (10240), where they were measured slower; a launch's workspace is (R - 1) x H floats, counted on
// the GPU that runs it.
TEST(CudaSchedule, MlpReplicasByShapeAndTheirWorkspace) {
    EXPECT_EQ(g4::cuda::mlp_replicas(12288), g4::plan::kMlpReplicasMax);
    EXPECT_EQ(g4::cuda::mlp_replicas(6144), 1);
    EXPECT_EQ(g4::cuda::mlp_replicas(10240), 1);
    EXPECT_EQ(g4::cuda::mlp_replicas(192), 1);

    std::vector<PlanTensor> tensors(1);
    std::memset(tensors.data(), 0, sizeof(PlanTensor));
    tensors[0].dims[0] = 1536, tensors[0].dims[1] = 12288; // the down [H, I]
    std::vector<g4::plan::PlanOp> ops(4);
    for (auto& o : ops) {
        std::memset(&o, 0, sizeof o);
        std::fill(std::begin(o.in), std::end(o.in), -1);
        std::fill(std::begin(o.out), std::end(o.out), -1);
    }
    ops[3].in[1] = 0;
    CudaLaunch l;
    std::memset(&l, 0, sizeof l);
    l.kind = (uint16_t)LaunchKind::Mlp, l.count = 4, l.ip[3] = 3, l.ip[6] = 4;
    const auto none = g4::cuda_ws::workspace(ops.data(), ops.size(), tensors.data(), 16, 1024, 256);
    const auto with = g4::cuda_ws::workspace(ops.data(), ops.size(), tensors.data(), 16, 1024, 256, true,
                                             nullptr, 0, &l, 1);
    EXPECT_EQ(none.mlp_rep, 0u);
    EXPECT_EQ(with.mlp_rep, 3u * 1536);
    EXPECT_EQ(with.device_bytes() - none.device_bytes(), 3u * 1536 * 4);
    const int on_gpu1[4] = {1, 1, 1, 1};
    EXPECT_EQ(
        g4::cuda_ws::workspace(ops.data(), ops.size(), tensors.data(), 16, 1024, 256, true, on_gpu1, 0, &l, 1)
            .mlp_rep,
        0u);
    l.ip[6] = 1;
    EXPECT_EQ(
        g4::cuda_ws::workspace(ops.data(), ops.size(), tensors.data(), 16, 1024, 256, true, nullptr, 0, &l, 1)
            .mlp_rep,
        0u);
}

// The tiny fixtures' MLPs (a few blocks) get 1 replica; `g4 compile --mlp-replicas 4` gives every fused
// MLP 4, each followed by the ResNorm that reads its output. A value outside 1..4 is refused with the
// option's name and leaves no plan. A plan whose record says 5 replicas, or 4 with no ResNorm summing them
// after it, is refused at load as corrupt.
TEST(CudaSchedule, MlpReplicasInThePlan) {
    G4_SKIP_WITHOUT_NVRTC();
    TempDir td;
    for (const std::string fx : {"e2b_tiny", "e4b_tiny"}) {
        g4::plan::Plan p;
        compile_sm90(td, fx, "", &p);
        for (size_t li = 0; li < p.n_launches(); ++li)
            if (p.launch(li).kind == (uint16_t)LaunchKind::Mlp) {
                EXPECT_EQ(p.launch(li).ip[6], 1) << fx << " launch " << li;
            }

        g4::plan::Plan q;
        const std::string path = compile_sm90_with(td, fx, fx + "_r4", "--mlp-replicas 4", &q);
        ASSERT_GT(q.n_launches(), 0u) << fx;
        size_t mlp = 0;
        int mlps   = 0;
        for (size_t li = 0; li < q.n_launches(); ++li) {
            const CudaLaunch& l = q.launch(li);
            if (l.kind != (uint16_t)LaunchKind::Mlp) continue;
            mlp = li, ++mlps;
            EXPECT_EQ(l.ip[6], 4) << fx << " launch " << li;
            ASSERT_LT(li + 1, q.n_launches());
            EXPECT_EQ(q.launch(li + 1).kind, (uint16_t)LaunchKind::ResNorm) << fx << " launch " << li;
            EXPECT_EQ(q.launch(li + 1).t[1], q.op(l.ip[3]).out[0]) << fx << " launch " << li;
        }
        ASSERT_GT(mlps, 0) << fx;

        expect_corrupt(
            td, path, fx + "_r5", [&](CudaLaunch* recs) { recs[mlp].ip[6] = 5; }, "MLP output replicas 5");
        expect_corrupt(
            td, path, fx + "_r0", [&](CudaLaunch* recs) { recs[mlp].ip[6] = 0; }, "MLP output replicas 0");
        expect_corrupt(
            td, path, fx + "_no_sum", [&](CudaLaunch* recs) { recs[mlp + 1].t[1] = recs[mlp + 1].t[0]; },
            "not followed by the ResNorm that sums them");
    }

    for (const char* v : {"5", "0", "two"}) {
        const std::string err = expect_option_refused(td, "--mlp-replicas", v);
        EXPECT_NE(err.find("from 1 to 4"), std::string::npos) << err;
    }
}

// The ResNorm between each MLP and the PLE reading its output runs in the PLE's kernel (ResNorm ip1 = 1,
// g4_resnorm_gated_proj) in default sm_90 plans where cuda::ple_fold_after takes the MLP (256 threads, at
// most 192 blocks, one output: every layer of the tiny fixtures, E2B's narrow layers), in none with
// --ple-fold off or with 4 MLP output replicas (a bad value is refused, no plan left). The MLP before then
// zeroes the PLE's output, so that output shares no bytes with the MLP's input, its output or the residual;
// the ResNorm's output (block 0 writes it while the other blocks read) none with the residual, the MLP's
// output or the per-layer input. Records that fold a ResNorm elsewhere, with another flag, after a 128-thread
// MLP or with a second norm are refused at load.
TEST(CudaSchedule, ResNormFoldedIntoThePle) {
    G4_SKIP_WITHOUT_NVRTC();
    TempDir td;
    for (const std::string fx : {"e2b_tiny", "e4b_tiny"}) {
        g4::plan::Plan p;
        compile_sm90(td, fx, "", &p);
        int ples = 0, folded = 0;
        size_t first_fold = 0, pre_mlp = 0;
        for (size_t li = 0; li < p.n_launches(); ++li) {
            const CudaLaunch& l = p.launch(li);
            if (l.kind == (uint16_t)LaunchKind::Mlp && li > 0) pre_mlp = li - 1;
            if (l.kind == (uint16_t)LaunchKind::ResNorm) {
                EXPECT_TRUE(l.ip[1] >= 0 && l.ip[1] <= 2) << fx << " launch " << li;
            }
            if (l.kind != (uint16_t)LaunchKind::GatedProj) continue;
            ++ples;
            ASSERT_GE(li, 2u);
            const CudaLaunch &rn = p.launch(li - 1), &mlp = p.launch(li - 2);
            if (rn.ip[1] != 1) continue;
            if (!folded++) first_fold = li - 1;
            ASSERT_EQ(mlp.kind, (uint16_t)LaunchKind::Mlp) << fx << " launch " << li;
            EXPECT_EQ(rn.t[1], mlp.t[0]) << fx << " launch " << li;
            EXPECT_EQ(p.op(l.op).in[0], rn.t[4]) << fx << " launch " << li;
            EXPECT_TRUE(rn.t[3] < 0 && rn.t[5] < 0 && rn.t[6] < 0) << fx << " launch " << li;
            const int32_t y = l.t[0], xo = rn.t[4];
            for (int32_t t : {p.op(mlp.ip[0]).in[0], rn.t[0], rn.t[1], xo})
                EXPECT_FALSE(overlap(p, y, t)) << fx << " launch " << li;
            for (int32_t t : {rn.t[0], rn.t[1], p.op(l.op + 1).in[1]})
                EXPECT_FALSE(overlap(p, xo, t)) << fx << " launch " << li;
        }
        EXPECT_GT(ples, 0) << fx;
        EXPECT_EQ(folded, ples) << fx;

        g4::plan::Plan q;
        const std::string path = compile_sm90_with(td, fx, fx + "_nofold", "--ple-fold off", &q);
        ASSERT_GT(q.n_launches(), 0u) << fx;
        for (size_t li = 0; li < q.n_launches(); ++li)
            if (q.launch(li).kind == (uint16_t)LaunchKind::ResNorm) {
                EXPECT_NE(q.launch(li).ip[1], 1) << fx << " launch " << li;
            }
        CmdResult i = run_g4("inspect '" + path + "'");
        EXPECT_NE(i.out.find(std::to_string(ples) +
                             " PLE (gate + projection in one kernel; 0 with the ResNorm before"),
                  std::string::npos)
            << i.out;

        const std::string folded_plan = td.file(fx + ".g4plan");
        CmdResult i2                  = run_g4("inspect '" + folded_plan + "'");
        EXPECT_NE(i2.out.find(std::to_string(ples) + " PLE (gate + projection in one kernel; " +
                              std::to_string(ples) + " with the ResNorm before"),
                  std::string::npos)
            << i2.out;
        expect_corrupt(
            td, folded_plan, fx + "_fold2", [&](CudaLaunch* recs) { recs[first_fold].ip[1] = 2; },
            "bad folded ResNorm (folded 2");
        expect_corrupt(
            td, folded_plan, fx + "_fold_pre_mlp", [&](CudaLaunch* recs) { recs[pre_mlp].ip[1] = 1; },
            "bad folded ResNorm (folded 1");
        expect_corrupt(
            td, folded_plan, fx + "_fold_norm2",
            [&](CudaLaunch* recs) { recs[first_fold].t[5] = recs[first_fold].t[2]; },
            "bad folded ResNorm (folded 1");
        expect_corrupt(
            td, folded_plan, fx + "_fold_b128", [&](CudaLaunch* recs) { recs[first_fold - 1].ip[5] = 128; },
            "bad folded ResNorm (folded 1");

        g4::plan::Plan p4;
        compile_sm90_with(td, fx, fx + "_fold_r4", "--mlp-replicas 4", &p4);
        ASSERT_GT(p4.n_launches(), 0u) << fx;
        for (size_t li = 0; li < p4.n_launches(); ++li)
            if (p4.launch(li).kind == (uint16_t)LaunchKind::ResNorm) {
                EXPECT_NE(p4.launch(li).ip[1], 1) << fx << " with replicas, launch " << li;
            }
    }
    // By shape: E2B's narrow layers (6144, 256 threads) fold; its wide ones (12288, 128 threads, 4 replicas)
    // and E4B's (10240: 320 blocks of 256 threads) do not.
    EXPECT_TRUE(g4::cuda::ple_fold_after(6144, 256, 1));
    EXPECT_FALSE(g4::cuda::ple_fold_after(12288, 128, 4));
    EXPECT_FALSE(g4::cuda::ple_fold_after(10240, 256, 1));
    EXPECT_FALSE(g4::cuda::ple_fold_after(6144, 256, 2));
    expect_option_refused(td, "--ple-fold", "yes");
}

// The ResNorm making each packed-f16 MLP's input runs in the MLP's kernel (ResNorm ip1 = 2, the _r kernels)
// in default sm_90 plans: every MLP of the tiny fixtures. An earlier ResNorm (launched, not after output
// replicas) zeroes the MLP's output instead (its ip2 = y + 1), so y shares no bytes with what that ResNorm
// touches or with any op between it and the MLP; y and x1 (block 0 writes it while every block reads) none
// with the residual and the attention's output. --mlp-fold off: none; all: every one (as by default here);
// f32 MLPs never; a bad value is refused, no plan left. Corrupt records are refused at load. By shape
// (mlp_fold_one_wave): E2B's MLPs fold by default, E4B's (two waves) do not.
TEST(CudaSchedule, ResNormFoldedIntoTheMlp) {
    G4_SKIP_WITHOUT_NVRTC();
    TempDir td;
    for (const std::string fx : {"e2b_tiny", "e4b_tiny"}) {
        g4::plan::Plan p;
        compile_sm90(td, fx, "", &p);
        int mlps = 0, folded = 0, zeroers = 0;
        size_t first_rn = 0, first_z = 0;
        for (size_t li = 0; li < p.n_launches(); ++li) {
            const CudaLaunch& l = p.launch(li);
            if (l.kind == (uint16_t)LaunchKind::ResNorm && l.ip[2] > 0) ++zeroers;
            if (l.kind != (uint16_t)LaunchKind::Mlp) continue;
            ++mlps;
            ASSERT_GE(li, 1u);
            const CudaLaunch& rn = p.launch(li - 1);
            if (rn.ip[1] != 2) continue;
            const int32_t y = l.t[0], x = rn.t[0], d = rn.t[1], x1 = rn.t[4];
            EXPECT_EQ(l.ip[7], 1) << fx << " launch " << li;
            EXPECT_EQ(p.op(l.ip[0]).in[0], rn.t[6]) << fx << " launch " << li;
            EXPECT_EQ(rn.t[7], y) << fx << " launch " << li;
            EXPECT_LT(rn.t[3], 0) << fx << " launch " << li;
            for (int32_t t : {x, d, x1})
                EXPECT_FALSE(overlap(p, y, t)) << fx << " launch " << li;
            for (int32_t t : {x, d})
                EXPECT_FALSE(overlap(p, x1, t)) << fx << " launch " << li;
            size_t z = li - 1;
            while (z-- > 0)
                if (p.launch(z).kind == (uint16_t)LaunchKind::ResNorm && p.launch(z).ip[2] == y + 1) break;
            ASSERT_LT(z, li) << fx << " launch " << li << ": no ResNorm zeroes the MLP's output";
            EXPECT_EQ(p.launch(z).ip[1], 0) << fx << " launch " << li;
            for (size_t j = p.launch(z).op; j < (size_t)l.op; ++j) {
                for (int32_t t : p.op(j).in)
                    EXPECT_FALSE(overlap(p, y, t)) << fx << " op " << j;
                for (int32_t t : p.op(j).out)
                    EXPECT_FALSE(overlap(p, y, t)) << fx << " op " << j;
            }
            if (!folded++) first_rn = li - 1, first_z = z;
        }
        EXPECT_GT(mlps, 0) << fx;
        EXPECT_EQ(folded, mlps) << fx;
        EXPECT_EQ(zeroers, folded) << fx;

        const std::string path = td.file(fx + ".g4plan");
        expect_corrupt(
            td, path, fx + "_mfold_nozero", [&](CudaLaunch* recs) { recs[first_z].ip[2] = 0; },
            "bad folded ResNorm (folded 2");
        expect_corrupt(
            td, path, fx + "_mfold_no_t7", [&](CudaLaunch* recs) { recs[first_rn].t[7] = -1; },
            "bad MLP record");
        expect_corrupt(
            td, path, fx + "_mfold_f32", [&](CudaLaunch* recs) { recs[first_rn + 1].ip[7] = 0; },
            "bad folded ResNorm (folded 2");
        // A scale the record's ops do not have: refused as a record whose tensors are not its ops'
        // (plan_reader.cpp launch_operands), before the folding rule is reached.
        expect_corrupt(
            td, path, fx + "_mfold_scale",
            [&](CudaLaunch* recs) { recs[first_rn].t[3] = recs[first_rn].t[2]; },
            "the ResNorm's scale is not x_out * scalar in place");
        expect_corrupt(
            td, path, fx + "_mfold_no_mlp", [&](CudaLaunch* recs) { recs[first_z].ip[1] = 2; },
            "folded 2 needs the MLP launch");
        expect_corrupt(
            td, path, fx + "_zero2_range", [&](CudaLaunch* recs) { recs[first_z].ip[2] = 1 << 30; },
            "bad second zeroed buffer");
        expect_corrupt(
            td, path, fx + "_zero2_folded",
            [&](CudaLaunch* recs) { recs[first_rn].ip[2] = recs[first_rn].t[7] + 1; },
            "bad second zeroed buffer");

        for (const std::string v : {"off", "all"}) {
            g4::plan::Plan q;
            compile_sm90_with(td, fx, fx + "_mfold" + v, "--mlp-fold " + v, &q);
            int f = 0, z = 0;
            for (size_t li = 0; li < q.n_launches(); ++li) {
                f += q.launch(li).kind == (uint16_t)LaunchKind::ResNorm && q.launch(li).ip[1] == 2;
                z += q.launch(li).kind == (uint16_t)LaunchKind::ResNorm && q.launch(li).ip[2] > 0;
            }
            EXPECT_EQ(f, v == "off" ? 0 : mlps) << fx << " --mlp-fold " << v;
            EXPECT_EQ(z, f) << fx << " --mlp-fold " << v;
        }
        g4::plan::Plan c;
        const std::string fpath = td.file(fx + "_mfold_f32.g4plan");
        CmdResult r =
            run_g4("compile --model '" + fixture(fx) +
                   "' --device cuda --target sm_90 --weights nf4 --no-fidelity --mlp-precision f32 -o '" +
                   fpath + "'");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        std::string err;
        ASSERT_EQ(c.load(fpath, false, &err), G4_OK) << err;
        for (size_t li = 0; li < c.n_launches(); ++li)
            if (c.launch(li).kind == (uint16_t)LaunchKind::ResNorm) {
                EXPECT_NE(c.launch(li).ip[1], 2) << fx << " f32 MLPs, launch " << li;
            }
    }
    // By width: E2B (1536) at both thread counts, E4B (2560) at both; wider rows do not fit the registers.
    EXPECT_TRUE(g4::plan::mlp_res_fits(1536, 128));
    EXPECT_TRUE(g4::plan::mlp_res_fits(2560, 128));
    EXPECT_TRUE(g4::plan::mlp_res_fits(3072, 256));
    EXPECT_FALSE(g4::plan::mlp_res_fits(3072, 128));
    EXPECT_FALSE(g4::plan::mlp_res_fits(3200, 256));
    EXPECT_FALSE(g4::plan::mlp_res_fits(1536, 64));
    EXPECT_FALSE(g4::plan::mlp_res_fits(1538, 256));
    EXPECT_TRUE(g4::cuda::mlp_fold_one_wave(6144, 256));
    EXPECT_TRUE(g4::cuda::mlp_fold_one_wave(12288, 128));
    EXPECT_FALSE(g4::cuda::mlp_fold_one_wave(10240, 256));
    EXPECT_FALSE(g4::cuda::mlp_fold_one_wave(16384, 128));
    expect_option_refused(td, "--mlp-fold", "yes");
}

// The schedule options for measurements (--mlp-replicas, --ple-fold, --mlp-fold) and the kernel trace
// (--kernel-trace) are recorded where they are not the default: the policy's mlp_replicas / ple_fold /
// mlp_fold, META cuda.kernel_trace, both shown by `g4 inspect`; a default plan records none of them. CPU
// plans refuse each with a one-line error and leave no plan; a bad trace mode is refused too.
TEST(CudaSchedule, ScheduleOptionsRecordedInThePlan) {
    G4_SKIP_WITHOUT_NVRTC();
    TempDir td;
    g4::plan::Plan p, q;
    compile_sm90(td, "e2b_tiny", "", &p);
    const std::string def = run_g4("inspect '" + td.file("e2b_tiny.g4plan") + "'").out;
    for (const char* k : {"\"mlp_replicas\"", "\"ple_fold\"", "\"mlp_fold\"", "timeline trace"})
        EXPECT_EQ(def.find(k), std::string::npos) << k;
    EXPECT_NE(def.find("\"mlp_precision\":\"f16\""), std::string::npos) << def;

    const std::string path =
        compile_sm90_with(td, "e2b_tiny", "e2b_opts",
                          "--mlp-replicas 2 --ple-fold off --mlp-fold all --kernel-trace launches", &q);
    int mlps = 0;
    for (size_t li = 0; li < q.n_launches(); ++li)
        if (q.launch(li).kind == (uint16_t)LaunchKind::Mlp) {
            ++mlps;
            EXPECT_EQ(q.launch(li).ip[6], 2) << "launch " << li;
        }
    EXPECT_GT(mlps, 0);
    const std::string out = run_g4("inspect '" + path + "'").out;
    for (const char* k :
         {"\"mlp_replicas\":2", "\"ple_fold\":\"off\"", "\"mlp_fold\":\"all\"", "timeline trace of launches"})
        EXPECT_NE(out.find(k), std::string::npos) << k << "\n" << out;

    for (const auto& [option, val] : {std::pair<std::string, std::string>{"--mlp-replicas", "2"},
                                      {"--ple-fold", "off"},
                                      {"--mlp-fold", "all"},
                                      {"--kernel-trace", "launches"}}) {
        const std::string cpu = td.file("cpu" + option + ".g4plan");
        CmdResult r = run_g4("compile --model '" + fixture("e2b_tiny") + "' --weights nf4 --no-fidelity " +
                             option + " " + val + " -o '" + cpu + "'");
        EXPECT_NE(r.exit_code, 0) << option;
        EXPECT_NE(r.err.find(option + " applies to --device cuda only"), std::string::npos) << r.err;
        EXPECT_FALSE(std::filesystem::exists(cpu)) << option;
    }
    expect_option_refused(td, "--kernel-trace", "yes");
}

// The fused MLP's arithmetic (ip7, g4 compile --mlp-precision): packed f16 by default wherever the weights
// allow it (never with double-quant block scales), at 256 threads up to 320 blocks; f32 with --mlp-precision
// f32. A bad value is refused with no plan left behind; a record with another arithmetic, or packed f16 over
// double-quant scales, is refused at load.
TEST(CudaSchedule, MlpPrecision) {
    G4_SKIP_WITHOUT_NVRTC();
    EXPECT_TRUE(g4::cuda::mlp_f16(true, 1536, false));
    EXPECT_TRUE(g4::cuda::mlp_f16(true, 2560, false));
    EXPECT_FALSE(g4::cuda::mlp_f16(true, 1536, true)); // double quant
    EXPECT_FALSE(g4::cuda::mlp_f16(false, 1536, false));
    EXPECT_FALSE(g4::cuda::mlp_f16(true, 1540, false));  // H % 32
    EXPECT_FALSE(g4::cuda::mlp_f16(true, 10272, false)); // H > 10240
    EXPECT_EQ(g4::cuda::mlp_threads_f16(6144), 256);
    EXPECT_EQ(g4::cuda::mlp_threads_f16(10240), 256);
    EXPECT_EQ(g4::cuda::mlp_threads_f16(12288), 128);

    TempDir td;
    for (const std::string fx : {"e2b_tiny", "e4b_tiny"}) {
        auto mlps = [&](const std::string& flags, const std::string& name, g4::plan::Plan* q) {
            const std::string path = td.file(fx + "_" + name + ".g4plan");
            CmdResult r            = run_g4("compile --model '" + fixture(fx) +
                                            "' --device cuda --target sm_90 --weights nf4 --no-fidelity " + flags +
                                            " -o '" + path + "'");
            EXPECT_EQ(r.exit_code, 0) << r.err;
            std::string err;
            EXPECT_EQ(q->load(path, false, &err), G4_OK) << err;
            std::vector<CudaLaunch> out;
            for (size_t li = 0; li < q->n_launches(); ++li)
                if (q->launch(li).kind == (uint16_t)LaunchKind::Mlp) out.push_back(q->launch(li));
            EXPECT_FALSE(out.empty()) << fx << " " << name;
            return out;
        };
        g4::plan::Plan a, b, c, d;
        for (const CudaLaunch& l : mlps("", "auto", &a))
            EXPECT_TRUE(l.ip[7] == 1 && l.ip[5] == 256) << fx;
        for (const CudaLaunch& l : mlps("--mlp-precision f16", "f16", &b))
            EXPECT_TRUE(l.ip[7] == 1 && l.ip[5] == 256) << fx;
        for (const CudaLaunch& l : mlps("--mlp-precision f32", "f32", &c)) {
            EXPECT_EQ(l.ip[7], 0) << fx;
            EXPECT_EQ(l.ip[5], g4::cuda::mlp_threads(c.tensor(c.op(l.ip[0]).in[1]).dims[0])) << fx;
        }
        for (const auto& [name, plan] : {std::pair<std::string, g4::plan::Plan*>{"auto", &a}, {"f32", &c}}) {
            CmdResult r = run_g4("inspect '" + td.file(fx + "_" + name + ".g4plan") + "'");
            ASSERT_EQ(r.exit_code, 0) << r.err;
            int n = 0;
            for (size_t li = 0; li < plan->n_launches(); ++li)
                n += plan->launch(li).kind == (uint16_t)LaunchKind::Mlp;
            const std::string want = std::to_string(n) + " MLP (gate/up + down in one kernel; " +
                                     (name == "f32" ? "0" : std::to_string(n)) +
                                     " with packed-f16 products, ";
            EXPECT_NE(r.out.find(want), std::string::npos) << fx << " " << name << ": " << r.out;
        }
        size_t mlp = 0;
        for (const CudaLaunch& l : mlps("--double-quant", "dq", &d))
            EXPECT_EQ(l.ip[7], 0) << fx;
        for (size_t li = 0; li < d.n_launches(); ++li)
            if (d.launch(li).kind == (uint16_t)LaunchKind::Mlp) mlp = li;
        expect_corrupt(
            td, td.file(fx + "_auto.g4plan"), fx + "_arith2",
            [&](CudaLaunch* recs) {
                for (size_t li = 0; li < a.n_launches(); ++li)
                    if (recs[li].kind == (uint16_t)LaunchKind::Mlp) recs[li].ip[7] = 2;
            },
            "MLP arithmetic 2");
        expect_corrupt(
            td, td.file(fx + "_dq.g4plan"), fx + "_dq_f16", [&](CudaLaunch* recs) { recs[mlp].ip[7] = 1; },
            "a packed-f16 MLP needs NF4 gate and up weights with f32 block scales");
    }
    const std::string path = td.file("bad_precision.g4plan");
    CmdResult r            = run_g4(
                   "compile --model '" + fixture("e2b_tiny") +
                   "' --device cuda --target sm_90 --weights nf4 --no-fidelity --mlp-precision f8 -o '" + path + "'");
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("unknown --mlp-precision 'f8': expected f16 or f32"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(path));
}

} // namespace
