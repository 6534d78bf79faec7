"""The ids kernels synchronise by: one definition each, usable as compile-time constants.

:class:`Barrier` names what a bounded wait (:mod:`device.waits`) waits on. Its value is the
code the wait's timeout report writes into the diagnostics mailbox (slot 1), so the host can
say which barrier stalled; the mbarrier rings of the GEMM and the depth frame and the frame's
waits between CTAs each have one.

:class:`NamedBarrier` holds the hardware named-barrier ids of ``bar.sync id, threads`` (16 per
CTA; 0 is ``__syncthreads``). A kernel gives each group of threads that syncs on its own an id
of its own; the GEMM shell checks that its consumer and epilogue do not share one.

Both are IntEnums: a member is an int wherever the DSL takes a constant (``Constexpr[int]``
parameters, ``Int32(code)``), so the PTX holds the same immediates a bare integer gave.
"""
from __future__ import annotations

from enum import IntEnum


class Barrier(IntEnum):
    """What a bounded wait waits on, and the mailbox code of its timeout report."""

    def __new__(cls, code: int, meaning: str):
        member = int.__new__(cls, code)
        member._value_ = code
        member.meaning = meaning
        return member

    # mbarrier rings (device.waits.wait_parity; the report's fields: stage, parity, CTA, thread)
    FULL = 0, "consumer waiting for the producer's stage"
    EMPTY = 1, "producer waiting for consumers to release a stage"
    ACT_FULL = 2, "consumer waiting for the activation stage's f16 tile"
    ACT_EMPTY = 3, "activation stage waiting for consumers to release a tile"
    PAGE_FULL = 4, "a frame task waiting for its weight page; 'stage' is the page"
    PAGE_EMPTY = 5, "the frame's loader waiting for a task to release a page"
    # a K-split cluster's DSMEM fixup (epilogues.tile_store.ClusterSplitStore;
    # "stage" is the CTA's cluster rank, its K split)
    FIX_FULL = 6, "a K split waiting for its peers' partials in its shared memory"
    FIX_FREE = 7, "a K split waiting for its peers to have read its previous partials"
    # waits between CTAs (the depth frame; device.waits.WAIT_FIELDS names their fields)
    COUNTER = 16, "a global counter reaching its expected count"
    PARTIAL = 17, "the pair CTA's split-K partial"
    SLOT = 18, "the pair CTA freeing its combine slot"


class NamedBarrier(IntEnum):
    """Hardware named-barrier ids (``bar.sync``) of a CTA."""

    SYNC_THREADS = 0  # the whole CTA (__syncthreads); reserved
    CONSUMERS = 1  # the consumer warpgroups among themselves (GEMM: f16 tiles written; frame)
    EPILOGUE = 2  # the GEMM consumers' epilogue (split-K: partials stored, the last CTA known)
