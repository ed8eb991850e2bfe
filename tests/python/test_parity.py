"""Parity with transformers + PEFT from Python (examples/python/parity.py): needs torch, transformers and peft,
and skips without them."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import FIX, ROOT

missing = [m for m in ("torch", "transformers", "peft") if importlib.util.find_spec(m) is None]


@pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)} (not installed here)")
@pytest.mark.parametrize("adapter", [None, "e2b_lora"])
def test_parity_with_transformers_peft(adapter: str | None, tmp_path) -> None:
    sys.path.insert(0, str(ROOT / "examples" / "python"))
    from parity import run_parity

    r = run_parity(str(FIX / "e2b_tiny"), str(FIX / "adapters" / adapter) if adapter else None,
                   "The capital of France is", weights="f32", new_tokens=16, workdir=str(tmp_path))
    print(r)
    assert r["rel_l2"] < 1e-4
    assert r["greedy_match"], (r["greedy_g4"], r["greedy_hf"])
