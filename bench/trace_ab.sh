#!/usr/bin/env bash
# Every block's timeline, this tree (A) against this tree with each PATCH applied (B, C, ...), in one run
# on the GPU machine: one real-shape NF4 plan a side compiled with G4_KERNEL_TRACE=2 (every block of every
# decode launch records entry, release and exit), `g4 bench` on each, then bench/trace_blocks.py.
# Usage (repo root, $OUT set): [MODEL=e2b] [DEPTH=16] [KV=bf16] bash bench/trace_ab.sh [PATCH...]
# Writes $OUT/tb_<model>_<side>.txt (the bench and the summary) and .csv; the traces stay in /tmp.
set -u
PATCHES=()
for p in "$@"; do PATCHES+=("$(realpath "$p")"); done
SIDES="A"
for i in "${!PATCHES[@]}"; do SIDES="$SIDES $(printf "\\x$(printf %x $((66 + i)))")"; done
MODEL=${MODEL:-e2b}
DEPTH=${DEPTH:-16}
KV=${KV:-bf16}
A=$PWD
dir() { if [ $1 = A ]; then echo $A; else echo /tmp/tb_$1; fi; }
i=0
for s in $SIDES; do
    [ $s = A ] && continue
    B=$(dir $s)
    rm -rf $B && mkdir -p $B
    tar --exclude='./build*' --exclude=./.deps --exclude=./.bnb -cf - . | tar -xf - -C $B
    ln -s $A/.deps $B/.deps
    (cd $B && patch -p1 -s < ${PATCHES[$i]}) || { echo "patch ${PATCHES[$i]} does not apply"; exit 1; }
    i=$((i + 1))
done
source bench/lab_common.sh
lab_checkpoint_start $MODEL $OUT/tb_ckpt.txt
PIDS=()
for s in $SIDES; do
    d=$(dir $s)
    (cmake -S $d -B $d/build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$A/.deps/usr" -DG4_BUILD_TESTS=OFF > $d/cmake.log 2>&1 &&
        cmake --build $d/build-dev -j8 --target g4 > $d/build.log 2>&1) &
    PIDS+=($!)
done
for s in $SIDES; do
    wait ${PIDS[0]} || { tail -30 $(dir $s)/build.log; exit 1; }
    PIDS=("${PIDS[@]:1}")
done
echo "built: ${SECONDS}s"
lab_checkpoint_wait $OUT/tb_ckpt.txt
PIDS=()
for s in $SIDES; do (G4_KERNEL_TRACE=2 lab_plan $(dir $s)/build-dev/tools/g4 $MODEL $KV /tmp/tb_$s.g4plan) & PIDS+=($!); done
for p in "${PIDS[@]}"; do wait $p || exit 1; done
echo "checkpoint and plans: ${SECONDS}s"
for s in $SIDES; do
    R=$OUT/tb_${MODEL}_$s.txt
    echo "## side $s (traced, every block): g4 bench -p 512 -n 128 -d $DEPTH -r 1" > $R
    G4_TRACE_OUT=/tmp/tb_$s.bin $(dir $s)/build-dev/tools/g4 bench /tmp/tb_$s.g4plan -p 512 -n 128 -d $DEPTH -r 1 >> $R 2>&1
    python3 bench/trace_blocks.py /tmp/tb_$s.bin --csv $OUT/tb_${MODEL}_$s.csv >> $R 2>&1
    echo "side $s traced: ${SECONDS}s"
done
