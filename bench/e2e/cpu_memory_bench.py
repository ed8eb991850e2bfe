"""cpu_memory_bench.py - CPU plans' memory, planned against measured: a CPU plan's memory figure (g4 compile's "cpu" total:
weights mapped from the plan + activation arena + KV cache + per-thread scratch) against the peak
resident memory of `g4 run` measured by the kernel (/usr/bin/time's maximum RSS), at several contexts,
on a random-weight checkpoint at the real E2B/E4B text shapes (made here on the CPU if absent).

With --drop-caches the page cache is dropped between compile and run (see its help). The plan counts the
whole mapped plan file; the per-layer-embedding table (ple_table, 4.4 GiB for E2B)
is part of it but only the rows of the tokens seen become resident, so the table also reports the
plan without that table ("resident plan").
Needs torch and transformers (the checkpoint), no GPU.
Usage: python3 bench/e2e/cpu_memory_bench.py BUILD/tools/g4 [--model e2b|e4b] [--contexts 4096,32768,131072] [--kv-dtypes f32,bf16]
       [--prompt 256] [--new 8] [--threads N] [--workdir /tmp/g4cpu] [--out DIR]
Writes cpu_memory_<model>.json under --out (default bench-out) and prints a markdown table.
"""
import argparse, json, os, re, subprocess, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("g4")
ap.add_argument("--model", default="e2b", choices=["e2b", "e4b"])
ap.add_argument("--contexts", default="4096,32768,131072")
ap.add_argument("--kv-dtypes", default="f32,bf16")
ap.add_argument("--drop-caches", action="store_true",
                help="drop the page cache (root) between compile and run: g4 compile leaves the plan cached in large folios, and "
                     "each gathered PLE row then maps a whole folio (about 2 MiB a distinct token)")
ap.add_argument("--prompt", type=int, default=256)
ap.add_argument("--new", type=int, default=8)
ap.add_argument("--threads", type=int, default=os.cpu_count())
ap.add_argument("--workdir", default="/tmp/g4cpu")
ap.add_argument("--out", default="bench-out")
args = ap.parse_args()
os.makedirs(args.workdir, exist_ok=True)
os.makedirs(args.out, exist_ok=True)

ckpt = os.path.join(args.workdir, args.model)
if not os.path.exists(os.path.join(ckpt, "config.json")):
    import torch
    from transformers import Gemma4ForCausalLM
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
    from gemma4_shapes import text_config
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)   # built in bf16: the fp32 model would not fit next to its copy
    m = Gemma4ForCausalLM(text_config(args.model))
    with torch.no_grad():   # as bench/e2e/e2e_bench.py: attention logits of about unit scale
        for n, p in m.named_parameters():
            if n.endswith(("q_norm.weight", "k_norm.weight")):
                p.fill_(0.25)
    m.save_pretrained(ckpt, max_shard_size="20GB")
    del m


def mib(s):
    v, u = s.split()
    return float(v) * {"B": 2**-20, "KiB": 2**-10, "MiB": 1, "GiB": 1024, "TiB": 2**20}[u]


def ids(n):
    return ",".join(str(2 if i == 0 else (i * 7919 + 13) % 200000 + 1000) for i in range(n))


rows = []
env = dict(os.environ, G4_THREADS=str(args.threads))
for ctx, kvdt in [(int(c), k) for c in args.contexts.split(",") for k in args.kv_dtypes.split(",")]:
    plan = os.path.join(args.workdir, f"{args.model}-{ctx}.g4plan")
    t0 = time.time()
    r = subprocess.run([args.g4, "compile", "--model", ckpt, "--device", "cpu", "--no-fidelity", "--max-context", str(ctx), "--kv-dtype", kvdt,
                        "-o", plan], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(r.stderr)
    compile_s = time.time() - t0
    # The memory table's cpu row: "cpu  <total>  weights ... " (compiler/placement.cpp print_memory_plan).
    m = re.search(r"^\s+cpu\s+([\d.]+ \w+)\s+\S+\s+(.*)$", r.stderr, re.M)
    if not m:
        sys.exit("no cpu row in the compile report:\n" + r.stderr)
    planned, parts = mib(m.group(1)), m.group(2)
    ple = re.search(r"^\s+ple_table\s+\d+\s+[\d.]+ \w+\s+([\d.]+ \w+)$", r.stderr, re.M)
    ple_mib = mib(ple.group(1)) if ple else 0.0
    dropped = False
    if args.drop_caches:
        subprocess.run(["sync"])
        try:
            open("/proc/sys/vm/drop_caches", "w").write("3\n")
            dropped = True
        except OSError as e:
            print(f"cannot drop the page cache: {e}", file=sys.stderr)
    tf = os.path.join(args.workdir, "prompt.txt")
    open(tf, "w").write(ids(args.prompt))
    r = subprocess.run(["/usr/bin/time", "-f", "maxrss_kib %M", args.g4, "run", plan, "--tokens", "@" + tf, "-n", str(args.new), "--temp", "0",
                        "--ignore-eos", "--stats"], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(r.stderr)
    rss = int(re.search(r"maxrss_kib (\d+)", r.stderr).group(1)) / 1024
    stats = [l for l in r.stderr.splitlines() if l.startswith("g4: load")]
    rows.append({"context": ctx, "kv_dtype": kvdt, "page_cache_dropped": dropped, "planned_cpu_mib": round(planned, 1), "plan_parts": parts, "ple_table_mib": round(ple_mib, 1),
                 "resident_plan_mib": round(planned - ple_mib, 1), "rss_minus_resident_plan_mib": round(rss - planned + ple_mib, 1), "peak_rss_mib": round(rss, 1),
                 "rss_minus_plan_mib": round(rss - planned, 1), "plan_file_mib": round(os.path.getsize(plan) / 2**20, 1),
                 "compile_s": round(compile_s, 1), "stats": stats[-1] if stats else ""})
    print(json.dumps(rows[-1]), flush=True)
    os.remove(plan)

res = {"model": args.model, "threads": args.threads, "prompt": args.prompt, "new_tokens": args.new, "cpu": os.uname().machine,
       "nproc": os.cpu_count(), "rows": rows}
json.dump(res, open(os.path.join(args.out, f"cpu_memory_{args.model}.json"), "w"), indent=1)
print(f"\n| {args.model} CPU plan, context, KV | planned (cpu) | resident plan (less the PLE table) | measured peak RSS | RSS - resident plan |")
print("|---|---|---|---|---|")
for x in rows:
    print(f"| {x['context']}, {x['kv_dtype']} | {x['planned_cpu_mib']:.0f} MiB | {x['resident_plan_mib']:.0f} MiB | {x['peak_rss_mib']:.0f} MiB "
          f"| {x['rss_minus_resident_plan_mib']:+.0f} MiB |")
