#!/usr/bin/env bash
# Runs the CUDA kernel and plan tests (tests/cuda/*_test.cpp: every kernel at real shapes, and the CudaPlan
# decode tests of whole plans) under compute-sanitizer's memcheck, racecheck,
# initcheck and synccheck, on a machine with an NVIDIA GPU and compute-sanitizer on its PATH. A tool passes
# when it reports 0 errors and the tests pass under it. Not part of ctest (it needs a GPU).
#
# Usage (repository root, after building the tests/cuda executables, build/tests/cuda_*_test):
#   bash tests/gpu/compute_sanitizer.sh [BUILD_DIR] [OUT_DIR]
# Environment: TOOLS (default "memcheck racecheck initcheck synccheck"), FILTER (a gtest filter, default
# every test), LIMIT (seconds a tool may run, default 900). initcheck runs with G4_CUBLAS=off: it does not see
# cuBLAS's stores, so every read of a cuBLAS GEMM's output would be reported (CUBLAS_INITCHECK=on keeps it).
# Writes OUT_DIR/<tool>.log (default OUT_DIR: sanitizer-out) and prints one summary line a tool.
set -u
BUILD=${1:-build}
OUT=${2:-sanitizer-out}
TOOLS=${TOOLS:-memcheck racecheck initcheck synccheck}
FILTER=${FILTER:-*}
LIMIT=${LIMIT:-900}
TESTS=$(ls "$BUILD"/tests/cuda_*_test 2>/dev/null | grep -v cuda_compile_test | grep -v cuda_schedule_test)
command -v compute-sanitizer >/dev/null || { echo "compute_sanitizer.sh: compute-sanitizer is not on PATH" >&2; exit 2; }
[ -n "$TESTS" ] || { echo "compute_sanitizer.sh: no $BUILD/tests/cuda_*_test built (cmake --build $BUILD)" >&2; exit 2; }
mkdir -p "$OUT"
fail=0
for tool in $TOOLS; do
    log=$OUT/$tool.log
    : > "$log"
    start=$SECONDS
    # Launches of every kernel are checked; CUDA API errors are reported too (the default), so a failed
    # lookup or allocation counts as an error.
    envs=()
    [ "$tool" = initcheck ] && [ "${CUBLAS_INITCHECK:-off}" = off ] && envs=(G4_CUBLAS=off)
    rc=0
    for test in $TESTS; do
        env "${envs[@]}" timeout "$LIMIT" compute-sanitizer --tool "$tool" --error-exitcode 86 --print-limit 20 \
            --target-processes all "$test" --gtest_filter="$FILTER" >> "$log" 2>&1 || rc=$?
    done
    secs=$((SECONDS - start))
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)
    tests=$(grep -E '^\[  (PASSED|FAILED)  \]' "$log" | tr '\n' ' ')
    echo "$tool: rc $rc, ${secs} s, ${summary:-no summary} | $tests"
    [ "$rc" = 0 ] || fail=1
done
exit $fail
