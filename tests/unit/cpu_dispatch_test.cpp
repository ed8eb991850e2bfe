// The run-time choice of the CPU kernels' instruction-set level (kernels/cpu/dispatch.h): the level in use is
// one this CPU supports and is what the kernels report; G4_CPU_LEVEL picks any supported level in a new
// process (`g4 --version` says which) and an unknown or missing one falls back to the best with one line.
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dispatch.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <string>

namespace {

using namespace g4;
using g4test::run_g4;

cpu::Level best_level() {
    cpu::Level best = cpu::Level::Baseline;
    for (int i = 0; i < cpu::kLevelCount; ++i)
        if (cpu::level_supported((cpu::Level)i)) best = (cpu::Level)i;
    return best;
}

TEST(CpuDispatch, ActiveLevelIsSupportedAndListed) {
    const cpu::Level l = cpu::active_level();
    EXPECT_TRUE(cpu::level_supported(l));
    const std::string all = cpu::supported_levels();
    EXPECT_NE(all.find(cpu::level_name(l)), std::string::npos) << all;
    EXPECT_EQ(all.rfind(cpu::level_name(best_level()), 0), 0u) << "best first: " << all;
}

TEST(CpuDispatch, KernelsReportTheLevelInUse) {
    const cpu::Level l = cpu::active_level();
    if (l == cpu::Level::Native) GTEST_SKIP() << "a G4_NATIVE build: one copy, flags of the build machine";
    EXPECT_EQ(cpu::gemm_has_avx512(),
              l == cpu::Level::Avx512 || l == cpu::Level::Avx512Bf16 || l == cpu::Level::Amx);
    EXPECT_EQ(cpu::gemm_has_avx512_bf16(), l == cpu::Level::Avx512Bf16 || l == cpu::Level::Amx);
}

TEST(CpuDispatch, EnvironmentPicksEverySupportedLevel) {
    for (int i = 0; i < cpu::kLevelCount; ++i) {
        const cpu::Level l = (cpu::Level)i;
        if (!cpu::level_supported(l)) continue;
        g4test::CmdResult r = g4test::run_cmd(std::string("G4_CPU_LEVEL=") + cpu::level_name(l) + " '" +
                                              g4test::cli_path() + "' --version");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_NE(r.out.find(std::string("CPU kernels: ") + cpu::level_name(l) + " "), std::string::npos)
            << r.out;
        EXPECT_EQ(r.err, "");
    }
}

TEST(CpuDispatch, UnknownOrMissingLevelFallsBackToTheBest) {
    const std::string best = std::string("CPU kernels: ") + cpu::level_name(best_level()) + " ";
    g4test::CmdResult r    = g4test::run_cmd("G4_CPU_LEVEL=sse9 '" + g4test::cli_path() + "' --version");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(best), std::string::npos) << r.out;
    EXPECT_NE(r.err.find("G4_CPU_LEVEL=sse9 is not a CPU level"), std::string::npos) << r.err;
    for (int i = 0; i < cpu::kLevelCount; ++i) {
        const cpu::Level l = (cpu::Level)i;
        if (cpu::level_supported(l)) continue;
        r = g4test::run_cmd(std::string("G4_CPU_LEVEL=") + cpu::level_name(l) + " '" + g4test::cli_path() +
                            "' --version");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_NE(r.out.find(best), std::string::npos) << r.out;
        EXPECT_NE(r.err.find("this CPU or build lacks it"), std::string::npos) << r.err;
    }
}

} // namespace
