#!/usr/bin/env python3
"""Medians per test and side of an A/B run log (bench/scripts/ab_env.sh, ab_plans.sh print it at the end):
blocks of
'## round N S [label]' (the label optional) followed by one `g4 bench --json` array (lines between
them, such as a switch's note on stderr, are skipped).

Usage: python3 bench/scripts/ab_summary.py LOG
"""
import json
import re
import statistics as st
import sys

txt = open(sys.argv[1]).read()
rows, names = {}, {}
for m in re.finditer(r"## round (\d+) (\w)(?: \[([^\n]*)\])?\n(?:(?!\[|## )[^\n]*\n)*(\[[^\n]*\])\n", txt):
    if m.group(3) is not None:
        names[m.group(2)] = m.group(3) or "(defaults)"
    for d in json.loads(m.group(4)):
        rows.setdefault((d["test"], m.group(2)), []).append(round(d["tok_s"], 1))
for (test, s), v in sorted(rows.items()):
    label = f" {names[s]:>20}" if s in names else ""
    print(f"{test:>12} {s}{label}: median {st.median(v):8.1f} tok/s over rounds {v}")
