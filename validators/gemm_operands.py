"""Prepacked NVFP4 GEMM operands for P0-P4 checks: (codes uint8 [rows, K/2], scales [Rp, Cp], g).

Kinds:
* ``normal`` / ``lognormal``: bf16 activations or weights (randn; per-block log-normal magnitudes)
  quantized by the reference quantizer, as a real linear layer sees them;
* ``raw``: every code 0..15 and every finite E4M3 scale byte 0x00..0x7E drawn uniformly — the
  whole operand space, subnormal scales and 448·6 extremes included;
* ``cancel``: raw magnitudes whose signs alternate in pairs of blocks, so long sums cancel and the
  accumulated rounding error is largest relative to the result.
Scale padding (rows past the operand, columns past K/16) is filled with random finite bytes, not
zeros, so a kernel that reads padding shows up as a wrong answer.
"""
from __future__ import annotations

import torch

from numerics import nvfp4

KINDS = ("normal", "lognormal", "raw", "cancel")


def make_operand(kind: str, rows: int, K: int, seed: int, device="cuda"):
    if kind not in KINDS:
        raise ValueError(f"unknown operand kind {kind!r}; choose from {KINDS}")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    Rp, Cp = nvfp4.scale_shape(rows, K)
    if kind in ("normal", "lognormal"):
        x = torch.randn(rows, K, generator=gen)
        if kind == "lognormal":
            x = (x.view(rows, K // 16, 16)
                 * torch.exp(3.0 * torch.randn(rows, K // 16, 1, generator=gen))).view(rows, K)
        x = x.to(torch.bfloat16).to(device)
        g = nvfp4.global_scale(x)
        q, s = nvfp4.quantize(x, g, pad_16x=True)
        q = q[:rows].contiguous()
        s8 = s.view(torch.uint8)
        pad = torch.randint(0, 0x7F, s8.shape, generator=gen, dtype=torch.uint8).to(device)
        logical = nvfp4.to_blocked(torch.ones(rows, K // 16, dtype=torch.uint8, device=device))
        s8 = torch.where(logical.view(Rp, Cp).bool(), s8, pad)
        return q.to(device), s8.view(torch.float8_e4m3fn), float(g)
    codes = torch.randint(0, 16, (rows, K), generator=gen, dtype=torch.uint8)
    scales = torch.randint(0, 0x7F, (Rp, Cp), generator=gen, dtype=torch.uint8)
    if kind == "cancel":
        codes &= 0x7
        sign = ((torch.arange(K) // 32) % 2).to(torch.uint8) << 3
        codes |= sign.view(1, K)
        scales = torch.randint(0x70, 0x7F, (Rp, Cp), generator=gen, dtype=torch.uint8)
    q = nvfp4.pack_codes(codes)
    s = nvfp4.to_blocked(scales).view(Rp, Cp)
    g = float(torch.exp2(torch.randint(-12, 4, (1,), generator=gen).float()) * 1.25)
    return q.to(device), s.to(device).view(torch.float8_e4m3fn), g
