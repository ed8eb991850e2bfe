#!/usr/bin/env bash
# Every block's timeline, this tree (A) against this tree with each PATCH applied (B, C, ...), in one run
# on the GPU machine: one real-shape NF4 plan a side compiled with G4_KERNEL_TRACE=2 (every block of every
# decode launch records entry, release and exit), `g4 bench` on each, then bench/trace_blocks.py.
# Usage (repo root, $OUT set): [MODEL=e2b] [DEPTH=16] [KV=bf16] [P=16] [N=20] bash bench/trace_ab.sh [PATCH...]
# Writes $OUT/tb_<model>_<side>.txt (the bench and the summary) and .csv; the traces stay in /tmp.
set -u
MODEL=${MODEL:-e2b}
DEPTH=${DEPTH:-16}
P=${P:-16}    # prompt tokens of the pp test and decode steps: small enough that the ring (2M records) does not wrap
N=${N:-20}
KV=${KV:-bf16}
source bench/lab_common.sh
lab_sides tb "$@"
lab_checkpoint_start $MODEL $OUT/tb_ckpt.txt
lab_build_sides OFF g4
echo "built: ${SECONDS}s"
lab_checkpoint_wait $OUT/tb_ckpt.txt
PIDS=()
for s in $SIDES; do (G4_KERNEL_TRACE=2 lab_plan $(lab_dir $s)/build-dev/tools/g4 $MODEL $KV /tmp/tb_$s.g4plan) & PIDS+=($!); done
for p in "${PIDS[@]}"; do wait $p || exit 1; done
echo "checkpoint and plans: ${SECONDS}s"
for s in $SIDES; do
    R=$OUT/tb_${MODEL}_$s.txt
    echo "## side $s (traced, every block): g4 bench -p $P -n $N -d $DEPTH -r 1" > $R
    G4_TRACE_OUT=/tmp/tb_$s.bin $(lab_dir $s)/build-dev/tools/g4 bench /tmp/tb_$s.g4plan -p $P -n $N -d $DEPTH -r 1 >> $R 2>&1
    python3 bench/trace_blocks.py /tmp/tb_$s.bin --csv $OUT/tb_${MODEL}_$s.csv >> $R 2>&1
    echo "side $s traced: ${SECONDS}s"
done
