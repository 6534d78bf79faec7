"""Bounded waits for warp-specialised kernels: no spin-wait may hang the GPU.

Every wait on an mbarrier goes through :func:`wait_parity`: ``mbarrier.try_wait.parity`` (which
already suspends the thread for a hardware-chosen time) in a loop that reads ``%globaltimer``.
After ``TIMEOUT_NS`` it writes what it was waiting for — barrier id, stage, parity, CTA, thread —
into the diagnostics mailbox (pinned host memory, so it survives the dead context) and traps.
The host turns the mailbox into a message (:func:`kernels.device.runtime.synchronize`).

No ``printf`` here: a call in the kernel makes ptxas serialise every wgmma (each one followed by
``WARPGROUP.DEPBAR``), which halves the GEMM's speed.

Phase convention (CUTLASS's): each role counts its uses of a ring; use ``n`` is stage ``n % S``
with parity ``(n // S) & 1``. A consumer waits on "full" for that parity; a producer waits on
"empty" for the opposite parity, which a fresh barrier satisfies at once.
"""
from __future__ import annotations

from workbench import WorkbenchError
from kernels.device.runtime import cute_modules

cutlass, cute = cute_modules()
from cutlass import Int32, Int64  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402
from cutlass.cutlass_dsl import dsl_user_op  # noqa: E402

TIMEOUT_NS = 2_000_000_000  # 2 s: far beyond any legitimate wait in these kernels


@dsl_user_op
def trap(*, loc=None, ip=None) -> None:
    llvm.inline_asm(None, [], "trap;", "", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


@cute.jit
def wait_parity(mbar: cute.Pointer, parity: Int32, barrier_id: cutlass.Constexpr[int],
                stage: Int32, mailbox: cute.Tensor):
    """Wait until the mbarrier at ``mbar`` completes the phase with ``parity``, or report
    (``BARRIER_NAMES[barrier_id]``, stage, parity, CTA, thread) in ``mailbox`` and trap."""
    done = cute.arch.mbarrier_try_wait(mbar, parity)
    if not done:
        start = cute.arch.globaltimer()
        while not done:
            done = cute.arch.mbarrier_try_wait(mbar, parity)
            if not done:
                if cute.arch.globaltimer() - start > Int64(TIMEOUT_NS):
                    tid, _, _ = cute.arch.thread_idx()
                    bid, _, _ = cute.arch.block_idx()
                    for i, v in enumerate((Int32(barrier_id), stage, parity, bid, tid)):
                        mailbox[i + 1] = v
                    cute.arch.fence_acq_rel_sys()
                    mailbox[0] = Int32(MAILBOX_MAGIC)
                    cute.arch.fence_acq_rel_sys()
                    trap()


MAILBOX_MAGIC = 0x7130E007
BARRIER_NAMES = {0: "full (consumer waiting for the producer's stage)",
                 1: "empty (producer waiting for consumers to release a stage)",
                 2: "act_full (consumer waiting for the activation stage's f16 tile)",
                 3: "act_empty (activation stage waiting for consumers to release a tile)"}

def ring_position(count: Int32, stages: int):
    """(stage index, phase parity) of the ``count``-th use of a ring of ``stages`` buffers."""
    return count % stages, (count // stages) & 1


@cute.jit
def count_split_arrival(mCount: cute.Tensor, tile_id: Int32, splits: cutlass.Constexpr[int],
                        flag: cute.Tensor):
    """Split-K arrival, by one thread per CTA after the CTA's partials are stored and fenced:
    bump the tile's counter (``atom.add.acq_rel.gpu``); the last of ``splits`` CTAs re-arms it to
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
    import torch

    if _MAILBOX is None:
        _MAILBOX = torch.zeros(8, dtype=torch.int32, pin_memory=True)
    return _MAILBOX


def mailbox_report() -> str | None:
    if _MAILBOX is None or int(_MAILBOX[0]) != MAILBOX_MAGIC:
        return None
    bar, stage, parity, cta, tid = (int(v) for v in _MAILBOX[1:6])
    return (f"kernel timed out after 2 s waiting on the {BARRIER_NAMES.get(bar, bar)} barrier "
            f"(stage {stage}, parity {parity}) in CTA {cta}, thread {tid}")


def synchronize():
    """torch.cuda.synchronize(), turning a trapped kernel's mailbox into the error message."""
    import torch

    try:
        torch.cuda.synchronize()
    except RuntimeError as e:
        report = mailbox_report()
        if report:
            raise WorkbenchError(report) from e
        raise
