"""Rung 3: the real QKV, out, FC1 and FC2 projections at blocks 0, 24 and 49 (first, middle and
last block of a scaled config), on the activations the reference model really feeds them.

Every GEMM output is checked per element: it must lie within the oracle's proven
fp32-accumulation bound of the exact result alpha·S (numerics.gemm_oracle), a rerun must be
bit-identical, and a row slice (rows=(128, M)) must equal the same rows of the whole output.
Where the model fuses its gated residual add into the projection (out, fc2: P4), the fused
output must be bit-identical to numerics.epilogue.gate_residual of the plain output.
Also home of what rungs 4-7 share: the backend-under-test model and the per-GEMM audit.
"""
from __future__ import annotations

import torch

from models.h3 import ROLES, H3Model, initial_latent
from models.nvfp4_linear import Audit, BackendUnavailable
from numerics.epilogue import gate_residual
from validators.base import RungResult, check

NAME = "real projections"


def selected_blocks(blocks: int) -> list[int]:
    """First, middle and last block: 0, 24 and 49 of 50."""
    return sorted({0, (blocks - 1) // 2, blocks - 1})


def model_under_test(reference: H3Model, backend: str, wrap=None) -> H3Model:
    """``reference``'s workload (same packed weights) on ``backend``; BackendUnavailable when
    this machine cannot run it."""
    return reference.derived(backend=backend, wrap=wrap)


def not_run(rung: int, name: str, e: BackendUnavailable) -> RungResult:
    return RungResult(rung, name, "not-run", str(e))


def gemm_check(label: str, y: torch.Tensor, oracle) -> dict:
    """Per element: |y - alpha·S| <= bound, from ``oracle`` = (D, alpha·S, bound) of
    Nvfp4Linear.oracle, or an Nvfp4Linear.audit of y (the bound only where y is not D, the one
    place it can fail: the same verdict and detail)."""
    if isinstance(oracle, Audit):
        d, at = oracle.d, oracle.at
        bad_at = ~((y.flatten()[at].double() - oracle.real).abs() <= oracle.bound)
        n = int(bad_at.sum())
        if n:
            j = int(bad_at.nonzero()[0])  # ``at`` ascends: the first in row-major order
            r, c = divmod(int(at[j]), y.shape[1])
            real_rc, bound_rc = float(oracle.real[j]), float(oracle.bound[j])
    else:
        d, real, bound = oracle
        bad = ~((y.double() - real).abs() <= bound)
        n = int(bad.sum())
        if n:
            r, c = (int(i) for i in bad.nonzero()[0])
            real_rc, bound_rc = float(real[r, c]), float(bound[r, c])
    exact = float((y.view(torch.int16) == d.view(torch.int16)).double().mean())
    if n == 0:
        return check(True, f"{label}: all {y.numel()} within the bound ({exact:.5f} equal to "
                     "the correctly rounded result)")
    return check(False, f"{label}: {n} of {y.numel()} outside the oracle bound, first at "
                 f"element ({r}, {c}): {float(y[r, c])!r} vs exact {real_rc!r} "
                 f"± {bound_rc:.3g}")


def fused_check(label: str, fused: torch.Tensor, y: torch.Tensor, gate, residual) -> dict:
    """P4: the fused gated residual add, bit for bit against the reference order on y."""
    want = gate_residual(y, gate, residual)
    n = int((fused.view(torch.int16) != want.view(torch.int16)).sum())
    return check(n == 0, f"{label}: fused gated residual add bit-identical to the reference "
                 f"order" if n == 0 else f"{label}: {n} of {want.numel()} fused gated residual "
                 "add outputs differ from the reference order")


class GemmAudit:
    """A wrap for the model under test: every linear call is checked per element against the
    reference linear's oracle on the same input; a call with a fused gated residual add is also
    run plain, its GEMM output audited and the fused output checked bit for bit against the
    reference order (fused_check). The first failure per (step, block, role) is kept. Call n of
    a linear is step n (each step calls each linear once)."""

    def __init__(self, reference: H3Model, inner=None):
        self.reference, self.inner = reference, inner
        self.calls: dict = {}
        self.failures: dict = {}
        self.elements = 0

    def __call__(self, block: int, role: str, lin):
        run = self.inner(block, role, lin) if self.inner is not None else lin

        def audited(x, rows=None, *, gate=None, residual=None):
            out = run(x, rows=rows, gate=gate, residual=residual)
            y = out if gate is None else run(x, rows=rows)
            step = self.calls.get((block, role), 0)
            self.calls[(block, role)] = step + 1
            ref = self.reference.linears(block)[role]
            label = f"step {step} block {block} {role}"
            # Σ|ab| only where y is not the correctly rounded output (Nvfp4Linear.audit)
            c = gemm_check(label, y, ref.audit(x, y, rows=rows))
            if c["pass"] and gate is not None:
                c = fused_check(label, out, y, gate, residual)
            self.elements += y.numel()
            if not c["pass"]:
                self.failures.setdefault(label, c)
            return out

        return audited

    def state(self) -> dict:
        """What a resumed audit needs (JSON): the calls per linear, first failures, elements."""
        return {"calls": [[b, r, n] for (b, r), n in self.calls.items()],
                "failures": self.failures, "elements": self.elements}

    def restore(self, state: dict) -> None:
        self.calls = {(b, r): n for b, r, n in state["calls"]}
        self.failures, self.elements = dict(state["failures"]), state["elements"]

    def check(self) -> dict:
        n = sum(self.calls.values())
        if not self.failures:
            return {"gemm outputs": check(True, f"{n} GEMM calls, {self.elements} elements, "
                                          "all within the oracle bound")}
        return dict(self.failures)


def real_inputs(reference: H3Model, blocks: list[int]) -> dict:
    """(block, role) -> (the bf16 input the reference feeds that projection at step 0, its
    gated residual operands: {} or {"gate", "residual"})."""
    seen = {}

    def record(block, role, lin):
        def rec(x, rows=None, **epilogue):
            if block in blocks:
                seen[(block, role)] = (x, epilogue)
            return lin(x, rows=rows, **epilogue)
        return rec

    latent = initial_latent(reference.cfg, reference.seed).to(reference.device)
    reference.derived(wrap=record).denoiser_step(latent, 0)
    return seen


def run(reference: H3Model, backend: str = "reference", wrap=None, log=print) -> RungResult:
    try:
        model = model_under_test(reference, backend, wrap)
    except BackendUnavailable as e:
        return not_run(3, NAME, e)
    blocks = selected_blocks(reference.cfg.blocks)
    inputs = real_inputs(reference, blocks)
    checks, elements = {}, 0
    for b in blocks:
        lins, refs = model.linears(b), reference.linears(b)
        for role in ROLES:
            x, epilogue = inputs[(b, role)]
            y, again = lins[role](x), lins[role](x)
            label = f"block {b} {role}"
            checks[label] = gemm_check(label, y, refs[role].oracle(x))
            if epilogue:
                checks[f"{label} fused"] = fused_check(label, lins[role](x, **epilogue), y,
                                                       **epilogue)
            same = torch.equal(y.view(torch.int16), again.view(torch.int16))
            checks[f"{label} rerun"] = check(same, f"{label}: rerun bit-identical: {same}")
            if x.shape[0] > 128:
                part = lins[role](x, rows=(128, x.shape[0]))
                ok = torch.equal(part.view(torch.int16), y[128:].view(torch.int16))
                checks[f"{label} rows"] = check(ok, f"{label}: rows (128, {x.shape[0]}) equal "
                                                f"the whole output's rows: {ok}")
            elements += y.numel()
        failing = [k for k in checks if k.startswith(f"block {b} ") and not checks[k]["pass"]]
        log(f"    rung 3 block {b}: {'FAIL ' + ', '.join(failing) if failing else 'pass'}")
    return RungResult.from_checks(3, NAME, checks, elements)
