"""The plan module: every tuning table of the workbench, as data, each entry citing the notes
version whose H200 measurement chose it. Three sections: the depth loop's frame plan
(models.fast_loop), the skinny projections' default tiles (kernels/depth/gemm_skinny.py) and the
P0 GEMM's default config (kernels/nvfp4/gemm.py). This module imports nothing of the project.

The depth loop's frame plan: what models.fast_loop.FastLoop runs with at each row count.

``frame_plan(rows)`` -> :class:`FramePlan`: the kernel rows (the fused GEMVs up to
``GEMV_MAX_ROWS`` rows, more rows padded to a multiple of 16 for the tensor-core projections),
the row parts (two 64-row chains at 128 kernel rows), each projection's mainloop and tile, the
input projection and where the draws' Gumbel terms are drawn. Each table entry below cites the
notes/fast-loop.md version whose same-run frame A/B chose it (the figures are there); what no
table names is the kernel's own default (the skinny GEMM's per-shape defaults, section two).

An A/B changes the plan only through a FrameVariant, which lives beside this module
(schedules/plan_variant.py: its knobs go through :func:`frame_plan_with`) and which only
scripts/ and tests build; ``frame_plan(rows)`` takes none. A variant that wins its A/B becomes a
table entry here; one that loses leaves the code, and its record stays in the notes. This module
imports neither models/ nor kernels/.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

PROJECTIONS = ("qkv", "wo", "gate_up", "down", "heads")
# kernels/depth/gemm_skinny.py (mma.sync), gemm_skinny_wgmma.py (shared-memory wgmma: its input
# chunk-major), gemm_skinny_rwgmma.py (the weights in registers: "rwgmma" a chunk-major input
# by bulk copies, "rwgmma_tma" a row-major input by TMA)
MAINLOOPS = ("sync", "wgmma", "rwgmma", "rwgmma_tma")
# the tile keywords each mainloop's wrapper takes (the register-A wgmma takes gemm_skinny's)
_SKINNY_TILE = ("warps", "splits", "m_split", "a_stages")
TILE_KEYWORDS = {"sync": _SKINNY_TILE, "rwgmma": _SKINNY_TILE, "rwgmma_tma": _SKINNY_TILE,
                 "wgmma": ("warps", "splits", "m_split", "stages")}
INPUT_PROJS = ("torch", "skinny")  # cuBLAS then the bias add, or the skinny GEMM (bias residual)
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)  # one captured frame per bucket (v1; 128 rows: v8c)

GEMV_MAX_ROWS = 2  # v8d: the GEMV frame grows with every row, the 16-row tensor-core frame not
# kernel rows -> projection -> mainloop (others "sync")
FRAME_MAINLOOPS = {
    32: {"qkv": "rwgmma", "gate_up": "rwgmma"},  # v11a
    64: {"qkv": "rwgmma_tma", "wo": "rwgmma_tma", "gate_up": "rwgmma_tma",  # v11e
         "down": "wgmma",  # v10z
         "heads": "rwgmma_tma"},  # v12c
    128: {"qkv": "rwgmma", "gate_up": "rwgmma",  # v11a
          "down": "wgmma"},  # v10z
}
# kernel rows of a one-chain frame -> projection -> its mma.sync tile (others the kernel's)
FRAME_TILES = {64: {"qkv": {"splits": 2, "m_split": 2},  # v10x
                    "gate_up": {"splits": 2, "a_stages": 2},  # v10u
                    "heads": {"warps": 8, "m_split": 2, "a_stages": 2}}}  # v10u
# the same for the register-A wgmma ("rwgmma", "rwgmma_tma"); none measured faster on "wgmma"
RWGMMA_TILES = {64: {"qkv": {"splits": 2, "m_split": 2},  # v11a
                     "gate_up": {"splits": 2, "a_stages": 8},  # v12c
                     "heads": {"splits": 2, "a_stages": 8}}}  # v12c
# kernel rows of a one-chain frame -> the input projection (others "torch")
FRAME_INPUT_PROJ = {64: "skinny"}  # v12c
# kernel rows -> the first chain's rows (the rest on a second stream)
FIRST_PART_ROWS = {128: 64}  # v10l
# the depth frame kernel's weight ring (schedules.depth_frame.FrameOptions; its defaults are the
# seed's 32 x 4 KB): 8 pages of 16 KB won the 4b8c4c6 / 657793b A/B at 1, 16 and 64 rows
# (notes/depth-frame.md, session 18); 32 KB pages do not divide down's 48 KB half tiles
FRAME_RING = {"ring_pages": 8, "page_bytes": 16384}
# the frame kernel's activation stage buffers: 2 beat as many as fit (up to 6) in the 9621aa2 /
# d7ed49d A/B (notes/depth-frame.md, session 18)
FRAME_ACT_BUFFERS = 2
# the frame kernel's normalised inputs published once by a norm phase
# (schedules.depth_frame.FrameOptions.norm_once, issue #37 item 1) from this many rows on: the
# 15fc61e A/B (scripts/ab_depth_frame.py, now ab_frame_option.py --option norm_once;
# notes/depth-frame.md, session 22) measured it -243 us at 64 rows, +170 at 16 and +419 at 1
# (the same bits); rows in between were not measured
FRAME_NORM_ONCE_FROM_ROWS = 64
# the frame kernel's per-chunk waits (schedules.depth_frame.FrameOptions.chunk_waits, issue #37
# item 5: o and down wait per K stage for their chunk's producers) from this many rows on: the
# 23c1df6 A/B (scripts/ab_frame_chunks.py, now ab_frame_option.py --option chunk_waits)
# measured it faster at 1 and 64 rows with the same bits; 8-32 rows were not measured
# (notes/depth-frame.md, session 28: per-chunk waits, built)
FRAME_CHUNK_WAITS_FROM_ROWS = 1
# the frame kernel's activation stage (K elements) by the step's rows: (up to rows, K). 512
# beat 256 at 1-32 rows in the projection study (notes/depth-frame.md, session 19); at 64 rows
# two stages of 512 do not fit beside the ring
FRAME_K_STAGE = ((32, 512), (64, 256))


# the dispatch rule between the depth frame kernel and the fast loop
# (FastLoop(depth_kernel="auto")): the frame from this many rows on, the loop below; None: the
# loop at every row count, since the frame lost to it at 1, 8, 16, 32 and 64 rows
# (results/depth-frame.json at 69d87e0, again at 129a606 and 6a58e70; notes/depth-frame.md)
FRAME_KERNEL_FROM_ROWS = None


def frame_kernel_dispatch(rows: int) -> bool:
    """Whether the dispatch rule (FRAME_KERNEL_FROM_ROWS) runs a step of ``rows`` rows on the
    depth frame kernel."""
    return FRAME_KERNEL_FROM_ROWS is not None and rows >= FRAME_KERNEL_FROM_ROWS


def frame_norm_once(rows: int) -> bool:
    """Whether the frame kernel normalises once in norm phases at ``rows`` rows
    (FRAME_NORM_ONCE_FROM_ROWS)."""
    return FRAME_NORM_ONCE_FROM_ROWS is not None and rows >= FRAME_NORM_ONCE_FROM_ROWS


def frame_chunk_waits(rows: int) -> bool:
    """Whether the frame kernel's o and down tasks wait per K chunk at ``rows`` rows
    (FRAME_CHUNK_WAITS_FROM_ROWS)."""
    return FRAME_CHUNK_WAITS_FROM_ROWS is not None and rows >= FRAME_CHUNK_WAITS_FROM_ROWS


def frame_k_stage(rows: int) -> int:
    """The frame kernel's activation stage for a step of ``rows`` rows (FRAME_K_STAGE)."""
    for up_to, k in FRAME_K_STAGE:
        if rows <= up_to:
            return k
    raise ValueError(f"rows {rows}: the frame kernel takes at most {FRAME_K_STAGE[-1][0]}")
# where the draws' Gumbel terms are drawn (kernels/depth/draw.py NOISE; the same codes)
DRAW_NOISE_GEMV = "compact"  # v10q: the GEMV frame's draw CTA is released too soon to hide them
DRAW_NOISE_TENSOR_CORE = "early"  # v10q


def bucket_for(rows: int) -> int:
    """The smallest bucket that holds ``rows`` rows."""
    for b in BUCKETS:
        if rows <= b:
            return b
    raise ValueError(f"{rows} rows exceed the largest bucket ({BUCKETS[-1]})")


def kernel_rows(rows: int) -> int:
    """Rows the kernels compute for a ``rows``-row chain (padding rows are dropped)."""
    return rows if rows <= GEMV_MAX_ROWS else -(-rows // 16) * 16


def frame_tiles(run_rows: int, mainloops: dict | None = None) -> dict:
    """The measured tiles of a one-chain frame on ``run_rows`` kernel rows for the projections'
    ``mainloops`` (absent: "sync"): FRAME_TILES on mma.sync, RWGMMA_TILES on the register-A
    wgmma, none on the shared-memory one; copies."""
    out = {}
    for name in PROJECTIONS:
        loop = (mainloops or {}).get(name, "sync")
        table = RWGMMA_TILES if loop.startswith("rwgmma") else FRAME_TILES if loop == "sync" \
            else {}
        if name in table.get(run_rows, {}):
            out[name] = dict(table[run_rows][name])
    return out


def checked_parts(parts, rows: int) -> tuple:
    """``parts`` validated for ``rows`` rows: row counts in order adding up to ``rows``, all
    but the last a multiple of 16; one part is one chain, ()."""
    parts = tuple(parts)
    if parts and (sum(parts) != rows or min(parts) < 1 or any(r % 16 for r in parts[:-1])):
        raise ValueError(f"parts {parts}: row counts adding up to {rows}, all but the last a "
                         "multiple of 16")
    return parts if len(parts) > 1 else ()


@dataclass(frozen=True)
class ProjectionPlan:
    """One tensor-core projection: its mainloop (MAINLOOPS) and tile keywords as sorted
    (keyword, value) pairs (() = the kernel's defaults)."""
    mainloop: str = "sync"
    tile: tuple = ()

    def tile_kwargs(self) -> dict:
        return dict(self.tile)


@dataclass(frozen=True)
class FramePlan:
    """What a frame of ``rows`` rows runs with (``frame_plan``): ``run_rows`` kernel rows (over
    all parts), the row ``parts`` (() one chain), ``projections`` (a ProjectionPlan per
    PROJECTIONS name, in that order; () on the GEMVs), ``input_proj`` (INPUT_PROJS),
    ``draw_noise``, ``pdl`` and the traces (the tables' plan: PDL, no traces; an A/B's
    FrameVariant may set them, schedules.plan_variant)."""
    rows: int
    run_rows: int
    parts: tuple = ()
    projections: tuple = ()
    input_proj: str = "torch"
    draw_noise: str = DRAW_NOISE_GEMV
    pdl: bool = True
    draw_trace: bool = False
    attn_trace: bool = False

    @property
    def gemv(self) -> bool:
        """The fused GEMVs (one chain of at most GEMV_MAX_ROWS rows)."""
        return not self.projections

    @property
    def padded(self) -> bool:
        """Padding rows beyond ``rows`` (their results dropped; their draws read copies of the
        sampler's tensors)."""
        return self.run_rows > self.rows

    def projection(self, name: str) -> ProjectionPlan:
        return self.projections[PROJECTIONS.index(name)]

    @property
    def chunk_major_inputs(self) -> frozenset:
        """The projections whose inputs their producers (norm, attention, gate/up's epilogue)
        write chunk-major: those whose mainloops bulk-copy them."""
        return frozenset(name for name, p in zip(PROJECTIONS, self.projections)
                         if p.mainloop in ("wgmma", "rwgmma"))

    def part(self, rows: int) -> FramePlan:
        """The plan of one part's chain of ``rows`` rows: this plan's projections and input
        projection (not a lone frame's of that size), its own kernel rows and draw noise."""
        run = kernel_rows(rows)
        gemv = run <= GEMV_MAX_ROWS
        return dataclasses.replace(
            self, rows=rows, run_rows=run, parts=(), projections=() if gemv else self.projections,
            draw_noise=DRAW_NOISE_GEMV if gemv else DRAW_NOISE_TENSOR_CORE)

    def as_dict(self) -> dict:
        """The plan as plain data (results files)."""
        out = dataclasses.asdict(self)
        out["projections"] = {name: {"mainloop": p.mainloop, "tile": p.tile_kwargs()}
                              for name, p in zip(PROJECTIONS, self.projections)}
        return out


def frame_plan(rows: int) -> FramePlan:
    """The plan of a ``rows``-row frame (1 to BUCKETS[-1]) from the tables above."""
    return frame_plan_with(rows)


def frame_plan_with(rows: int, *, parts: tuple | None = None, mainloops: Mapping | None = None,
                    tiles: Mapping | None = None, input_proj: str | None = None) -> FramePlan:
    """The tables' plan of a ``rows``-row frame with the choices named here in place of
    theirs: the row ``parts`` (None: the tables'; () one chain), per projection a mainloop
    (its measured tile follows unless ``tiles`` names one) and tile keywords, the input
    projection (None: the tables'). Only an A/B's FrameVariant names any
    (schedules.plan_variant.variant_plan). ValueError for what this frame cannot run."""
    if not 1 <= rows <= BUCKETS[-1]:
        raise ValueError(f"rows {rows}: the kernels path runs 1-{BUCKETS[-1]} rows")
    mainloops, tiles = mainloops or {}, tiles or {}
    K = kernel_rows(rows)
    first = FIRST_PART_ROWS.get(K)
    parts = checked_parts(parts, rows) if parts is not None else \
        (first, rows - first) if first else ()
    chains = [kernel_rows(r) for r in parts] or [K]
    one_chain = not parts
    input_proj = input_proj or (FRAME_INPUT_PROJ.get(K, "torch") if one_chain else "torch")
    if input_proj == "skinny" and min(chains) <= GEMV_MAX_ROWS:
        raise ValueError(f"input_proj 'skinny': tensor-core chains only, more than "
                         f"{GEMV_MAX_ROWS} rows each (here {parts or rows})")
    projections = ()
    if K <= GEMV_MAX_ROWS:
        if mainloops or tiles:
            raise ValueError(f"mainloops / tiles: a {rows}-row frame runs the GEMVs (up to "
                             f"{GEMV_MAX_ROWS} rows), no tensor-core projections")
    else:
        loops = {name: FRAME_MAINLOOPS.get(K, {}).get(name, "sync") for name in PROJECTIONS}
        loops.update(mainloops)
        chosen = frame_tiles(K, loops) if one_chain else {}  # a part's are not a lone frame's
        chosen.update(tiles)
        for name, tile in chosen.items():
            if set(tile) - set(TILE_KEYWORDS[loops[name]]):
                raise ValueError(f"tiles[{name!r}] {dict(tile)}: mainloop {loops[name]!r} takes "
                                 f"{TILE_KEYWORDS[loops[name]]}")
        projections = tuple(ProjectionPlan(loops[name],
                                           tuple(sorted(chosen.get(name, {}).items())))
                            for name in PROJECTIONS)
    return FramePlan(rows=rows, run_rows=sum(chains), parts=parts, projections=projections,
                     input_proj=input_proj,
                     draw_noise=DRAW_NOISE_GEMV if K <= GEMV_MAX_ROWS else DRAW_NOISE_TENSOR_CORE)


# ---- the skinny projections' default tiles (kernels/depth/gemm_skinny.py) ---------------------
# Where a same-run frame A/B on the H200 measured a tile faster, by (weight rows, K) of the
# projection: QKV [4096, 1024], wo [1024, 2048], gate/up [6144, 1024], down [1024, 3072].
# row counts M at which 8 warps (a 128-row weight tile) won: QKV and gate/up at 16-32 rows,
# down at 128 (notes/fast-loop.md v9c; gate/up at 64 rows back to 4 warps, v10g)
SKINNY_WIDE_TILES = {(4096, 1024): (16, 32), (6144, 1024): (16, 32), (1024, 3072): (128,)}
# row counts at which two warps per weight group (m_split) won: wo and down at 64 rows (v9d)
SKINNY_SPLIT_ROWS = {(1024, 2048): (64,), (1024, 3072): (64,)}
# {rows M: a_stages} where the staged copy of a won: a layer's four projections in 4 stages at
# 32 / 64 / 128 rows (v10e)
SKINNY_A_STAGES = {shape: {32: 4, 64: 4, 128: 4}
                   for shape in ((4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072))}


# ---- the P0 GEMM's default config (kernels/nvfp4/gemm.py default_config) ---------------------
# Which static config of the block-scaled NVFP4 GEMM runs for a problem; each entry cites the
# notes/p0-gemm.md version whose H200 measurement (or design argument, where nothing was
# measured) chose it.
ROW_TILE = 128  # rows of a CTA tile (tile_m) and of a swizzled scale tile


@dataclass(frozen=True)
class TileChoice:
    tile_n: int
    stages: int  # weight-ring depth
    source: str  # the notes/p0-gemm.md version that justified it


# Split K only below one wave of 128 x 128 tiles: splits = min(MAX_SPLITS, SMs // tiles,
# k_blocks // MIN_K_BLOCKS_PER_SPLIT), at least 1.
MAX_SPLITS = 4  # v4 (4d741a1): 3 splits won for out/fc2 at M = 128, 4 (two waves) lost
MIN_K_BLOCKS_PER_SPLIT = 16  # v4 (4d741a1) design: each split keeps a pipelined K loop

# The swap-AB tile (weights as register-A wgmma from the register-order prepack, 128 tokens x
# 128 weight rows a CTA), which the f16 swap-AB build runs (splits: the rule above; v5: the
# best split at M = 128 was SMs // tiles for all five H3 shapes). The designs that expanded the
# packed activation in every CTA (p0's 128 x 256 / 128 x 128 tiles, the packed swap-AB) lost
# to the f16 builds and left the code with their entries (notes/p0-gemm.md, session 27).
SWAP_AB = TileChoice(
    tile_n=128, stages=8,
    source="v5 (6148474): tokens 128, each k-block's wgmmas retired before the next "
           "conversion: correct by construction; the one-group-in-flight variant measured "
           "within 2 % (inside the run's spread) and its A-register guard is not ordered by "
           "ptxas (v5 review); the f16 build's ring the same (session 22)")

# The f16 builds (the activation's exact f16 expansion by TMA; kernels/nvfp4/gemm.py
# default_config, every call's): notes/p0-gemm.md, session 22 (15fc61e).
# 4 f16 activation buffers: with 2 the pipelined consumer starved (1.5-1.8x slower a k-block);
# the serial consumer with 4 ran 0.78-0.85x production's time at M = 128
F16_BUFFERS = 4
# stream-K (device.tiles.StreamKSchedule) instead of the tile loop where the 128 x 128 tiles
# pass a whole wave by at most half of one (tiles / SMs in (lo, hi]) at one K split: it won at
# qkv M = 128 (168 tiles on 132 SMs: 0.82x the tile loop's time) and lost wherever the tile
# loop ran whole waves or K splits (fc1, out, fc2, 7168 x 5376 at M = 128: 1.18-1.33x slower)
F16_STREAM_K_WAVES = (1.0, 1.5)
# K splits at which the f16 swap-AB build's splits of a tile are one cluster reducing in
# distributed shared memory (epilogues.tile_store.ClusterSplitStore) instead of through the
# global workspace: #34 1(a) (e7999c1, e8e774c; notes/p0-gemm.md session 27) measured its
# fixup at a third to a half of the global one's at two splits on out, fc2 and 7168 x 5376
# (M = 128); at three splits out and fc2 need 42 clusters of 3, more than the GPCs hold at
# once (a second round: 3-7x the global fixup)
F16_CLUSTER_SPLITS = (2,)
# The f16 swap-AB build up to one token tile or one wave of 128 x 128 tiles, the three-warpgroup
# build with 256 tokens a CTA (m64n256k16) beyond: session 23 (e841be0, part S) measured the
# 256-token build ahead from one wave on (M = 256 qkv by 7 %; M = 512 and 1024 out and fc2 by
# 8-15 %, tile loop to tile loop) and behind below it (M = 256 out 1.32x and fc2 1.30x the
# swap-AB build's time);
# session 22 measured it 0.68-0.82x the swap-AB f16 build's time at M = 2048 and behind at 128
F16_SWAP_AB_MAX_WAVES = 1
# stream-K on the 256-token build where its tiles' last wave is at most this full (0 excluded):
# session 23 (parts S and W, 14 cells at M = 256-2048) measured it ahead wherever the last wave
# held <= 0.32 of the SMs (qkv at 256, 1024, 2048; out and fc2 at 256 and 1024: 4-38 %) and
# behind at 0.39-0.79 (4-19 %), except fc2 at M = 512 (0.64: ahead by 9 %, the one miss)
WIDE_F16_STREAM_K_LAST_WAVE = 1 / 3
# ... and only up to 10 whole waves before that last one: measured ahead at up to 10 (qkv at
# M = 2048, 1344 tiles), behind at 47 (session 24, 4039eab: out and fc2 at M = 37810, the two
# shapes on stream-K there, ran at 0.67-0.71x cuBLAS bf16 while the shapes off it ran at
# 1.00-1.06x, and the work queue's build without stream-K ran out 13-20 % faster than the
# stream-K GEMM alone, its quantizers included)
WIDE_F16_STREAM_K_MAX_FULL_WAVES = 10
WIDE_F16 = TileChoice(  # tile_n: the tokens a CTA (wgmma N; the shell's tile_m, 256)
    tile_n=256, stages=8,
    source="session 22 (15fc61e, ca914ee): tokens 256 beat 128 by 19-44 % at M = 2048 and "
           "lost at M = 128; stages 8: the study's, not swept")


# ---- P2's persistent work queue (kernels/nvfp4/workqueue.py; notes/p2.md) --------------------
@dataclass(frozen=True)
class WorkQueueChoice:
    capacity: int  # rows a chunk (whole 256-token tiles)
    slots: int  # chunks the f16 ring holds
    producers: tuple  # quantizer CTAs: ((at least this many weight tiles, CTAs), ...), in order
    loads: int  # 16-element blocks a quantizer thread has in flight
    source: str

    def producers_for(self, weight_tiles: int) -> int:
        """Quantizer CTAs for a GEMM of ``weight_tiles`` weight tiles a token tile: a chunk's
        GEMM time grows with them, its quantizers' time shrinks with their count."""
        return next(p for least, p in self.producers if weight_tiles >= least)


WORKQUEUE = WorkQueueChoice(
    capacity=256, slots=3, producers=((77, 3), (0, 12)), loads=4,
    source="3 x 256 f16 rows of K = 5376 are 8.26 MB, inside issue #39's 8.3 MB ring target; "
           "quantizers from session 24's sweeps at M = 37810 (63ce891 and ddf0a13: 2, 3, 4, 8, "
           "12 CTAs): qkv (168 weight tiles) and fc1 (112) fastest at 3, out (42) at 12; "
           "4 loads in flight a thread (~48 KB an SM), not swept")
