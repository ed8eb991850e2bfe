#!/usr/bin/env python3
"""tower_memory.py - the towers' placement on a GPU: planned against measured GPU memory, and what each choice
costs (NVIDIA GPUs only).

For each placement of the vision and audio towers (both on the GPU, vision only, both on the CPU), compiles the
tower_checkpoint.py checkpoint (real tower shapes, a 2-layer E2B-width text decoder) for the GPU and runs one
prompt with a 1024x768 image and a 30 s clip, then decodes 64 tokens (`g4 run --stats`), while nvidia-smi is
sampled every 20 ms. Reports the compiler's cuda:0 figure, the measured peak and their difference (the CUDA
context, which the plan does not count: it should not depend on the placement), the host's peak RSS (VmHWM,
sampled every 20 ms; the plan file is mapped, so it counts the weight pages read), each tower's time, the
prefill of the prompt's soft tokens and the decode speed (medians of REPS runs).

Usage: python3 bench/e2e/tower_memory.py G4_BINARY [--reps 3] [--threads N] [--dir WORKDIR] [--out FILE.json]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
sys.path.insert(0, os.path.dirname(__file__))
from g4_measure import GpuPeak, gib, planned_gpu_mib  # noqa: E402
from tower_checkpoint import make_checkpoint, make_inputs  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("g4")
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--threads", type=int, default=os.cpu_count())
ap.add_argument("--out", default="")
ap.add_argument("--dir", default="/tmp/g4bench/towers")
args = ap.parse_args()
make_checkpoint(args.dir)

tmp = tempfile.mkdtemp()
_, image, _, wav, _ = make_inputs(tmp)


def hwm_mib(pid):
    """The process's peak resident set so far (VmHWM), in MiB; 0 once it has gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(l.split()[1]) / 1024 for l in f if l.startswith("VmHWM:")), 0.0)
    except OSError:
        return 0.0


def run_once(plan):
    """One g4 run: (stderr, peak GPU MiB, peak RSS MiB from VmHWM, sampled every 20 ms)."""
    err = os.path.join(tmp, "stderr.txt")
    cmd = [args.g4, "run", plan, "--tokens", "2", "--image", image, "--audio", wav, "-n", "64",   # the checkpoint has no tokenizer
           "--ignore-eos", "--stats", "--threads", str(args.threads)]
    rss = 0.0
    with GpuPeak() as pk, open(err, "w") as ef:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=ef)
        while p.poll() is None:
            rss = max(rss, hwm_mib(p.pid))
            time.sleep(0.02)
    text = open(err).read()
    if p.returncode:
        sys.exit("g4 run failed:\n" + text)
    return text, pk.peak, rss


rows = []
for label, place in (("both towers on the GPU", "vision=gpu,audio=gpu"), ("vision on the GPU, audio on the CPU", "vision=gpu,audio=cpu"),
                     ("both towers on the CPU", "vision=cpu,audio=cpu")):
    plan = os.path.join(tmp, "towers.g4plan")
    r = subprocess.run([args.g4, "compile", "--model", args.dir, "--no-fidelity", "--device", "cuda", "--place", place, "-o", plan],
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit("g4 compile failed:\n" + r.stderr)
    host = re.search(r"^\s+host\s+([\d.]+ \w+)", r.stderr, re.M)
    runs = [run_once(plan) for _ in range(args.reps + 1)][1:]   # the first run warms the page cache

    def med(pattern, group=1):
        vals = [float(m.group(group)) for m in (re.search(pattern, t) for t, _, _ in runs) if m]
        return round(statistics.median(vals), 2) if vals else None

    row = {"placement": label, "place": place, "planned_cuda0_mib": planned_gpu_mib(r.stderr),
           "planned_host_mib": round(gib(host.group(1)) * 1024, 1) if host else None,
           "measured_peak_cuda0_mib": max(pk for _, pk, _ in runs), "peak_rss_mib": round(max(rss for _, _, rss in runs), 1),
           "image_ms": med(r"images \d+ soft tokens in ([\d.]+) ms"), "audio_ms": med(r"audio \d+ soft tokens in ([\d.]+) ms"),
           "prefill_tokens": med(r"prefill (\d+) tokens"), "prefill_ms": med(r"prefill \d+ tokens in ([\d.]+) ms"),
           "decode_tok_s": med(r"decode \d+ tokens in [\d.]+ ms \(([\d.]+) tok/s\)"),
           "placement_line": next((l.strip() for l in r.stderr.splitlines() if "placement:" in l), "")}
    row["peak_minus_plan_mib"] = row["measured_peak_cuda0_mib"] - row["planned_cuda0_mib"] if row["planned_cuda0_mib"] else None
    rows.append(row)
    print(json.dumps(row), flush=True)

gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
res = {"gpu": gpu, "threads": args.threads, "reps": args.reps, "rows": rows}
print("\n| placement | cuda:0 plan | measured peak | peak - plan | host plan | peak RSS | image | 30 s clip | prefill | decode |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['placement']} | {r['planned_cuda0_mib']} MiB | {r['measured_peak_cuda0_mib']} MiB | {r['peak_minus_plan_mib']} MiB | "
          f"{r['planned_host_mib']} MiB | {r['peak_rss_mib']} MiB | {r['image_ms']} ms | {r['audio_ms']} ms | "
          f"{r['prefill_tokens']:.0f} tokens in {r['prefill_ms']} ms | {r['decode_tok_s']} tok/s |")
if args.out:
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
