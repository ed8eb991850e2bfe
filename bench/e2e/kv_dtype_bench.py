#!/usr/bin/env python3
"""kv_dtype_bench.py - the KV cache dtype (--kv-dtype f32 | bf16) on a GPU at the real E2B/E4B shapes.

Makes a random-weight text checkpoint at the real shapes (as bench/e2e/e2e_bench.py: transformers, bf16,
q/k norm weights 0.25), compiles two CUDA plans that differ only in --kv-dtype (NF4 projections, chunk
1024), and measures with `g4 bench` (one warm process, medians): time to first token and decode
tokens/s at several context depths. Also compares the plans' outputs on one 256-token prompt:
relative L2 of the prefill logits (bf16 vs f32 cache) and how many of 64 greedy tokens agree.
Needs a CUDA GPU, torch and transformers.
Usage: python3 bench/e2e/kv_dtype_bench.py BUILD/tools/g4 [--model e2b|e4b] [--depths 0,4096,32000] [--out DIR]
Writes DIR/kv_dtype_<model>.json.
"""
import argparse, json, os, subprocess, sys

import numpy as np
import torch

ap = argparse.ArgumentParser()
ap.add_argument("g4")
ap.add_argument("--model", default="e2b", choices=["e2b", "e4b"])
ap.add_argument("--depths", default="0,4096,32000")
ap.add_argument("--prompts", default="512,4096")
ap.add_argument("--max-context", type=int, default=32768)
ap.add_argument("--new", type=int, default=64)
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--workdir", default="/tmp/g4bench")
ap.add_argument("--out", default="/tmp")
args = ap.parse_args()
os.makedirs(args.workdir, exist_ok=True)

from transformers import Gemma4ForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from gemma4_shapes import text_config  # noqa: E402

ckpt = os.path.join(args.workdir, args.model)
if not os.path.exists(os.path.join(ckpt, "config.json")):
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = Gemma4ForCausalLM(text_config(args.model)).to(torch.bfloat16)
    with torch.no_grad():   # unit-scale attention logits, as in trained checkpoints (see e2e_bench.py)
        for n, p in m.named_parameters():
            if n.endswith(("q_norm.weight", "k_norm.weight")):
                p.fill_(0.25)
    m.save_pretrained(ckpt, max_shard_size="20GB")
    del m
    torch.cuda.empty_cache()


def sh(a):
    r = subprocess.run(a, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"FAILED: {' '.join(a)}\n{r.stderr[-3000:]}")
    return r


res = {"model": args.model, "max_context": args.max_context, "plans": {}}
plans = {}
for kv in ["f32", "bf16"]:
    plans[kv] = os.path.join(args.workdir, f"{args.model}-kv{kv}.g4plan")
    r = sh([args.g4, "compile", "--model", ckpt, "--device", "cuda", "--weights", "nf4", "--kv-dtype", kv, "--chunk", "1024",
            "--max-context", str(args.max_context), "--no-fidelity", "-o", plans[kv]])
    kvline = [l.strip() for l in r.stderr.splitlines() if "KV cache" in l and "cuda:0" in l]
    b = sh([args.g4, "bench", plans[kv], "-p", args.prompts, "-n", str(args.new), "-d", args.depths, "-r", str(args.reps), "--json"])
    res["plans"][kv] = {"memory": kvline, "bench": json.loads(b.stdout)}
    print(kv, kvline, flush=True)
    print(b.stdout[:2000], flush=True)

ids = [2] + [3 + (i * 7919 + 13) % 200000 for i in range(255)]   # logits of every position: 256 x vocab floats
tok = {}
lg = {}
for kv in ["f32", "bf16"]:
    dump = os.path.join(args.workdir, f"logits-{kv}.f32")
    r = sh([args.g4, "run", plans[kv], "--tokens", ",".join(map(str, ids)), "-n", "64", "--temp", "0", "--ignore-eos", "--print-ids",
            "--dump-logits", dump])
    tok[kv] = [int(x) for x in r.stdout.strip().split(",") if x]
    lg[kv] = np.fromfile(dump, dtype="<f4").astype(np.float64)
res["prefill_logits_rel_l2_bf16_vs_f32"] = float(np.linalg.norm(lg["bf16"] - lg["f32"]) / np.linalg.norm(lg["f32"]))
res["greedy_tokens_agree"] = next((i for i, (a, b) in enumerate(zip(tok["f32"], tok["bf16"])) if a != b), len(tok["f32"]))
res["greedy_tokens"] = len(tok["f32"])
print(json.dumps({k: v for k, v in res.items() if k != "plans"}))
json.dump(res, open(os.path.join(args.out, f"kv_dtype_{args.model}.json"), "w"), indent=1)
