#!/usr/bin/env bash
# Cross-builds the CPU kernels and their op tests for aarch64 (tools/cross/CMakeLists.txt with Debian's cross
# compiler, tools/cmake/aarch64-linux-gnu.cmake) and runs them under qemu-user at both aarch64 levels:
# `-cpu max` (dot product instructions: the dispatcher picks dotprod) and `-cpu cortex-a72` (ARMv8.0-A: it
# must pick neon). Checks which level each CPU model gets, then runs cpu_kernels_test (filtered: see
# G4_CROSS_FILTER) and cpu_dispatch_test's in-process cases on each.
# Usage: bash tools/cross_aarch64.sh      (BUILD_DIR defaults to ./build-aarch64)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-aarch64}
# Under emulation the op test leaves out its real-shape sweeps of code that is the same
# portable C++/Eigen on both aarch64 levels: the NF4 GEMV shape table (Shapes/Nf4GemvTest) and its thread
# check, the tower GEMM, the int16-vs-float32 comparison at E2B shapes (its float32 side) and the four
# largest attention shapes. Everything else runs, every NEON kernel's test included.
G4_CROSS_FILTER=${G4_CROSS_FILTER:--Shapes/Nf4GemvTest.*:Nf4Gemv.DeterministicAcrossThreadsAndRowCounts:CpuKernels.MatmulGemmMatchesReference:Nf4Int16.CloseToFloat32Gemv:*rows64_kv2*:*pos4095*:*rows37*:*rows20*}

need=()
for pkg in cmake ninja-build g++-aarch64-linux-gnu qemu-user googletest libeigen3-dev nlohmann-json3-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "== installing: ${need[*]}"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

echo "== cross-building the CPU kernels and their tests for aarch64 ($BUILD_DIR)"
cmake -S tools/cross -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_TOOLCHAIN_FILE="$PWD/tools/cmake/aarch64-linux-gnu.cmake" ${G4_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"

run() { # run <cpu model> <binary> [args...]: the binary under qemu-user on that CPU model
    local cpu=$1
    shift
    qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu "$cpu" "$@"
}

for pair in max:dotprod cortex-a72:neon; do
    cpu=${pair%%:*} want=${pair##*:}
    echo "== qemu-aarch64 -cpu $cpu: expecting the $want level"
    # Forcing a level no aarch64 CPU has makes the dispatcher name the supported ones and the one it uses.
    got=$(G4_CPU_LEVEL=avx2 run "$cpu" "$BUILD_DIR/cpu_dispatch_test" \
        --gtest_filter=CpuDispatch.ActiveLevelIsSupportedAndListed 2>&1 >/dev/null) || true
    case "$got" in
    *"; using $want"*) echo "$got" ;;
    *)
        echo "error: on -cpu $cpu the CPU kernels did not pick $want: '$got'" >&2
        exit 1
        ;;
    esac
    run "$cpu" "$BUILD_DIR/cpu_dispatch_test" --gtest_brief=1 \
        --gtest_filter='CpuDispatch.ActiveLevelIsSupportedAndListed:CpuDispatch.KernelsReportTheLevelInUse'
    run "$cpu" "$BUILD_DIR/cpu_kernels_test" --gtest_brief=1 --gtest_filter="$G4_CROSS_FILTER"
done
echo "== aarch64: all passed"
