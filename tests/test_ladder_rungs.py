"""Ladder rungs: 1-2 at the ci hypothesis profile (rung 2 tiles drawn by hypothesis); 3-8 on a
tiny synthetic H3, the reference against itself, a perturbed fake and a legal adversary; the
runner: its parts and highest rung, resume after an interruption, the budget pause."""
import json
import time
import zlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from models.h3 import QUICK, H3Config, H3Model
from numerics.epilogue import gate_residual
from validators import (rung1_adversarial, rung2_randomized, rung3_projections, rung4_block,
                        rung5_step, rung6_two_steps, rung7_checksum, rung8_profile, runner,
                        trajectory_pass)
from validators.tiles import KINDS
from workbench import results as R


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
    # rung 1 counts only with its CUDA parts (1b, 1c), which a CPU cannot run
    assert s["headline"]["highest_rung_passed"] == (2 if HAVE_CUDA else 0)
    assert run_ladder("p0", quick=True) == 0  # what cannot run is reported, not failed
    s = R.load("ladder-p0", tmp_path)
    if not HAVE_CUDA:
        assert "needs a CUDA GPU" in " ".join(s["notes"]["not_run"])
    else:  # rungs 3-8 run p0 on the scaled H3
        assert s["headline"]["highest_rung_passed"] == 8, s["measurements"][-1]
        assert len(s["headline"]["trajectory_checksum"]) == 64


@pytest.mark.parametrize("phase, part_2c", [("p1", "randomized P1 GEMMs"),
                                             ("p2", "randomized ring chunks (P2)")])
def test_streamed_phase_runs_p0s_rungs_with_its_producer(phase, part_2c, tmp_path, monkeypatch):
    """The p1 and p2 phases are P0's ladder with their producer behind Nvfp4Linear (backend
    p1: P1; p2: the ring) and a part 2c of their own against P0; without a GPU their CPU parts
    run and every other part is named not-run with its reason."""
    from validators.runner import PassPart, _rungs, run_ladder

    parts = []  # rungs 5-7 are one PassPart where the backend can run, else a part each
    for p in _rungs(phase, True, "cpu"):
        parts += list(p.ids) if isinstance(p, PassPart) else [p.id]
    assert parts == ["1a", "1b", "1c", "2a", "2b", "2c", "3", "4", "5", "6", "7", "8"]
    assert runner._model_backend(phase, True)[0] == phase
    if HAVE_CUDA:
        return  # the GPU runs are the ladder-p1-quick and ladder-p2-quick device steps
    monkeypatch.setenv("WB_RESULTS_DIR", str(tmp_path))
    assert run_ladder(phase, quick=True) == 0  # incomplete, not failed
    s = R.load(f"ladder-{phase}", tmp_path)
    assert s["verdict"] == "incomplete" and s["headline"]["highest_rung_passed"] == 0
    not_run = " ".join(s["notes"]["not_run"])
    assert f"rung 2c ({part_2c}): needs a CUDA GPU" in not_run
    assert f"the {phase} backend needs a CUDA GPU" in not_run  # rungs 3-8
    assert {m["part"] for m in s["measurements"] if m["status"] == "pass"} == {"1a", "2a"}


def test_ladder_p2_sets_the_rings_capacity():
    """The scaled H3's 256 tokens cross a chunk boundary: its ring holds 128 rows; full size the
    backend's default."""
    assert runner._model_backend("p0", True) == ("p0", None)
    assert runner._model_backend("p1", True) == ("p1", None)
    for quick, rows in ((True, runner.P2_QUICK_CAPACITY), (False, 2048)):
        backend, wrap = runner._model_backend("p2", quick)
        lin = type("Lin", (), {"ring_capacity": 4096})()
        assert backend == "p2" and wrap(0, "qkv", lin) is lin and lin.ring_capacity == rows
    from models.h3 import QUICK

    assert runner.P2_QUICK_CAPACITY < QUICK.tokens and runner.P2_QUICK_CAPACITY % 128 == 0


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


def test_shared_trajectory_pass_equals_rungs_5_to_7_run_apart():
    """One pass gives rungs 5, 6 and 7 exactly as three separate runs do (the same checks,
    details, elements, checksums), with a legal backend that is not bit-identical."""
    ref = H3Model(SHORT, seed=0)
    shared = trajectory_pass.run_rungs(ref, wrap=rung4_block.edge_wrap(seed=2), log=_quiet)
    for rung, mod in ((5, rung5_step), (6, rung6_two_steps), (7, rung7_checksum)):
        alone = mod.run(ref, wrap=rung4_block.edge_wrap(seed=2), log=_quiet)
        assert shared[rung].to_json() == alone.to_json(), rung
    assert any("relative deviation" in c["detail"] for c in shared[7].checks.values())


# --- the runner: parts, highest rung, resume, budget ---------------------------------------
def _stub_rungs_1_2(monkeypatch):
    """Rungs 1-2's parts replaced by passing stubs (they have tests of their own, above)."""
    from validators.base import RungResult

    real = runner._rungs

    def rungs(phase, quick, device):
        for item in real(phase, quick, device):
            if isinstance(item, runner.Part) and item.id[0] in "12":
                item = runner.Part(item.id, item.title, lambda r=int(item.id[0]): RungResult(
                    r, "stub", "pass", "stubbed"))
            yield item
    monkeypatch.setattr(runner, "_rungs", rungs)


def _legal_stateless(block, role, lin):
    """A legal backend without call counters, so a resumed ladder draws what an uninterrupted
    one does: rung 4's adversary move, its sides seeded by the input's bytes and drawn for
    every row (a row slice moves as the same rows of the whole output, as rung 3 asks)."""
    def edge(x, rows=None, *, gate=None, residual=None):
        d, real, bound = lin.oracle(x, rows=rows)
        seed = zlib.crc32(x.detach().cpu().contiguous().view(torch.int16).numpy().tobytes())
        gen = torch.Generator().manual_seed(seed)
        side = torch.randint(0, 2, (x.shape[0], d.shape[1]), generator=gen) * 2 - 1
        r0, r1 = rows or (0, x.shape[0])
        y = rung4_block.legal_move(d, real, bound, side[r0:r1])
        return y if gate is None else gate_residual(y, gate, residual)
    return edge


@pytest.fixture
def tiny_ladder(tmp_path, monkeypatch):
    """The p0 ladder on the 3-step tiny H3 with a legal, not bit-identical backend under test
    (so rungs 3-7 run on a CPU); rungs 1-2 stubbed. Its run folder."""
    run_dir = tmp_path / "run"
    monkeypatch.setenv("WB_RESULTS_DIR", str(run_dir))
    _stub_rungs_1_2(monkeypatch)
    monkeypatch.setattr(runner, "_reference_config", lambda quick: SHORT)
    monkeypatch.setattr(runner, "_backend_unavailable", lambda backend: None)
    monkeypatch.setattr(runner, "_model_backend",
                        lambda phase, quick=False: ("reference", _legal_stateless))
    return run_dir


def _pause_after(monkeypatch, units: int):
    """Each call runs ``units`` units, then pauses as if its budget had run out."""
    def check(self, kind, where):
        self.units_run = getattr(self, "units_run", 0) + 1
        if self.units_run > units:
            raise runner._Pause(where)
    monkeypatch.setattr(runner._Ladder, "_check_budget", check)


def _comparable(summary: dict) -> dict:
    """A summary without what differs between calls: provenance, wall times, the calls."""
    notes = {k: v for k, v in summary["notes"].items() if k != "calls"}
    return {"measurements": [{k: v for k, v in m.items() if k != "seconds"}
                             for m in summary["measurements"]],
            "headline": summary["headline"], "gates": summary["gates"],
            "verdict": summary["verdict"], "notes": notes}


def _resume_until_done(run_dir, first_rc: int) -> tuple[int, int]:
    rc, calls = first_rc, 1
    while rc == runner.PAUSED:
        rc, calls = runner.run_ladder(resume=run_dir, stop_after=600), calls + 1
    return rc, calls


def test_resumed_ladder_continues_where_it_stopped_and_gives_the_same_summary(
        tiny_ladder, tmp_path, monkeypatch):
    assert runner.run_ladder("p0", quick=True) == 0
    want = R.load("ladder-p0", tiny_ladder)
    assert want["headline"]["highest_rung_passed"] == (8 if HAVE_CUDA else 7)
    assert len(want["headline"]["trajectory_checksum"]) == 64
    assert [m["part"] for m in want["measurements"]] == [
        "1a", "1b", "1c", "2a", "2b", "3", "4", "5", "6", "7", "8"]
    # every call runs one unit (a part, or a block of the trajectory pass), then pauses:
    # resumed after every part, at every step boundary and in the middle of every step
    resumed = tmp_path / "resumed"
    monkeypatch.setenv("WB_RESULTS_DIR", str(resumed))
    _pause_after(monkeypatch, 1)
    rc, calls = _resume_until_done(resumed, runner.run_ladder("p0", quick=True, stop_after=600))
    blocks = SHORT.blocks * SHORT.steps
    assert rc == 0 and calls == 8 + blocks  # a call per part but 5-7, one per pass block
    got = R.load("ladder-p0", resumed)
    assert _comparable(got) == _comparable(want)
    assert [c["ended"].split()[0] for c in got["notes"]["calls"]] == ["paused"] * (calls - 1) + [
        "finished"]
    assert not (resumed / "ladder-p0.state").exists()  # the summary holds what it had
    assert "completed over" in (resumed / "ladder-p0.md").read_text()


def test_resume_after_a_kill_or_lost_tensors_restarts_the_pass(tiny_ladder, monkeypatch,
                                                               capsys):
    """Paused in the middle of step 1, its tensors lost (a fresh machine): the pass restarts
    from step 0, rung 5 is computed again, and the summary is the uninterrupted one."""
    _pause_after(monkeypatch, 7 + SHORT.blocks + 1)  # parts 1a-4, step 0, step 1's block 0
    assert runner.run_ladder("p0", quick=True, stop_after=600) == runner.PAUSED
    state_dir = tiny_ladder / "ladder-p0.state"
    state = json.loads((state_dir / "state.json").read_text())
    assert state["status"] == "paused" and state["pass"]["step"] == 1
    assert [d["part"] for d in state["done"]][-1] == "5"
    for pt in state_dir.glob("*.pt"):
        pt.unlink()
    _pause_after(monkeypatch, 10**6)
    assert runner.run_ladder(resume=tiny_ladder) == 0
    assert "restart from step 0" in capsys.readouterr().err
    s = R.load("ladder-p0", tiny_ladder)
    assert [m["part"] for m in s["measurements"]].count("5") == 1
    assert s["headline"]["highest_rung_passed"] == (8 if HAVE_CUDA else 7)


def test_budget_pause_resume_and_a_finished_ladder(tiny_ladder, capsys):
    from cli.main import main

    assert main(["ladder", "--phase", "p0", "--quick", "--stop-after", "0.001"]) == 75
    out = capsys.readouterr().out
    assert "rung 1a" in out and "paused before rung 1b" in out  # the first unit always runs
    assert f"resume with: wb ladder --phase p0 --resume {tiny_ladder} --stop-after 0.001" in out
    # a fresh ladder never takes over a paused one's folder
    assert main(["ladder", "--phase", "p0", "--quick"]) == 2
    assert "unfinished ladder p0" in capsys.readouterr().err
    assert main(["ladder", "--resume", str(tiny_ladder)]) == 0  # the phase from the folder
    out = capsys.readouterr().out
    assert "resuming" in out and "rung 3  real projections" in out
    before = (tiny_ladder / "ladder-p0.json").read_bytes()
    assert main(["ladder", "--resume", str(tiny_ladder)]) == 0
    assert "ladder p0 in" in capsys.readouterr().out.split("finished earlier")[0]
    assert (tiny_ladder / "ladder-p0.json").read_bytes() == before  # said so, wrote nothing
    calls = R.load("ladder-p0", tiny_ladder)["notes"]["calls"]
    assert [c["ended"].split()[0] for c in calls] == ["paused", "finished"]


def test_budget_estimates_the_next_unit_by_its_last_time(tmp_path):
    from validators.ladder_state import LadderState

    state = LadderState.fresh(tmp_path, "p0", True, "cpu")
    state.unit_time("pass-block", 3.0)
    state.unit_time("pass-block", 5.0)
    walk = runner._Ladder("p0", True, "cpu", state, stop_after=4.0, t_start=time.monotonic())
    walk._check_budget("pass-block", "at step 0")  # a call's first unit runs whatever it costs
    walk.units = 1
    walk._check_budget("3", "before rung 3")  # never measured: estimated 0 s
    with pytest.raises(runner._Pause, match="at step 1"):
        walk._check_budget("pass-block", "at step 1")  # 5 s would end past 4 s


def test_resume_refuses_another_commit_a_live_lock_and_the_wrong_phase(tiny_ladder,
                                                                       monkeypatch):
    import os
    import platform
    import subprocess

    from workbench import WorkbenchError

    assert runner.run_ladder("p0", quick=True, stop_after=1e-6) == runner.PAUSED
    with pytest.raises(WorkbenchError, match="no ladder numerics state"):
        runner.run_ladder("numerics", resume=tiny_ladder)
    with pytest.raises(WorkbenchError, match="quick True there, False here"):
        runner.run_ladder(resume=tiny_ladder, quick=False)
    lock = tiny_ladder / "ladder-p0.state" / "lock"
    lock.write_text(json.dumps({"host": platform.node(), "pid": os.getpid()}))
    with pytest.raises(WorkbenchError, match="locked"):
        runner.run_ladder(resume=tiny_ladder)
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock.write_text(json.dumps({"host": platform.node(), "pid": dead.pid}))  # a killed call's
    assert runner.run_ladder(resume=tiny_ladder, stop_after=1e-6) == runner.PAUSED
    monkeypatch.setenv("WB_GIT_COMMIT", "0" * 40)
    with pytest.raises(WorkbenchError, match="commit"):
        runner.run_ladder(resume=tiny_ladder)


# --- the trajectory pass's chains side by side (devices): the one-device pass's results ----
QUICK_2 = H3Config(**{**QUICK.__dict__, "steps": 2})  # QUICK's sizes; rung 7 over 2 steps
CPU3 = ["cpu", "cpu", "cpu"]


def test_pass_on_three_devices_equals_the_one_device_pass():
    """QUICK (two steps, so rungs 5, 6 and 7 all end), a legal backend that is not
    bit-identical: the three chains in three threads give every result, check, figure and the
    checksum of the one-device pass, to the byte."""
    ref = H3Model(QUICK_2, seed=0)
    one = trajectory_pass.run_rungs(ref, wrap=rung4_block.edge_wrap(seed=2), log=_quiet)
    lines = []
    three = trajectory_pass.run_rungs(ref, wrap=rung4_block.edge_wrap(seed=2), log=lines.append,
                                      devices=CPU3)
    assert {r: v.to_json() for r, v in three.items()} == {r: v.to_json() for r, v in one.items()}
    assert three[7].headline["trajectory_checksum"] == one[7].headline["trajectory_checksum"]
    assert any("relative deviation" in c["detail"] for c in three[7].checks.values())
    assert all("reference" in line and "adversary" in line for line in lines if "[" in line)


def test_pass_state_moves_between_one_device_and_three():
    """Saved mid-step by a one-device pass, continued on three devices, saved again mid-step
    and finished on one: the uninterrupted pass's results."""
    wrap = _legal_stateless
    want = trajectory_pass.run_rungs(H3Model(SHORT, seed=0), wrap=wrap, log=_quiet)
    p = trajectory_pass.TrajectoryPass(H3Model(SHORT, seed=0), "reference", wrap, log=_quiet)
    p.advance()  # step 0, block 0: x mid-step
    for devices, blocks in ((CPU3, 2), (None, 10**6)):
        meta, tensors = p.state()
        meta = json.loads(json.dumps(meta))  # as the state file holds it
        p.close()
        p = trajectory_pass.TrajectoryPass.restore(H3Model(SHORT, seed=0), "reference", wrap,
                                                   meta, tensors, log=_quiet, devices=devices)
        assert [m.device.type for m in p.models] == ["cpu"] * 3
        while blocks and not p.finished:
            p.advance()
            blocks -= 1
    assert {r: v.to_json() for r, v in p.results.items()} == {
        r: v.to_json() for r, v in want.items()}


def test_resumed_ladder_alternating_devices_gives_the_same_summary(tiny_ladder, tmp_path,
                                                                   monkeypatch):
    """Every call one unit, the calls alternating between one device and three: the summary
    of an uninterrupted one-device ladder; each call records its devices."""
    assert runner.run_ladder("p0", quick=True) == 0
    want = R.load("ladder-p0", tiny_ladder)
    resumed = tmp_path / "devices"
    monkeypatch.setenv("WB_RESULTS_DIR", str(resumed))
    _pause_after(monkeypatch, 1)
    rc, calls = runner.run_ladder("p0", quick=True, stop_after=600, devices=CPU3), 1
    while rc == runner.PAUSED:
        devices = CPU3 if calls % 2 == 0 else None
        rc, calls = runner.run_ladder(resume=resumed, stop_after=600, devices=devices), calls + 1
    assert rc == 0 and calls == 8 + SHORT.blocks * SHORT.steps
    got = R.load("ladder-p0", resumed)
    assert _comparable(got) == _comparable(want)
    assert [c.get("devices") for c in got["notes"]["calls"][:3]] == [CPU3, None, CPU3]


def test_devices_refused_unless_three_of_this_machines_kind(tiny_ladder):
    from workbench import WorkbenchError

    with pytest.raises(WorkbenchError, match="name three"):
        runner.run_ladder("p0", quick=True, devices=["cpu", "cpu"])
    with pytest.raises(WorkbenchError, match="not a device"):
        runner.run_ladder("p0", quick=True, devices=["cpu", "gpu0", "cpu"])
    if not HAVE_CUDA:
        with pytest.raises(WorkbenchError, match="is not a cpu device"):
            runner.run_ladder("p0", quick=True, devices=["cuda:0", "cuda:1", "cuda:2"])
    assert not (tiny_ladder / "ladder-p0.state").exists()  # refused before any work


@pytest.mark.gpu
def test_pass_on_several_gpus_equals_one_gpu():
    """p0 on CUDA: the chains on cuda:1, cuda:2 (or cuda:1 twice), cuda:0, side by side,
    against all on cuda:0: the same results and checksum (run on a host with 2+ GPUs)."""
    n = torch.cuda.device_count()
    if n < 2 or torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("needs two or more sm_90 GPUs")
    ref = H3Model(SHORT, seed=0, device="cuda:0")
    one = trajectory_pass.run_rungs(ref, backend="p0", log=_quiet)
    devices = ["cuda:1", f"cuda:{min(2, n - 1)}", "cuda:0"]
    many = trajectory_pass.run_rungs(H3Model(SHORT, seed=0, device="cuda:0"), backend="p0",
                                     log=_quiet, devices=devices)
    assert {r: v.to_json() for r, v in many.items()} == {r: v.to_json() for r, v in one.items()}
    assert many[7].status == "pass"


def test_a_failing_rung_stops_the_ladder_and_names_the_rest(tiny_ladder, monkeypatch):
    monkeypatch.setattr(runner, "_model_backend",
                        lambda phase, quick=False: ("reference", _perturb_fc1_of_block_1))
    assert runner.run_ladder("p0", quick=True) == 1
    s = R.load("ladder-p0", tiny_ladder)
    assert s["measurements"][-1]["part"] == "3" and s["measurements"][-1]["status"] == "fail"
    assert s["headline"]["highest_rung_passed"] == 2
    assert ("rung 4, 5, 6, 7, 8: not run, the ladder stopped at rung 3's failure"
            in s["notes"]["not_run"])


@pytest.mark.skipif(HAVE_CUDA, reason="checks what a machine without CUDA reports")
def test_rung_listing_on_a_cpu_names_every_part_and_why(tmp_path, monkeypatch, capsys):
    """Every part has its own name and line; highest rung passed follows from them and says
    what stops it; every part not run is named with its reason."""
    monkeypatch.setenv("WB_RESULTS_DIR", str(tmp_path))
    assert runner.run_ladder("p0", quick=True) == 0
    out = capsys.readouterr().out
    s = R.load("ladder-p0", tmp_path)
    status = {m["part"]: m["status"] for m in s["measurements"]}
    assert status == {"1a": "pass", "1b": "not-run", "1c": "not-run", "2a": "pass",
                      "2b": "not-run", **{str(r): "not-run" for r in range(3, 9)}}
    assert "rung 2a randomized tiles" in out and "rung 2b randomized GEMMs (P0)" in out
    assert s["headline"]["highest_rung_passed"] == 0
    assert s["notes"]["highest_rung_why"] == "rung 1: 1b not-run, 1c not-run"
    assert "highest rung passed 0 (rung 1: 1b not-run, 1c not-run)" in out
    named = " ".join(s["notes"]["not_run"])
    for part in ["1b", "1c", "2b", *map(str, range(3, 9))]:
        assert f"rung {part} (" in named, part
    assert "rung 3, 4, 5, 6, 7, 8: the p0 backend needs a CUDA GPU" in out
    assert "| 2b | randomized GEMMs (P0) | not-run |" in (tmp_path / "ladder-p0.md").read_text()


def test_frame_phase_says_what_exists():
    from workbench import WorkbenchError

    with pytest.raises(WorkbenchError) as e:
        runner.run_ladder("frame")
    msg = str(e.value)
    assert "ran no rung" in msg and "kernel exists" in msg
    assert "FastLoop(depth_kernel=True)" in msg and "rungs are not built yet" in msg


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
