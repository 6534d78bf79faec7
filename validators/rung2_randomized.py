"""Rung 2: randomized packed tiles, every byte compared.

On any machine: :func:`numerics.nvfp4.quantize` against the independent scalar transcription
(:mod:`numerics.scalar_spec`) on random tiles of every kind. With a GPU: the same reference on
CUDA against CPU, and every CuTe DSL quantize kernel passed in against the reference.
"""
from __future__ import annotations

import torch

from numerics import nvfp4, scalar_spec
from validators.base import RungResult, check, mismatch_detail
from validators.rung1_adversarial import _scalar_quantize
from validators.tiles import KINDS, make_tile, tensor_scale_for

NAME = "randomized"


def compare_to_scalar(kind: str, rows: int, cols: int, dtype, seed: int) -> tuple[int, int]:
    """(packed+scale bytes differing, bytes compared) between reference and scalar spec."""
    x = make_tile(kind, rows, cols, dtype, seed)
    g = tensor_scale_for(x)
    q, s = nvfp4.quantize(x, g)
    want_q = _scalar_quantize(x, g)
    blocks = x.float().view(-1, 16).tolist()
    want_s = torch.tensor([scalar_spec.quantize_block(b, g)[0] for b in blocks],
                          dtype=torch.uint8).view(rows, cols // 16)
    got_s = nvfp4.from_blocked(s.view(torch.uint8), rows, cols // 16)
    bad = int((q != want_q).sum()) + int((got_s != want_s).sum())
    return bad, q.numel() + want_s.numel()


def compare_devices(kind, rows, cols, dtype, seed, kernel=None) -> dict:
    """Reference on CUDA vs CPU, and an optional kernel(x, g) -> (q, s) vs the reference."""
    x = make_tile(kind, rows, cols, dtype, seed)
    g = tensor_scale_for(x)
    q_cpu, s_cpu = nvfp4.quantize(x, g)
    q_gpu, s_gpu = nvfp4.quantize(x.cuda(), g)
    out = {f"cuda-vs-cpu:{kind}": check(torch.equal(q_cpu, q_gpu.cpu()) and torch.equal(
        s_cpu.view(torch.uint8), s_gpu.cpu().view(torch.uint8)),
        mismatch_detail(q_gpu.cpu(), q_cpu, "packed"))}
    if kernel is not None:
        qk, sk = kernel(x.cuda(), torch.tensor([g], device="cuda"))
        out[f"kernel-vs-ref:{kind}"] = check(
            torch.equal(qk.cpu(), q_cpu) and torch.equal(sk.cpu().view(torch.uint8),
                                                         s_cpu.view(torch.uint8)),
            mismatch_detail(qk.cpu(), q_cpu, "packed") + "; " +
            mismatch_detail(sk.cpu(), s_cpu, "scales"))
    return out


def run(quick: bool = False, device: str = "cpu", kernel=None) -> RungResult:
    checks = {}
    n_tiles = 2 if quick else 8
    elements = 0
    for kind in KINDS:
        bad = total = 0
        for i in range(n_tiles):
            dtype = torch.bfloat16 if i % 2 == 0 else torch.float16
            b, t = compare_to_scalar(kind, 32, 64, dtype, seed=1000 * i + len(kind))
            bad += b
            total += t
            elements += 32 * 64
        checks[f"ref-vs-scalar:{kind}"] = check(bad == 0, f"{bad} of {total} bytes differ")
    if device == "cuda":
        rows, cols = (256, 1024) if quick else (2048, 5376)
        for kind in KINDS:
            checks.update(compare_devices(kind, rows, cols, torch.bfloat16, seed=7, kernel=kernel))
            elements += rows * cols
    return RungResult.from_checks(2, NAME, checks, elements)
