#!/usr/bin/env bash
# A/B of runtime switches on a CUDA GPU, side by side in one run: one build, one real-shape NF4 plan,
# `g4 bench -p 512 -n 128 -d $DEPTHS` alternated between environment settings (e.g. G4_LM_SCREEN=0
# against the default), so the sides differ only in what the switch changes. Medians per side.
# Usage (repo root): [MODEL=e2b] [ROUNDS=3] [DEPTHS=16,4096] [KV=bf16] [KT_FILTER=...] bash bench/scripts/ab_env.sh 'A_ENV' 'B_ENV' ...
#   e.g. bash bench/scripts/ab_env.sh '' 'G4_PDL=0'   (programmatic dependent launch on / off)
#   KT_FILTER: build the tests too and run the CUDA kernel tests it matches (a gtest filter) first
#   each argument: space-separated VAR=value settings for one side ('' = the defaults)
# BUILD, CMAKE_ARGS, WORK, OUT: see lab_common.sh.
# Writes $OUT/ab_env_<model>.txt (every bench JSON, the sides interleaved) and prints the medians.
set -u
MODEL=${MODEL:-e2b}
ROUNDS=${ROUNDS:-3}
DEPTHS=${DEPTHS:-16,4096}
KV=${KV:-bf16}
source bench/scripts/lab_common.sh
lab_checkpoint_start $MODEL $OUT/ab_ckpt.txt
if [ -n "${KT_FILTER:-}" ]; then   # the kernel tests matching KT_FILTER first, in $OUT/ab_env_kt.txt
    LAB_ROOT=$PWD SIDES=A lab_build_sides ON cuda_kernels_test g4
    echo "built: ${SECONDS}s"
    $BUILD/tests/cuda_kernels_test --gtest_filter="$KT_FILTER" > $OUT/ab_env_kt.txt 2>&1
    echo "kernel tests: $(grep -E "FAILED|PASSED" $OUT/ab_env_kt.txt | head -20) (${SECONDS}s)"
else
    lab_build ab_env
    echo "built: ${SECONDS}s"
fi
lab_checkpoint_wait $OUT/ab_ckpt.txt
PLAN=$WORK/ab_env_$MODEL.g4plan
lab_plan $BUILD/tools/g4 $MODEL $KV $PLAN
$BUILD/tools/g4 inspect $PLAN | grep "CUDA decode schedule"
echo "checkpoint and plan: ${SECONDS}s"
env_side() { echo "env $2 $BUILD/tools/g4 bench $PLAN"; }
lab_rounds $OUT/ab_env_$MODEL.txt env_side "$@"
