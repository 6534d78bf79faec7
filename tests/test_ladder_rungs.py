"""Ladder rungs: 1-2 at the ci hypothesis profile (rung 2 tiles drawn by hypothesis); 3-8 on a
tiny synthetic H3, the reference against itself, a perturbed fake and a legal adversary."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from models.h3 import H3Config, H3Model
from validators import (rung1_adversarial, rung2_randomized, rung3_projections, rung4_block,
                        rung5_step, rung6_two_steps, rung7_checksum, rung8_profile)
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
    if not torch.cuda.is_available():
        assert "needs a CUDA GPU" in " ".join(s["notes"]["not_run"])
    else:  # rungs 3-8 run p0 on the scaled H3
        assert s["headline"]["highest_rung_passed"] == 8, s["measurements"][-1]
        assert len(s["headline"]["trajectory_checksum"]) == 64


# --- rungs 3-8 on the synthetic H3 (tiny config: every rung's machinery in seconds) ---------
TINY = H3Config(blocks=2, hidden=128, mlp=256, head_dim=64, video_tokens=160, audio_tokens=32)
SHORT = H3Config(**{**TINY.__dict__, "steps": 3})  # rung 7's machinery on a 3-step trajectory
MODEL_RUNGS = {3: rung3_projections, 4: rung4_block, 5: rung5_step, 6: rung6_two_steps,
               7: rung7_checksum}
HAVE_CUDA = torch.cuda.is_available()


def _quiet(line):
    pass


@pytest.fixture(scope="module")
def tiny():
    return H3Model(TINY, seed=0)


def _perturb_fc1_of_block_1(block, role, lin):
    """A fake backend: the reference with one fc1 output element of block 1 wrong."""
    def wrong(x, rows=None, **epilogue):
        y = lin(x, rows=rows, **epilogue)
        if block == 1 and role == "fc1":
            y = y.clone()
            y[5, 7] = y[5, 7] * 2 + 1
        return y
    return wrong


@pytest.mark.parametrize("rung", sorted(MODEL_RUNGS))
def test_model_rung_reference_against_itself_is_bit_identical(tiny, rung):
    r = MODEL_RUNGS[rung].run(tiny, log=_quiet)
    assert r.rung == rung and r.status == "pass", r.detail
    assert not any("deviation" in c["detail"] for c in r.checks.values()), r.checks
    if rung == 7:
        assert len(r.headline["trajectory_checksum"]) == 64
        assert r.headline["trajectory_checksum"] == r.headline["reference_checksum"]


@pytest.mark.parametrize("rung", sorted(MODEL_RUNGS))
def test_model_rung_trips_on_a_perturbed_backend(tiny, rung):
    ref = H3Model(SHORT, seed=0) if rung == 7 else tiny
    r = MODEL_RUNGS[rung].run(ref, wrap=_perturb_fc1_of_block_1, log=_quiet)
    assert r.rung == rung and r.status == "fail"
    assert "block 1 fc1" in r.detail and "element (5, 7)" in r.detail, r.detail
    assert "outside the oracle bound" in r.detail


@pytest.mark.parametrize("rung", [4, 6])
def test_legal_but_different_backend_passes(tiny, rung):
    """A backend that moves GEMM outputs inside the proven bound (the legal adversary with
    another seed) is not bit-identical but passes: the derived tolerance is not too tight."""
    r = MODEL_RUNGS[rung].run(tiny, wrap=rung4_block.edge_wrap(seed=2), log=_quiet)
    assert r.status == "pass", r.detail
    assert any("relative deviation" in c["detail"] for c in r.checks.values())


def test_propagated_comparison_trips_beyond_tolerance():
    gen = torch.Generator().manual_seed(5)
    ref = torch.randn(64, 128, generator=gen).to(torch.bfloat16)
    adv = (ref.float() * (1 + 2.0**-8 * torch.randn(64, 128, generator=gen))).to(torch.bfloat16)
    assert rung4_block.compare("x", ref.clone(), ref, adv)["pass"]
    assert rung4_block.compare("x", adv, ref, adv)["pass"]
    wrong = ref.clone()
    wrong[3, 9] += 50
    c = rung4_block.compare("block 0 output", wrong, ref, adv)
    assert not c["pass"] and "element (3, 9)" in c["detail"]
    nan = ref.clone()
    nan[0, 0] = float("nan")
    assert not rung4_block.compare("x", nan, ref, adv)["pass"]


@pytest.mark.skipif(HAVE_CUDA, reason="checks what a machine without CUDA reports")
@pytest.mark.parametrize("rung", [3, 4, 5, 6, 7, 8])
def test_model_rungs_not_run_for_p0_without_cuda(tiny, rung):
    mod = {**MODEL_RUNGS, 8: rung8_profile}[rung]
    r = mod.run(tiny, backend="p0", log=_quiet)
    assert r.rung == rung and r.status == "not-run"
    assert "CUDA" in r.detail


def test_runner_stops_rungs_3_on_when_p0_cannot_run(tmp_path, monkeypatch):
    """With rung 2 passing (stubbed), a CPU machine reports rung 3 not-run (p0 needs CUDA)."""
    from validators import rung2_p0_gemm, runner
    from validators.base import RungResult
    from workbench import results as R

    if HAVE_CUDA:
        pytest.skip("checks what a machine without CUDA reports")
    monkeypatch.setenv("WB_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(rung2_p0_gemm, "run",
                        lambda quick=False: RungResult(2, "stub", "pass", "stubbed"))
    assert runner.run_ladder("p0", quick=True) == 0
    s = R.load("ladder-p0", tmp_path)
    assert s["verdict"] == "incomplete" and s["headline"]["highest_rung_passed"] == 2
    assert s["measurements"][-1]["rung"] == 3
    assert "p0 backend needs a CUDA GPU" in s["measurements"][-1]["detail"]
    assert "highest rung passed: 2" in (tmp_path / "ladder-p0.md").read_text()


def test_runner_runs_model_rungs_in_order_and_stops_at_a_failure(tmp_path, monkeypatch, tiny):
    """The runner's rungs 3-8 (model rungs run on the tiny reference): all pass but 8 (not run
    on CPU); with a perturbed backend the ladder stops at rung 3 and fails."""
    from validators import rung2_p0_gemm, runner
    from validators.base import RungResult
    from workbench import results as R

    monkeypatch.setenv("WB_RESULTS_DIR", str(tmp_path))
    monkeypatch.setattr(rung2_p0_gemm, "run",
                        lambda quick=False: RungResult(2, "stub", "pass", "stubbed"))
    monkeypatch.setattr(runner, "_backend_unavailable", lambda backend: None)
    short = H3Model(SHORT, seed=0)
    mods = {**MODEL_RUNGS, 8: rung8_profile}
    monkeypatch.setattr(runner, "_model_rung", lambda rung, backend, quick, device: mods[
        rung].run(short, log=_quiet))
    assert runner.run_ladder("p0", quick=True) == 0
    s = R.load("ladder-p0", tmp_path)
    expected = 7 if not HAVE_CUDA else 8
    assert s["headline"]["highest_rung_passed"] == expected
    assert len(s["headline"]["trajectory_checksum"]) == 64
    assert s["headline"]["trajectory_checksum"] in (tmp_path / "ladder-p0.md").read_text()
    monkeypatch.setattr(runner, "_model_rung", lambda rung, backend, quick, device: mods[
        rung].run(short, wrap=_perturb_fc1_of_block_1, log=_quiet))
    assert runner.run_ladder("p0", quick=True) == 1
    s = R.load("ladder-p0", tmp_path)
    assert s["measurements"][-1]["rung"] == 3 and s["measurements"][-1]["status"] == "fail"
    assert s["headline"]["highest_rung_passed"] == 2


@pytest.mark.gpu
@pytest.mark.parametrize("rung", [3, 4, 5, 6, 7, 8])
def test_model_rungs_pass_for_p0_at_tiny_config(rung):
    """p0 against the reference on CUDA: every GEMM output within the oracle bound, block and
    trajectory outputs within the derived tolerance, profile and peak memory recorded."""
    if torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("p0 needs an sm_90 GPU")
    ref = H3Model(SHORT if rung == 7 else TINY, seed=0, device="cuda")
    mod = {**MODEL_RUNGS, 8: rung8_profile}[rung]
    r = mod.run(ref, backend="p0", log=_quiet)
    assert r.status == "pass", r.detail
