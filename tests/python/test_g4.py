"""The g4 Python package against the tiny fixtures: compile (with and without an adapter), generation
(streaming and not), images and audio, logits against `g4 run --dump-logits` and the Hugging Face reference,
errors, and sessions on several threads."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import g4
from conftest import FIX, run_cli

PROMPT = "The capital of France is"


def ref_logits(adapter: str, name: str) -> tuple[list[int], np.ndarray]:
    ref_dir = FIX / "adapters" / adapter / "reference"
    meta = json.loads((ref_dir / "reference.json").read_text())
    p = next(p for p in meta["prompts"] if p["name"] == name)
    return p["ids"], np.fromfile(ref_dir / p["logits"], dtype="<f4").reshape(len(p["ids"]), -1)


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


def test_compile_report_and_progress(tmp_path: Path) -> None:
    lines: list[str] = []
    path, report = g4.compile(FIX / "e2b_tiny", out=tmp_path / "nf4.g4plan", progress=lines.append)
    assert Path(path).is_file()
    assert any(line.startswith("g4 compile: ") for line in lines)
    assert "\n".join(lines) + "\n" == report["log"]
    fid = report["fidelity"]  # NF4 is lossy: measured against the full-precision model
    assert fid is not None and 0 < fid["rel_l2"] < 1 and 0 <= fid["top1_agree"] <= fid["tokens"] == 32
    assert f"{fid['rel_l2']:.3e}" in report["log"]
    assert report["weights_bytes"] > 0 and report["max_context"] == 4096
    lossless = g4.compile(FIX / "e2b_tiny", out=tmp_path / "f32.g4plan", weights="f32", max_context=64)
    assert lossless.report["fidelity"] is None and lossless.report["max_context"] == 64
    assert g4.Plan(lossless).max_context == 64
    three = g4.compile(FIX / "e2b_tiny", weights="f32", max_context=64, max_sessions=3, dry_run=True)
    assert "KV cache (f32) (3 sessions)" in three.report["log"]


def test_compile_progress_exception_stops_it(tmp_path: Path) -> None:
    def boom(line: str) -> None:
        raise KeyError("stop here")

    with pytest.raises(KeyError, match="stop here"):
        g4.compile(FIX / "e2b_tiny", out=tmp_path / "x.g4plan", weights="f32", progress=boom)
    assert not (tmp_path / "x.g4plan").exists()


def test_adapter_logits_match_hugging_face(plans: dict[str, str]) -> None:
    ids, ref = ref_logits("e2b_lora", "short")  # HF PeftModel (adapter not merged), float32
    s = g4.Plan(plans["lora"]).session()
    ours = s.append(ids, all_logits=True)
    assert ours.shape == ref.shape
    assert rel_l2(ours, ref) < 1e-4
    np.testing.assert_array_equal(s.logits(), ours[-1])
    base = g4.Plan(plans["text"]).session()
    assert rel_l2(base.append(ids, all_logits=True), ref) > 1e-2  # the adapter changed something


def test_logits_match_cli(plans: dict[str, str], tmp_path: Path) -> None:
    plan = g4.Plan(plans["lora"])
    ids = plan.tokenize(PROMPT)
    dump = tmp_path / "logits.f32"
    r = run_cli("run", plans["lora"], "--tokens", ",".join(map(str, ids)), "-n", "8", "--temp", "0",
                "--ignore-eos", "--dump-logits", str(dump))
    assert r.returncode == 0, r.stderr
    cli = np.fromfile(dump, dtype="<f4").reshape(len(ids), plan.vocab_size)
    s = plan.session()
    np.testing.assert_allclose(s.append(ids, all_logits=True), cli, rtol=1e-5, atol=1e-5)
    s.generate(None, max_new_tokens=8, temperature=0, ignore_eos=True)
    assert " ".join(map(str, s.last.token_ids)) == r.stdout.strip().replace(",", " ")


def test_generate_streaming_and_not(plans: dict[str, str]) -> None:
    plan = g4.Plan(plans["text"])
    s = plan.session()
    text = s.generate(PROMPT, max_new_tokens=12, temperature=0, ignore_eos=True)
    whole = s.last
    assert whole.finish_reason == "length" and len(whole.token_ids) == 12 and whole.text == text
    assert s.position == len(plan.tokenize(PROMPT)) + 12
    s.reset()
    assert s.position == 0
    pieces = list(s.generate(PROMPT, max_new_tokens=12, temperature=0, ignore_eos=True, stream=True))
    assert "".join(pieces) == text and s.last.token_ids == whole.token_ids
    # closing the iterator early stops the generation
    s.reset()
    it = s.generate(PROMPT, max_new_tokens=12, temperature=0, ignore_eos=True, stream=True)
    next(it)
    it.close()
    assert len(plan.tokenize(PROMPT)) < s.position < len(plan.tokenize(PROMPT)) + 12
    # sampling with a seed is reproducible
    outs = []
    for _ in range(2):
        s.reset()
        s.generate(PROMPT, max_new_tokens=8, temperature=1.0, top_k=40, top_p=0.9, seed=7, ignore_eos=True)
        outs.append(s.last.token_ids)
    assert outs[0] == outs[1]


def test_stop_string_and_chat(plans: dict[str, str]) -> None:
    plan = g4.Plan(plans["text"])
    s = plan.session()
    full = s.generate(PROMPT, max_new_tokens=12, temperature=0, ignore_eos=True)
    stop = next((full[i:i + 2] for i in range(2, len(full) - 2) if full[i:i + 2].strip()), None)
    if stop:
        s.reset()
        cut = s.generate(PROMPT, max_new_tokens=12, temperature=0, ignore_eos=True, stop=[stop])
        assert cut == full[: full.index(stop)] and s.last.finish_reason == "stop"
    msgs = [{"role": "user", "content": "hi"}]
    rendered = plan.apply_chat_template(msgs)
    assert isinstance(rendered, str) and rendered.startswith("<bos>") and rendered.endswith("model\n")
    assert plan.apply_chat_template(msgs, tokenize=True) == plan.tokenize(rendered, add_special=False)
    s.reset()
    s.generate(msgs, max_new_tokens=4, temperature=0)
    with pytest.raises(g4.InvalidArgumentError, match="reset"):
        s.generate(msgs, max_new_tokens=4)


def test_tokenizer_and_info(plans: dict[str, str]) -> None:
    plan = g4.Plan(plans["lora"])
    ids = plan.tokenize(PROMPT)
    assert ids[0] == plan.info["runtime"]["bos_token_id"]
    assert plan.detokenize(ids, skip_special=True) == PROMPT
    info = plan.info
    assert info["architecture"] and info["hparams"]["vocab_size"] == plan.vocab_size
    assert info["provenance"]["adapter"]["dir"] == "e2b_lora"
    assert info["runtime"]["max_context"] == plan.max_context


def test_images_and_audio(plans: dict[str, str], tmp_path: Path) -> None:
    plan = g4.Plan(plans["mm"])
    assert plan.info["media"]["has_vision"] and plan.info["media"]["has_audio"]
    img = FIX / "towers" / "image" / "rgb_37x53.png"
    wav = FIX / "towers" / "audio" / "clip0.wav"
    s = plan.session()
    s.generate(PROMPT, images=[img], audio=[wav], max_new_tokens=0)
    by_path = np.array(s.logits())
    st = s.stats()
    assert st["image_tokens"] > 0 and st["audio_tokens"] > 0
    dump = tmp_path / "mm.f32"
    r = run_cli("run", plans["mm"], "-p", PROMPT, "--image", str(img), "--audio", str(wav), "-n", "0",
                "--dump-logits", str(dump))
    assert r.returncode == 0, r.stderr
    cli = np.fromfile(dump, dtype="<f4").reshape(-1, plan.vocab_size)
    # the same plan through two front ends: --dump-logits computes every prompt row's logits (a matrix
    # product), the session the last row's only (a matrix-vector product): they round differently, ~2e-5
    np.testing.assert_allclose(by_path, cli[-1], rtol=1e-5, atol=1e-4)
    assert s.position == cli.shape[0]
    # the same clip as an array (int16 and float, mono and [n, 2]) gives the same logits
    pcm = np.fromfile(FIX / "towers" / "audio" / "clip0.pcm.f32", dtype="<f4")
    as_int16 = np.round(pcm * 32768).clip(-32768, 32767).astype(np.int16)
    for clip in (as_int16, (np.stack([as_int16, as_int16], axis=1), 16000)):
        s.reset()
        s.generate(PROMPT, images=[img], audio=[clip], max_new_tokens=0)
        np.testing.assert_allclose(s.logits(), by_path, rtol=1e-5, atol=1e-5)
    with pytest.raises(g4.InvalidArgumentError, match="16000 Hz"):
        s.generate(PROMPT, audio=[(pcm, 44100)], max_new_tokens=0)
    # an RGBA array: its alpha dropped, as transformers' load_image drops it
    s.reset()
    s.generate(PROMPT, images=[img], max_new_tokens=0)
    ref_img = np.array(s.logits())
    # a compressed clip by path goes through the same decoder and resampler as `g4 run --audio`
    mp3 = FIX / "towers" / "audio_files" / "tones.mp3"
    s.reset()
    s.generate(PROMPT, audio=[mp3], max_new_tokens=0)
    r = run_cli("run", plans["mm"], "-p", PROMPT, "--audio", str(mp3), "-n", "0", "--dump-logits", str(dump))
    assert r.returncode == 0, r.stderr
    cli = np.fromfile(dump, dtype="<f4").reshape(-1, plan.vocab_size)
    np.testing.assert_allclose(s.logits(), cli[-1], rtol=1e-5, atol=1e-5)
    Image = pytest.importorskip("PIL.Image", reason="pillow not installed: PIL image inputs not checked")
    pil = Image.open(img)
    for im in (pil, np.asarray(pil.convert("RGB"))):
        s.reset()
        s.generate(PROMPT, images=[im], audio=[wav], max_new_tokens=0)
        np.testing.assert_allclose(s.logits(), by_path, rtol=1e-5, atol=1e-5)
    # RGBA (an array with any alpha, and a PIL RGBA image): the alpha is dropped, as load_image drops it
    rgb = np.asarray(pil.convert("RGB"))
    rgba = np.concatenate([rgb, np.linspace(0, 255, rgb.shape[0] * rgb.shape[1]).astype(np.uint8).reshape(
        rgb.shape[0], rgb.shape[1], 1)], axis=2)
    for im in (rgba, Image.fromarray(rgba, "RGBA")):
        s.reset()
        s.generate(PROMPT, images=[im], max_new_tokens=0)
        np.testing.assert_allclose(s.logits(), ref_img, rtol=1e-5, atol=1e-5)


def test_errors_carry_g4_messages(plans: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(g4.FileError, match="cannot open plan file"):
        g4.Plan(tmp_path / "missing.g4plan")
    bad = tmp_path / "bad.g4plan"
    bad.write_bytes(b"not a plan" * 100)
    with pytest.raises(g4.PlanError):
        g4.Plan(bad)
    r = run_cli("compile", "--model", str(tmp_path / "nope"), "-o", str(tmp_path / "x.g4plan"))
    with pytest.raises(g4.CompileError) as e:
        g4.compile(tmp_path / "nope", out=tmp_path / "x.g4plan")
    assert r.stderr.strip() == f"g4 compile: error: {e.value}"
    with pytest.raises(g4.CompileError, match="bad_shape"):
        g4.compile(FIX / "e2b_tiny", FIX / "adapters" / "bad_shape", out=tmp_path / "x.g4plan")
    with pytest.raises(g4.InvalidArgumentError, match="max_context"):
        g4.compile(FIX / "e2b_tiny", out=tmp_path / "x.g4plan", max_context=0)
    plan = g4.Plan(plans["text"])
    s = plan.session()
    with pytest.raises(g4.InvalidArgumentError, match="outside the vocabulary"):
        s.append([plan.vocab_size + 5])
    assert s.position == 0
    with pytest.raises(g4.InvalidArgumentError, match="temperature"):
        s.generate(PROMPT, temperature=-1.0)
    with pytest.raises(g4.InvalidArgumentError, match="feed tokens first"):
        s.logits()
    small = g4.compile(FIX / "e2b_tiny", out=tmp_path / "small.g4plan", weights="f32", max_context=8, vision=False,
                       audio=False)
    s2 = g4.Plan(small).session()
    with pytest.raises(g4.ContextFullError):
        s2.append(list(range(3, 20)))
    with pytest.raises(g4.InvalidArgumentError, match="no vision tower"):
        s2.generate("hi", images=[FIX / "towers" / "image" / "rgb_37x53.png"])
    mm = g4.Plan(plans["mm"]).session()
    with pytest.raises(g4.FileError, match="missing.png"):
        mm.generate("hi", images=[tmp_path / "missing.png"])
    with pytest.raises(g4.InvalidArgumentError, match="uint8"):
        mm.generate("hi", images=[np.zeros((8, 8, 3), dtype=np.float32)])
    assert isinstance(g4.InvalidArgumentError("x"), ValueError)


def test_sessions_on_threads(plans: dict[str, str]) -> None:
    plan = g4.Plan(plans["lora"])
    expected = plan.session().generate(PROMPT, max_new_tokens=10, temperature=0, ignore_eos=True)
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            s = plan.session(n_threads=1)
            for _ in range(2):
                s.reset()
                results[i] = s.generate(PROMPT, max_new_tokens=10, temperature=0, ignore_eos=True)
        except BaseException as e:  # reported on the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(results[i] == expected for i in range(4))


def test_stream_left_open_at_exit(plans: dict[str, str]) -> None:
    code = (
        "import g4, sys\n"
        f"s = g4.Plan({plans['text']!r}).session()\n"
        "it = s.generate('hi', max_new_tokens=40, ignore_eos=True, stream=True)\n"
        "next(it)\n"
        "sys.exit(0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "terminate" not in r.stderr, r.stderr
