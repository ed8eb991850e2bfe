#!/usr/bin/env bash
# Cross-device plans on real GPUs: a plan split by --place layers=... against the same fixture's plan
# without --place, both compiled with the same flags, 48 greedy tokens after a 41-token prompt. Prints per
# FIXTURE:LAYERS the prefill logits' relative L2 and how many greedy tokens agree, the compiler's
# cross-device line and any note the runtime printed. Two-GPU splits must give relative L2 0 and 48/48
# tokens; splits with CPU layers are within bf16's error (the CPU layers compute in fp32).
# Not part of ctest (CI checks the same plans on emulated devices, ctest -R CrossDevice): it needs one or
# two CUDA GPUs, a g4 build, python3 and numpy. bench/e2e/cross_device_bench.sh and multi_gpu_bench.sh run it.
# Usage (repo root): bash tests/gpu/split_compare.sh G4 WORKDIR FIXTURE:LAYERS...
#   e.g. bash tests/gpu/split_compare.sh build/tools/g4 /tmp/split e2b_tiny_text:"0-4:gpu0,5-9:gpu1"
# Exits 1 on a failed compile or run.
set -u
G4=$1 W=$2
shift 2
ids=2,$(python3 -c "print(','.join(str(3 + (i * 7919 + 13) % 500) for i in range(40)))")
for fx in "$@"; do
  m=${fx%%:*}; pl=${fx#*:}
  $G4 compile --model tests/fixtures/$m --device cuda --chunk 16 --no-fidelity -o $W/a.g4plan 2>> $W/log || { tail $W/log >&2; exit 1; }
  $G4 compile --model tests/fixtures/$m --device cuda --chunk 16 --no-fidelity --place layers=$pl -o $W/b.g4plan 2> $W/b.log || { tail $W/b.log >&2; exit 1; }
  for s in a b; do
    $G4 run $W/$s.g4plan --tokens $ids -n 48 --temp 0 --ignore-eos --print-ids --dump-logits $W/$s.f32 > $W/$s.ids 2> $W/$s.err || { cat $W/$s.err >&2; exit 1; }
  done
  grep "note:" $W/b.err
  python3 - "$m" "$pl" $W <<'PY'
import sys, numpy as np
m, pl, w = sys.argv[1:]
a, b = (np.fromfile(f"{w}/{s}.f32", dtype="<f4").astype(np.float64) for s in "ab")
ta, tb = (open(f"{w}/{s}.ids").read().strip().split(",") for s in "ab")
agree = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), len(ta))
print(f"{m} layers={pl}: prefill logits rel L2 vs the plan without --place {np.linalg.norm(a - b) / np.linalg.norm(a):.3e}; greedy tokens agree {agree}/{len(ta)}")
PY
  grep "cross-device" $W/b.log
done
exit 0
