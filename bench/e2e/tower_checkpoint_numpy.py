#!/usr/bin/env python3
"""tower_checkpoint_numpy.py - the towers at their real shapes without torch: the vision and audio towers of
Hugging Face's Gemma4VisionConfig(use_clipped_linears=True) / Gemma4AudioConfig() defaults (transformers is
imported for the configs only) with random bf16 weights (linears N(0, 0.02), norm weights U(0.5, 1.5), clip
bounds +-8, as tower_checkpoint.py sets them), on the text model of tests/fixtures/e2b_tiny_mm, plus the same
inputs (a noisy 1024x768 gradient as PPM, a 30 s 16 kHz chirp). For timing `g4 run --image/--audio --stats`
and G4_CPU_PROFILE=1 where torch is missing; its outputs are not comparable with transformers (different
random weights), so accuracy comes from the parity tests.
Usage: python3 bench/e2e/tower_checkpoint_numpy.py tests/fixtures/e2b_tiny_mm OUT_DIR
"""
import json, struct, sys, os, shutil
import numpy as np
src, dst = sys.argv[1], sys.argv[2]
c = json.load(open(src + '/config.json'))
from transformers import Gemma4AudioConfig, Gemma4VisionConfig
c['vision_config'] = Gemma4VisionConfig(use_clipped_linears=True).to_dict()
c['audio_config'] = Gemma4AudioConfig().to_dict()
for k in ('vision_config', 'audio_config'):
    for drop in ('transformers_version', 'id2label', 'label2id'):
        c[k].pop(drop, None)
f = open(src + '/model.safetensors', 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); base = 8 + n
TH = c['text_config']['hidden_size']
V = dict(h=768, i=3072, hd=64, pos=10240)
A = dict(h=1024, f=4096, hd=128)
def real_shape(name, s):
    if 'vision' in name:
        if 'position_embedding_table' in name: return [2, 10240, 768]
        if 'input_proj' in name: return [768, 768]
        if 'embed_vision' in name: return [TH, 768]
        m = {32: 768, 64: 3072, 16: 64}
        if name.endswith('q_norm.weight') or name.endswith('k_norm.weight'): return [64]
        return [m[x] for x in s]
    if 'audio' in name:
        if 'embed_audio' in name: return [TH, 1536]
        if 'output_proj' in name: return [1536, 1024] if len(s) == 2 else [1536]
        if 'layer0.conv' in name: return [128, 1, 3, 3]
        if 'layer0.norm' in name: return [128]
        if 'layer1.conv' in name: return [32, 128, 3, 3]
        if 'layer1.norm' in name: return [32]
        if 'input_proj_linear' in name: return [1024, 1024]
        if 'per_dim_scale' in name: return [128]
        if 'depthwise' in name: return [1024, 1, 5]
        if 'linear_start' in name and len(s) == 2: return [2048, 1024]
        m = {32: 1024, 128: 4096, 1: 1, 5: 5}
        return [m[x] for x in s]
    return s
# the tiny towers have 2 layers; the real ones 16 / 12
names = {}
for k, v in h.items():
    if k == '__metadata__': continue
    if ('vision' in k or 'audio' in k) and '.layers.' in k:
        if '.layers.0.' not in k: continue
        L = 16 if 'vision' in k else 12
        for l in range(L): names[k.replace('.layers.0.', '.layers.%d.' % l)] = (k, v)
    else:
        names[k] = (k, v)
rng = np.random.default_rng(0)
out_h, off, plan = {}, 0, []
for k in sorted(names):
    sk, v = names[k]
    shp = real_shape(k, v['shape']) if ('vision' in k or 'audio' in k) else v['shape']
    nb = 2 * int(np.prod(shp)) if shp else 2
    out_h[k] = {'dtype': 'BF16', 'shape': shp, 'data_offsets': [off, off + nb]}
    plan.append((k, sk, v, shp)); off += nb
hb = json.dumps(out_h).encode(); hb += b' ' * (-len(hb) % 8)
os.makedirs(dst, exist_ok=True)
with open(dst + '/model.safetensors', 'wb') as o:
    o.write(struct.pack('<Q', len(hb)) + hb)
    for k, sk, v, shp in plan:
        if not ('vision' in k or 'audio' in k):
            f.seek(base + v['data_offsets'][0]); o.write(f.read(v['data_offsets'][1] - v['data_offsets'][0])); continue
        n = int(np.prod(shp)) if shp else 1
        if k.endswith('input_min') or k.endswith('output_min'): x = np.full(n, -8.0, np.float32)
        elif k.endswith('input_max') or k.endswith('output_max'): x = np.full(n, 8.0, np.float32)
        elif k.endswith('norm.weight'): x = rng.uniform(0.5, 1.5, n).astype(np.float32)
        else: x = (rng.standard_normal(n, dtype=np.float32) * 0.02)
        u = x.view(np.uint32); u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        o.write(u.tobytes())
json.dump(c, open(dst + '/config.json', 'w'), indent=1)
for fn in os.listdir(src):
    if fn not in ('config.json', 'model.safetensors', 'README.md'): shutil.copy(src + '/' + fn, dst + '/' + fn)
print(off / 2**20, 'MiB')
# inputs: a 1024x768 noisy gradient (PPM) and a 30 s 16 kHz chirp (WAV)
import wave
H, W = 768, 1024
yy, xx = np.mgrid[0:H, 0:W]
img = np.stack([(xx * 255 // W), (yy * 255 // H), ((xx + yy) % 256)], -1).astype(np.int16) + rng.integers(-20, 21, (H, W, 3))
img = np.clip(img, 0, 255).astype(np.uint8)
open(dst + '/image.ppm', 'wb').write(b'P6\n%d %d\n255\n' % (W, H) + img.tobytes())
sr = 16000; t = np.arange(sr * 30) / sr
pcm = (0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
w = wave.open(dst + '/clip.wav', 'wb'); w.setnchannels(1); w.setsampwidth(2); w.setframerate(sr)
w.writeframes(np.clip(np.round(pcm * 32768), -32768, 32767).astype(np.int16).tobytes()); w.close()
