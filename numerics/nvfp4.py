"""NVFP4 as Comfy Kitchen (0.2.31-0.2.40) computes it, bit for bit.

Layout: E2M1 codes packed two per byte (``hi_first=True``: element 2i in the high nibble), one
E4M3 scale per 16 consecutive elements of a row stored in the cuBLAS 128x4 swizzle
(``[roundup(M,128), roundup(K/16,4)]``, zero padding), and one fp32 tensor scale g in the decode
direction (x ≈ e2m1 · s · g).

``mode="cuda"`` reproduces the CUDA kernel (built with --use_fast_math): FTZ multiplies,
``/6 -> ·RN(1/6)``, the MUFU reciprocal (numerics.rcp), ``fminf(·, 448)`` with NaN -> 448, E4M3
RNE with subnormals, E2M1 thresholds with the sign kept and NaN -> +6, NaN ignored in the block
amax. ``mode="eager"`` reproduces the eager torch backend as it runs on a GPU.
"""
from __future__ import annotations

import torch

from numerics.formats import (BF16, FLT_MAX, FORMATS, RN_ONE_SIXTH, e2m1_decode, e2m1_encode,
                              e4m3_decode, e4m3_encode, fmul_ftz, round_to_format)
from numerics.rcp import rcp_approx

F8_E4M3_MAX = 448.0
F4_E2M1_MAX = 6.0
BLOCK = 16
MODES = ("cuda", "eager")


def _roundup(a: int, b: int) -> int:
    return -(-a // b) * b


def scale_shape(rows: int, cols: int) -> tuple[int, int]:
    """Shape of the swizzled scale buffer for a [rows, cols] operand (cols = K elements)."""
    return _roundup(rows, 128), _roundup(-(-cols // BLOCK), 4)


# --- global scale ---------------------------------------------------------------------------
def global_scale(x: torch.Tensor) -> torch.Tensor:
    """g = amax(|x|) / 2688 evaluated in x's dtype (so bf16 input gives a bf16 value), as fp32."""
    return global_scale_from_amax(torch.amax(x.abs()))


def global_scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """The same g from an amax already computed (in the activation's dtype, e.g. the amax
    kernel's output): the division happens in that dtype, then fp32."""
    return (amax / (F8_E4M3_MAX * F4_E2M1_MAX)).to(torch.float32)


# --- swizzle --------------------------------------------------------------------------------
def swizzle_offset(r, c, n_scale_cols: int):
    """Byte offset of scale (row r, block column c) in the 128x4 swizzle (Cb = ceil(cols/4))."""
    cb = -(-n_scale_cols // 4)
    return ((((r // 128) * cb + c // 4) * 32 + r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4)


def to_blocked(s: torch.Tensor) -> torch.Tensor:
    """Row-major scales [R, C] -> swizzled buffer [roundup(R,128), roundup(C,4)], zero padded."""
    R, C = s.shape
    Rp, Cp = _roundup(R, 128), _roundup(C, 4)
    flat = torch.zeros(Rp * Cp, dtype=s.dtype, device=s.device)
    r = torch.arange(R, device=s.device).view(-1, 1).expand(R, C)
    c = torch.arange(C, device=s.device).view(1, -1).expand(R, C)
    flat[swizzle_offset(r, c, C).reshape(-1)] = s.reshape(-1)
    return flat.view(Rp, Cp)


def from_blocked(buf: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`to_blocked`: the [rows, cols] row-major scales."""
    flat = buf.reshape(-1)
    r = torch.arange(rows, device=buf.device).view(-1, 1).expand(rows, cols)
    c = torch.arange(cols, device=buf.device).view(1, -1).expand(rows, cols)
    return flat[swizzle_offset(r, c, cols).reshape(-1)].view(rows, cols)


# --- packing --------------------------------------------------------------------------------
def pack_codes(codes: torch.Tensor, hi_first: bool = True) -> torch.Tensor:
    """[..., K] uint8 codes (0..15) -> [..., K/2] bytes."""
    even, odd = codes[..., 0::2].to(torch.uint8), codes[..., 1::2].to(torch.uint8)
    return (even << 4) | odd if hi_first else (odd << 4) | even


def unpack_codes(packed: torch.Tensor, hi_first: bool = True) -> torch.Tensor:
    hi, lo = packed >> 4, packed & 0xF
    first, second = (hi, lo) if hi_first else (lo, hi)
    return torch.stack([first, second], dim=-1).reshape(*packed.shape[:-1], -1)


def swap_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Convert between hi-first (Comfy) and lo-first (PyTorch float4_e2m1fn_x2, cuBLAS) order."""
    return (packed << 4) | (packed >> 4)


# --- quantize -------------------------------------------------------------------------------
def _check_input(x: torch.Tensor, pad_16x: bool, mode: str):
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K]; got shape {tuple(x.shape)}")
    allowed = (torch.bfloat16, torch.float16) + ((torch.float32,) if mode == "eager" else ())
    if x.dtype not in allowed:
        raise TypeError(f"x has dtype {x.dtype}; mode={mode!r} takes {allowed}")
    M, K = x.shape
    if not pad_16x and (M % BLOCK or K % BLOCK):
        raise ValueError(f"shape {tuple(x.shape)}: M and K must be multiples of 16 "
                         "(or pass pad_16x=True)")


def _padded(x: torch.Tensor, pad_16x: bool) -> torch.Tensor:
    M, K = x.shape
    if not pad_16x:
        return x
    Mp, Kp = _roundup(M, BLOCK), _roundup(K, BLOCK)
    if (Mp, Kp) == (M, K):
        return x
    out = torch.zeros(Mp, Kp, dtype=x.dtype, device=x.device)
    out[:M, :K] = x
    return out


def _as_g(g, device) -> torch.Tensor:
    return torch.as_tensor(g, dtype=torch.float32, device=device).reshape(())


def block_scales_cuda(xb: torch.Tensor, g: torch.Tensor):
    """Per-block (scale code, scale value) of the CUDA kernel for blocks xb [..., 16]."""
    ax = xb.abs().to(torch.float32)
    nan = torch.isnan(ax)
    amax = torch.where(nan, torch.full_like(ax, -1.0), ax).amax(dim=-1)
    amax = torch.where(amax < 0, torch.full_like(amax, float("nan")), amax)  # all 16 NaN
    d = fmul_ftz(fmul_ftz(amax, RN_ONE_SIXTH), rcp_approx(g))
    d = torch.fmin(d, torch.tensor(F8_E4M3_MAX, device=d.device))  # fminf: NaN -> 448
    s8 = e4m3_encode(d)
    return s8, e4m3_decode(s8)


def quantize(x: torch.Tensor, g, *, hi_first: bool = True, pad_16x: bool = False,
             mode: str = "cuda"):
    """x [M, K] -> (packed uint8 [Mp, Kp/2], float8_e4m3fn scales [roundup(Mp,128),
    roundup(Kp/16,4)] swizzled and zero padded). Mp, Kp are 16-padded with ``pad_16x``."""
    _check_input(x, pad_16x, mode)
    xp = _padded(x, pad_16x)
    Mp, Kp = xp.shape
    g = _as_g(g, x.device)
    xb = xp.view(Mp, Kp // BLOCK, BLOCK)
    if mode == "cuda":
        s8, sf = block_scales_cuda(xb, g)
        enc = torch.fmin(rcp_approx(fmul_ftz(g, sf)), torch.tensor(FLT_MAX, device=x.device))
        v = fmul_ftz(xb.to(torch.float32), enc.unsqueeze(-1))
    else:
        max_abs = torch.amax(xb.abs(), dim=-1)  # input dtype, NaN propagates
        bs = max_abs.to(torch.float32) * RN_ONE_SIXTH  # torch on CUDA: x / 6.0 == x * RN(1/6)
        s = torch.clamp(bs / g, max=F8_E4M3_MAX)
        s8 = s.to(torch.float8_e4m3fn).view(torch.uint8)
        tot = (g * e4m3_decode(s8)).unsqueeze(-1)
        v = torch.where(tot == 0, torch.zeros_like(tot), xb.to(torch.float32) / tot)
        v = torch.clamp(v, -F4_E2M1_MAX, F4_E2M1_MAX)
    codes = e2m1_encode(v).view(Mp, Kp)
    packed = pack_codes(codes, hi_first)
    scales = to_blocked(s8.view(torch.uint8)).view(torch.float8_e4m3fn)
    return packed, scales


# --- dequantize -----------------------------------------------------------------------------
def dequantize(packed: torch.Tensor, scales: torch.Tensor, g, shape, dtype=torch.bfloat16, *,
               hi_first: bool = True, mode: str = "cuda") -> torch.Tensor:
    """Inverse map to ``dtype``; ``shape`` = (M, K) crops any 16-padding.

    cuda: ``RN_dtype(e2m1 · fmul_ftz(s, g))``, one rounding. eager: all-``dtype`` arithmetic
    ``lut[code] · (g · s)``, which rounds twice.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    M, K = shape
    Mp, Kp = packed.shape[0], packed.shape[1] * 2
    codes = unpack_codes(packed, hi_first)
    s8 = from_blocked(scales.view(torch.uint8), Mp, Kp // BLOCK)
    sv = e4m3_decode(s8).repeat_interleave(BLOCK, dim=1)
    g = _as_g(g, packed.device)
    if mode == "cuda":
        p = fmul_ftz(sv, g).to(torch.float64)
        exact = e2m1_decode(codes, torch.float64) * p
        out = round_to_format(exact, FORMATS[dtype]).to(dtype)
    else:
        out = e2m1_decode(codes, dtype) * (g.to(dtype) * sv.to(dtype))
    return out[:M, :K]


def dequantize_operand(packed, scales, shape) -> torch.Tensor:
    """Operand values e2m1·s WITHOUT g, exact in bf16 (what a Hopper GEMM feeds wgmma)."""
    M, K = shape
    Mp, Kp = packed.shape[0], packed.shape[1] * 2
    codes = unpack_codes(packed)
    s8 = from_blocked(scales.view(torch.uint8), Mp, Kp // BLOCK)
    sv = e4m3_decode(s8).repeat_interleave(BLOCK, dim=1)
    out = e2m1_decode(codes, torch.float32) * sv  # every product is exact in bf16 (spec §4.3)
    return round_to_format(out, BF16).to(torch.bfloat16)[:M, :K]
