"""Bounded waits for warp-specialised kernels: no spin-wait may hang the GPU.

Every wait on an mbarrier goes through :func:`wait_parity`: ``mbarrier.try_wait.parity`` (which
already suspends the thread for a hardware-chosen time) in a loop that reads ``%globaltimer``.
After ``TIMEOUT_NS`` it writes what it was waiting for — barrier id, stage, parity, CTA, thread —
into the diagnostics mailbox (pinned host memory, so it survives the dead context) and traps.
The host turns the mailbox into a message (:func:`synchronize` below). What a wait waits on is a
:class:`device.barriers.Barrier`: its value is the report's code.

No ``printf`` here: a call in the kernel makes ptxas serialise every wgmma (each one followed by
``WARPGROUP.DEPBAR``), which halves the GEMM's speed.

Phase convention (CUTLASS's): each role counts its uses of a ring; use ``n`` is stage ``n % S``
with parity ``(n // S) & 1``. A consumer waits on "full" for that parity; a producer waits on
"empty" for the opposite parity, which a fresh barrier satisfies at once.
"""
from __future__ import annotations

import torch

from device.barriers import Barrier
from device.ptx import ld_acquire_gpu, try_wait_acquire_cluster
from device.runtime import cute_modules
from workbench import WorkbenchError

cutlass, cute = cute_modules()
from cutlass import Int32, Int64  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402
from cutlass.cutlass_dsl import dsl_user_op  # noqa: E402

TIMEOUT_NS = 2_000_000_000  # 2 s: far beyond any legitimate wait in these kernels
CLAIM_GRACE_NS = 200_000_000  # a losing timed-out thread waits this long for the winner's trap


@dsl_user_op
def trap(*, loc=None, ip=None) -> None:
    llvm.inline_asm(None, [], "trap;", "", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


@cute.jit
def wait_parity(mbar: cute.Pointer, parity: Int32, barrier_id: cutlass.Constexpr[int],
                stage: Int32, mailbox: cute.Tensor, claim=None,
                timeout_ns: cutlass.Constexpr[int] = TIMEOUT_NS,
                cluster: cutlass.Constexpr[bool] = False):
    """Wait until the mbarrier at ``mbar`` completes the phase with ``parity``, or report
    (``barrier_id``: a :class:`Barrier`; stage, parity, CTA, thread) in ``mailbox`` and trap.
    ``claim``: the launch's report claim (:func:`_claim_report_and_trap`), for kernels where
    many waits can time out together. ``cluster``: acquire at cluster scope (a barrier that a
    peer CTA arrives on after writing this CTA's shared memory)."""
    done = _try_wait(mbar, parity, cluster)
    if not done:
        start = cute.arch.globaltimer()
        while not done:
            done = _try_wait(mbar, parity, cluster)
            if not done:
                if cute.arch.globaltimer() - start > Int64(timeout_ns):
                    tid, _, _ = cute.arch.thread_idx()
                    bid, _, _ = cute.arch.block_idx()
                    if cutlass.const_expr(claim is None):
                        _report_and_trap(mailbox, barrier_id, stage, parity, bid, tid)
                    else:
                        _claim_report_and_trap(claim, mailbox, barrier_id, stage, parity, bid,
                                               tid, Int32(0))


def _try_wait(mbar, parity, cluster: bool):
    if cluster:
        return try_wait_acquire_cluster(mbar, parity) != 0
    return cute.arch.mbarrier_try_wait(mbar, parity)


MAILBOX_MAGIC = 0x7130E007
# the waits between CTAs (the depth frame): the report's slots after the code
WAIT_FIELDS = {Barrier.COUNTER: ("counter", "expected", "cta", "task", "seen"),
               Barrier.PARTIAL: ("slot", "parity", "cta", "task", "split"),
               Barrier.SLOT: ("slot", "parity", "cta", "task", "split")}
# the mbarrier rings' reports name the barrier: "full (consumer waiting for ...)"
BARRIER_NAMES = {b: f"{b.name.lower()} ({b.meaning})" for b in Barrier if b not in WAIT_FIELDS}


def _report_and_trap(mailbox: cute.Tensor, code: int, *fields):
    """Write the report (code, then its fields) into the mailbox, publish it, trap. Called
    while tracing a timed-out branch (straight-line code: no dynamic control flow here)."""
    for i, v in enumerate((Int32(code), *fields)):
        mailbox[i + 1] = v
    cute.arch.fence_acq_rel_sys()
    mailbox[0] = Int32(MAILBOX_MAGIC)
    cute.arch.fence_acq_rel_sys()
    trap()


@cute.jit
def _claim_report_and_trap(claim: cute.Tensor, mailbox: cute.Tensor,
                           code: cutlass.Constexpr[int], a: Int32, b: Int32, c: Int32, d: Int32,
                           e: Int32):
    """The first timed-out thread of the launch (``claim[0]``, zeroed by the host) writes the
    report and traps; the others wait (bounded: CLAIM_GRACE_NS) for that trap, which ends the
    grid, so their own trap can neither cut the report short nor mix fields into it."""
    if cute.arch.atomic_add(claim.iterator.llvm_ptr, Int32(1)) == 0:
        _report_and_trap(mailbox, code, a, b, c, d, e)
    start = cute.arch.globaltimer()
    while cute.arch.globaltimer() - start < Int64(CLAIM_GRACE_NS):
        pass
    trap()


@cute.jit
def wait_counter(counters: cute.Tensor, cid: Int32, expect: Int32, task: Int32,
                 mailbox: cute.Tensor, claim: cute.Tensor,
                 timeout_ns: cutlass.Constexpr[int] = TIMEOUT_NS):
    """Spin (``ld.acquire.gpu``) until global counter ``cid`` reaches ``expect``; after
    ``timeout_ns`` report (counter, expected, CTA, task, last value seen) and trap. A kernel
    whose in-CTA barrier waits sit behind this wait passes a shorter bound, so that a stall is
    reported by the counter that caused it, not by a barrier downstream of it."""
    seen = ld_acquire_gpu(counters.iterator + cid)
    if seen < expect:
        start = cute.arch.globaltimer()
        while seen < expect:
            seen = ld_acquire_gpu(counters.iterator + cid)
            if seen < expect:
                if cute.arch.globaltimer() - start > Int64(timeout_ns):
                    bid, _, _ = cute.arch.block_idx()
                    _claim_report_and_trap(claim, mailbox, Barrier.COUNTER, cid, expect, bid,
                                           task, seen)


@cute.jit
def wait_cluster_parity(mbar: cute.Pointer, parity: Int32, code: cutlass.Constexpr[int],
                        slot: Int32, task: Int32, split: Int32, mailbox: cute.Tensor,
                        claim: cute.Tensor):
    """Wait (acquire at cluster scope) for this CTA's mbarrier phase of ``parity``, which the
    pair CTA arrives on; after TIMEOUT_NS report (slot, parity, CTA, task, split index), trap.
    ``code``: Barrier.PARTIAL or Barrier.SLOT."""
    done = try_wait_acquire_cluster(mbar, parity)
    if done == 0:
        start = cute.arch.globaltimer()
        while done == 0:
            done = try_wait_acquire_cluster(mbar, parity)
            if done == 0:
                if cute.arch.globaltimer() - start > Int64(TIMEOUT_NS):
                    bid, _, _ = cute.arch.block_idx()
                    _claim_report_and_trap(claim, mailbox, code, slot, parity, bid, task,
                                           split)


def ring_position(count: Int32, stages: int):
    """(stage index, phase parity) of the ``count``-th use of a ring of ``stages`` buffers."""
    return count % stages, (count // stages) & 1


@cute.jit
def acquire_stage(count: Int32, stages: cutlass.Constexpr[int], empty, full, tx_bytes,
                  barrier_id: cutlass.Constexpr[int], mailbox: cute.Tensor):
    """A producer's ``count``-th fill of a ring of ``stages``: wait (bounded) until its slot's
    ``empty`` barrier says the readers released it, then one elected thread arrives on its
    ``full`` barrier announcing the ``tx_bytes`` the copies will deliver. Returns (stage, the
    full barrier) for the copies. ``barrier_id``: the empty barrier's Barrier code."""
    s, ph = ring_position(count, stages)
    wait_parity(empty + s, ph ^ 1, barrier_id, s, mailbox)
    bar = full + s
    with cute.arch.elect_one():
        cute.arch.mbarrier_arrive_and_expect_tx(bar, tx_bytes)
    return s, bar


@cute.jit
def count_split_arrival(mCount: cute.Tensor, tile_id: Int32, splits,
                        flag: cute.Tensor):
    """Split-K arrival, by one thread per CTA after the CTA's partials are stored and fenced:
    bump the tile's counter (``atom.add.acq_rel.gpu``); the last of ``splits`` CTAs (an int, or
    the tile's Int32 segment count under stream-K) re-arms it to
    0 for the next launch. ``flag[0]`` (shared with the CTA) becomes 1 in the last CTA, else 0.
    Nobody waits on anybody, so this cannot deadlock."""
    arrived = cute.arch.atomic_add((mCount.iterator + tile_id).llvm_ptr, Int32(1),
                                   sem="acq_rel", scope="gpu")
    last = Int32(0)
    if arrived == splits - 1:
        last = Int32(1)
        mCount[tile_id] = Int32(0)  # re-arm for the next launch
    flag[0] = last


# ---- diagnostics mailbox: how a trapped kernel says why ----------------------------------------
_MAILBOX = None


def diagnostics_mailbox():
    """Pinned host int32[8] that kernels write before trapping (readable after the context dies).
    Slot 0 holds the magic value when a report is present; see wait_parity."""
    global _MAILBOX
    if _MAILBOX is None:
        _MAILBOX = torch.zeros(8, dtype=torch.int32, pin_memory=True)
    return _MAILBOX


def mailbox_report(counter_names=None) -> str | None:
    """The trapped kernel's report, or None; ``counter_names`` name a counter wait's counter."""
    if _MAILBOX is None or int(_MAILBOX[0]) != MAILBOX_MAGIC:
        return None
    code, *vals = (int(v) for v in _MAILBOX[1:6 + 1])
    if code == Barrier.COUNTER:
        cid, expect, cta, task, seen = vals
        name = counter_names[cid] if counter_names and 0 <= cid < len(counter_names) else cid
        return (f"kernel timed out in CTA {cta}, task {task}, waiting on counter "
                f"{name!r} (id {cid}) for {expect} signals; it holds {seen}")
    if code in (Barrier.PARTIAL, Barrier.SLOT):
        slot, parity, cta, task, split = vals
        what = ("the pair CTA's partial" if code == Barrier.PARTIAL
                else "the pair CTA to free its combine slot")
        return (f"kernel timed out after 2 s in CTA {cta}, task {task} (split tile {split}), "
                f"waiting for {what} (slot {slot}, parity {parity})")
    stage, parity, cta, tid = vals[:4]
    return (f"kernel timed out after 2 s waiting on the {BARRIER_NAMES.get(code, code)} barrier "
            f"(stage {stage}, parity {parity}) in CTA {cta}, thread {tid}")


def synchronize(counter_names=None):
    """torch.cuda.synchronize(), turning a trapped kernel's mailbox into the error message."""
    try:
        torch.cuda.synchronize()
    except RuntimeError as e:
        report = mailbox_report(counter_names)
        if report:
            raise WorkbenchError(report) from e
        raise
