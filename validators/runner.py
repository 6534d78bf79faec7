"""The validator ladder: its parts in order, resumable, stopping at the first that fails.

The 8 rungs of the NVFP4 design (seeds/nvfp4-streaming-design.md), per phase:
 1 adversarial cases  2 randomized tiles / GEMMs  3 real projections at blocks 0, 24, 49
 4 complete block  5 all 50 blocks of a step  6 two-step trajectory  7 12-step checksum
 8 per-kernel profile and peak memory (torch.profiler; an Nsight recapture is a script's job).
A rung made of several parts names them by letter, each with its own line and gate:
 1a the reference quantizer on the CPU, 1b the same on CUDA, 1c the CuTe DSL quantize kernel;
 2a randomized tiles (the reference against the scalar spec; with a GPU also CUDA against CPU
    and the kernel against the reference), 2b randomized P0 GEMMs against the oracle (p0, p2),
 2c randomized projections through P2's ring, bit for bit against P0's whole call (p2).
Rungs 3-8 run the synthetic H3 (models.h3; --quick: its scaled config) on the phase's backend
against the reference backend on the same device, printing a line per block or step; rungs 5-7
are one trajectory pass (validators.trajectory_pass: 12 steps where separate rungs took 15).

Every part runs in order. One this machine cannot run, or whose code is not built, is recorded
not-run with its reason and the ladder goes on; the first that fails stops it, and the parts
after are named as not run. "Highest rung passed" is the highest r such that rungs 1..r ran
every part and every part passed (a later rung is never claimed over an unrun or partial
earlier one); the last line names what stops it going higher. A ladder with any part not run
is "incomplete", never "pass"; one that runs no part at all is an error.

Resumable (validators.ladder_state): the state lives in ``<run folder>/ladder-<phase>.state/``
until the summary is written, saved after every part and at every step of the trajectory pass.
With ``stop_after`` seconds (--stop-after) a call stops before a unit (a part, or a block of
the pass) that its last measured time says would cross the budget (its first unit always runs,
so every call makes progress), checkpoints, and returns PAUSED;
``resume=RUN_DIR`` (--resume) continues after the last completed part, step or block. When the
ladder is done it writes ladder-<phase>.json and a short Markdown report, ladder-<phase>.md,
into the run folder; the headline names highest_rung_passed and trajectory_checksum (rung 7's
sha256, None until it runs).
"""
from __future__ import annotations

import importlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from models import weight_cache
from models.h3 import FULL, QUICK, H3Model
from models.nvfp4_linear import BackendUnavailable, resolve_backend
from schedules.p2_ring import DEFAULT_CAPACITY
from validators import rung1_adversarial, rung2_randomized
from validators.base import RungResult
from validators.ladder_state import LadderState, finished_summary
from validators.trajectory_pass import TrajectoryPass
from workbench import WorkbenchError
from workbench import results as R
from workbench.env import gpu_info

PAUSED = 75  # exit code of a call that stopped at its budget (EX_TEMPFAIL: try again later)

RUNG_TITLES = {
    1: "adversarial", 2: "randomized", 3: "real projections", 4: "complete block",
    5: "all blocks of a step", 6: "two-step trajectory", 7: "12-step checksum",
    8: "profile + peak memory",
}
MODEL_RUNGS = {3: "rung3_projections", 4: "rung4_block", 8: "rung8_profile"}
PASS_RUNGS = (5, 6, 7)

FRAME_NOT_BUILT = (
    "the depth frame kernel exists (kernels/depth/frame/, opt-in via "
    "FastLoop(depth_kernel=True); checked by tests/test_depth_frame.py and "
    "experiments/depth_frame.py), but its ladder rungs are not built yet")
# what each phase's rungs exercise beyond the numerics reference, and which issue builds it
PENDING = {
    "numerics": {},
    "p0": {},
    # every P1/P2 rung, the adversarial cases first, runs through the phase's producer
    "p1": {},  # P0's rungs with P1 behind Nvfp4Linear (backend p1), and part 2c
    "p2": {},  # P0's rungs with the ring behind Nvfp4Linear (backend p2), and part 2c
    "frame": {1: FRAME_NOT_BUILT},
}
PHASES = tuple(PENDING)
# rung 2's part 2c per streamed phase: (title, validators module), loaded only on a GPU
PRODUCER_PARTS = {"p1": ("randomized P1 GEMMs", "rung2_p1_gemm"),
                  "p2": ("randomized ring chunks (P2)", "rung2_p2_ring")}


@dataclass
class Part:
    """One unit of the ladder: ``run()`` -> its RungResult; ``id`` names it ("1a", "3") and
    ``title`` replaces the rung module's name where the part needs its own."""
    id: str | None
    title: str | None
    run: Callable[[], RungResult]


@dataclass
class PassPart:
    """Rungs 5-7: one trajectory pass, run block by block."""
    ids = tuple(str(r) for r in PASS_RUNGS)
    phase: str
    quick: bool
    device: str


class _Pause(Exception):
    """The budget would run out before the next unit: ``where`` the ladder stopped."""


def _kernel_quantize():
    """The CuTe DSL quantize kernel when a Hopper GPU is present, else None."""
    try:
        if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
            return None
        # here, not at the top: the kernel imports CuTe DSL, which the ladder runs without
        from kernels.nvfp4.quantize import quantize_nvfp4

        return lambda x, g: quantize_nvfp4(x, g)
    except ImportError:
        return None


def _not_run(rung: int, title: str, reason: str) -> Callable[[], RungResult]:
    return lambda: RungResult(rung, title, "not-run", reason)


def _rungs(phase: str, quick: bool, device: str):
    """The phase's parts in order: Part objects and, for rungs 5-7, one PassPart."""
    if phase == "frame":  # its rungs are not the NVFP4 ones: one line says what exists
        yield Part("1", "depth frame rungs", _not_run(1, "depth frame rungs", FRAME_NOT_BUILT))
        return
    pending = PENDING[phase]
    kernel = _kernel_quantize() if device == "cuda" else None
    last = 2 if phase == "numerics" else 8  # rungs 3-8 are whole-model gates for GEMM phases
    unavailable = None
    for rung in range(1, last + 1):
        title = RUNG_TITLES[rung]
        waiting = [r for r in pending if r <= rung]
        if waiting:
            reason = pending.get(rung) or pending[min(waiting)]
            yield Part(str(rung), title, _not_run(rung, title, reason))
            continue
        if rung == 1:
            yield Part("1a", "adversarial (reference, CPU)",
                       lambda: rung1_adversarial.run(quick=quick))
            t = "adversarial (reference on CUDA)"
            yield Part("1b", t, (lambda: rung1_adversarial.run(quick=quick, device="cuda"))
                       if device == "cuda" else _not_run(1, t, "no CUDA GPU visible"))
            t = "adversarial (CuTe DSL quantize kernel)"
            yield Part("1c", t, (lambda: rung1_adversarial.run(
                quick=quick, device="cuda", quantize=lambda x, g: kernel(x, _gtensor(g))))
                if kernel is not None else _not_run(1, t, _kernel_unavailable(device)))
        elif rung == 2:
            yield Part("2a", "randomized tiles",
                       lambda: rung2_randomized.run(quick=quick, device=device, kernel=kernel))
            if phase in ("p0", "p1", "p2"):
                # here, not at the top: only the GEMM phases load the CuTe DSL GEMM they check
                from validators import rung2_p0_gemm

                yield Part("2b", "randomized GEMMs (P0)", lambda: rung2_p0_gemm.run(quick=quick))
            if phase in PRODUCER_PARTS:  # the phase's own producer against P0, bit for bit
                t, module = PRODUCER_PARTS[phase]
                if device == "cuda":
                    mod = importlib.import_module(f"validators.{module}")
                    yield Part("2c", t, lambda: mod.run(quick=quick))
                else:
                    yield Part("2c", t, _not_run(2, t, "needs a CUDA GPU"))
        else:
            if unavailable is None:
                unavailable = _backend_unavailable(phase) or ""
            if unavailable:
                yield Part(str(rung), title, _not_run(rung, title, unavailable))
            elif rung in PASS_RUNGS:
                if rung == PASS_RUNGS[0]:
                    yield PassPart(phase, quick, device)
            else:
                yield Part(str(rung), title,
                           lambda rung=rung: _model_rung(rung, phase, quick, device))


def _kernel_unavailable(device: str) -> str:
    if device == "cpu":
        return "no CUDA GPU visible"
    return "needs an sm_90 GPU and CuTe DSL (nvidia-cutlass-dsl)"


def _backend_unavailable(backend: str) -> str | None:
    try:
        resolve_backend(backend, "qkv")
    except BackendUnavailable as e:
        return str(e)
    return None


# the p2 ladder's ring rows: the scaled H3's 256 tokens in two chunks, so the quick ladder
# crosses a chunk boundary; full size the backend's default (37,810 rows in 19 chunks)
P2_QUICK_CAPACITY = 128


def _model_backend(phase: str, quick: bool = False):
    """(backend, wrap) of the model under test in rungs 3-8: the phase's backend; for p2 a wrap
    that sets the ring's capacity (P2_QUICK_CAPACITY on the scaled H3)."""
    if phase != "p2":
        return phase, None
    capacity = P2_QUICK_CAPACITY if quick else DEFAULT_CAPACITY

    def ring_rows(block, role, lin):
        lin.ring_capacity = capacity  # the p2 model's own linears (fc2's, on p0, ignore it)
        return lin

    return phase, ring_rows


def _reference_config(quick: bool):
    return QUICK if quick else FULL


_REFERENCE: dict = {}  # (quick, device) -> the reference H3 model, shared by rungs 3-8


def _reference(quick: bool, device: str):
    key = (quick, device)
    if key not in _REFERENCE:
        _REFERENCE.clear()
        # $WB_WEIGHT_CACHE: packed weights from the device's disk, not drawn again each call
        _REFERENCE[key] = H3Model(_reference_config(quick), seed=0, device=device,
                                  weight_cache=weight_cache.from_env())
    return _REFERENCE[key]


def _log(line: str) -> None:
    print(line, flush=True)


def _model_rung(rung: int, phase: str, quick: bool, device: str) -> RungResult:
    mod = importlib.import_module(f"validators.{MODEL_RUNGS[rung]}")
    backend, wrap = _model_backend(phase, quick)
    return mod.run(_reference(quick, device), backend=backend, wrap=wrap, log=_log)


def _gtensor(g):
    return torch.tensor([float(g)], dtype=torch.float32, device="cuda")


def highest_rung_passed(done: list[RungResult]) -> int:
    """The highest rung r such that rungs 1..r all ran and every part of each passed."""
    statuses: dict[int, list[str]] = {}
    for r in done:
        statuses.setdefault(r.rung, []).append(r.status)
    best = 0
    while statuses.get(best + 1) and all(st == "pass" for st in statuses[best + 1]):
        best += 1
    return best


def why_not_higher(done: list[RungResult], highest: int) -> str:
    """What keeps the highest rung passed at ``highest``: the next rung's parts that did not
    pass, or that it did not run ('' when no rung follows)."""
    nxt = [r for r in done if r.rung == highest + 1]
    if not nxt:
        later = any(r.rung > highest + 1 for r in done)
        return f"rung {highest + 1} not run" if later else ""
    bad = [f"{r.label} {r.status}" for r in nxt if r.status != "pass"]
    return f"rung {highest + 1}: {', '.join(bad)}"


def _device_steps_not_run(device: str) -> list[str]:
    """The checks inside part 2a that need a GPU (reference on CUDA against the CPU, the CuTe
    DSL quantize kernel) and cannot run here (rung 1's are parts 1b and 1c of their own)."""
    if device == "cpu":
        return ["rung 2a's CUDA comparisons (reference on CUDA vs CPU, CuTe DSL quantize "
                "kernel vs reference): no CUDA GPU visible"]
    if _kernel_quantize() is None:
        return ["rung 2a's CuTe DSL quantize kernel comparison: needs an sm_90 GPU and CuTe DSL"]
    return []


def _grouped(results: list[RungResult]) -> list[str]:
    """'rung 3, 4, 5: reason' for the not-run parts, one entry per distinct reason."""
    by_reason: dict[str, list[str]] = {}
    for r in results:
        if r.status == "not-run":
            by_reason.setdefault(r.detail, []).append(r.label)
    return [f"rung {', '.join(labels)}: {reason}" for reason, labels in by_reason.items()]


def _print_result(r: RungResult, seconds: float, earlier: bool = False) -> None:
    when = "earlier call" if earlier else f"{seconds:.1f}s"
    print(f"  rung {r.label:<3}{r.name:<40} {r.status.upper():<8} {r.detail} ({when})",
          flush=True)


class _Ladder:
    """One call's walk over the parts: runs, records, pauses."""

    def __init__(self, phase, quick, device, state, stop_after, t_start, devices=None):
        self.phase, self.quick, self.device = phase, quick, device
        self.state, self.stop_after, self.t_start = state, stop_after, t_start
        self.devices = devices  # the trajectory pass's chains, or None: one device
        self.done: list[RungResult] = state.done() if state else []
        self.earlier = {r.label: r for r in self.done}
        self.failed: RungResult | None = None
        self.skipped: list[str] = []  # parts after a failure, never run
        self.units = 0  # units run by this call

    def _persist(self) -> bool:
        """Whether to save: from the first part that ran (a ladder that runs nothing writes
        nothing), or whenever the state is already on disk."""
        return self.state is not None and (
            (self.state.dir / "state.json").exists()
            or any(r.status != "not-run" for r in self.done))

    def _check_budget(self, kind: str, where: str) -> None:
        """Pause before a unit that would end past the budget; a call's first unit always
        runs, so that every call makes progress however small its budget."""
        if self.stop_after is None or self.units == 0:
            return
        elapsed = time.monotonic() - self.t_start
        if elapsed + self.state.estimate(kind) > self.stop_after:
            raise _Pause(where)

    def _record(self, r: RungResult, seconds: float) -> None:
        self.done.append(r)
        _print_result(r, seconds)
        if self.state is not None:
            self.state.record(r, seconds)
        if r.status == "fail":
            self.failed = r

    def walk(self) -> None:
        for item in _rungs(self.phase, self.quick, self.device):
            if isinstance(item, PassPart):
                self._pass(item)
                continue
            part = item if isinstance(item, Part) else Part(None, None, item)
            if self.failed is not None:
                self.skipped.append(part.id or "?")
                continue
            if part.id is not None and part.id in self.earlier:
                _print_result(self.earlier[part.id], 0.0, earlier=True)
                continue
            self._check_budget(part.id or "", f"before rung {part.id}")
            t0 = time.monotonic()
            r = part.run()
            seconds = time.monotonic() - t0
            self.units += 1
            if part.id is not None:
                r.part = part.id
            if part.title is not None:
                r.name = part.title
            self._record(r, seconds)
            if self.state is not None:
                self.state.unit_time(r.label, seconds)
                if self._persist():
                    self.state.save()

    def _pass(self, item: PassPart) -> None:
        todo = [i for i in item.ids if i not in self.earlier]
        for i in item.ids:
            if i in self.earlier:
                _print_result(self.earlier[i], 0.0, earlier=True)
        if self.failed is not None:
            self.skipped += todo
            return
        if not todo:
            return
        state = self.state
        saved = state.load_pass() if state is not None else None
        if state is not None and saved is None and state.data["pass"]:
            self._forget_pass_results()  # its tensors are gone: the pass restarts
        reference = _reference(self.quick, self.device)
        backend, wrap = _model_backend(self.phase, self.quick)
        if saved is not None:
            p = TrajectoryPass.restore(reference, backend, wrap, *saved, log=_log,
                                       devices=self.devices)
            print(f"  rungs 5-7: the trajectory pass continues at {p.where()}", flush=True)
        else:
            p = TrajectoryPass(reference, backend, wrap, PASS_RUNGS, log=_log,
                               devices=self.devices)
        if self.devices is not None:
            print(f"  rungs 5-7: reference on {self.devices[0]}, adversary on "
                  f"{self.devices[1]}, model on {self.devices[2]}, side by side", flush=True)
        try:
            self._advance(p, item)
        finally:
            p.close()
        if state is not None:
            state.drop_pass()

    def _advance(self, p: TrajectoryPass, item: PassPart) -> None:
        state = self.state
        while not p.finished:
            try:
                self._check_budget("pass-block", f"in the trajectory pass at {p.where()}")
            except _Pause:
                state.save_pass(*p.state())
                raise
            t0 = time.monotonic()
            ended = p.advance()
            self.units += 1
            if state is not None:
                state.unit_time("pass-block", time.monotonic() - t0)
            for r in ended:
                r.part = str(r.rung)
                self._record(r, p.seconds(r.rung))
                if r.status == "fail":
                    break
            if self.failed is not None:
                self.skipped += [i for i in item.ids if i not in {r.label for r in self.done}]
                break
            if state is not None and p.block == 0 and not p.finished:
                state.save_pass(*p.state())  # every step: a killed call loses one step at most

    def _forget_pass_results(self) -> None:
        ids = set(PassPart.ids)
        self.done = [r for r in self.done if r.label not in ids]
        self.earlier = {r.label: r for r in self.done}
        self.state.data["done"] = [d for d in self.state.data["done"] if d["part"] not in ids]
        self.state.drop_pass()


def _check_devices(devices, device: str) -> list[str] | None:
    """--devices: three devices of this machine's kind (repeats allowed), or None."""
    if devices is None:
        return None
    devices = [d.strip() for d in devices]
    if len(devices) != 3:
        raise WorkbenchError(f"--devices {','.join(devices)}: name three (the reference, the "
                             "adversary, the model under test), e.g. cuda:1,cuda:2,cuda:0")
    for d in devices:
        try:
            t = torch.device(d)
        except RuntimeError:
            raise WorkbenchError(f"--devices: {d!r} is not a device") from None
        if t.type != device:
            raise WorkbenchError(f"--devices: {d} is not a {device} device (this ladder runs "
                                 f"on {device})")
        if t.type == "cuda" and (t.index or 0) >= torch.cuda.device_count():
            raise WorkbenchError(f"--devices: {d}, but {torch.cuda.device_count()} CUDA GPUs "
                                 "are visible")
    return devices


def run_ladder(phase: str | None = None, quick: bool | None = None, write: bool = True,
               resume: str | Path | None = None, stop_after: float | None = None,
               devices=None) -> int:
    """Run (or continue, ``resume``) the ladder of ``phase``: 0 when it passes or is
    incomplete, 1 when a part fails, PAUSED when it stopped at ``stop_after`` seconds;
    WorkbenchError when no part can run at all or the state refuses. ``devices``: the
    trajectory pass's chains side by side (validators.trajectory_pass), this call only."""
    t_start = time.monotonic()
    if stop_after is not None and not stop_after > 0:
        raise WorkbenchError(f"--stop-after {stop_after}: give a positive number of seconds")
    if phase is not None and phase not in PHASES:
        raise WorkbenchError(f"unknown phase {phase!r}; choose from {', '.join(PHASES)}")
    device = "cuda" if gpu_info() is not None else "cpu"
    devices = _check_devices(devices, device)
    state = None
    if resume is not None:
        finished = finished_summary(Path(resume), phase)
        if finished is not None:
            phase, summary = finished
            print(f"ladder {phase} in {resume} finished earlier: "
                  f"{summary['verdict'].upper()}, highest rung passed "
                  f"{summary['headline']['highest_rung_passed']} (ladder-{phase}.json); "
                  "nothing to resume")
            return 1 if summary["verdict"] in ("fail", "partial") else 0
        state = LadderState.resume(Path(resume), phase, quick, device)
        phase, quick = state.phase, state.quick
        state.acquire()
    else:
        phase, quick = phase or "numerics", bool(quick)
        if write:
            state = LadderState.fresh(R.results_dir(), phase, quick, device)
        elif stop_after is not None:
            raise WorkbenchError("--stop-after needs the ladder's state on disk (write=True)")
    print(f"ladder {phase}: device {device}{' (quick)' if quick else ''}"
          + (f", budget {stop_after:g} s" if stop_after is not None else ""), flush=True)
    if state is not None:
        if resume is not None:
            if state.data["status"] != "paused":  # "running" or "interrupted"
                print(f"  the last call ended without pausing ({state.data['status']}): "
                      "continuing from its last saved point", flush=True)
            n, calls = len(state.data["done"]), len(state.calls())
            print(f"  resuming {state.dir}: {n} part{'s' * (n != 1)} done in {calls} earlier "
                  f"call{'s' * (calls != 1)}", flush=True)
        state.begin_call()
        if devices is not None:
            state.calls()[-1]["devices"] = devices
    walk = _Ladder(phase, quick, device, state, stop_after, t_start, devices)
    try:
        walk.walk()
    except _Pause as p:
        state.end_call(f"paused {p}", "paused")
        state.save()
        state.release()
        _REFERENCE.clear()
        again = f"wb ladder --phase {phase} --resume {state.run_dir}"
        print(f"ladder {phase}: paused {p} after {time.monotonic() - t_start:.0f} s of a "
              f"{stop_after:g} s budget; resume with: {again} --stop-after {stop_after:g}",
              flush=True)
        return PAUSED
    except BaseException as e:  # the state on disk is consistent as of its last save
        if state is not None:
            if walk._persist():
                state.end_call(f"error: {type(e).__name__}", "interrupted")
                state.save()
            state.release()
        raise
    finally:
        _REFERENCE.clear()  # the reference model's packed weights
    try:
        return _finish(phase, quick, device, walk, state, write)
    finally:
        if state is not None:
            state.release()


def _finish(phase, quick, device, walk: _Ladder, state, write: bool) -> int:
    done = walk.done
    not_run = [f"rung {r.label} ({r.name}): {r.detail}" for r in done if r.status == "not-run"]
    if all(r.status == "not-run" for r in done):
        raise WorkbenchError(f"ladder {phase} ran no rung: "
                             f"{'; '.join(_grouped(done)) or 'none defined'}")
    more = []  # not-run notes beyond the parts' own
    if walk.failed is not None and walk.skipped:
        more.append(f"rung {', '.join(walk.skipped)}: not run, the ladder stopped at rung "
                    f"{walk.failed.label}'s failure")
    has_2a = phase != "frame" and not PENDING[phase]
    if walk.failed is None and has_2a:
        more += _device_steps_not_run(device)
    not_run += more
    gates = {f"rung{r.label}:{r.name}": R.gate(r.status == "pass", f"{r.status}: {r.detail}")
             for r in done if r.status != "not-run"}
    verdict = R.expected_verdict(gates, not_run)
    highest = highest_rung_passed(done)
    why = why_not_higher(done, highest)
    checksum = next((r.headline["trajectory_checksum"] for r in done
                     if "trajectory_checksum" in r.headline), None)
    headline = {"highest_rung_passed": highest, "trajectory_checksum": checksum,
                "status": verdict, "device": device}
    failed = verdict in ("fail", "partial")
    seconds = state.seconds() if state is not None else {}
    if state is not None:
        state.end_call("finished", "finished")
    calls = state.calls() if state is not None else []
    if write:
        summary = R.make_summary(
            f"ladder-{phase}", parameters={"phase": phase, "quick": quick},
            measurements=[{**r.to_json(), "seconds": seconds.get(r.label)} for r in done],
            headline=headline, gates=gates, not_run=not_run,
            notes={"highest_rung_why": why, "calls": calls} if calls else
            {"highest_rung_why": why})
        path = R.write(summary, state.run_dir if state is not None else None)
        md = path.with_suffix(".md")
        md.write_text(markdown_report(phase, quick, headline, done, not_run, why, calls))
        print(f"wrote {path} and {md.name}")
        if state is not None and state.dir.exists():
            state.remove()
    print(f"ladder {phase}: {verdict.upper()}, highest rung passed {highest}"
          + (f" ({why})" if why else "")
          + (f"; not run: {'; '.join(_grouped(done) + more)}" if not_run else ""), flush=True)
    if failed:
        where = walk.failed.label if walk.failed else done[-1].label
        print(f"ladder {phase}: FAILED at rung {where}", file=sys.stderr)
        return 1
    return 0


def markdown_report(phase: str, quick: bool, headline: dict, done: list[RungResult],
                    not_run: list[str], why: str = "", calls: list | None = None) -> str:
    """The short human-readable report written beside ladder-<phase>.json."""
    lines = [f"# Ladder {phase}{' (quick)' if quick else ''}: {headline['status']}", "",
             f"- highest rung passed: {headline['highest_rung_passed']}"
             + (f" ({why})" if why else ""),
             f"- trajectory checksum: {headline['trajectory_checksum'] or 'not computed'}",
             f"- device: {headline['device']}"]
    if calls and len(calls) > 1:
        lines.append(f"- completed over {len(calls)} calls: "
                     + ", ".join(f"{c['seconds']} s ({c['ended']})" for c in calls))
    lines += ["", "| rung | name | status | detail |", "|---|---|---|---|"]
    lines += [f"| {r.label} | {r.name} | {r.status} | {r.detail.replace('|', '/')} |"
              for r in done]
    if not_run:
        lines += ["", "Not run:", *[f"- {n}" for n in not_run]]
    return "\n".join(lines) + "\n"
