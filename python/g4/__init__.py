"""g4 from Python: compile a Gemma 4 checkpoint (and a PEFT adapter) into a plan, then run it.

    import g4
    path, report = g4.compile("my-gemma", "my-adapter", out="model.g4plan")
    plan = g4.Plan(path)
    s = plan.session()
    print(s.generate("The capital of France is", max_new_tokens=16, temperature=0))

The compiled runtime and compiler live in the extension module ``g4._g4``; this package is the documented
API over it (docs/python.md).
"""

from __future__ import annotations

from . import _g4
from ._compile import CompileResult, compile
from ._errors import (
    BY_STATUS,
    CancelledError,
    CompileError,
    ContextFullError,
    Error,
    FileError,
    InternalError,
    InvalidArgumentError,
    NoTokenizerError,
    OutOfMemoryError,
    PlanCorruptError,
    PlanError,
    PlanVersionError,
    UnsupportedError,
)
from ._plan import Generation, Plan, Session

_g4._set_error_classes(dict(BY_STATUS))

__version__: str = _g4.runtime_version()

__all__ = [
    "CancelledError",
    "CompileError",
    "CompileResult",
    "ContextFullError",
    "Error",
    "FileError",
    "Generation",
    "InternalError",
    "InvalidArgumentError",
    "NoTokenizerError",
    "OutOfMemoryError",
    "Plan",
    "PlanCorruptError",
    "PlanError",
    "PlanVersionError",
    "Session",
    "UnsupportedError",
    "compile",
]
