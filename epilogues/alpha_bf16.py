"""Output rule D = RN_bf16(fl32(alpha · acc)), alpha = fl32(gA · gB): P0's plain projection.

It multiplies by ``alpha`` in fp32 (round to nearest, no flush to zero) and rounds each pair
with one ``cvt.rn.bf16x2.f32``: the single bf16 rounding the oracle assumes.
"""
from __future__ import annotations

from dataclasses import dataclass

from device.rounding import bf16x2_rn


@dataclass(frozen=True)
class AlphaBf16:
    operands = ()

    def pair(self, ops, row, pair, x0, x1):
        """The bf16 pair (columns 2·pair, 2·pair + 1 of ``row``) from two fp32 sums."""
        return bf16x2_rn(x0 * ops.alpha, x1 * ops.alpha)
