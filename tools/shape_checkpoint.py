#!/usr/bin/env python3
"""shape_checkpoint.py - a header-only Gemma 4 text checkpoint at the real E2B or E4B shapes: config.json
and one model.safetensors whose header lists every tensor (bf16) and whose data is a sparse hole (no
disk used, nothing readable). Enough for `g4 compile --dry-run`, which sizes a plan from the config and
the headers without reading a weight, so memory plans at real shapes can be checked on any machine.
Usage: python3 tools/shape_checkpoint.py e2b|e4b OUT_DIR
"""
import json, os, struct, sys

import torch
from transformers import Gemma4ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemma4_shapes import text_config  # noqa: E402

if len(sys.argv) != 3 or sys.argv[1] not in ("e2b", "e4b"):
    sys.exit(__doc__)
cfg = text_config(sys.argv[1])
with torch.device("meta"):
    model = Gemma4ForCausalLM(cfg)
os.makedirs(sys.argv[2], exist_ok=True)
cfg.save_pretrained(sys.argv[2])
header, off = {}, 0
for name, t in model.state_dict().items():
    header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [off, off + 2 * t.numel()]}
    off += 2 * t.numel()
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
path = os.path.join(sys.argv[2], "model.safetensors")
with open(path + ".tmp", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    f.truncate(8 + len(h) + off)
os.replace(path + ".tmp", path)
print(f"{path}: {len(header)} tensors, {off / 2**30:.2f} GiB of bf16 (sparse)")
