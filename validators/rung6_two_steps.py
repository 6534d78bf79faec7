"""Rung 6: a two-step video/audio trajectory: each step's latent against the reference's by
rung 4's derived tolerance, every GEMM output per element within the oracle bound."""
from __future__ import annotations

from models.h3 import H3Model
from models.nvfp4_linear import BackendUnavailable
from validators.base import RungResult
from validators.rung3_projections import not_run
from validators.rung4_block import compare, three_ways

NAME = "two-step trajectory"


def latents(model: H3Model, steps: int) -> dict:
    """step -> the latent after it, from the seed's noise."""
    out = {}
    model.trajectory(steps, on_step=lambda s, x: out.__setitem__(s, x))
    return out


def compare_trajectories(rung: int, reference: H3Model, backend: str, wrap, steps: int,
                         log) -> tuple[dict, object, int, dict]:
    """(checks, the model's final latent, elements, the reference's final latent) over
    ``steps`` sampler steps; raises BackendUnavailable."""
    model, audit, adversary = three_ways(reference, backend, wrap)
    ref, adv = latents(reference, steps), latents(adversary, steps)
    got = latents(model, steps)
    checks = {}
    for s in range(steps):
        checks[f"step {s} latent"] = c = compare(f"step {s} latent", got[s], ref[s], adv[s])
        log(f"    rung {rung} step {s}: {'pass' if c['pass'] else 'FAIL'} ({c['detail']})")
    checks.update(audit.check())
    return checks, got[steps - 1], audit.elements, ref[steps - 1]


def run(reference: H3Model, backend: str = "reference", wrap=None, log=print) -> RungResult:
    try:
        checks, _, elements, _ = compare_trajectories(6, reference, backend, wrap, 2, log)
    except BackendUnavailable as e:
        return not_run(6, NAME, e)
    return RungResult.from_checks(6, NAME, checks, elements)
