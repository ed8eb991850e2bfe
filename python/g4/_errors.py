"""Exceptions raised by the g4 package: one class per g4 status, each carrying g4's one-line message."""

from __future__ import annotations


class Error(Exception):
    """Base class of every error g4 raises. ``str(e)`` is g4's one-line message."""

    status = "G4_ERR_INTERNAL"


class InvalidArgumentError(Error, ValueError):
    """A bad value: an out-of-range option or token id, a malformed array, an unknown keyword."""

    status = "G4_ERR_INVALID_ARGUMENT"


class FileError(Error, OSError):
    """A file is missing, unreadable or not in a format g4 reads."""

    status = "G4_ERR_IO"


class PlanError(Error):
    """The plan file cannot be used: written by an incompatible g4 or damaged (re-run g4.compile)."""


class PlanVersionError(PlanError):
    status = "G4_ERR_PLAN_VERSION"


class PlanCorruptError(PlanError):
    status = "G4_ERR_PLAN_CORRUPT"


class OutOfMemoryError(Error, MemoryError):
    status = "G4_ERR_OUT_OF_MEMORY"


class ContextFullError(Error):
    """The tokens would exceed the plan's max context (compile with a larger max_context)."""

    status = "G4_ERR_CONTEXT_FULL"


class CancelledError(Error):
    status = "G4_ERR_CANCELLED"


class UnsupportedError(Error):
    """The plan needs a device or feature this build or machine lacks (e.g. a CUDA plan without a GPU)."""

    status = "G4_ERR_UNSUPPORTED"


class InternalError(Error):
    status = "G4_ERR_INTERNAL"


class NoTokenizerError(Error):
    """The plan carries no tokenizer (compile from a directory with tokenizer.json)."""

    status = "G4_ERR_NO_TOKENIZER"


class CompileError(Error):
    """g4.compile failed: the message names the file or tensor and says how to fix it."""

    status = "G4_COMPILE_ERROR"


# g4_status values (runtime/include/g4/g4.h) and -1 for the compiler.
BY_STATUS: dict[int, type[Error]] = {
    1: InvalidArgumentError,
    2: FileError,
    3: PlanVersionError,
    4: PlanCorruptError,
    5: OutOfMemoryError,
    6: ContextFullError,
    7: CancelledError,
    8: UnsupportedError,
    9: InternalError,
    11: NoTokenizerError,
    -1: CompileError,
}
