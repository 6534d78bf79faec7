"""The H200's ``rcp.approx.ftz.f32`` (SASS ``MUFU.RCP``), bit for bit, from a measured table.

For a normal input x = ±(1 + m·2^-23)·2^e the hardware returns
``bits(RN(1/x)) + plus[m] - minus[m]``: a ±1 ulp correction that depends only on the mantissa.
The table (numerics/data/rcp-approx-ftz-f32-sm90.bin.xz, two packed bit arrays of 2^23 bits)
was measured on an H200; ``kernels/nvfp4/rcp_probe.py`` regenerates it on a GPU and a gpu test checks
the shipped copy against the hardware. FTZ: a denormal input acts as ±0 (result ±inf) and a
denormal result flushes to ±0; 1/±inf = ±0; NaN stays NaN. Not assumed for other architectures.
"""
from __future__ import annotations

import functools
import hashlib
import lzma
from pathlib import Path

import numpy as np
import torch

TABLE_PATH = Path(__file__).resolve().parent / "data" / "rcp-approx-ftz-f32-sm90.bin.xz"
TABLE_SHA256 = "5803d3092e2eb131229af304937f41ad77ae43a114d97d5dd1c890f5b10eba26"
N_MANTISSAS = 1 << 23


def decode_table(blob_xz: bytes) -> np.ndarray:
    """xz(plus_bits ‖ minus_bits) -> int8 correction per mantissa (+1, 0, -1)."""
    raw = np.frombuffer(lzma.decompress(blob_xz), dtype=np.uint8)
    bits = np.unpackbits(raw)  # big-endian bit order within each byte
    plus, minus = bits[:N_MANTISSAS], bits[N_MANTISSAS:2 * N_MANTISSAS]
    return plus.astype(np.int8) - minus.astype(np.int8)


def encode_table(correction: np.ndarray) -> bytes:
    """Inverse of :func:`decode_table` (used by the GPU probe to write a regenerated table)."""
    plus = (correction > 0).astype(np.uint8)
    minus = (correction < 0).astype(np.uint8)
    return lzma.compress(np.packbits(np.concatenate([plus, minus])).tobytes())


@functools.lru_cache(maxsize=None)
def _correction_cpu() -> torch.Tensor:
    blob = TABLE_PATH.read_bytes()
    if hashlib.sha256(blob).hexdigest() != TABLE_SHA256:
        raise RuntimeError(f"{TABLE_PATH} does not have the expected sha256 {TABLE_SHA256[:12]}…")
    return torch.from_numpy(decode_table(blob).astype(np.int32))


@functools.lru_cache(maxsize=None)
def _correction(device: str) -> torch.Tensor:
    return _correction_cpu().to(device)


def correction_table() -> torch.Tensor:
    """int32 [2^23]: +1 / 0 / -1 ulp relative to the correctly rounded reciprocal."""
    return _correction_cpu()


def rcp_approx(x) -> torch.Tensor:
    """``rcp.approx.ftz.f32`` of fp32 ``x`` exactly as the H200 computes it (CPU or CUDA)."""
    x = torch.as_tensor(x, dtype=torch.float32)
    tiny = x.abs() < 2.0**-126  # zeros and denormals (FTZ inputs act as ±0)
    xs = torch.where(tiny, torch.ones_like(x), x)
    r = 1.0 / xs  # IEEE RN division in fp32 on CPU and CUDA
    bits = r.view(torch.int32)
    m = xs.view(torch.int32) & 0x7FFFFF
    corr = _correction(str(x.device))[m.long()]
    finite = torch.isfinite(xs) & (r.abs() >= 2.0**-126)
    out = torch.where(finite, (bits + corr).view(torch.float32), r)
    out = torch.where(finite | torch.isnan(xs) | torch.isinf(xs), out, r * 0.0)  # FTZ result
    inf = torch.copysign(torch.full_like(x, float("inf")), x)
    return torch.where(tiny, inf, out)
