#!/usr/bin/env python3
"""g4 serve under concurrent streaming clients: aggregate decode throughput and time to first token against the
number of clients, and the single-stream check against `g4 bench`.

Starts `g4 serve PLAN` on a free loopback port, then for each concurrency N runs N client threads, each sending
--requests streaming completions one after the other (distinct prompts of about --prompt-tokens tokens,
--max-tokens tokens each with ignore_eos, greedy). Per request it records the time to the first streamed text
(TTFT, from sending the request, queue included) and to the last; per level the aggregate decode throughput (the
level's generated tokens / its wall time) and TTFT p50 / p99. The single-stream check serves with one session of
--threads threads and compares its decode speed (the server's g4_decode_tokens_per_second for a whole reply and
for a streamed one, and as one streaming client sees it: tokens after the first / the time between the first and
the last) with `g4 bench -p P -n M -d P --threads T` on the same plan, the two alternated. Writes serve_bench.json (every
request), serve_bench.md and serve_bench.png (matplotlib, if installed) under --out.

With --llama-server BIN --gguf FILE, the same sweep also runs against llama.cpp's llama-server on that GGUF (the
same checkpoint converted by llama.cpp; `-np` the same number of slots as g4's sessions, each with room for a
request, `--llama-args` added, default "-ngl 99 -fa on": every layer on the GPU, flash attention), after g4's,
and the report gives both and their ratio. A llama.cpp source tree builds it with
    cmake -S DIR -B DIR/build -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_CUDA=ON
    cmake --build DIR/build --target llama-server llama-quantize -j
(bench/e2e/cpu_llamacpp_bench.py --stop-after quantize converts a checkpoint and quantizes it with that tree).

Needs only the Python standard library (matplotlib for the chart). Example, the tiny fixture on a CPU:
    build/tools/g4 compile --model tests/fixtures/e2b_tiny --no-fidelity -o /tmp/tiny.g4plan
    python3 bench/e2e/serve_bench.py --plan /tmp/tiny.g4plan --out bench/results/serve-2core
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import http.client
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """g4 serve PLAN ARGS (or, with cmd, that server command; {port} in it is the port) until /health answers."""
    def __init__(self, g4: str, plan: str, args: list[str], cmd: list[str] | None = None, wait_s: float = 60):
        self.port = free_port()
        self.cmd = [c.replace("{port}", str(self.port)) for c in cmd] if cmd else \
            [g4, "serve", plan, "--port", str(self.port), *args]
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + wait_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"{os.path.basename(self.cmd[0])} exited: " + self.proc.stderr.read()[-2000:])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.05)
        self.proc.kill()
        sys.exit(f"{os.path.basename(self.cmd[0])} did not come up within {wait_s:.0f} s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def prompt_text(i: int, words: int) -> str:
    # Distinct from the first word on, so that no request reuses another's prompt beyond <bos>.
    return f"{i} " + " ".join(f"w{(i * 7919 + k) % 997}" for k in range(words))


def one_request(port: int, prompt: str, max_tokens: int, stream: bool = True) -> dict:
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
                       "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    first = last = None
    usage = None
    if not stream:
        usage = json.loads(resp.read())["usage"]
    for raw in resp if stream else []:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("choices") and ev["choices"][0].get("text"):
            now = time.perf_counter()
            first = first if first is not None else now
            last = now
        if ev.get("usage"):
            usage = ev["usage"]
    conn.close()
    end = time.perf_counter()
    return {"ttft_s": (first if first is not None else end) - t0, "total_s": end - t0,
            "decode_s": (last - first) if first is not None else 0.0,
            "completion_tokens": usage["completion_tokens"], "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)}


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise RuntimeError(f"/metrics has no {name}")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q / 100 * (len(xs) - 1)))))]


def level(port: int, n: int, requests: int, words: int, max_tokens: int, base: int) -> dict:
    results: list[dict] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        for r in range(requests):
            res = one_request(port, prompt_text(base + c * requests + r, words), max_tokens)
            with lock:
                results.append(res)

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(n) as ex:
        list(ex.map(client, range(n)))
    wall = time.perf_counter() - t0
    gen = sum(r["completion_tokens"] for r in results)
    ttft = [r["ttft_s"] for r in results]
    return {"clients": n, "requests": len(results), "wall_s": wall, "completion_tokens": gen,
            "decode_tok_s": gen / wall, "ttft_p50_ms": 1e3 * pct(ttft, 50), "ttft_p99_ms": 1e3 * pct(ttft, 99),
            "per_request": results}


def g4_bench(g4: str, plan: str, prompt_tokens: int, max_tokens: int, threads: int, reps: int) -> float:
    r = subprocess.run([g4, "bench", plan, "-p", str(prompt_tokens), "-n", str(max_tokens), "-d", str(prompt_tokens),
                        "-r", str(reps), "--threads", str(threads), "--json"], capture_output=True, text=True,
                       check=True)
    data = json.loads(r.stdout)
    rows = data["tests"] if isinstance(data, dict) and "tests" in data else data
    tg = [t for t in rows if str(t.get("name", t.get("test", ""))).startswith("tg")]
    if not tg:
        raise RuntimeError("g4 bench --json: no tg test in " + r.stdout[:300])
    return float(tg[0]["median_tok_s"] if "median_tok_s" in tg[0] else tg[0]["tok_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", required=True)
    ap.add_argument("--g4", default=str(ROOT / "build" / "tools" / "g4"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--concurrency", default="1,2,4,8,16,32")
    ap.add_argument("--sessions", type=int, default=4, help="g4 serve --max-sessions for the sweep")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="CPU threads: of the single-stream server and g4 bench; the sweep's sessions share them")
    ap.add_argument("--requests", type=int, default=2, help="requests each client sends, one after the other")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="about this many prompt tokens a request")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5, help="single-stream check: requests and g4 bench runs, alternated")
    ap.add_argument("--note", default="", help="a line for the report (e.g. what else ran on the machine)")
    ap.add_argument("--llama-server", metavar="BIN", help="llama.cpp's llama-server: the same sweep against it")
    ap.add_argument("--gguf", help="with --llama-server: the model it serves (the plan's checkpoint, converted)")
    ap.add_argument("--llama-args", default="-ngl 99 -fa on", help="more llama-server arguments. Default: -ngl 99 -fa on")
    a = ap.parse_args()
    if bool(a.llama_server) != bool(a.gguf):
        ap.error("--llama-server and --gguf go together")
    os.makedirs(a.out, exist_ok=True)
    words = max(1, a.prompt_tokens // 4)  # "wNNN " is about 4 tokens with the tiny fixture's tokenizer
    conc = [int(x) for x in a.concurrency.split(",")]
    per_session = max(1, a.threads // a.sessions)
    res = {"plan": os.path.basename(a.plan), "cpu": platform.processor() or platform.machine(),
           "cores": os.cpu_count(), "load_average_before": os.getloadavg(), "note": a.note,
           "sessions": a.sessions, "threads_per_session": per_session, "max_tokens": a.max_tokens,
           "requests_per_client": a.requests, "levels": []}

    s = Serve(a.g4, a.plan, ["--max-sessions", str(a.sessions), "--threads", str(per_session), "--max-queue",
                             str(max(conc) * 2)])
    try:
        level(s.port, 1, 1, words, a.max_tokens, 10**6)  # warm-up
        for n in conc:
            lv = level(s.port, n, a.requests, words, a.max_tokens, n * 1000)
            res["levels"].append(lv)
            print(f"{n:3d} clients: {lv['decode_tok_s']:8.1f} tok/s, TTFT p50 {lv['ttft_p50_ms']:8.1f} ms "
                  f"p99 {lv['ttft_p99_ms']:8.1f} ms", flush=True)
    finally:
        s.stop()

    if a.llama_server:  # the same sweep against llama-server: as many slots, each holding one request
        slot_ctx = 4 * a.prompt_tokens + a.max_tokens + 256
        cmd = [a.llama_server, "-m", a.gguf, "--host", "127.0.0.1", "--port", "{port}", "-np", str(a.sessions),
               "-c", str(a.sessions * slot_ctx), "-t", str(a.threads), "--no-webui", *a.llama_args.split()]
        s = Serve("", "", [], cmd=cmd, wait_s=600)
        res["llama_server"] = {"command": " ".join(s.cmd), "levels": []}
        try:
            level(s.port, 1, 1, words, a.max_tokens, 10**6)  # warm-up
            for n in conc:
                lv = level(s.port, n, a.requests, words, a.max_tokens, n * 1000)
                res["llama_server"]["levels"].append(lv)
                print(f"{n:3d} clients, llama-server: {lv['decode_tok_s']:8.1f} tok/s, TTFT p50 "
                      f"{lv['ttft_p50_ms']:8.1f} ms p99 {lv['ttft_p99_ms']:8.1f} ms", flush=True)
        finally:
            s.stop()

    # Single stream: one session with every thread against g4 bench at the same prompt depth, alternated
    # (one request, one g4 bench repetition) so that both see the same load.
    s = Serve(a.g4, a.plan, ["--max-sessions", "1", "--threads", str(a.threads)])
    runs, whole, bench = [], [], []
    try:
        prompt_tokens = one_request(s.port, prompt_text(7, words), a.max_tokens)["prompt_tokens"]
        for i in range(a.reps):
            runs.append(one_request(s.port, prompt_text(100 + i, words), a.max_tokens))
            runs[-1]["server_decode_tok_s"] = metric(s.port, "g4_decode_tokens_per_second")
            one_request(s.port, prompt_text(200 + i, words), a.max_tokens, stream=False)
            whole.append(metric(s.port, "g4_decode_tokens_per_second"))
            bench.append(g4_bench(a.g4, a.plan, prompt_tokens, a.max_tokens, a.threads, 1))
    finally:
        s.stop()
    client_rate = statistics.median((r["completion_tokens"] - 1) / r["decode_s"] for r in runs)
    stream_rate = statistics.median(r["server_decode_tok_s"] for r in runs)
    serve_rate = statistics.median(whole)
    bench_rate = statistics.median(bench)
    ratio = serve_rate / bench_rate
    res["single_stream"] = {"serve_decode_tok_s": serve_rate, "serve_streaming_decode_tok_s": stream_rate,
                            "streaming_ratio": stream_rate / bench_rate, "client_decode_tok_s": client_rate,
                            "client_ratio": client_rate / bench_rate, "serve_runs_tok_s": whole, "g4_bench_tg_tok_s": bench_rate, "ratio": ratio,
                            "within_5_percent": abs(ratio - 1) <= 0.05, "prompt_tokens": prompt_tokens,
                            "threads": a.threads, "runs": runs, "g4_bench_runs_tok_s": bench}
    res["load_average_after"] = os.getloadavg()

    with open(os.path.join(a.out, "serve_bench.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = [f"`g4 serve` on {res['plan']}, {res['cores']} cores ({res['cpu']}); {a.sessions} sessions x "
          f"{per_session} threads; each client sends {a.requests} streaming completions of ~{prompt_tokens} prompt "
          f"tokens and {a.max_tokens} generated tokens (greedy, ignore_eos). Load average before / after: "
          f"{res['load_average_before'][0]:.1f} / {res['load_average_after'][0]:.1f}." + (f" {a.note}" if a.note else ""),
          "", "Aggregate decode tok/s: the level's generated tokens / its wall time (prefill included).", "",
          "| clients | requests | aggregate decode tok/s | TTFT p50 ms | TTFT p99 ms |", "|---|---|---|---|---|"]
    for lv in res["levels"]:
        md.append(f"| {lv['clients']} | {lv['requests']} | {lv['decode_tok_s']:.1f} | {lv['ttft_p50_ms']:.1f} | "
                  f"{lv['ttft_p99_ms']:.1f} |")
    if "llama_server" in res:
        md += ["", f"llama-server on the same checkpoint's GGUF, the same clients (`{res['llama_server']['command']}`):",
               "", "| clients | llama-server tok/s | TTFT p50 ms | TTFT p99 ms | g4 / llama-server tok/s |",
               "|---|---|---|---|---|"]
        for g, lv in zip(res["levels"], res["llama_server"]["levels"]):
            md.append(f"| {lv['clients']} | {lv['decode_tok_s']:.1f} | {lv['ttft_p50_ms']:.1f} | {lv['ttft_p99_ms']:.1f} | "
                      f"{g['decode_tok_s'] / lv['decode_tok_s']:.2f}x |")
    ss = res["single_stream"]
    md += ["", f"Single stream ({a.threads} threads, medians of {a.reps}, alternated with `g4 bench -p {prompt_tokens} "
               f"-n {a.max_tokens} -d {prompt_tokens} -r 1`): g4 bench {ss['g4_bench_tg_tok_s']:.1f} tok/s. The server's "
               f"decode speed (`g4_decode_tokens_per_second`) for a whole (non-streaming) reply "
               f"{ss['serve_decode_tok_s']:.1f} tok/s, ratio {ss['ratio']:.3f} "
               f"({'within' if ss['within_5_percent'] else 'NOT within'} 5 %); for a streamed reply "
               f"{ss['serve_streaming_decode_tok_s']:.1f} tok/s (ratio {ss['streaming_ratio']:.3f}), and as the "
               f"streaming client sees it (tokens after the first / time from the first to the last) "
               f"{ss['client_decode_tok_s']:.1f} tok/s (ratio {ss['client_ratio']:.3f}): each streamed token wakes "
               f"the HTTP thread, which writes it, and the client reads it, on the same cores."]
    with open(os.path.join(a.out, "serve_bench.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        xs = [lv["clients"] for lv in res["levels"]]
        fig, (l, r) = plt.subplots(1, 2, figsize=(10, 4))
        l.plot(xs, [lv["decode_tok_s"] for lv in res["levels"]], "o-", label="g4 serve")
        if "llama_server" in res:
            ls = res["llama_server"]["levels"]
            l.plot([lv["clients"] for lv in ls], [lv["decode_tok_s"] for lv in ls], "^-", label="llama-server")
            r.plot([lv["clients"] for lv in ls], [lv["ttft_p50_ms"] for lv in ls], "^-", label="llama-server p50")
            l.legend()
        l.set_xscale("log", base=2)
        l.set_xlabel("concurrent streaming clients")
        l.set_ylabel("aggregate decode tokens/s")
        l.set_ylim(bottom=0)
        r.plot(xs, [lv["ttft_p50_ms"] for lv in res["levels"]], "o-", label="p50")
        r.plot(xs, [lv["ttft_p99_ms"] for lv in res["levels"]], "s--", label="p99")
        r.set_xscale("log", base=2)
        r.set_yscale("log")
        r.set_xlabel("concurrent streaming clients")
        r.set_ylabel("time to first token, ms")
        r.legend()
        fig.suptitle(f"g4 serve, {res['plan']}, {res['cores']} cores, {a.sessions} sessions")
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "serve_bench.png"), dpi=100)
    except ImportError as e:
        print("chart not drawn (pip install matplotlib):", e)


if __name__ == "__main__":
    main()
