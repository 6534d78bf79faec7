"""Rung 5: all blocks of one denoiser step, free-running from the seed's noise.

Every GEMM output of every block is checked per element against the oracle's bound (GemmAudit);
each block's output, and the step's velocity, against the reference's by rung 4's derived
tolerance (SAFETY x the legal adversary's deviation at the same point of the same step).
Runs as step 0 of the trajectory pass (validators.trajectory_pass), which the ladder shares
between rungs 5-7.
"""
from __future__ import annotations

from models.h3 import H3Model
from validators.base import RungResult
from validators.trajectory_pass import NAMES, run_rungs

NAME = NAMES[5]


def run(reference: H3Model, backend: str = "reference", wrap=None, log=print) -> RungResult:
    return run_rungs(reference, backend, wrap, (5,), log)[5]
