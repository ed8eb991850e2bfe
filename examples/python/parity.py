"""Parity check from Python: a checkpoint (+ PEFT adapter) run by transformers + PEFT and by g4, compared.

The check to run before trusting g4 with a fine-tune: the same token ids go through the Hugging Face model
(float32, eager attention, the adapter loaded with PeftModel, not merged) and through g4.compile + g4.Plan;
the script prints the logits' relative L2 difference, their largest absolute difference, the top-1 agreement
over the prompt, and whether greedy decoding gives the same tokens. It exits 1 when the logits differ by
more than --max-rel or the greedy tokens differ (checked by default for --weights f32, at 1e-4; lossy
plans are only reported unless --max-rel is given).

    pip install .            # the g4 package; torch, transformers and peft installed
    python examples/python/parity.py --model my-gemma --adapter my-adapter --prompt "Hello"
    python examples/python/parity.py --model tests/fixtures/e2b_tiny --adapter tests/fixtures/adapters/e2b_lora
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

import numpy as np


def hf_model(model_dir: str, adapter_dir: str | None) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kind = AutoConfig.from_pretrained(model_dir).model_type
    if kind in ("gemma4", "gemma3n"):
        from transformers import Gemma4ForConditionalGeneration as Model
    else:
        Model = AutoModelForCausalLM
    m = Model.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    if adapter_dir:
        from peft import PeftModel

        m = PeftModel.from_pretrained(m, adapter_dir).eval()
    return m


def hf_logits(model: Any, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        x = torch.tensor([ids], dtype=torch.long)
        return model(input_ids=x, use_cache=False).logits[0].float().numpy()


def hf_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    seq = list(ids)
    for _ in range(n):
        seq.append(int(hf_logits(model, seq)[-1].argmax()))
    return seq[len(ids) :]


def run_parity(
    model_dir: str,
    adapter_dir: str | None,
    prompt: str | list[int],
    *,
    weights: str = "f32",
    new_tokens: int = 16,
    workdir: str | None = None,
    fidelity: bool = True,
) -> dict[str, Any]:
    """Runs both and returns the figures (see the module docstring)."""
    import g4

    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        plan_path, report = g4.compile(
            model_dir, adapter_dir, out=os.path.join(tmp, "parity.g4plan"), weights=weights, fidelity=fidelity
        )
        plan = g4.Plan(plan_path)
        ids = plan.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        s = plan.session()
        ours = s.append(ids, all_logits=True)
        s.reset()
        s.append(ids)
        s.generate(None, max_new_tokens=new_tokens, temperature=0, ignore_eos=True)
        g4_greedy = s.last.token_ids

    model = hf_model(model_dir, adapter_dir)
    ref = hf_logits(model, ids)
    ref_greedy = hf_greedy(model, ids, new_tokens)
    diff = ours.astype(np.float64) - ref.astype(np.float64)
    return {
        "model": model_dir,
        "adapter": adapter_dir,
        "weights": weights,
        "prompt_tokens": len(ids),
        "rel_l2": float(np.linalg.norm(diff) / max(np.linalg.norm(ref), 1e-300)),
        "max_abs": float(np.abs(diff).max()),
        "top1_agree": int((ours.argmax(-1) == ref.argmax(-1)).sum()),
        "greedy_g4": g4_greedy,
        "greedy_hf": ref_greedy,
        "greedy_match": g4_greedy == ref_greedy,
        "compile_fidelity": report["fidelity"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint directory (save_pretrained)")
    ap.add_argument("--adapter", help="PEFT adapter directory")
    ap.add_argument("--prompt", default="The capital of France is", help="text, or comma-separated token ids")
    ap.add_argument("--weights", default="f32", help="g4 plan weights: f32 | bf16 | nf4")
    ap.add_argument("--new-tokens", type=int, default=16, help="greedy tokens compared")
    ap.add_argument("--max-rel", type=float, help="largest relative L2 logit difference accepted")
    ap.add_argument("--no-fidelity", action="store_true", help="skip g4's own fidelity measurement at compile")
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args()
    prompt: str | list[int] = a.prompt
    if all(p.strip().isdigit() for p in a.prompt.split(",")):
        prompt = [int(p) for p in a.prompt.split(",")]
    r = run_parity(
        a.model, a.adapter, prompt, weights=a.weights, new_tokens=a.new_tokens, fidelity=not a.no_fidelity
    )
    print(
        f"{a.model}{' + ' + a.adapter if a.adapter else ''} ({a.weights} plan, {r['prompt_tokens']} prompt tokens): "
        f"logits rel L2 {r['rel_l2']:.3e}, max abs {r['max_abs']:.3e}, top-1 {r['top1_agree']}/{r['prompt_tokens']}; "
        f"greedy {a.new_tokens} tokens {'identical' if r['greedy_match'] else 'DIFFER'}"
    )
    if not r["greedy_match"]:
        print(f"  g4 {r['greedy_g4']}\n  hf {r['greedy_hf']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    max_rel = a.max_rel if a.max_rel is not None else (1e-4 if a.weights == "f32" else None)
    ok = max_rel is None or (r["greedy_match"] and r["rel_l2"] <= max_rel)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
