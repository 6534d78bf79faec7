"""The exact epilogue's reference (P4): what H3 does with a projection's bf16 output.

    out = RN_bf16( fl32( fl32(residual) + fl32(gate · y) ) )

with ``y`` the projection's bf16 output, ``gate`` a per-output-channel bf16 vector and
``residual`` the bf16 residual stream: one fp32 multiply (rounded), one fp32 add (rounded), one
bf16 rounding, never an FMA. models.h3 calls this function for both of a block's gated residual
adds, and the P4 epilogue (epilogues/gate_residual.py, device/rounding.gate_residual_pair)
computes the same three roundings per element, so the two are bit-identical by construction and
by test.
"""
from __future__ import annotations

import torch


def gate_residual(y: torch.Tensor, gate: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """bf16 [M, N]: ``residual + gate * y`` in fp32, rounded once to bf16 (y, residual [M, N],
    gate [N], all bf16)."""
    for name, t in (("y", y), ("gate", gate), ("residual", residual)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16:
            raise TypeError(f"{name} must be a bf16 torch.Tensor, got "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
    if y.dim() != 2 or residual.shape != y.shape or gate.shape != (y.shape[1],):
        raise ValueError(f"shapes y {tuple(y.shape)}, gate {tuple(gate.shape)}, residual "
                         f"{tuple(residual.shape)}: need y and residual [M, N], gate [N]")
    # two torch ops, two roundings: torch never fuses an eager mul and add into an FMA
    return (residual.float() + gate.float() * y.float()).to(torch.bfloat16)
