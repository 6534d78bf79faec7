"""Ladder rungs 1-2 at the ci hypothesis profile (rung 2 tiles drawn by hypothesis)."""
import torch
from hypothesis import given
from hypothesis import strategies as st

from validators import rung1_adversarial, rung2_randomized
from validators.tiles import KINDS


def test_rung1_adversarial_passes():
    r = rung1_adversarial.run(quick=True)
    assert r.status == "pass", {k: v for k, v in r.checks.items() if not v["pass"]}


@given(kind=st.sampled_from(KINDS), dtype=st.sampled_from([torch.bfloat16, torch.float16]),
       rows=st.sampled_from([16, 32, 48]), kb=st.integers(1, 6), seed=st.integers(0, 2**30))
def test_rung2_reference_matches_scalar_spec(kind, dtype, rows, kb, seed):
    bad, total = rung2_randomized.compare_to_scalar(kind, rows, 16 * kb, dtype, seed)
    assert bad == 0, f"{bad} of {total} bytes differ ({kind}, seed {seed})"


def test_ladder_runner_writes_summary(tmp_path, monkeypatch):
    from validators.runner import run_ladder
    from workbench import results as R

    monkeypatch.setenv("WB_RESULTS_DIR", str(tmp_path))
    assert run_ladder("numerics", quick=True) == 0
    s = R.load("ladder-numerics", tmp_path)
    assert s["headline"]["highest_rung_passed"] == 2
    assert run_ladder("p0", quick=True) == 0  # what cannot run is reported, not failed
    s = R.load("ladder-p0", tmp_path)
    not_run = " ".join(s["notes"]["not_run"])
    import torch

    assert ("needs a CUDA GPU" in not_run) if not torch.cuda.is_available() else ("P3" in not_run)
