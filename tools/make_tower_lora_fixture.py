#!/usr/bin/env python3
"""make_tower_lora_fixture.py - the image prompt of tests/fixtures/towers/vision (meta.json "e2e") through
Hugging Face's float32 model with the PEFT adapter tests/fixtures/adapters/e2b_tower_linear loaded (LoRA on
the vision tower's q_proj.linear, the inner nn.Linear of Gemma4ClippableLinear, and on the text q_proj):
tests/fixtures/towers/vision/e2e_tower_lora_logits.f32, float32 [T, vocab], every position. g4 merges the
tower modules into the tower's weights at compile time (Media.TowerLoraMatchesPeft).

The pixels are the fixture's img0 rows (u8 / 255, exactly HF's pixel_values); no image library needed.
Usage: python3 tools/make_tower_lora_fixture.py
"""
import json
import os

import numpy as np
import torch
from peft import PeftModel
from transformers import Gemma4ForConditionalGeneration

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
VIS = os.path.join(ROOT, "towers", "vision")


def main():
    meta = json.load(open(os.path.join(VIS, "meta.json")))
    e2e = meta["e2e"]
    img = next(i for i in meta["images"] if i["name"] == e2e["image"])
    n = img["n_patches"]
    u8 = np.fromfile(os.path.join(VIS, img["pixels"]["file"]), dtype=np.uint8).reshape(n, -1)
    pos = np.fromfile(os.path.join(VIS, img["pos"]["file"]), dtype=np.int32).reshape(n, 2)
    pv = torch.from_numpy((u8.astype(np.float64) * (1.0 / 255.0)).astype(np.float32))[None]
    pos_t = torch.from_numpy(pos.astype(np.int64))[None]
    ids = torch.tensor([e2e["ids"]], dtype=torch.long)

    base = Gemma4ForConditionalGeneration.from_pretrained(os.path.join(ROOT, "e2b_tiny"), attn_implementation="eager").float().eval()
    with torch.no_grad():
        plain = base(input_ids=ids, pixel_values=pv, image_position_ids=pos_t).logits[0]
    model = PeftModel.from_pretrained(base, os.path.join(ROOT, "adapters", "e2b_tower_linear")).float().eval()
    tower_modules = [n for n, _ in model.named_modules() if "vision_tower" in n and n.endswith("q_proj.linear.lora_A")]
    assert tower_modules, "the adapter put no LoRA on the vision tower"
    with torch.no_grad():
        logits = model(input_ids=ids, pixel_values=pv, image_position_ids=pos_t).logits[0]
    moved = float((logits - plain).norm() / plain.norm())
    # The tower's share: the same adapter with the tower modules' LoRA switched off.
    for name, mod in model.named_modules():
        if "vision_tower" in name and hasattr(mod, "scaling") and isinstance(mod.scaling, dict):
            for k in mod.scaling:
                mod.scaling[k] = 0.0
    with torch.no_grad():
        text_only = model(input_ids=ids, pixel_values=pv, image_position_ids=pos_t).logits[0]
    tower = float((logits - text_only).norm() / text_only.norm())
    assert moved > 1e-3 and tower > 1e-3, f"the adapter barely changes the logits ({moved}, tower part {tower})"
    out = os.path.join(VIS, "e2e_tower_lora_logits.f32")
    logits.numpy().astype(np.float32).tofile(out)
    with open(os.path.join(VIS, "e2e_tower_lora.json"), "w") as f:
        json.dump({"generator": "tools/make_tower_lora_fixture.py", "adapter": "adapters/e2b_tower_linear",
                   "logits": "e2e_tower_lora_logits.f32", "shape": list(logits.shape), "adapter_effect_rel_l2": moved,
                   "tower_lora_effect_rel_l2": tower}, f, indent=1)
    print(f"{out}: {tuple(logits.shape)}; LoRA on {len(tower_modules)} tower modules; the adapter moves the logits by "
          f"{moved:.3e}, its tower modules alone by {tower:.3e} (rel L2)")


if __name__ == "__main__":
    main()
