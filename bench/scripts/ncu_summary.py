#!/usr/bin/env python3
"""ncu_summary.py - per-kernel table of one decode step from an Nsight Compute CSV (bench/e2e/e2e_bench.py --profile).

Usage: python3 bench/scripts/ncu_summary.py ncu_e2b.csv
Groups the launches between the last two g4_argmax kernels (one decode step) by kernel name and grid,
with isolated GPU time, DRAM bytes read and the achieved read bandwidth.
"""
import collections, csv, signal, sys

signal.signal(signal.SIGPIPE, signal.SIG_DFL)

text = open(sys.argv[1]).read()
lines = [l for l in text.splitlines() if l.startswith('"')]
rows = list(csv.reader(lines))
h = rows[0]
ki, ti, di, gi = h.index("Kernel Name"), h.index("gpu__time_duration.sum"), h.index("dram__bytes_read.sum"), h.index("Grid Size")
num = lambda s: float(s.replace(",", "")) if s.replace(",", "").replace(".", "").isdigit() else 0.0
data = [r for r in rows[1:] if len(r) == len(h) and num(r[ti]) > 0]
idx = [i for i, r in enumerate(data) if r[ki] == "g4_argmax"]
step = data[idx[-2] + 1:idx[-1] + 1]
agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
for r in step:
    a = agg[r[ki] + " " + r[gi]]
    a[0] += 1
    a[1] += num(r[ti])
    a[2] += num(r[di])
total = sum(v[1] for v in agg.values())
print(f"one decode step: {len(step)} launches, {total / 1000:.1f} us of kernel time (isolated)")
for k, (n, t, b) in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f"  {k:42s} n={n:3d} {t / 1000:8.1f} us {t / n / 1000:7.2f} us/launch {b / n / 1e6:8.2f} MB {b / t:6.0f} GB/s")
