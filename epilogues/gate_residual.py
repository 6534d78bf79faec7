"""P4, the exact epilogue: out = RN_bf16(residual + gate · RN_bf16(alpha · acc)).

H3 follows its attention-output and FC2 projections with a gated residual add (models.h3). This
rule fuses it into the GEMM's store in exactly the reference's order (numerics.epilogue
.gate_residual): the projection's own bf16 rounding first (the value an unfused P0 would write),
then an fp32 multiply by the column's gate, an fp32 add of the residual and one bf16 rounding,
each rounded separately (device.rounding.gate_residual_pair: ``mul.rn`` / ``add.rn``,
never contracted into an FMA). So the fused output is bit-identical to P0's output followed by the reference's two torch
ops, for any accumulation order, split-K included (tests/test_gemm_nvfp4.py).

Reads ``gate`` (bf16 [N]) and ``residual`` (bf16 [M, N], may be the output tensor itself: each
element is read and then written by the same thread).
"""
from __future__ import annotations

from dataclasses import dataclass

from device.rounding import bf16x2_rn, gate_residual_pair


@dataclass(frozen=True)
class GateResidualBf16:
    operands = ("gate", "residual")

    def pair(self, ops, row, pair, x0, x1):
        y = bf16x2_rn(x0 * ops.alpha, x1 * ops.alpha)
        return gate_residual_pair(y, ops.gate[pair], ops.residual[row, pair])
