#!/usr/bin/env python3
"""plan_memory_bench.py - a CUDA plan's GPU memory: the compiler's cuda:0 figure against the process's peak.

Compiles CHECKPOINT with the given compile flags, then runs `g4 bench` on the plan while nvidia-smi is sampled
every 20 ms, once as is and once with G4_LM_SCREEN=0 (the LM head's screening copy left out at run time).
The peak includes the CUDA context, which the plan does not count.
Usage: python3 bench/e2e/plan_memory_bench.py BUILD/tools/g4 CHECKPOINT [--adapter DIR]
           [--compile "--gpu-mem 8GiB --max-context 131072"] [--bench "-p 512 -n 64 -d 0,120000"] [--out DIR]
Writes DIR/plan_memory.json (and keeps the compile report in DIR/compile.log).
"""
import argparse, json, os, shlex, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from g4_measure import GpuPeak, planned_gpu_mib  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("g4")
ap.add_argument("checkpoint")
ap.add_argument("--adapter", default="")
ap.add_argument("--compile", default="--gpu-mem 8GiB --max-context 131072")
ap.add_argument("--bench", default="-p 512 -n 64 -d 0,120000")
ap.add_argument("--out", default="/tmp")
args = ap.parse_args()
plan = os.path.join(args.out, "plan_memory.g4plan")
cmd = [args.g4, "compile", "--model", args.checkpoint, "--device", "cuda", "--no-fidelity", "-o", plan]
cmd += (["--adapter", args.adapter] if args.adapter else []) + shlex.split(args.compile)
r = subprocess.run(cmd, capture_output=True, text=True)
open(os.path.join(args.out, "compile.log"), "w").write(r.stderr)
if r.returncode != 0:
    raise SystemExit(r.stderr[-2000:])
planned = planned_gpu_mib(r.stderr)
rows = []
for env in ({}, {"G4_LM_SCREEN": "0"}):
    with GpuPeak() as pk:
        b = subprocess.run([args.g4, "bench", plan, "-r", "1", "--json"] + shlex.split(args.bench), capture_output=True,
                           text=True, env={**os.environ, **env})
    if b.returncode != 0:
        raise SystemExit(b.stderr[-2000:])
    row = {"env": env, "planned_cuda0_mib": planned, "measured_peak_mib": pk.peak,
           "peak_minus_plan_mib": pk.peak - planned if planned else None,
           "tok_s": {t["test"]: round(t["tok_s"], 1) for t in json.loads(b.stdout)}}
    print(json.dumps(row), flush=True)
    rows.append(row)
os.remove(plan)
json.dump({"compile": cmd[1:], "bench": args.bench, "rows": rows}, open(os.path.join(args.out, "plan_memory.json"), "w"),
          indent=1)
