#!/usr/bin/env python3
"""make_fixtures.py - build the tiny random-weight Gemma 4 test fixtures for g4.

Creates small Gemma 4 checkpoints in Hugging Face layout (bf16 safetensors +
config.json) with deterministic random weights, and float32 reference outputs
computed by Hugging Face transformers (the numerical reference of g4):

  e2b_tiny/       E2B-like, Gemma4ForConditionalGeneration with tiny vision and
                  audio towers, saved in the *released* form: text_config has
                  "global_head_dim" and no "per_layer_config"; the KV-shared layers
                  carry (unused) self_attn.k_proj / v_proj / k_norm tensors; one
                  model.safetensors file.
  e4b_tiny/       E4B-like (GQA, no double-wide MLP), Gemma4ForConditionalGeneration,
                  saved in the *re-saved* form written by transformers itself:
                  text_config has "per_layer_config", no shared-layer K/V tensors,
                  sharded safetensors with model.safetensors.index.json.
  e2b_tiny_text/  e2b_tiny's text decoder as a text-only Gemma4ForCausalLM
                  (model_type "gemma4_text", tensor prefix "model."), re-saved form.

Each fixture gets reference/: reference.json (prompt ids, greedy continuations),
<prompt>.logits.f32 (raw little-endian float32 [len(ids), vocab], final softcapped
logits of one full forward pass) and a README.md.

Usage:  python tools/make_fixtures.py --out tests/fixtures
Deterministic: all randomness comes from fixed seeds (torch.Generator / numpy).
"""

import argparse
import json
import os
import re
import shutil

import numpy as np
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
    GenerationConfig,
)

S, F = "sliding_attention", "full_attention"

ROPE = {
    S: {"rope_type": "default", "rope_theta": 10000.0},
    F: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}

COMMON_TEXT = dict(
    vocab_size=512,
    vocab_size_per_layer_input=512,
    num_attention_heads=4,
    head_dim=16,
    global_head_dim=32,
    sliding_window=8,
    hidden_size_per_layer_input=16,
    final_logit_softcapping=30.0,
    rope_parameters=ROPE,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    hidden_activation="gelu_pytorch_tanh",
    tie_word_embeddings=True,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
)

E2B_TEXT = dict(
    COMMON_TEXT,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=10,
    layer_types=[S, S, S, S, F] * 2,
    num_key_value_heads=1,
    num_kv_shared_layers=4,  # layers 6..9 shared; donors 4 (full), 5 (sliding)
    use_double_wide_mlp=True,
)

E4B_TEXT = dict(
    COMMON_TEXT,
    hidden_size=96,
    intermediate_size=192,
    num_hidden_layers=12,
    layer_types=[S, S, S, S, S, F] * 2,
    num_key_value_heads=2,
    num_kv_shared_layers=5,  # layers 7..11 shared; donors 5 (full), 6 (sliding)
    use_double_wide_mlp=False,
)

# Tiny towers: only there so that the tower tensors exist in the checkpoint.
VISION = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
    position_embedding_size=64,
    use_clipped_linears=True,
)

AUDIO = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    subsampling_conv_channels=[8, 4],
    output_proj_dims=32,
    use_clipped_linears=True,
)

# Weight seeds. Picked once from seeds 2..41 (by a throw-away sweep) for varied greedy
# continuations with the largest smallest top1-top2 logit margin; any seed gives valid fixtures.
E2B_SEED = 26
E4B_SEED = 40

PROMPTS = [("short", 5, 1001), ("long", 40, 1002)]  # (name, length, seed)
N_GREEDY = 16
VOCAB = 512


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------


def make_prompts():
    """Deterministic prompts: <bos>=2 followed by ids in [3, 511]."""
    out = []
    for name, n, seed in PROMPTS:
        rng = np.random.default_rng(seed)
        ids = [2] + [int(x) for x in rng.integers(3, VOCAB, size=n - 1)]
        out.append((name, ids))
    return out


# Norm-weight ranges. All are random and away from 1 so that a skipped scale is visible.
# q_norm/k_norm act as the attention temperature (Gemma 4 uses scaling 1.0, no 1/sqrt(d)):
# with weights ~1 the softmax is so peaked that the network becomes chaotic (bf16 and fp32
# runs disagree by several logits), hence the smaller range. The post-sublayer norms are
# larger so that the layer outputs are not swamped by the sqrt(H)-scaled token embedding
# in the residual stream (otherwise the tied LM head mostly predicts the current token and
# greedy decoding repeats one token).
NORM_RANGE = (0.5, 1.5)
QK_NORM_RANGE = (0.2, 0.6)
POST_NORM_RANGE = (2.0, 6.0)
QK_NORMS = ("q_norm.", "k_norm.")
POST_NORMS = ("post_attention_layernorm.", "post_feedforward_layernorm.", "post_per_layer_input_norm.")


@torch.no_grad()
def randomize_(model, seed):
    """Overwrite every saved tensor of `model` (params + persistent buffers) with
    non-trivial random values. Iterates names in sorted order for determinism."""
    g = torch.Generator().manual_seed(seed)
    state_names = set(model.state_dict().keys())
    tensors = dict(model.named_parameters())
    tensors.update({k: v for k, v in model.named_buffers() if k in state_names})

    def uniform(t, lo, hi):
        t.copy_(torch.rand(t.shape, generator=g) * (hi - lo) + lo)

    def normal(t, std):
        t.copy_(torch.randn(t.shape, generator=g) * std)

    for name in sorted(tensors):
        t = tensors[name]
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "layer_scalar":
            uniform(t, 0.3, 1.2)
        elif leaf in ("input_min", "output_min"):  # clippable-linear bounds: finite, clip some values
            uniform(t, -3.0, -1.5)
        elif leaf in ("input_max", "output_max"):
            uniform(t, 1.5, 3.0)
        elif name.endswith("embed_tokens.weight") or name.endswith("embed_tokens_per_layer.weight"):
            normal(t, 1.0)
        elif leaf == "position_embedding_table":
            normal(t, 0.5)
        elif leaf == "per_dim_scale":
            normal(t, 0.5)
        elif leaf == "bias":
            normal(t, 0.1)
        elif t.dim() == 1 and leaf == "weight" and any(n in name for n in QK_NORMS):
            uniform(t, *QK_NORM_RANGE)
        elif t.dim() == 1 and leaf == "weight" and any(n in name for n in POST_NORMS):
            uniform(t, *POST_NORM_RANGE)
        elif t.dim() == 1 and leaf == "weight":  # other RMSNorm / LayerNorm scales
            uniform(t, *NORM_RANGE)
        elif t.dim() >= 2 and leaf == "weight":  # linear / conv: std 1/sqrt(fan_in)
            fan_in = int(np.prod(t.shape[1:]))
            normal(t, fan_in**-0.5)
        else:
            raise RuntimeError(f"randomize_: no rule for {name} {tuple(t.shape)}")


def text_state_dict_from_mm(mm_model):
    """Text-decoder weights of a Gemma4ForConditionalGeneration renamed for Gemma4ForCausalLM."""
    prefix = "model.language_model."
    sd = {}
    for k, v in mm_model.state_dict().items():
        if k.startswith(prefix):
            sd["model." + k[len(prefix):]] = v.clone()
    return sd


def load_ref(cls, path, attn="eager", dtype=torch.float32):
    if cls is Gemma4ForConditionalGeneration and attn != "eager":
        # the audio tower only implements eager attention
        attn = {"": attn, "text_config": attn, "vision_config": attn, "audio_config": "eager"}
    model, info = cls.from_pretrained(
        path, dtype=dtype, attn_implementation=attn, output_loading_info=True
    )
    bad = {k: v for k, v in info.items() if v and k != "unexpected_keys"}
    # Shared-layer k/v/k_norm in the released form are ignored on purpose by HF.
    unexpected = [k for k in info.get("unexpected_keys", [])]
    if bad or unexpected:
        raise RuntimeError(f"loading {path}: {bad} unexpected={unexpected}")
    model.eval()
    return model


@torch.no_grad()
def full_logits(model, ids):
    x = torch.tensor([ids], dtype=torch.long)
    out = model(input_ids=x, use_cache=False, logits_to_keep=0)
    return out.logits[0]


@torch.no_grad()
def greedy_manual(model, ids, n):
    """Greedy continuation by repeated full forward passes; also returns the top1-top2
    logit margin of every step (small margins = steps a less exact engine may flip)."""
    seq, margins = list(ids), []
    for _ in range(n):
        last = full_logits(model, seq)[-1]
        top2 = last.topk(2).values
        margins.append(round(float(top2[0] - top2[1]), 5))
        seq.append(int(last.argmax()))
    return seq[len(ids):], margins


@torch.no_grad()
def greedy_generate(model, ids, n):
    """model.generate with the KV cache; EOS stopping disabled (eos_token_id=None)."""
    gc = GenerationConfig(do_sample=False, max_new_tokens=n, eos_token_id=None, pad_token_id=0, bos_token_id=2)
    x = torch.tensor([ids], dtype=torch.long)
    out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=gc)
    return [int(t) for t in out[0, len(ids):]]


def compute_references(cls, path, prompts):
    """Eager fp32 reference for every prompt, plus sdpa / fp64 / generate() cross-checks."""
    model = load_ref(cls, path, "eager")
    sdpa = load_ref(cls, path, "sdpa")
    f64 = load_ref(cls, path, "eager", dtype=torch.float64)
    results = []
    for name, ids in prompts:
        logits = full_logits(model, ids)
        ref64 = full_logits(f64, ids)
        d_sdpa = (full_logits(sdpa, ids) - logits).abs().max().item()
        d_f64 = (logits.double() - ref64).abs().max().item()
        # The fp32 reference itself is only good to ~1e-3 absolute (compare with fp64): the
        # residual stream reaches |x| ~ 1e2, so sdpa-vs-eager can't agree to 1e-5 absolute.
        tol = 1e-4 * max(1.0, logits.abs().max().item())
        assert d_sdpa < tol, f"{path}/{name}: sdpa vs eager max diff {d_sdpa} > {tol}"
        assert d_f64 < tol, f"{path}/{name}: fp32 vs fp64 max diff {d_f64} > {tol}"
        greedy, margins = greedy_manual(model, ids, N_GREEDY)
        assert greedy_manual(f64, ids, N_GREEDY)[0] == greedy, f"{path}/{name}: fp64 greedy differs"
        gen = greedy_generate(model, ids, N_GREEDY)
        note = None
        if gen != greedy:
            note = f"generate() differs from manual greedy: {gen}"
            print(f"  WARNING {name}: {note}")
        if COMMON_TEXT["eos_token_id"] in greedy:
            note = (note or "") + " greedy continuation contains EOS id 1 (not stopped)"
        results.append(
            dict(name=name, ids=ids, logits=logits, greedy=greedy, margins=margins,
                 generate_match=gen == greedy, sdpa_diff=d_sdpa, f64_diff=d_f64, note=note)
        )
    return results


def write_references(fixture_dir, results, script_note):
    ref_dir = os.path.join(fixture_dir, "reference")
    os.makedirs(ref_dir, exist_ok=True)
    prompts = []
    for r in results:
        fname = f"{r['name']}.logits.f32"
        arr = r["logits"].numpy().astype("<f4")
        assert arr.shape == (len(r["ids"]), VOCAB)
        arr.tofile(os.path.join(ref_dir, fname))
        entry = {
            "name": r["name"],
            "ids": r["ids"],
            "logits": fname,
            "greedy": r["greedy"],
            "vocab_size": VOCAB,
            # extras: top1-top2 gap per greedy step, generate() (KV cache) agreement,
            # and the accuracy of the fp32 reference itself (max |fp32 - fp64| of the logits)
            "greedy_margins": r["margins"],
            "generate_kv_cache_matches": r["generate_match"],
            "fp32_vs_fp64_max_abs_diff": float(f"{r['f64_diff']:.3g}"),
        }
        if r["note"]:
            entry["note"] = r["note"]
        prompts.append(entry)
    meta = {
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "prompts": prompts,
    }
    text = json.dumps(meta, indent=1)
    # keep number lists on one line
    text = re.sub(r"\[\s+([-0-9.e,\s]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    with open(os.path.join(ref_dir, "reference.json"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(ref_dir, "README.md"), "w") as f:
        f.write(
            "Reference outputs produced by `python tools/make_fixtures.py --out tests/fixtures` "
            f"(transformers {transformers.__version__}, torch {torch.__version__}, CPU).\n"
            "The bf16 checkpoint in the parent directory was loaded with `from_pretrained(dtype=torch.float32, "
            'attn_implementation="eager")`; `<name>.logits.f32` = final softcapped logits, raw little-endian '
            "float32 [len(ids), vocab] from one full forward pass; `greedy` = 16 ids from a manual loop of "
            "full forward passes (argmax, no EOS stop); `greedy_margins` = top1-top2 logit gap of each step.\n"
            f"{script_note}\n"
        )


def report(fixture_dir, results):
    print(f"[{os.path.basename(fixture_dir)}]")
    for r in results:
        lg = r["logits"]
        print(
            f"  {r['name']:6s} len={len(r['ids']):3d} logits std={lg.std().item():.3f} "
            f"max|logit|={lg.abs().max().item():.3f} sdpa-diff={r['sdpa_diff']:.1e} "
            f"fp64-diff={r['f64_diff']:.1e} min-margin={min(r['margins']):.3f} "
            f"generate-match={r['generate_match']}\n         greedy={r['greedy']}"
        )
    total = 0
    for root, _, files in os.walk(fixture_dir):
        for fn in sorted(files):
            p = os.path.join(root, fn)
            sz = os.path.getsize(p)
            total += sz
            print(f"    {os.path.relpath(p, fixture_dir):45s} {sz:9d} B")
    print(f"  total {total} B ({total / 2**20:.2f} MiB)")


def fresh_dir(path):
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)


def build_mm_model(text_cfg, seed):
    cfg = Gemma4Config(text_config=dict(text_cfg), vision_config=dict(VISION), audio_config=dict(AUDIO))
    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(cfg)
    randomize_(model, seed)
    return model.to(torch.bfloat16)


def read_safetensors(path):
    tensors, meta = {}, None
    with safe_open(path, "pt") as f:
        meta = f.metadata()
        for k in f.keys():
            tensors[k] = f.get_tensor(k)
    return tensors, meta


# ----------------------------------------------------------------------------
# fixtures
# ----------------------------------------------------------------------------


def to_released_form(fixture_dir, text_cfg, seed):
    """Rewrite a transformers-5.23-saved multimodal checkpoint into the released form:
    config text_config has global_head_dim (no per_layer_config) and the KV-shared layers
    carry random k_proj / v_proj / k_norm tensors (ignored by HF)."""
    cfg_path = os.path.join(fixture_dir, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    tc = cfg["text_config"]
    assert "per_layer_config" in tc, "expected transformers to write per_layer_config"
    del tc["per_layer_config"]
    tc["global_head_dim"] = text_cfg["global_head_dim"]
    cfg["text_config"] = dict(sorted(tc.items()))
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")

    st_path = os.path.join(fixture_dir, "model.safetensors")
    tensors, meta = read_safetensors(st_path)
    g = torch.Generator().manual_seed(seed)
    n_layers = text_cfg["num_hidden_layers"]
    first_shared = n_layers - text_cfg["num_kv_shared_layers"]
    hidden, n_kv = text_cfg["hidden_size"], text_cfg["num_key_value_heads"]
    for i in range(first_shared, n_layers):
        hd = text_cfg["global_head_dim"] if text_cfg["layer_types"][i] == F else text_cfg["head_dim"]
        p = f"model.language_model.layers.{i}.self_attn."
        for nm in ("k_proj", "v_proj"):
            assert p + nm + ".weight" not in tensors
            w = torch.randn(n_kv * hd, hidden, generator=g) * hidden**-0.5
            tensors[p + nm + ".weight"] = w.to(torch.bfloat16)
        lo, hi = QK_NORM_RANGE
        tensors[p + "k_norm.weight"] = (torch.rand(hd, generator=g) * (hi - lo) + lo).to(torch.bfloat16)
    tensors = dict(sorted(tensors.items()))
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    save_file(tensors, st_path, metadata=meta or {"format": "pt"})


def make_e2b(out_dir, prompts):
    d = os.path.join(out_dir, "e2b_tiny")
    fresh_dir(d)
    model = build_mm_model(E2B_TEXT, seed=E2B_SEED)
    model.save_pretrained(d)  # single model.safetensors
    with open(os.path.join(d, "config.json")) as f:
        resaved_text_cfg_keys = sorted(json.load(f)["text_config"].keys())

    # logits of the transformers-written (per_layer_config) form, before conversion
    m0 = load_ref(Gemma4ForConditionalGeneration, d)
    before = {name: full_logits(m0, ids) for name, ids in prompts}
    del m0

    to_released_form(d, E2B_TEXT, seed=E2B_SEED + 1000)
    with open(os.path.join(d, "config.json")) as f:
        tc = json.load(f)["text_config"]
    assert "per_layer_config" not in tc and tc["global_head_dim"] == 32

    results = compute_references(Gemma4ForConditionalGeneration, d, prompts)
    for r in results:
        diff = (r["logits"] - before[r["name"]]).abs().max().item()
        assert diff == 0.0, f"released form changed logits by {diff}"
    write_references(d, results, "Checkpoint: released form (global_head_dim, shared-layer k/v/k_norm present).")
    report(d, results)
    return model, results, resaved_text_cfg_keys


def make_e2b_text(out_dir, prompts, mm_model, mm_results):
    d = os.path.join(out_dir, "e2b_tiny_text")
    fresh_dir(d)
    cfg = Gemma4TextConfig(**E2B_TEXT)
    model = Gemma4ForCausalLM(cfg)
    sd = text_state_dict_from_mm(mm_model)
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    model = model.to(torch.bfloat16)
    model.save_pretrained(d)

    results = compute_references(Gemma4ForCausalLM, d, prompts)
    for r, rm in zip(results, mm_results):
        diff = (r["logits"] - rm["logits"]).abs().max().item()
        assert diff < 1e-6, f"text-only vs multimodal logits differ by {diff}"
        assert r["greedy"] == rm["greedy"]
    write_references(d, results, "Checkpoint: text-only Gemma4ForCausalLM with the same weights as ../e2b_tiny.")
    report(d, results)


def make_e4b(out_dir, prompts):
    d = os.path.join(out_dir, "e4b_tiny")
    fresh_dir(d)
    model = build_mm_model(E4B_TEXT, seed=E4B_SEED)
    model.save_pretrained(d, max_shard_size="1MB")
    assert os.path.exists(os.path.join(d, "model.safetensors.index.json"))
    shards = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    assert len(shards) >= 2, shards
    results = compute_references(Gemma4ForConditionalGeneration, d, prompts)
    write_references(d, results, "Checkpoint: re-saved form as written by transformers (per_layer_config, sharded).")
    report(d, results)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures", help="output directory (default tests/fixtures)")
    args = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)

    prompts = make_prompts()
    mm_e2b, e2b_results, resaved_keys = make_e2b(args.out, prompts)
    make_e2b_text(args.out, prompts, mm_e2b, e2b_results)
    make_e4b(args.out, prompts)
    print("transformers-written text_config keys:", resaved_keys)


if __name__ == "__main__":
    main()
