#!/usr/bin/env python3
"""tower_bench.py - the vision and audio towers at their real (E2B = E4B) shapes: g4 against transformers,
in one run on one machine (on the CPU; with a GPU also g4's GPU vision tower and transformers bf16 on it).

A random-weight Gemma 4 multimodal checkpoint (real vision and audio towers, an E2B-width text decoder cut
to 2 layers: the towers do not depend on the text depth) is made with transformers; g4 compiles it and
encodes one image (1024x768, 256 soft tokens at the default 280 budget) and one 30 s clip (750 soft
tokens) through `g4 run --image/--audio --stats`; transformers runs its processor + get_image_features /
get_audio_features on the CPU (float32 and bfloat16, the same thread count) and, when there is one, on
the GPU (bfloat16). Medians of REPS runs after a warm-up. Also checks g4's tower outputs against
transformers float32 on the same inputs (relative L2 of the soft-token embeddings).

Needs torch and transformers (torchvision for transformers' default image processor).
Usage: python3 bench/e2e/tower_bench.py G4_BINARY [--threads N] [--reps 3] [--dir WORKDIR] [--out FILE.json]
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

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
sys.path.insert(0, os.path.dirname(__file__))
from tower_checkpoint import make_checkpoint, make_inputs  # noqa: E402

from transformers import Gemma4AudioFeatureExtractor, Gemma4ForConditionalGeneration, Gemma4ImageProcessor  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("g4")
ap.add_argument("--threads", type=int, default=os.cpu_count())
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--out", default="")
ap.add_argument("--dir", default="/tmp/g4bench/towers")
args = ap.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(0)

# ---- checkpoint ------------------------------------------------------------------------------------
ckpt = args.dir
tc = make_checkpoint(ckpt)
model = Gemma4ForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()

# ---- inputs ----------------------------------------------------------------------------------------
tmp = tempfile.mkdtemp()
img, png, pcm_read, wav, sr = make_inputs(tmp)

# ---- g4 --------------------------------------------------------------------------------------------
plans = {}
kinds = ["fp32", "bf16"] + (["gpu"] if torch.cuda.is_available() else [])
for prec in kinds:
    plans[prec] = os.path.join(tmp, f"towers_{prec}.g4plan")
    # gpu: a CUDA plan (nf4 text, bf16 tower weights): the compiler puts both towers on the GPU.
    extra = ["--device", "cuda"] if prec == "gpu" else ["--tower-precision", prec]
    r = subprocess.run([args.g4, "compile", "--model", ckpt, "--no-fidelity", *extra, "-o", plans[prec]],
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit("g4 compile failed:\n" + r.stderr)
    if prec == "fp32":
        report = r.stderr
dump = os.path.join(tmp, "soft")


def g4_once(kind, prec="fp32"):
    plan = plans[prec]
    flag = ["--image", png] if kind == "image" else ["--audio", wav]
    out = dump + "." + kind + ("" if prec == "fp32" else "." + prec)
    if os.path.exists(out):
        os.remove(out)   # the last run's rows are compared below
    env = dict(os.environ, G4_DUMP_MEDIA=out)
    r = subprocess.run([args.g4, "run", plan, *flag, "--tokens", "2", "-n", "0", "--stats", "--threads", str(args.threads)],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        sys.exit("g4 run failed:\n" + r.stderr)
    m = re.search(r"images (\d+) soft tokens in ([\d.]+) ms \(([\w:]+)\); audio (\d+) soft tokens in ([\d.]+) ms", r.stderr)
    return (int(m.group(1)), float(m.group(2))) if kind == "image" else (int(m.group(4)), float(m.group(5)))


rows = {}
for prec, label in (("fp32", "CPU, fp32 arithmetic, bf16 weights"), ("bf16", "CPU, --tower-precision bf16: bf16 matmul inputs, fp32 sums"),
                    ("gpu", "GPU, bf16 tensor-core matmuls, fp32 sums")):
    if prec not in plans:
        continue
    for kind in ("image", "audio"):
        g4_once(kind, prec)
        runs = [g4_once(kind, prec) for _ in range(args.reps)]
        rows[f"g4 {kind} ({label})"] = {"tokens": runs[0][0], "ms": statistics.median(r[1] for r in runs)}

# ---- transformers ----------------------------------------------------------------------------------
proc = Gemma4ImageProcessor()
fe = Gemma4AudioFeatureExtractor()


def hf_image(m, dev, dt):
    t0 = time.perf_counter()
    x = proc(images=[img], return_tensors="pt")
    with torch.no_grad():
        kw = {k: v.to(dev) for k, v in x.items() if k != "num_soft_tokens_per_image"}
        kw["pixel_values"] = kw["pixel_values"].to(dt)
        out = m.model.get_image_features(**kw)
    out = out.pooler_output if hasattr(out, "pooler_output") else out
    out = torch.cat(list(out)) if isinstance(out, (list, tuple)) else out
    if dev == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out.float().reshape(-1, out.shape[-1]).cpu()


def hf_audio(m, dev, dt):
    t0 = time.perf_counter()
    x = fe([pcm_read], sampling_rate=sr, return_tensors="pt")
    with torch.no_grad():
        out = m.model.get_audio_features(x["input_features"].to(dev, dt), x["input_features_mask"].to(dev))
    out = out.pooler_output if hasattr(out, "pooler_output") else out
    if dev == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def measure(label, fn, m, dev, dt):
    try:
        first = fn(m, dev, dt)[0] * 1000
        if first > 20000:   # slow rows (bf16 matmuls on a CPU without bf16 units): the warm-up run is the figure
            rows[label] = {"ms": first, "runs": 1}
            return
        times = [fn(m, dev, dt)[0] * 1000 for _ in range(args.reps)]
        rows[label] = {"ms": statistics.median(times), "runs": args.reps}
    except Exception as e:  # record why a row cannot run
        rows[label] = {"error": f"{type(e).__name__}: {e}"[:300]}


try:
    hf_img32 = hf_image(model, "cpu", torch.float32)[1]
except Exception as e:  # a transformers without this API: timings still run (and record why)
    hf_img32 = None
    print("transformers image features failed:", e, file=sys.stderr)
for dt, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
    m = model.to(dt)
    measure(f"transformers image (CPU, {name})", hf_image, m, "cpu", dt)
    measure(f"transformers audio (CPU, {name})", hf_audio, m, "cpu", dt)
if torch.cuda.is_available():
    m = model.to(torch.bfloat16).cuda()
    measure("transformers image (GPU, bf16)", hf_image, m, "cuda", torch.bfloat16)
    measure("transformers audio (GPU, bf16)", hf_audio, m, "cuda", torch.bfloat16)
    model = model.cpu()

# ---- parity on the real shapes (g4 writes its soft tokens with G4_DUMP_MEDIA) -----------------------
parity = {}
model = model.float()
if os.path.exists(dump + ".image") and hf_img32 is not None:
    g = np.fromfile(dump + ".image", dtype=np.float32).reshape(-1, tc.hidden_size)
    ref = hf_img32.numpy()
    parity["image_rel_l2"] = float(np.linalg.norm(g - ref) / np.linalg.norm(ref)) if g.shape == ref.shape else f"shape {g.shape} vs {ref.shape}"
if os.path.exists(dump + ".audio"):
    g = np.fromfile(dump + ".audio", dtype=np.float32).reshape(-1, tc.hidden_size)
    try:
        _, ref = hf_audio(model, "cpu", torch.float32)
        ref = ref.reshape(-1, tc.hidden_size).numpy()
    except Exception as e:
        ref = None
        parity["audio_error"] = str(e)[:300]
if os.path.exists(dump + ".audio") and ref is not None:
    parity["audio_rel_l2"] = float(np.linalg.norm(g - ref[: g.shape[0]]) / np.linalg.norm(ref[: g.shape[0]])) if g.shape[0] <= ref.shape[0] else f"shape {g.shape} vs {ref.shape}"

for kind, ref_rows in (("image", hf_img32), ("audio", ref if os.path.exists(dump + ".audio") else None)):
    for suffix in ("bf16", "gpu"):
        path = dump + "." + kind + "." + suffix
        if ref_rows is None or not os.path.exists(path):
            continue
        rr = ref_rows.numpy() if hasattr(ref_rows, "numpy") else ref_rows
        rr = rr.reshape(-1, tc.hidden_size)
        g = np.fromfile(path, dtype=np.float32).reshape(-1, tc.hidden_size)
        if g.shape[0] <= rr.shape[0]:
            parity[f"{kind}_{suffix}_rel_l2"] = float(np.linalg.norm(g - rr[: g.shape[0]]) / np.linalg.norm(rr[: g.shape[0]]))
if hf_img32 is not None and torch.cuda.is_available():   # HF's own bf16 GPU tower against its float32 one, for scale
    try:
        hb = hf_image(model.to(torch.bfloat16).cuda(), "cuda", torch.bfloat16)[1].numpy()
        rr = hf_img32.numpy()
        parity["image_transformers_bf16_gpu_rel_l2"] = float(np.linalg.norm(hb - rr) / np.linalg.norm(rr))
        model = model.cpu().float()
    except Exception as e:
        parity["image_transformers_bf16_gpu_error"] = str(e)[:300]

res = {"threads": args.threads, "cpu": os.popen("lscpu | grep 'Model name'").read().strip(), "torch": torch.__version__,
       "transformers": __import__("transformers").__version__, "rows": rows, "parity_vs_transformers_fp32": parity,
       "compile_report_towers": [l for l in report.splitlines() if "tower" in l]}
if torch.cuda.is_available():
    res["gpu"] = torch.cuda.get_device_name(0)
print(json.dumps(res, indent=1))
if args.out:
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
