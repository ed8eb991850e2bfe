#!/usr/bin/env python3
"""Every block of every decode launch, from a kernel trace made with `g4 compile --kernel-trace blocks` (kernels.cu
G4_TRACE_ALL; bench/scripts/trace_ab.sh): when each launch's blocks became resident, were released and
exited, so that a launch's share of the critical path splits into

  run    its release (the earliest block past its wait) to its last block's exit,
  gap    that exit to the next launch's release (the grid's completion reaching the next kernel),
  tail   its last block's exit after the second-to-last one's (a block that works alone at the end),
  late   blocks that became resident only after the release (their pre-wait work on the critical path).

Usage: python3 bench/scripts/trace_blocks.py TRACE [--skip N] [--csv FILE]
"""
import bisect
import collections
import statistics

from trace_summary import decode_steps, name_of, read_trace


def launches_of(recs):
    """Groups the records into launches: block 0 of each names one; every other block joins the launch of
    its (tag, key) whose block 0 was released nearest to it."""
    heads = collections.defaultdict(list)
    for x in recs:
        if x["lin"] == 0:
            heads[(x["tag"], x["key"])].append(x)
    for k in heads:
        heads[k].sort(key=lambda x: x["t1"])
    t1s = {k: [h["t1"] for h in hs] for k, hs in heads.items()}
    blocks = {id(h): [h] for hs in heads.values() for h in hs}
    lost = collections.Counter()
    for x in recs:
        if x["lin"] == 0:
            continue
        hs = heads.get((x["tag"], x["key"]))
        if not hs:
            lost[name_of(x["tag"])] += 1
            continue
        j = bisect.bisect_left(t1s[(x["tag"], x["key"])], x["t1"])
        best = min((h for h in hs[max(0, j - 1):j + 1]), key=lambda h: abs(h["t1"] - x["t1"]))
        if abs(best["t1"] - x["t1"]) > 100000:
            lost[name_of(x["tag"])] += 1
            continue
        blocks[id(best)].append(x)
    out = []
    for hs in heads.values():
        for h in hs:
            bl = blocks[id(h)]
            t2s = sorted(b["t2"] for b in bl)
            R = min(b["t1"] for b in bl)
            lastb = max(bl, key=lambda b: b["t2"])
            out.append({
                "tag": h["tag"], "grid": h["blocks"], "seen": len(bl), "R": R, "E0": min(b["t0"] for b in bl),
                "Emax": max(b["t0"] for b in bl), "X": t2s[-1], "X2": t2s[-2] if len(t2s) > 1 else t2s[-1],
                "late": sum(1 for b in bl if b["t0"] > R), "maxrun": max(b["t2"] - b["t1"] for b in bl),
                "lastrun": lastb["t2"] - lastb["t1"], "lastrel": lastb["t1"] - R, "bl": bl,
            })
    out.sort(key=lambda l: l["R"])
    return out, lost


def sm_loads(L, steps, want):
    """The fused MLP's blocks by SM: how many SMs a launch used and the most blocks one held, and each block's
    wait-to-exit time (its gate/up to mark 0, then the down projection) by how many of the launch's blocks
    its SM held, means over steps per launch position."""
    pos = [i for i, t in enumerate(want) if t & 15 == 15]
    if not pos:
        return
    print("\nfused MLP blocks by SM load, means over steps (us; k = the launch's blocks on the block's SM):")
    print(f"{'i':>4} {'launch':<12} {'step':>6} {'SMs':>5} {'max k':>5} {'SMs@max':>7}   " +
          "  ".join(f"k={k}: n  run  g/u  down" for k in (1, 2, 3)))
    for i in pos:
        acc = collections.defaultdict(list)
        for (b, e) in steps:
            l = L[b + i]
            per = collections.Counter(x["smid"] & 0xFF for x in l["bl"])
            kmax = max(per.values())
            acc["sms"].append(len(per))
            acc["kmax"].append(kmax)
            acc["atmax"].append(sum(1 for v in per.values() if v == kmax))
            if b + i + 1 < len(L):
                acc["step"].append(L[b + i + 1]["R"] - l["R"])
            for x in l["bl"]:
                k = per[x["smid"] & 0xFF]
                acc[f"n{k}"].append(1)
                acc[f"run{k}"].append(x["t2"] - x["t1"])
                if x["m0"]:
                    acc[f"gu{k}"].append(x["m0"])
                    acc[f"dn{k}"].append(x["t2"] - x["t1"] - x["m0"])
        m = lambda v: statistics.fmean(v) if v else float("nan")
        cols = []
        for k in (1, 2, 3):
            n = len(acc[f"n{k}"]) / max(1, len(steps))
            cols.append(f"{n:5.0f} {m(acc[f'run{k}']) / 1e3:5.2f} {m(acc[f'gu{k}']) / 1e3:4.2f} {m(acc[f'dn{k}']) / 1e3:5.2f}")
        print(f"{i:>4} {name_of(want[i]):<12} {m(acc['step']) / 1e3:6.2f} {m(acc['sms']):5.1f} {m(acc['kmax']):5.1f} "
              f"{m(acc['atmax']):7.1f}   " + "  ".join(cols))


def main():
    a, n, recs = read_trace()
    for x in recs:
        x["lin"] = (x["smid"] & 0x7FFFFFFF) >> 8
    L, lost = launches_of(recs)
    print(f"{n} records, {len(L)} launches, {sum(lost.values())} records matched to no launch "
          f"({', '.join(f'{k} {c}' for k, c in lost.most_common(6))})")
    kinds = collections.Counter(name_of(l["tag"]) for l in L)
    print("launches by kind: " + ", ".join(f"{k} {c}" for k, c in kinds.most_common()))
    if L:
        print(f"span {(L[-1]['R'] - L[0]['R']) / 1e6:.2f} ms")
    steps, want = decode_steps(L, a.skip)
    P = len(want)
    cols = collections.defaultdict(lambda: collections.defaultdict(list))
    tok = []
    for (b, e) in steps:
        if e < len(L):
            tok.append(L[e]["R"] - L[b]["R"])
        for i in range(P):
            l = L[b + i]
            c = cols[i]
            if b + i + 1 < len(L):
                nx = L[b + i + 1]
                c["step"].append(nx["R"] - l["R"])
                c["gap"].append(nx["R"] - l["X"])
            c["run"].append(l["X"] - l["R"])
            c["tail"].append(l["X"] - l["X2"])
            c["late"].append(l["late"])
            c["pre"].append(l["R"] - l["E0"])
            c["emax"].append(l["Emax"] - l["R"])
            c["maxrun"].append(l["maxrun"])
            c["lastrun"].append(l["lastrun"])
            c["lastrel"].append(l["lastrel"])
            c["seen"].append(l["seen"])
    us = lambda v: statistics.fmean(v) / 1000 if v else float("nan")
    cnt = lambda v: statistics.fmean(v) if v else float("nan")
    print(f"token (release to release): median {statistics.median(tok) / 1000:.1f} us" if tok else "")
    print("per launch, means over steps, us: step = release to the next release; run = release to the last exit;\n"
          "gap = last exit to the next release; tail = last exit after the second-to-last; pre = first entry to the release;\n"
          "emax = last block's entry after the release; late = blocks entering after the release; maxrun = the longest\n"
          "block, release-to-exit; lastrun / lastrel = the last-exiting block's own wait-to-exit and its release after R")
    hdr = ("i", "launch", "grid", "seen", "step", "run", "gap", "tail", "pre", "emax", "late", "maxrun", "lastrun", "lastrel")
    print(f"{hdr[0]:>4} {hdr[1]:<28} " + " ".join(f"{h:>7}" for h in hdr[2:]))
    rows = []
    for i in range(P):
        c = cols[i]
        row = (i, name_of(want[i]), L[steps[0][0] + i]["grid"], cnt(c["seen"]), us(c["step"]), us(c["run"]), us(c["gap"]),
               us(c["tail"]), us(c["pre"]), us(c["emax"]), cnt(c["late"]), us(c["maxrun"]), us(c["lastrun"]), us(c["lastrel"]))
        rows.append(row)
        print(f"{row[0]:>4} {row[1]:<28} " + " ".join(f"{x:7.2f}" if isinstance(x, float) else f"{x:>7}" for x in row[2:]))
    agg = collections.OrderedDict()
    for row in rows:
        s = agg.setdefault(row[1], [0] + [0.0] * 10)
        s[0] += 1
        for j, x in enumerate(row[4:14]):
            s[1 + j] += 0.0 if x != x else x
    tot = sum(s[1] for s in agg.values())
    print(f"\nby launch kind (sum of steps {tot:.1f} us), means a launch:")
    print(f"{'launch':<28} {'n':>4} {'us/token':>9} {'share':>6} " + " ".join(f"{h:>7}" for h in hdr[4:]))
    for k, s in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"{k:<28} {s[0]:>4} {s[1]:9.1f} {100 * s[1] / tot:5.1f}% " + " ".join(f"{x / s[0]:7.2f}" for x in s[1:]))
    sm_loads(L, steps, want)
    if a.csv:
        with open(a.csv, "w") as f:
            f.write(",".join(hdr) + "\n")
            for row in rows:
                f.write(",".join(str(x) for x in row) + "\n")


if __name__ == "__main__":
    main()
