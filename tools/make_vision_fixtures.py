#!/usr/bin/env python3
"""make_vision_fixtures.py - Hugging Face reference numbers for g4's CPU vision tower.

Loads tests/fixtures/e2b_tiny (Gemma4ForConditionalGeneration, run in float32, eager attention),
makes two deterministic smooth RGB images, runs HF's Gemma 4 image processor on them and then
model.get_image_features(), and writes under tests/fixtures/towers/vision/:

  img<i>_pixels.u8    uint8 [n_real, 3*16*16]: the real (unpadded) rows of HF's pixel_values times
                      255. HF's rows are exactly float32(float64(u8) * (1/255)) (checked below), so the
                      test rebuilds them bit for bit; stored as bytes to keep the fixture small.
  img<i>_pos.i32      int32 [n_real, 2]: HF image_position_ids (x, y) of the real rows.
  img<i>_pooled.f32   float32 [n_soft, vision hidden]: HF vision_tower output (pooled, * sqrt(hidden)).
  img<i>_out.f32      float32 [n_soft, text hidden]: HF get_image_features() pooler_output (after
                      embed_vision).
  e2e_ids.i32         int32 [T]: a prompt with one image (img0) in it.
  e2e_logits.f32      float32 [T, vocab]: HF float32 full forward (input_ids + pixel_values +
                      image_position_ids), final softcapped logits at every position.
  meta.json           shapes, ids, and notes.

The tiny checkpoint's vision config has position_embedding_size 64 (patch positions 0..63), so
images are at most 1024 px a side. max_soft_tokens = 70 (max_patches 630), the smallest budget HF
accepts. img0 (384x384) is not resized and has 576 patches, padded by HF to 630; img1 (480x336, HxW,
portrait) is not resized and fills all 630 patches (no padding). The resize itself is the image
preprocessing's business (another test); these inputs start from pixel_values.

The end-to-end prompt: the tiny vocab has 512 ids, so boi (255999) and eoi (258882) cannot be
embedded; they are replaced by the in-vocab stand-ins BOI_STANDIN / EOI_STANDIN below. The image
placeholder id 258880 is used as is: HF (Gemma4Model.forward) replaces every image/video/audio
placeholder id by pad_token_id (0) before the main embedding lookup and before the per-layer (PLE)
token lookup, uses the pad row's scaled embedding as the PLE context input at those positions, and
then overwrites the main embeddings at those positions with the image features (unscaled). This
script checks that by recording the ids the embedding modules receive.

Usage: python3 tools/make_vision_fixtures.py   (deterministic: fixed numpy seeds, no sampling)
"""

import json
import os

import numpy as np
import torch
from transformers import Gemma4ForConditionalGeneration
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CKPT = os.path.join(ROOT, "tests", "fixtures", "e2b_tiny")
OUT = os.path.join(ROOT, "tests", "fixtures", "towers", "vision")

MAX_SOFT_TOKENS = 70
BOI_STANDIN = 300   # stands for <|image> (255999), outside the tiny vocab
EOI_STANDIN = 301   # stands for <image|> (258882)


def smooth_image(h, w, seed):
    """uint8 [h, w, 3]: a few random low-frequency waves plus a gradient and mild noise."""
    rng = np.random.default_rng(seed)
    y, x = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
    img = np.zeros((h, w, 3))
    for c in range(3):
        acc = 0.5 + 0.3 * (rng.uniform(-1, 1) * x + rng.uniform(-1, 1) * y)
        for _ in range(4):
            fx, fy = rng.uniform(0.5, 6, size=2)
            ph = rng.uniform(0, 2 * np.pi)
            acc += rng.uniform(0.05, 0.2) * np.sin(2 * np.pi * (fx * x + fy * y) + ph)
        img[..., c] = acc
    img += rng.normal(0, 0.02, size=img.shape)
    return np.clip(np.round(img * 255), 0, 255).astype(np.uint8)


def write(name, arr):
    arr = np.ascontiguousarray(arr)
    assert arr.dtype in (np.float32, np.int32, np.uint8), arr.dtype
    arr.astype(arr.dtype.newbyteorder("<")).tofile(os.path.join(OUT, name))
    return {"file": name, "dtype": {np.float32: "f32", np.int32: "i32", np.uint8: "u8"}[arr.dtype.type],
            "shape": list(arr.shape)}


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration.from_pretrained(CKPT, attn_implementation="eager").float().eval()
    cfg = model.config
    vcfg = cfg.vision_config
    proc = Gemma4ImageProcessorPil(max_soft_tokens=MAX_SOFT_TOKENS)
    k = vcfg.pooling_kernel_size
    max_patches = MAX_SOFT_TOKENS * k * k

    meta = {
        "generator": "tools/make_vision_fixtures.py",
        "checkpoint": "tests/fixtures/e2b_tiny",
        "dtype": "float32 (model.float(), eager attention)",
        "max_soft_tokens": MAX_SOFT_TOKENS,
        "max_patches": max_patches,
        "pixels_note": "pixel = float32(float64(u8) * (1.0/255.0)), bit-exact to HF pixel_values",
        "images": [],
    }

    images = [("img0", smooth_image(384, 384, 1234)), ("img1", smooth_image(480, 336, 5678))]
    hf_inputs = {}
    for name, img in images:
        feats = proc(images=[img], return_tensors="pt")
        pv = feats["pixel_values"][0].float()            # [max_patches, 768]
        pos = feats["image_position_ids"][0].to(torch.int32)   # [max_patches, 2]
        assert pv.shape[0] == max_patches
        real = (pos != -1).all(dim=-1)
        n_real = int(real.sum())
        assert bool(real[:n_real].all()) and not bool(real[n_real:].any()), "padding must be trailing"
        u8 = np.round(pv[:n_real].numpy().astype(np.float64) * 255.0).astype(np.uint8)
        rebuilt = (u8.astype(np.float64) * (1.0 / 255.0)).astype(np.float32)
        assert np.array_equal(rebuilt, pv[:n_real].numpy()), "pixel_values are not u8/255 exactly"
        assert not pv[n_real:].any()

        with torch.no_grad():
            res = model.get_image_features(pv[None], pos[None].long(), return_dict=True)
            pooled = res.last_hidden_state                  # [n_soft, vision hidden]
            out = res.pooler_output[0]                      # [n_soft, text hidden]
        n_soft = int(feats["num_soft_tokens_per_image"][0])
        assert out.shape[0] == n_soft == n_real // (k * k)
        gw, gh = int(pos[:n_real, 0].max()) + 1, int(pos[:n_real, 1].max()) + 1
        entry = {
            "name": name, "image_hw": list(img.shape[:2]), "n_patches": n_real, "grid_w": gw, "grid_h": gh,
            "n_soft": n_soft, "padded_by_hf": n_real < max_patches,
            "pixels": write(f"{name}_pixels.u8", u8),
            "pos": write(f"{name}_pos.i32", pos[:n_real].numpy()),
            "pooled": write(f"{name}_pooled.f32", pooled.numpy().astype(np.float32)),
            "out": write(f"{name}_out.f32", out.numpy().astype(np.float32)),
        }
        meta["images"].append(entry)
        hf_inputs[name] = (pv, pos, n_soft)
        print(f"{name}: {img.shape[:2]} -> {n_real} patches ({gw}x{gh}), {n_soft} soft tokens, "
              f"out rms {out.pow(2).mean().sqrt():.4f}")

    # End-to-end: [bos, text, boi*, n x image, eoi*, text] with img0.
    pv, pos, n_soft = hf_inputs["img0"]
    ids = [2, 17, 123, 456, BOI_STANDIN] + [cfg.image_token_id] * n_soft + [EOI_STANDIN, 77, 310, 9]
    input_ids = torch.tensor([ids], dtype=torch.long)

    seen = {}
    lm = model.model.language_model
    h1 = lm.embed_tokens.register_forward_hook(lambda m, a, o: seen.__setitem__("embed", a[0].clone()))
    h2 = lm.embed_tokens_per_layer.register_forward_hook(lambda m, a, o: seen.__setitem__("ple", a[0].clone()))
    with torch.no_grad():
        logits = model(input_ids=input_ids, pixel_values=pv[None], image_position_ids=pos[None].long()).logits[0]
    h1.remove()
    h2.remove()
    is_img = input_ids[0] == cfg.image_token_id
    for key in ("embed", "ple"):
        got = seen[key][0]
        assert bool((got[is_img] == cfg.text_config.pad_token_id).all()), f"{key}: placeholders not padded"
        assert bool((got[~is_img] == input_ids[0][~is_img]).all()), f"{key}: text ids changed"
    assert torch.isfinite(logits).all()
    meta["e2e"] = {
        "image": "img0",
        "n_soft": n_soft,
        "ids": ids,
        "boi_standin": BOI_STANDIN,
        "eoi_standin": EOI_STANDIN,
        "image_token_id": cfg.image_token_id,
        "pad_token_id": cfg.text_config.pad_token_id,
        "ids_file": write("e2e_ids.i32", np.array(ids, dtype=np.int32)),
        "logits": write("e2e_logits.f32", logits.numpy().astype(np.float32)),
        "note": ("boi 255999 / eoi 258882 are outside the tiny 512-id vocab and replaced by the stand-ins; "
                 "image_token_id 258880 is kept: HF swaps every placeholder id for pad_token_id before the "
                 "main and per-layer embedding lookups (verified with hooks), feeds the pad row's scaled "
                 "embedding to the PLE projection there, then overwrites the main embeddings at those "
                 "positions with get_image_features rows in order. The text attention is causal throughout "
                 "(text_config.use_bidirectional_attention is null in this checkpoint)."),
    }
    print(f"e2e: T={len(ids)} logits {tuple(logits.shape)}")
    with open(os.path.join(OUT, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
