#!/usr/bin/env bash
# The full g4-vs-Hugging-Face comparison of issue #5 on the GPU machine, for several models in one go:
# builds g4 (and the CUDA kernel tests, whose plan tests run first), then for each model makes the
# real-shape checkpoint (kept in /tmp/g4bench for later labs) and runs bench/e2e_bench.py.
# The transformers rows need bitsandbytes: unpack its wheel into .bnb/ and carry it with .deps.
# Usage (repo root): bash bench/e2e_device.sh RESULT_DIR e2b [e4b ...]
# Writes RESULT_DIR/{gpu.txt,kt_plan.txt,e2e_<model>.txt,bench_<model>.{json,md,png}} and RESULT_DIR/done
# when finished (every step's failure is logged there and the next model still runs).
set -u
RES=$1
shift
mkdir -p "$RES"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader > "$RES/gpu.txt"
source bench/lab_common.sh
lab_checkpoint_start "$1" "$RES/ckpt_$1.txt"
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps/usr" -DG4_BUILD_TESTS=ON > "$RES/cmake.log" 2>&1 &&
    cmake --build build-dev -j16 --target g4 cuda_kernels_test > "$RES/build.log" 2>&1 || { tail -30 "$RES/build.log"; echo build failed > "$RES/done"; exit 1; }
echo "built: ${SECONDS}s" >> "$RES/progress.txt"
G4_KERNEL_CACHE=/tmp/kc build-dev/tests/cuda_kernels_test --gtest_filter='CudaPlan.*' > "$RES/kt_plan.txt" 2>&1
echo "plan tests rc=$?: ${SECONDS}s" >> "$RES/progress.txt"
lab_checkpoint_wait "$RES/ckpt_$1.txt"
for m in "$@"; do
    lab_checkpoint "$m" "$RES/ckpt_$m.txt"
    echo "checkpoint $m: ${SECONDS}s" >> "$RES/progress.txt"
    PYTHONPATH=$PWD/.bnb PYTHONUNBUFFERED=1 python3 bench/e2e_bench.py build-dev/tools/g4 --model "$m" --out "$RES" \
        --workdir /tmp/g4bench > "$RES/e2e_$m.txt" 2>&1
    echo "e2e $m rc=$?: ${SECONDS}s" >> "$RES/progress.txt"
    rm -f /tmp/g4bench/"$m".g4plan*   # disk: 6-9 GB each
done
echo ok > "$RES/done"
