"""tower_checkpoint.py - what tower_bench.py and tower_memory.py share: the random-weight Gemma 4 multimodal
checkpoint (real vision and audio towers, the E2B = E4B tower shapes, an E2B-width text decoder cut to 2 layers: the
towers do not depend on the text depth; norm weights and clip bounds non-trivial, as a trained tower's are) and the
inputs (a 1024x768 image, a 30 s clip)."""
import os
import wave

import numpy as np

import torch
from transformers import Gemma4AudioConfig, Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig, Gemma4VisionConfig

from gemma4_shapes import SHAPES


def text_config():
    return Gemma4TextConfig(vocab_size=262144, vocab_size_per_layer_input=262144, hidden_size_per_layer_input=256, sliding_window=512,
                            final_logit_softcapping=30.0, max_position_embeddings=131072,
                            **dict(SHAPES["e2b"], num_hidden_layers=2, num_kv_shared_layers=0,
                                   layer_types=["sliding_attention", "full_attention"]))


def make_checkpoint(ckpt):
    """Writes the checkpoint to `ckpt` unless it is there already; returns its text config."""
    tc = text_config()
    if os.path.exists(os.path.join(ckpt, "model.safetensors")):
        return tc
    torch.manual_seed(0)
    cfg = Gemma4Config(text_config=tc.to_dict(), vision_config=Gemma4VisionConfig(use_clipped_linears=True).to_dict(),
                       audio_config=Gemma4AudioConfig().to_dict())
    model = Gemma4ForConditionalGeneration(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight") and ("vision" in n or "audio" in n):
                p.uniform_(0.5, 1.5)
        for n, b in model.named_buffers():
            if n.endswith("input_min") or n.endswith("output_min"):
                b.fill_(-8.0)
            elif n.endswith("input_max") or n.endswith("output_max"):
                b.fill_(8.0)
    model.save_pretrained(ckpt)
    return tc


def make_inputs(tmp):
    """A noisy 1024x768 gradient image and a 30 s 16 kHz chirp, written to `tmp` (PNG when PIL is there, else PPM;
    16-bit WAV). Returns (image uint8 [768, 1024, 3], image path, the clip's samples as read back, WAV path, rate)."""
    rng = np.random.default_rng(0)
    H, W = 768, 1024
    yy, xx = np.mgrid[0:H, 0:W]
    img = np.stack([(xx * 255 // W), (yy * 255 // H), ((xx + yy) % 256)], -1).astype(np.int16) + rng.integers(-20, 21, (H, W, 3))
    img = np.clip(img, 0, 255).astype(np.uint8)
    try:
        from PIL import Image
        image = os.path.join(tmp, "image.png")
        Image.fromarray(img).save(image)
    except ImportError:  # stb reads PPM too
        image = os.path.join(tmp, "image.ppm")
        with open(image, "wb") as f:
            f.write(b"P6\n%d %d\n255\n" % (W, H) + img.tobytes())
    sr, secs = 16000, 30.0
    t = np.arange(int(sr * secs)) / sr
    pcm = (0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
    pcm16 = np.clip(np.round(pcm * 32768), -32768, 32767).astype(np.int16)
    wav = os.path.join(tmp, "clip.wav")
    with wave.open(wav, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(sr), w.writeframes(pcm16.tobytes())
    return img, image, pcm16.astype(np.float32) / 32768.0, wav, sr
