#!/usr/bin/env bash
# A/B of kernel changes on the GPU machine, side by side in one run: builds this tree (A) and this tree
# with each PATCH applied (B, C, ...), compiles one E2B/E4B plan with each build (kernels live in the
# plan), runs the patched builds' CUDA kernel tests, then alternates `g4 bench` on the plans ROUNDS times.
# Usage (repo root, $OUT set): [MODEL=e2b] [ROUNDS=3] [DEPTHS=16,4096,32000] [KV=bf16] [KT=0] [PARITY=1] bash bench/ab_patch.sh PATCH [PATCH...]
# KT=0 skips the kernel tests (and their build): one patch then fits one 10-minute device call;
# KT_FILTER='*Gemv*' runs only the matching kernel tests (a gtest filter), which also fits (the whole
# suite does not: its flash-attention CPU references take minutes); KT_A=1 runs them on this tree (A) too. The checkpoint is made while the
# sides build, and the sides' plans compile side by side.
# Writes $OUT/ab_<model>.txt (every bench JSON, the sides interleaved) and $OUT/ab_kt_<side>.txt.
set -u
MODEL=${MODEL:-e2b}
ROUNDS=${ROUNDS:-3}
DEPTHS=${DEPTHS:-16,4096,32000}
KV=${KV:-bf16}
KT=${KT:-1}
TARGETS="g4"
[ "$KT" = 0 ] || TARGETS="cuda_kernels_test g4"
source bench/lab_common.sh
lab_sides ab "$@"
lab_checkpoint_start $MODEL $OUT/ab_ckpt.txt
lab_build_sides ON $TARGETS
echo "built: ${SECONDS}s"
if [ "$KT" != 0 ]; then
    for s in $SIDES; do
        [ $s = A ] && [ "${KT_A:-0}" = 0 ] && continue
        $(lab_dir $s)/build-dev/tests/cuda_kernels_test --gtest_filter="${KT_FILTER:-*}" > $OUT/ab_kt_$s.txt 2>&1
        echo "kernel tests $s: $(grep -E "FAILED|PASSED" $OUT/ab_kt_$s.txt | head -20)"
    done
fi
lab_checkpoint_wait $OUT/ab_ckpt.txt
echo "checkpoint: ${SECONDS}s"
# One plan a side, compiled side by side (each its own NVRTC run).
PIDS=()
for s in $SIDES; do (lab_plan $(lab_dir $s)/build-dev/tools/g4 $MODEL $KV /tmp/ab_$s.g4plan) & PIDS+=($!); done
for p in "${PIDS[@]}"; do wait $p || exit 1; done
echo "checkpoint and plans: ${SECONDS}s"
R=$OUT/ab_$MODEL.txt
: > $R
for r in $(seq $ROUNDS); do
    for s in $SIDES; do
        d=$(lab_dir $s)
        echo "## round $r $s" >> $R
        $d/build-dev/tools/g4 bench /tmp/ab_$s.g4plan -p 512 -n 128 -d $DEPTHS -r 3 --json >> $R 2>&1
    done
done
python3 bench/ab_summary.py "$R"
# PARITY=1: bench/cuda_parity.py with each patched side's build after the benches (~2 min a side), so one call
# can measure and check a patch; $OUT/parity_<side>.txt.
if [ "${PARITY:-0}" = 1 ]; then
    for s in $SIDES; do
        [ $s = A ] && continue
        d=$(lab_dir $s)
        (cd $d && python3 bench/cuda_parity.py build-dev/tools/g4) > $OUT/parity_$s.txt 2>&1
        echo "parity $s: $(tail -1 $OUT/parity_$s.txt)"
    done
fi
