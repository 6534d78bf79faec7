"""Rung 4: complete block equality at the first, middle and last block, on the real block input.

Two kinds of check (the ladder's equality rule):
* every GEMM output of the backend under test, per element, within the oracle's proven bound of
  the exact result on the same input (rung 3's GemmAudit);
* the block output, where GEMM errors propagate through norms, attention, the next quantization
  and the residual stream, against the reference block by a derived tolerance: bit-identical, or
  a normwise relative deviation ||y - y_ref|| / ||y_ref|| <= SAFETY x that of a *legal
  adversary*, the reference with every GEMM output moved one bf16 step (random side) from the
  correctly rounded result wherever that step stays inside the proven bound. Any
  fp32-accumulating kernel may legally produce those outputs, and a real kernel moves far fewer
  elements (rung 2 measures its fraction equal to the correctly rounded result). The
  tolerance is the adversary's propagated deviation on the same inputs, doubled: an envelope
  measured from the proven per-GEMM bound, not a proof (no bound survives a flipped E2M1 code
  in the next quantization). The factor 2 covers the spread between legal kernels: the same
  adversary with another seed lands at 0.3-0.6 of it (tiny config, tests/test_ladder_rungs.py).
Also home of the propagated-tolerance helpers rungs 5-7 use.
"""
from __future__ import annotations

import zlib

import torch

from models.h3 import H3Model, initial_latent
from models.nvfp4_linear import BackendUnavailable
from numerics.epilogue import gate_residual
from validators.base import RungResult, check
from validators.rung3_projections import GemmAudit, model_under_test, not_run, selected_blocks

NAME = "complete block"
SAFETY = 2.0


def edge_wrap(seed: int = 1, calls: dict | None = None):
    """The legal adversary's wrap (apply to the reference model). ``calls`` (block, role,
    plain) -> calls so far, each step drawing fresh sides: pass a saved one to continue an
    adversary where it stopped (validators.trajectory_pass)."""
    calls = {} if calls is None else calls

    def wrap(block, role, lin):
        def edge(x, rows=None, *, gate=None, residual=None):
            d, real, bound = lin.oracle(x, rows=rows)
            # a fused call and a plain one (GemmAudit makes both) count apart, so call n of
            # each draws the same sides: the adversary is one deterministic legal backend
            kind = (block, role, gate is None)
            n = calls[kind] = calls.get(kind, -1) + 1
            gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{block}:{role}:{n}".encode()))
            y = legal_move(d, real, bound, torch.randint(0, 2, d.shape, generator=gen) * 2 - 1)
            return y if gate is None else gate_residual(y, gate, residual)
        return edge
    return wrap


def legal_move(d, real, bound, side: torch.Tensor) -> torch.Tensor:
    """The oracle's output ``d`` moved one bf16 step to ``side`` (+-1 per element), wherever
    that stays within ``bound`` of ``real`` (a legal fp32-accumulating kernel's output)."""
    side = side.to(d.device)
    df = d.double()
    ulp = torch.exp2(torch.floor(torch.log2(df.abs().clamp_min(2.0**-126))) - 7)
    cand = (df + side * ulp).to(torch.bfloat16)
    ok = ((cand.double() - real).abs() <= bound) & torch.isfinite(cand)
    return torch.where(ok, cand, d)


def relative_deviation(y: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (y.double() - ref.double()).norm()
    norm = ref.double().norm()
    return float(diff / norm) if norm > 0 else float(diff)


def compare(label: str, y: torch.Tensor, ref: torch.Tensor, adversary: torch.Tensor) -> dict:
    """Bit-identical, or finite and within SAFETY x the legal adversary's deviation."""
    if y.shape == ref.shape and torch.equal(y.view(torch.int16), ref.view(torch.int16)):
        return check(True, f"{label}: bit-identical to the reference")
    tol = SAFETY * relative_deviation(adversary, ref)
    dev = relative_deviation(y, ref) if y.shape == ref.shape else float("inf")
    ok = bool(torch.isfinite(y).all()) and dev <= tol
    where = ""
    if y.shape == ref.shape:
        r, c = divmod(int((y.double() - ref.double()).abs().argmax()), y.shape[1])
        where = f"; largest difference at element ({r}, {c})"
    return check(ok, f"{label}: relative deviation {dev:.3g} vs tolerance {tol:.3g} "
                 f"({SAFETY:g} x legal adversary){where}")


def three_ways(reference: H3Model, backend: str, wrap, adversary_calls: dict | None = None,
               adversary_device=None, model_device=None):
    """(model under test with a GemmAudit, the audit, the legal adversary), by default on the
    reference's device. With ``model_device`` the model and its audit (the reference's oracle
    of every GEMM it makes) go there, with ``adversary_device`` the adversary: each takes the
    reference's packed weights, moved (validators.trajectory_pass runs them side by side)."""
    here = reference.derived(device=model_device) if model_device is not None else reference
    audit = GemmAudit(here, wrap)
    adversary = reference.derived(wrap=edge_wrap(calls=adversary_calls),
                                  device=adversary_device)
    return model_under_test(here, backend, audit), audit, adversary


def block_io(reference: H3Model, blocks, step: int = 0) -> dict:
    """block -> (input, output) of the reference's denoiser step ``step`` from the seed's noise,
    for ``blocks`` only (at full size every block's pair would be 20 GB)."""
    io = {}

    def keep(i, x, y):
        if i in blocks:
            io[i] = (x, y)

    latent = initial_latent(reference.cfg, reference.seed).to(reference.device)
    reference.denoiser_step(latent, step, on_block=keep)
    return io


def run(reference: H3Model, backend: str = "reference", wrap=None, log=print) -> RungResult:
    try:
        model, audit, adversary = three_ways(reference, backend, wrap)
    except BackendUnavailable as e:
        return not_run(4, NAME, e)
    blocks = selected_blocks(reference.cfg.blocks)
    io = block_io(reference, blocks)
    checks, elements = {}, 0
    for b in blocks:
        x, y_ref = io[b]
        c = compare(f"block {b} output", model.block(b, x), y_ref, adversary.block(b, x))
        checks[f"block {b} output"] = c
        elements += y_ref.numel()
        log(f"    rung 4 block {b}: {'pass' if c['pass'] else 'FAIL'} ({c['detail']})")
    checks.update(audit.check())
    return RungResult.from_checks(4, NAME, checks, elements + audit.elements)
