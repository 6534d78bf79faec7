"""Rung 2 for the P1 phase: randomized GEMMs that quantize their activation inside, bit for bit
against P0 (GPU).

P1 changes only who quantizes the activation and where (kernels/nvfp4/gemm_p1.py); its contract
is that the output equals P0's on the quantize kernel's output with the same tensor scale, on
the production swap-AB build at the same K split (the f16 build on the activation's expansion:
the same wgmmas on the same values as the packed swap-AB build P1 was first measured against). Per case: a fresh bf16 activation (normal,
heavy-tailed channels, or rows of zeros and tiny values), ragged M, N and K (a partial k-block
and K/16 not a multiple of 4 among them), the split P1's chooser gives; the output poisoned with
NaN before P1 runs, then run again (two runs equal). P0's own exactness against the oracle is
part 2b's; Comfy's bits for every tile P1 quantizes are tests/test_p1.py's debug build's.
"""
from __future__ import annotations

import zlib

import torch

from kernels.nvfp4.gemm import gemm_nvfp4
from kernels.nvfp4.gemm_p1 import choose_config, gemm_nvfp4_p1
from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90
from kernels.nvfp4.prepack import prepack
from kernels.nvfp4.quantize import quantize_expand_nvfp4
from validators.base import RungResult, check
from validators.rung2_p2_ring import KINDS, case_operands

NAME = "randomized P1 GEMMs"
# (M, N, K): partial k-blocks, K/16 not a multiple of 4, and K splits (128 x 512 x 2048: 2;
# 256 x 1024 x 5376: 4 on 132 SMs) beside one-split shapes
SHAPES = [(200, 64, 96), (128, 512, 2048), (333, 144, 160), (700, 272, 1056),
          (256, 1024, 5376), (1500, 1024, 2080), (2100, 528, 5376)]


def run(quick: bool = False, seed: int = 0) -> RungResult:
    if not torch.cuda.is_available():
        return RungResult(2, NAME, "not-run", "needs a CUDA GPU")
    checks, elements = {}, 0
    for (M, N, K) in (SHAPES[:3] if quick else SHAPES):
        config, _ = choose_config(M, N, K)
        p0_config = BlockscaledGemmSm90.swap_ab_f16(splits=config.splits)
        for kind in KINDS:
            s = zlib.crc32(f"p1:{M}x{N}x{K}:{kind}:{seed}".encode())
            x, w_q, w_s, g_w, g = case_operands(kind, M, N, K, s)
            pre = prepack(w_q, w_s)
            q, sc, a16 = quantize_expand_nvfp4(x, g, pad_16x=True)
            want = gemm_nvfp4(q, sc, g, w_q, w_s, g_w, rows=(0, M), config=p0_config,
                              prepacked=pre, a16=a16)
            out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
            gemm_nvfp4_p1(x, g, pre, g_w, out=out, config=config)
            again = gemm_nvfp4_p1(x, g, pre, g_w, config=config)
            rows_bad = (out.view(torch.int16) != want.view(torch.int16)).any(dim=1)
            rerun = torch.equal(again.view(torch.int16), out.view(torch.int16))
            n_bad = int(rows_bad.sum())
            checks[f"{M}x{N}x{K}:s{config.splits}:{kind}"] = check(
                n_bad == 0 and rerun,
                "every row equal to P0's, rerun equal" if n_bad == 0 and rerun else
                f"{n_bad} of {M} rows differ from P0's"
                + (f" (first: row {int(rows_bad.nonzero()[0])})" if n_bad else "")
                + ("" if rerun else "; a rerun differs"))
            elements += M * N
    return RungResult.from_checks(2, NAME, checks, elements)
