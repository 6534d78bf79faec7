"""Epilogues: what the GEMM shell does with a finished fp32 accumulator tile.

The contract (one signature for every epilogue): an epilogue module is a
:class:`~epilogues.tile_store.TileStore`, built from the consumer's thread count, an *output
rule* and the shell's K ``splits``. The consumer calls, from every one of its threads once the
tile's last wgmma retired::

    epilogue.store(pairs, operands, tile)

``pairs`` is the thread's accumulators as [(m, n, x0, x1)]: the fp32 sums of D[m, n] and
D[m, n + 1] in tile coordinates, n even (the consumer's ``output_pairs`` knows its fragment
layout; swap-AB consumers transpose with a shuffle), ``operands`` an :class:`EpilogueOperands` of
global tensors and ``tile`` an :class:`OutputTile`. Epilogues and rules are frozen dataclasses
(the DSL then treats them as read-only inside the consumer's tile loop). The store owns the split-K reduction (fixed order); the output
rule turns two fp32 sums of one row into one 32-bit word of two bf16 (``pair``) and names the
extra operands it reads (``operands``: a subset of ("gate", "residual")), which the torch entry
checks and passes. Rules: :class:`~epilogues.alpha_bf16.AlphaBf16` (D = RN_bf16(alpha·acc)) and
:class:`~epilogues.gate_residual.GateResidualBf16` (P4, the exact gated residual add).
Epilogues sync the consumer's threads on a named barrier of their own (NamedBarrier.EPILOGUE,
split-K only; the shell checks the thread count and that the consumer does not use that id)
and use no shared storage beyond one flag word.
"""
from __future__ import annotations

from typing import NamedTuple


class EpilogueOperands(NamedTuple):
    """Global tensors an epilogue may touch (views built by the shell)."""
    d: object         # uint32 [M, N/2]: D as bf16 column pairs
    alpha: object     # Float32 value gA·gB
    work: object      # fp32 [splits·tiles·tile_m·tile_n]: split-K partials, fragment order
    count: object     # int32 [tiles]: split-K arrival counters (re-armed to 0)
    flag: object      # smem pointer: one int32, "this CTA reduces the tile"
    gate: object      # uint32 [N/2]: a bf16 per-column gate, as pairs (P4)
    residual: object  # uint32 [M, N/2]: the bf16 residual, as pairs (P4; may alias d)
    # a K-split cluster's DSMEM fixup only (epilogues.tile_store.ClusterSplitStore):
    # (its receive buffer, its fix_full and fix_free mbarriers, the diagnostics mailbox)
    fixup: object = None


class OutputTile(NamedTuple):
    """Where the tile lies: its first row and column, its index and K split, the thread, and
    under stream-K the tile's segment count (``split`` is then this CTA's segment)."""
    m0: object
    n0: object
    tile_id: object
    split: object
    ct: object  # consumer thread index, 0 .. the epilogue's threads - 1
    segments: object = None  # Int32 under stream-K (device.tiles.StreamKSchedule), else None
