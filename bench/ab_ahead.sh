#!/usr/bin/env bash
# Decoding ahead (greedy tokens fed on the device, the next decode step enqueued before the host reads
# the token) on the GPU machine: one build with the tests, the kernel tests that cover it, then `g4 bench`
# alternated between G4_DECODE_AHEAD=0 (A) and the default (B) on one plan, ROUNDS times.
# Usage (repo root, $OUT set): [MODEL=e2b] [ROUNDS=3] [DEPTHS=16,4096] [KV=bf16] [KT_FILTER=...] bash bench/ab_ahead.sh
# Writes $OUT/kt_ahead.txt and $OUT/ab_ahead_<model>.txt (every bench JSON, the sides interleaved).
set -u
MODEL=${MODEL:-e2b}
ROUNDS=${ROUNDS:-3}
DEPTHS=${DEPTHS:-16,4096}
KV=${KV:-bf16}
source bench/lab_common.sh
lab_checkpoint_start $MODEL $OUT/ab_ckpt.txt
LAB_ROOT=$PWD SIDES=A lab_build_sides ON cuda_kernels_test g4
echo "built: ${SECONDS}s"
if [ "${KT_FILTER:-*Argmax*:*CudaPlan*}" != none ]; then
    G4_KERNEL_CACHE=/tmp/g4kc build-dev/tests/cuda_kernels_test --gtest_filter="${KT_FILTER:-*Argmax*:*CudaPlan*}" > $OUT/kt_ahead.txt 2>&1
    echo "kernel tests: $(grep -E "FAILED|PASSED|decode ahead" $OUT/kt_ahead.txt | head -20) (${SECONDS}s)"
fi
lab_checkpoint_wait $OUT/ab_ckpt.txt
PLAN=/tmp/ab_ahead_$MODEL.g4plan
[ -f $PLAN ] || lab_plan build-dev/tools/g4 $MODEL $KV $PLAN
echo "checkpoint and plan: ${SECONDS}s"
R=$OUT/ab_ahead_$MODEL.txt
: > $R
for r in $(seq $ROUNDS); do
    for side in A B; do
        e=""
        [ $side = A ] && e="G4_DECODE_AHEAD=0"
        echo "## round $r $side [$e]" >> $R
        env $e build-dev/tools/g4 bench $PLAN -p 512 -n 128 -d $DEPTHS -r 3 --json >> $R 2>&1
    done
done
python3 bench/ab_summary.py "$R"
