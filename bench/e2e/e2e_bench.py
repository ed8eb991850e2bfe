#!/usr/bin/env python3
"""e2e_bench.py - g4 vs the Hugging Face stack on one GPU, same checkpoint and adapter, one run.

Makes a random-weight Gemma 4 text checkpoint at the real E2B or E4B shapes (transformers, bf16) and a
random LoRA (r=16, alpha=32, on q/k/v/o/gate/up/down), then measures side by side, batch 1:
  time to first token for 512- and 4096-token prompts; decode tokens/s at context depths 0, 4K, 32K;
  peak GPU memory; g4's achieved GB/s against the device's measured copy bandwidth.
Rows: g4 (adapter merged, NF4 projections, CUDA); llama.cpp Q4_0 and Q4_K_M (with --llama-cpp: the same
checkpoint converted by llama.cpp's own converter, all layers on the GPU, flash attention, llama-bench);
transformers bf16; transformers bf16 + PEFT (unmerged); transformers + bitsandbytes NF4 + PEFT (if
bitsandbytes imports; else the reason).
Needs a CUDA GPU, torch, transformers, peft (bitsandbytes for the last row) and a g4 build.
Usage: python3 bench/e2e/e2e_bench.py BUILD/tools/g4 --model e2b|e4b [--out DIR] [--workdir DIR] [--new 128]
       [--llama-cpp SRC [--llama-bin DIR] [--quants Q4_0,Q4_K_M]] [--g4-only [--quick]] [--profile] [--checkpoint-only]
  --workdir: where the checkpoint, adapter and plans go (default /tmp/g4bench); bench/e2e/e2e_run.sh runs both models.
  --llama-cpp: a llama.cpp source tree built with CUDA (cmake -B build -DGGML_CUDA=ON; llama-bench and
  llama-quantize in build/bin, or --llama-bin). The llama.cpp rows measure the base checkpoint: g4's merge of
  the adapter changes weight values, not shapes, and speed depends only on the shapes.
Writes DIR/bench_<model>.json, DIR/bench_<model>.md and DIR/bench_<model>.png.
"""
import argparse, json, os, re, subprocess, sys, time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("g4")
ap.add_argument("--model", default="e2b", choices=["e2b", "e4b"])
ap.add_argument("--new", type=int, default=128)
ap.add_argument("--out", default="/tmp")
ap.add_argument("--workdir", default="/tmp/g4bench")
ap.add_argument("--depths", default="0,4096,32768")
ap.add_argument("--chunk", type=int, default=4096, help="g4 prefill chunk (tokens per prefill step; 4096: the prompts in one step, as transformers does)")
ap.add_argument("--g4-only", action="store_true", help="measure g4 only (no transformers rows), plus a per-kernel profile")
ap.add_argument("--profile", action="store_true", help="only the decode profile (GPU events per launch, then Nsight Compute per kernel)")
ap.add_argument("--checkpoint-only", action="store_true", help="make the random checkpoint and adapter under --workdir, then stop")
ap.add_argument("--quick", action="store_true", help="with --g4-only: skip the PLE-on-host plan (kernel iteration)")
ap.add_argument("--llama-cpp", metavar="SRC", help="llama.cpp source tree with a CUDA build: adds its rows (see above)")
ap.add_argument("--llama-bin", metavar="DIR", help="where llama-bench and llama-quantize are. Default: SRC/build/bin")
ap.add_argument("--quants", default="Q4_0,Q4_K_M", help="llama.cpp quantizations. Default: Q4_0,Q4_K_M")
args = ap.parse_args()
depths = [int(d) for d in args.depths.split(",")]
os.makedirs(args.workdir, exist_ok=True)

from transformers import Gemma4ForCausalLM
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from gemma4_shapes import text_config  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from g4_measure import GpuPeak, gib, planned_gpu_mib  # noqa: E402

cfg = text_config(args.model)
ckpt, adapter = os.path.join(args.workdir, args.model), os.path.join(args.workdir, args.model + "-lora")
if not os.path.exists(os.path.join(ckpt, "config.json")):
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = Gemma4ForCausalLM(cfg).to(torch.bfloat16)
    # q/k norm weights of 0.25 give attention logits of about unit scale, as in trained checkpoints;
    # with HF's init (1.0) and scaling 1.0 every attention row is nearly one-hot and the random model is
    # chaotic: any rounding difference flips keys and tokens, and no comparison means anything.
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith(("q_norm.weight", "k_norm.weight")):
                p.fill_(0.25)
    m.save_pretrained(ckpt, max_shard_size="20GB")
    from peft import LoraConfig, get_peft_model
    pm = get_peft_model(m, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                          "up_proj", "down_proj"]))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.normal_(0, 0.01)
    pm.save_pretrained(adapter)
    del m, pm
    torch.cuda.empty_cache()

if args.checkpoint_only:
    sys.exit(0)

res = {"model": args.model, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "transformers": transformers.__version__,
       "new_tokens": args.new, "rows": {}}
try:
    res["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                                   text=True).stdout.strip()
except Exception:
    pass
import peft
res["peft"] = peft.__version__

# Measured device bandwidth: a 4 GiB device-to-device copy (bytes read + written).
a = torch.empty(1 << 30, dtype=torch.float32, device="cuda")
b = torch.empty_like(a)
for _ in range(3):
    b.copy_(a)
torch.cuda.synchronize()
t0 = time.time()
for _ in range(10):
    b.copy_(a)
torch.cuda.synchronize()
res["device_copy_GBps"] = round(2 * a.numel() * 4 * 10 / (time.time() - t0) / 1e9, 1)
del a, b
torch.cuda.empty_cache()


def ids_of(n):
    return [2] + [(i * 7919 + 13) % 200000 + 1000 for i in range(n - 1)]


# ---- g4: adapter merged in fp32, NF4 projections, one plan for every measurement.
max_ctx = max(depths + [4096]) + args.new + 16
plan = os.path.join(args.workdir, args.model + ".g4plan")
t0 = time.time()
if args.profile:
    if not os.path.exists(plan):
        subprocess.run([args.g4, "compile", "--model", ckpt, "--adapter", adapter, "--device", "cuda", "--no-fidelity", "--max-context",
                        str(max_ctx), "--chunk", str(args.chunk), "-o", plan], capture_output=True, text=True, check=True)
    ids = ",".join(map(str, ids_of(16)))
    r = subprocess.run([args.g4, "run", plan, "--tokens", ids, "-n", "64", "--temp", "0", "--ignore-eos"], capture_output=True, text=True,
                       env=dict(os.environ, G4_CUDA_PROFILE="1"))
    print(r.stderr[-9000:], flush=True)
    open(os.path.join(args.out, f"profile_{args.model}.txt"), "w").write(r.stderr)
    ncu = subprocess.run(["ncu", "--metrics", "gpu__time_duration.sum,dram__bytes_read.sum", "--cache-control", "none", "--csv",
                          "--page", "raw", args.g4, "run", plan, "--tokens", ids, "-n", "3", "--temp", "0", "--ignore-eos"],
                         capture_output=True, text=True)
    open(os.path.join(args.out, f"ncu_{args.model}.csv"), "w").write(ncu.stdout)
    print(ncu.stderr[-2000:], flush=True)
    sys.exit(0)
r = subprocess.run([args.g4, "compile", "--model", ckpt, "--adapter", adapter, "--device", "cuda", "--no-fidelity", "--max-context",
                    str(max_ctx), "--chunk", str(args.chunk), "-o", plan], capture_output=True, text=True)
if r.returncode != 0:
    print(r.stderr)
    sys.exit(1)
res["g4_compile_s"] = round(time.time() - t0, 1)
report = r.stderr
print(report[-1200:], flush=True)


groups = {m.group(1): gib(m.group(3)) for m in re.finditer(r"^\s+(\w+)\s+\d+\s+([\d.]+ \w+)\s+([\d.]+ \w+)$", report, re.M)}
# Bytes read per decode token: every weight but the PLE table and the embedding lookup rows (the
# tied LM head reads the whole embedding).
bytes_per_token = (sum(groups.values()) - groups.get("ple_table", 0)) * 2**30


def g4_run(n_prompt, n_new, env=None):
    tf = os.path.join(args.workdir, "prompt.txt")
    open(tf, "w").write(",".join(map(str, ids_of(n_prompt))))
    with GpuPeak() as pk:
        r = subprocess.run([args.g4, "run", plan, "--tokens", "@" + tf, "-n", str(n_new), "--temp", "0",
                            "--ignore-eos", "--stats"], capture_output=True, text=True, env=dict(os.environ, **(env or {})))
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    line = [l for l in r.stderr.splitlines() if l.startswith("g4: load")][-1]
    num = lambda pat: float(re.search(pat, line).group(1))
    return {"ttft_ms": num(r"time to first token ([\d.]+) ms"), "decode_tok_s": num(r"decode \d+ tokens in [\d.]+ ms \(([\d.]+) tok/s"),
            "peak_mib": pk.peak, "line": line}


def g4_bench(pl, prompts, depth_list, env=None, reps=3):
    """`g4 bench`: one warm process, as the HF rows are measured (warm-up first, then medians)."""
    with GpuPeak() as pk:
        r = subprocess.run([args.g4, "bench", pl, "-p", ",".join(map(str, prompts)), "-n", str(args.new), "-d",
                            ",".join(str(max(d, 16)) for d in depth_list), "-r", str(reps), "--json"], capture_output=True, text=True,
                           env=dict(os.environ, **(env or {})))
    if r.returncode != 0:
        raise SystemExit(r.stderr)
    out = {"peak_mib": pk.peak}
    for t in json.loads(r.stdout):
        if t["test"].startswith("pp"):
            out[f"ttft_{t['tokens']}_ms"] = round(t["median_ms"], 2)
        else:
            out[f"decode_tok_s_depth_{0 if t['depth'] == 16 else t['depth']}"] = round(t["tok_s"], 1)
    return out


g4row = g4_bench(plan, [512, 4096], depths)
cold = g4_run(4096, 1)
g4row["ttft_4096_ms_cold_process"] = cold["ttft_ms"]   # `g4 run` in a fresh process: includes first-use costs
g4row["peak_gpu_mib"] = max(g4row.pop("peak_mib"), cold["peak_mib"])
g4row["planned_gpu_mib"] = planned_gpu_mib(report)   # the measured peak adds the CUDA context
g4row["GBps_depth_0"] = round(bytes_per_token * g4row["decode_tok_s_depth_0"] / 1e9, 1)
g4row["fraction_of_copy_bw"] = round(g4row["GBps_depth_0"] / res["device_copy_GBps"], 3)
res["rows"]["g4 NF4 + LoRA merged (CUDA)"] = g4row
print(json.dumps(g4row), flush=True)

# Offloading cost: the same plan with the PLE table in pinned host memory (--place ple=host).
plan_host = plan + ".plehost"
r = subprocess.run([args.g4, "compile", "--model", ckpt, "--adapter", adapter, "--device", "cuda", "--no-fidelity", "--max-context",
                    str(max_ctx), "--chunk", str(args.chunk), "--place", "ple=host", "-o", plan_host], capture_output=True, text=True) \
    if not args.quick else subprocess.CompletedProcess([], 1, "", "skipped (--quick)")
if r.returncode == 0:
    plan_dev, plan = plan, plan_host
    hrow = g4_bench(plan_host, [512, 4096], depths)
    hrow["peak_gpu_mib"] = hrow.pop("peak_mib")
    hrow["planned_gpu_mib"] = planned_gpu_mib(r.stderr)
    ids_run = lambda pl: subprocess.run([args.g4, "run", pl, "--tokens", ",".join(map(str, ids_of(64))), "-n", "16", "--temp", "0",
                                         "--ignore-eos", "--print-ids"], capture_output=True, text=True, check=True).stdout.split()[-1]
    hrow["greedy_identical_to_device_ple"] = ids_run(plan_host) == ids_run(plan_dev)
    plan = plan_dev
    os.remove(plan_host)   # disk: real-shape plans are 6-9 GB each
    res["rows"]["g4, PLE table in host memory"] = hrow
    print("PLE on host:", json.dumps(hrow), flush=True)
else:
    res["rows"]["g4, PLE table in host memory"] = {"not_run": r.stderr[-300:]}

# Decode (fused GEMV schedule, split-K decode attention) vs prefill at the real shapes. Random-weight
# logits are nearly flat, so the check uses a second plan whose prefill runs in fp32 (same decode
# kernels): greedy tokens against the argmax of a teacher-forced fp32 prefill. The bf16 (cuBLAS)
# prefill is compared with the fp32 one by relative L2 over the same 80 positions.
plan32 = plan + ".fp32"
r = subprocess.run([args.g4, "compile", "--model", ckpt, "--adapter", adapter, "--device", "cuda", "--no-fidelity", "--max-context",
                    str(max_ctx), "--chunk", str(args.chunk), "--prefill-precision", "fp32", "-o", plan32], capture_output=True, text=True)
if r.returncode != 0:
    raise SystemExit("fp32-prefill plan: " + r.stderr[-600:])
import numpy as np
tf = os.path.join(args.workdir, "tf.txt")
open(tf, "w").write(",".join(map(str, ids_of(64))))
r = subprocess.run([args.g4, "run", plan32, "--tokens", "@" + tf, "-n", "16", "--temp", "0", "--ignore-eos", "--print-ids"],
                   capture_output=True, text=True, check=True)
gen = [int(x) for x in re.findall(r"\d+", r.stdout)][-16:]
open(tf, "w").write(",".join(map(str, ids_of(64) + gen)))
logits = {}
for name, pl in [("fp32", plan32), ("bf16", plan)]:
    lf = os.path.join(args.workdir, name + ".logits")
    subprocess.run([args.g4, "run", pl, "--tokens", "@" + tf, "-n", "0", "--dump-logits", lf], capture_output=True, text=True, check=True)
    logits[name] = np.fromfile(lf, dtype=np.float32).reshape(64 + 16, -1).astype(np.float64)
os.remove(plan32)
agree = int(sum(int(logits["fp32"][63 + i].argmax()) == gen[i] for i in range(16)))
rl2 = float(np.linalg.norm(logits["bf16"] - logits["fp32"]) / np.linalg.norm(logits["fp32"]))
top2 = np.sort(logits["fp32"][63:79], axis=1)[:, -2:]
res["decode_vs_fp32_prefill_argmax_agreement"] = f"{agree}/16"
res["bf16_prefill_vs_fp32_prefill_rel_l2"] = rl2
res["fp32_top2_gap_median"] = float(np.median(top2[:, 1] - top2[:, 0]))
print(f"decode vs teacher-forced fp32 prefill argmax: {agree}/16; bf16 prefill vs fp32 prefill rel L2 {rl2:.3e}; "
      f"median top-2 logit gap {res['fp32_top2_gap_median']:.3e}", flush=True)

# ---- llama.cpp rows: the GGUFs made by llama.cpp's converter and llama-quantize (cached in --workdir/gguf),
# every layer on the GPU, flash attention; llama-bench runs a warm-up, then the repetitions (medians here).
def llama_rows():
    import types
    import cpu_llamacpp_bench as clb
    la = types.SimpleNamespace(llama_cpp=args.llama_cpp, llama_bin=args.llama_bin, g4=args.g4, stop_after=None,
                               no_plot=True, workdir=args.workdir, python=sys.executable,
                               quant_list=[q for q in args.quants.split(",") if q])
    try:
        tools = clb.find_tools(la)
        ggufs, steps = clb.prepare_ggufs(la, tools, ckpt, clb.checkpoint_key(ckpt), os.path.join(args.workdir, "llama.log"))
    except clb.BenchError as e:
        res["rows"]["llama.cpp"] = {"not_run": str(e)[:300]}
        print("llama.cpp rows not run:", e, flush=True)
        return
    res["llama_cpp_steps_s"] = {k: round(v, 1) for k, v in steps.items()}

    def bench(gguf, extra):
        cmd = [tools["llama-bench"], "-m", gguf, "-ngl", "99", "-fa", "1", "-r", "3", "-o", "json", *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"llama-bench rc {r.returncode}: {(r.stderr.strip().splitlines() or ['?'])[-1][:200]}")
        return json.loads(r.stdout[r.stdout.index("["):])

    for q, gguf in ggufs.items():
        label = f"llama.cpp {q} (CUDA, flash attention)"
        row = {}
        try:
            with GpuPeak() as pk:
                for rec in bench(gguf, ["-p", "512,4096", "-n", "0"]):
                    med = sorted(rec["samples_ns"])[len(rec["samples_ns"]) // 2] / 1e6
                    row[f"ttft_{rec['n_prompt']}_ms"] = round(med, 1)
                for rec in bench(gguf, ["-p", "0", "-n", str(args.new), "-d", ",".join(map(str, depths))]):
                    med = sorted(rec["samples_ns"])[len(rec["samples_ns"]) // 2] / 1e9
                    row[f"decode_tok_s_depth_{rec.get('n_depth', 0)}"] = round(args.new / med, 1)
                    row["build_commit"], row["model_size"] = rec.get("build_commit"), rec.get("model_size")
            row["peak_gpu_mib"] = pk.peak
        except (RuntimeError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
            row = {"not_run": str(e)[:300]}
        res["rows"][label] = row
        print(label, json.dumps(row), flush=True)


if args.llama_cpp:
    llama_rows()


if args.g4_only:
    # Programmatic dependent launch on/off, interleaved (sm_90+; G4_PDL=0 turns it off).
    ab = {"on": [], "off": []}
    for _ in range(3):
        for k, env in [("on", {}), ("off", {"G4_PDL": "0"})]:
            ab[k].append(g4_bench(plan, [16], [0], env, reps=1)["decode_tok_s_depth_0"])
    res["pdl_decode_tok_s_depth_0"] = {k: sorted(v)[1] for k, v in ab.items()}
    print("programmatic dependent launch:", res["pdl_decode_tok_s_depth_0"], flush=True)
    open(tf, "w").write(",".join(map(str, ids_of(512))))
    r = subprocess.run([args.g4, "run", plan, "--tokens", "@" + tf, "-n", "32", "--temp", "0", "--ignore-eos"], capture_output=True,
                       text=True, env=dict(os.environ, G4_CUDA_PROFILE="1"))
    res["profile_512_plus_32"] = r.stderr[-8000:]
    print(r.stderr[-8000:], flush=True)
    json.dump(res, open(os.path.join(args.out, f"g4only_{args.model}.json"), "w"), indent=1)
    sys.exit(0)


# ---- Hugging Face rows
def hf_measure(model, label, depth_list):
    row = {}
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        # Warm-up (kernel selection, allocator) so the first timed row is not penalised.
        out = model(torch.tensor([ids_of(16)], device="cuda"), use_cache=True, logits_to_keep=1)
        past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(8):
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        del past, out
        for n in [512, 4096]:
            x = torch.tensor([ids_of(n)], device="cuda")
            best = 1e9
            for _ in range(2):
                torch.cuda.synchronize(); t0 = time.time()
                out = model(x, use_cache=True, logits_to_keep=1)
                out.logits[0, -1].argmax().item()
                best = min(best, (time.time() - t0) * 1000)
            row[f"ttft_{n}_ms"] = round(best, 1)
        for d in depth_list:
            x = torch.tensor([ids_of(max(d, 16))], device="cuda")
            out = model(x, use_cache=True, logits_to_keep=1)
            past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize(); t0 = time.time()
            for _ in range(args.new):
                out = model(tok, past_key_values=past, use_cache=True)
                past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            row[f"decode_tok_s_depth_{d}"] = round(args.new / (time.time() - t0), 1)
            del past, out
    row["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
    res["rows"][label] = row
    print(label, json.dumps(row), flush=True)


base = Gemma4ForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
hf_measure(base, "transformers bf16", depths)
from peft import PeftModel
pm = PeftModel.from_pretrained(base, adapter).eval()
hf_measure(pm, "transformers bf16 + PEFT (unmerged)", depths)
del pm, base
torch.cuda.empty_cache()
try:
    import bitsandbytes  # noqa: F401
    from transformers import BitsAndBytesConfig
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    qm = Gemma4ForCausalLM.from_pretrained(ckpt, quantization_config=q, dtype=torch.bfloat16, device_map={"": 0},
                                           attn_implementation="sdpa").eval()
    qm = PeftModel.from_pretrained(qm, adapter).eval()
    hf_measure(qm, "transformers + bitsandbytes NF4 + PEFT", depths)
    del qm
except Exception as e:  # record why the row could not run
    res["rows"]["transformers + bitsandbytes NF4 + PEFT"] = {"not_run": f"{type(e).__name__}: {str(e)[:300]}"}
    print("bnb row not run:", e, flush=True)

json.dump(res, open(os.path.join(args.out, f"bench_{args.model}.json"), "w"), indent=1)
cols = ["ttft_512_ms", "ttft_4096_ms"] + [f"decode_tok_s_depth_{d}" for d in depths] + ["peak_gpu_mib"]
md = [f"### {args.model.upper()} on {res['gpu']} (driver {res.get('driver', '?')}, torch {res['torch']}, transformers "
      f"{res['transformers']}, peft {res['peft']}); device copy {res['device_copy_GBps']} GB/s", "",
      "| row | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
for label, row in res["rows"].items():
    md.append(f"| {label} | " + " | ".join(str(row.get(c, row.get("not_run", "—") if c == cols[0] else "—")) for c in cols) + " |")
g = res["rows"]["g4 NF4 + LoRA merged (CUDA)"]
md += ["", f"g4 decode at depth 0 reads {bytes_per_token / 1e9:.2f} GB/token: {g['GBps_depth_0']} GB/s, "
           f"{100 * g['fraction_of_copy_bw']:.1f}% of the measured copy bandwidth."]
for label, row in res["rows"].items():
    if label.startswith("llama.cpp ") and "not_run" not in row:
        ratios = [f"{c} {g[c] / row[c]:.2f}x" for c in cols[2:-1] if row.get(c) and g.get(c)]
        ratios += [f"{c} {row[c] / g[c]:.2f}x" for c in cols[:2] if row.get(c) and g.get(c)]
        md.append(f"g4 against {label}: " + ", ".join(ratios) + " (decode: tok/s ratio; prefill: time ratio).")
open(os.path.join(args.out, f"bench_{args.model}.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4))
    labels = [l for l, r in res["rows"].items() if "not_run" not in r]
    w = 0.8 / max(1, len(labels))
    for i, l in enumerate(labels):
        vals = [res["rows"][l].get(f"decode_tok_s_depth_{d}", 0) for d in depths]
        ax.bar([j + i * w for j in range(len(depths))], vals, w, label=l)
    ax.set_xticks([j + w * (len(labels) - 1) / 2 for j in range(len(depths))])
    ax.set_xticklabels([f"depth {d}" for d in depths])
    ax.set_ylabel("decode tokens/s (batch 1)")
    ax.set_title(f"Gemma 4 {args.model.upper()} on {res['gpu']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, f"bench_{args.model}.png"), dpi=110)
except Exception as e:
    print("chart not drawn:", e)
