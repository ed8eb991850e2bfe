#!/usr/bin/env python3
"""make_long_context_fixture.py - HF reference for a long prompt (8200 tokens) on e2b_tiny.

RoPE does not depend on max_position_embeddings, so e2b_tiny's weights run at long positions once
the config allows them. Writes tests/fixtures/e2b_tiny/reference/long_context.json with the prompt
seed, the float32 logits of the last 8 prompt positions (as a list) and 8 greedy tokens.
Usage: python tools/make_long_context_fixture.py [--out tests/fixtures]
"""
import argparse, json, os, random

import torch
from transformers import AutoConfig, Gemma4ForConditionalGeneration

ap = argparse.ArgumentParser()
ap.add_argument("--out", default="tests/fixtures")
args = ap.parse_args()
src = os.path.join(args.out, "e2b_tiny")
cfg = AutoConfig.from_pretrained(src)
cfg.text_config.max_position_embeddings = 16384
model = Gemma4ForConditionalGeneration.from_pretrained(src, config=cfg, dtype=torch.float32, attn_implementation="eager").eval()
rng = random.Random(8200)
ids = [2] + [rng.randrange(3, 512) for _ in range(8199)]
with torch.no_grad():
    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    logits = out.logits[0, -8:].float()
    past, seq = out.past_key_values, []
    nxt = int(out.logits[0, -1].argmax())
    for _ in range(8):
        seq.append(nxt)
        o = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
        past, nxt = o.past_key_values, int(o.logits[0, -1].argmax())
ref = {"note": "e2b_tiny with max_position_embeddings 16384; prompt = [2] + 8199 ids from random.Random(8200).randrange(3, 512)",
       "prompt_len": len(ids), "prompt": ids, "last_logits": [[round(float(v), 6) for v in row] for row in logits], "greedy": seq}
json.dump(ref, open(os.path.join(src, "reference", "long_context.json"), "w"))
print("greedy", seq, "logits std", float(logits.std()))
