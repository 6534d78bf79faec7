"""Rung 6: a two-step video/audio trajectory: each step's latent against the reference's by
rung 4's derived tolerance, every GEMM output per element within the oracle bound (steps 0-1
of the trajectory pass, validators.trajectory_pass)."""
from __future__ import annotations

from models.h3 import H3Model
from validators.base import RungResult
from validators.trajectory_pass import NAMES, run_rungs

NAME = NAMES[6]


def run(reference: H3Model, backend: str = "reference", wrap=None, log=print) -> RungResult:
    return run_rungs(reference, backend, wrap, (6,), log)[6]
