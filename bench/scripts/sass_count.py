#!/usr/bin/env python3
# Static SASS size of the kernels of kernels/cuda/*.cu (all_kernels.cuh): nvcc -cubin for one target, nvdisasm, then per
# kernel its instruction count and its loops' (a backward branch's span) instruction counts. A proxy for
# issue slots on a hot path: predicated-off instructions still take one (docs/performance.md).
# Needs nvcc and nvdisasm (CUDA toolkit; or `pip download nvidia-cuda-nvdisasm`, its wheel unzipped, with
# NVDISASM=path). No GPU.
#   python3 bench/scripts/sass_count.py [--arch sm_90] [-D G4_AD_HPG=8 ...] [--patch FILE] [--filter REGEX] [--loops]
# --patch applies FILE's kernels/ hunks to a temporary copy of kernels/ first (git apply), so a patch's
# kernels and this tree's can be compared in two runs.
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tool(name, env):
    p = os.environ.get(env) or shutil.which(name) or os.path.join("/usr/local/cuda/bin", name)
    if not os.path.exists(p):
        sys.exit(f"sass_count: {name} not found; set {env}=path (the CUDA toolkit's, or pip's nvidia-cuda-nvdisasm)")
    return p


def kernels_source(patch, tmp):
    if not patch:
        return os.path.join(ROOT, "kernels/cuda/all_kernels.cuh")
    dst = os.path.join(tmp, "tree")
    shutil.copytree(os.path.join(ROOT, "kernels"), os.path.join(dst, "kernels"))
    r = subprocess.run(["git", "apply", "--include=kernels/*", os.path.abspath(patch)], cwd=dst, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sass_count: {patch} does not apply to kernels/: {r.stderr.strip()}")
    return os.path.join(dst, "kernels/cuda/all_kernels.cuh")


def functions(sass):
    # nvdisasm -c: ".text.<name>:" opens each kernel; instructions carry a /*xxxx*/ address comment, and a
    # ".L_x_N:" line labels the next instruction. Yields (name, [(address, instruction)], {label: address}).
    parts = re.split(r"\n\s*\.text\.(\S+):", sass)
    for i in range(1, len(parts), 2):
        body, labels, pending = [], {}, []
        for line in parts[i + 1].splitlines():
            lab = re.match(r"\s*(\.L_x_\d+):", line)
            if lab:
                pending.append(lab.group(1))
                continue
            m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;", line)
            if m:
                addr = int(m.group(1), 16)
                for l in pending:
                    labels[l] = addr
                pending = []
                body.append((addr, m.group(2)))
        yield parts[i], body, labels


def loops(body, labels):
    # A branch to a lower address closes a loop: (instructions from its target to it, target, branch).
    index = {a: i for i, (a, _) in enumerate(body)}
    out = []
    for i, (addr, ins) in enumerate(body):
        m = re.search(r"\bBRA\b.*\((\.L_x_\d+)\)", ins)
        target = labels.get(m.group(1)) if m else None
        if target is not None and target < addr:
            out.append((i - index[target] + 1, target, addr))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("-D", action="append", default=[], help="a macro for kernels.cu (e.g. G4_AD_HPG=8)")
    ap.add_argument("--patch")
    ap.add_argument("--filter", default="")
    ap.add_argument("--loops", action="store_true", help="also each loop's instruction count")
    a = ap.parse_args()
    nvcc, nvdisasm = tool("nvcc", "NVCC"), tool("nvdisasm", "NVDISASM")
    with tempfile.TemporaryDirectory() as tmp:
        src = kernels_source(a.patch, tmp)
        cubin = os.path.join(tmp, "k.cubin")
        cmd = [nvcc, "-cubin", f"-arch={a.arch}", "-std=c++17", "-O3", "-x", "cu", src, "-o", cubin] + [f"-D{d}" for d in a.D]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("sass_count: nvcc failed:\n" + r.stderr)
        sass = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True, check=True).stdout
    rx = re.compile(a.filter)
    rows = sorted((f for f in functions(sass) if rx.search(f[0])), key=lambda f: f[0])
    if not rows:
        sys.exit(f"sass_count: no kernel matches '{a.filter}'")
    for name, body, labels in rows:
        print(f"{name:40s} {len(body):6d}")
        if a.loops:
            for n, t, e in loops(body, labels):
                print(f"    loop {t:#07x}..{e:#07x}: {n} instructions")


if __name__ == "__main__":
    main()
