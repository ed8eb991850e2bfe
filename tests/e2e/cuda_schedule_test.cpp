// The fused decode schedule of sm_90 plans (compiler/cuda_schedule.cpp), checked from the compiled plan
// itself (no GPU needed): each kernel that adds into an output it does not zero itself (Mlp, AttnO, Ple) has
// a ResNorm launch before it that zeroes exactly that output, no launch in between touches the output's
// arena bytes, the Mlp and AttnO weights are stored tiled and no other weight is; --deterministic plans
// fuse none of them.
#include "runtime/src/plan/plan_reader.h"
#include "test_util.h"

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
        return t.kind == (uint8_t)g4::plan::TensorKind::Activation || t.kind == (uint8_t)g4::plan::TensorKind::Input;
    };
    if (!arena(x) || !arena(y)) return false;
    return x.offset < y.offset + y.nbytes && y.offset < x.offset + x.nbytes;
}

void compile_sm90(TempDir& td, const std::string& fx, const std::string& flags, g4::plan::Plan* p) {
    std::string path = td.file(fx + (flags.empty() ? "" : "_det") + ".g4plan");
    CmdResult r = run_g4("compile --model '" + fixture(fx) + "' --device cuda --target sm_90 --weights nf4 --no-fidelity " + flags + " -o '" +
                         path + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::string err;
    ASSERT_EQ(p->load(path, false, &err), G4_OK) << err;
}

TEST(CudaSchedule, ZeroedOutputsStayUntouchedUntilTheirKernel) {
    TempDir td;
    for (const std::string fx : {"e2b_tiny", "e4b_tiny"}) {
        g4::plan::Plan p;
        compile_sm90(td, fx, "", &p);
        ASSERT_GT(p.n_launches(), 0u) << fx;
        int fused[3] = {0, 0, 0};   // Mlp, AttnO, Ple
        std::set<int32_t> tiled;  // the weights the fused kernels read tiled
        for (size_t li = 0; li < p.n_launches(); ++li) {
            const CudaLaunch& l = p.launch(li);
            const bool mlp = l.kind == (uint16_t)LaunchKind::Mlp, ao = l.kind == (uint16_t)LaunchKind::AttnO;
            const bool ple = l.kind == (uint16_t)LaunchKind::Ple;
            if (!mlp && !ao && !ple) continue;
            ++fused[ple ? 2 : ao];
            const int32_t wop = mlp ? l.ip[3] : ple ? l.op + 2 : l.op, y = p.op(wop).out[0];
            if (!ple) tiled.insert(p.op(wop).in[1]);
            EXPECT_EQ(!ple, (p.tensor(p.op(wop).in[1]).quant_flags & g4::plan::kQuantTiled32) != 0) << fx << " launch " << li;
            size_t z = li;   // the ResNorm launch that zeroes y
            while (z-- > 0 && !(p.launch(z).kind == (uint16_t)LaunchKind::ResNorm && p.launch(z).t[7] == y)) {}
            ASSERT_LT(z, li) << fx << " launch " << li << ": no ResNorm zeroes its output";
            const CudaLaunch& rn = p.launch(z);
            EXPECT_FALSE(overlap(p, y, rn.t[4])) << fx << " launch " << li;
            EXPECT_FALSE(overlap(p, y, rn.t[6])) << fx << " launch " << li;
            // Every op between the ResNorm and the fused kernel, and the input the fused MLP still reads while
            // it adds (its intermediates are never written).
            for (int32_t j = rn.op + rn.count; j < l.op; ++j) {
                for (int32_t t : p.op(j).in) EXPECT_FALSE(overlap(p, y, t)) << fx << " launch " << li << " op " << p.str(p.op(j).name);
                for (int32_t t : p.op(j).out) EXPECT_FALSE(overlap(p, y, t)) << fx << " launch " << li << " op " << p.str(p.op(j).name);
            }
            if (mlp) {
                EXPECT_FALSE(overlap(p, y, p.op(l.ip[0]).in[0])) << fx << " launch " << li;
            }
            if (ple) {   // the gate's input and the per-layer input
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
            EXPECT_TRUE(d.launch(li).kind != (uint16_t)LaunchKind::Mlp && d.launch(li).kind != (uint16_t)LaunchKind::AttnO &&
                        d.launch(li).kind != (uint16_t)LaunchKind::Ple)
                << fx;
        for (size_t t = 0; t < d.n_tensors(); ++t) EXPECT_FALSE(d.tensor(t).quant_flags & g4::plan::kQuantTiled32) << fx;
    }
}

} // namespace
