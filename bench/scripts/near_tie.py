#!/usr/bin/env python3
"""near_tie.py - where two CUDA plans' greedy decodes part, and how close the top two logits were there.

  python3 bench/scripts/near_tie.py G4 PLAN_A PLAN_B FIXTURE [-n 200] [--runs 3]
Decodes the fixture's last reference prompt greedily with PLAN_A (--runs times) and PLAN_B (NT_DUMP=1: both
also dumping the prompt's logits, as tests/gpu/cuda_parity.py does), prints the first
token where each A run parts from B, and at that step the gap between B's two largest logits (from B's
prefill of the prompt and its tokens so far: the same weights and cache dtype, prefill arithmetic).
"""
import json, os, subprocess, sys, tempfile

import numpy as np

g4, pa, pb, fixture = sys.argv[1:5]
n = int(sys.argv[sys.argv.index("-n") + 1]) if "-n" in sys.argv else 200
runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 3
ref = json.load(open(os.path.join(fixture, "reference", "reference.json")))
ids = ref["prompts"][-1]["ids"]


def gen(plan, toks, k, dump=None):
    a = [g4, "run", plan, "--tokens", ",".join(map(str, toks)), "-n", str(k), "--temp", "0", "--ignore-eos", "--print-ids"]
    if dump:
        a += ["--dump-logits", dump]
    r = subprocess.run(a, capture_output=True, text=True, check=True)
    return [int(x) for x in r.stdout.strip().split(",") if x]


# NT_DUMP=1: both plans also dump the prompt's logits, as tests/gpu/cuda_parity.py runs them (the prompt then
# goes in chunks of at most logits_rows rows: other kernels than one long chunk).
dump = os.path.join(tempfile.mkdtemp(), "p.f32") if os.environ.get("NT_DUMP") else None
b = gen(pb, ids, n, dump)
for i in range(runs):
    a = gen(pa, ids, n, dump)
    part = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), len(b))
    line = f"run {i}: parts from B at token {part} of {len(b)}"
    if part < len(b):
        d = os.path.join(tempfile.mkdtemp(), "l.f32")
        gen(pb, ids + b[:part], 1, d)   # the gap from B's prefill of the same rows (its chunking may differ)
        lg = np.fromfile(d, dtype="<f4").reshape(-1, int(os.path.getsize(d) / 4 / (len(ids) + part)))[-1]
        top = np.sort(lg)[-2:]
        line += f" (A {a[part]}, B {b[part]}; B's top-2 logit gap there {top[1] - top[0]:.2e}, logits {lg[a[part]]:.4f} / {lg[b[part]]:.4f})"
    print(line)
b2 = gen(pb, ids, n, dump)
print("B twice the same:", b2 == b)
