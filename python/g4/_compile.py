"""g4.compile: a Hugging Face checkpoint directory (and a PEFT adapter) -> one plan file, as `g4 compile`."""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, NamedTuple, Sequence, Union

from . import _g4
from ._errors import InvalidArgumentError

PathLike = Union[str, "os.PathLike[str]"]
Size = Union[str, int]


class CompileResult(NamedTuple):
    """What g4.compile returns: the plan's path and the compile report.

    ``report`` holds ``fidelity`` (None for a lossless plan, with ``fidelity=False`` or ``dry_run=True``;
    else a dict: ``rel_l2``, the relative L2 error of the plan's logits against the full-precision merged
    model on a calibration prompt, ``top1_agree`` and ``tokens``, the positions whose argmax agrees out of the
    prompt's), ``weights_bytes``, ``activation_bytes``, ``kv_cache_bytes``, ``max_context``,
    ``adapter_weights_merged`` and ``log`` (the report `g4 compile` prints). A CompileResult is path-like:
    ``g4.Plan(g4.compile(...))`` works.
    """

    path: str | None
    report: dict[str, Any]

    def __fspath__(self) -> str:
        if self.path is None:
            raise InvalidArgumentError("a dry run writes no plan")
        return self.path


def _size(name: str, v: Size) -> str:
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise InvalidArgumentError(f"{name}: expected a size such as '12GiB' or a number of bytes, got {v!r}")
    return str(v)


def compile(
    model_dir: PathLike,
    adapter: PathLike | None = None,
    *,
    out: PathLike | None = None,
    weights: str = "nf4",
    device: str = "cpu",
    gpu_mem: Size | Sequence[Size] | None = None,
    cpu_mem: Size | None = None,
    place: str | Sequence[str] | Mapping[str, str] | None = None,
    max_context: int | None = None,
    chunk: int | None = None,
    logits_rows: int | None = None,
    max_sessions: int | None = None,
    quantize: str | None = None,
    keep: str | None = None,
    double_quant: bool = False,
    kv_dtype: str | None = None,
    tokenizer: PathLike | None = None,
    target: str | None = None,
    prefill_precision: str | None = None,
    cpu_precision: str | None = None,
    deterministic: bool = False,
    vision: bool = True,
    audio: bool = True,
    image_tokens: int | None = None,
    max_image_pixels: int | None = None,
    max_audio_seconds: float | None = None,
    max_media_tokens: int | None = None,
    tower_precision: str | None = None,
    fidelity: bool = True,
    lm_screen: bool = True,
    dry_run: bool = False,
    progress: Callable[[str], Any] | None = None,
) -> CompileResult:
    """Compiles the checkpoint in ``model_dir`` (what ``save_pretrained`` writes) into the plan ``out``.

    ``adapter`` is a PEFT adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``), merged
    in fp32 before quantization. The other keywords are `g4 compile`'s options (``g4 compile --help``;
    docs/python.md lists the mapping): ``weights`` nf4 | bf16 | f32; ``device`` cpu | cuda | cuda:N;
    ``gpu_mem`` one size, or one "[IDX:]SIZE" a GPU; ``cpu_mem`` a size; ``place`` "component=target" items
    (a list, a comma-separated string or a dict); ``max_context`` positions a session holds (default
    min(4096, the model's)). ``progress`` is called with each line of the compile log as it is written
    (raising in it stops the compile; the exception propagates). The plan is written to a temporary file and
    renamed into place, so a failed compile leaves an existing ``out`` untouched. The GIL is released while
    the compiler runs.

    Returns ``CompileResult(path, report)``. Raises g4.CompileError with the compiler's one-line message.
    """
    if out is None and not dry_run:
        raise InvalidArgumentError("g4.compile: missing out=PLAN (the plan file to write)")
    opts: dict[str, Any] = {
        "model_dir": os.fspath(model_dir),
        "out_path": os.fspath(out) if out is not None else "",
        "weights": weights,
        "device": device,
        "double_quant": double_quant,
        "deterministic": deterministic,
        "vision": vision,
        "audio": audio,
        "fidelity": fidelity,
        "lm_screen": lm_screen,
        "dry_run": dry_run,
    }
    if adapter is not None:
        opts["adapter_dir"] = os.fspath(adapter)
    if tokenizer is not None:
        opts["tokenizer"] = os.fspath(tokenizer)
    if gpu_mem is not None:
        items = [gpu_mem] if isinstance(gpu_mem, (str, int)) else list(gpu_mem)
        opts["gpu_mem"] = [_size("gpu_mem", v) for v in items]
    if cpu_mem is not None:
        opts["cpu_mem"] = _size("cpu_mem", cpu_mem)
    if place is not None:
        if isinstance(place, Mapping):
            place = [f"{k}={v}" for k, v in place.items()]
        opts["place"] = place if isinstance(place, str) else ",".join(place)
    for key, value in (
        ("max_context", max_context),
        ("chunk", chunk),
        ("logits_rows", logits_rows),
        ("max_sessions", max_sessions),
        ("image_tokens", image_tokens),
        ("max_media_tokens", max_media_tokens),
    ):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"g4.compile: {key} must be a positive integer, got {value!r}")
            opts[key] = value
    if max_image_pixels is not None:
        opts["max_image_pixels"] = int(max_image_pixels)
    if max_audio_seconds is not None:
        opts["max_audio_seconds"] = float(max_audio_seconds)
    for key, value in (
        ("quantize", quantize),
        ("keep", keep),
        ("kv_dtype", kv_dtype),
        ("target", target),
        ("prefill_precision", prefill_precision),
        ("cpu_precision", cpu_precision),
        ("tower_precision", tower_precision),
    ):
        if value is not None:
            opts[key] = value
    raw = _g4.compile(opts, progress)
    fid = None
    if raw["fidelity_measured"]:
        fid = {
            "rel_l2": raw["fidelity_rel_l2"],
            "top1_agree": raw["fidelity_top1_agree"],
            "tokens": raw["fidelity_calibration_tokens"],
        }
    report = {
        "fidelity": fid,
        "weights_bytes": raw["weights_bytes"],
        "activation_bytes": raw["activation_bytes"],
        "kv_cache_bytes": raw["kv_cache_bytes"],
        "max_context": raw["max_context"],
        "adapter_weights_merged": raw["adapter_weights_merged"],
        "log": raw["log"],
    }
    return CompileResult(None if dry_run else raw["out"], report)
