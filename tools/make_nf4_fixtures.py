#!/usr/bin/env python3
"""make_nf4_fixtures.py - NF4 test vectors for tests/unit/nf4_test.cpp, from tools/nf4_ref.py.

Writes tests/fixtures/nf4/:
  index.json   every case and where its arrays live in data.bin
  data.bin     raw little-endian arrays (float32 / uint8), back to back, 16-byte aligned

Cases:
  quant[]      input float32 x (n values) and, for single and double quant, the expected g4 blob
               (kernels/nf4.h layout), its components (packed codes, absmax, absmax_q, absmax2, offset,
               code2) and the dequantized values.
  blockwise[]  bnb quantize_blockwise(x, code=create_dynamic_map(), blocksize=256) alone: codes + absmax
               (exercises exact ties on the dynamic map's midpoints).
  bnb[]        pre-quantized tensors in bitsandbytes' serialized form (the safetensors entries
               P.weight, P.weight.absmax, P.weight.quant_map, P.weight.nested_absmax,
               P.weight.nested_quant_map, P.weight.quant_state.bitsandbytes__nf4) + expected fp32 dequant.
  nf4_code, dynamic_map, nf4_bounds    the tables themselves.

Usage:  python tools/make_nf4_fixtures.py [--out tests/fixtures/nf4] [--bnb-check]
Deterministic (fixed numpy seeds, numpy only). --bnb-check additionally compares tools/nf4_ref.py with an
installed bitsandbytes (pip install bitsandbytes; CPU is enough), running bnb's pure-torch reference backend.
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nf4_ref as R  # noqa: E402

f32 = np.float32


class Data:
    def __init__(self):
        self.buf = bytearray()

    def add(self, arr) -> dict:
        arr = np.ascontiguousarray(arr)
        if arr.dtype == np.float32:
            dt, raw = "f32", arr.astype("<f4").tobytes()
        elif arr.dtype == np.uint8:
            dt, raw = "u8", arr.tobytes()
        else:
            raise TypeError(arr.dtype)
        while len(self.buf) % 16:
            self.buf.append(0)
        ent = {"offset": len(self.buf), "bytes": len(raw), "dtype": dt, "count": int(arr.size)}
        self.buf += raw
        return ent

    def add_bytes(self, raw: bytes) -> dict:
        return self.add(np.frombuffer(raw, dtype=np.uint8))


def tie_values(code: np.ndarray, blocksize: int, rng) -> np.ndarray:
    """Blocks whose absmax is exactly a power of two, holding every fp32 midpoint between neighbouring codes
    (scaled by that power), its two float neighbours, and the codes themselves."""
    mids = R._bounds(code)
    vals = []
    for m in mids:
        vals += [m, np.nextafter(m, f32(-np.inf)), np.nextafter(m, f32(np.inf))]
    vals += list(code)
    vals = np.array(vals, dtype=np.float32)
    blocks = []
    for scale, sign in [(1.0, 1), (4.0, -1), (0.0078125, 1)]:
        v = vals.copy()
        rng.shuffle(v)
        per = blocksize - 1
        for i in range(0, len(v), per):
            chunk = v[i:i + per]
            blk = np.zeros(blocksize, dtype=np.float32)
            blk[0] = f32(sign)   # the absmax of the block is exactly 1 (times scale)
            blk[1:1 + len(chunk)] = chunk
            blocks.append(blk * f32(scale))
    return np.concatenate(blocks)


def make_quant_cases(rng):
    cases = {}

    def normal(n, sd=0.05):
        return (rng.standard_normal(n) * sd).astype(np.float32)

    cases["n64"] = normal(64)
    cases["n128"] = normal(128)
    cases["n1000"] = normal(1000, 0.02)
    cases["n63"] = normal(63)
    cases["n1"] = np.array([-0.37], dtype=np.float32)
    big = normal(64 * 256 * 2 + 70, 1.0)
    scales = np.exp(rng.uniform(-6, 1, size=-(-big.size // 64))).astype(np.float32)   # spread the absmax values
    cases["n32838_3dq_blocks"] = (big * np.repeat(scales, 64)[:big.size]).astype(np.float32)
    z = normal(64 * 5 + 10)
    z[64:128] = 0
    z[192:256] = 0
    z[320:] = 0
    cases["zero_blocks"] = z                      # zero full blocks (absmax 0) and a zero tail (absmax 1e-38)
    cases["all_zero_200"] = np.zeros(200, dtype=np.float32)
    cases["nf4_ties"] = tie_values(R.NF4_CODE, 64, rng)
    mags = [normal(64, 1e30), normal(64, 1e-30), normal(64, 1e-40), np.full(64, 3.0e38, np.float32) * np.sign(normal(64)),
            normal(64, 1.0), np.concatenate([normal(32, 1e30), normal(32, 1e-30)]), normal(5, 1e-20)]
    cases["magnitudes"] = np.concatenate(mags).astype(np.float32)
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "nf4"))
    ap.add_argument("--bnb-check", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(20260421)
    d = Data()
    dyn = R.create_dynamic_map()
    index = {
        "generator": "tools/make_nf4_fixtures.py (reference: tools/nf4_ref.py)",
        "nf4_code": d.add(R.NF4_CODE),
        "nf4_bounds": d.add(R._bounds(R.NF4_CODE)),
        "dynamic_map": d.add(dyn),
        "quant": [],
        "blockwise": [],
        "bnb": [],
    }

    for name, x in make_quant_cases(rng).items():
        case = {"name": name, "n": int(x.size), "x": d.add(x)}
        for mode, dq in [("single", False), ("double", True)]:
            q = R.quantize(x, dq)
            lay = R.blob_layout(x.size, dq)
            m = {"blob": d.add_bytes(R.to_blob(q)), "layout": lay, "packed": d.add(q["packed"]),
                 "absmax": d.add(q["absmax"]), "deq": d.add(R.dequantize(q).reshape(-1))}
            if dq:
                m.update(absmax_q=d.add(q["absmax_q"]), absmax2=d.add(q["absmax2"]),
                         offset=d.add(np.array([q["offset"]], np.float32)),
                         block_absmax=d.add(R.block_absmax(q)))
            case[mode] = m
        index["quant"].append(case)

    # quantize_blockwise on the dynamic map: exact midpoint ties, a zero block, a partial tail, negatives.
    bw = np.concatenate([tie_values(dyn, 256, rng), np.zeros(256, np.float32),
                         (rng.standard_normal(100) * 3).astype(np.float32)])
    codes, am = R.quantize_blockwise(bw, dyn, 256)
    index["blockwise"].append({"name": "dynamic_map_ties", "blocksize": 256, "n": int(bw.size), "x": d.add(bw),
                               "codes": d.add(codes), "absmax": d.add(am)})

    # bitsandbytes serialized (pre-quantized) tensors.
    for name, shape, dq, bs, dtype in [("single_48x80", (48, 80), False, 64, "bfloat16"),
                                       ("nested_96x200", (96, 200), True, 64, "bfloat16"),
                                       ("nested_bs128_40x100", (40, 100), True, 128, "float16"),
                                       ("single_odd_7x9", (7, 9), False, 64, "float32")]:
        w = (rng.standard_normal(shape) * 0.03).astype(np.float32)
        q = R.quantize(w, dq, blocksize=bs)
        st = R.to_bnb_state(q, dtype=dtype)
        tensors = {}
        for suffix, (arr, sdt) in st.items():
            tensors["weight" + suffix] = {"dtype": sdt, "shape": list(arr.shape), "data": d.add(arr)}
        index["bnb"].append({"name": name, "shape": list(shape), "double_quant": dq, "blocksize": bs,
                             "quant_state_json": bytes(st[".quant_state.bitsandbytes__nf4"][0]).decode("utf-8"),
                             "tensors": tensors, "expected": d.add(R.dequantize(q).reshape(-1))})

    with open(os.path.join(args.out, "data.bin"), "wb") as fh:
        fh.write(bytes(d.buf))
    with open(os.path.join(args.out, "index.json"), "w") as fh:
        json.dump(index, fh, indent=1)
        fh.write("\n")
    print(f"wrote {args.out}: data.bin {len(d.buf)} bytes, {len(index['quant'])} quant cases, "
          f"{len(index['bnb'])} bnb tensors")

    if args.bnb_check:
        sys.exit(subprocess.call([sys.executable, os.path.abspath(__file__), "--_bnb_check_child", args.out]))


BNB_CHECK = r'''
import ctypes, sys, json, os
# Hide bitsandbytes' native CPU library so its pure-torch reference backend (backends/default/ops.py) runs.
_CDLL = ctypes.CDLL
class _NoBnb(_CDLL):
    def __init__(self, name, *a, **k):
        if "bitsandbytes" in str(name):
            raise OSError("hidden: use the reference backend")
        super().__init__(name, *a, **k)
ctypes.CDLL = _NoBnb
_load = ctypes.cdll.LoadLibrary
def _load_no_bnb(name, *a, **k):
    if "bitsandbytes" in str(name):
        raise OSError("hidden: use the reference backend")
    return _load(name, *a, **k)
ctypes.cdll.LoadLibrary = _load_no_bnb
import numpy as np, torch
import bitsandbytes, bitsandbytes.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[1])))
import nf4_ref as R
out = sys.argv[2]
idx = json.load(open(os.path.join(out, "index.json")))
data = open(os.path.join(out, "data.bin"), "rb").read()
def arr(e):
    return np.frombuffer(data, dtype=np.float32 if e["dtype"] == "f32" else np.uint8, count=e["count"], offset=e["offset"])
fails = 0
def check(what, ok):
    global fails
    fails += (not ok)
    print(("ok   " if ok else "FAIL ") + what)
print("bitsandbytes", bitsandbytes.__version__, "torch", torch.__version__)
check("create_dynamic_map() bitwise", np.array_equal(F.create_dynamic_map().numpy().view(np.uint32), R.create_dynamic_map().view(np.uint32)))
check("get_4bit_type('nf4') bitwise", np.array_equal(F.get_4bit_type("nf4", device="cpu").numpy().view(np.uint32), R.NF4_CODE.view(np.uint32)))
for c in idx["quant"]:
    x = torch.from_numpy(arr(c["x"]).copy())
    p, s = F.quantize_4bit(x, blocksize=64, compress_statistics=False, quant_type="nf4")
    check(c["name"] + " single: packed+absmax", np.array_equal(p.numpy().reshape(-1), arr(c["single"]["packed"]))
          and np.array_equal(s.absmax.numpy().view(np.uint32), arr(c["single"]["absmax"]).view(np.uint32)))
    check(c["name"] + " single: dequantize_4bit", np.array_equal(F.dequantize_4bit(p, s).numpy().reshape(-1).view(np.uint32),
                                                                 arr(c["single"]["deq"]).view(np.uint32)))
    p, s = F.quantize_4bit(x, blocksize=64, compress_statistics=True, quant_type="nf4")
    mine = float(arr(c["double"]["offset"])[0])
    same_off = s.offset.item() == mine
    # torch's fp32 mean may differ from nf4_ref's correctly rounded one by an ulp; redo stage 2 with torch's offset.
    aq, a2 = R.quantize_blockwise((arr(c["single"]["absmax"]) - np.float32(s.offset.item())).astype(np.float32),
                                  R.create_dynamic_map(), 256)
    check(c["name"] + " double: packed, stage 2 given bnb's offset (offset %s)" % ("identical" if same_off else
          "differs: bnb %r, ref %r" % (s.offset.item(), mine)),
          np.array_equal(p.numpy().reshape(-1), arr(c["double"]["packed"])) and np.array_equal(s.absmax.numpy(), aq)
          and np.array_equal(s.state2.absmax.numpy().view(np.uint32), a2.view(np.uint32)))
    if same_off:
        check(c["name"] + " double: dequantize_4bit", np.array_equal(F.dequantize_4bit(p, s).numpy().reshape(-1).view(np.uint32),
                                                                     arr(c["double"]["deq"]).view(np.uint32)))
for c in idx["blockwise"]:
    code = torch.from_numpy(R.create_dynamic_map())
    q, am = torch.ops.bitsandbytes.quantize_blockwise(torch.from_numpy(arr(c["x"]).copy()), code, c["blocksize"])
    check("blockwise " + c["name"] + ": quantize_blockwise (reference backend)",
          np.array_equal(q.numpy(), arr(c["codes"])) and np.array_equal(am.numpy().view(np.uint32), arr(c["absmax"]).view(np.uint32)))
for b in idx["bnb"]:
    t = {k: torch.from_numpy(arr(v["data"]).copy().reshape(v["shape"])) for k, v in b["tensors"].items()}
    qs = F.QuantState.from_dict({k[len("weight."):]: v for k, v in t.items() if k != "weight"}, device="cpu")
    qs.dtype = torch.float32   # compare the fp32 values before the cast to the checkpoint dtype
    w = F.dequantize_4bit(t["weight"], qs).numpy().reshape(-1)
    check("bnb " + b["name"] + ": QuantState.from_dict + dequantize_4bit", np.array_equal(w.view(np.uint32), arr(b["expected"]).view(np.uint32)))
print(("%d failed" % fails) if fails else "all bitsandbytes cross-checks passed")
sys.exit(1 if fails else 0)
'''

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--_bnb_check_child":
        sys.exit(subprocess.call([sys.executable, "-c", BNB_CHECK, os.path.abspath(__file__), sys.argv[2]]))
    main()
