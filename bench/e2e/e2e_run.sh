#!/usr/bin/env bash
# The full g4-against-Hugging-Face comparison on a CUDA GPU, for several models in one go (the tables in
# docs/performance.md and bench/README.md): builds g4 and the CUDA kernel tests (whose CudaPlan.* tests run
# first), then for each model makes the random-weight real-shape checkpoint (kept in $WORK) and runs
# bench/e2e/e2e_bench.py. About 7-10 minutes a model on an H200.
# Needs torch with CUDA, transformers, peft; bitsandbytes for the transformers NF4 row (it is reported as
# not run without it). BUILD, CMAKE_ARGS, WORK, JOBS: see bench/scripts/lab_common.sh. LLAMA_CPP: a llama.cpp
# source tree built with CUDA, for the llama.cpp rows (e2e_bench.py --llama-cpp).
# Usage (repo root): bash bench/e2e/e2e_run.sh RESULT_DIR e2b [e4b ...]
# Writes RESULT_DIR/{gpu.txt,kt_plan.txt,e2e_<model>.txt,bench_<model>.{json,md,png}} and RESULT_DIR/done
# when finished (every step's failure is logged there and the next model still runs).
set -u
RES=$1
shift
mkdir -p "$RES"
OUT=$RES
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader > "$RES/gpu.txt"
source bench/scripts/lab_common.sh
lab_checkpoint_start "$1" "$RES/ckpt_$1.txt"
cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DG4_BUILD_TESTS=ON ${CMAKE_ARGS:-} > "$RES/cmake.log" 2>&1 &&
    cmake --build $BUILD -j$JOBS --target g4 cuda_kernels_test > "$RES/build.log" 2>&1 || { tail -30 "$RES/build.log"; echo build failed > "$RES/done"; exit 1; }
echo "built: ${SECONDS}s" >> "$RES/progress.txt"
G4_KERNEL_CACHE=$WORK/kernel_cache $BUILD/tests/cuda_kernels_test --gtest_filter='CudaPlan.*' > "$RES/kt_plan.txt" 2>&1
echo "plan tests rc=$?: ${SECONDS}s" >> "$RES/progress.txt"
lab_checkpoint_wait "$RES/ckpt_$1.txt"
for m in "$@"; do
    lab_checkpoint "$m" "$RES/ckpt_$m.txt"
    echo "checkpoint $m: ${SECONDS}s" >> "$RES/progress.txt"
    PYTHONUNBUFFERED=1 python3 bench/e2e/e2e_bench.py $BUILD/tools/g4 --model "$m" --out "$RES" --workdir $WORK \
        ${LLAMA_CPP:+--llama-cpp "$LLAMA_CPP"} > "$RES/e2e_$m.txt" 2>&1
    echo "e2e $m rc=$?: ${SECONDS}s" >> "$RES/progress.txt"
    rm -f $WORK/"$m".g4plan*   # disk: 6-9 GB each
done
echo ok > "$RES/done"
