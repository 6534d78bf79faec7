"""Rungs 5, 6 and 7 as one free-running pass that can stop between any two blocks.

The reference, the legal adversary (rung 4) and the backend under test (behind its GemmAudit)
advance together, block by block, through the sampler's steps from the seed's noise:

* rung 5 (all blocks of a step): at step 0 every block's output and the velocity against the
  reference's by rung 4's derived tolerance; every GEMM output of the step within the bound;
* rung 6 (two-step trajectory): the latents after steps 0 and 1, and the GEMM outputs of both;
* rung 7 (12-step checksum): the latent after every step, every GEMM output, and the final
  latent's checksum (the ladder's headline) against the reference's.

Each is the rung it is when run alone: the same models, the same audit, and the same draws of
the adversary (call n of each of its linears is step n either way), so one pass of cfg.steps
steps yields all three where separate runs took 1 + 2 + cfg.steps (12 steps instead of 15 at
full size). :meth:`TrajectoryPass.state` is the pass between two blocks: its position,
counters and checks as JSON, plus the tensors it continues from (the three latents at the
step's start and, mid-step, the three activations after the last block);
:meth:`TrajectoryPass.restore` continues from them bit for bit.
"""
from __future__ import annotations

import time

from models.h3 import H3Model, checksum, initial_latent
from models.nvfp4_linear import BackendUnavailable
from validators.base import RungResult, check
from validators.rung3_projections import not_run
from validators.rung4_block import compare, three_ways

NAMES = {5: "all blocks of a step", 6: "two-step trajectory", 7: "12-step checksum"}


def _word(c: dict) -> str:
    return "pass" if c["pass"] else "FAIL"


class TrajectoryPass:
    """The pass over ``rungs`` (a subset of 5, 6, 7); BackendUnavailable when ``backend``
    cannot run here. :meth:`advance` runs one block; :attr:`results` fills as rungs end."""

    def __init__(self, reference: H3Model, backend: str = "reference", wrap=None,
                 rungs=(5, 6, 7), log=print):
        self.reference, self.rungs, self.log = reference, tuple(sorted(rungs)), log
        self.adversary_calls: dict = {}  # (block, role, plain) -> calls: saved with the pass
        model, self.audit, adversary = three_ways(reference, backend, wrap,
                                                  self.adversary_calls)
        self.models = (reference, adversary, model)
        cfg = reference.cfg
        self.span = {5: 1, 6: 2, 7: cfg.steps}  # the steps each rung covers
        self.step = self.block = 0
        latent = initial_latent(cfg, reference.seed).to(reference.device)
        self.latents = [latent] * 3  # reference, adversary, model at the step's start
        self.x = None  # their activations after block self.block - 1 (None at block 0)
        self.checks: dict = {r: {} for r in self.rungs}
        self.results: dict = {}  # rung -> RungResult, once its last step is done
        self.elapsed = 0.0  # wall seconds of advance() so far, over every call
        self.marks: dict = {}  # rung -> self.elapsed when it ended

    @property
    def finished(self) -> bool:
        return len(self.results) == len(self.rungs)

    def where(self) -> str:
        return f"step {self.step} block {self.block}"

    def advance(self) -> list[RungResult]:
        """Run the next block (and the step's end after its last): the rungs that ended."""
        s, b = self.step, self.block
        t0 = time.perf_counter()
        if b == 0:
            self.x = [m.embed(latent, s) for m, latent in zip(self.models, self.latents)]
        self.x = [m.block(b, x) for m, x in zip(self.models, self.x)]
        seconds = time.perf_counter() - t0
        ref, adv, got = self.x
        if s == 0 and 5 in self.rungs:
            label = f"block {b} output"
            c = self.checks[5][label] = compare(label, got, ref, adv)
            self.log(f"    rung 5 block {b}: {_word(c)} ({c['detail']}) [{seconds:.1f} s]")
        else:
            self.log(f"    step {s} block {b}: done [{seconds:.1f} s]")
        self.block += 1
        ended = self._end_step() if self.block == self.reference.cfg.blocks else []
        self.elapsed += time.perf_counter() - t0
        for r in ended:
            self.marks[r.rung] = self.elapsed
        return ended

    def seconds(self, rung: int) -> float:
        """Wall time of ``rung`` alone: from the previous rung's end (or the start) to its own."""
        before = [t for r, t in self.marks.items() if r < rung]
        return self.marks[rung] - max(before, default=0.0)

    def _end_step(self) -> list[RungResult]:
        s, ended = self.step, []
        v = [m.head(x) for m, x in zip(self.models, self.x)]
        if s == 0 and 5 in self.rungs:
            self.checks[5]["velocity"] = compare("velocity", v[2], v[0], v[1])
            ended.append(self._result(5))
        self.latents = [m.sampler_update(latent, vm, s)
                        for m, latent, vm in zip(self.models, self.latents, v)]
        self.x, self.step, self.block = None, s + 1, 0
        latent_rungs = [r for r in (6, 7) if r in self.rungs and s < self.span[r]]
        if latent_rungs:
            label = f"step {s} latent"
            ref, adv, got = self.latents
            c = compare(label, got, ref, adv)
            for r in latent_rungs:
                self.checks[r][label] = c
            self.log(f"    rung {latent_rungs[0]} step {s}: {_word(c)} ({c['detail']})")
        ended += [self._result(r) for r in latent_rungs if s == self.span[r] - 1]
        return ended

    def _result(self, rung: int) -> RungResult:
        checks = dict(self.checks[rung])
        checks.update(self.audit.check())
        headline = {}
        if rung == 7:
            got, want = checksum(self.latents[2]), checksum(self.latents[0])
            same = got["sha256"] == want["sha256"]
            checks["checksum"] = check(
                got["finite"], f"{self.span[7]}-step checksum {got['sha256'][:16]}... "
                f"{'equals' if same else 'differs from'} the reference's {want['sha256'][:16]}"
                f"... (rms {got['rms']:.6g} vs {want['rms']:.6g})")
            headline = {"trajectory_checksum": got["sha256"], "trajectory_summary": got,
                        "reference_checksum": want["sha256"]}
        self.results[rung] = r = RungResult.from_checks(rung, NAMES[rung], checks,
                                                        self.audit.elements, headline)
        return r

    def state(self) -> tuple[dict, dict]:
        """(JSON-able position, counters and checks; CPU tensors to continue from)."""
        meta = {"rungs": list(self.rungs), "step": self.step, "block": self.block,
                "elapsed": self.elapsed, "marks": {str(r): t for r, t in self.marks.items()},
                "checks": {str(r): c for r, c in self.checks.items()},
                "results": {str(r): res.to_json() for r, res in self.results.items()},
                "audit": self.audit.state(),
                "adversary_calls": [[b, role, plain, n] for (b, role, plain), n
                                    in self.adversary_calls.items()]}
        tensors = {"latents": [t.cpu() for t in self.latents]}
        if self.x is not None:
            tensors["x"] = [t.cpu() for t in self.x]
        return meta, tensors

    @classmethod
    def restore(cls, reference: H3Model, backend: str, wrap, meta: dict, tensors: dict,
                log=print) -> TrajectoryPass:
        p = cls(reference, backend, wrap, meta["rungs"], log)
        p.step, p.block, p.elapsed = meta["step"], meta["block"], meta["elapsed"]
        p.marks = {int(r): t for r, t in meta["marks"].items()}
        p.checks = {int(r): c for r, c in meta["checks"].items()}
        p.results = {int(r): RungResult.from_json(d) for r, d in meta["results"].items()}
        p.audit.restore(meta["audit"])
        p.adversary_calls.update({(b, role, plain): n for b, role, plain, n
                                  in meta["adversary_calls"]})
        device = reference.device
        p.latents = [t.to(device) for t in tensors["latents"]]
        p.x = [t.to(device) for t in tensors["x"]] if "x" in tensors else None
        return p


def run_rungs(reference: H3Model, backend: str = "reference", wrap=None, rungs=(5, 6, 7),
              log=print) -> dict:
    """rung -> RungResult for ``rungs`` from one uninterrupted pass (each not-run when the
    backend cannot run here)."""
    try:
        p = TrajectoryPass(reference, backend, wrap, rungs, log)
    except BackendUnavailable as e:
        return {r: not_run(r, NAMES[r], e) for r in rungs}
    while not p.finished:
        p.advance()
    return p.results
