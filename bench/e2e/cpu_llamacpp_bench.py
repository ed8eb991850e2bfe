#!/usr/bin/env python3
"""cpu_llamacpp_bench.py - g4 against llama.cpp on the CPU: same checkpoint, prefill and decode tok/s at
several thread counts, the engines alternated in one run.

llama.cpp's own converter turns the Hugging Face checkpoint into GGUF bf16, llama-quantize makes Q4_0 and
Q4_K_M from it; g4 compiles NF4 CPU plans of the same checkpoint (the default CPU precision and, when the g4
build has `--cpu-precision`, `--cpu-precision f32`). Then, per round and thread count (largest first), each engine
runs in turn: `llama-bench -m GGUF -p P -n N -t T -ngl 0 -r R -o json` (CUDA hidden) and
`g4 bench PLAN -p P -n N -r R --threads T --json`; `--rounds` repeats the whole sweep (so a run cut by
--time-limit has every thread count of the first round). Prefill is P prompt tokens
(llama-bench's ppP; g4's ppP also picks the first token), decode N tokens from an empty context (tgN, tgN@d0).
Every test warms up once; figures are the medians of all repetitions. The 1-minute load average before each
call is recorded (other processes on the machine change the figures).

Needs: a g4 build, a llama.cpp tree with llama-bench and llama-quantize built (see --help), and for the
converter python with torch, numpy, transformers, pyyaml; matplotlib for the plot. --model also needs
torch and transformers (a random-weight checkpoint at the real E2B/E4B text shapes, or a toy one; made on
the GPU if torch has one, else on the CPU).
Usage: python3 bench/e2e/cpu_llamacpp_bench.py (CHECKPOINT | --model e2b|e4b|tiny) --llama-cpp DIR [--g4 G4]
       [--threads 1,2,4,8,16] [-p 512] [-n 128] [--reps 3] [--rounds 1] [--g4-variants nf4,...] [--out DIR]
       [--workdir DIR]
Writes OUT/cpu_llamacpp_<tag>.json, .md and .png after every thread count (a cut run keeps what it measured),
and OUT/cpu_llamacpp_<tag>.log (the converter, llama-quantize and g4 compile).
"""
import argparse, hashlib, json, os, platform, re, shutil, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))

LLAMA_HELP = """\
--llama-cpp DIR is a llama.cpp source tree (with convert_hf_to_gguf.py and gguf-py/) whose llama-bench and
llama-quantize are built in DIR/build/bin (or DIR/bin, or --llama-bin). A CPU-only build:
  cmake -S DIR -B DIR/build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF
  cmake --build DIR/build --target llama-bench llama-quantize -j
The converter runs under --python (default: this interpreter) with DIR/gguf-py on PYTHONPATH and needs
torch, numpy, transformers and pyyaml (pip install). A build with CUDA also works: the GPU is hidden
from llama-bench (CUDA_VISIBLE_DEVICES empty) and -ngl 0 is passed.
"""


class BenchError(Exception):
    """A one-line reason the run cannot go on (missing tool, failed step)."""


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=LLAMA_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", nargs="?", help="Hugging Face Gemma 4 checkpoint directory")
    ap.add_argument("--model", choices=["e2b", "e4b", "tiny"],
                    help="instead of CHECKPOINT: a random-weight checkpoint at these real shapes, made in --workdir (tiny: "
                         "E2B's layer layout at toy sizes, to check a set-up in seconds)")
    ap.add_argument("--render", metavar="JSON",
                    help="only write the .md and .png of an earlier run's JSON (e.g. one taken where matplotlib is missing)")
    ap.add_argument("--llama-cpp", metavar="DIR", help="llama.cpp source tree with a build (see below)")
    ap.add_argument("--llama-bin", metavar="DIR", help="where llama-bench and llama-quantize are. Default: DIR/build/bin")
    ap.add_argument("--g4", default=os.path.join(ROOT, "build", "tools", "g4"), help="the g4 binary. Default: build/tools/g4")
    ap.add_argument("--threads", help="thread counts. Default: 1,2,4,8,16 up to the machine's hardware threads")
    ap.add_argument("-p", "--prompt", type=int, default=512, help="prompt tokens of the prefill test. Default: 512")
    ap.add_argument("-n", "--gen", type=int, default=128, help="decoded tokens of the decode test. Default: 128")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per call, after one warm-up. Default: 3")
    ap.add_argument("--rounds", type=int, default=1, help="sweeps over the thread counts. Default: 1")
    ap.add_argument("--quants", default="Q4_0,Q4_K_M", help="llama.cpp quantizations. Default: Q4_0,Q4_K_M")
    ap.add_argument("--g4-variants", default="",
                    help="g4 plans to measure, by label (nf4, 'nf4 full head', 'nf4 f32'), comma-separated. Default: all")
    ap.add_argument("--llama-args", default="", help="extra llama-bench arguments, e.g. '-fa 1'")
    ap.add_argument("--python", default=sys.executable, help="python for llama.cpp's converter. Default: this one")
    ap.add_argument("--workdir", default="/tmp/g4cpubench", help="checkpoint, GGUFs and plans (cached). Default: /tmp/g4cpubench")
    ap.add_argument("--out", default="bench-out", help="result folder. Default: bench-out")
    ap.add_argument("--time-limit", type=float, default=0,
                    help="seconds from the start after which no new measurement starts (0: none); the results say what was left")
    ap.add_argument("--stop-after", choices=["convert", "quantize", "compile"],
                    help="prepare up to this step, then stop: convert (checkpoint and GGUF bf16: no g4 or llama.cpp build "
                         "needed), quantize (the GGUFs: no g4 needed), compile (the plans too); later runs reuse them")
    ap.add_argument("--clean", action="store_true", help="delete the GGUFs, plans and generated checkpoint at the end")
    ap.add_argument("--no-plot", action="store_true", help="no PNG (matplotlib not needed)")
    a = ap.parse_args(argv)
    if a.render:
        return a
    if not a.llama_cpp:
        ap.error("--llama-cpp DIR is required (a llama.cpp source tree with a build; see the end of --help)")
    if (a.checkpoint is None) == (a.model is None):
        ap.error("give a CHECKPOINT directory or --model e2b|e4b (one of them)")
    if a.prompt < 1 or a.gen < 1 or a.reps < 1 or a.rounds < 1:
        ap.error("-p, -n, --reps and --rounds must be at least 1")
    try:
        a.thread_list = thread_counts(a.threads, os.cpu_count() or 1)
    except ValueError as e:
        ap.error(str(e))
    a.quant_list = [q for q in a.quants.split(",") if q]
    a.g4_variant_list = [v.strip() for v in a.g4_variants.split(",") if v.strip()]
    if not a.quant_list or any(not re.fullmatch(r"[A-Za-z0-9_]+", q) for q in a.quant_list):
        ap.error("--quants: a comma-separated list of llama-quantize types, e.g. Q4_0,Q4_K_M")
    return a


def thread_counts(spec, ncpu):
    """'1,2,4' -> [1, 2, 4]; None -> 1,2,4,8,16 capped at ncpu (plus ncpu itself when it lies between)."""
    if spec is None:
        ts = [t for t in (1, 2, 4, 8, 16) if t <= ncpu]
        if ncpu < 16 and ncpu not in ts:
            ts.append(ncpu)
        return ts
    try:
        ts = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        raise ValueError("--threads: a comma-separated list of positive integers, e.g. 1,2,4") from None
    if not ts or ts[0] < 1:
        raise ValueError("--threads: a comma-separated list of positive integers, e.g. 1,2,4")
    return ts


# ---------------------------------------------------------------- tools and inputs
def find_tools(a):
    """Paths of every tool the run needs, or BenchError naming the first one missing."""
    stop = a.stop_after
    if stop not in ("convert", "quantize") and not (os.path.isfile(a.g4) and os.access(a.g4, os.X_OK)):
        raise BenchError(f"g4 binary not found at {a.g4} (build it: cmake --build build --target g4, or pass --g4)")
    src = os.path.abspath(a.llama_cpp)
    conv = os.path.join(src, "convert_hf_to_gguf.py")
    if not os.path.isfile(conv):
        raise BenchError(f"{conv} not found: --llama-cpp must be a llama.cpp source tree (see --help)")
    if not os.path.isdir(os.path.join(src, "gguf-py")):
        raise BenchError(f"{src}/gguf-py not found: --llama-cpp must be a full llama.cpp source tree (see --help)")
    dirs = [a.llama_bin] if a.llama_bin else [os.path.join(src, "build", "bin"), os.path.join(src, "bin"), src]
    tools = {"g4": os.path.abspath(a.g4), "convert": conv, "gguf_py": os.path.join(src, "gguf-py")}
    for name in {"convert": (), "quantize": ("llama-quantize",)}.get(stop, ("llama-bench", "llama-quantize")):
        hit = [os.path.join(d, name) for d in dirs if os.access(os.path.join(d, name), os.X_OK)]
        if not hit:
            raise BenchError(f"{name} not found in {' or '.join(dirs)} (build llama.cpp first: see --help)")
        tools[name] = hit[0]
    if not a.no_plot and not stop:
        need_matplotlib()
    return tools


def need_converter_python(python):
    r = subprocess.run([python, "-c", "import torch, numpy, transformers, yaml"], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        raise BenchError(f"{python} cannot run llama.cpp's converter ({last}): pip install torch numpy transformers "
                         "pyyaml, or pass --python")


def need_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise BenchError("matplotlib is missing (pip install matplotlib), or pass --no-plot") from None


def make_random_checkpoint(model, out):
    """A random-weight checkpoint at the real text shapes (bf16, N(0, 0.02^2), norms 1) in one safetensors file,
    written a tensor at a time in 32M-value chunks (an E2B needs ~10 GB of disk, not of memory); drawn on the GPU
    when torch sees one (faster), else on the CPU."""
    import torch
    from transformers import Gemma4ForCausalLM
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from gemma4_shapes import text_config
    if model == "tiny":
        from transformers import Gemma4TextConfig
        cfg = Gemma4TextConfig(vocab_size=512, vocab_size_per_layer_input=512, hidden_size_per_layer_input=16, hidden_size=64,
                               intermediate_size=128, num_hidden_layers=10, num_attention_heads=2, num_key_value_heads=1,
                               head_dim=32, global_head_dim=64, num_kv_shared_layers=5, sliding_window=512,
                               final_logit_softcapping=30.0, max_position_embeddings=8192,
                               layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 2)
    else:
        cfg = text_config(model)
    with torch.device("meta"):
        m = Gemma4ForCausalLM(cfg)
    cfg.architectures = ["Gemma4ForCausalLM"]
    tmp = out + ".part"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    cfg.save_pretrained(tmp)
    items = [(n, t.shape) for n, t in m.state_dict().items() if not (n == "lm_head.weight" and cfg.tie_word_embeddings)]
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in items:
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + 2 * n]}
        off += 2 * n
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    with open(os.path.join(tmp, "model.safetensors"), "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        for name, shape in items:
            n = header[name]["data_offsets"][1] // 2 - header[name]["data_offsets"][0] // 2
            for i in range(0, n, 1 << 25):
                k = min(1 << 25, n - i)
                if "norm" in name or "scalar" in name:
                    v = torch.ones(k, dtype=torch.bfloat16)
                else:
                    v = (torch.randn(k, generator=g, device=dev) * 0.02).to(torch.bfloat16).cpu()
                f.write(v.view(torch.int16).numpy().tobytes())
    os.replace(tmp, out)
    print(f"[bench] checkpoint {out}: {off / 2**30:.2f} GiB bf16", flush=True)


def synthetic_tokenizer(vocab_size):
    """tokenizer.json + tokenizer_config.json of exactly vocab_size tokens (BPE, byte fallback) for a
    checkpoint without a tokenizer: llama.cpp's converter needs a vocabulary; speed does not depend on it."""
    toks = (["<pad>", "<eos>", "<bos>", "<unk>"] + ["<0x%02X>" % b for b in range(256)] + ["\u2581", "\u2581\u2581"])
    toks += ["<tok_%d>" % i for i in range(len(toks), vocab_size)]
    toks = toks[:vocab_size]
    special = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                "special": True} for i, t in enumerate(toks[:4])]
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
          "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
          "pre_tokenizer": None, "post_processor": None,
          "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                                      {"type": "ByteFallback"}, {"type": "Fuse"}]},
          "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                    "vocab": {t: i for i, t in enumerate(toks)}, "merges": [["\u2581", "\u2581"]]}}
    tc = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>",
          "pad_token": "<pad>", "add_bos_token": True}
    return tj, tc


def converter_input(ckpt, stage):
    """The directory to hand the converter: the checkpoint itself, or a stage directory linking its files with what
    the converter needs and the checkpoint lacks: a synthetic tokenizer (no tokenizer.json), `architectures` in
    config.json (checkpoints saved from a config alone)."""
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    vocab = int((cfg.get("text_config") or cfg).get("vocab_size") or 262144)
    has_tok = os.path.isfile(os.path.join(ckpt, "tokenizer.json"))
    tok = None
    if has_tok:  # llama.cpp refuses a GGUF whose token count differs from the embedding's rows
        with open(os.path.join(ckpt, "tokenizer.json"), encoding="utf-8") as f:
            tok = json.load(f)
        ids = list((tok.get("model") or {}).get("vocab", {}).values()) + [t["id"] for t in tok.get("added_tokens", [])]
        if not ids or max(ids) < vocab:
            tok = None
    if has_tok and tok is None and cfg.get("architectures"):
        return ckpt
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    for n in os.listdir(ckpt):
        if n.endswith(".safetensors") or (n.endswith(".json") and n != "config.json") or n.endswith(".jinja"):
            os.symlink(os.path.join(ckpt, n), os.path.join(stage, n))
    if not cfg.get("architectures"):
        cfg["architectures"] = ["Gemma4ForConditionalGeneration" if "text_config" in cfg else "Gemma4ForCausalLM"]
    with open(os.path.join(stage, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    if tok is not None:  # the ids at or above vocab_size left out (the Gemma tokenizer's <image_soft_token>)
        gone = {t["content"] for t in tok.get("added_tokens", []) if t["id"] >= vocab}
        gone |= {k for k, v in tok["model"]["vocab"].items() if v >= vocab}
        tok["added_tokens"] = [t for t in tok.get("added_tokens", []) if t["id"] < vocab]
        tok["model"]["vocab"] = {k: v for k, v in tok["model"]["vocab"].items() if v < vocab}
        merges = tok["model"].get("merges")
        if merges:
            tok["model"]["merges"] = [m for m in merges if not (set(m.split(" ") if isinstance(m, str) else m) & gone)]
        os.remove(os.path.join(stage, "tokenizer.json"))
        with open(os.path.join(stage, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False)
        tcp = os.path.join(stage, "tokenizer_config.json")
        if os.path.lexists(tcp):
            with open(tcp) as f:
                tc = json.load(f)
            tc["added_tokens_decoder"] = {k: v for k, v in tc.get("added_tokens_decoder", {}).items() if int(k) < vocab}
            os.remove(tcp)
            with open(tcp, "w") as f:
                json.dump(tc, f, indent=1)
        print(f"[bench] {ckpt}/tokenizer.json has ids from {vocab} on: the converter gets it without them", flush=True)
    if not has_tok:
        tj, tc = synthetic_tokenizer(vocab)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if os.path.lexists(os.path.join(stage, name)):
                os.remove(os.path.join(stage, name))
        with open(os.path.join(stage, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tj, f, ensure_ascii=False)
        with open(os.path.join(stage, "tokenizer_config.json"), "w") as f:
            json.dump(tc, f, indent=1)
        print(f"[bench] {ckpt} has no tokenizer.json: the converter gets a synthetic one of {vocab} tokens", flush=True)
    return stage


def checkpoint_key(ckpt):
    """Names cached GGUFs and plans: the directory and its files' sizes and modification times."""
    h = hashlib.sha256(os.path.abspath(ckpt).encode())
    for n in sorted(os.listdir(ckpt)):
        st = os.stat(os.path.join(ckpt, n))
        h.update(f"{n}:{st.st_size}:{int(st.st_mtime)}".encode())
    return h.hexdigest()[:10]


def run_logged(what, cmd, log, env=None, timeout=None):
    """Runs cmd with stdout+stderr appended to log; BenchError naming `what` and the log's last line on failure."""
    with open(log, "a") as f:
        f.write("\n$ " + " ".join(cmd) + "\n")
        f.flush()
        t0 = time.time()
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            raise BenchError(f"{what} timed out after {timeout:.0f} s (log: {log})") from None
    if rc != 0:
        with open(log, errors="replace") as f:
            last = ([ln.strip() for ln in f if ln.strip()] or ["?"])[-1]
        raise BenchError(f"{what} failed (rc {rc}): {last[:200]} (log: {log})")
    return time.time() - t0


def prepare_ggufs(a, tools, ckpt, key, log):
    """GGUF bf16 by llama.cpp's converter, then each --quants type by llama-quantize; cached by key."""
    gdir = os.path.join(a.workdir, "gguf")
    os.makedirs(gdir, exist_ok=True)
    bf16 = os.path.join(gdir, f"{key}-bf16.gguf")
    steps = {}
    if not os.path.isfile(bf16):
        need_converter_python(a.python)
        src = converter_input(ckpt, os.path.join(a.workdir, f"stage-{key}"))
        env = dict(os.environ, PYTHONPATH=tools["gguf_py"] + os.pathsep + os.environ.get("PYTHONPATH", ""))
        print(f"[bench] converting {ckpt} to GGUF bf16", flush=True)
        cmd = [a.python, tools["convert"], src, "--outtype", "bf16", "--outfile", bf16 + ".part"]
        steps["convert"] = run_logged("convert_hf_to_gguf.py", cmd, log, env=env)
        os.replace(bf16 + ".part", bf16)
    ggufs = {}
    if a.stop_after == "convert":
        return ggufs, steps
    for q in a.quant_list:
        out = os.path.join(gdir, f"{key}-{q}.gguf")
        if not os.path.isfile(out):
            print(f"[bench] llama-quantize {q}", flush=True)
            cmd = [tools["llama-quantize"], bf16, out + ".part", q, str(os.cpu_count() or 1)]
            steps["quantize " + q] = run_logged("llama-quantize " + q, cmd, log)
            os.replace(out + ".part", out)
        ggufs[q] = out
    return ggufs, steps


def g4_variants(tools):
    """The g4 plans to measure: (label, extra compile flags)."""
    help_text = subprocess.run([tools["g4"], "compile", "--help"], capture_output=True, text=True).stdout
    variants = [("nf4", [])]
    if "--no-lm-screen" in help_text:
        # g4 bench decodes greedily, which screens the LM head; llama-bench computes every logit
        variants.append(("nf4 full head", ["--no-lm-screen"]))
    if "--cpu-precision" in help_text:
        variants.append(("nf4 f32", ["--cpu-precision", "f32"]))
    return variants


def prepare_plans(a, tools, ckpt, key, log):
    """One NF4 CPU plan per variant, cached by checkpoint, flags and the g4 binary."""
    st = os.stat(tools["g4"])
    plans, steps = {}, {}
    for label, flags in g4_variants(tools):
        if a.g4_variant_list and label not in a.g4_variant_list:
            continue
        h = hashlib.sha256(f"{key}|{' '.join(flags)}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:10]
        plan = os.path.join(a.workdir, f"{key}-{h}.g4plan")
        if not os.path.isfile(plan):
            print(f"[bench] g4 compile ({label})", flush=True)
            need = max(4096, a.prompt + a.gen + 1)
            cmd = [tools["g4"], "compile", "--model", ckpt, "--device", "cpu", "--weights", "nf4", "--no-fidelity",
                   "--max-context", str(need), *flags, "-o", plan]
            steps["g4 compile " + label] = run_logged("g4 compile", cmd, log)
        plans[label] = {"path": plan, "flags": ["--weights", "nf4", *flags]}
    return plans, steps


# ---------------------------------------------------------------- measuring
def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return None


def llama_samples(records, prompt, gen):
    """llama-bench JSON records -> {"pp": [ms...], "tg": [ms...]} and the record fields worth keeping."""
    out, info = {"pp": [], "tg": []}, {}
    for r in records:
        kind = "pp" if r.get("n_prompt") == prompt and not r.get("n_gen") else "tg" if r.get("n_gen") == gen else None
        if kind:
            out[kind] += [ns / 1e6 for ns in r.get("samples_ns", [])]
        for k in ("build_commit", "cpu_info", "model_type", "model_size", "flash_attn", "type_k", "n_batch", "n_ubatch"):
            if k in r:
                info[k] = r[k]
    return out, info


def g4_samples(rows, prompt, gen):
    """g4 bench --json rows -> {"pp": [ms...], "tg": [ms...]} and the CPU kernel level."""
    out, info = {"pp": [], "tg": []}, {}
    for r in rows:
        if r.get("test") == f"pp{prompt}":
            out["pp"] += r.get("ms", [])
        elif r.get("test") == f"tg{gen}@d0":
            out["tg"] += r.get("ms", [])
        if "cpu_kernels" in r:
            info["cpu_kernels"] = r["cpu_kernels"]
    return out, info


def measure(engine, variant, path, threads, a, tools, timeout):
    """One call of one engine at one thread count: its samples (ms a run) and what it reported."""
    if engine == "llama.cpp":
        cmd = [tools["llama-bench"], "-m", path, "-p", str(a.prompt), "-n", str(a.gen), "-t", str(threads), "-ngl", "0",
               "-r", str(a.reps), "-o", "json", *a.llama_args.split()]
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    else:
        cmd = [tools["g4"], "bench", path, "-p", str(a.prompt), "-n", str(a.gen), "-d", "0", "-r", str(a.reps),
               "--threads", str(threads), "--json"]
        env = None
    run = {"engine": engine, "variant": variant, "threads": threads, "load_before": loadavg(), "command": " ".join(cmd)}
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        run.update(error=f"timed out after {timeout:.0f} s", seconds=round(time.time() - t0, 1))
        return run
    run["seconds"], run["load_after"] = round(time.time() - t0, 1), loadavg()
    if r.returncode != 0:
        run["error"] = f"rc {r.returncode}: " + ((r.stderr.strip().splitlines() or ["?"])[-1])[:300]
        return run
    try:
        data = json.loads(r.stdout[r.stdout.index("["):])
    except ValueError:
        run["error"] = "no JSON in the output"
        return run
    parse = llama_samples if engine == "llama.cpp" else g4_samples
    run["ms"], run["info"] = parse(data, a.prompt, a.gen)
    return run


# ---------------------------------------------------------------- results: summary, markdown, plot
def summarize(runs, prompt, gen):
    """Medians per (engine, variant, threads) over every repetition of every round, as tok/s."""
    groups = {}
    for r in runs:
        if "ms" not in r:
            continue
        g = groups.setdefault((r["engine"], r["variant"], r["threads"]), {"pp": [], "tg": []})
        for k in ("pp", "tg"):
            g[k] += r["ms"][k]
    out = []
    for (engine, variant, threads), g in groups.items():
        row = {"engine": engine, "variant": variant, "threads": threads, "prefill_tok_s": None, "decode_tok_s": None,
               "prefill_runs": len(g["pp"]), "decode_runs": len(g["tg"])}
        if g["pp"]:
            row["prefill_tok_s"] = round(prompt * 1000.0 / statistics.median(g["pp"]), 2)
        if g["tg"]:
            row["decode_tok_s"] = round(gen * 1000.0 / statistics.median(g["tg"]), 2)
        out.append(row)
    return sorted(out, key=lambda r: (r["engine"] != "g4", r["variant"], r["threads"]))


def series(summary):
    """[(label, [(threads, prefill, decode), ...])] in a stable order: g4 first, then llama.cpp."""
    by = {}
    for r in summary:
        label = f"{r['engine']} {r['variant']}"
        by.setdefault(label, []).append((r["threads"], r["prefill_tok_s"], r["decode_tok_s"]))
    return [(k, sorted(v)) for k, v in by.items()]


def fmt(v):
    return "-" if v is None else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def markdown(doc):
    """The result tables (tok/s per engine and thread count) and how they were taken."""
    summary, threads = doc["summary"], sorted({r["threads"] for r in doc["summary"]})
    host = doc["host"]
    lines = [f"# CPU: g4 against llama.cpp, {doc['model']}", "",
             f"{host['cpu']}, {host['hardware_threads']} hardware threads; {doc['g4']['version']} "
             f"(CPU kernels {doc['g4'].get('cpu_kernels', '?')}); llama.cpp {doc['llama_cpp'].get('build_commit', '?')}.",
             f"Prefill: {doc['prompt_tokens']}-token prompt; decode: {doc['gen_tokens']} tokens from an empty context; "
             f"{doc['reps']} repetitions after a warm-up, {doc['rounds']} round(s), medians.", ""]
    for key, title in (("prefill_tok_s", f"Prefill tok/s ({doc['prompt_tokens']}-token prompt)"),
                       ("decode_tok_s", "Decode tok/s")):
        lines += [f"**{title}**", "", "| engine | " + " | ".join(f"{t} thr" for t in threads) + " |",
                  "|---|" + "---:|" * len(threads)]
        for label, pts in series(summary):
            val = {t: (p if key == "prefill_tok_s" else d) for t, p, d in pts}
            lines.append(f"| {label} | " + " | ".join(fmt(val.get(t)) for t in threads) + " |")
        lines.append("")
    loads = [r["load_before"] for r in doc["runs"] if r.get("load_before") is not None]
    if loads:
        lines.append(f"1-minute load average before the calls: {min(loads):.1f} to {max(loads):.1f} "
                     f"(the measuring process itself adds up to its thread count).")
    errors = [r for r in doc["runs"] if "error" in r]
    for r in errors:
        lines.append(f"- {r['engine']} {r['variant']} at {r['threads']} threads: {r['error']}")
    if doc.get("not_measured"):
        lines.append(f"Not measured (time limit or error): {', '.join(doc['not_measured'])}.")
    lines += ["", "Commands, per round and thread count T (engines in turn, largest T first):", ""]
    lines += [f"- `{c}`" for c in doc["command_templates"]]
    return "\n".join(lines) + "\n"


def plot(doc, path):
    """tok/s against threads: prefill and decode panels, a line per engine and variant."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, idx, title in ((axes[0], 1, f"prefill, {doc['prompt_tokens']}-token prompt"),
                           (axes[1], 2, f"decode, {doc['gen_tokens']} tokens")):
        for label, pts in series(doc["summary"]):
            xs = [p[0] for p in pts if p[idx] is not None]
            ys = [p[idx] for p in pts if p[idx] is not None]
            if xs:
                ax.plot(xs, ys, marker="o", linestyle="-" if label.startswith("g4") else "--", label=label)
        ax.set_xscale("log", base=2)
        ticks = sorted({r["threads"] for r in doc["summary"]})
        ax.set_xticks(ticks or [1])
        ax.set_xticklabels([str(t) for t in ticks or [1]])
        ax.set_xlabel("threads")
        ax.set_ylabel("tok/s")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{doc['model']} on {doc['host']['cpu']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path + ".part.png", dpi=110)
    plt.close(fig)
    os.replace(path + ".part.png", path)


def write_results(doc, base, with_plot, write_json=True):
    doc["summary"] = summarize(doc["runs"], doc["prompt_tokens"], doc["gen_tokens"])
    files = [(".md", markdown(doc))] + ([(".json", json.dumps(doc, indent=1) + "\n")] if write_json else [])
    for ext, text in files:
        with open(base + ext + ".part", "w") as f:
            f.write(text)
        os.replace(base + ext + ".part", base + ext)
    if with_plot and doc["summary"]:
        plot(doc, base + ".png")


# ---------------------------------------------------------------- the run
def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
        return m.group(1).strip() if m else platform.processor()
    except OSError:
        return platform.processor() or "unknown CPU"


def render(path, with_plot):
    """Writes the .md (and .png) beside an earlier run's JSON."""
    if with_plot:
        need_matplotlib()
    try:
        with open(path) as f:
            doc = json.load(f)
        base = path[:-5] if path.endswith(".json") else path
        write_results(doc, base, with_plot, write_json=False)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BenchError(f"{path} is not a result of this benchmark ({e.__class__.__name__}: {e})") from None
    print(f"[bench] wrote {base}.md" + ("" if not with_plot else ", .png"))
    return 0


def main(argv):
    a = parse_args(argv)
    if a.render:
        return render(a.render, not a.no_plot)
    t_start = time.time()
    a.workdir = os.path.abspath(a.workdir)
    os.makedirs(a.workdir, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    tools = find_tools(a)
    if a.model:
        ckpt = os.path.join(a.workdir, a.model)
        if not os.path.isfile(os.path.join(ckpt, "config.json")):
            make_random_checkpoint(a.model, ckpt)
    else:
        ckpt = os.path.abspath(a.checkpoint)
        if not os.path.isfile(os.path.join(ckpt, "config.json")):
            raise BenchError(f"{ckpt}/config.json not found: CHECKPOINT must be a Hugging Face checkpoint directory")
    key = checkpoint_key(ckpt)
    tag = a.model or re.sub(r"[^A-Za-z0-9_.-]+", "_", os.path.basename(ckpt.rstrip("/")))
    log = os.path.join(a.out, f"cpu_llamacpp_{tag}.log")
    ggufs, steps = prepare_ggufs(a, tools, ckpt, key, log)
    if a.stop_after not in ("convert", "quantize"):
        plans, plan_steps = prepare_plans(a, tools, ckpt, key, log)
        steps.update(plan_steps)
    if a.stop_after:
        print(f"[bench] prepared up to {a.stop_after} in {a.workdir} ({time.time() - t_start:.0f} s)")
        return 0
    version = subprocess.run([tools["g4"], "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    doc = {"benchmark": "cpu-llamacpp", "model": tag, "checkpoint": ckpt, "prompt_tokens": a.prompt, "gen_tokens": a.gen,
           "reps": a.reps, "rounds": a.rounds, "threads": a.thread_list,
           "host": {"cpu": cpu_name(), "hardware_threads": os.cpu_count(), "kernel": platform.release(),
                    "load_at_start": loadavg()},
           "g4": {"version": version[0] if version else "?",
                  "bench_tree_commit": commit.stdout.strip() if commit.returncode == 0 else None,
                  "plans": {k: {"flags": v["flags"], "bytes": os.path.getsize(v["path"])} for k, v in plans.items()}},
           "llama_cpp": {"source": os.path.abspath(a.llama_cpp),
                         "gguf_bytes": {q: os.path.getsize(p) for q, p in ggufs.items()}},
           "prepare_seconds": {k: round(v, 1) for k, v in steps.items()},
           "command_templates": [f"llama-bench -m MODEL-{q}.gguf -p {a.prompt} -n {a.gen} -t T -ngl 0 -r {a.reps} -o json"
                                 + (" " + a.llama_args if a.llama_args else "") + "  (CUDA_VISIBLE_DEVICES=)"
                                 for q in a.quant_list] +
                                [f"g4 bench PLAN -p {a.prompt} -n {a.gen} -d 0 -r {a.reps} --threads T --json  (plan: g4 "
                                 f"compile --model CKPT {' '.join(v['flags'])} --no-fidelity)" for v in plans.values()],
           "runs": [], "not_measured": []}
    base = os.path.join(a.out, f"cpu_llamacpp_{tag}")
    engines = [("llama.cpp", q, ggufs[q]) for q in a.quant_list] + [("g4", k, v["path"]) for k, v in plans.items()]
    for rnd in range(a.rounds):
        for t in sorted(a.thread_list, reverse=True):
            for engine, variant, path in engines:
                left = a.time_limit - (time.time() - t_start) if a.time_limit else None
                if left is not None and left <= 0:
                    continue
                run = measure(engine, variant, path, t, a, tools, timeout=max(left, 30) if left else 3600)
                run["round"] = rnd + 1
                doc["runs"].append(run)
                info = run.get("info", {})
                if engine == "llama.cpp" and "build_commit" in info:
                    doc["llama_cpp"]["build_commit"] = info["build_commit"]
                    doc["llama_cpp"]["flash_attn"] = info.get("flash_attn")
                if "cpu_kernels" in info:
                    doc["g4"]["cpu_kernels"] = info["cpu_kernels"]
                print(f"[bench] round {rnd + 1}, {t:>2} threads, {engine} {variant}: " + (run.get("error") or
                      ", ".join(f"{k} median {statistics.median(v):.0f} ms" for k, v in run["ms"].items() if v))
                      + f" (load {run['load_before']})", flush=True)
            doc["not_measured"] = [f"{e} {v} at {t} threads" for t in sorted(a.thread_list) for e, v, _ in engines
                                   if not any(r["engine"] == e and r["variant"] == v and r["threads"] == t and "ms" in r
                                              for r in doc["runs"])]
            write_results(doc, base, not a.no_plot)
    if a.clean:
        for p in list(ggufs.values()) + [v["path"] for v in plans.values()]:
            os.remove(p)
        bf16 = os.path.join(a.workdir, "gguf", f"{key}-bf16.gguf")
        if os.path.isfile(bf16):
            os.remove(bf16)
        shutil.rmtree(os.path.join(a.workdir, f"stage-{key}"), ignore_errors=True)
        if a.model:
            shutil.rmtree(ckpt, ignore_errors=True)
    print(f"[bench] results: {base}.json, .md" + ("" if a.no_plot else ", .png") + f" ({time.time() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
