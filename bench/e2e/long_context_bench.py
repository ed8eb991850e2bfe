#!/usr/bin/env python3
"""long_context_bench.py - plans for long contexts on a GPU, planned vs measured GPU memory.

For each context N: compiles the checkpoint made by `e2e_bench.py --checkpoint-only` (NF4, LoRA merged,
PLE table in pinned host memory, --max-context N) and reads the plan's cuda:0 total from the compiler's
memory table; then `g4 bench` prefills N - 256 tokens and decodes 32, while nvidia-smi is sampled every
20 ms for the process's peak. The measured peak includes the CUDA context (not in the plan).
Usage: python3 bench/e2e/long_context_bench.py BUILD/tools/g4 --model e2b [--contexts 32768,131072] [--chunk 1024] [--out DIR]
Writes DIR/long_context_<model>_chunk<C>.json.
"""
import argparse, json, os, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from g4_measure import GpuPeak, planned_gpu_mib  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("g4")
ap.add_argument("--model", default="e2b", choices=["e2b", "e4b"])
ap.add_argument("--contexts", default="32768,131072")
ap.add_argument("--chunk", type=int, default=1024, help="prefill chunk (g4's default for CUDA plans: 1024)")
ap.add_argument("--workdir", default="/tmp/g4bench")
ap.add_argument("--out", default="/tmp")
args = ap.parse_args()
ckpt, adapter = os.path.join(args.workdir, args.model), os.path.join(args.workdir, args.model + "-lora")
if not os.path.exists(os.path.join(ckpt, "config.json")):
    raise SystemExit(f"no checkpoint in {ckpt}: run bench/e2e/e2e_bench.py G4 --model {args.model} --checkpoint-only first")


rows = []
for n in [int(x) for x in args.contexts.split(",")]:
    plan = os.path.join(args.workdir, f"{args.model}_{n}.g4plan")
    t0 = time.time()
    r = subprocess.run([args.g4, "compile", "--model", ckpt, "--adapter", adapter, "--device", "cuda", "--no-fidelity", "--max-context",
                        str(n), "--chunk", str(args.chunk), "--place", "ple=host", "-o", plan], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(r.stderr[-2000:])
    row = {"context": n, "chunk": args.chunk, "compile_s": round(time.time() - t0, 1), "planned_cuda0_mib": planned_gpu_mib(r.stderr)}
    depth = n - 256
    with GpuPeak() as pk:
        b = subprocess.run([args.g4, "bench", plan, "-p", "512", "-n", "32", "-d", str(depth), "-r", "1", "--json"], capture_output=True,
                           text=True)
    if b.returncode != 0:
        raise SystemExit(b.stderr[-2000:])
    for t in json.loads(b.stdout):
        if t["test"].startswith("tg"):
            row[f"decode_tok_s_depth_{t['depth']}"] = round(t["tok_s"], 1)
        else:
            row[f"ttft_{t['tokens']}_ms"] = round(t["median_ms"], 2)
    row["measured_peak_mib"] = pk.peak
    row["overhead_mib"] = pk.peak - row["planned_cuda0_mib"] if row["planned_cuda0_mib"] else None
    print(json.dumps(row), flush=True)
    rows.append(row)
    os.remove(plan)   # real-shape plans are several GB
json.dump({"model": args.model, "rows": rows}, open(os.path.join(args.out, f"long_context_{args.model}_chunk{args.chunk}.json"), "w"), indent=1)
