#!/usr/bin/env python3
"""The decode step's timeline from a kernel trace (bench/scripts/trace_lab.sh; kernels.cu G4_TRACE).

Each traced launch left two records, from its first and its last block (thread 0): the global timer at
entry (t0), after the programmatic wait (t1) and at exit (t2). The first block is dispatched first, so
its t1 is when the launch's wait released: the previous launches had finished. The difference between
consecutive releases is what each launch adds to the step's critical path; they sum to the token time.

Usage: python3 bench/scripts/trace_summary.py TRACE [--skip N] [--csv FILE]
  --skip N  leave out the first N decode steps of the trace (warm-up)
"""
import argparse
import collections
import math
import statistics
import struct
import sys

REC = struct.Struct("<4Q8I")   # key, t0, t1, t2; tag, blocks, smid (bit 31: the last block), cycles; mark[4]
FIELDS = ("key", "t0", "t1", "t2", "tag", "blocks", "smid", "cycles", "m0", "m1", "m2", "m3")


def name_of(tag):
    kind = tag & 15
    if kind == 1:
        nf4, m, lanes, epi, nmat = (tag >> 4) & 1, (tag >> 5) & 7, (tag >> 8) & 255, (tag >> 16) & 15, (tag >> 20) & 15
        if epi == 3:
            return "lm_head"
        what = {0: f"x{nmat}", 1: "gate/up", 2: "gelu*aux"}.get(epi, f"epi{epi}")
        return f"gemv_{'nf4' if nf4 else 'bf16'} {what} L{lanes}"
    if kind == 3:
        post, bf16, sliding = (tag >> 4) & 1, (tag >> 5) & 1, (tag >> 6) & 1
        return f"attn_{'sliding' if sliding else 'full'}{'+post' if post else ''}"
    if kind == 15:   # the fused MLP; its mark 0: the gate/up done (the down projection follows)
        return f"mlp b{256 if (tag >> 4) & 1 else 128}"
    if kind == 9:
        return ["add", "gelu_mul", "scale", "softcap"][min((tag >> 8) & 255, 3)]
    return {2: "resnorm", 4: "merge", 5: "qkv_post", 6: "argmax", 7: "embed", 8: "rms_norm", 10: "matmul_bf16",
            11: "rope", 12: "kv_store", 13: "attn_o", 14: "ple"}.get(kind, f"tag{tag}")


def decode_steps(launches, skip):
    """Decode steps begin with the embeddings (the greedy step's LM-head screen and argmax are not traced):
    the (begin, end) index ranges of the steps whose launch sequence (tags) is the commonest one, less the
    first `skip`, and that sequence. Prefill chunks begin with an embedding too; their sequences differ."""
    emb  = lambda i: launches[i]["tag"] & 15 == 7
    cuts = [i for i in range(len(launches)) if emb(i) and (i == 0 or not emb(i - 1))]   # a step's first embedding
    segs = [(cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)]
    sig = lambda s: tuple(x["tag"] for x in launches[s[0]:s[1]])
    common = collections.Counter(sig(s) for s in segs).most_common(1)
    if not common:
        sys.exit("no decode steps found (fewer than two embedding launches)")
    want = common[0][0]
    steps = [s for s in segs if sig(s) == want][skip:]
    print(f"{len(segs)} steps, {len(steps)} used ({len(want)} traced launches a step)")
    return steps, want


def read_trace():
    """The command line (TRACE [--skip N] [--csv FILE]) and the trace's records, as dicts of FIELDS."""
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--csv")
    a = ap.parse_args()
    raw = open(a.trace, "rb").read()
    n = struct.unpack_from("<I", raw)[0]
    return a, n, [dict(zip(FIELDS, x)) for x in REC.iter_unpack(raw[4:4 + n * REC.size])]


def main():
    a, n, r = read_trace()
    for x in r:
        x["last"] = x["smid"] >> 31
    first = sorted((x for x in r if x["last"] == 0), key=lambda x: x["t1"])
    lastr = [x for x in r if x["last"] == 1]
    print(f"{n} records, {len(first)} launches")
    ts = sorted(x[k] for x in first for k in ("t0", "t1", "t2"))
    diffs = [b - a for a, b in zip(ts, ts[1:]) if b > a]
    res = math.gcd(*diffs[:20000]) if diffs else 0
    print(f"global timer: gcd of the nonzero differences {res} ns, smallest {min(diffs) if diffs else 0} ns")
    T1 = [x["t1"] for x in first]
    ghz = sorted(x["cycles"] / (x["t2"] - x["t1"]) for x in first if x["t2"] - x["t1"] > 2000)
    if ghz:
        q = lambda f: ghz[int(f * (len(ghz) - 1))]
        print(f"SM clock from release to exit (first blocks, > 2 us): median {q(0.5):.3f} GHz (10% {q(0.1):.3f}, 90% {q(0.9):.3f})")

    steps, want = decode_steps(first, a.skip)
    P = len(want)

    by_key = collections.defaultdict(list)
    for x in lastr:
        by_key[(x["tag"], x["key"])].append(x)
    for k in by_key:
        by_key[k].sort(key=lambda x: x["t0"])

    def last_of(f):
        lst = by_key.get((f["tag"], f["key"]), [])
        lo, hi = 0, len(lst)
        while lo < hi:
            mid = (lo + hi) // 2
            if lst[mid]["t0"] < f["t0"]: lo = mid + 1
            else: hi = mid
        # The nearest in time either way: the last block may enter before the first (then the next
        # record of the same tag and key is a later launch's, e.g. the next layer's PLE, 30-80 us on).
        near = [lst[j] for j in (lo - 1, lo) if 0 <= j < len(lst)]
        if not near:
            return None
        l = min(near, key=lambda x: abs(x["t0"] - f["t0"]))
        return l if abs(l["t0"] - f["t0"]) < 20000 else None

    cols = collections.defaultdict(lambda: collections.defaultdict(list))
    tok = []
    for (b, e) in steps:
        seg = first[b:e]
        if e < len(first):
            tok.append(T1[e] - T1[b])
        for i in range(P):
            f = seg[i]
            c = cols[i]
            if b + i + 1 < len(first): c["step"].append(T1[b + i + 1] - f["t1"])
            c["pre"].append(f["t1"] - f["t0"])
            c["post0"].append(f["t2"] - f["t1"])
            if i > 0: c["gap_prev_start"].append(f["t0"] - seg[i - 1]["t1"])
            l = last_of(f)
            if l is not None:
                c["last_start"].append(l["t0"] - f["t1"])
                c["last_end"].append(l["t2"] - f["t1"])
            c["blocks"].append(f["blocks"])
            for k in ("m0", "m1", "m2", "m3"):
                if f[k]: c[k].append(f[k])
    med = lambda v: statistics.median(v) / 1000 if v else float("nan")
    mean = lambda v: statistics.fmean(v) / 1000 if v else float("nan")
    print(f"token (release to release of the first launch): median {med(tok):.1f} us, mean {mean(tok):.1f} us")
    print("per launch, us (means over steps; step = this release to the next, the launch's share of the critical path;\n"
          "pre = first block entry to its release; post = first block release to exit; last = last block's start / end after the first's release;\n"
          "m0..m3: the first block's marks (kernels.cu G4_TRACE_MARK) after its release):")
    rows = []
    for i in range(P):
        c = cols[i]
        rows.append((i, name_of(want[i]), c["blocks"][0], mean(c["step"]), mean(c["pre"]), mean(c["post0"]),
                     mean(c["last_start"]), mean(c["last_end"]), mean(c["gap_prev_start"]), mean(c["m0"]), mean(c["m1"]),
                     mean(c["m2"]), mean(c["m3"])))
    print(f"{'i':>4} {'launch':<28} {'blocks':>6} {'step':>7} {'pre':>7} {'post':>7} {'lastS':>7} {'lastE':>7} {'start-prevrel':>13}"
          f" {'m0':>6} {'m1':>6} {'m2':>6} {'m3':>6}")
    for row in rows:
        print(f"{row[0]:>4} {row[1]:<28} {row[2]:>6} {row[3]:7.2f} {row[4]:7.2f} {row[5]:7.2f} {row[6]:7.2f} {row[7]:7.2f} {row[8]:13.2f}"
              + "".join(f" {x:6.2f}" for x in row[9:]))
    agg = collections.OrderedDict()
    for row in rows:
        k = row[1]
        s = agg.setdefault(k, [0, 0.0, 0.0, 0.0])
        s[0] += 1
        s[1] += 0 if math.isnan(row[3]) else row[3]
        s[2] += 0 if math.isnan(row[5]) else row[5]
        s[3] += 0 if math.isnan(row[7]) else row[7]
    tot = sum(s[1] for s in agg.values())
    print(f"\nby launch kind (sum of steps {tot:.1f} us):")
    print(f"{'launch':<28} {'n':>4} {'us/token':>9} {'share':>6} {'us/launch':>9} {'post/launch':>11} {'lastE/launch':>12}")
    for k, s in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"{k:<28} {s[0]:>4} {s[1]:9.1f} {100 * s[1] / tot:5.1f}% {s[1] / s[0]:9.2f} {s[2] / s[0]:11.2f} {s[3] / s[0]:12.2f}")
    # Hand-offs: a launch's step less its first block's post (release to exit), by the launch and the one after
    # it: how long after that block's exit the next launch is released (for one-block launches, the kernel
    # boundary; larger when the next launch's pre-wait work or dispatch finishes later than the wait would).
    hand = collections.OrderedDict()
    for r0, r1 in zip(rows, rows[1:]):
        if math.isnan(r0[3]) or math.isnan(r0[5]):
            continue
        h = hand.setdefault((r0[1], r1[1]), [0, 0.0, 0.0])
        h[0] += 1
        h[1] += r0[3] - r0[5]
        h[2] += r1[4]
    print("\nhand-offs, us a launch (step - post of the first, then the next launch's pre):")
    print(f"{'launch -> next':<58} {'n':>4} {'step-post':>9} {'next pre':>9}")
    for (k0, k1), h in sorted(hand.items(), key=lambda kv: -kv[1][1]):
        print(f"{k0 + ' -> ' + k1:<58} {h[0]:>4} {h[1] / h[0]:9.2f} {h[2] / h[0]:9.2f}")
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("i,launch,blocks,step_us,pre_us,post_us,last_start_us,last_end_us,start_minus_prev_release_us,m0_us,m1_us,m2_us,m3_us\n")
            for row in rows:
                f.write(",".join(str(x) for x in row) + "\n")


if __name__ == "__main__":
    main()
