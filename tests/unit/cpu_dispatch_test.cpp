// The run-time choice of the CPU kernels' instruction-set level (kernels/cpu/dispatch.h): the level in use is
// one this CPU supports and is what the kernels report; G4_CPU_LEVEL picks any supported level in a new
// process (`g4 --version` says which) and an unknown or missing one falls back to the best with one line.
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dispatch.h"
#include "test_util.h"

#include <cstdlib>
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

// The towers' bf16 matmuls take the bf16 GEMM only where it has bf16 instructions: always on AMX tiles,
// never without AVX-512 BF16; G4_CPU_BF16_GEMM=0 / 1 choose in a new process (`g4 --version` says which).
TEST(CpuDispatch, TowerBf16MatmulsTakeTheFasterGemm) {
    const bool has_bf16 = cpu::gemm_has_avx512_bf16(); // the CLI below runs this build's level too
    if (!has_bf16) {
        EXPECT_FALSE(cpu::gemm_bf16_preferred());
    }
    if (cpu::active_level() == cpu::Level::Amx && !std::getenv("G4_CPU_BF16_GEMM")) {
        EXPECT_TRUE(cpu::gemm_bf16_preferred());
    }
    const std::string cli = "'" + g4test::cli_path() + "' --version";
    g4test::CmdResult off = g4test::run_cmd("G4_CPU_BF16_GEMM=0 " + cli);
    g4test::CmdResult on  = g4test::run_cmd("G4_CPU_BF16_GEMM=1 " + cli);
    ASSERT_EQ(off.exit_code, 0) << off.err;
    ASSERT_EQ(on.exit_code, 0) << on.err;
    EXPECT_NE(off.out.find("Towers' bf16 matmuls on the CPU: fp32 GEMM"), std::string::npos) << off.out;
    EXPECT_NE(on.out.find(std::string("Towers' bf16 matmuls on the CPU: ") + (has_bf16 ? "bf16" : "fp32")),
              std::string::npos)
        << on.out;
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
