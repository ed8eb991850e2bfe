#!/usr/bin/env python3
# Generates tests/fixtures/towers/image/: small PNG inputs and what Hugging Face's default Gemma 4 image
# processor (transformers 5.17, torchvision backend, the one AutoImageProcessor picks when torchvision is
# installed) makes of them, for tests/unit/image_preprocess_test.cpp. Deterministic (fixed numpy seeds).
#
# Needs torch, transformers, numpy, Pillow and torchvision (a torchvision wheel matching torch's minor
# version works; e.g. `pip install --no-deps --target /tmp/tv_site torchvision pillow` and run with
# PYTHONPATH=/tmp/tv_site).
#
# Outputs (all small):
#   <name>.png                     inputs (RGB, one RGBA, one greyscale)
#   <name>_t<tokens>.resized.png   HF's pixel_values, un-patchified, as the uint8 image it came from: the
#                                  generator asserts that pixel_values == float32(u8) * float32(1/255)
#                                  bit for bit, so this PNG is a lossless encoding of HF's floats
#   <name>_t<tokens>.pos.bin       HF's image_position_ids, real rows only: int32 [n_patches, 2] (x, y)
#   alpha_table.png                every (value, alpha) pair (the processor drops alpha: convert("RGB"))
#   manifest.json                  cases (layout, soft tokens) and the image_layout() table
import json
import math
import os
import sys

import numpy as np
import PIL.Image
import torch

from transformers.models.gemma4.image_processing_gemma4 import (
    Gemma4ImageProcessor,
    get_aspect_ratio_preserving_size,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "towers", "image")
PATCH, POOL = 16, 3
TWO_BUDGETS = ("tall_900x12",)   # the others only at 70 tokens: keeps the fixture small


def smooth_noise(h, w, seed, channels=3, amp=1.0):
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, h)[:, None]
    x = np.linspace(0.0, 1.0, w)[None, :]
    planes = []
    for c in range(channels):
        f = 1.5 + c
        base = 128 + 100 * np.sin(2 * np.pi * (f * x + 0.7 * c)) * np.cos(2 * np.pi * (1.3 * y + 0.2 * c))
        base += 60 * (x - y)
        planes.append(base + rng.normal(0.0, amp, (h, w)))
    img = np.stack(planes, axis=-1)
    # a few hard edges and saturated blocks so clamping in the resampler is exercised
    img[h // 4: h // 4 + max(1, h // 8), :, 0] = 255
    img[:, w // 3: w // 3 + max(1, w // 10), min(1, channels - 1)] = 0
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def formula_image(h, w):
    # procedural, rebuilt bit for bit by the C++ test (no input file): a large image for a strong downscale
    y = np.arange(h, dtype=np.int64)[:, None, None]
    x = np.arange(w, dtype=np.int64)[None, :, None]
    c = np.arange(3, dtype=np.int64)[None, None, :]
    return (((x * 3 + y * 2 + c * 85) // 16 + ((x ^ y) & 15) * 4) & 255).astype(np.uint8)


def save_png(arr, path, mode):
    PIL.Image.fromarray(arr, mode=mode).save(path, optimize=True)


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)

    inputs = {}
    inputs["rgb_640x480"] = (smooth_noise(640, 480, 1, amp=0.0), "RGB")   # about 1.3x downscale at 70 tokens
    inputs["rgb_37x53"] = (smooth_noise(37, 53, 2), "RGB")           # small: upscaled
    inputs["wide_20x700"] = (smooth_noise(20, 700, 3), "RGB")        # extreme aspect ratio
    inputs["tall_900x12"] = (smooth_noise(900, 12, 4), "RGB")        # width rounds to 0 at 70 tokens
    inputs["vonly_1500x48"] = (smooth_noise(1500, 48, 8, amp=0.0), "RGB")  # width kept: vertical pass only
    inputs["honly_48x1500"] = (smooth_noise(48, 1500, 9, amp=0.0), "RGB")  # height kept: horizontal pass only
    rgba = smooth_noise(64, 80, 6, channels=4)
    rgba[:, :8, 3] = 0
    rgba[:, 8:16, 3] = 255
    inputs["rgba_64x80"] = (rgba, "RGBA")
    inputs["grey_50x90"] = (smooth_noise(50, 90, 7, channels=1)[..., 0], "L")
    for name, (arr, mode) in inputs.items():
        save_png(arr, os.path.join(OUT, name + ".png"), mode)

    # every (value, alpha) pair: R = value, G = 255 - value, B = value * 7 mod 256, A = alpha
    v = np.arange(256, dtype=np.int64)
    table = np.zeros((256, 256, 4), dtype=np.uint8)
    table[:, :, 0] = v[None, :]
    table[:, :, 1] = 255 - v[None, :]
    table[:, :, 2] = (v[None, :] * 7) % 256
    table[:, :, 3] = v[:, None]
    save_png(table, os.path.join(OUT, "alpha_table.png"), "RGBA")

    scale = np.float32(1.0 / 255.0)
    cases = []
    runs = [(name, tokens) for name in inputs for tokens in ((70, 280) if name in TWO_BUDGETS else (70,))]
    runs.append(("formula_2400x3200", 70))   # about 7x downscale; input made by formula_image, not stored
    for name, tokens in runs:
        proc = Gemma4ImageProcessor(max_soft_tokens=tokens)
        if name.startswith("formula_"):
            pil = PIL.Image.fromarray(formula_image(2400, 3200), mode="RGB")
        else:
            pil = PIL.Image.open(os.path.join(OUT, name + ".png"))
        out = proc(images=pil, return_tensors="pt")
        pv = out["pixel_values"][0].numpy()            # [max_patches, 3*16*16]
        pos = out["image_position_ids"][0].numpy()     # [max_patches, 2]
        n_soft = int(out["num_soft_tokens_per_image"][0])
        in_h, in_w = pil.height, pil.width
        oh, ow = get_aspect_ratio_preserving_size(in_h, in_w, PATCH, tokens * POOL * POOL, POOL)
        gh, gw = oh // PATCH, ow // PATCH
        n = gh * gw
        assert n_soft == n // (POOL * POOL), (name, tokens)
        assert (pos[n:] == -1).all() and (pv[n:] == 0).all()
        real = pv[:n].reshape(gh, gw, PATCH, PATCH, 3).transpose(0, 2, 1, 3, 4).reshape(oh, ow, 3)
        u8 = np.rint(real * 255.0).astype(np.int64)
        assert u8.min() >= 0 and u8.max() <= 255
        u8 = u8.astype(np.uint8)
        recon = u8.astype(np.float32) * scale
        assert np.array_equal(recon.view(np.uint32), real.astype(np.float32).view(np.uint32)), (name, tokens)
        stem = f"{name}_t{tokens}"
        save_png(u8, os.path.join(OUT, stem + ".resized.png"), "RGB")
        pos[:n].astype("<i4").tofile(os.path.join(OUT, stem + ".pos.bin"))
        cases.append(dict(image=name + ".png" if not name.startswith("formula_") else name, max_soft_tokens=tokens, in_h=in_h, in_w=in_w,
                          out_h=oh, out_w=ow, grid_h=gh, grid_w=gw, n_patches=n, n_soft=n_soft,
                          resized=stem + ".resized.png", pos=stem + ".pos.bin"))

    layout_inputs = [(300, 420), (420, 300), (37, 53), (20, 700), (700, 20), (900, 12), (12, 900), (1, 1),
                     (1, 10000), (10000, 1), (2, 3000), (3000, 2), (48, 48), (96, 144), (144, 96), (3000, 4000),
                     (4000, 3000), (1080, 1920), (768, 768), (5, 7), (17, 4096), (4096, 17), (224, 224),
                     (480, 640), (100, 4800), (4800, 100), (33, 1000), (1000, 33)]
    layouts = []
    for tokens in (70, 140, 280, 560, 1120):
        for h, w in layout_inputs:
            oh, ow = get_aspect_ratio_preserving_size(h, w, PATCH, tokens * POOL * POOL, POOL)
            layouts.append(dict(in_h=h, in_w=w, max_soft_tokens=tokens, out_h=oh, out_w=ow))

    import transformers
    manifest = dict(generator="tools/make_image_fixtures.py", transformers=transformers.__version__,
                    patch=PATCH, pool=POOL,
                    note="pixel_values are float32(u8) * float32(1/255) of the .resized.png images (asserted)",
                    cases=cases, layouts=layouts)
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    total = sum(os.path.getsize(os.path.join(OUT, p)) for p in os.listdir(OUT))
    print(f"wrote {len(cases)} cases, {len(layouts)} layouts, {total} bytes to {OUT}")


if __name__ == "__main__":
    sys.exit(main())
