"""A second, independent transcription of the Comfy CUDA quantizer, one scalar at a time.

Plain Python floats and numpy float32 scalars, no torch, written straight from the spec
(nvfp4-numerics.md §1.3). It is slow and exists only to cross-check :mod:`numerics.nvfp4` on small
random tiles in CI (ladder rung 2): two implementations that share no code must agree on every
byte. It shares only the measured MUFU table.
"""
from __future__ import annotations

import math
import struct

import numpy as np

from numerics.rcp import correction_table

_F32 = np.float32
_MIN_NORMAL = 2.0**-126
_FLT_MAX = float(np.finfo(np.float32).max)


def _bits(f: float) -> int:
    return struct.unpack("<I", struct.pack("<f", f))[0]


def _from_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0]


def ftz(f: float) -> float:
    return math.copysign(0.0, f) if f != 0 and abs(f) < _MIN_NORMAL else f


def fmul(a: float, b: float) -> float:
    with np.errstate(all="ignore"):
        return ftz(float(_F32(ftz(a)) * _F32(ftz(b))))


def rcp(x: float) -> float:
    x = ftz(x)
    if math.isnan(x):
        return x
    if x == 0:
        return math.copysign(math.inf, x)
    if math.isinf(x):
        return math.copysign(0.0, x)
    r = float(_F32(1.0) / _F32(x))
    if abs(r) < _MIN_NORMAL:
        return math.copysign(0.0, r)
    corr = int(correction_table()[_bits(x) & 0x7FFFFF])
    return _from_bits(_bits(r) + corr)


def e4m3_round(d: float) -> tuple[int, float]:
    """satfinite RNE to E4M3 (d >= 0 or NaN here) -> (code, value)."""
    if math.isnan(d):
        return 0x7F, math.nan
    sign = 0x80 if math.copysign(1.0, d) < 0 else 0
    a = min(abs(d), 448.0)
    if a == 0:
        return sign, math.copysign(0.0, d)
    e = max(math.frexp(a)[1] - 1, -6)
    ulp = 2.0 ** (e - 3)
    q = round(a / ulp) * ulp  # Python's round() is half-to-even
    q = min(q, 448.0)
    if q == 0:
        return sign, math.copysign(0.0, d)
    qe = math.frexp(q)[1] - 1
    if qe < -6:  # subnormal: exponent field 0, mantissa = q / 2^-9
        code = int(q / 2.0**-9)
    else:
        code = ((qe + 7) << 3) | int((q / 2.0**qe - 1.0) * 8)
    return sign | code, math.copysign(q, d)


def e2m1_code(v: float) -> int:
    if math.isnan(v):
        return 0x7
    a = abs(v)
    code = sum((a > 0.25, a >= 0.75, a > 1.25, a >= 1.75, a > 2.5, a >= 3.5, a > 5))
    return code | (8 if math.copysign(1.0, v) < 0 else 0)


def block_scale(amax: float, g: float) -> tuple[int, float]:
    """The block's E4M3 scale (code, value) from its NaN-ignoring amax and the tensor scale g."""
    d = fmul(fmul(amax, float(_F32(1.0) / _F32(6.0))), rcp(g))
    d = 448.0 if math.isnan(d) else min(d, 448.0)
    return e4m3_round(d)


def quantize_block(xs: list[float], g: float) -> tuple[int, list[int]]:
    """One 16-element block (values already exact in fp32) -> (scale code, 16 E2M1 codes)."""
    finite = [abs(x) for x in xs if not math.isnan(x)]
    s8, sf = block_scale(max(finite) if finite else math.nan, g)
    enc = rcp(fmul(g, sf))
    enc = _FLT_MAX if math.isnan(enc) else min(enc, _FLT_MAX)
    return s8, [e2m1_code(fmul(x, enc)) for x in xs]
