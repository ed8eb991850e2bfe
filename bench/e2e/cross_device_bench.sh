#!/usr/bin/env bash
# Layers on the CPU in a CUDA plan (--place layers=...:cpu) on a CUDA GPU: correctness on the tiny
# fixtures (tests/gpu/split_compare.sh: greedy tokens and prefill logits of the split plan against the
# GPU-only plan, same flags) and the decode-speed cost at the real E2B shapes (g4 bench -p 512 -n 64 -d 16,
# two rounds, plans interleaved).
# Usage (repo root): [G4=build/tools/g4] [WORK=/tmp/g4bench] [OUT=bench-out] bash bench/e2e/cross_device_bench.sh
# Makes the E2B checkpoint with bench/e2e/e2e_bench.py if $WORK has none. Writes $OUT/cross_device.txt.
set -u
G4=${G4:-build/tools/g4}
WORK=${WORK:-/tmp/g4bench}
OUT=${OUT:-bench-out}
mkdir -p $OUT $WORK
R=$OUT/cross_device.txt
: > $R
W=$WORK/cross_device && mkdir -p $W
bash tests/gpu/split_compare.sh $G4 $W e2b_tiny_text:"0-6:gpu,7-9:cpu" e2b_tiny_text:"0-5:cpu,6-9:gpu" \
     e2b_tiny_text:"0-1:cpu,2-4:gpu,5-7:cpu,8-9:gpu" e4b_tiny:"0-7:gpu,8-11:cpu" >> $R || exit 1
cat $R
# Real E2B shapes: decode cost of CPU-placed layers.
[ -d $WORK/e2b ] || python3 bench/e2e/e2e_bench.py $G4 --model e2b --workdir $WORK --checkpoint-only > $W/ck.txt 2>&1 || { tail $W/ck.txt; exit 1; }
for pl in none 34:cpu 30-34:cpu; do
    args=""; [ $pl != none ] && args="--place layers=0-$(( ${pl%%[-:]*} - 1 )):gpu,$pl"
    $G4 compile --model $WORK/e2b --device cuda --weights nf4 --chunk 1024 --max-context 8192 --no-fidelity $args -o $W/e2b-$pl.g4plan 2> $W/c.log || { tail $W/c.log; exit 1; }
    echo "## plan $pl" >> $R; grep -E "cuda:0|host |cross-device" $W/c.log >> $R
done
for r in 1 2; do
    for pl in none 34:cpu 30-34:cpu; do
        echo "## round $r $pl" >> $R
        $G4 bench $W/e2b-$pl.g4plan -p 512 -n 64 -d 16 -r 3 --json >> $R 2>&1
    done
done
grep -A3 "## round" $R | grep -oE '"test":"[^"]*","tok_s":[0-9.]+|## round.*' | tail -20
