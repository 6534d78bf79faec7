"""Rung 7: the canonical 12-step video/audio trajectory and its checksum.

The checksum (sha256 of the final latent's bf16 bytes) is the ladder's headline; it must be
equal between P0/P1/P2 (same consumer and order). Against ``reference`` the trajectory passes
when every step's latent is within rung 4's derived tolerance and every GEMM output within the
oracle bound; whether the checksums are also equal is reported.
"""
from __future__ import annotations

from models.h3 import H3Model, checksum
from models.nvfp4_linear import BackendUnavailable
from validators.base import RungResult, check
from validators.rung3_projections import not_run
from validators.rung6_two_steps import compare_trajectories

NAME = "12-step checksum"


def run(reference: H3Model, backend: str = "reference", wrap=None, log=print) -> RungResult:
    steps = reference.cfg.steps
    try:
        checks, final, elements, ref_final = compare_trajectories(
            7, reference, backend, wrap, steps, log)
    except BackendUnavailable as e:
        return not_run(7, NAME, e)
    got, want = checksum(final), checksum(ref_final)
    same = got["sha256"] == want["sha256"]
    checks["checksum"] = check(got["finite"], f"{steps}-step checksum {got['sha256'][:16]}... "
                               f"{'equals' if same else 'differs from'} the reference's "
                               f"{want['sha256'][:16]}... (rms {got['rms']:.6g} vs "
                               f"{want['rms']:.6g})")
    return RungResult.from_checks(7, NAME, checks, elements, headline={
        "trajectory_checksum": got["sha256"], "trajectory_summary": got,
        "reference_checksum": want["sha256"]})
