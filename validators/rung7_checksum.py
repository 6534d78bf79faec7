"""Rung 7: the canonical 12-step video/audio trajectory and its checksum.

The checksum (sha256 of the final latent's bf16 bytes) is the ladder's headline; it must be
equal between P0/P1/P2 (same consumer and order). Against ``reference`` the trajectory passes
when every step's latent is within rung 4's derived tolerance and every GEMM output within the
oracle bound; whether the checksums are also equal is reported. The whole trajectory pass
(validators.trajectory_pass) over cfg.steps steps.
"""
from __future__ import annotations

from models.h3 import H3Model
from validators.base import RungResult
from validators.trajectory_pass import NAMES, run_rungs

NAME = NAMES[7]


def run(reference: H3Model, backend: str = "reference", wrap=None, log=print) -> RungResult:
    return run_rungs(reference, backend, wrap, (7,), log)[7]
