#!/usr/bin/env bash
# Every block's timeline of the decode step on a CUDA GPU, for this tree (A) and optionally this tree with
# each PATCH (a diff) applied (B, C, ...), in one run: one real-shape NF4 plan a side compiled with
# `g4 compile --kernel-trace blocks` (every block of every decode launch records entry, release and exit; ~9% slower),
# `g4 bench -p $P -n $N` on each, then bench/scripts/trace_blocks.py (each launch's share of a token).
# Usage (repo root): [MODEL=e2b] [DEPTH=16] [KV=bf16] [P=16] [N=20] bash bench/scripts/trace_ab.sh [PATCH...]
# BUILD, CMAKE_ARGS, WORK, OUT: see lab_common.sh.
# Writes $OUT/tb_<model>_<side>.txt (the bench and the summary) and .csv; the traces stay in $WORK.
set -u
MODEL=${MODEL:-e2b}
DEPTH=${DEPTH:-16}
P=${P:-16}    # prompt tokens of the pp test and decode steps: small enough that the ring (2M records) does not wrap
N=${N:-20}
KV=${KV:-bf16}
source bench/scripts/lab_common.sh
lab_sides tb "$@"
lab_checkpoint_start $MODEL $OUT/tb_ckpt.txt
lab_build_sides OFF g4
echo "built: ${SECONDS}s"
lab_checkpoint_wait $OUT/tb_ckpt.txt
PIDS=()
for s in $SIDES; do (lab_plan $(lab_dir $s)/$BUILD/tools/g4 $MODEL $KV $WORK/tb_$s.g4plan "--kernel-trace blocks") & PIDS+=($!); done
for p in "${PIDS[@]}"; do wait $p || exit 1; done
echo "checkpoint and plans: ${SECONDS}s"
for s in $SIDES; do
    R=$OUT/tb_${MODEL}_$s.txt
    echo "## side $s (traced, every block): g4 bench -p $P -n $N -d $DEPTH -r 1" > $R
    G4_TRACE_OUT=$WORK/tb_$s.bin $(lab_dir $s)/$BUILD/tools/g4 bench $WORK/tb_$s.g4plan -p $P -n $N -d $DEPTH -r 1 >> $R 2>&1
    python3 bench/scripts/trace_blocks.py $WORK/tb_$s.bin --csv $OUT/tb_${MODEL}_$s.csv >> $R 2>&1
    echo "side $s traced: ${SECONDS}s"
done
