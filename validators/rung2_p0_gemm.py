"""Rung 2 for the P0 phase: randomized block-scaled GEMMs against the exact oracle (GPU).

Fresh operands for every case (all four operand kinds, ragged M, N, K), each output poisoned with
NaN before the launch. The production call (the weight's prepack and the activation's f16
expansion given, as models.nvfp4_linear.Nvfp4Linear passes them); a case passes when every
element lies within the oracle's proven fp32-accumulation bound and the convenience call (both
made per call) gives the same bits.
"""
from __future__ import annotations

import zlib

import torch

from kernels.nvfp4.gemm import gemm_nvfp4
from kernels.nvfp4.prepack import prepack
from kernels.nvfp4.quantize import expand_nvfp4
from numerics import gemm_oracle as G
from validators.base import RungResult, check
from validators.gemm_operands import KINDS, make_operand

SHAPES = [(1, 8, 32), (97, 136, 160), (129, 264, 96), (300, 520, 1056), (640, 384, 2080)]


def run(quick: bool = False, seed: int = 0) -> RungResult:
    if not torch.cuda.is_available():
        return RungResult(2, "randomized GEMMs (P0)", "not-run", "needs a CUDA GPU")
    checks, elements = {}, 0
    shapes = SHAPES[:3] if quick else SHAPES
    for (M, N, K) in shapes:
        for kind in KINDS:
            s = zlib.crc32(f"p0:{M}x{N}x{K}:{kind}:{seed}".encode())
            qa, sa, ga = make_operand(kind, M, K, s, "cuda")
            qb, sb, gb = make_operand(kind, N, K, s + 1, "cuda")
            out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
            gemm_nvfp4(qa, sa, ga, qb, sb, gb, out=out, prepacked=prepack(qb, sb),
                       a16=expand_nvfp4(qa, sa))
            again = gemm_nvfp4(qa, sa, ga, qb, sb, gb)  # the convenience: both made per call
            d, real, bound = G.reference_gemm(qa, sa, qb, sb, ga, gb, M, N, K)
            bad = int((~((out.double() - real).abs() <= bound)).sum())
            same = torch.equal(out.view(torch.int16), again.view(torch.int16))
            exact = float((out.double() == d.double()).float().mean())
            checks[f"{M}x{N}x{K}:{kind}"] = check(
                bad == 0 and same, f"{bad} outside the fp32 bound, the convenience call identical: {same}, "
                f"{exact:.5f} equal to the correctly rounded result")
            elements += M * N
    return RungResult.from_checks(2, "randomized GEMMs (P0)", checks, elements)
