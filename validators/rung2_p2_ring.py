"""Rung 2 for the P2 phase: randomized projections through the ring, bit for bit against P0 (GPU).

P2 changes only who writes the packed activation and when; its contract is that every output
is bit-identical to P0's whole call (kernels/nvfp4/ring.py). Per case: a fresh bf16 activation
(normal, heavy-tailed channels, or rows of zeros and tiny values), ragged M, N and K, ring
capacities of one and several 128-row tiles (a partial last chunk in every case), rows from
r0 = 0 or 128; the output poisoned with NaN before the ring runs; the f16 build Nvfp4Linear's
p2 runs (the ring holding each chunk's f16 expansion; no stream-K across chunks). A case passes
when every chunk's rows equal P0's (quantize and expand the whole x, gemm_nvfp4 with the whole
call's config and a16).
P0's own exactness against the oracle is part 2b's.
"""
from __future__ import annotations

import zlib

import torch

from kernels.nvfp4.amax import amax
from kernels.nvfp4.gemm import default_config, gemm_nvfp4
from kernels.nvfp4.prepack import prepack
from kernels.nvfp4.quantize import quantize_expand_nvfp4, quantize_nvfp4
from kernels.nvfp4.ring import ring_gemm
from numerics import nvfp4
from schedules.p2_ring import chunk_plan
from validators.base import RungResult, check

NAME = "randomized ring chunks (P2)"
KINDS = ("normal", "heavy", "sparse")
# (M, N, K, capacity, r0): partial last chunks throughout, K/16 not a multiple of 4 in one
SHAPES = [(200, 64, 96, 128, 0), (333, 144, 160, 128, 128), (700, 272, 1056, 256, 0),
          (1500, 1024, 2080, 512, 128), (2100, 528, 5376, 1024, 0)]


def _activation(kind: str, M: int, K: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(M, K, generator=gen)
    if kind == "heavy":  # a few channels far above the rest, as H3's
        x = x * torch.exp(1.5 * torch.randn(K, generator=gen))
    elif kind == "sparse":  # zero rows and blocks, tiny values beside large ones
        x[torch.rand(M, generator=gen) < 0.2] = 0
        x = x * torch.where(torch.rand(M, K, generator=gen) < 0.1, 1e-6, 1.0)
    return x.to(torch.bfloat16).cuda()


def case_operands(kind: str, M: int, N: int, K: int, s: int):
    """(x, w_q, w_s, g_w, g) of one randomized case: a ``kind`` activation [M, K] and a normal
    weight [N, K] from seed ``s``, the weight quantized (16-padded) with its tensor scale, and
    the activation's tensor scale, both from the amax kernel."""
    x = _activation(kind, M, K, s)
    w = _activation("normal", N, K, s + 1)
    g_w = nvfp4.global_scale_from_amax(amax(w)).reshape(1)
    w_q, w_s = quantize_nvfp4(w, g_w, pad_16x=True)
    return x, w_q, w_s, g_w, nvfp4.global_scale_from_amax(amax(x)).reshape(1)


def run(quick: bool = False, seed: int = 0) -> RungResult:
    if not torch.cuda.is_available():
        return RungResult(2, NAME, "not-run", "needs a CUDA GPU")
    checks, elements = {}, 0
    for (M, N, K, cap, r0) in (SHAPES[:3] if quick else SHAPES):
        for kind in KINDS:
            s = zlib.crc32(f"p2:{M}x{N}x{K}:{cap}:{kind}:{seed}".encode())
            x, w_q, w_s, g_w, g = case_operands(kind, M, N, K, s)
            several = len(chunk_plan(r0, M, cap)) > 1
            config = default_config(M - r0, N, K, stream_k=not several)
            pre = prepack(w_q, w_s)
            q, sc, a16 = quantize_expand_nvfp4(x, g, pad_16x=True)
            want = gemm_nvfp4(q, sc, g, w_q, w_s, g_w, rows=(r0, M), config=config,
                              prepacked=pre, a16=a16)
            out = torch.full((M - r0, N), float("nan"), dtype=torch.bfloat16, device="cuda")
            ring_gemm(x, g, w_q, w_s, g_w, rows=(r0, M), capacity=cap, config=config,
                      prepacked=pre, out=out)
            bad = [c for c in chunk_plan(r0, M, cap) if not torch.equal(
                out[c.start - r0:c.stop - r0].view(torch.int16),
                want[c.start - r0:c.stop - r0].view(torch.int16))]
            chunks = len(chunk_plan(r0, M, cap))
            checks[f"{M}x{N}x{K}:c{cap}:r{r0}:{kind}:f16"] = check(
                not bad, f"{chunks} chunks equal to P0's whole call" if not bad else
                f"{len(bad)} of {chunks} chunks differ from P0's whole call (first: chunk "
                f"{bad[0].index}, rows [{bad[0].start}, {bad[0].stop}))")
            elements += (M - r0) * N
    return RungResult.from_checks(2, NAME, checks, elements)
