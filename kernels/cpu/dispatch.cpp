// Picks the instruction-set copy of the CPU kernels once (see dispatch.h) and defines cpu.h's functions as
// calls through that copy's Kernels table.
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/kernel_list.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define G4_CPU_X86 1
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#define G4_CPU_ARM64 1
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20) // the Linux arm64 ABI's bit (asm/hwcap.h)
#endif
#endif

// The tables the build linked in (kernels/CMakeLists.txt defines G4_CPU_HAVE_<LEVEL> for each copy).
extern "C" {
#if defined(G4_CPU_HAVE_BASELINE)
const g4::cpu::Kernels* g4cpu_kernels_baseline();
#endif
#if defined(G4_CPU_HAVE_AVX2)
const g4::cpu::Kernels* g4cpu_kernels_avx2();
#endif
#if defined(G4_CPU_HAVE_AVX512)
const g4::cpu::Kernels* g4cpu_kernels_avx512();
const g4::cpu::Kernels* g4cpu_kernels_avx512_bf16();
#endif
#if defined(G4_CPU_HAVE_AMX)
const g4::cpu::Kernels* g4cpu_kernels_avx512_amx();
#endif
#if defined(G4_CPU_HAVE_NEON)
const g4::cpu::Kernels* g4cpu_kernels_neon();
#endif
#if defined(G4_CPU_HAVE_DOTPROD)
const g4::cpu::Kernels* g4cpu_kernels_dotprod();
#endif
#if defined(G4_CPU_HAVE_NATIVE)
const g4::cpu::Kernels* g4cpu_kernels_native();
#endif
}

namespace g4::cpu {
namespace {

constexpr const char* kNames[kLevelCount] = {"baseline", "avx2", "avx512",  "avx512_bf16",
                                             "amx",      "neon", "dotprod", "native"};

// What the CPU and the OS support: x86-64-v3 (AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE and the v2 set, AVX
// state enabled), x86-64-v4 (AVX-512 F/BW/DQ/VL/CD, AVX-512 state enabled), AVX-512 BF16 with VNNI, AMX
// (AMX-TILE and AMX-BF16, tile state enabled and granted); on aarch64, the dot product instructions
// (SDOT/UDOT, ARMv8.2-A's optional, ARMv8.4-A's mandatory extension).
struct Features {
    bool v3 = false, v4 = false, bf16 = false, amx = false, dotprod = false;
    bool amd = false; // cpuid vendor "AuthenticAMD"
};

#if defined(G4_CPU_X86)
constexpr bool bit(unsigned r, int i) {
    return (r >> i) & 1u;
}

uint64_t xcr0() {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

bool request_tile_state() {
#if defined(__linux__) && defined(SYS_arch_prctl)
    constexpr int kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
}

Features detect() {
    Features f;
    unsigned a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d)) // vendor: EBX, EDX, ECX
        f.amd = b == 0x68747541u && d == 0x69746E65u && c == 0x444D4163u;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    const bool v2 =
        bit(c, 0) && bit(c, 9) && bit(c, 13) && bit(c, 19) && bit(c, 20) && bit(c, 23); // SSE3..POPCNT
    const bool v3_leaf1 = bit(c, 12) && bit(c, 22) && bit(c, 28) && bit(c, 29); // FMA, MOVBE, AVX, F16C
    if (!v2 || !v3_leaf1 || !bit(c, 27)) return f;                              // 27: OSXSAVE (xgetbv usable)
    const uint64_t x = xcr0();
    unsigned a7, b7, c7, d7, ax, bx, cx, dx;
    if (!__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7) || !__get_cpuid(0x80000001u, &ax, &bx, &cx, &dx))
        return f;
    // XCR0 bits 1-2: SSE and AVX state; leaf 7 EBX 3, 5, 8: BMI1, AVX2, BMI2; 0x80000001 ECX 5: LZCNT.
    f.v3 = (x & 0x6) == 0x6 && bit(b7, 3) && bit(b7, 5) && bit(b7, 8) && bit(cx, 5);
    // XCR0 bits 5-7: opmask and ZMM state; EBX 16, 17, 28, 30, 31: AVX-512 F, DQ, CD, BW, VL.
    f.v4 =
        f.v3 && (x & 0xE0) == 0xE0 && bit(b7, 16) && bit(b7, 17) && bit(b7, 28) && bit(b7, 30) && bit(b7, 31);
    unsigned a71 = 0, b71, c71, d71;
    if (f.v4 && a7 >= 1) __get_cpuid_count(7, 1, &a71, &b71, &c71, &d71);
    // leaf 7 sub-leaf 1 EAX 5: AVX512_BF16; sub-leaf 0 ECX 11: AVX512_VNNI (the level's int16 GEMV; every
    // CPU with AVX512_BF16 has it)
    f.bf16 = f.v4 && bit(a71, 5) && bit(c7, 11);
    // leaf 7 EDX 22, 24: AMX-BF16, AMX-TILE; XCR0 bits 17-18: XTILECFG and XTILEDATA state. Linux also
    // wants the process to ask for the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, feature 18) before
    // any thread runs a tile instruction; without the grant the AVX-512 BF16 level stays the best.
    f.amx = f.bf16 && bit(d7, 22) && bit(d7, 24) && (x & 0x60000) == 0x60000 && request_tile_state();
    return f;
}
#elif defined(G4_CPU_ARM64)
Features detect() {
    Features f;
    f.dotprod = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
    return f;
}
#else
Features detect() {
    return {};
}
#endif

const Features& features() {
    static const Features f = detect();
    return f;
}

const Kernels* table(Level l) {
    switch (l) {
#if defined(G4_CPU_HAVE_BASELINE)
    case Level::Baseline:
        return g4cpu_kernels_baseline();
#endif
#if defined(G4_CPU_HAVE_AVX2)
    case Level::Avx2:
        return features().v3 ? g4cpu_kernels_avx2() : nullptr;
#endif
#if defined(G4_CPU_HAVE_AVX512)
    case Level::Avx512:
        return features().v4 ? g4cpu_kernels_avx512() : nullptr;
    case Level::Avx512Bf16:
        return features().bf16 ? g4cpu_kernels_avx512_bf16() : nullptr;
#endif
#if defined(G4_CPU_HAVE_AMX)
    case Level::Amx:
        return features().amx ? g4cpu_kernels_avx512_amx() : nullptr;
#endif
#if defined(G4_CPU_HAVE_NEON)
    case Level::Neon:
        return g4cpu_kernels_neon();
#endif
#if defined(G4_CPU_HAVE_DOTPROD)
    case Level::Dotprod:
        return features().dotprod ? g4cpu_kernels_dotprod() : nullptr;
#endif
#if defined(G4_CPU_HAVE_NATIVE)
    case Level::Native:
        return g4cpu_kernels_native();
#endif
    default:
        return nullptr;
    }
}

struct Choice {
    Level level;
    const Kernels* k;
};

Choice pick() {
    Choice best{Level::Baseline, nullptr};
    for (int i = 0; i < kLevelCount; ++i)
        if (const Kernels* k = table((Level)i)) best = {(Level)i, k};
    const char* want = std::getenv("G4_CPU_LEVEL");
    if (!want || !*want || !std::strcmp(want, "auto")) return best;
    for (int i = 0; i < kLevelCount; ++i) {
        if (std::strcmp(want, kNames[i])) continue;
        if (const Kernels* k = table((Level)i)) return {(Level)i, k};
        std::fprintf(stderr, "g4: G4_CPU_LEVEL=%s: this CPU or build lacks it (supported: %s); using %s\n",
                     want, supported_levels(), kNames[(int)best.level]);
        return best;
    }
    std::fprintf(stderr,
                 "g4: G4_CPU_LEVEL=%s is not a CPU level (baseline, avx2, avx512, avx512_bf16, amx, neon, "
                 "dotprod, native); using %s\n",
                 want, kNames[(int)best.level]);
    return best;
}

const Choice& choice() {
    static const Choice c = pick();
    return c;
}

} // namespace

const char* level_name(Level l) {
    const int i = (int)l;
    return i >= 0 && i < kLevelCount ? kNames[i] : "unknown";
}

bool level_supported(Level l) {
    return table(l) != nullptr;
}

const Kernels* level_kernels(Level l) {
    return table(l);
}

Level active_level() {
    return choice().level;
}

const char* supported_levels() {
    static const std::string s = [] {
        std::string r;
        for (int i = kLevelCount - 1; i >= 0; --i)
            if (table((Level)i)) r += (r.empty() ? "" : " ") + std::string(kNames[i]);
        return r;
    }();
    return s.c_str();
}

bool gemm_bf16_preferred() {
    static const bool preferred = [] {
        const char* want = std::getenv("G4_CPU_BF16_GEMM");
        if (want && !std::strcmp(want, "0")) return false;
        if (!gemm_has_avx512_bf16()) return false;
        if (want && !std::strcmp(want, "1")) return true;
        return active_level() == Level::Amx || features().amd;
    }();
    return preferred;
}

#define G4_CPU_KERNEL_CALL(ret, name, params, args)                                                          \
    static_assert(std::is_same_v<decltype(&name), ret(*) params>, "cpu.h and kernel_list.h differ: " #name); \
    ret name params {                                                                                        \
        return choice().k->name args;                                                                        \
    }
G4_CPU_KERNELS(G4_CPU_KERNEL_CALL)
#undef G4_CPU_KERNEL_CALL

} // namespace g4::cpu
