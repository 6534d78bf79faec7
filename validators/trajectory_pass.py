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

The three chains (the reference, the adversary, the model with its audit) meet only where they
are compared, so with ``devices`` (three, one a chain, e.g. cuda:1, cuda:2, cuda:0; repeats
allowed) each chain lives on its own device and they advance side by side, a thread each, a
block at a time: a block then takes the slowest chain's time, not the sum. The compared
tensors are copied to the reference's device. Every chain computes what it computes alone
(its weights moved, not made again; nothing in a chain reads another), so the results, checks
and checksum are those of the one-device pass (tests/test_ladder_rungs.py, on CPU threads).
"""
from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from models.h3 import H3Model, checksum, initial_latent
from models.nvfp4_linear import BackendUnavailable
from validators.base import RungResult, check
from validators.rung3_projections import not_run
from validators.rung4_block import compare, three_ways

NAMES = {5: "all blocks of a step", 6: "two-step trajectory", 7: "12-step checksum"}


def _word(c: dict) -> str:
    return "pass" if c["pass"] else "FAIL"


def _devices(devices) -> tuple[torch.device, ...] | None:
    if devices is None:
        return None
    devices = tuple(torch.device(d) for d in devices)
    if len(devices) != 3:
        raise ValueError(f"devices: one for each of the reference, the adversary and the "
                         f"model, got {len(devices)}")
    return devices


class TrajectoryPass:
    """The pass over ``rungs`` (a subset of 5, 6, 7); BackendUnavailable when ``backend``
    cannot run here. :meth:`advance` runs one block; :attr:`results` fills as rungs end.
    ``devices`` (reference, adversary, model): run the three chains there, side by side."""

    def __init__(self, reference: H3Model, backend: str = "reference", wrap=None,
                 rungs=(5, 6, 7), log=print, devices=None):
        self.reference, self.rungs, self.log = reference, tuple(sorted(rungs)), log
        self.devices = _devices(devices)
        self.adversary_calls: dict = {}  # (block, role, plain) -> calls: saved with the pass
        if self.devices is None:
            model, self.audit, adversary = three_ways(reference, backend, wrap,
                                                      self.adversary_calls)
            self.models = (reference, adversary, model)
            self._pool = None
        else:
            ref_dev, adv_dev, model_dev = self.devices
            model, self.audit, adversary = three_ways(reference, backend, wrap,
                                                      self.adversary_calls, adv_dev, model_dev)
            self.models = (reference.derived(device=ref_dev), adversary, model)
            self._pool = ThreadPoolExecutor(3, thread_name_prefix="trajectory-chain")
        cfg = reference.cfg
        self.span = {5: 1, 6: 2, 7: cfg.steps}  # the steps each rung covers
        self.step = self.block = 0
        latent = initial_latent(cfg, reference.seed)
        self.latents = [latent.to(m.device) for m in self.models]  # at the step's start
        self.chain_seconds = [0.0, 0.0, 0.0]  # each chain's time in the last block (devices)
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

    def _each(self, work) -> list:
        """[work(i, model) for each chain]: in turn on one device; with ``devices`` a thread
        each, its device current there (what kernels launch on), waited for (each chain's
        time in chain_seconds)."""
        if self._pool is None:
            return [work(i, m) for i, m in enumerate(self.models)]

        def run(i, m):
            t0 = time.perf_counter()
            cuda = m.device.type == "cuda"
            with torch.cuda.device(m.device) if cuda else contextlib.nullcontext():
                out = work(i, m)
                if cuda:
                    torch.cuda.synchronize()
            self.chain_seconds[i] = time.perf_counter() - t0
            return out

        jobs = [self._pool.submit(run, i, m) for i, m in enumerate(self.models)]
        return [j.result() for j in jobs]  # re-raises a chain's error

    def _compared(self, tensors) -> list:
        """The three chains' tensors on the reference's device, where comparisons run."""
        return [t.to(self.models[0].device) for t in tensors]

    def _chains(self) -> str:
        if self._pool is None:
            return ""
        ref, adv, got = self.chain_seconds
        return f"; reference {ref:.1f}, adversary {adv:.1f}, model {got:.1f} s"

    def close(self) -> None:
        """End the chains' threads (the pass can still save its state)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def advance(self) -> list[RungResult]:
        """Run the next block (and the step's end after its last): the rungs that ended."""
        s, b = self.step, self.block
        t0 = time.perf_counter()
        if b == 0:
            self.x = self._each(lambda i, m: m.embed(self.latents[i], s))
        self.x = self._each(lambda i, m: m.block(b, self.x[i]))
        seconds = time.perf_counter() - t0
        if s == 0 and 5 in self.rungs:
            ref, adv, got = self._compared(self.x)
            label = f"block {b} output"
            c = self.checks[5][label] = compare(label, got, ref, adv)
            self.log(f"    rung 5 block {b}: {_word(c)} ({c['detail']}) [{seconds:.1f} s"
                     f"{self._chains()}]")
        else:
            self.log(f"    step {s} block {b}: done [{seconds:.1f} s{self._chains()}]")
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
        v = self._each(lambda i, m: m.head(self.x[i]))
        if s == 0 and 5 in self.rungs:
            ref, adv, got = self._compared(v)
            self.checks[5]["velocity"] = compare("velocity", got, ref, adv)
            ended.append(self._result(5))
        self.latents = self._each(lambda i, m: m.sampler_update(self.latents[i], v[i], s))
        self.x, self.step, self.block = None, s + 1, 0
        latent_rungs = [r for r in (6, 7) if r in self.rungs and s < self.span[r]]
        if latent_rungs:
            label = f"step {s} latent"
            ref, adv, got = self._compared(self.latents)
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
                log=print, devices=None) -> TrajectoryPass:
        """The pass ``state()`` saved, its tensors on ``devices`` (or the reference's): the
        devices may differ from the saving call's, the values cannot."""
        p = cls(reference, backend, wrap, meta["rungs"], log, devices)
        p.step, p.block, p.elapsed = meta["step"], meta["block"], meta["elapsed"]
        p.marks = {int(r): t for r, t in meta["marks"].items()}
        p.checks = {int(r): c for r, c in meta["checks"].items()}
        p.results = {int(r): RungResult.from_json(d) for r, d in meta["results"].items()}
        p.audit.restore(meta["audit"])
        p.adversary_calls.update({(b, role, plain): n for b, role, plain, n
                                  in meta["adversary_calls"]})
        p.latents = [t.to(m.device) for m, t in zip(p.models, tensors["latents"])]
        p.x = ([t.to(m.device) for m, t in zip(p.models, tensors["x"])] if "x" in tensors
               else None)
        return p


def run_rungs(reference: H3Model, backend: str = "reference", wrap=None, rungs=(5, 6, 7),
              log=print, devices=None) -> dict:
    """rung -> RungResult for ``rungs`` from one uninterrupted pass (each not-run when the
    backend cannot run here); ``devices``: the chains side by side (TrajectoryPass)."""
    try:
        p = TrajectoryPass(reference, backend, wrap, rungs, log, devices)
    except BackendUnavailable as e:
        return {r: not_run(r, NAMES[r], e) for r in rungs}
    try:
        while not p.finished:
            p.advance()
    finally:
        p.close()
    return p.results
