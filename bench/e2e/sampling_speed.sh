#!/usr/bin/env bash
# Sampling on the GPU against the CPU sampler at E2B shapes (random weights) on a CUDA GPU: time inside
# g4_session_sample a token (g4 run --stats) for greedy, top-k, and top-p / min-p without top-k,
# G4_GPU_SAMPLING=1|0 interleaved, REPS repetitions (default 2). Random weights give flatter rows than a
# trained model; lower temperatures stand in for peaked ones.
# Usage (repo root): [G4=build/tools/g4] [WORK=/tmp/g4bench] [OUT=bench-out] [REPS='1 2'] bash bench/e2e/sampling_speed.sh
# Makes the E2B checkpoint with bench/e2e/e2e_bench.py if $WORK has none. Writes $OUT/sampling_speed.txt.
set -u
G4=${G4:-build/tools/g4}
WORK=${WORK:-/tmp/g4bench}
OUT=${OUT:-bench-out}
mkdir -p $OUT $WORK
R=$OUT/sampling_speed.txt
W=$WORK/sampling && mkdir -p $W
[ -d $WORK/e2b ] || python3 bench/e2e/e2e_bench.py $G4 --model e2b --workdir $WORK --checkpoint-only > $W/ck.txt 2>&1 || { tail $W/ck.txt; exit 1; }
[ -f $W/e2b.g4plan ] || $G4 compile --model $WORK/e2b --device cuda --weights nf4 --chunk 1024 --no-fidelity -o $W/e2b.g4plan 2> $W/c.log || { tail $W/c.log; exit 1; }
python3 -c "print(','.join(['2'] + [str(3 + (i * 7919) % 9000) for i in range(511)]))" > $W/prompt.txt
for rep in ${REPS:-1 2}; do
  for args in "--temp 0" "--temp 1 --top-k 64 --top-p 0.95" "--temp 1 --top-p 0.95" "--temp 0.3 --top-p 0.9" "--temp 0.5 --min-p 0.1" "--temp 0.2 --top-p 0.95 --repeat-penalty 1.1"; do
    for g in 1 0; do
      line=$(G4_GPU_SAMPLING=$g $G4 run $W/e2b.g4plan --tokens @$W/prompt.txt -n 128 $args --ignore-eos --stats 2>&1 >/dev/null | grep -oE "decode .*")
      echo "gpu_sampling=$g $args: $line" >> $R
    done
  done
done
cat $R
