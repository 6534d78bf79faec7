"""Exact models of the floating-point operations the NVFP4 path uses, in plain torch.

The single definition of every rounding rule in the workbench: kernels follow it and tests compare
against it. Everything here works on CPU and CUDA tensors and gives the same bits on both.

* :func:`round_to_format` — round-to-nearest-even onto a binary format's grid (bf16, fp16, fp32,
  E4M3 with subnormals, saturating or overflowing to inf), computed exactly in float64.
* :func:`flush`, :func:`fmul_ftz` — fp32 multiply with denormal inputs and outputs flushed to
  signed zero (what ``FMUL.FTZ`` does).
* :func:`e4m3_encode` / :func:`e4m3_decode`, :func:`e2m1_encode` / :func:`e2m1_decode` — codecs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

FLT_MAX = 3.4028234663852886e38
FLT_MIN_NORMAL = 2.0**-126
RN_ONE_SIXTH = 0.1666666716337204  # RN_fp32(1/6) = 0x3E2AAAAB, the constant ptxas folds /6 into


@dataclass(frozen=True)
class Format:
    name: str
    mbits: int  # explicit mantissa bits
    emin: int  # exponent of the smallest normal
    max_finite: float
    saturate: bool  # True: overflow clamps to max_finite (satfinite); False: rounds to inf


BF16 = Format("bf16", 7, -126, float(torch.finfo(torch.bfloat16).max), False)
FP16 = Format("fp16", 10, -14, 65504.0, False)
FP32 = Format("fp32", 23, -126, FLT_MAX, False)
E4M3 = Format("e4m3", 3, -6, 448.0, True)
FORMATS = {torch.bfloat16: BF16, torch.float16: FP16, torch.float32: FP32}


def round_to_format(x: torch.Tensor, fmt: Format) -> torch.Tensor:
    """RNE of ``x`` (any float dtype, read exactly as float64) onto ``fmt``; returns float64.

    Gradual underflow below ``2**fmt.emin``; overflow saturates (satfinite) or becomes ±inf;
    NaN stays NaN, ±inf stays ±inf (or saturates when ``fmt.saturate``).
    """
    x = x.to(torch.float64)
    finite = torch.isfinite(x) & (x != 0)
    xs = torch.where(finite, x, torch.ones_like(x))
    _, e = torch.frexp(xs)  # |x| = m * 2**e, m in [0.5, 1)
    exp = torch.clamp(e.to(torch.float64) - 1, min=fmt.emin)
    ulp = torch.exp2(exp - fmt.mbits)
    q = torch.round(xs / ulp) * ulp  # division by a power of two is exact; round() is RNE
    big = q.abs() > fmt.max_finite
    if fmt.saturate:
        q = torch.where(big, torch.copysign(torch.full_like(q, fmt.max_finite), q), q)
    else:
        q = torch.where(big, torch.copysign(torch.full_like(q, float("inf")), q), q)
    out = torch.where(finite, q, x)
    if fmt.saturate:
        out = torch.where(torch.isinf(x), torch.copysign(torch.full_like(x, fmt.max_finite), x),
                          out)
    return out


def flush(x: torch.Tensor) -> torch.Tensor:
    """Flush fp32 denormals to zero, keeping the sign (FTZ)."""
    return torch.where((x.abs() < FLT_MIN_NORMAL) & (x != 0), x * 0.0, x)


def fmul_ftz(a, b) -> torch.Tensor:
    """IEEE fp32 multiply, round to nearest, with FTZ on inputs and output (FMUL.FTZ)."""
    a = flush(torch.as_tensor(a, dtype=torch.float32))
    b = flush(torch.as_tensor(b, dtype=torch.float32, device=a.device))
    return flush(a * b)


# --- E4M3 (float8_e4m3fn) -------------------------------------------------------------------
def e4m3_decode(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes -> float32 values (0x7F / 0xFF are NaN)."""
    return codes.to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)


def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    """``cvt.rn.satfinite.e4m3x2.f32``: RNE with subnormals (2**-9 step), saturate at ±448,
    NaN -> 0x7F. Returns uint8 codes."""
    v = round_to_format(x, E4M3)
    nan = torch.isnan(v)
    codes = torch.where(nan, torch.zeros_like(v), v).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(nan, torch.full_like(codes, 0x7F), codes)


# --- E2M1 -----------------------------------------------------------------------------------
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_decode(codes: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """4-bit codes (0..15) -> values; bit 3 is the sign (0x8 is -0.0)."""
    lut = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32,
                       device=codes.device)
    lut[8] = -0.0
    return lut[codes.to(torch.long)].to(dtype)


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """RNE to E2M1 with saturation at 6 (the ``cuda_fp4.h`` software path on sm_90).

    Magnitude code = [a>0.25]+[a>=0.75]+[a>1.25]+[a>=1.75]+[a>2.5]+[a>=3.5]+[a>5]; the sign bit
    is kept (-0.0 -> 0x8); ±inf -> ±6; NaN -> 0x7 (+6, sign dropped). Returns uint8 codes.
    """
    a = v.abs()
    code = ((a > 0.25).to(torch.uint8) + (a >= 0.75).to(torch.uint8) + (a > 1.25).to(torch.uint8)
            + (a >= 1.75).to(torch.uint8) + (a > 2.5).to(torch.uint8)
            + (a >= 3.5).to(torch.uint8) + (a > 5).to(torch.uint8))
    sign = torch.signbit(v).to(torch.uint8) << 3
    code = code | sign
    return torch.where(torch.isnan(v), torch.full_like(code, 0x7), code)
