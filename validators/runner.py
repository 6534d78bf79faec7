"""The validator ladder: rungs in order, stopping at the first that fails or cannot run.

The 8 rungs of the NVFP4 design (seeds/nvfp4-streaming-design.md), per phase:
 1 adversarial cases  2 randomized tiles / GEMMs  3 real projections at blocks 0, 24, 49
 4 complete block  5 all 50 blocks of a step  6 two-step trajectory  7 12-step checksum
 8 Nsight recapture and peak memory.
Rungs whose code does not exist yet say so and stop the ladder (a later rung is never claimed
over an unrun earlier one). Writes results/ladder-<phase>.json.
"""
from __future__ import annotations

import sys
import time

from validators.base import RungResult

RUNG_TITLES = {
    1: "adversarial", 2: "randomized", 3: "real projections", 4: "complete block",
    5: "all 50 blocks", 6: "two-step trajectory", 7: "12-step checksum", 8: "nsight + memory",
}

# what each phase's rungs exercise beyond the numerics reference, and which issue builds it
PENDING = {
    "numerics": {},
    "p0": {3: "real projections need the H3 model's weights and activations (P3)"},
    "p1": {2: "P1 software A producer not built yet (depends on P0, issue #4)"},
    "p2": {2: "P2 ring producer not built yet (depends on P0/P1)"},
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


def _gtensor(g):
    import torch

    return torch.tensor([float(g)], dtype=torch.float32, device="cuda")


def _on_device(r: RungResult) -> RungResult:
    r.name += " (reference on CUDA)"
    return r


def _on_kernel(r: RungResult) -> RungResult:
    r.name += " (CuTe DSL quantize kernel)"
    return r


def run_ladder(phase: str = "numerics", quick: bool = False, write: bool = True) -> int:
    from workbench import results as R
    from workbench.env import gpu_info

    device = "cuda" if gpu_info() is not None else "cpu"
    print(f"ladder {phase}: device {device}{' (quick)' if quick else ''}", flush=True)
    done: list[RungResult] = []
    status = "pass"
    for step in _rungs(phase, quick, device):
        t0 = time.time()
        r = step()
        done.append(r)
        print(f"  rung {r.rung} {r.name:<40} {r.status.upper():<8} {r.detail} "
              f"({time.time() - t0:.1f}s)", flush=True)
        if r.status != "pass":
            status = r.status
            break
    if device == "cpu":
        print("  GPU rungs (reference on CUDA, CuTe DSL kernels) not run: no CUDA GPU visible")
    gates = {f"rung{r.rung}:{r.name}": R.gate(r.status == "pass", f"{r.status}: {r.detail}")
             for r in done if r.status != "not-run"}
    not_run = [f"rung {r.rung} ({r.name}): {r.detail}" for r in done if r.status == "not-run"]
    headline = {"highest_rung_passed": max([r.rung for r in done if r.status == "pass"],
                                           default=0),
                "status": status, "device": device}
    if write:
        summary = R.make_summary(
            f"ladder-{phase}", parameters={"phase": phase, "quick": quick},
            measurements=[{"rung": r.rung, "name": r.name, "status": r.status,
                           "detail": r.detail, "elements": r.elements, "checks": r.checks}
                          for r in done],
            headline=headline, gates=gates,
            notes={"not_run": not_run} if not_run else None)
        path = R.write(summary)
        print(f"wrote {path}")
    if status == "fail":
        print(f"ladder {phase}: FAILED at rung {done[-1].rung}", file=sys.stderr)
        return 1
    return 0
