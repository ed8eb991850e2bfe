#!/usr/bin/env python3
"""make_media_fixtures.py - image pixel formats, audio files and a multi-media prompt, with what Hugging Face's
Gemma 4 processing makes of them.

Two steps:
  python3 tools/make_media_fixtures.py inputs      (Pillow, numpy, the ffmpeg CLI: writes the input files)
  python3 tools/make_media_fixtures.py reference   (torch, transformers: reads them, writes the reference)

Outputs, tests/fixtures/towers/formats/ (images) and tests/fixtures/towers/audio_files/ (clips):
  <image>                    inputs: RGBA, LA, palette + tRNS, 1-bit, 8/16-bit grey, 16-bit RGB(A) PNG; RGB,
                             4:4:4, progressive, grey and CMYK JPEG; JPEGs with EXIF orientation 2..8; a GIF
                             with a transparent index
  <image>.ref.png            transformers.image_utils.load_image(path) (PIL.ImageOps.exif_transpose, then
                             convert("RGB")): the RGB pixels the processor starts from, losslessly
  rgba_150x260_t70.resized.png / .pos.bin  Gemma4ImageProcessor(max_soft_tokens=70) pixel_values of the RGBA
                             image, un-patchified as uint8 (asserted lossless), and image_position_ids
  formats.json               cases, Pillow's mode of each input, versions, the e2e prompts below
  e2e_rgba.logits.f32        [T, 512] e2b_tiny float32 logits of [bos, text, boi*, n x image, eoi*, text]
                             with the RGBA image
  e2e_multi.logits.f32       [rows, 512] (every 4th position and every non-placeholder one) of [bos, 17, boi*, image A, eoi*, 18, boa*, clip, eoa*, 19, boi*, image B,
                             eoi*, 20]: image A towers/image/rgb_37x53.png, clip towers/audio/clip0.wav, image B
                             towers/image/rgb_640x480.png (the stand-ins 300/301/500/501 for boi/eoi/boa/eoa)
  audio_files/<clip>         44.1 kHz stereo WAV, 48 kHz stereo FLAC, MP3, Ogg/Opus, M4A/AAC of one signal
  audio_files/<clip>.ref16k.f32  transformers.audio_utils.load_audio(path) (16 kHz mono), where it can load it
  audio_files/audio_files.json   which loader ran, and torchaudio's resample of the lossless files' samples

  python3 tools/make_media_fixtures.py video OUT_DIR   (torch, transformers, OpenCV: the video reference)
  video/<clip>.ref.frames.png    the processor's sampled frames as load_video decodes them, stacked top to bottom
  video/<clip>.ref.resized.png   its pixel_values_videos of the first and last frames, un-patchified as uint8
                                 (asserted lossless), stacked
  video/<clip>.ref.logits.f32    e2b_tiny_mm float32 logits of [bos, 17, the video's text and blocks, 18] at
                                 the rows video_ref.json lists; video_ref.json: sampling, timestamps, the
                                 processor's text, ids, soft tokens a frame, 4 greedy tokens
"""
import io
import json
import os
import struct
import subprocess
import sys
import wave
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FMT = os.path.join(ROOT, "tests", "fixtures", "towers", "formats")
AUD = os.path.join(ROOT, "tests", "fixtures", "towers", "audio_files")
VID = os.path.join(ROOT, "tests", "fixtures", "towers", "video")
BOI, EOI, BOA, EOA = 300, 301, 500, 501
IMAGE_TOKEN, AUDIO_TOKEN = 258880, 258881
# The video parity clips (odd sizes and frame rates; more frames than the processor's 32), made by `inputs`.
VIDEO_CLIPS = ("clip_99x57_14.985fps.mp4", "clip_83x65_23.976fps.webm")


def smooth(h, w, ch, seed):
    rng = np.random.default_rng(seed)
    y, x = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
    out = np.zeros((h, w, ch))
    for c in range(ch):
        a, b, ph = rng.uniform(1, 4), rng.uniform(1, 4), rng.uniform(0, 6.28)
        out[..., c] = 0.5 + 0.45 * np.sin(2 * np.pi * (a * x + b * y) + ph)
    return out  # [0, 1]


def signal(sr):
    """0.9 s of two tones and a chirp, different per channel: float64 [n, 2]."""
    t = np.arange(int(0.9 * sr)) / sr
    left = 0.4 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * (200 + 2000 * t) * t)
    right = 0.3 * np.sin(2 * np.pi * 1250 * t) + 0.1 * np.sin(2 * np.pi * 7000 * t)
    return np.stack([left, right], 1)


def int16(x):
    return np.clip(np.rint(x * 32767), -32768, 32767).astype("<i2")


def png16(path, arr, color_type):
    """A 16-bit PNG (Pillow cannot write 16-bit RGB): arr uint16 [h, w, ch] or [h, w]."""
    h, w = arr.shape[:2]
    raw = b"".join(b"\x00" + arr[r].astype(">u2").tobytes() for r in range(h))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0))
    data += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    open(path, "wb").write(data)


def inputs():
    import PIL.Image
    os.makedirs(FMT, exist_ok=True)
    os.makedirs(AUD, exist_ok=True)
    H, W = 47, 33
    u8 = lambda a: np.clip(np.rint(a * 255), 0, 255).astype(np.uint8)
    rgba = u8(smooth(260, 150, 4, 1))
    rgba[:, :40, 3] = 0                       # transparent with colour behind it
    rgba[:, 40:80, 3] = (np.arange(260)[:, None] % 256).astype(np.uint8)
    PIL.Image.fromarray(rgba, "RGBA").save(os.path.join(FMT, "rgba_150x260.png"), optimize=True)
    la = u8(smooth(H, W, 2, 2))
    la[:10, :, 1] = 0
    PIL.Image.fromarray(la, "LA").save(os.path.join(FMT, "la.png"))
    pal = PIL.Image.fromarray(u8(smooth(H, W, 3, 3)), "RGB").quantize(16)
    pal.info["transparency"] = bytes([0, 128, 255, 0] + [255] * 12)
    pal.save(os.path.join(FMT, "palette_trns.png"), transparency=bytes([0, 128, 255, 0] + [255] * 12))
    PIL.Image.fromarray(u8(smooth(H, W, 1, 4))[..., 0] > 127).save(os.path.join(FMT, "bw1.png"))
    PIL.Image.fromarray(u8(smooth(H, W, 1, 5))[..., 0], "L").save(os.path.join(FMT, "grey8.png"))
    g16 = (smooth(H, W, 1, 6)[..., 0] * 65535).astype(np.uint16)
    g16[:, :12] //= 200                       # below 256: Pillow keeps these grey, the rest clip to white
    png16(os.path.join(FMT, "grey16.png"), g16, 0)
    png16(os.path.join(FMT, "rgb16.png"), (smooth(H, W, 3, 7) * 65535).astype(np.uint16), 2)
    png16(os.path.join(FMT, "rgba16.png"), (smooth(H, W, 4, 8) * 65535).astype(np.uint16), 6)
    rgb = PIL.Image.fromarray(u8(smooth(H, W, 3, 9)), "RGB")
    rgb.save(os.path.join(FMT, "rgb420.jpg"), quality=90)
    rgb.save(os.path.join(FMT, "rgb444.jpg"), quality=90, subsampling=0)
    rgb.save(os.path.join(FMT, "progressive.jpg"), quality=90, progressive=True)
    rgb.convert("L").save(os.path.join(FMT, "grey.jpg"), quality=90)
    rgb.convert("CMYK").save(os.path.join(FMT, "cmyk.jpg"), quality=90)
    small = PIL.Image.fromarray(u8(smooth(16, 24, 3, 10)), "RGB")
    for o in range(2, 9):
        ex = PIL.Image.Exif()
        ex[0x0112] = o
        small.save(os.path.join(FMT, f"exif_o{o}.jpg"), quality=95, exif=ex.tobytes())
    gif = PIL.Image.fromarray(u8(smooth(H, W, 3, 11)), "RGB").quantize(8)
    gif.save(os.path.join(FMT, "trns.gif"), transparency=2)

    def wav(path, x, sr):
        pcm = int16(x)
        with wave.open(path, "wb") as w:
            w.setnchannels(x.shape[1]); w.setsampwidth(2); w.setframerate(sr); w.writeframes(pcm.tobytes())
    wav(os.path.join(AUD, "tones_44k1_stereo.wav"), signal(44100), 44100)
    tmp = os.path.join(AUD, "_48k.wav")
    wav(tmp, signal(48000), 48000)
    ff = ["ffmpeg", "-v", "error", "-y", "-i", tmp, "-map_metadata", "-1", "-fflags", "+bitexact"]
    subprocess.check_call(ff + ["-c:a", "flac", os.path.join(AUD, "tones_48k_stereo.flac")])
    subprocess.check_call(ff + ["-c:a", "libmp3lame", "-b:a", "64k", os.path.join(AUD, "tones.mp3")])
    subprocess.check_call(ff + ["-c:a", "libopus", "-b:a", "32k", os.path.join(AUD, "tones.opus.ogg")])
    subprocess.check_call(ff + ["-c:a", "aac", "-b:a", "48k", os.path.join(AUD, "tones.m4a")])
    os.remove(tmp)
    # video: 2 s of a moving pattern, odd size and frame rate, H.264 in MP4 and VP9 in WebM
    os.makedirs(VID, exist_ok=True)
    src = ["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i",
           "testsrc2=size=128x80:rate=12.5:duration=2", "-vf", "scale=97:61", "-fflags", "+bitexact", "-map_metadata", "-1"]
    subprocess.check_call(src + ["-c:v", "libx264", "-pix_fmt", "yuv444p", "-crf", "28",
                                 os.path.join(VID, "pattern_97x61_12.5fps.mp4")])
    subprocess.check_call(src + ["-c:v", "libvpx-vp9", "-b:v", "60k", os.path.join(VID, "pattern_97x61_12.5fps.webm")])
    # the parity clips: 45 frames of 99x57 at 15000/1001 fps (H.264 4:4:4), 40 of 83x65 at 24000/1001 (VP9 4:2:0)
    for (w, h, rate, n, codec), name in zip(((99, 57, "15000/1001", 45, ["-c:v", "libx264", "-pix_fmt", "yuv444p",
                                                                      "-crf", "30"]),
                                             (83, 65, "24000/1001", 40, ["-c:v", "libvpx-vp9", "-b:v", "50k"])),
                                            VIDEO_CLIPS):
        subprocess.check_call(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", f"testsrc2=size=160x96:rate={rate}",
                               "-vf", f"scale={w}:{h}", "-frames:v", str(n), "-fflags", "+bitexact",
                               "-map_metadata", "-1"] + codec + [os.path.join(VID, name)])
    for d in (FMT, AUD, VID):
        for f in sorted(os.listdir(d)):
            print(f, os.path.getsize(os.path.join(d, f)))


def save_png(arr, path):
    import PIL.Image
    PIL.Image.fromarray(arr, "RGB").save(path, optimize=True)


def reference(out_root):
    import PIL
    import PIL.Image
    import torch
    import transformers
    from transformers import Gemma4ForConditionalGeneration
    from transformers.image_utils import load_image
    from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor
    fmt_out = os.path.join(out_root, "formats")
    aud_out = os.path.join(out_root, "audio_files")
    os.makedirs(fmt_out, exist_ok=True)
    os.makedirs(aud_out, exist_ok=True)
    meta = {"transformers": transformers.__version__, "pillow": PIL.__version__, "torch": torch.__version__,
            "images": []}
    proc = Gemma4ImageProcessor(max_soft_tokens=70)
    for f in sorted(os.listdir(FMT)):
        if f.endswith((".ref.png", ".resized.png", ".bin", ".json", ".f32")):
            continue
        path = os.path.join(FMT, f)
        im = load_image(path)
        arr = np.asarray(im)
        save_png(arr, os.path.join(fmt_out, f + ".ref.png"))
        entry = {"file": f, "pil_mode": PIL.Image.open(path).mode, "ref": f + ".ref.png",
                 "size_wh": [im.width, im.height]}
        try:
            a = proc(images=path, return_tensors="pt")["pixel_values"]
            b = proc(images=im, return_tensors="pt")["pixel_values"]
            entry["processor_path_equals_load_image"] = bool(torch.equal(a, b))
        except Exception as e:  # noqa: BLE001
            entry["processor_path_error"] = str(e)[:200]
        meta["images"].append(entry)
    try:
        # the RGBA image through the processor, and through the model
        path = os.path.join(FMT, "rgba_150x260.png")
        feats = proc(images=load_image(path), return_tensors="pt")
        pv, pos = feats["pixel_values"][0], feats["image_position_ids"][0]
        n = int((pos != -1).all(-1).sum())
        gw, gh = int(pos[:n, 0].max()) + 1, int(pos[:n, 1].max()) + 1
        real = pv[:n].numpy().reshape(gh, gw, 16, 16, 3).transpose(0, 2, 1, 3, 4).reshape(gh * 16, gw * 16, 3)
        u8 = np.rint(real.astype(np.float64) * 255).astype(np.uint8)
        lossless = {"f64": bool(np.array_equal((u8.astype(np.float64) * (1 / 255)).astype(np.float32), real)),
                    "f32": bool(np.array_equal(u8.astype(np.float32) * np.float32(1 / 255), real))}
        assert lossless["f64"] or lossless["f32"], "pixel_values are not u8/255"
        real.astype("<f4").tofile(os.path.join(fmt_out, "rgba_pv.f32"))
        save_png(u8, os.path.join(fmt_out, "rgba_150x260_t70.resized.png"))
        pos[:n].numpy().astype("<i4").tofile(os.path.join(fmt_out, "rgba_150x260_t70.pos.bin"))
        n_soft = int(feats["num_soft_tokens_per_image"][0])
        model = Gemma4ForConditionalGeneration.from_pretrained(
            os.path.join(ROOT, "tests", "fixtures", "e2b_tiny"), dtype=torch.float32,
            attn_implementation="eager").eval()
        ids = [2, 17, BOI] + [IMAGE_TOKEN] * n_soft + [EOI, 18, 19]
        with torch.no_grad():
            lg = model(input_ids=torch.tensor([ids]), pixel_values=pv[None], image_position_ids=pos[None].long(),
                       use_cache=False).logits[0]
        lg.numpy().astype("<f4").tofile(os.path.join(fmt_out, "e2e_rgba.logits.f32"))
        meta["e2e_rgba"] = {"image": "rgba_150x260.png", "n_soft": n_soft, "ids": ids, "logits": "e2e_rgba.logits.f32",
                            "grid_wh": [gw, gh], "resized": "rgba_150x260_t70.resized.png",
                            "pos": "rgba_150x260_t70.pos.bin", "lossless": lossless}
        # two images and a clip in one prompt
        from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
        ac = model.config.audio_config
        fe = Gemma4AudioFeatureExtractor(feature_size=4 * (ac.subsampling_conv_channels[0] // 4))
        imgs = [os.path.join(ROOT, "tests/fixtures/towers/image", f) for f in ("rgb_37x53.png", "rgb_640x480.png")]
        fi = proc(images=[load_image(p) for p in imgs], return_tensors="pt")
        with wave.open(os.path.join(ROOT, "tests/fixtures/towers/audio/clip0.wav")) as w:
            pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768.0
        fa = fe([pcm], return_tensors="pt")
        with torch.no_grad():
            na = int(model.model.get_audio_features(fa["input_features"], fa["input_features_mask"],
                                                    return_dict=True).attention_mask[0].sum())
        nA, nB = [int(x) for x in fi["num_soft_tokens_per_image"]]
        ids = ([2, 17, BOI] + [IMAGE_TOKEN] * nA + [EOI, 18, BOA] + [AUDIO_TOKEN] * na + [EOA, 19, BOI] +
               [IMAGE_TOKEN] * nB + [EOI, 20])
        with torch.no_grad():
            lg = model(input_ids=torch.tensor([ids]), pixel_values=fi["pixel_values"],
                       image_position_ids=fi["image_position_ids"].long(), input_features=fa["input_features"],
                       input_features_mask=fa["input_features_mask"], use_cache=False).logits[0]
        # kept small: every 4th position and every position that is not a placeholder
        rows = [i for i, t in enumerate(ids) if i % 4 == 0 or t not in (IMAGE_TOKEN, AUDIO_TOKEN)]
        lg[rows].numpy().astype("<f4").tofile(os.path.join(fmt_out, "e2e_multi.logits.f32"))
        meta["e2e_multi"] = {"images": ["rgb_37x53.png", "rgb_640x480.png"], "clip": "clip0.wav",
                             "n_soft": [nA, na, nB], "ids": ids, "logits": "e2e_multi.logits.f32",
                             "rows": rows, "note": "logits kept at these rows only, [len(rows), 512]"}
    except Exception:  # noqa: BLE001
        import traceback
        meta["error"] = traceback.format_exc()[-2000:]
    with open(os.path.join(fmt_out, "formats.json"), "w") as f:
        json.dump(meta, f, indent=1)

    am = {}
    try:
        # audio: transformers' own loader, and torchaudio on the lossless files' exact samples
        from transformers import audio_utils
        am = {"loaders": {}, "clips": []}
        for mod in ("torchcodec", "librosa", "soxr", "torchaudio", "soundfile", "av", "cv2", "decord"):
            try:
                m = __import__(mod)
                am["loaders"][mod] = getattr(m, "__version__", "?")
            except Exception as e:  # noqa: BLE001
                am["loaders"][mod] = "absent: " + str(e)[:80]
        for f in sorted(os.listdir(AUD)):
            if f.endswith((".f32", ".json")):
                continue
            entry = {"file": f}
            try:
                x = audio_utils.load_audio(os.path.join(AUD, f), sampling_rate=16000)
                np.asarray(x, dtype="<f4").tofile(os.path.join(aud_out, f + ".ref16k.f32"))
                entry["load_audio"] = {"n": int(len(x)), "file": f + ".ref16k.f32"}
            except Exception as e:  # noqa: BLE001
                entry["load_audio_error"] = str(e)[:300]
            am["clips"].append(entry)
        try:
            import torchaudio.functional as AF
            with wave.open(os.path.join(AUD, "tones_44k1_stereo.wav")) as w:
                x = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2).astype(np.float32) / 32768.0
            mono = torch.from_numpy(x.mean(1))
            y = AF.resample(mono, 44100, 16000)
            y.numpy().astype("<f4").tofile(os.path.join(aud_out, "tones_44k1_stereo.wav.torchaudio16k.f32"))
            am["torchaudio_resample"] = {"file": "tones_44k1_stereo.wav.torchaudio16k.f32", "of": "mean of the "
                                         "channels of int16/32768, torchaudio.functional.resample 44100->16000 defaults"}
        except Exception as e:  # noqa: BLE001
            am["torchaudio_error"] = str(e)[:300]
    except Exception:  # noqa: BLE001
        import traceback
        am["error"] = traceback.format_exc()[-2000:]
    with open(os.path.join(aud_out, "audio_files.json"), "w") as f:
        json.dump(am, f, indent=1)


def video_reference(out):
    """The video prompts as transformers builds them, for the clips VIDEO_CLIPS: every frame through
    transformers.video_utils.load_video (OpenCV backend: the reference machine has no torchcodec), then
    Gemma4VideoProcessor's own sampling, resize and patching (its defaults: 32 frames, 70 soft tokens a frame),
    Gemma4Processor.replace_video_token's text, and the float32 model's prompt logits and greedy tokens."""
    import PIL.Image
    import tokenizers
    import torch
    import transformers
    from transformers import Gemma4ForConditionalGeneration
    from transformers.models.gemma4 import processing_gemma4 as ppm
    from transformers.models.gemma4 import video_processing_gemma4 as vpm
    from transformers.video_utils import load_video
    os.makedirs(out, exist_ok=True)
    ckpt = os.path.join(ROOT, "tests", "fixtures", "e2b_tiny_mm")
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    boi, eoi, video_id = cfg["boi_token_id"], cfg["eoi_token_id"], cfg["video_token_id"]
    tok = tokenizers.Tokenizer.from_file(os.path.join(ckpt, "tokenizer.json"))
    model = Gemma4ForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    vp = vpm.Gemma4VideoProcessor()
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "decoder": "opencv " +
            __import__("cv2").__version__, "processor": {k: getattr(vp, k) for k in
            ("num_frames", "max_soft_tokens", "patch_size", "pooling_kernel_size", "do_sample_frames")}, "clips": []}

    class Stub:  # what replace_video_token reads of the processor, with marker strings for the special tokens
        boi_token, eoi_token, video_token, video_processor = "\x01", "\x02", "\x03", vp

    for f in VIDEO_CLIPS:
        e = {"file": f}
        try:
            frames, md = load_video(os.path.join(VID, f), backend="opencv",
                                    sample_indices_fn=lambda metadata, **kw: np.arange(metadata.total_num_frames))
            md.frames_indices = None  # the processor samples from every frame, as from a fresh decode
            e["metadata"] = {k: getattr(md, k) for k in ("total_num_frames", "fps", "width", "height", "duration")}
            r = vp(videos=[frames], video_metadata=[md], return_metadata=True, return_tensors="pt")
            m = r["video_metadata"][0]
            idx = [int(i) for i in m.frames_indices]
            pv, pos = r["pixel_values_videos"][0], r["video_position_ids"][0]
            n_soft = int(r["num_soft_tokens_per_video"][0])
            n = int((pos[0] != -1).all(-1).sum())
            gw, gh = int(pos[0, :n, 0].max()) + 1, int(pos[0, :n, 1].max()) + 1
            real = pv[:, :n].numpy().reshape(len(idx), gh, gw, 16, 16, 3).transpose(0, 1, 3, 2, 4, 5)
            real = real.reshape(len(idx) * gh * 16, gw * 16, 3)
            u8 = np.rint(real.astype(np.float64) * 255).astype(np.uint8)
            assert np.array_equal(u8.astype(np.float32) * np.float32(1 / 255), real) or np.array_equal(
                (u8.astype(np.float64) / 255).astype(np.float32), real), "pixel values are not u8/255"
            base = f + ".ref"
            PIL.Image.fromarray(np.concatenate([frames[i] for i in idx], 0), "RGB").save(
                os.path.join(out, base + ".frames.png"), optimize=True)
            keep = [0, len(idx) - 1]  # the first and last frames' pixel values (all 32 would take 3 MB)
            fh = gh * 16
            PIL.Image.fromarray(np.concatenate([u8[k * fh:(k + 1) * fh] for k in keep], 0), "RGB").save(
                os.path.join(out, base + ".resized.png"), optimize=True)
            try:
                text = ppm.Gemma4Processor.replace_video_token(Stub(), r, 0)
                e["text_from"] = "Gemma4Processor.replace_video_token"
            except Exception as ex:  # noqa: BLE001
                text = " ".join("%02d:%02d \x01%s\x02" % (int(t // 60), int(t % 60), "\x03" * n_soft)
                                for t in (i / md.fps for i in idx))
                e["text_from"] = "mm:ss of index / fps (replace_video_token failed: %s)" % str(ex)[:200]
            ids, piece = [], ""
            for ch in text + "\x00":
                if ch in "\x00\x01\x02\x03":
                    if piece:
                        ids += tok.encode(piece, add_special_tokens=False).ids
                    piece = ""
                    ids += {"\x01": [boi], "\x02": [eoi], "\x03": [video_id], "\x00": []}[ch]
                else:
                    piece += ch
            prompt = [2, 17] + ids + [18]
            kw = dict(pixel_values_videos=r["pixel_values_videos"], video_position_ids=r["video_position_ids"])
            with torch.no_grad():
                lg = model(input_ids=torch.tensor([prompt]), use_cache=False, **kw).logits[0]
            try:
                with torch.no_grad():
                    gen = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=4, do_sample=False,
                                         **kw)[0, len(prompt):]
            except Exception as ex:  # noqa: BLE001
                e["generate_error"] = str(ex)[:300]
                gen = lg[-1:].argmax(-1)
            rows = [i for i in range(len(prompt)) if i % 24 == 0 or i >= len(prompt) - 4]
            lg[rows].numpy().astype("<f4").tofile(os.path.join(out, base + ".logits.f32"))
            e.update({"frames_indices": idx, "timestamps": [float(t) for t in m.timestamps], "text": text.replace(
                "\x01", "<boi>").replace("\x02", "<eoi>").replace("\x03" * n_soft, "<video x %d>" % n_soft),
                "n_soft": n_soft, "grid_wh": [gw, gh], "frames": base + ".frames.png",
                "resized": base + ".resized.png", "resized_frames": keep, "ids": prompt, "rows": rows, "logits": base + ".logits.f32",
                "greedy": [int(t) for t in gen]})
        except Exception:  # noqa: BLE001
            import traceback
            e["error"] = traceback.format_exc()[-2000:]
        meta["clips"].append(e)
    with open(os.path.join(out, "video_ref.json"), "w") as fh:
        json.dump(meta, fh, indent=1, default=str)


if __name__ == "__main__":
    if sys.argv[1:] == ["inputs"]:
        inputs()
    elif len(sys.argv) == 3 and sys.argv[1] == "reference":
        reference(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "video":
        video_reference(sys.argv[2])
    else:
        sys.exit("usage: make_media_fixtures.py inputs | reference OUT_DIR | video OUT_DIR")
