#!/usr/bin/env bash
# Sanitizer and fuzzing runs (docs/fuzzing.md), each in its own build folder, built with clang:
#
#   bash tools/sanitize.sh asan [--all]   AddressSanitizer + UndefinedBehaviorSanitizer build (build-asan), then
#                                         the suite's CI subset (ASAN_EXCLUDE below) or, with --all, every test.
#                                         The subset: every unit, ops and fuzz-replay test, runtime_test, the
#                                         multi-session tests, and the e2e tests of bad input, adapters,
#                                         images/audio and text on the CPU. Left out for time: parity (many full
#                                         compiles per dtype), long_context, cross_device, placement_cli,
#                                         cuda_schedule and cuda_compile (CUDA plan compiles: NVRTC's output is
#                                         not instrumented anyway), the NF4 throughput print and the CPU
#                                         kernels' real-shape sweeps; the executables holding only these, and
#                                         the GPU tests (tests/cuda), are not built for the subset.
#   bash tools/sanitize.sh tsan           ThreadSanitizer build (build-tsan) of the CPU worker pool's test
#                                         (tests/unit/thread_pool_test.cpp), the C API's multi-session tests
#                                         (tests/unit/concurrency_test.cpp) and the runtime's cancellation test.
#   bash tools/sanitize.sh fuzz [SECONDS] [TARGET...]
#                                         libFuzzer + ASan + UBSan build (build-fuzz); runs each target (default:
#                                         all of tests/fuzz) for SECONDS (default 60) on its seeds, regression
#                                         inputs and the corpus kept in build-fuzz/fuzz/corpus/<target>. Any crash,
#                                         sanitizer report, leak, input over 10 s, RSS over 2 GB or allocation over
#                                         1 GB fails; the input is saved in build-fuzz/fuzz/artifacts/<target>/.
#   bash tools/sanitize.sh ci             what .ci/run runs after tools/test.sh: the asan CI subset, built in
#                                         build-fuzz (the same sanitizers; one instrumented build instead of
#                                         two), then tsan, then fuzz 20.
#
# Installs clang and libFuzzer's runtime (Debian: clang, libclang-rt-14-dev or the clang version's package)
# when missing. JOBS (default: nproc) sets the build's parallelism.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${JOBS:-$(nproc)}
ALL_FUZZ_TARGETS=(safetensors config adapter tokenizer chat image wav media plan)
# The ASan CI subset is the suite less these test suites (gtest suite names; parameterized ones match after '/')
# and the per-instruction-set reruns (cpu_level_*: the op table, kernel and parity tests again with G4_CPU_LEVEL
# forced; the subset runs those tests at the machine's own level).
# The CPU kernels' real-shape sweeps are left out too, as under qemu (tools/cross_aarch64.sh): the same kernels
# run at smaller shapes with the same tails in the op and kernel tests.
ASAN_EXCLUDE='(^|/)(Parity|ParityTest|Bf16KvParityTest|LongContext|CrossDevice|PlacementCli|CudaSchedule|CudaCompile|CudaPlan|Nf4Perf)\.|^cpu_level_'
ASAN_EXCLUDE+='|^Shapes/Nf4GemvTest\.|^Nf4Gemv\.DeterministicAcrossThreadsAndRowCounts$|^CpuKernels\.MatmulGemmMatchesReference$'
ASAN_EXCLUDE+='|^Nf4Int16\.CloseToFloat32Gemv$'
# The executables that hold nothing else, and those whose every test needs a GPU, are not built for the subset.
ASAN_LEFT_OUT="long_context_test;cross_device_test;placement_cli_test;cuda_schedule_test;cuda_compile_test"
ASAN_LEFT_OUT+=";cuda_kernels_test;cuda_attention_test;cuda_ops_kernels_test;cuda_sampling_test"

need_packages() {
    local need=()
    for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
    if [ ${#need[@]} -gt 0 ]; then
        echo "== installing: ${need[*]}"
        local SUDO=""
        [ "$(id -u)" -ne 0 ] && SUDO=sudo
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
    fi
}

setup_clang() {
    G4_SETUP_SKIP_BUILD=1 bash tools/setup.sh >/dev/null   # the project's own packages
    need_packages clang
    # libFuzzer and the sanitizer runtimes ship in libclang-rt-N-dev (N: clang's major version).
    local major
    major=$(clang --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)
    if ! ls "$(clang -print-resource-dir)"/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
        need_packages "libclang-rt-$major-dev"
    fi
}

# The CUDA plans the tests compile take NVRTC's outputs from the main build's kernel cache when tools/test.sh
# made one (the cache's key holds NVRTC's version, options and source; NVRTC itself is not instrumented).
KERNEL_CACHE=""
[ -d "$ROOT/build/kernel-cache" ] && KERNEL_CACHE="$ROOT/build/kernel-cache"

# configure DIR CMAKE_ARGS...: a clang build folder (ccache when installed). Sanitizer builds hold one copy of
# the CPU kernels (G4_NATIVE: this machine's instruction set) instead of one per x86-64 level: the level
# dispatch and the per-level reruns are tools/test.sh's, and three instrumented copies cost CI minutes.
configure() {
    local dir=$1
    shift
    local launcher=()
    if command -v ccache >/dev/null; then
        launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    fi
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
        -DG4_NATIVE=ON -DG4_TEST_KERNEL_CACHE="${KERNEL_CACHE:-$ROOT/$dir/kernel-cache}" "${launcher[@]}" "$@" >/dev/null
}

# Sanitizer reports of every process (the CLI the tests start included) go to files under $1; any is a failure.
sanitizer_env() {
    local logs=$1
    rm -rf "$logs"
    mkdir -p "$logs"
    export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:log_path=$logs/asan"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1:log_path=$logs/ubsan"
    export TSAN_OPTIONS="halt_on_error=1:abort_on_error=1:second_deadlock_stack=1:log_path=$logs/tsan"
}
check_sanitizer_logs() {
    local logs=$1
    if compgen -G "$logs/*" >/dev/null; then
        echo "== sanitizer reports in $logs:"
        cat "$logs"/*
        return 1
    fi
}

# asan_suite DIR [--all] CMAKE_ARGS...: builds DIR with the given sanitizer options and runs the suite in it.
asan_suite() {
    local dir=$1 all=$2
    shift 2
    setup_clang
    echo "== ASan+UBSan build ($dir)"
    local left_out="$ASAN_LEFT_OUT"
    [ "$all" = --all ] && left_out=""
    configure "$dir" -DG4_TESTS_LEFT_OUT="$left_out" "$@"
    cmake --build "$dir" -j"$JOBS"
    sanitizer_env "$ROOT/$dir/sanitizer-logs"
    local filter=(-E "$ASAN_EXCLUDE")
    [ "$all" = --all ] && filter=()
    echo "== ctest under ASan+UBSan ${filter[*]:+(CI subset)}"
    local rc=0
    ctest --test-dir "$dir" --output-on-failure -j"$JOBS" "${filter[@]}" || rc=1
    check_sanitizer_logs "$ROOT/$dir/sanitizer-logs" || rc=1
    unset ASAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS
    return $rc
}
run_asan() { asan_suite build-asan "${1:-}" -DG4_SANITIZE=address,undefined; }

run_tsan() {
    setup_clang
    echo "== TSan build (build-tsan)"
    configure build-tsan -DG4_SANITIZE=thread
    cmake --build build-tsan -j"$JOBS" --target concurrency_test runtime_test thread_pool_test
    sanitizer_env "$ROOT/build-tsan/sanitizer-logs"
    # clang 14's TSan cannot map its shadow under the high ASLR entropy of recent kernels: run without ASLR.
    local norand=()
    if setarch "$(uname -m)" -R true 2>/dev/null; then norand=(setarch "$(uname -m)" -R); fi
    echo "== the CPU worker pool and the multi-session tests under TSan"
    local rc=0
    "${norand[@]}" build-tsan/tests/thread_pool_test || rc=1
    local kc=${KERNEL_CACHE:-$ROOT/build-tsan/kernel-cache}
    G4_KERNEL_CACHE="$kc" "${norand[@]}" build-tsan/tests/concurrency_test || rc=1
    G4_KERNEL_CACHE="$kc" "${norand[@]}" build-tsan/tests/runtime_test \
        --gtest_filter='Runtime.Cancel*:Runtime.CApiRejectsMisuse' || rc=1
    check_sanitizer_logs "$ROOT/build-tsan/sanitizer-logs" || rc=1
    return $rc
}

run_fuzz() {
    local seconds=${1:-60}
    shift || true
    local targets=("$@")
    [ ${#targets[@]} -eq 0 ] && targets=("${ALL_FUZZ_TARGETS[@]}")
    setup_clang
    echo "== libFuzzer build (build-fuzz)"
    configure build-fuzz -DG4_FUZZ=ON
    cmake --build build-fuzz -j"$JOBS" --target fuzz_seeds "${targets[@]/#/fuzz_}"
    local base="$ROOT/build-fuzz/fuzz" failed=() summary=()
    export ASAN_OPTIONS="detect_leaks=1"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
    for t in "${targets[@]}"; do
        local corpus="$base/corpus/$t" art="$base/artifacts/$t" log="$base/logs/$t.log"
        mkdir -p "$corpus" "$art" "$base/logs"
        # libFuzzer writes new inputs into the first directory: the corpus, never the tree's regressions.
        local extra=() regress=()
        [ -d "tests/fuzz/regressions/$t" ] && regress=("tests/fuzz/regressions/$t")
        [ -f "tests/fuzz/dict/$t.dict" ] && extra=(-dict="tests/fuzz/dict/$t.dict")
        echo "== fuzz $t for ${seconds}s (log: $log)"
        if TMPDIR="$base" build-fuzz/tests/fuzz/fuzz_"$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
            -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$art/" "${extra[@]}" \
            "$corpus" "${regress[@]}" "$base/seeds/$t" >"$log" 2>&1; then
            local execs
            execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
            summary+=("$t: ${execs:-?} runs in ${seconds}s ($(( ${execs:-0} / seconds ))/s), corpus $(ls "$corpus" | wc -l) inputs")
        else
            failed+=("$t")
            summary+=("$t: FAILED, reproducer(s): $(ls -d "$art"/* 2>/dev/null | tr '\n' ' ')")
            grep -E 'ERROR|SUMMARY|runtime error|==[0-9]+==' "$log" | head -20 || true
        fi
    done
    echo "== fuzz summary"
    printf '  %s\n' "${summary[@]}"
    if [ ${#failed[@]} -gt 0 ]; then
        echo "failed: ${failed[*]} (replay one with: build-fuzz/tests/fuzz/fuzz_TARGET FILE)"
        return 1
    fi
}

mode=${1:-}
shift || true
case "$mode" in
asan) run_asan "$@" ;;
tsan) run_tsan ;;
fuzz) run_fuzz "$@" ;;
ci)
    # One ASan+UBSan build serves the suite and the fuzzers (build-fuzz: G4_FUZZ's coverage instrumentation
    # on top of the same sanitizers): a third instrumented build of the tree would not fit CI's time.
    rc=0
    for step in "asan_suite build-fuzz subset -DG4_FUZZ=ON" "run_tsan" "run_fuzz 20"; do
        start=$(date +%s)
        $step || rc=1
        echo "== ${step%% *}: $(( $(date +%s) - start ))s"
    done
    exit $rc
    ;;
*)
    sed -n '2,28p' "$0"
    exit 2
    ;;
esac
