#!/usr/bin/env python3
"""make_audio_file_fixtures.py - compressed and resampled audio files through Hugging Face's Gemma 4 audio tower.

The clips of tests/fixtures/towers/audio_files (made by tools/make_media_fixtures.py inputs): an MP3 (48 kHz
stereo), a 48 kHz stereo FLAC and a 44.1 kHz stereo WAV. Two steps, because the machine with FFmpeg is not the
one with torch:

  python3 tools/make_audio_file_fixtures.py samples XFER     (numpy, the ffmpeg CLI)
      tests/fixtures/towers/audio_files/<clip>.g4_16k.f32  the clip as g4 decodes it: the ffmpeg CLI with
                     g4's settings (runtime/src/media/media_decode.cpp: the mean of the channels, then
                     libswresample's default resampler to 16 kHz; equal to g4's load_audio within 2e-7,
                     which MediaDecode.AudioFileSamplesAreTheFixtures checks)
      XFER/<clip>.mean.f32, XFER/rates.json   the clip at its own rate, mean of the channels, for torchaudio
      XFER/<clip>.g4_16k.f32                  copies of the above, for the reference step

  python3 tools/make_audio_file_fixtures.py reference XFER OUT   (torch, torchaudio, transformers 5.23)
      OUT/<clip>.tower.f32            Gemma4AudioFeatureExtractor(feature_size=8) + get_audio_features of
                                      tests/fixtures/e2b_tiny (float32, eager) on <clip>.g4_16k.f32: the
                                      soft tokens [n_soft, 64], valid rows only
      OUT/<clip>.torchaudio16k.f32    torchaudio.functional.resample(<clip>.mean.f32, rate, 16000), defaults
      OUT/audio_file_tokens.json      versions, shapes, and the measured differences: g4's samples against
                                      torchaudio's resample, the soft tokens of torchaudio's samples against
                                      those of g4's, and this environment's tower against the committed
                                      towers/audio/clip0.tower.f32 (a check that the reference is the one g4
                                      follows)

The audio tower of transformers 5.17 differs from 5.23's (docs/towers.md); g4 follows 5.23, so the reference
step runs with transformers 5.23.
"""
import json
import os
import subprocess
import sys
import wave

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AUD = os.path.join(ROOT, "tests", "fixtures", "towers", "audio_files")
CLIPS = ("tones.mp3", "tones_48k_stereo.flac", "tones_44k1_stereo.wav")


def ffmpeg_f32(path, filters=None):
    """The first audio stream as interleaved float32 (filters: an -af chain), and its channel count and rate."""
    probe = subprocess.check_output(["ffprobe", "-v", "error", "-select_streams", "a:0", "-show_entries",
                                     "stream=channels,sample_rate", "-of", "json", path])
    st = json.loads(probe)["streams"][0]
    cmd = ["ffmpeg", "-v", "error", "-i", path] + (["-af", filters] if filters else []) + ["-f", "f32le", "-"]
    return np.frombuffer(subprocess.check_output(cmd), "<f4"), int(st["channels"]), int(st["sample_rate"])


def samples(xfer):
    os.makedirs(xfer, exist_ok=True)
    rates = {}
    for clip in CLIPS:
        path = os.path.join(AUD, clip)
        # g4's chain: float planar samples, the mean of the (two) channels, libswresample's defaults to 16 kHz
        g4, _, _ = ffmpeg_f32(path, "aformat=sample_fmts=fltp,pan=mono|c0=0.5*c0+0.5*c1,aresample=16000")
        for d in (AUD, xfer):
            g4.tofile(os.path.join(d, clip + ".g4_16k.f32"))
        if clip.endswith(".wav"):  # int16 exactly as the file holds it
            with wave.open(path) as w:
                ch, rate = w.getnchannels(), w.getframerate()
                x = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768.0
        else:  # FLAC s16 and MP3's float decoder: exact in float32
            x, ch, rate = ffmpeg_f32(path)
        x.reshape(-1, ch).mean(1, dtype=np.float64).astype("<f4").tofile(os.path.join(xfer, clip + ".mean.f32"))
        rates[clip] = rate
        print(clip, rate, ch, len(g4))
    with open(os.path.join(xfer, "rates.json"), "w") as f:
        json.dump(rates, f)


def rel_l2(a, b):
    n = min(len(a), len(b))
    return float(np.linalg.norm(a[:n] - b[:n]) / np.linalg.norm(b[:n]))


def reference(xfer, out):
    import torch
    import torchaudio
    import torchaudio.functional as AF
    import transformers
    from transformers import Gemma4ForConditionalGeneration
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    os.makedirs(out, exist_ok=True)
    model = Gemma4ForConditionalGeneration.from_pretrained(
        os.path.join(ROOT, "tests", "fixtures", "e2b_tiny"), dtype=torch.float32, attn_implementation="eager").eval()
    ac = model.config.audio_config
    fe = Gemma4AudioFeatureExtractor(feature_size=4 * (ac.subsampling_conv_channels[0] // 4))

    @torch.no_grad()
    def tower(pcm):
        feats = fe([pcm], return_tensors="pt")
        o = model.model.get_audio_features(feats["input_features"], feats["input_features_mask"], return_dict=True)
        return o.pooler_output[0][o.attention_mask[0]].numpy().astype("<f4")

    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "torchaudio": torchaudio.__version__, "checkpoint": "tests/fixtures/e2b_tiny", "clips": []}
    aud = os.path.join(ROOT, "tests", "fixtures", "towers", "audio")
    ref0 = np.fromfile(os.path.join(aud, "clip0.tower.f32"), "<f4")
    got0 = tower(np.fromfile(os.path.join(aud, "clip0.pcm.f32"), "<f4")).ravel()
    meta["check_clip0_tower_rel_l2"] = rel_l2(got0, ref0) if got0.size == ref0.size else "shape differs"
    rates = json.load(open(os.path.join(xfer, "rates.json")))
    for clip in CLIPS:
        g4 = np.fromfile(os.path.join(xfer, clip + ".g4_16k.f32"), "<f4")
        mean = torch.from_numpy(np.fromfile(os.path.join(xfer, clip + ".mean.f32"), "<f4"))
        ta = AF.resample(mean, rates[clip], 16000).numpy().astype("<f4")
        ta.tofile(os.path.join(out, clip + ".torchaudio16k.f32"))
        t_g4, t_ta = tower(g4), tower(ta)
        t_g4.tofile(os.path.join(out, clip + ".tower.f32"))
        meta["clips"].append({
            "file": clip, "rate": rates[clip], "g4_16k": clip + ".g4_16k.f32", "n_samples": int(len(g4)),
            "tower": clip + ".tower.f32", "n_soft": int(t_g4.shape[0]), "hidden": int(t_g4.shape[1]),
            "torchaudio16k": clip + ".torchaudio16k.f32", "n_samples_torchaudio": int(len(ta)),
            "samples_rel_l2_g4_vs_torchaudio": rel_l2(g4, ta),
            "tokens_rel_l2_torchaudio_samples_vs_g4_samples":
                rel_l2(t_ta.ravel(), t_g4.ravel()) if t_ta.shape == t_g4.shape else "shape differs"})
    with open(os.path.join(out, "audio_file_tokens.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "samples":
        samples(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "reference":
        reference(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
