"""tower_checkpoint.py - the random-weight Gemma 4 multimodal checkpoint that tower_bench.py and tower_memory.py share:
real vision and audio towers (the E2B = E4B tower shapes), an E2B-width text decoder cut to 2 layers (the towers do
not depend on the text depth). Norm weights and clip bounds are non-trivial, as a trained tower's are."""
import os

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
