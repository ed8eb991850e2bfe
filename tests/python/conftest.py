"""Shared fixtures of the Python package tests: the tiny checkpoints' paths, plans compiled once per run,
and the g4 CLI (for comparisons with `g4 run`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import g4

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"


def cli_path() -> str | None:
    """The g4 CLI: $G4_CLI (set by ctest), else build/tools/g4, else none (those comparisons skip)."""
    for p in (os.environ.get("G4_CLI"), str(ROOT / "build" / "tools" / "g4"), shutil.which("g4")):
        if p and os.access(p, os.X_OK):
            return p
    return None


def run_cli(*args: str) -> subprocess.CompletedProcess:
    cli = cli_path()
    if cli is None:
        pytest.skip("no g4 CLI built (set G4_CLI)")
    return subprocess.run([cli, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("plans")
    out = {}
    out["text"] = g4.compile(FIX / "e2b_tiny", out=d / "text.g4plan", weights="f32").path
    out["lora"] = g4.compile(FIX / "e2b_tiny", FIX / "adapters" / "e2b_lora", out=d / "lora.g4plan", weights="f32").path
    out["mm"] = g4.compile(FIX / "e2b_tiny_mm", out=d / "mm.g4plan", weights="f32", image_tokens=70).path
    return out
