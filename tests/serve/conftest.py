"""Fixtures of the `g4 serve` tests: the tiny multimodal fixture compiled once, servers started on free
loopback ports (and stopped with SIGTERM), and `g4 run` for the reference outputs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"


def cli() -> str:
    p = os.environ.get("G4_CLI") or str(ROOT / "build" / "tools" / "g4")
    if not os.access(p, os.X_OK):
        pytest.fail(f"no g4 CLI at {p} (set G4_CLI)")
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A running `g4 serve`; `url` is its base URL."""

    def __init__(self, plan: str, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = []
        self.proc = subprocess.Popen([cli(), "serve", plan, "--port", str(self.port), *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("g4 serve exited: " + self.proc.stderr.read())
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("g4 serve did not come up")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.stderr = self.proc.stderr.read()
        return rc

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out


def post(url: str, body, headers: dict | None = None, timeout: float = 60) -> tuple[int, dict, bytes]:
    """POST raw bytes or a JSON-able body; (status, headers, body) whatever the status."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.fixture(scope="session")
def plan(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("plans") / "tiny.g4plan"
    subprocess.run([cli(), "compile", "--model", str(FIX / "e2b_tiny_mm"), "--image-tokens", "70", "--no-fidelity",
                    "-o", str(out)], check=True, capture_output=True, timeout=300)
    return str(out)


@pytest.fixture(scope="session")
def server(plan: str, tmp_path_factory: pytest.TempPathFactory):
    s = Server(plan, "--max-sessions", "4", "--max-queue", "16", "--model-name", "tiny",
               "--media-dir", str(FIX / "towers"))
    yield s
    assert s.stop() == 0, s.stderr


def g4_run(plan: str, prompt: str, n: int, chat: bool = True, extra: tuple = ()) -> str:
    """The text `g4 run` generates greedily (its trailing newline removed)."""
    args = [cli(), "run", plan, "-p", prompt, "-n", str(n), "--temp", "0", *extra]
    if chat:
        args.append("--chat")
    r = subprocess.run(args, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode("utf-8", errors="replace")
    return out[:-1] if out.endswith("\n") else out
