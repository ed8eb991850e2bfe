"""g4.Plan (an opened plan file) and g4.Session (one conversation on it): generation, logits, tokenizer."""

from __future__ import annotations

import json
import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Literal, Mapping, Sequence, Union, overload

import numpy as np

from . import _g4
from ._errors import InvalidArgumentError

PathLike = Union[str, "os.PathLike[str]"]
Message = Mapping[str, Any]  # {"role": ..., "content": str or [{"type": "text"|"image"|"audio", ...}]}
Prompt = Union[str, Sequence[Message]]
ImageInput = Any  # a path, a PIL.Image.Image, or a uint8 array [H, W, 3] (RGB), [H, W, 4] (RGBA) or [H, W]
AudioInput = Any  # a path (any audio file the build decodes), a mono/[n, channels] array at 16 kHz, or (array, sample_rate)

_MSG_STOP = object()


def _decode(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


@dataclass
class Generation:
    """The last generate() call of a session: its text, token ids and why it ended.

    ``finish_reason``: "stop" (an end-of-generation token or a stop string), "length" (max_new_tokens),
    "context_full" (the plan's max context; the tokens so far stay fed) or "cancelled".
    """

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = ""


class Plan:
    """A compiled plan, opened (memory-mapped) once and shared by any number of sessions and threads.

    A CUDA plan runs on the GPU it was compiled for; opening one on a machine without a GPU or CUDA driver
    raises g4.UnsupportedError. ``verify_weights`` checks the weights' checksum (reads every byte).
    """

    def __init__(self, path: PathLike, *, verify_weights: bool = False) -> None:
        self.path: str = os.fspath(path)
        self._engine = _g4.Engine(self.path, verify_weights)
        self._runtime: dict[str, Any] = self._engine.info()
        self._media: dict[str, Any] = self._engine.media_info()
        self._info: dict[str, Any] | None = None

    @property
    def info(self) -> dict[str, Any]:
        """What `g4 inspect` shows: the plan's META (``architecture``, ``device``, ``hparams``, ``policy``,
        ``placement``, ``memory``, ``provenance``, ...), plus ``format``, ``file_size``, ``n_tensors``,
        ``n_ops``, ``runtime`` (vocab_size, max_context, bos/eos ids, weights_bytes, session_bytes, load_ms)
        and ``media`` (the towers, their placeholder ids and limits)."""
        if self._info is None:
            head = _g4.plan_header(self.path)
            info: dict[str, Any] = json.loads(head.pop("meta_json"))
            info.update(head)
            info["runtime"] = dict(self._runtime)
            info["media"] = dict(self._media)
            self._info = info
        return self._info

    @property
    def vocab_size(self) -> int:
        return int(self._runtime["vocab_size"])

    @property
    def max_context(self) -> int:
        return int(self._runtime["max_context"])

    def session(self, *, n_threads: int = 0) -> Session:
        """A new session: its KV cache and all its memory are allocated now. ``n_threads`` 0: the G4_THREADS
        environment variable, else every hardware thread."""
        return Session(self, n_threads)

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special`` puts <bos> first, as Hugging Face's tokenizer does."""
        return list(self._engine.tokenize(text, add_special))

    def detokenize(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        return _decode(self._engine.detokenize([int(i) for i in ids], skip_special))

    def apply_chat_template(
        self, messages: Sequence[Message], *, add_generation_prompt: bool = True, tokenize: bool = False
    ) -> str | list[int]:
        """Renders a conversation with the chat template the plan records (for Gemma 4: <bos>, its turns, and
        "<|turn>model\\n" when ``add_generation_prompt``). Image and audio parts of a message's content become
        their placeholder tokens. ``tokenize``: return the ids instead of the text."""
        text = self._render(messages, add_generation_prompt, None, None)
        return self.tokenize(text, add_special=False) if tokenize else text

    def _placeholder(self, kind: str) -> str:
        tok = self._media["image_token_id" if kind == "image" else "audio_token_id"]
        if tok < 0:
            raise InvalidArgumentError(f"a message has an {kind} part but the plan has no {kind} tower")
        return self.detokenize([tok])

    def _render(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool,
        images: list[Any] | None,
        audio: list[Any] | None,
    ) -> str:
        pairs: list[tuple[str, str]] = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
                raise InvalidArgumentError(f"messages[{i}]: expected a dict with 'role' and 'content'")
            content = m["content"]
            if not isinstance(content, str):
                parts = []
                for p in content:
                    kind = p.get("type") if isinstance(p, Mapping) else None
                    if kind == "text":
                        parts.append(str(p["text"]))
                    elif kind in ("image", "audio"):
                        parts.append(self._placeholder(kind))
                        media = p.get(kind, p.get("path", p.get("url")))
                        target = images if kind == "image" else audio
                        if target is not None and media is not None:
                            target.append(media)
                    else:
                        raise InvalidArgumentError(
                            f"messages[{i}]: a content part must be {{'type': 'text'|'image'|'audio', ...}}"
                        )
                content = "".join(parts)
            pairs.append((str(m["role"]), content))
        return _decode(self._engine.chat_render(pairs, add_generation_prompt))


def _image_rgb(img: Any) -> np.ndarray:
    """An RGB uint8 array [H, W, 3] of a PIL image or an array, as transformers' load_image sees it: PIL's
    convert("RGB"), which drops transparency (an RGBA array keeps its first three channels)."""
    if hasattr(img, "mode") and hasattr(img, "convert"):  # PIL.Image.Image
        img = np.asarray(img.convert("RGB"))
    a = np.asarray(img)
    if a.dtype != np.uint8:
        raise InvalidArgumentError(f"image array: expected uint8 pixels (0-255), got {a.dtype}")
    if a.ndim == 2:
        a = np.repeat(a[:, :, None], 3, axis=2)
    if a.ndim != 3 or a.shape[2] not in (3, 4):
        raise InvalidArgumentError(f"image array: expected [height, width, 3 or 4] or [height, width], got {a.shape}")
    return np.ascontiguousarray(a[:, :, :3], dtype=np.uint8)


def _audio_pcm(clip: Any, rate: int) -> np.ndarray:
    """Mono float32 samples of an array clip, or of (array, sample_rate). Other rates than the tower's are
    refused: resampling is left to the caller (e.g. scipy.signal.resample_poly or librosa.resample), so the
    samples the tower sees are the ones the caller chose."""
    if isinstance(clip, tuple):
        if len(clip) != 2:
            raise InvalidArgumentError("audio: expected an array or (array, sample_rate)")
        clip, clip_rate = clip
        if int(clip_rate) != rate:
            raise InvalidArgumentError(
                f"audio: {clip_rate} Hz, but the audio tower takes {rate} Hz mono; resample first, e.g. "
                f"scipy.signal.resample_poly(x, {rate}, {clip_rate}) or librosa.resample(x, orig_sr={clip_rate}, "
                f"target_sr={rate})"
            )
    a = np.asarray(clip)
    if a.dtype == np.int16:
        a = a.astype(np.float32) / 32768.0
    elif a.dtype.kind != "f":
        raise InvalidArgumentError(f"audio array: expected float samples in [-1, 1] or int16, got {a.dtype}")
    if a.ndim == 2:
        a = a.mean(axis=1)  # [n, channels] -> mono, as the WAV reader does
    if a.ndim != 1:
        raise InvalidArgumentError(f"audio array: expected [samples] or [samples, channels], got {a.shape}")
    return np.ascontiguousarray(a, dtype=np.float32)


class Session:
    """One conversation on a plan: KV cache, position, logits and sampler state, all allocated at creation.

    A session is used by one thread at a time; several sessions (of one plan or several) run in parallel on
    several threads, the GIL released while they compute. Text functions need a plan with a tokenizer.
    """

    def __init__(self, plan: Plan, n_threads: int = 0) -> None:
        self.plan = plan
        self._s = _g4.Session(plan._engine, n_threads)
        self._busy = threading.Lock()
        self.last: Generation = Generation()

    # ---- tokens and logits ----
    @property
    def position(self) -> int:
        """Tokens the session holds (the next token's position)."""
        return int(self._s.position())

    def append(self, ids: Iterable[int] | np.ndarray, *, all_logits: bool = False) -> np.ndarray | None:
        """Feeds token ids (prefill, or one decode step). ``all_logits``: returns the logits of every fed
        token, a new float32 array [len(ids), vocab_size]."""
        arr = np.ascontiguousarray(np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids), dtype=np.int32)
        if arr.ndim != 1 or arr.size == 0:
            raise InvalidArgumentError("append: expected a non-empty list of token ids")
        with self._using():
            return self._s.append(arr, all_logits)

    def logits(self) -> np.ndarray:
        """The logits of the last fed token, float32 [vocab_size]: a read-only view of the session's buffer,
        no copy, valid until the next call that feeds tokens or resets (np.array(s.logits()) keeps them)."""
        with self._using():
            return self._s.logits()

    def sample(self, **sampling: Any) -> int:
        """Chooses the next token from the current logits (does not feed it). Keywords as generate()."""
        with self._using():
            return int(self._s.sample(sampling))

    def reset(self) -> None:
        """Forgets every token and queued image/audio (position 0)."""
        with self._using():
            self._s.reset()
        self.last = Generation()

    def cancel(self) -> None:
        """Asks the running (or next) prefill or generation to stop; safe from any thread."""
        self._s.cancel()

    def stats(self) -> dict[str, Any]:
        """Timings and token counts (g4_session_stats): prefill_ms, decode_ms, ttft_ms, ..."""
        return dict(self._s.stats())

    # ---- generation ----
    @overload
    def generate(
        self, prompt: Prompt | None = ..., *, stream: Literal[False] = ..., **kw: Any
    ) -> str: ...
    @overload
    def generate(self, prompt: Prompt | None = ..., *, stream: Literal[True], **kw: Any) -> Iterator[str]: ...
    def generate(
        self,
        prompt: Prompt | None = None,
        *,
        images: Sequence[ImageInput] = (),
        audio: Sequence[AudioInput] = (),
        max_new_tokens: int = 256,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        min_p: float | None = None,
        repeat_penalty: float | None = None,
        repeat_last_n: int | None = None,
        seed: int | None = None,
        stop: Sequence[str] | str = (),
        ignore_eos: bool = False,
        stream: bool = False,
    ) -> str | Iterator[str]:
        """Feeds ``prompt`` after the tokens the session holds, then generates.

        ``prompt``: text (tokenized with <bos> when the session is empty) or a list of chat messages
        (rendered with the plan's chat template and the generation prompt; the session must be empty:
        reset() first), or None to continue from the current logits. ``images`` / ``audio`` run through the
        plan's towers and take the place of the prompt's lone <|image|> / <|audio|> placeholders, in order, or
        follow <bos> when the prompt has none; in a message, a content part {"type": "image", "image": X}
        adds X. An image is a path, a PIL image or a uint8 array ([H, W, 3] RGB, [H, W, 4] RGBA, [H, W]
        grey); a clip is a path to an audio file (WAV, and through FFmpeg MP3, FLAC, Ogg/Opus, M4A or a
        video's sound track, resampled to 16 kHz mono as the CLI does), a float (or int16) array at 16 kHz,
        mono or [samples, channels], or (array, sample_rate) — arrays at other rates are refused (resample
        first).

        Sampling keywords left None take the plan's generation_config defaults; ``temperature=0`` is greedy.
        Generation stops at an end-of-generation token (not fed, not returned; ``ignore_eos`` ignores it),
        at a stop string (the text before it is returned) or after ``max_new_tokens``. Returns the text, or
        with ``stream=True`` an iterator of text pieces as they are produced (closing it early stops the
        generation). ``self.last`` then holds the text, token ids and finish reason.
        """
        sampling = {
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "min_p": min_p,
            "repeat_penalty": repeat_penalty,
            "repeat_last_n": repeat_last_n,
            "seed": seed,
        }
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise InvalidArgumentError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
        stops = [stop] if isinstance(stop, str) else [str(s) for s in stop]
        images, audio = list(images), list(audio)
        with self._using():
            self._s.check_sampling(sampling)  # before the prompt is fed
            if prompt is not None:
                ids = self._prompt_ids(prompt, images, audio)
                self._s.append(np.asarray(ids, dtype=np.int32), False)
            elif images or audio:
                raise InvalidArgumentError("generate: images and audio need a prompt to go into")
            elif self._s.position() == 0:
                raise InvalidArgumentError("generate: the session is empty; give a prompt")
        if stream:
            return self._stream(sampling, max_new_tokens, ignore_eos, stops)
        with self._using():
            text, ids, status, _ = self._s.generate(sampling, max_new_tokens, ignore_eos, stops, None)
        self.last = Generation(_decode(text), list(ids), self._reason(status, len(ids), max_new_tokens))
        return self.last.text

    def _stream(self, sampling: dict, max_new: int, ignore_eos: bool, stops: list[str]) -> Iterator[str]:
        q: queue.Queue = queue.Queue()
        closed = threading.Event()

        def on_token(token: int, text: bytes) -> bool:
            if text:
                q.put(_decode(text))
            return closed.is_set()

        def run() -> None:
            try:
                q.put(("done", self._s.generate(sampling, max_new, ignore_eos, stops, on_token)))
            except BaseException as e:  # handed to the consumer's thread
                q.put(("error", e))
            finally:
                self._busy.release()

        if not self._busy.acquire(blocking=False):
            raise InvalidArgumentError("the session is in use by another call (one thread at a time)")
        worker = threading.Thread(target=run, name="g4-generate")
        worker.start()

        def pieces() -> Iterator[str]:
            try:
                while True:
                    item = q.get()
                    if isinstance(item, str):
                        yield item
                        continue
                    kind, value = item
                    if kind == "error":
                        raise value
                    text, ids, status, _ = value
                    self.last = Generation(_decode(text), list(ids), self._reason(status, len(ids), max_new))
                    return
            finally:
                closed.set()
                worker.join()

        return pieces()

    @staticmethod
    def _reason(status: int, n: int, max_new: int) -> str:
        if status == 6:
            return "context_full"
        if status == 7:
            return "cancelled"
        return "length" if n >= max_new else "stop"

    def _prompt_ids(self, prompt: Prompt, images: list[Any], audio: list[Any]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.plan.tokenize(prompt, add_special=self._s.position() == 0)
        else:
            if self._s.position() != 0:
                raise InvalidArgumentError(
                    "generate: a list of messages is rendered whole (from <bos>); reset() the session first, "
                    "or pass only the new text"
                )
            text = self.plan._render(prompt, True, images, audio)
            ids = self.plan.tokenize(text, add_special=False)
        if not ids:
            raise InvalidArgumentError("generate: the prompt is empty")
        if images or audio:
            try:
                ids = self._add_media(ids, images, audio)
            except BaseException:
                self._s.clear_media()
                raise
        return ids

    def _add_media(self, ids: list[int], images: list[Any], audio: list[Any]) -> list[int]:
        mi = self.plan._media
        counts_img, counts_aud = [], []
        if images and not mi["has_vision"]:
            raise InvalidArgumentError("images: the plan has no vision tower (compile a checkpoint with vision_config)")
        if audio and not mi["has_audio"]:
            raise InvalidArgumentError("audio: the plan has no audio tower (compile a checkpoint with audio_config)")
        for img in images:
            if isinstance(img, (str, os.PathLike)):
                counts_img.append(self._s.add_image_file(os.fspath(img)))
            else:
                counts_img.append(self._s.add_image(_image_rgb(img)))
        for clip in audio:
            if isinstance(clip, (str, os.PathLike)):
                counts_aud.append(self._s.add_audio_file(os.fspath(clip)))
            else:
                counts_aud.append(self._s.add_audio(_audio_pcm(clip, mi["audio_sample_rate"])))
        bos = self.plan._runtime["bos_token_id"]
        at = [1 if ids and ids[0] == bos else 0]

        def place(counts: list[int], open_id: int, ph: int, close_id: int) -> None:
            for n in counts:
                block = [open_id] + [ph] * n + [close_id]
                lone = next(
                    (
                        i
                        for i, t in enumerate(ids)
                        if t == ph
                        and (i == 0 or ids[i - 1] != open_id)
                        and (i + 1 == len(ids) or ids[i + 1] != ph)
                    ),
                    None,
                )
                if lone is not None:
                    ids[lone : lone + 1] = block
                else:
                    ids[at[0] : at[0]] = block
                    at[0] += len(block)

        place(counts_img, mi["boi_token_id"], mi["image_token_id"], mi["eoi_token_id"])
        place(counts_aud, mi["boa_token_id"], mi["audio_token_id"], mi["eoa_token_id"])
        return ids

    class _Using:
        def __init__(self, lock: threading.Lock) -> None:
            self.lock = lock

        def __enter__(self) -> None:
            if not self.lock.acquire(blocking=False):
                raise InvalidArgumentError("the session is in use by another call (one thread at a time)")

        def __exit__(self, *exc: Any) -> None:
            self.lock.release()

    def _using(self) -> Session._Using:
        return Session._Using(self._busy)
