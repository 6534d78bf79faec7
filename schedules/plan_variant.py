"""A/B variants of the fast loop's frame plan (schedules.plan): the study side of it, beside the
plan and apart from it. Only scripts/ (ab_frame.py and the trace / profile / bench scripts) and
tests build a :class:`FrameVariant`; :func:`variant_plan` turns one into the
:class:`schedules.plan.FramePlan` a FastLoop runs (``FastLoop(..., plan=variant_plan(rows,
variant))``). A variant that wins its A/B becomes a table entry of schedules/plan.py; one that
loses leaves the code, and its record stays in the notes.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from schedules.plan import (INPUT_PROJS, MAINLOOPS, PROJECTIONS, TILE_KEYWORDS, FramePlan,
                            frame_plan_with)


@dataclass(frozen=True)
class FrameVariant:
    """The frame's live A/B knobs: per projection a mainloop (``mainloops``; its measured tile
    follows unless ``tiles`` names one) and tile keywords (``tiles``, replacing that
    projection's tile), the row ``parts`` (None: the plan's; () one chain), ``input_proj``
    (None: the plan's), ``pdl``; and diagnostics that change no bits: ``draw_trace`` /
    ``attn_trace`` stamp the draws / attention steps (scripts/trace_frame.py)."""
    mainloops: Mapping = field(default_factory=dict)
    tiles: Mapping = field(default_factory=dict)
    parts: tuple | None = None
    input_proj: str | None = None
    pdl: bool = True
    draw_trace: bool = False
    attn_trace: bool = False

    def __post_init__(self):
        def known(arg: str, names):
            if not isinstance(names, Mapping) or set(names) - set(PROJECTIONS):
                raise ValueError(f"{arg} {names!r}: a dict keyed by projections of "
                                 f"{PROJECTIONS}")

        known("mainloops", self.mainloops)
        bad = {k: v for k, v in self.mainloops.items() if v not in MAINLOOPS}
        if bad:
            raise ValueError(f"mainloops {bad!r}: each one of {MAINLOOPS}")
        known("tiles", self.tiles)
        every = set().union(*TILE_KEYWORDS.values())
        for name, tile in self.tiles.items():
            if not isinstance(tile, Mapping) or set(tile) - every or not all(
                    type(x) is int for x in tile.values()):
                raise ValueError(f"tiles[{name!r}] {tile!r}: a dict of GEMM keywords "
                                 f"({sorted(every)}) to ints, e.g. {{'warps': 8}}")
        if self.input_proj not in (None, *INPUT_PROJS):
            raise ValueError(f"input_proj {self.input_proj!r}: one of {INPUT_PROJS} or None")
        if self.parts is not None and (isinstance(self.parts, (str, int))
                                       or not all(isinstance(r, int) for r in self.parts)):
            raise ValueError(f"parts {self.parts!r}: a tuple of row counts, or None")
        for name in ("pdl", "draw_trace", "attn_trace"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} {getattr(self, name)!r}: True or False")
        freeze = object.__setattr__  # copies, so a caller's later edits reach no plan
        freeze(self, "mainloops", MappingProxyType(dict(self.mainloops)))
        freeze(self, "tiles", MappingProxyType({n: MappingProxyType(dict(t))
                                                for n, t in self.tiles.items()}))
        freeze(self, "parts", None if self.parts is None else tuple(self.parts))


def variant_plan(rows: int, variant: FrameVariant) -> FramePlan:
    """The plan of a ``rows``-row frame with ``variant``'s knobs over the tables' choices
    (``FrameVariant()``: ``frame_plan(rows)``); ValueError for a variant this frame cannot
    run."""
    if not isinstance(variant, FrameVariant):
        raise ValueError(f"variant {variant!r}: a FrameVariant")
    plan = frame_plan_with(rows, parts=variant.parts, mainloops=variant.mainloops,
                           tiles=variant.tiles, input_proj=variant.input_proj)
    return dataclasses.replace(plan, pdl=variant.pdl, draw_trace=variant.draw_trace,
                               attn_trace=variant.attn_trace)
