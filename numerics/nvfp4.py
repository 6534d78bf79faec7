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

import math
import numbers

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


# --- swizzle --------------------------------------------------------------------------------
# The cuBLAS 128x4 block-scale swizzle, the one definition every layer derives from (torch code
# calls the functions below; device code uses device.nvfp4.scale_swizzle_offset, built
# from these constants). A tile covers 128 rows x 4 block columns in 512 contiguous bytes, tiles
# row-tile-major; inside one, byte ((r % 32)·4 + (r % 128) // 32)·4 + c % 4: 32 lines of 16 bytes,
# line r % 32 holding rows r, r + 32, r + 64, r + 96 (4 bytes each).
SCALE_TILE_ROWS = 128
SCALE_TILE_COLS = 4
SCALE_TILE_BYTES = SCALE_TILE_ROWS * SCALE_TILE_COLS
# The register-order prepack of weights for the swap-AB register-A wgmma consumer
# (kernels/nvfp4/prepack.py has the layout): per 64-row slab and 64-wide k-block, 128 threads x
# 16 code bytes (4 k16 steps x 4 registers) and 32 thread quads x 8 scale bytes.
PREPACK_SLAB_ROWS = 64
PREPACK_STEPS = 4
PREPACK_THREADS = 128
PREPACK_GROUPS = PREPACK_THREADS // 4
SCALE_LINE_ROWS = 32  # rows r and r + 32·j share one 16-byte line
SCALE_LINE_BYTES = SCALE_TILE_BYTES // SCALE_LINE_ROWS


def scale_shape(rows: int, cols: int) -> tuple[int, int]:
    """Shape of the swizzled scale buffer for a [rows, cols] operand (cols = K elements)."""
    return _roundup(rows, SCALE_TILE_ROWS), _roundup(-(-cols // BLOCK), SCALE_TILE_COLS)


def swizzle_offset(r, c, n_scale_cols: int):
    """Byte offset of scale (row r, block column c) in the 128x4 swizzle of a buffer with
    ``n_scale_cols`` block columns (ints or integer tensors)."""
    tile = (r // SCALE_TILE_ROWS) * -(-n_scale_cols // SCALE_TILE_COLS) + c // SCALE_TILE_COLS
    line = r % SCALE_LINE_ROWS
    group = (r % SCALE_TILE_ROWS) // SCALE_LINE_ROWS
    return (tile * SCALE_TILE_BYTES + line * SCALE_LINE_BYTES + group * SCALE_TILE_COLS
            + c % SCALE_TILE_COLS)


def to_blocked(s: torch.Tensor) -> torch.Tensor:
    """Row-major scales [R, C] -> swizzled buffer [roundup(R,128), roundup(C,4)], zero padded."""
    R, C = s.shape
    Rp, Cp = _roundup(R, SCALE_TILE_ROWS), _roundup(C, SCALE_TILE_COLS)
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


# --- global scale ---------------------------------------------------------------------------
def global_scale(x: torch.Tensor) -> torch.Tensor:
    """g = amax(|x|) / 2688 evaluated in x's dtype (so bf16 input gives a bf16 value), as fp32."""
    return global_scale_from_amax(torch.amax(x.abs()))


def global_scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """The same g from an amax already computed (in the activation's dtype, e.g. the amax
    kernel's output): the division happens in that dtype, then fp32."""
    return (amax / (F8_E4M3_MAX * F4_E2M1_MAX)).to(torch.float32)


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


# --- input checks ---------------------------------------------------------------------------
DEVICES = ("cpu", "cuda")  # where the reference computes (a meta tensor has no values)


def _check_tensor(name: str, t, dtypes) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}; expected one of {dtypes}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D; got shape {tuple(t.shape)}")
    if t.device.type not in DEVICES:
        raise ValueError(f"{name} is on {t.device}; the reference computes on {DEVICES}")
    if t.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)})")


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def _check_flags(**flags) -> None:
    for name, v in flags.items():
        if not isinstance(v, bool):
            raise TypeError(f"{name} must be True or False, got {v!r}")


def _check_input(x: torch.Tensor, pad_16x: bool, mode: str):
    _check_mode(mode)
    allowed = (torch.bfloat16, torch.float16) + ((torch.float32,) if mode == "eager" else ())
    _check_tensor("x", x, allowed)
    M, K = x.shape
    if not pad_16x and (M % BLOCK or K % BLOCK):
        raise ValueError(f"x has shape {tuple(x.shape)}: M and K must be multiples of 16 "
                         "(or pass pad_16x=True)")


def _as_g(g, device, nonfinite_g: bool = False) -> torch.Tensor:
    """g as a 0-d fp32 tensor on ``device``, after refusing what cannot be a tensor scale: a
    value that is not one real number, a negative one (-0.0 included: amax / 2688 is >= +0) and,
    unless ``nonfinite_g``, NaN or ±inf once rounded to fp32. Reads the value (a CUDA g syncs)."""
    if isinstance(g, torch.Tensor):
        if not g.is_floating_point():
            raise TypeError(f"g has dtype {g.dtype}; expected a floating dtype (fp32)")
        if g.numel() != 1:
            raise ValueError(f"g must hold one value; it has shape {tuple(g.shape)}")
        if g.device.type not in DEVICES:
            raise ValueError(f"g is on {g.device}; the reference reads it on {DEVICES}")
    elif isinstance(g, bool) or not isinstance(g, numbers.Real):
        raise TypeError(f"g must be a real number or a one-element tensor, got {type(g).__name__}")
    t = torch.as_tensor(g, dtype=torch.float32).to(device).reshape(())
    v = float(t)
    if not nonfinite_g and not math.isfinite(v):
        raise ValueError(f"g = {v} in fp32; expected a finite tensor scale (pass "
                         "nonfinite_g=True to model what the CUDA kernel does with it)")
    if v < 0 or (v == 0 and math.copysign(1.0, v) < 0):
        raise ValueError(f"g = {v}; a tensor scale is >= +0 (amax / 2688)")
    return t


# --- quantize -------------------------------------------------------------------------------
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
             mode: str = "cuda", nonfinite_g: bool = False):
    """x [M, K] -> (packed uint8 [Mp, Kp/2], float8_e4m3fn scales [roundup(Mp,128),
    roundup(Kp/16,4)] swizzled and zero padded). Mp, Kp are 16-padded with ``pad_16x``.

    ``g``: the fp32 tensor scale (a number or a one-element tensor), >= +0 and finite;
    ``nonfinite_g`` also takes NaN and +inf, as the CUDA kernel does with a device g it cannot
    refuse (ladder rung 1 pins what it then writes).

    Raises (before any work): TypeError for x not a bf16/fp16 tensor (fp32 too in eager mode),
    g not a real number / floating tensor, or a flag (hi_first, pad_16x, nonfinite_g) not a
    bool; ValueError for a bad mode, x not 2-D, empty or off CPU/CUDA, M or K not multiples of
    16 without ``pad_16x``, g not one value, negative (-0.0 too) or, without ``nonfinite_g``,
    not finite.
    """
    _check_flags(hi_first=hi_first, pad_16x=pad_16x, nonfinite_g=nonfinite_g)
    _check_input(x, pad_16x, mode)
    g = _as_g(g, x.device, nonfinite_g)
    xp = _padded(x, pad_16x)
    Mp, Kp = xp.shape
    xb = xp.reshape(Mp, Kp // BLOCK, BLOCK)  # a strided x (a view) is copied, not refused
    if mode == "cuda":
        s8, sf = block_scales_cuda(xb, g)
        enc = torch.fmin(rcp_approx(fmul_ftz(g, sf)), torch.tensor(FLT_MAX, device=x.device))
        v = fmul_ftz(xb.to(torch.float32), enc.unsqueeze(-1))
    else:
        max_abs = torch.amax(xb.abs(), dim=-1)  # input dtype, NaN propagates
        bs = max_abs.to(torch.float32) * RN_ONE_SIXTH  # torch on CUDA: x / 6.0 == x * RN(1/6)
        s = torch.clamp(bs / g, max=F8_E4M3_MAX)
        s8 = s.to(torch.float8_e4m3fn).view(torch.uint8)
        # g = 0: a zero block's 0/0 is a NaN whose sign depends on the CPU code path (x86's
        # default NaN is negative, a strided copy may take another path); CUDA's is +NaN (0x7F)
        s8 = torch.where(s8 == 0xFF, torch.full_like(s8, 0x7F), s8)
        tot = (g * e4m3_decode(s8)).unsqueeze(-1)
        v = torch.where(tot == 0, torch.zeros_like(tot), xb.to(torch.float32) / tot)
        v = torch.clamp(v, -F4_E2M1_MAX, F4_E2M1_MAX)
    codes = e2m1_encode(v).view(Mp, Kp)
    packed = pack_codes(codes, hi_first)
    scales = to_blocked(s8.view(torch.uint8)).view(torch.float8_e4m3fn)
    return packed, scales


# --- dequantize -----------------------------------------------------------------------------
def _check_packed(packed, scales, shape) -> tuple[int, int]:
    """The checks dequantize and dequantize_operand share; returns (M, K)."""
    _check_tensor("packed", packed, (torch.uint8,))
    Mp, Kp = packed.shape[0], packed.shape[1] * 2
    if Kp % BLOCK:
        raise ValueError(f"packed has {Kp // 2} bytes a row: K = {Kp} must be a multiple of 16")
    _check_tensor("scales", scales, (torch.float8_e4m3fn, torch.uint8))
    if scales.device != packed.device:
        raise ValueError(f"scales is on {scales.device}, packed on {packed.device}")
    if tuple(scales.shape) != scale_shape(Mp, Kp):
        raise ValueError(f"scales has shape {tuple(scales.shape)}; packed [{Mp}, {Kp // 2}] "
                         f"needs the swizzled shape {scale_shape(Mp, Kp)}")
    if (not isinstance(shape, (tuple, list, torch.Size)) or len(shape) != 2
            or not all(isinstance(n, numbers.Integral) and not isinstance(n, bool)
                       for n in shape)):
        raise TypeError(f"shape must be a pair of ints (M, K), got {shape!r}")
    M, K = int(shape[0]), int(shape[1])
    if not (0 < M <= Mp and _roundup(M, BLOCK) >= Mp and 0 < K <= Kp
            and _roundup(K, BLOCK) >= Kp):
        raise ValueError(f"shape {tuple(shape)} must be the data's [{Mp}, {Kp}] less at most "
                         "its 16-padding (0 < M <= Mp <= roundup(M, 16), the same for K)")
    return M, K


def _codes_and_scale_values(packed, scales, hi_first: bool = True):
    """[Mp, Kp] E2M1 codes and each element's decoded fp32 block scale."""
    Mp, Kp = packed.shape[0], packed.shape[1] * 2
    codes = unpack_codes(packed, hi_first)
    s8 = from_blocked(scales.view(torch.uint8), Mp, Kp // BLOCK)
    return codes, e4m3_decode(s8).repeat_interleave(BLOCK, dim=1)


def dequantize(packed: torch.Tensor, scales: torch.Tensor, g, shape, dtype=torch.bfloat16, *,
               hi_first: bool = True, mode: str = "cuda",
               nonfinite_g: bool = False) -> torch.Tensor:
    """Inverse map to ``dtype`` (bf16, fp16 or fp32); ``shape`` = (M, K) crops any 16-padding.

    cuda: ``RN_dtype(e2m1 · fmul_ftz(s, g))``, one rounding. eager: all-``dtype`` arithmetic
    ``lut[code] · (g · s)``, which rounds twice. ``g`` as :func:`quantize` takes it.

    Raises (before any work): TypeError for packed not uint8, scales not float8_e4m3fn/uint8,
    dtype not bf16/fp16/fp32, shape not two ints, g not a real number / floating tensor, or a
    flag (hi_first, nonfinite_g) not a bool; ValueError for a bad mode, packed or scales not
    2-D, empty or off CPU/CUDA (or on two devices), K not a multiple of 16, scales not exactly
    the swizzled shape, shape beyond the data or cropping more than its 16-padding, and g as
    :func:`quantize` refuses it.
    """
    _check_flags(hi_first=hi_first, nonfinite_g=nonfinite_g)
    _check_mode(mode)
    M, K = _check_packed(packed, scales, shape)
    if dtype not in FORMATS:
        raise TypeError(f"dtype {dtype!r}: expected one of {tuple(FORMATS)}")
    g = _as_g(g, packed.device, nonfinite_g)
    codes, sv = _codes_and_scale_values(packed, scales, hi_first)
    if mode == "cuda":
        p = fmul_ftz(sv, g).to(torch.float64)
        exact = e2m1_decode(codes, torch.float64) * p
        out = round_to_format(exact, FORMATS[dtype]).to(dtype)
    else:
        out = e2m1_decode(codes, dtype) * (g.to(dtype) * sv.to(dtype))
    return out[:M, :K]


def dequantize_operand(packed, scales, shape) -> torch.Tensor:
    """Operand values e2m1·s WITHOUT g, exact in bf16 (what a Hopper GEMM feeds wgmma).
    Raises as :func:`dequantize` does for packed, scales and shape."""
    M, K = _check_packed(packed, scales, shape)
    codes, sv = _codes_and_scale_values(packed, scales)
    out = e2m1_decode(codes, torch.float32) * sv  # every product is exact in bf16 (spec §4.3)
    return round_to_format(out, BF16).to(torch.bfloat16)[:M, :K]
