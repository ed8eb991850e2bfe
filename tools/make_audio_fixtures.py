#!/usr/bin/env python3
"""make_audio_fixtures.py - Hugging Face reference numbers for g4's CPU audio tower.

Runs transformers' Gemma4AudioFeatureExtractor and the audio tower + embed_audio of the tiny
random-weight checkpoint tests/fixtures/e2b_tiny (loaded in float32, eager attention) on two
synthetic clips, and writes under tests/fixtures/towers/audio/:

  clip{0,1}.pcm.f32        [n_samples] mono float32 PCM at 16 kHz (chirps + noise, numpy RNG)
  clip{0,1}.features.f32   [n_frames, mel_bins] HF log-mel input_features (padded frames are zero)
  clip{0,1}.mask.i32       [n_frames] HF input_features_mask (1 valid, 0 padding)
  clip{0,1}.tower.f32      [n_soft, text_hidden] get_audio_features().pooler_output, valid rows only
  clip0.wav                clip 0 as a 16-bit PCM mono WAV (int16 = round(x * 32768), clipped)
  e2e.logits.f32           [T, vocab] logits of the full Gemma4ForConditionalGeneration forward on
                           e2e.json's ids with clip 0 as input_features
  audio.json               shapes, soft-token counts for many clip lengths, the e2e ids
  mid/                     an audio-only random-weight checkpoint with the released model's front end
                           (128 mel bins, subsampling_conv_channels [128, 32]) but a small conformer
                           (config.json: audio_config + text hidden size; model.safetensors: bf16
                           model.audio_tower.* / model.embed_audio.*), and for clip 0 its HF features
                           (mid/clip0.features.f32 [n_frames, 128]) and tower output (mid/clip0.tower.f32)

The tiny audio tower's input_proj_linear takes (subsampling_conv_channels[0] // 4) * channels[1]
= 8 inputs, i.e. 2 frequency rows after the two stride-2 convs: HF builds that layer for a
feature extractor with channels[0] = 8 mel bins (128 for the real model), so the extractor runs
with feature_size=8 here. The tiny vocabulary (512) cannot embed boa 256000 / eoa 258883, so the
e2e sequence uses the in-vocab stand-ins 500 / 501 (audio 258881 placeholders are swapped for the
pad id by HF before the embedding lookup, so they stay as they are).

Usage:  python tools/make_audio_fixtures.py [--ckpt tests/fixtures/e2b_tiny] [--out tests/fixtures/towers/audio]
Deterministic: the clips come from numpy.random.default_rng with fixed seeds.
"""

import argparse
import json
import os
import wave

import numpy as np
import torch
import transformers
from safetensors.torch import save_file
from transformers import Gemma4ForConditionalGeneration
from transformers.models.gemma4.configuration_gemma4 import Gemma4AudioConfig, Gemma4TextConfig
from transformers.models.gemma4.modeling_gemma4 import Gemma4AudioModel, Gemma4MultimodalEmbedder
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

SR = 16000
CLIP_SAMPLES = [20837, 49116]   # 1.302 s, 3.070 s: not multiples of 128/160/320; clip 1 gets a padded frame
CLIP_SEEDS = [1234, 5678]
BOA_STANDIN, EOA_STANDIN = 500, 501
AUDIO_TOKEN = 258881
COUNT_LENGTHS = [1, 100, 160, 161, 200, 255, 256, 320, 321, 400, 480, 481, 639, 640, 641, 801, 1000,
                 1601, 16000, 20837, 49116, 49123, 160000, 479839, 479840, 479999, 480000, 480001, 500000]


def make_clip(n, seed):
    rng = np.random.default_rng(seed)
    t = np.arange(n, dtype=np.float64) / SR
    dur = n / SR
    f0, f1 = rng.uniform(80, 400), rng.uniform(2000, 7000)
    phase = 2 * np.pi * (f0 * t + (f1 - f0) * t * t / (2 * dur))    # linear chirp f0 -> f1
    x = 0.35 * np.sin(phase)
    x += 0.2 * np.sin(2 * np.pi * rng.uniform(150, 900) * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    x += 0.05 * rng.standard_normal(n)
    x[: n // 20] *= np.linspace(0, 1, n // 20)                        # fade in
    return x.astype(np.float32)


def soft_tokens_hf(fe, n):
    """Soft tokens HF's processor inserts for n samples (Gemma4Processor.replace_audio_token)."""
    m = fe([np.zeros(n, dtype=np.float32)], return_tensors="np")["input_features_mask"][0]
    t = len(m)
    for _ in range(2):
        t_out = (t + 2 - 3) // 2 + 1
        m = m[::2][:t_out]
        t = len(m)
    return int(m.sum())


MID_AUDIO = dict(hidden_size=48, num_hidden_layers=1, num_attention_heads=2, subsampling_conv_channels=[128, 32],
                 output_proj_dims=56, conv_kernel_size=5, use_clipped_linears=True)
MID_TEXT_HIDDEN = 40


@torch.no_grad()
def make_mid(out_dir, pcm):
    """Random audio tower with the released front end (128 mel bins); weights rounded to bf16, run in fp32."""
    os.makedirs(out_dir, exist_ok=True)
    acfg = Gemma4AudioConfig(**MID_AUDIO)
    acfg._attn_implementation = "eager"
    tcfg = Gemma4TextConfig(hidden_size=MID_TEXT_HIDDEN, vocab_size=512, num_hidden_layers=1,
                            intermediate_size=64, num_attention_heads=1, num_key_value_heads=1, head_dim=16)
    tower, embed = Gemma4AudioModel(acfg).eval(), Gemma4MultimodalEmbedder(acfg, tcfg).eval()
    g = torch.Generator().manual_seed(4242)
    tensors = {}
    for prefix, mod in (("model.audio_tower.", tower), ("model.embed_audio.", embed)):
        names = set(mod.state_dict().keys())
        params = dict(mod.named_parameters())
        params.update({k: v for k, v in mod.named_buffers() if k in names})
        for name in sorted(params):
            t, leaf = params[name], name.rsplit(".", 1)[-1]
            if leaf.endswith("_min"):
                v = torch.rand(t.shape, generator=g) * 1.5 - 3.0
            elif leaf.endswith("_max"):
                v = torch.rand(t.shape, generator=g) * 1.5 + 1.5
            elif leaf in ("per_dim_scale", "bias"):
                v = torch.randn(t.shape, generator=g) * 0.3
            elif t.dim() == 1:
                v = torch.rand(t.shape, generator=g) + 0.5
            else:
                v = torch.randn(t.shape, generator=g) * int(np.prod(t.shape[1:])) ** -0.5
            v = v.to(torch.bfloat16)
            t.copy_(v.float())
            tensors[prefix + name] = v.contiguous()
    save_file(tensors, os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump({"audio_config": MID_AUDIO, "text_config": {"hidden_size": MID_TEXT_HIDDEN}}, f, indent=1)
    fe = Gemma4AudioFeatureExtractor()   # 128 mel bins, the released default
    feats = fe([pcm], return_tensors="pt")
    x, m = feats["input_features"], feats["input_features_mask"]
    out = tower(x, m, return_dict=True)
    emb = embed(out.last_hidden_state)[0][out.attention_mask[0]]
    x[0].numpy().astype("<f4").tofile(os.path.join(out_dir, "clip0.features.f32"))
    emb.numpy().astype("<f4").tofile(os.path.join(out_dir, "clip0.tower.f32"))
    return {"dir": "mid", "audio_config": MID_AUDIO, "text_hidden_size": MID_TEXT_HIDDEN, "mel_bins": 128,
            "clip": "clip0", "n_frames": int(x.shape[1]), "n_valid_frames": int(m[0].sum()),
            "n_soft": int(emb.shape[0]), "features": "mid/clip0.features.f32", "tower": "mid/clip0.tower.f32"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default="tests/fixtures/e2b_tiny")
    ap.add_argument("--out", default="tests/fixtures/towers/audio")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)

    model = Gemma4ForConditionalGeneration.from_pretrained(
        args.ckpt, dtype=torch.float32, attn_implementation="eager").eval()
    cfg = model.config
    ac = cfg.audio_config
    mel_bins = 4 * (ac.subsampling_conv_channels[0] // 4)
    fe = Gemma4AudioFeatureExtractor(feature_size=mel_bins)

    meta = {"transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "checkpoint": "tests/fixtures/e2b_tiny", "mel_bins": mel_bins, "sample_rate": SR,
            "text_hidden_size": cfg.text_config.hidden_size, "clips": []}
    clips = []
    for i, (n, seed) in enumerate(zip(CLIP_SAMPLES, CLIP_SEEDS)):
        pcm = make_clip(n, seed)
        clips.append(pcm)
        feats = fe([pcm], return_tensors="pt")
        x, m = feats["input_features"], feats["input_features_mask"]
        with torch.no_grad():
            out = model.model.get_audio_features(x, m, return_dict=True)
        emb = out.pooler_output[0][out.attention_mask[0]]                 # [n_soft, text_hidden]
        n_soft = int(out.attention_mask[0].sum())
        assert n_soft == soft_tokens_hf(fe, n) == emb.shape[0]
        pcm.astype("<f4").tofile(os.path.join(args.out, f"clip{i}.pcm.f32"))
        x[0].numpy().astype("<f4").tofile(os.path.join(args.out, f"clip{i}.features.f32"))
        m[0].numpy().astype("<i4").tofile(os.path.join(args.out, f"clip{i}.mask.i32"))
        emb.numpy().astype("<f4").tofile(os.path.join(args.out, f"clip{i}.tower.f32"))
        meta["clips"].append({"name": f"clip{i}", "n_samples": n, "seed": seed, "n_frames": int(x.shape[1]),
                              "n_valid_frames": int(m[0].sum()), "n_soft": n_soft,
                              "pcm": f"clip{i}.pcm.f32", "features": f"clip{i}.features.f32",
                              "mask": f"clip{i}.mask.i32", "tower": f"clip{i}.tower.f32"})

    pcm16 = np.clip(np.round(clips[0].astype(np.float64) * 32768.0), -32768, 32767).astype("<i2")
    with wave.open(os.path.join(args.out, "clip0.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SR)
        w.writeframes(pcm16.tobytes())
    meta["wav"] = {"file": "clip0.wav", "of": "clip0", "format": "PCM int16 mono 16 kHz, int16 = round(x*32768)"}

    meta["soft_tokens"] = [[n, soft_tokens_hf(fe, n)] for n in COUNT_LENGTHS]

    # End-to-end: [bos, text, boa, n x audio, eoa, text] with clip 0 through the full model.
    n0 = meta["clips"][0]["n_soft"]
    ids = [2, 17, 230, 411, BOA_STANDIN] + [AUDIO_TOKEN] * n0 + [EOA_STANDIN, 96, 305]
    feats = fe([clips[0]], return_tensors="pt")
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]), input_features=feats["input_features"],
                       input_features_mask=feats["input_features_mask"], use_cache=False,
                       logits_to_keep=0).logits[0]
    logits.numpy().astype("<f4").tofile(os.path.join(args.out, "e2e.logits.f32"))
    meta["e2e"] = {"ids": ids, "clip": "clip0", "n_soft": n0, "audio_token_id": AUDIO_TOKEN,
                   "boa_standin": BOA_STANDIN, "eoa_standin": EOA_STANDIN,
                   "logits": "e2e.logits.f32", "shape": [len(ids), int(logits.shape[1])],
                   "note": "full Gemma4ForConditionalGeneration float32 forward, final softcapped logits for "
                           "every position; audio positions take the tower rows of clip0.tower.f32 in order "
                           "(HF looks up the pad id 0 there for the per-layer inputs)"}
    meta["mid"] = make_mid(os.path.join(args.out, "mid"), clips[0])
    with open(os.path.join(args.out, "audio.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps({k: v for k, v in meta.items() if k != "soft_tokens"}, indent=1))


if __name__ == "__main__":
    main()
