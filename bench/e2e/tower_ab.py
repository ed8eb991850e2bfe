#!/usr/bin/env python3
"""tower_ab.py - the vision and audio towers of two g4 builds side by side: the same random-weight real-shape
checkpoint (tower_checkpoint.py: the E2B = E4B towers, 1024x768 image, 30 s clip), each build compiling its own
plans (CPU fp32 and, with a GPU, CUDA), `g4 run --image/--audio --stats` alternated between the builds REPS
times after a warm-up. Prints the median encode times per build and their ratio, and the relative L2 between
the two builds' soft tokens (G4_DUMP_MEDIA).

Needs torch and transformers (to make the checkpoint once).
Usage: python3 bench/e2e/tower_ab.py G4_A G4_B [--threads N] [--reps 5] [--dir WORKDIR] [--out FILE.json]
       [--devices cpu,cuda] [--kinds image,audio]   (default: both kinds, the CPU and, with a GPU, CUDA)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
sys.path.insert(0, os.path.dirname(__file__))
from tower_checkpoint import make_checkpoint, make_inputs  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("a")
ap.add_argument("b")
ap.add_argument("--threads", type=int, default=os.cpu_count())
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--dir", default="/tmp/g4bench/towers")
ap.add_argument("--out", default="")
ap.add_argument("--devices", default="", help="comma-separated subset of cpu,cuda (default: every one present)")
ap.add_argument("--kinds", default="image,audio", help="comma-separated subset of image,audio")
args = ap.parse_args()

tc = make_checkpoint(args.dir)
tmp = tempfile.mkdtemp()
_, png, _, wav, _ = make_inputs(tmp)
devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
if args.devices:
    devices = [d for d in args.devices.split(",") if d in devices]
kinds = [k for k in args.kinds.split(",") if k in ("image", "audio")]
builds = {"A": args.a, "B": args.b}
plans = {}
for side, g4 in builds.items():
    for dev in devices:
        plan = os.path.join(tmp, f"{side}_{dev}.g4plan")
        r = subprocess.run([g4, "compile", "--model", args.dir, "--no-fidelity", "--device", dev, "-o", plan],
                           capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"{side}: g4 compile --device {dev} failed:\n" + r.stderr[-2000:])
        plans[side, dev] = plan

STATS = re.compile(r"images (\d+) soft tokens in ([\d.]+) ms .*; audio (\d+) soft tokens in ([\d.]+) ms")


def once(side, dev, kind):
    out = os.path.join(tmp, f"soft_{side}_{dev}_{kind}")
    env = dict(os.environ, G4_DUMP_MEDIA=out)
    flag = ["--image", png] if kind == "image" else ["--audio", wav]
    r = subprocess.run([builds[side], "run", plans[side, dev], *flag, "--tokens", "2", "-n", "0", "--stats",
                        "--threads", str(args.threads)], capture_output=True, text=True, env=env)
    if r.returncode:
        sys.exit(f"{side}: g4 run failed:\n" + r.stderr[-2000:])
    m = STATS.search(r.stderr)
    if not m:
        sys.exit(f"{side}: no tower timing in the --stats output:\n" + r.stderr[-2000:])
    return float(m.group(2)) if kind == "image" else float(m.group(4))


res = {"threads": args.threads, "cpu": os.popen("lscpu | grep 'Model name'").read().strip(), "rows": {}}
if torch.cuda.is_available():
    res["gpu"] = torch.cuda.get_device_name(0)
for dev in devices:
    for kind in kinds:
        t = {"A": [], "B": []}
        for side in "AB":
            once(side, dev, kind)  # warm-up
        for _ in range(args.reps):
            for side in "AB":
                t[side].append(once(side, dev, kind))
        a = np.fromfile(os.path.join(tmp, f"soft_A_{dev}_{kind}"), dtype=np.float32)
        b = np.fromfile(os.path.join(tmp, f"soft_B_{dev}_{kind}"), dtype=np.float32)
        rel = float(np.linalg.norm(a - b) / np.linalg.norm(a)) if a.shape == b.shape else f"sizes {a.size} vs {b.size}"
        ma, mb = statistics.median(t["A"]), statistics.median(t["B"])
        res["rows"][f"{kind} {dev}"] = {"A_ms": ma, "B_ms": mb, "B_over_A": mb / ma, "A_runs": t["A"], "B_runs": t["B"],
                                        "soft_tokens_rel_l2_B_vs_A": rel}
        print(f"{kind:5s} {dev:4s}: A {ma:8.1f} ms  B {mb:8.1f} ms  B/A {mb / ma:5.2f}  rel L2 {rel}", flush=True)
print(json.dumps(res, indent=1))
if args.out:
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
