"""Rung 5: all blocks of one denoiser step, free-running from the seed's noise.

Every GEMM output of every block is checked per element against the oracle's bound (GemmAudit);
each block's output, and the step's velocity, against the reference's by rung 4's derived
tolerance (SAFETY x the legal adversary's deviation at the same point of the same step).
"""
from __future__ import annotations

from models.h3 import H3Model, initial_latent
from models.nvfp4_linear import BackendUnavailable
from validators.base import RungResult
from validators.rung3_projections import not_run
from validators.rung4_block import compare, three_ways

NAME = "all blocks of a step"


def outputs_by_block(model: H3Model, latent, step: int = 0):
    """(block -> output, the step's velocity)."""
    out = {}
    v = model.denoiser_step(latent, step, on_block=lambda i, x, y: out.__setitem__(i, y))
    return out, v


def run(reference: H3Model, backend: str = "reference", wrap=None, log=print) -> RungResult:
    try:
        model, audit, adversary = three_ways(reference, backend, wrap)
    except BackendUnavailable as e:
        return not_run(5, NAME, e)
    latent = initial_latent(reference.cfg, reference.seed).to(reference.device)
    (ref, v_ref), (adv, v_adv) = (outputs_by_block(m, latent) for m in (reference, adversary))
    got, v = outputs_by_block(model, latent)
    checks = {}
    for b in sorted(ref):
        checks[f"block {b} output"] = c = compare(f"block {b} output", got[b], ref[b], adv[b])
        log(f"    rung 5 block {b}: {'pass' if c['pass'] else 'FAIL'} ({c['detail']})")
    checks["velocity"] = compare("velocity", v, v_ref, v_adv)
    checks.update(audit.check())
    return RungResult.from_checks(5, NAME, checks, audit.elements)
