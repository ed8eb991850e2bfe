// Every CUDA kernel compiles through NVRTC for every supported target (runs without a GPU: CI), and
// the kernel cache returns exactly what NVRTC made.
#include "compiler/cuda_compile.h"
#include "compiler/error.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

namespace {

namespace fs = std::filesystem;

// Sets (or, given nullopt, unsets) an environment variable for a scope and restores what was there.
class ScopedEnv {
public:
    ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
        if (const char* v = std::getenv(name)) old_ = v;
        if (value)
            setenv(name, value->c_str(), 1);
        else
            unsetenv(name);
    }
    ~ScopedEnv() {
        if (old_)
            setenv(name_, old_->c_str(), 1);
        else
            unsetenv(name_);
    }

private:
    const char* name_;
    std::optional<std::string> old_;
};

TEST(CudaCompile, AllKernelsForAllTargets) {
    G4_SKIP_WITHOUT_NVRTC();
    // sm_86 and sm_90 with the decode attention specialised for 4 heads a group, as the fixtures' CUDA plans
    // the other tests compile (the kernel cache, keyed by NVRTC's version, the options and the source, gives
    // NVRTC's output once for all of them); sm_80 and sm_89 with the generic kernels.
    for (const auto& t : g4::cuda::supported_targets()) {
        g4::cuda::KernelSpec spec;
        if (t == "sm_86" || t == "sm_90") spec.attn_hpg = 4;
        g4::cuda::KernelBinary kb = g4::cuda::compile_kernels(t, spec);
        EXPECT_GT(kb.cubin.size(), 1000u) << t;
        for (const char* k : {"g4_embed",
                              "g4_matmul_bf16",
                              "g4_matmul_f32",
                              "g4_matmul_nf4",
                              "g4_gemm_bf16",
                              "g4_gemm_nf4",
                              "g4_gemv_bf16",
                              "g4_gemv_nf4",
                              "g4_tc_gemm_bf16",
                              "g4_tc_gemm_nf4",
                              "g4_rms_norm",
                              "g4_elementwise",
                              "g4_rope",
                              "g4_kv_store",
                              "g4_attention_partial",
                              "g4_attention_merge",
                              "g4_argmax",
                              "g4_clamp",
                              "g4_add_position_2d",
                              "g4_rope_2d",
                              "g4_pool_rows", // encoder programs
                              "g4_conv2d_norm_relu",
                              "g4_silu",
                              "g4_sigmoid_mul",
                              "g4_causal_conv1d",
                              "g4_local_attention",
                              "g4_softplus_scale",
                              "g4_add_scaled",
                              "g4_mm_rows_tcs_nf4", // batched steps of 9..16 rows
                              "g4_mm_rows_tcs_bf16",
                              "g4_mm_rows_tcs_nf4_pair",
                              "g4_mm_rows_tcs_sum_gelu_pair",
                              "g4_argmax_rows",
                              "g4_mm_rows_tcs_sum",
                              "g4_mm_rows_tcs_sum_gelu",
                              "g4_mm_rows_tcs_sum_norm_rope",
                              "g4_mm_rows_tcs_sum_resnorm"})
            EXPECT_NE(kb.ptx.find(std::string(".entry ") + k), std::string::npos)
                << k << " missing for " << t;
        EXPECT_NE(kb.ptx.find(".target sm_" + t.substr(3)), std::string::npos) << t;
        EXPECT_EQ(kb.ptx.find("g4_trace_buf"), std::string::npos)
            << t << ": the timeline trace is compiled into ordinary plans";
    }
}

// The kernels a plan compiles for its model's heads per KV group (-DG4_AD_HPG): one size for all
// layers, a power of two <= 16; anything else keeps the generic kernels.
TEST(CudaCompile, KernelSpecialisation) {
    EXPECT_EQ(g4::cuda::kernel_spec({8, 8, 8}).attn_hpg, 8);
    EXPECT_EQ(g4::cuda::kernel_spec({1}).attn_hpg, 1);
    EXPECT_EQ(g4::cuda::kernel_spec({16, 16}).attn_hpg, 16);
    EXPECT_EQ(g4::cuda::kernel_spec({8, 4}).attn_hpg, 0);
    EXPECT_EQ(g4::cuda::kernel_spec({6}).attn_hpg, 0);
    EXPECT_EQ(g4::cuda::kernel_spec({32}).attn_hpg, 0);
    EXPECT_EQ(g4::cuda::kernel_spec({0, 0}).attn_hpg, 0);
    EXPECT_EQ(g4::cuda::kernel_spec({}).attn_hpg, 0);
    G4_SKIP_WITHOUT_NVRTC();
    // One head a group (the CUDA plan tests compile the fixtures' 4, the GPU kernel tests 8, 4 and 2), for
    // sm_86: the specialisation is the same for every target, and sm_90's kernels take NVRTC 2.5x as long.
    for (int hpg : {1}) {
        g4::cuda::KernelSpec s;
        s.attn_hpg                      = hpg;
        const g4::cuda::KernelBinary kb = g4::cuda::compile_kernels("sm_86", s, false);
        const std::string cubin(kb.cubin.begin(), kb.cubin.end());
        EXPECT_NE(cubin.find("g4_attn_decode_post_bf16"), std::string::npos) << hpg;
        EXPECT_TRUE(kb.ptx.empty());
    }
    g4::cuda::KernelSpec bad;
    bad.attn_hpg = 3;
    EXPECT_THROW(g4::cuda::compile_kernels("sm_90", bad, false), g4::CompileError);
}

// The timeline lab's kernels (KernelSpec::trace 1, g4 compile --kernel-trace launches,
// bench/scripts/trace_lab.sh; 2, blocks: every block, bench/scripts/trace_ab.sh) still compile and keep the
// trace buffer, 2^19 and 2^21 records of 64 bytes (ordinary plans do not: AllKernelsForAllTargets). A trace
// mode outside 0..2 is refused. Four heads a group, as e2b_tiny's plans: CudaSchedule's traced sm_90 plan
// (launches) reuses the first outputs from the kernel cache; blocks are compiled for sm_86, which takes NVRTC
// less time.
TEST(CudaCompile, TraceLabKernels) {
    G4_SKIP_WITHOUT_NVRTC();
    for (const auto& [mode, bytes] : {std::pair<int, long>{1, 64l << 19}, {2, 64l << 21}}) {
        g4::cuda::KernelSpec spec;
        spec.attn_hpg                       = 4;
        spec.trace                          = mode;
        const g4::cuda::KernelBinary traced = g4::cuda::compile_kernels(mode == 1 ? "sm_90" : "sm_86", spec);
        EXPECT_NE(traced.ptx.find("g4_trace_buf[" + std::to_string(bytes) + "]"), std::string::npos) << mode;
        EXPECT_NE(traced.ptx.find("%globaltimer"), std::string::npos) << mode;
    }
    g4::cuda::KernelSpec bad;
    bad.trace = 3;
    EXPECT_THROW(g4::cuda::compile_kernels("sm_90", bad, false), g4::CompileError);
}

// Where the kernel cache lives: G4_KERNEL_CACHE (off / 0 / empty: none), else XDG_CACHE_HOME, else HOME.
TEST(CudaCompile, KernelCacheFolder) {
    const ScopedEnv xdg("XDG_CACHE_HOME", "/x/cache"), home("HOME", "/home/u");
    {
        const ScopedEnv c("G4_KERNEL_CACHE", "/tmp/kc");
        EXPECT_EQ(g4::cuda::kernel_cache_dir(), "/tmp/kc");
    }
    for (const char* off : {"off", "0", ""}) {
        const ScopedEnv c("G4_KERNEL_CACHE", off);
        EXPECT_EQ(g4::cuda::kernel_cache_dir(), "") << off;
    }
    const ScopedEnv no_var("G4_KERNEL_CACHE", std::nullopt);
    EXPECT_EQ(g4::cuda::kernel_cache_dir(), "/x/cache/g4/kernels");
    const ScopedEnv no_xdg("XDG_CACHE_HOME", std::nullopt);
    EXPECT_EQ(g4::cuda::kernel_cache_dir(), "/home/u/.cache/g4/kernels");
}

// A second compile comes from the cache with NVRTC's exact bytes, also one that runs while the first
// compiles; a damaged entry is a miss that NVRTC redoes and rewrites; a cache folder that cannot be made is
// skipped, not an error.
TEST(CudaCompile, KernelCacheReturnsWhatNvrtcMade) {
    G4_SKIP_WITHOUT_NVRTC();
    const g4test::TempDir tmp;
    const fs::path dir = fs::path(tmp.path) / "kernels";
    const ScopedEnv cache("G4_KERNEL_CACHE", dir.string());
    // 40 older entries: the cache keeps the 32 most recent, the new ones among them.
    fs::create_directories(dir);
    for (int i = 0; i < 40; ++i) {
        const fs::path old = dir / ("sm_80-cubin-old" + std::to_string(i) + ".bin");
        std::ofstream(old) << "not an entry";
        fs::last_write_time(old, fs::file_time_type::clock::now() - std::chrono::hours(100 - i));
    }
    // Two compiles of the same kernels at once: one runs NVRTC, the other waits on the entry's lock and reads
    // its output.
    g4::cuda::KernelBinary first, second;
    std::thread other([&] { second = g4::cuda::compile_kernels("sm_80", {}, false); });
    first = g4::cuda::compile_kernels("sm_80", {}, false);
    other.join();
    EXPECT_NE(first.cached, second.cached);
    EXPECT_EQ(first.cubin, second.cubin);
    const g4::cuda::KernelBinary& a = first.cached ? second : first;
    // One NVRTC run keeps two entries, its cubin and its PTX, and the cubin's lock file.
    std::vector<fs::path> files;
    int olds = 0, ptxs = 0, locks = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        if (name.find("-old") != std::string::npos)
            ++olds;
        else if (name.size() > 5 && name.substr(name.size() - 5) == ".lock")
            ++locks;
        else if (name.find("sm_80-ptx-") == 0)
            ++ptxs;
        else
            files.push_back(e.path());
    }
    EXPECT_EQ(olds, 30);
    EXPECT_EQ(ptxs, 1);
    EXPECT_EQ(locks, 1);
    EXPECT_FALSE(fs::exists(dir / "sm_80-cubin-old9.bin")); // the oldest ten went
    EXPECT_TRUE(fs::exists(dir / "sm_80-cubin-old10.bin"));
    ASSERT_EQ(files.size(), 1u);
    EXPECT_NE(files[0].filename().string().find("sm_80-cubin-"), std::string::npos) << files[0];

    const g4::cuda::KernelBinary b = g4::cuda::compile_kernels("sm_80", {}, false);
    EXPECT_TRUE(b.cached);
    EXPECT_EQ(b.cubin, a.cubin);

    { // one byte of the stored cubin flipped
        std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
        f.seekg((std::streamoff)(fs::file_size(files[0]) / 2));
        char c = 0;
        f.read(&c, 1);
        f.seekp((std::streamoff)(fs::file_size(files[0]) / 2));
        c = (char)(c ^ 0x5a);
        f.write(&c, 1);
    }
    const g4::cuda::KernelBinary c = g4::cuda::compile_kernels("sm_80", {}, false);
    EXPECT_FALSE(c.cached);
    EXPECT_EQ(c.cubin, a.cubin);
    const g4::cuda::KernelBinary d = g4::cuda::compile_kernels("sm_80", {}, false); // rewritten
    EXPECT_TRUE(d.cached);
    EXPECT_EQ(d.cubin, a.cubin);

    { // a regular file where the folder should be
        const ScopedEnv blocked("G4_KERNEL_CACHE", (files[0] / "sub").string());
        const g4::cuda::KernelBinary e = g4::cuda::compile_kernels("sm_80", {}, false);
        EXPECT_FALSE(e.cached);
        EXPECT_EQ(e.cubin, a.cubin);
    }
}

TEST(CudaCompile, UnknownTargetIsAnError) {
    G4_SKIP_WITHOUT_NVRTC();
    try {
        g4::cuda::compile_kernels("sm_75");
        FAIL() << "expected an error";
    } catch (const g4::CompileError& e) {
        EXPECT_NE(std::string(e.what()).find("sm_75"), std::string::npos);
    }
}

} // namespace
