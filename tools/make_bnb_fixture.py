#!/usr/bin/env python3
"""make_bnb_fixture.py - a pre-quantized bitsandbytes 4-bit (NF4, double quant) base checkpoint.

Takes tests/fixtures/e2b_tiny, replaces every text-decoder attention/MLP projection weight by its
bitsandbytes serialized NF4 form (packed uint8 weight, absmax, quant_map, nested_absmax,
nested_quant_map, quant_state.bitsandbytes__nf4) computed with tools/nf4_ref.py (bnb's reference
math, checked against the bitsandbytes wheel), adds quantization_config to config.json, and writes
HF float32 reference logits/greedy tokens of the model whose projections are the dequantized
values. Output: tests/fixtures/e2b_tiny_bnb4/.
Usage: python tools/make_bnb_fixture.py [--out tests/fixtures]
"""
import argparse, json, os, re, shutil, sys

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nf4_ref  # noqa: E402

PROJ = re.compile(r"^model\.language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.weight$")


def bf16_to_f32(a):
    return (a.astype(np.uint32) << 16).view(np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures")
    args = ap.parse_args()
    src = os.path.join(args.out, "e2b_tiny")
    dst = os.path.join(args.out, "e2b_tiny_bnb4")
    os.makedirs(os.path.join(dst, "reference"), exist_ok=True)

    from safetensors import safe_open
    tensors, dequant = {}, {}
    with safe_open(os.path.join(src, "model.safetensors"), "pt") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            if PROJ.match(name):
                w = t.float().numpy()
                q = nf4_ref.quantize(w, double_quant=True)
                for suffix, (arr, _dt) in nf4_ref.to_bnb_state(q, dtype="bfloat16").items():
                    tensors[name + suffix] = torch.from_numpy(np.ascontiguousarray(arr))
                dequant[name] = torch.from_numpy(nf4_ref.dequantize(q).reshape(w.shape))
            else:
                tensors[name] = t
    from safetensors.torch import save_file as save_pt
    save_pt(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                  "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16",
                                  "bnb_4bit_quant_storage": "uint8",
                                  "llm_int8_skip_modules": ["embed_tokens", "embed_tokens_per_layer", "vision_tower",
                                                            "audio_tower", "embed_vision", "embed_audio", "per_layer"]}
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    shutil.copy(os.path.join(src, "generation_config.json"), dst)

    # Reference: HF float32 with the projections replaced by their dequantized NF4 values.
    from transformers import Gemma4ForConditionalGeneration
    model = Gemma4ForConditionalGeneration.from_pretrained(src, dtype=torch.float32, attn_implementation="eager").eval()
    sd = model.state_dict()
    with torch.no_grad():
        for name, w in dequant.items():
            if name in sd:   # KV-shared layers' k/v are in the checkpoint but not in the HF module
                sd[name].copy_(w)
    ref = json.load(open(os.path.join(src, "reference", "reference.json")))
    out = {"base": "e2b_tiny", "note": "HF float32 with NF4 (double quant) dequantized projections", "prompts": []}
    for p in ref["prompts"]:
        ids = torch.tensor([p["ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float().numpy()
        fn = p["name"] + ".logits.f32"
        logits.astype("<f4").tofile(os.path.join(dst, "reference", fn))
        seq = list(p["ids"])
        for _ in range(16):
            with torch.no_grad():
                nxt = int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
            seq.append(nxt)
        out["prompts"].append({"name": p["name"], "ids": p["ids"], "logits": fn, "greedy": seq[len(p["ids"]):],
                               "vocab_size": int(logits.shape[-1])})
    json.dump(out, open(os.path.join(dst, "reference", "reference.json"), "w"), indent=1)
    print("wrote", dst, sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(dst) for f in fs), "bytes")


if __name__ == "__main__":
    main()
