#!/usr/bin/env bash
# The decode step's timeline on a CUDA GPU: one real-shape NF4 plan compiled twice, as is and with
# the kernel trace (`g4 compile --kernel-trace launches`: the first and last block of every decode kernel record the global
# timer at entry, after the programmatic wait and at exit), `g4 bench` on both (the trace's cost), then
# bench/scripts/trace_summary.py: each launch's share of the critical path (release to release).
# Usage (repo root): [MODELS=e2b] [DEPTH=16] [KV=bf16] bash bench/scripts/trace_lab.sh
# BUILD, CMAKE_ARGS, WORK, OUT: see lab_common.sh.
# MODELS=e2b,e4b: both, the second's checkpoint made while the first's plans compile.
# Writes $OUT/trace_<model>.bin, $OUT/trace_<model>.txt (the summary), $OUT/trace_<model>.csv.
set -u
MODELS=${MODELS:-e2b}
DEPTH=${DEPTH:-16}
KV=${KV:-bf16}
source bench/scripts/lab_common.sh
FIRST=${MODELS%%,*}
lab_checkpoint_start $FIRST $OUT/trace_ckpt_$FIRST.txt
lab_build trace
echo "built: ${SECONDS}s"
lab_checkpoint_wait $OUT/trace_ckpt_$FIRST.txt
for MODEL in ${MODELS//,/ }; do
    lab_checkpoint $MODEL $OUT/trace_ckpt_$MODEL.txt
    # Both plans side by side (each its own NVRTC run), with the next model's checkpoint, so that the
    # benches below run alone.
    PIDS=()
    for t in 0 1; do
        TR=off; [ $t = 1 ] && TR=launches
        [ -f $WORK/trace_${MODEL}_$t.g4plan ] || (lab_plan $BUILD/tools/g4 $MODEL $KV $WORK/trace_${MODEL}_$t.g4plan "--kernel-trace $TR") &
        PIDS+=($!)
    done
    NEXT=$(echo ",$MODELS," | sed -n "s/.*,$MODEL,\([^,]*\),.*/\1/p")
    [ -n "$NEXT" ] && { (lab_checkpoint $NEXT $OUT/trace_ckpt_$NEXT.txt) > /dev/null 2>&1 & PIDS+=($!); }
    for p in "${PIDS[@]}"; do wait $p || exit 1; done
    echo "$MODEL checkpoint and plans: ${SECONDS}s"
    R=$OUT/trace_$MODEL.txt
    : > $R
    for t in 0 1; do
        echo "## plan traced=$t: g4 bench -p 512 -n 128 -d $DEPTH -r 2" >> $R
        G4_TRACE_OUT=$OUT/trace_$MODEL.bin $BUILD/tools/g4 bench $WORK/trace_${MODEL}_$t.g4plan -p 512 -n 128 -d $DEPTH -r 2 >> $R 2>&1
    done
    python3 bench/scripts/trace_summary.py $OUT/trace_$MODEL.bin --csv $OUT/trace_$MODEL.csv >> $R 2>&1
    echo "$MODEL traced: ${SECONDS}s"
done
