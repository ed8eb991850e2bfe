#!/usr/bin/env python3
"""video_bench.py - time to encode a video (the processor's 32 sampled frames decoded, each through the vision
tower at 70 soft tokens) with g4 on the GPU and on the CPU, at the real E2B (= E4B) vision tower shape.

The random-weight checkpoint of tower_checkpoint.py (real towers, a 2-layer E2B-width text decoder) is compiled
twice (`--device cuda`, and the CPU default: bf16 tower weights, fp32 arithmetic), both with
--max-media-tokens 4096 (a 16:9 frame gives 66 soft tokens; 32 of them exceed the 2048 default).
bench/micro/video_encode_bench times the decode and the towers. Where that binary was built without FFmpeg,
the frames are decoded with OpenCV (FFmpeg's decoders, transformers' `load_video` backend where torchcodec is
missing) and handed over raw: the decode row then says which decoder ran. transformers' own path (processor +
get_video_features, bf16 on the GPU) runs on the same frames for comparison when a GPU is there.

Usage: python3 bench/e2e/video_bench.py BENCH_BINARY G4_BINARY VIDEO --out DIR [--threads N] [--reps 2]
Writes DIR/video_bench.json and DIR/video_bench.md.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
sys.path.insert(0, os.path.dirname(__file__))

ap = argparse.ArgumentParser()
ap.add_argument("bench")
ap.add_argument("g4")
ap.add_argument("video")
ap.add_argument("--out", required=True)
ap.add_argument("--threads", type=int, default=os.cpu_count())
ap.add_argument("--reps", type=int, default=2)
ap.add_argument("--dir", default="/tmp/g4bench/video")
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
res = {"video": os.path.basename(args.video), "threads": args.threads, "reps": args.reps, "rows": {},
       "cpu": platform.processor() or platform.machine()}
try:
    res["cpu"] = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
except Exception:  # noqa: BLE001
    pass


def save():
    with open(os.path.join(args.out, "video_bench.json"), "w") as f:
        json.dump(res, f, indent=1)
    lines = [f"# Video encode: {res['video']}", "", f"CPU: {res['cpu']}, {args.threads} threads; "
             f"GPU: {res.get('gpu', 'none')}; medians of {args.reps} runs after a warm-up.", "",
             "| what | ms | detail |", "|---|---|---|"]
    for k, v in res["rows"].items():
        lines.append(f"| {k} | {v.get('ms', '')} | {v.get('detail', v.get('error', ''))} |")
    open(os.path.join(args.out, "video_bench.md"), "w").write("\n".join(lines) + "\n")


def sample_indices(total, n=32):
    n = min(n, total)
    step = total / n
    return [int(np.float32(i * step)) for i in range(int(np.ceil(total / step)))]


# ---- the frames: g4's decoder where the bench has FFmpeg, else OpenCV's ------------------------------------
tmp = tempfile.mkdtemp()
raw = None
import cv2  # noqa: E402

cap = cv2.VideoCapture(args.video)
t0 = time.perf_counter()
allf = []
while True:
    ok, fr = cap.read()
    if not ok:
        break
    allf.append(fr)
n_all = len(allf)
idx = sample_indices(n_all)
frames = [cv2.cvtColor(allf[i], cv2.COLOR_BGR2RGB) for i in idx]
cv_ms = (time.perf_counter() - t0) * 1000
del allf
h, w = frames[0].shape[:2]
res["video_frames"] = {"total": n_all, "sampled": len(idx),
                       "width": w, "height": h}
res["rows"]["decode, OpenCV " + cv2.__version__ + " (every frame, 32 kept)"] = {"ms": round(cv_ms, 1)}
raw = os.path.join(tmp, "frames.rgb")
with open(raw, "wb") as f:
    for fr in frames:
        f.write(np.ascontiguousarray(fr).tobytes())
save()

# ---- checkpoint and plans --------------------------------------------------------------------------------
import torch  # noqa: E402
from tower_checkpoint import make_checkpoint  # noqa: E402

t0 = time.perf_counter()
make_checkpoint(args.dir)
res["checkpoint_s"] = round(time.perf_counter() - t0, 1)
plans = {}
for dev in (["cuda"] if torch.cuda.is_available() else []) + ["cpu"]:
    plan = os.path.join(tmp, f"video_{dev}.g4plan")
    extra = ["--device", "cuda"] if dev == "cuda" else []
    r = subprocess.run([args.g4, "compile", "--model", args.dir, "--no-audio", "--no-fidelity",
                        "--max-media-tokens", "4096", *extra, "-o", plan], capture_output=True, text=True)
    if r.returncode:
        res["rows"][f"g4 compile {dev}"] = {"error": r.stderr[-400:]}
        continue
    plans[dev] = plan
if torch.cuda.is_available():
    res["gpu"] = torch.cuda.get_device_name(0)
save()


def bench(dev, mode):
    env = dict(os.environ, G4_THREADS=str(args.threads))
    cmd = [args.bench, plans[dev]] + (["--frames", raw, str(w), str(h), str(len(frames))] if mode == "raw"
                                      else [args.video]) + [str(args.reps)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        return {"error": (r.stderr or r.stdout)[-300:]}
    reps = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    return {k: statistics.median(x[k] for x in reps) for k in ("decode_ms", "encode_ms", "towers_ms")} | {
        "soft_tokens": reps[0]["soft_tokens"], "frames": reps[0]["frames"], "vision_device": reps[0]["vision_device"]}


for dev in plans:
    label = "GPU" if dev == "cuda" else f"CPU, {args.threads} threads"
    g = bench(dev, "file")
    if "error" not in g:
        res["rows"][f"g4 decode (FFmpeg, {label} plan)"] = {"ms": g["decode_ms"]}
        res["rows"][f"g4 decode + vision tower, {label}"] = {
            "ms": g["encode_ms"], "detail": f"{g['frames']} frames, {g['soft_tokens']} soft tokens"}
    else:
        res["rows"][f"g4 decode ({label})"] = {"error": g["error"].strip().splitlines()[-1][:200]}
    t = bench(dev, "raw")
    if "error" in t:
        res["rows"][f"g4 vision tower, {label}"] = t
    else:
        res["rows"][f"g4 vision tower, {label}"] = {
            "ms": t["towers_ms"], "detail": f"{t['frames']} frames of {w}x{h}, {t['soft_tokens']} soft tokens, "
                                            f"vision_device {t['vision_device']}"}
    save()

# ---- transformers on the same frames (GPU, bf16) ---------------------------------------------------------
if torch.cuda.is_available():
    try:
        from transformers import Gemma4ForConditionalGeneration
        from transformers.models.gemma4.video_processing_gemma4 import Gemma4VideoProcessor
        model = Gemma4ForConditionalGeneration.from_pretrained(args.dir, dtype=torch.bfloat16).cuda().eval()
        vp = Gemma4VideoProcessor()
        video = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2)

        def hf():
            t0 = time.perf_counter()
            x = vp(videos=[video], do_sample_frames=False, return_tensors="pt")
            with torch.no_grad():
                out = model.model.get_video_features(x["pixel_values_videos"].cuda().to(torch.bfloat16),
                                                     x["video_position_ids"].cuda())
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) * 1000

        hf()
        res["rows"]["transformers processor + get_video_features, GPU bf16"] = {
            "ms": round(statistics.median(hf() for _ in range(args.reps)), 1), "detail": "same 32 frames"}
    except Exception as e:  # noqa: BLE001
        res["rows"]["transformers processor + get_video_features, GPU bf16"] = {"error": f"{type(e).__name__}: {e}"[:300]}
save()
print(json.dumps(res, indent=1))
