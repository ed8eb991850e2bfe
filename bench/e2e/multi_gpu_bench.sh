#!/usr/bin/env bash
# Text layers on two GPUs (--place layers=A-B:gpu0,C-D:gpu1[,E-F:cpu]) on a machine with two CUDA GPUs:
# correctness on the tiny fixtures (tests/gpu/split_compare.sh: greedy tokens and prefill logits of each
# split plan against the one-GPU plan, same flags), then at the real E2B shapes each GPU's plan and
# measured peak, and the decode and prefill cost of the split (g4 bench -p 512,4096 -n 64 -d 16, two
# rounds, plans interleaved).
# Usage (repo root): [G4=build/tools/g4] [WORK=/tmp/g4bench] [OUT=bench-out] [PART=tiny|e2b|all] bash bench/e2e/multi_gpu_bench.sh
# Makes the E2B checkpoint with bench/e2e/e2e_bench.py if $WORK has none. Writes $OUT/multi_gpu.txt.
set -u
G4=${G4:-build/tools/g4}
WORK=${WORK:-/tmp/g4bench}
OUT=${OUT:-bench-out}
mkdir -p $OUT $WORK
R=$OUT/multi_gpu.txt
W=$WORK/multi_gpu && mkdir -p $W
PART=${PART:-all}
echo "# $(nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tr '\n' ';')" >> $R
nvidia-smi topo -m 2>/dev/null | head -4 >> $R
if [ $PART != e2b ]; then
  bash tests/gpu/split_compare.sh $G4 $W e2b_tiny_text:"0-4:gpu0,5-9:gpu1" e2b_tiny_text:"0-5:gpu1,6-9:gpu0" \
       e2b_tiny_text:"0-2:gpu0,3-5:gpu1,6-7:cpu,8-9:gpu1" e2b_tiny_text:"0-6:gpu,7-9:cpu" e4b_tiny:"0-5:gpu0,6-11:gpu1" >> $R || exit 1
  cat $R
fi
[ $PART = tiny ] && exit 0
# Real E2B shapes: per-GPU plans, measured peaks, decode and prefill cost of the split.
[ -d $WORK/e2b ] || python3 bench/e2e/e2e_bench.py $G4 --model e2b --workdir $WORK --checkpoint-only > $W/ck.txt 2>&1 || { tail $W/ck.txt; exit 1; }
for pl in none 0-17:gpu0,18-34:gpu1 0-29:gpu0,30-34:gpu1; do
  args=""; [ $pl != none ] && args="--place layers=$pl"
  $G4 compile --model $WORK/e2b --device cuda --weights nf4 --chunk 1024 --max-context 8192 --no-fidelity $args -o $W/e2b-$pl.g4plan 2> $W/c.log || { tail $W/c.log; exit 1; }
  echo "## plan $pl" >> $R; grep -E "cuda:[0-9] |host |cross-device" $W/c.log >> $R
  # Peak per GPU while a 512-token prompt is prefilled and 64 tokens decoded (nvidia-smi every 20 ms).
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 20 > $W/smi.csv &
  SMI=$!; sleep 0.5
  $G4 run $W/e2b-$pl.g4plan --tokens 2,$(python3 -c "print(','.join(str(3 + (i * 7919) % 9000) for i in range(511)))") -n 64 --temp 0 --ignore-eos > /dev/null 2> $W/run.err
  sleep 0.3; kill $SMI; grep "note:" $W/run.err >> $R
  python3 -c "
import collections; m = collections.defaultdict(int); base = {}
for l in open('$W/smi.csv'):
    i, u = (int(x) for x in l.split(','))
    base.setdefault(i, u); m[i] = max(m[i], u)
print('measured peak (MiB, idle baseline subtracted):', ', '.join(f'cuda:{i} {m[i] - base[i]}' for i in sorted(m)))" >> $R
done
for r in 1 2; do
  for pl in none 0-17:gpu0,18-34:gpu1 0-29:gpu0,30-34:gpu1; do
    echo "## round $r $pl" >> $R
    $G4 bench $W/e2b-$pl.g4plan -p 512,4096 -n 64 -d 16 -r 3 --json >> $R 2>&1
  done
done
grep -A3 "## round" $R | grep -oE '"test":"[^"]*","tok_s":[0-9.]+|## round.*' | tail -24
