#!/usr/bin/env python3
"""make_adapter_fixtures.py - build the PEFT LoRA adapter test fixtures for g4.

For the committed tiny checkpoints tests/fixtures/e2b_tiny and tests/fixtures/e4b_tiny this
creates random PEFT adapters (LoRA A *and* B random and non-zero, scaled so that the adapter
changes the logits by ~15% relative L2), saved with PeftModel.save_pretrained (safetensors),
under tests/fixtures/adapters/<name>/:

  e2b_lora              LoRA r=8 alpha=16 on q,k,v,o,gate,up,down of the text decoder (list
                        target_modules + exclude_modules for the towers). transformers has no
                        k_proj/v_proj modules on the KV-shared layers 6..9, so PEFT creates none; a
                        lora_A/lora_B pair for layers.7.self_attn.k_proj is hand-added to the file
                        (HF ignores it: "dropped, no effect" path). Stored float32.
  e2b_rslora_patterns   use_rslora, rank_pattern / alpha_pattern (first-match-wins and anchoring
                        cases), regex-string target_modules.
  e2b_dora              use_dora (magnitude vectors randomised too).
  e2b_modules_to_save   modules_to_save=["embed_tokens"] + LoRA on o_proj, default
                        ensure_weight_tying=False: PEFT saves only the embedding copy; HF uses it for
                        the input embedding while the (tied) LM head keeps the ORIGINAL weights.
                        Stored bfloat16.
  e2b_modules_to_save_tied  the same with ensure_weight_tying=True: PEFT saves embed_tokens.weight and
                        lm_head.weight (equal); the head follows the new embedding. Stored bfloat16.
  e2b_tower_linear      LoRA on the vision tower's q_proj.linear (Gemma4ClippableLinear inner
                        linear) plus the text q_proj (regex target_modules).
  e4b_lora              LoRA r=4 alpha=8 on all text projections of e4b_tiny. Stored bfloat16.
  bad_shape             e2b adapter whose lora_B of layers.1.self_attn.o_proj has out dim 96 (not 64).
  bad_peft_type         a real IA3 adapter (peft_type "IA3").
  bin_only              adapter_config.json + adapter_model.bin (safe_serialization=False).
  pissa                 LoRA with init_lora_weights="pissa" (changes the base weights).

Every good adapter gets reference/:
  reference.json   {"base", "prompts": [{"name", "ids" (same as the base fixture), "logits",
                   "greedy", "nf4_logits", "nf4_greedy", ...}], "modules": [{module, r, alpha,
                   scale, dora, has_bias}] as PEFT resolved them, "merged": "merged.safetensors",
                   "merged_tensors": [...], "replacements": [...], "extra_modules": [...]}
  <p>.logits.f32   HF PeftModel (adapter loaded, NOT merged), float32, eager attention; raw
                   little-endian float32 [len(ids), 512], every position.
  <p>.nf4.logits.f32  the adapter merged in fp32 (merge_and_unload), then every text-decoder
                   q,k,v,o,gate,up,down weight replaced by tools/nf4_ref.nf4_roundtrip(w,
                   double_quant=False) (blocksize 64, fp32 absmax: g4 compile's default), nothing
                   else changed.
  greedy / nf4_greedy  16 argmax tokens from a manual full-recompute loop (no EOS stop).
  merged.safetensors   float32 merged weights (PEFT merge_and_unload in fp32) of a few modules,
                   under the base checkpoint's tensor names.

The script also checks, for every merged module, that PEFT's merged weight equals the formula g4
implements (W + scale*B@A; DoRA: m/||W + scale*B@A||_row * (W + scale*B@A)) from the saved file.

Usage:  python tools/make_adapter_fixtures.py [--fixtures tests/fixtures]
Deterministic: all randomness comes from fixed seeds.
"""

import argparse
import json
import math
import os
import re
import shutil
import sys
import warnings

import numpy as np
import peft
import torch
import transformers
from peft import IA3Config, LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from peft.utils import ModulesToSaveWrapper
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import Gemma4ForConditionalGeneration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nf4_ref import nf4_roundtrip  # noqa: E402

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()

VOCAB = 512
N_GREEDY = 16
TARGET_REL = 0.15  # target relative L2 change of the logits (long prompt, all positions)
PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOWERS = r".*(vision_tower|audio_tower).*"
NF4_RE = re.compile(r"^model\.language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)\.weight$")
LM = "model.language_model."
NF4_DOUBLE_QUANT = False  # g4 compile's default (fp32 absmax per 64-block); --double-quant is not covered here

FIX = None  # set in main


# ----------------------------------------------------------------------------
# models and references
# ----------------------------------------------------------------------------


def load_base(base):
    m = Gemma4ForConditionalGeneration.from_pretrained(
        os.path.join(FIX, base), dtype=torch.float32, attn_implementation="eager"
    )
    return m.eval()


def base_prompts(base):
    with open(os.path.join(FIX, base, "reference", "reference.json")) as f:
        ref = json.load(f)
    return [(p["name"], p["ids"]) for p in ref["prompts"]]


def base_logits(base, name):
    return torch.from_numpy(
        np.fromfile(os.path.join(FIX, base, "reference", f"{name}.logits.f32"), dtype="<f4").reshape(-1, VOCAB)
    )


@torch.no_grad()
def full_logits(model, ids):
    x = torch.tensor([ids], dtype=torch.long)
    return model(input_ids=x, use_cache=False).logits[0].float()


@torch.no_grad()
def greedy_manual(model, ids, n=N_GREEDY):
    seq, margins = list(ids), []
    for _ in range(n):
        last = full_logits(model, seq)[-1]
        top2 = last.topk(2).values
        margins.append(round(float(top2[0] - top2[1]), 5))
        seq.append(int(last.argmax()))
    return seq[len(ids):], margins


def rel(a, b):
    return float((a - b).norm() / b.norm())


# ----------------------------------------------------------------------------
# randomising a fresh PEFT adapter (PEFT initialises B = 0)
# ----------------------------------------------------------------------------


def lora_layers(pm):
    return sorted(
        [(n, m) for n, m in pm.named_modules() if isinstance(m, LoraLayer) and "default" in m.lora_A],
        key=lambda x: x[0],
    )


def mts_wrappers(pm):
    return sorted([(n, m) for n, m in pm.named_modules() if isinstance(m, ModulesToSaveWrapper)], key=lambda x: x[0])


class Randomizer:
    """Unit-scale random A, B (and DoRA magnitude / modules_to_save noise); set(f) scales them so
    that every targeted weight changes by ~f relative."""

    def __init__(self, pm, seed):
        self.pm = pm
        g = torch.Generator().manual_seed(seed)
        self.units = []
        for name, m in lora_layers(pm):
            A, B = m.lora_A["default"].weight, m.lora_B["default"].weight
            r, fin = A.shape
            s = m.scaling["default"]
            a0 = torch.randn(A.shape, generator=g) / math.sqrt(fin)
            b0 = torch.randn(B.shape, generator=g) / math.sqrt(r) / s
            u = torch.rand(B.shape[0], generator=g) * 2 - 1 if "default" in m.lora_magnitude_vector else None
            self.units.append((m, a0, b0, u))
        self.mts = []
        for name, w in mts_wrappers(pm):
            mod = w.modules_to_save["default"]
            self.mts.append((mod, mod.weight.detach().clone(), torch.randn(mod.weight.shape, generator=g)))

    @torch.no_grad()
    def set(self, f):
        for m, a0, b0, u in self.units:
            m.lora_A["default"].weight.copy_(a0)
            m.lora_B["default"].weight.copy_(f * b0)
            if u is not None:  # DoRA: m = ||W + scale B A||_row * (1 + f/2 * U(-1, 1))
                W = m.get_base_layer().weight
                V = W + m.scaling["default"] * (m.lora_B["default"].weight @ m.lora_A["default"].weight)
                m.lora_magnitude_vector["default"].weight.copy_(V.norm(dim=1) * (1 + 0.5 * f * u))
        for mod, w0, noise in self.mts:
            mod.weight.copy_(w0 + f * w0.std() * noise)

    @torch.no_grad()
    def round_bf16(self):
        for p in self.params():
            p.copy_(p.bfloat16().float())

    def params(self):
        out = []
        for m, *_ in self.units:
            out += [m.lora_A["default"].weight, m.lora_B["default"].weight]
            if "default" in m.lora_magnitude_vector:
                out.append(m.lora_magnitude_vector["default"].weight)
        out += [mod.weight for mod, *_ in self.mts]
        return out


def calibrate(pm, rnd, base, prompts):
    """Scale the random adapter so the logits change by ~TARGET_REL (relative L2, mean over the prompts)."""
    refs = [(ids, base_logits(base, name)) for name, ids in prompts]
    f = 0.1
    for _ in range(4):
        rnd.set(f)
        got = float(np.mean([rel(full_logits(pm, ids), ref) for ids, ref in refs]))
        if abs(got / TARGET_REL - 1) < 0.2:
            break
        f *= TARGET_REL / max(got, 1e-6)
    assert 0.05 <= got <= 0.30, f"calibration failed: rel change {got}"
    return f, got


# ----------------------------------------------------------------------------
# files
# ----------------------------------------------------------------------------


def fresh_dir(path):
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)


def st_path(d):
    return os.path.join(d, "adapter_model.safetensors")


def read_st(path):
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def rewrite_st(path, fn):
    tensors, meta = read_st(path)
    tensors = fn(tensors)
    save_file(dict(sorted(tensors.items())), path, metadata=meta or {"format": "pt"})


def canonical_config(d):
    """PEFT keeps list target_modules (and friends) as Python sets, so their saved order depends on
    the hash seed; sort them (order is meaningless there) so that the fixtures are reproducible."""
    path = os.path.join(d, "adapter_config.json")
    with open(path) as fh:
        cfg = json.load(fh)
    for k in ("target_modules", "exclude_modules", "modules_to_save", "feedforward_modules"):
        if isinstance(cfg.get(k), list):
            cfg[k] = sorted(cfg[k])
    with open(path, "w") as fh:
        fh.write(json.dumps(cfg, indent=2, sort_keys=True))


def to_bf16_file(d):
    rewrite_st(st_path(d), lambda t: {k: v.to(torch.bfloat16) for k, v in t.items()})


def write_logits(path, t):
    arr = t.numpy().astype("<f4")
    arr.tofile(path)


def compact_json(obj):
    text = json.dumps(obj, indent=1)
    return re.sub(r"\[\s+([-0-9.e,\s]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text) + "\n"


# ----------------------------------------------------------------------------
# checks of g4's merge formula against PEFT
# ----------------------------------------------------------------------------


def module_key(name):
    """PEFT module name in the PeftModel -> module name as in the adapter keys."""
    assert name.startswith("base_model.model."), name
    return name[len("base_model.model."):]


def formula_merge(W, A, B, scale, mag=None):
    W, A, B = (x.double() for x in (W, A, B))
    V = W + scale * (B @ A)
    if mag is None:
        return V
    return (mag.double() / V.norm(dim=1))[:, None] * V


def check_formula(base_sd, merged_sd, adapter_file_tensors, modules):
    """Every LoRA module: PEFT's merged weight == g4's formula applied to the saved adapter tensors."""
    worst = 0.0
    for m in modules:
        mod = m["module"]
        A = adapter_file_tensors[f"base_model.model.{mod}.lora_A.weight"].float()
        B = adapter_file_tensors[f"base_model.model.{mod}.lora_B.weight"].float()
        mag = adapter_file_tensors.get(f"base_model.model.{mod}.lora_magnitude_vector")
        if mag is None:
            mag = adapter_file_tensors.get(f"base_model.model.{mod}.lora_magnitude_vector.weight")
        assert (mag is not None) == m["dora"], mod
        W = base_sd[mod + ".weight"]
        want = formula_merge(W, A, B, m["scale"], None if mag is None else mag.float())
        got = merged_sd[mod + ".weight"].double()
        d = float((want - got).abs().max())
        worst = max(worst, d)
        assert d < 2e-6, f"{mod}: PEFT merge differs from the formula by {d}"
    return worst


# ----------------------------------------------------------------------------
# one good adapter
# ----------------------------------------------------------------------------


def make_good(name, base, cfg, seed, merged_pick, bf16=False, post=None, notes=""):
    d = os.path.join(FIX, "adapters", name)
    fresh_dir(d)
    prompts = base_prompts(base)
    torch.manual_seed(seed)
    pm = get_peft_model(load_base(base), cfg).eval()
    rnd = Randomizer(pm, seed)
    f, got = calibrate(pm, rnd, base, prompts)
    if bf16:
        rnd.round_bf16()
    mem_logits = {n: full_logits(pm, ids) for n, ids in prompts}
    pm.save_pretrained(d)
    canonical_config(d)
    assert not os.path.exists(os.path.join(d, "adapter_model.bin"))
    if bf16:
        to_bf16_file(d)
    extra = post(d) if post else []
    with open(os.path.join(d, "README.md"), "w") as fh:
        fh.write(f"PEFT adapter fixture `{name}` for ../../{base} (made by tools/make_adapter_fixtures.py).\n{notes}\n")
    del pm

    # Reference: the adapter as saved, loaded by PEFT onto a fresh fp32 base, not merged.
    base_model = load_base(base)
    base_sd = {k: v.detach().clone() for k, v in base_model.state_dict().items()}
    pm = PeftModel.from_pretrained(base_model, d).eval()
    modules = []
    for n, m in lora_layers(pm):
        modules.append(dict(module=module_key(n), r=int(m.r["default"]), alpha=float(m.lora_alpha["default"]),
                            scale=float(m.scaling["default"]), dora="default" in m.lora_magnitude_vector,
                            has_bias=bool(m.lora_bias["default"])))
    results = []
    for pn, ids in prompts:
        lg = full_logits(pm, ids)
        dm = float((lg - mem_logits[pn]).abs().max())
        assert dm < 1e-5, f"{name}/{pn}: reloaded adapter differs from the in-memory one by {dm}"
        greedy, margins = greedy_manual(pm, ids)
        results.append(dict(name=pn, ids=ids, logits=lg, greedy=greedy, margins=margins,
                            rel=rel(lg, base_logits(base, pn))))

    # fp32 merge (merge_and_unload), checked against the unmerged forward and g4's formula.
    merged = pm.merge_and_unload().eval()
    merged_sd = {k: v.detach().clone() for k, v in merged.state_dict().items()}
    file_tensors, _ = read_st(st_path(d))
    worst = check_formula(base_sd, merged_sd, file_tensors, modules)
    for r in results:
        lm = full_logits(merged, r["ids"])
        tol = 1e-4 * max(1.0, r["logits"].abs().max().item())
        dd = float((lm - r["logits"]).abs().max())
        assert dd < tol, f"{name}/{r['name']}: merged vs unmerged logits differ by {dd}"
    replacements = []
    for k in sorted(file_tensors):
        if ".lora_" not in k:
            tname = k[len("base_model.model."):]
            replacements.append(tname)
            got = merged.get_parameter(tname).detach()
            assert torch.equal(got.float(), file_tensors[k].float()), f"{name}: merged {tname} != saved tensor"
    pick = {}
    for t in merged_pick:
        assert t in merged_sd, t
        assert not torch.equal(merged_sd[t], base_sd[t]), f"{name}: {t} not changed by the merge"
        pick[t] = merged_sd[t].float().contiguous()
    ref_dir = os.path.join(d, "reference")
    os.makedirs(ref_dir, exist_ok=True)
    save_file(pick, os.path.join(ref_dir, "merged.safetensors"), metadata={"format": "pt"})

    # NF4: the fp32-merged model with every text-decoder projection replaced by its NF4 round trip.
    n_q = 0
    with torch.no_grad():
        for pname, p in merged.named_parameters():
            if NF4_RE.match(pname):
                p.copy_(torch.from_numpy(nf4_roundtrip(p.detach().numpy(), double_quant=NF4_DOUBLE_QUANT)))
                n_q += 1
    for r in results:
        r["nf4_logits"] = full_logits(merged, r["ids"])
        r["nf4_greedy"], r["nf4_margins"] = greedy_manual(merged, r["ids"])
        r["nf4_rel"] = rel(r["nf4_logits"], r["logits"])

    # write
    entries = []
    for r in results:
        write_logits(os.path.join(ref_dir, f"{r['name']}.logits.f32"), r["logits"])
        write_logits(os.path.join(ref_dir, f"{r['name']}.nf4.logits.f32"), r["nf4_logits"])
        entries.append({
            "name": r["name"], "ids": r["ids"], "logits": f"{r['name']}.logits.f32", "greedy": r["greedy"],
            "nf4_logits": f"{r['name']}.nf4.logits.f32", "nf4_greedy": r["nf4_greedy"], "vocab_size": VOCAB,
            "greedy_margins": r["margins"], "nf4_greedy_margins": r["nf4_margins"],
            "rel_change_vs_base": round(r["rel"], 4), "nf4_rel_diff_vs_fp32": round(r["nf4_rel"], 4),
        })
    meta = {
        "base": base,
        "adapter": name,
        "transformers_version": transformers.__version__,
        "peft_version": peft.__version__,
        "torch_version": torch.__version__,
        "adapter_dtype": "bfloat16" if bf16 else "float32",
        "nf4": "tools/nf4_ref.py nf4_roundtrip(w, double_quant=False) (blocksize 64, fp32 absmax) of "
               "model.language_model.layers.*.{q,k,v,o,gate,up,down}_proj.weight after merge_and_unload in fp32",
        "nf4_double_quant": NF4_DOUBLE_QUANT,
        "nf4_weights_replaced": n_q,
        "prompts": entries,
        "modules": modules,
        "extra_modules": extra,
        "replacements": replacements,
        "merged": "merged.safetensors",
        "merged_tensors": sorted(pick),
        "formula_check_max_abs_diff": float(f"{worst:.3g}"),
    }
    with open(os.path.join(ref_dir, "reference.json"), "w") as fh:
        fh.write(compact_json(meta))
    size = sum(os.path.getsize(os.path.join(rt, fn)) for rt, _, fs in os.walk(d) for fn in fs)
    print(f"[{name}] base={base} scale-factor={f:.3g} modules={len(modules)} repl={replacements} extra={extra} "
          f"size={size} B formula-diff={worst:.2g}")
    for r in results:
        print(f"   {r['name']:5s} rel-change={r['rel']:.3f} nf4-vs-fp32={r['nf4_rel']:.3f} "
              f"greedy={r['greedy']}\n         nf4 greedy={r['nf4_greedy']}")
    return size


# ----------------------------------------------------------------------------
# post-processing hooks
# ----------------------------------------------------------------------------


def add_shared_kv(d):
    """Hand-add LoRA for layers.7.self_attn.k_proj (KV-shared: no module in HF, no effect)."""
    mod = LM + "layers.7.self_attn.k_proj"
    g = torch.Generator().manual_seed(77)

    def fn(t):
        t[f"base_model.model.{mod}.lora_A.weight"] = torch.randn(8, 64, generator=g) / 8.0
        t[f"base_model.model.{mod}.lora_B.weight"] = torch.randn(16, 8, generator=g)
        return t

    rewrite_st(st_path(d), fn)
    return [mod]


# ----------------------------------------------------------------------------
# bad adapters
# ----------------------------------------------------------------------------


def make_bad(out):
    sizes = {}
    small = LoraConfig(r=2, lora_alpha=4, target_modules=r".*language_model\.layers\.[01]\.self_attn\.(q_proj|o_proj)")

    def fresh_small(cfg, seed):
        torch.manual_seed(seed)
        pm = get_peft_model(load_base("e2b_tiny"), cfg)
        Randomizer(pm, seed).set(0.1)
        return pm

    # bad_shape: lora_B of layers.1.self_attn.o_proj with out dim 96 instead of 64
    d = os.path.join(out, "bad_shape")
    fresh_dir(d)
    fresh_small(small, 501).save_pretrained(d)
    key = f"base_model.model.{LM}layers.1.self_attn.o_proj.lora_B.weight"

    def widen(t):
        assert t[key].shape == (64, 2)
        t[key] = torch.randn(96, 2, generator=torch.Generator().manual_seed(5)) * 0.1
        return t

    rewrite_st(st_path(d), widen)

    # bad_peft_type: a real IA3 adapter
    d = os.path.join(out, "bad_peft_type")
    fresh_dir(d)
    ia3 = IA3Config(target_modules=r".*language_model\.layers\.[01]\.(self_attn\.v_proj|mlp\.down_proj)",
                    feedforward_modules=r".*language_model\.layers\.[01]\.mlp\.down_proj")
    get_peft_model(load_base("e2b_tiny"), ia3).save_pretrained(d)

    # bin_only: pickle weights
    d = os.path.join(out, "bin_only")
    fresh_dir(d)
    fresh_small(small, 502).save_pretrained(d, safe_serialization=False)
    assert os.path.exists(os.path.join(d, "adapter_model.bin")) and not os.path.exists(st_path(d))

    # pissa: init_lora_weights="pissa" (the base weights were changed at init)
    d = os.path.join(out, "pissa")
    fresh_dir(d)
    torch.manual_seed(503)
    pm = get_peft_model(load_base("e2b_tiny"), LoraConfig(r=2, lora_alpha=2, init_lora_weights="pissa",
                                                          target_modules=r".*language_model\.layers\.0\.self_attn\.q_proj"))
    pm.save_pretrained(d)
    with open(os.path.join(d, "adapter_config.json")) as fh:
        assert json.load(fh)["init_lora_weights"] == "pissa"

    for n in ("bad_shape", "bad_peft_type", "bin_only", "pissa"):
        canonical_config(os.path.join(out, n))
    for n, what in (("bad_shape", "lora_B of layers.1.self_attn.o_proj is [96, 2]; the base o_proj is [64, 64]"),
                    ("bad_peft_type", "a real IA3 adapter (peft_type IA3)"),
                    ("bin_only", "saved with safe_serialization=False: adapter_model.bin only"),
                    ("pissa", "init_lora_weights=pissa: the base weights were changed at init")):
        p = os.path.join(out, n)
        with open(os.path.join(p, "README.md"), "w") as fh:   # replaces PEFT's model card
            fh.write(f"Bad PEFT adapter fixture for error tests (tools/make_adapter_fixtures.py): {what}.\n")
        sizes[n] = sum(os.path.getsize(os.path.join(p, fn)) for fn in os.listdir(p))
        print(f"[{n}] files={sorted(os.listdir(p))} size={sizes[n]} B")
    return sizes


# ----------------------------------------------------------------------------


def text_targets(**kw):
    return LoraConfig(target_modules=PROJ, exclude_modules=TOWERS, **kw)


def main():
    global FIX
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixtures", default="tests/fixtures", help="fixtures directory (default tests/fixtures)")
    args = ap.parse_args()
    FIX = args.fixtures
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    out = os.path.join(FIX, "adapters")
    os.makedirs(out, exist_ok=True)
    total = 0

    total += make_good(
        "e2b_lora", "e2b_tiny", text_targets(r=8, lora_alpha=16), seed=101,
        merged_pick=[LM + "layers.0.self_attn.q_proj.weight", LM + "layers.4.self_attn.k_proj.weight",
                     LM + "layers.5.self_attn.v_proj.weight", LM + "layers.2.mlp.down_proj.weight"],
        post=add_shared_kv,
        notes="Plain LoRA r=8 alpha=16 (scale 2) on q,k,v,o,gate,up,down of the text decoder, float32. "
              "Hand-added: lora_A/lora_B for model.language_model.layers.7.self_attn.k_proj (a KV-shared layer: "
              "transformers has no such module, so HF ignores it; g4 must drop it).")

    total += make_good(
        "e2b_rslora_patterns", "e2b_tiny",
        LoraConfig(r=8, lora_alpha=16, use_rslora=True,
                   target_modules=r".*language_model\.layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|mlp\.down_proj)",
                   # saved with sort_keys: the layer-3 key precedes "q_proj", so it wins for layer 3 (first match)
                   rank_pattern={r"layers\.3\.self_attn\.q_proj": 12, "down_proj": 4, "q_proj": 6},
                   # "proj" must NOT match "...o_proj" (anchored on a '.' boundary)
                   alpha_pattern={r"layers\.[0-4]\.mlp\.down_proj": 8, "o_proj": 24, "proj": 99}),
        seed=102,
        merged_pick=[LM + "layers.3.self_attn.q_proj.weight", LM + "layers.1.mlp.down_proj.weight",
                     LM + "layers.5.self_attn.k_proj.weight"],
        notes="use_rslora (scale alpha/sqrt(r)) with rank_pattern/alpha_pattern and a regex-string target_modules.")

    total += make_good(
        "e2b_dora", "e2b_tiny", text_targets(r=8, lora_alpha=16, use_dora=True), seed=103, bf16=True,
        merged_pick=[LM + "layers.0.self_attn.q_proj.weight", LM + "layers.1.mlp.up_proj.weight",
                     LM + "layers.4.self_attn.v_proj.weight"],
        notes="DoRA r=8 alpha=16 on the text projections, bfloat16; magnitude vectors randomised around ||W + scale*B@A||_row.")

    total += make_good(
        "e2b_modules_to_save", "e2b_tiny",
        LoraConfig(r=8, lora_alpha=16, target_modules=["o_proj"], exclude_modules=TOWERS, modules_to_save=["embed_tokens"]),
        seed=104, bf16=True,
        merged_pick=[LM + "layers.2.self_attn.o_proj.weight", LM + "layers.9.self_attn.o_proj.weight"],
        notes="modules_to_save=[embed_tokens] (ensure_weight_tying=False, PEFT's default) + LoRA on o_proj, bfloat16. "
              "PEFT saves only model.language_model.embed_tokens.weight. HF then embeds tokens with the NEW matrix but "
              "the tied LM head keeps using the ORIGINAL embedding (merge_and_unload unties them and sets "
              "tie_word_embeddings=False). A correct merge must therefore untie: head = base embed_tokens.")

    total += make_good(
        "e2b_modules_to_save_tied", "e2b_tiny",
        LoraConfig(r=8, lora_alpha=16, target_modules=["o_proj"], exclude_modules=TOWERS, modules_to_save=["embed_tokens"],
                   ensure_weight_tying=True),
        seed=105, bf16=True,
        merged_pick=[LM + "layers.2.self_attn.o_proj.weight"],
        notes="modules_to_save=[embed_tokens] with ensure_weight_tying=True + LoRA on o_proj, bfloat16. PEFT saves both "
              "model.language_model.embed_tokens.weight and lm_head.weight (identical); the head follows the new "
              "embedding.")

    total += make_good(
        "e2b_tower_linear", "e2b_tiny",
        LoraConfig(r=4, lora_alpha=8, target_modules=r".*vision_tower.*\.q_proj\.linear|.*language_model.*\.q_proj"),
        seed=106,
        merged_pick=["model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight",
                     "model.vision_tower.encoder.layers.1.self_attn.q_proj.linear.weight",
                     LM + "layers.3.self_attn.q_proj.weight"],
        notes="LoRA r=4 alpha=8 on the vision tower's q_proj.linear (inner linear of Gemma4ClippableLinear) and the "
              "text q_proj. Text prompts never run the tower, so only the text q_proj changes the logits.")

    total += make_good(
        "e4b_lora", "e4b_tiny", text_targets(r=4, lora_alpha=8), seed=107, bf16=True,
        merged_pick=[LM + "layers.0.self_attn.q_proj.weight", LM + "layers.5.self_attn.k_proj.weight",
                     LM + "layers.2.self_attn.v_proj.weight"],
        notes="LoRA r=4 alpha=8 on all text projections of e4b_tiny (no k/v modules on KV-shared layers 7..11), bfloat16.")

    total += sum(make_bad(out).values())
    with open(os.path.join(out, "README.md"), "w") as fh:
        fh.write("PEFT LoRA adapter fixtures made by `python tools/make_adapter_fixtures.py` "
                 f"(peft {peft.__version__}, transformers {transformers.__version__}, torch {torch.__version__}).\n"
                 "See the script's docstring for what each adapter exercises and each <name>/README.md.\n")
    print(f"total {total} B ({total / 2**20:.2f} MiB)")


if __name__ == "__main__":
    main()
