#!/usr/bin/env python3
"""nf4_ref.py - independent numpy reference of bitsandbytes' NF4 (4-bit NormalFloat) quantization.

Reimplements, in numpy float32 arithmetic (no torch, no bitsandbytes), the definitions that g4's
compiler/nf4_quant.cpp and kernels/ref/nf4.cpp must reproduce bit for bit:

  * quantize_4bit(quant_type="nf4") of bitsandbytes' pure-torch reference backend
    (bitsandbytes/backends/default/ops.py):
      - blocks of `blocksize` (64) over the row-major flattened array;
      - full blocks:   absmax = max|x| (stored unclamped), scaled = clamp(x * (1 / max(absmax, 1e-38f)), -1, 1)
        (torch's `1.0 / t` is reciprocal(t) * 1.0, i.e. one fp32 division, then one fp32 multiply);
      - a partial tail block: absmax = max(max|x|, 1e-38f) (stored CLAMPED), scaled = clamp(x / absmax, -1, 1);
      - an odd element count is padded with one 0.0 (code 7) before packing;
      - code = torch.bucketize(scaled, bounds, right=False) with bounds = (code[:-1] + code[1:]) / 2 in fp32,
        i.e. the number of midpoints strictly below `scaled`: a value exactly on a midpoint takes the LOWER
        code (the same as torch.argmin's first minimum and CUDA's `x > threshold` decision tree);
      - an all-zero block: absmax 0 -> 0 * (1/1e-38f) = 0 -> code 7 (0.0);
      - packing: element 2i in the high nibble of byte i, element 2i+1 in the low nibble.
  * compress_statistics=True (double quant): offset = mean(absmax) as float32; absmax_q, absmax2 =
    quantize_blockwise(absmax - offset, code=create_dynamic_map(signed=True), blocksize=256), the same
    reference algorithm with the 256-entry dynamic map (bounds = fp32 midpoints, ties to the lower index).
    The mean is fp32(sequential float64 sum) / fp32(n) (torch sums fp32 in a SIMD/thread-dependent cascade
    and then divides in fp32; that sum is not reproducible across machines, so g4 fixes the correctly
    rounded one; the offset is stored, so dequantization is exact either way).
  * create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8) exactly as torch evaluates it:
    torch.linspace(0.1, 1, steps, float32) is start + step*i (i < steps//2) or end - step*(steps-1-i), each
    a fused multiply-add in fp32 (this is what torch's AVX2/AVX512/NEON kernels compute; verified against
    bitsandbytes 0.50.2 on torch 2.15), means = (b[:-1] + b[1:]) / 2, then fp32(10**e) * means.
  * dequantize: absmax = fp32(code2[absmax_q] * absmax2[b // 256]) + offset (two roundings, no FMA);
    w = fp32(codebook[code] * absmax[j // 64]).

Public API:
  quantize(w, double_quant, blocksize=64) -> dict      (components; see the function)
  dequantize(q) -> np.ndarray float32 of q["shape"]
  nf4_roundtrip(w, double_quant=False) -> np.ndarray float32, same shape as w
  to_blob(q) -> bytes                                     (g4 plan layout of kernels/nf4.h)
  to_bnb_state(q, dtype="bfloat16") -> dict name -> (np.ndarray, safetensors dtype), bitsandbytes' serialized form
  create_dynamic_map() -> np.ndarray float32[256]
"""

import json
from fractions import Fraction

import numpy as np

f32 = np.float32

# bitsandbytes get_4bit_type("nf4"): python floats -> torch float32 tensor, then divided by its max (1.0).
NF4_CODE_F64 = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
]
NF4_CODE = np.array(NF4_CODE_F64, dtype=np.float32)
NF4_CODE = NF4_CODE / np.abs(NF4_CODE).max()   # no-op (max is 1.0), kept to mirror get_4bit_type

BLOCK = 64
BLOCK2 = 256
CLAMP_MIN = f32(1e-38)   # torch clamp(min=1e-38) on fp32: the (subnormal) float nearest 1e-38


def _round_f32(x: Fraction) -> np.float32:
    """Exact rational -> nearest float32, ties to even."""
    r = f32(float(x))
    cands = [np.nextafter(r, f32(-np.inf)), r, np.nextafter(r, f32(np.inf))]

    def key(c):
        bits = int(np.array([c], dtype=np.float32).view(np.uint32)[0])
        return (abs(Fraction(float(c)) - x), bits & 1)

    return f32(min(cands, key=key))


def _fma32(a, b, c) -> np.float32:
    return _round_f32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))


def _linspace_f32(start: float, end: float, steps: int) -> np.ndarray:
    """torch.linspace(start, end, steps, dtype=torch.float32) on CPU (fused multiply-add form)."""
    s, e = f32(start), f32(end)
    if steps == 1:
        return np.array([s], dtype=np.float32)
    step = f32((e - s) / f32(steps - 1))
    half = steps // 2
    out = []
    for i in range(steps):
        if i < half:
            out.append(_fma32(step, f32(i), s))
        else:
            out.append(_fma32(-step, f32(steps - 1 - i), e))
    return np.array(out, dtype=np.float32)


def create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8) -> np.ndarray:
    """bitsandbytes.functional.create_dynamic_map, float32[2**total_bits], ascending."""
    data = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    i = 0
    for i in range(max_exponent_bits):
        fraction_items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                             else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        b = _linspace_f32(0.1, 1, fraction_items)
        means = (b[:-1] + b[1:]) / f32(2.0)
        scale = f32(10 ** (-(max_exponent_bits - 1) + i))
        data += [float(v) for v in (scale * means)]
        if signed:
            data += [float(v) for v in (f32(-scale) * means)]
    if additional_items > 0:
        b = _linspace_f32(0.1, 1, additional_items + 1)
        means = (b[:-1] + b[1:]) / f32(2.0)
        scale = f32(10 ** (-(max_exponent_bits - 1) + i))
        data += [float(v) for v in (scale * means)]
        if signed:
            data += [float(v) for v in (f32(-scale) * means)]
    data.append(0.0)
    data.append(1.0)
    assert len(data) == 2 ** total_bits
    data += [0.0] * (256 - len(data))
    data.sort()
    return np.array(data, dtype=np.float32)


def _bounds(code: np.ndarray) -> np.ndarray:
    return ((code[:-1] + code[1:]) / f32(2)).astype(np.float32)


def quantize_blockwise(x: np.ndarray, code: np.ndarray, blocksize: int):
    """bnb reference quantize_blockwise / the scaling half of quantize_4bit.
    Returns (codes uint8[n] (index into code), absmax float32[nblocks])."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    n = x.size
    rem = n % blocksize
    full = n - rem
    nfull = full // blocksize
    absmax = np.empty(nfull + (1 if rem else 0), dtype=np.float32)
    scaled = np.empty(n, dtype=np.float32)
    if nfull:
        a = x[:full].reshape(nfull, blocksize)
        am = np.abs(a).max(axis=1).astype(np.float32)
        absmax[:nfull] = am
        inv = (f32(1.0) / np.maximum(am, CLAMP_MIN)).astype(np.float32)
        scaled[:full] = np.clip(a * inv[:, None], f32(-1), f32(1)).reshape(-1)
    if rem:
        am = max(f32(np.abs(x[full:]).max()), CLAMP_MIN)
        absmax[nfull] = am
        scaled[full:] = np.clip(x[full:] / am, f32(-1), f32(1))
    q = _bucketize(scaled, _bounds(code))
    return q.astype(np.uint8), absmax


def _bucketize(v: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    # torch.bucketize(right=False): index i with bounds[i-1] < v <= bounds[i] == count of bounds < v.
    return np.searchsorted(bounds, v.astype(np.float32), side="left")


def _mean_f32(a: np.ndarray) -> np.float32:
    s = np.cumsum(a.astype(np.float64))[-1] if a.size else 0.0   # sequential float64 sum
    return f32(f32(s) / f32(a.size))


def quantize(w: np.ndarray, double_quant: bool, blocksize: int = BLOCK) -> dict:
    """NF4-quantizes w (any shape, row-major). Returns a dict:
      shape, n, blocksize, double_quant,
      codes   uint8[n]            NF4 index per element (unpacked)
      packed  uint8[ceil(n/2)]    high nibble = even element
      absmax  float32[nblocks]    first-level absmax (before double quant)
      and, if double_quant:
      absmax_q uint8[nblocks], absmax2 float32[ceil(nblocks/256)], offset float32, code2 float32[256]."""
    w = np.asarray(w)
    x = np.ascontiguousarray(w, dtype=np.float32).reshape(-1)
    n = x.size
    codes, absmax = quantize_blockwise(x, NF4_CODE, blocksize)
    padded = np.concatenate([codes, np.array([7], np.uint8)]) if n % 2 else codes
    packed = ((padded[0::2].astype(np.uint8) << 4) | padded[1::2]).astype(np.uint8)
    q = dict(shape=tuple(w.shape), n=n, blocksize=blocksize, double_quant=bool(double_quant),
             codes=codes, packed=packed, absmax=absmax)
    if double_quant:
        offset = _mean_f32(absmax)
        code2 = create_dynamic_map()
        absmax_q, absmax2 = quantize_blockwise((absmax - offset).astype(np.float32), code2, BLOCK2)
        q.update(absmax_q=absmax_q, absmax2=absmax2, offset=offset, code2=code2)
    return q


def block_absmax(q: dict) -> np.ndarray:
    """Per-block fp32 scales the dequantizer uses."""
    if not q["double_quant"]:
        return q["absmax"]
    b = np.arange(q["absmax_q"].size)
    prod = (q["code2"][q["absmax_q"]] * q["absmax2"][b // BLOCK2]).astype(np.float32)
    return (prod + q["offset"]).astype(np.float32)


def unpack(packed: np.ndarray, n: int) -> np.ndarray:
    out = np.empty(packed.size * 2, dtype=np.uint8)
    out[0::2] = packed >> 4
    out[1::2] = packed & 0xF
    return out[:n]


def dequantize(q: dict) -> np.ndarray:
    n, bs = q["n"], q["blocksize"]
    codes = unpack(q["packed"], n)
    scale = block_absmax(q)
    out = (NF4_CODE[codes] * scale[np.arange(n) // bs]).astype(np.float32)
    return out.reshape(q["shape"])


def nf4_roundtrip(w: np.ndarray, double_quant: bool = False) -> np.ndarray:
    """float32 values of w after NF4 quantization (blocksize 64) and dequantization, same shape as w.
    The default (single quant, fp32 absmax) is what `g4 compile` writes by default; double_quant=True is
    `g4 compile --double-quant` / bitsandbytes' bnb_4bit_use_double_quant (Unsloth/QLoRA checkpoints)."""
    return dequantize(quantize(w, double_quant))


def _align16(v: int) -> int:
    return (v + 15) // 16 * 16


def blob_layout(n: int, double_quant: bool) -> dict:
    """Byte offsets of the g4 plan NF4 blob (kernels/nf4.h)."""
    nb = -(-n // BLOCK)
    nb2 = -(-nb // BLOCK2)
    codes_bytes = (n + 1) // 2
    absmax_off = _align16(codes_bytes)
    if not double_quant:
        return dict(n=n, nblocks=nb, nblocks2=0, codes_off=0, codes_bytes=codes_bytes, absmax_off=absmax_off,
                    absmax2_off=0, offset_off=0, code2_off=0, total=absmax_off + 4 * nb)
    absmax2_off = _align16(absmax_off + nb)
    offset_off = absmax2_off + 4 * nb2
    code2_off = _align16(offset_off + 4)
    return dict(n=n, nblocks=nb, nblocks2=nb2, codes_off=0, codes_bytes=codes_bytes, absmax_off=absmax_off,
                absmax2_off=absmax2_off, offset_off=offset_off, code2_off=code2_off, total=code2_off + 4 * 256)


def to_blob(q: dict) -> bytes:
    assert q["blocksize"] == BLOCK
    lay = blob_layout(q["n"], q["double_quant"])
    b = bytearray(lay["total"])

    def put(off, arr):
        raw = np.ascontiguousarray(arr).astype(np.asarray(arr).dtype.newbyteorder("<")).tobytes()
        b[off:off + len(raw)] = raw

    put(0, q["packed"])
    if q["double_quant"]:
        put(lay["absmax_off"], q["absmax_q"])
        put(lay["absmax2_off"], q["absmax2"])
        put(lay["offset_off"], np.array([q["offset"]], np.float32))
        put(lay["code2_off"], q["code2"])
    else:
        put(lay["absmax_off"], q["absmax"])
    return bytes(b)


def to_bnb_state(q: dict, dtype: str = "bfloat16") -> dict:
    """bitsandbytes' serialized Linear4bit weight (QuantState.as_dict(packed=True) + the packed weight),
    as {suffix: (array, safetensors dtype)}; suffixes are appended to "<prefix>.weight"."""
    st = {
        "": (q["packed"].reshape(-1, 1), "U8"),
        ".quant_map": (NF4_CODE.copy(), "F32"),
    }
    qs = {"quant_type": "nf4", "blocksize": int(q["blocksize"]), "dtype": dtype, "shape": list(q["shape"])}
    if q["double_quant"]:
        st[".absmax"] = (q["absmax_q"], "U8")
        st[".nested_absmax"] = (q["absmax2"], "F32")
        st[".nested_quant_map"] = (q["code2"], "F32")
        qs.update(nested_blocksize=BLOCK2, nested_dtype="float32", nested_offset=float(q["offset"]))
    else:
        st[".absmax"] = (q["absmax"], "F32")
    js = json.dumps(qs).encode("utf-8")   # pack_dict_to_tensor: json.dumps -> utf-8 -> uint8 tensor
    st[".quant_state.bitsandbytes__nf4"] = (np.frombuffer(js, dtype=np.uint8).copy(), "U8")
    return st
