"""The validator ladder: rungs in order, stopping at the first that fails or cannot run.

The 8 rungs of the NVFP4 design (seeds/nvfp4-streaming-design.md), per phase:
 1 adversarial cases  2 randomized tiles / GEMMs  3 real projections at blocks 0, 24, 49
 4 complete block  5 all 50 blocks of a step  6 two-step trajectory  7 12-step checksum
 8 per-kernel profile and peak memory (torch.profiler; an Nsight recapture is a script's job).
Rungs whose code does not exist yet say so and stop the ladder (a later rung is never claimed
over an unrun earlier one). Rungs 3-8 run the synthetic H3 (models.h3; --quick: its scaled
config) on the phase's backend against the reference backend on the same device, printing a
line per block or step; a backend this machine cannot run makes them not-run with the reason,
never pass. A ladder with any part not run (a pending rung, or the CUDA and kernel steps
without a GPU) is "incomplete", never "pass"; one that runs no rung at all is an error.
Writes ladder-<phase>.json into the run folder (workbench.results.results_dir) and a short
Markdown report beside it, ladder-<phase>.md; the headline names highest_rung_passed and
trajectory_checksum (rung 7's sha256, None until it runs).
"""
from __future__ import annotations

import sys
import time

from validators.base import RungResult
from workbench import WorkbenchError

RUNG_TITLES = {
    1: "adversarial", 2: "randomized", 3: "real projections", 4: "complete block",
    5: "all blocks of a step", 6: "two-step trajectory", 7: "12-step checksum",
    8: "profile + peak memory",
}
MODEL_RUNGS = {3: "rung3_projections", 4: "rung4_block", 5: "rung5_step", 6: "rung6_two_steps",
               7: "rung7_checksum", 8: "rung8_profile"}

# what each phase's rungs exercise beyond the numerics reference, and which issue builds it
PENDING = {
    "numerics": {},
    "p0": {},
    # every P1/P2 rung, the adversarial cases first, runs through the phase's producer
    "p1": {1: "P1 software A producer not built yet (depends on P0, issue #4)"},
    "p2": {1: "P2 ring producer not built yet (depends on P0/P1)"},
    "frame": {1: "depth frame kernel not built yet (issues #5, #6)"},
}


def _kernel_quantize():
    """The CuTe DSL quantize kernel when a Hopper GPU is present, else None."""
    try:
        import torch

        if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
            return None
        from kernels.nvfp4.quantize import quantize_nvfp4

        return lambda x, g: quantize_nvfp4(x, g)
    except ImportError:
        return None


def _rungs(phase: str, quick: bool, device: str):
    from validators import rung1_adversarial, rung2_randomized

    pending = PENDING[phase]
    kernel = _kernel_quantize() if device == "cuda" else None
    last = 2 if phase == "numerics" else 8  # rungs 3-8 are whole-model gates for GEMM phases
    for rung in range(1, last + 1):
        if any(r <= rung for r in pending):
            reason = pending.get(rung) or pending[min(pending)]
            yield lambda rung=rung, reason=reason: RungResult(rung, RUNG_TITLES[rung], "not-run",
                                                              reason)
            return
        if rung == 1:
            yield lambda: rung1_adversarial.run(quick=quick)
            if device == "cuda":
                yield lambda: _on_device(rung1_adversarial.run(quick=quick, device="cuda"))
                if kernel is not None:
                    yield lambda: _on_kernel(rung1_adversarial.run(
                        quick=quick, device="cuda",
                        quantize=lambda x, g: kernel(x, _gtensor(g))))
        elif rung == 2:
            yield lambda: rung2_randomized.run(quick=quick, device=device, kernel=kernel)
            if phase == "p0":
                from validators import rung2_p0_gemm

                yield lambda: rung2_p0_gemm.run(quick=quick)
        else:
            reason = _backend_unavailable(phase)
            if reason:
                yield lambda rung=rung, reason=reason: RungResult(
                    rung, RUNG_TITLES[rung], "not-run", reason)
                return
            yield lambda rung=rung: _model_rung(rung, phase, quick, device)


def _backend_unavailable(backend: str) -> str | None:
    from models.nvfp4_linear import BackendUnavailable, resolve_backend

    try:
        resolve_backend(backend, "qkv")
    except BackendUnavailable as e:
        return str(e)
    return None


_REFERENCE: dict = {}  # (quick, device) -> the reference H3 model, shared by rungs 3-8


def _model_rung(rung: int, backend: str, quick: bool, device: str) -> RungResult:
    import importlib

    from models.h3 import FULL, QUICK, H3Model

    key = (quick, device)
    if key not in _REFERENCE:
        _REFERENCE.clear()
        _REFERENCE[key] = H3Model(QUICK if quick else FULL, seed=0, device=device)
    mod = importlib.import_module(f"validators.{MODEL_RUNGS[rung]}")
    return mod.run(_REFERENCE[key], backend=backend, log=lambda line: print(line, flush=True))


def _gtensor(g):
    import torch

    return torch.tensor([float(g)], dtype=torch.float32, device="cuda")


def _on_device(r: RungResult) -> RungResult:
    r.name += " (reference on CUDA)"
    return r


def _on_kernel(r: RungResult) -> RungResult:
    r.name += " (CuTe DSL quantize kernel)"
    return r


def highest_rung_passed(done: list[RungResult]) -> int:
    """The highest rung r such that rungs 1..r all ran and every step of each passed."""
    statuses: dict[int, list[str]] = {}
    for r in done:
        statuses.setdefault(r.rung, []).append(r.status)
    best = 0
    while statuses.get(best + 1) and all(st == "pass" for st in statuses[best + 1]):
        best += 1
    return best


def _device_steps_not_run(device: str) -> list[str]:
    """The steps of rungs 1-2 that need a GPU (reference on CUDA, the CuTe DSL quantize kernel)
    and cannot run here."""
    if device == "cpu":
        return ["rungs 1-2 on CUDA and with the CuTe DSL quantize kernel: no CUDA GPU visible"]
    if _kernel_quantize() is None:
        return ["rungs 1-2 with the CuTe DSL quantize kernel: needs an sm_90 GPU and CuTe DSL"]
    return []


def run_ladder(phase: str = "numerics", quick: bool = False, write: bool = True) -> int:
    """Run the ladder of ``phase``: 0 when it passes or is incomplete, 1 when a rung fails;
    WorkbenchError when no rung can run at all."""
    from workbench import results as R
    from workbench.env import gpu_info

    device = "cuda" if gpu_info() is not None else "cpu"
    print(f"ladder {phase}: device {device}{' (quick)' if quick else ''}", flush=True)
    done: list[RungResult] = []
    for step in _rungs(phase, quick, device):
        t0 = time.time()
        r = step()
        done.append(r)
        print(f"  rung {r.rung} {r.name:<40} {r.status.upper():<8} {r.detail} "
              f"({time.time() - t0:.1f}s)", flush=True)
        if r.status != "pass":
            break
    _REFERENCE.clear()  # the reference model's packed weights
    not_run = [f"rung {r.rung} ({r.name}): {r.detail}" for r in done if r.status == "not-run"]
    if all(r.status == "not-run" for r in done):
        raise WorkbenchError(f"ladder {phase} ran no rung: {'; '.join(not_run) or 'none defined'}")
    if not any(r.status == "fail" for r in done):
        not_run += _device_steps_not_run(device)
    gates = {f"rung{r.rung}:{r.name}": R.gate(r.status == "pass", f"{r.status}: {r.detail}")
             for r in done if r.status != "not-run"}
    verdict = R.expected_verdict(gates, not_run)
    highest = highest_rung_passed(done)
    checksum = next((r.headline["trajectory_checksum"] for r in done
                     if "trajectory_checksum" in r.headline), None)
    headline = {"highest_rung_passed": highest, "trajectory_checksum": checksum,
                "status": verdict, "device": device}
    if write:
        summary = R.make_summary(
            f"ladder-{phase}", parameters={"phase": phase, "quick": quick},
            measurements=[{"rung": r.rung, "name": r.name, "status": r.status,
                           "detail": r.detail, "elements": r.elements, "checks": r.checks,
                           "headline": r.headline} for r in done],
            headline=headline, gates=gates, not_run=not_run)
        path = R.write(summary)
        md = path.with_suffix(".md")
        md.write_text(markdown_report(phase, quick, headline, done, not_run))
        print(f"wrote {path} and {md.name}")
    print(f"ladder {phase}: {verdict.upper()}, highest rung passed {highest}"
          + (f"; not run: {'; '.join(not_run)}" if not_run else ""), flush=True)
    if verdict in ("fail", "partial"):
        print(f"ladder {phase}: FAILED at rung {done[-1].rung}", file=sys.stderr)
        return 1
    return 0


def markdown_report(phase: str, quick: bool, headline: dict, done: list[RungResult],
                    not_run: list[str]) -> str:
    """The short human-readable report written beside ladder-<phase>.json."""
    lines = [f"# Ladder {phase}{' (quick)' if quick else ''}: {headline['status']}", "",
             f"- highest rung passed: {headline['highest_rung_passed']}",
             f"- trajectory checksum: {headline['trajectory_checksum'] or 'not computed'}",
             f"- device: {headline['device']}", "", "| rung | name | status | detail |",
             "|---|---|---|---|"]
    lines += [f"| {r.rung} | {r.name} | {r.status} | {r.detail.replace('|', '/')} |"
              for r in done]
    if not_run:
        lines += ["", "Not run:", *[f"- {n}" for n in not_run]]
    return "\n".join(lines) + "\n"
