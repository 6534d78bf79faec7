"""The persistent tile loop every role of a warp-specialised kernel walks.

A static persistent schedule (CUTLASS's): the grid holds at most one wave of clusters, and
cluster c of G takes the linear work items c, c + G, c + 2G, ... over the (m, n, split) output
tiles grouped into clusters along N (or, ``cluster_k``, along the K splits: the splits of one
tile are one cluster, split s at rank s), rasterised along M or N. Every role walks it on its own
(:func:`for_each_tile`), so producer, stages and consumers agree on the tile sequence without
talking to each other.

:class:`TileSchedule` is built on the host and crosses into the kernel as a launch argument: the
tile counts and, for the two divisions that turn a work index into tile coordinates, fast-divmod
divisors computed on the host (``cute.fast_divmod_create_divisor_v2``).
"""
from __future__ import annotations

from typing import NamedTuple

from device.runtime import cute_modules

cutlass, cute = cute_modules()
from cutlass import Boolean, Int32  # noqa: E402
from cutlass.cutlass_dsl import extract_mlir_values, new_from_mlir_values  # noqa: E402


class TileSchedule:
    """Static config: ``tiles`` = (m tiles, n tiles, K splits), clusters of ``cluster_n`` CTAs
    along N, linear work rasterised along M (``raster_along_m``) or N. ``cluster_k`` (with
    ``cluster_n`` 1; the K splits' count): each cluster one (m, n) tile, its CTA of rank s (grid
    y) that tile's split s, so a work item is a tile and, rasterised along N, its index
    m · n tiles + n (the epilogue's tile id: a CTA's k-th tile is work item c + kG). Host side:
    :meth:`grid`; device side: :meth:`start` (through :func:`for_each_tile`)."""

    def __init__(self, tiles: tuple, cluster_n: int = 1, raster_along_m: bool = True,
                 *, spare: int = 0, cluster_k: int = 1, _encoded=None, _templates=None):
        self.tiles, self.cluster_n, self.raster_along_m = tiles, cluster_n, raster_along_m
        self.spare = spare  # CTAs at the grid's start that walk no tiles (the work queue's)
        self.cluster_k = cluster_k
        if cluster_k != 1 and (cluster_n != 1 or spare):
            raise ValueError(f"cluster_k = {cluster_k} with cluster_n = {cluster_n}, spare = "
                             f"{spare}: a K-split cluster is the whole cluster, every CTA a walker")
        # work items in cluster units, m fastest (CuTe's default column-major layout)
        self.clusters = cute.make_layout(cute.ceil_div(
            tiles, (1, cluster_n) if cluster_k == 1 else (1, 1, cluster_k)))
        m_clusters, n_clusters = self.clusters.shape[0], self.clusters.shape[1]
        major, minor = ((m_clusters, n_clusters) if raster_along_m
                        else (n_clusters, m_clusters))
        if _encoded is None:
            self.major = cute.fast_divmod_create_divisor_v2(major)
            self.minor = cute.fast_divmod_create_divisor_v2(minor)
        else:  # in the kernel: the host's divisors, their scalar halves from our tile counts
            self.major = new_from_mlir_values(_templates[0], [_encoded[0], major])
            self.minor = new_from_mlir_values(_templates[1], [_encoded[1], minor])

    # Only the tile counts and the encoded divisors cross the launch: each divisor's scalar
    # follows from the counts, so the kernel rebuilds it instead of taking two more arguments.
    def __extract_mlir_values__(self) -> list:
        return (extract_mlir_values(self.tiles) + extract_mlir_values(self.major)[:1]
                + extract_mlir_values(self.minor)[:1])

    def __new_from_mlir_values__(self, values) -> TileSchedule:
        n = len(extract_mlir_values(self.tiles))
        return TileSchedule(new_from_mlir_values(self.tiles, values[:n]), self.cluster_n,
                            self.raster_along_m, spare=self.spare, cluster_k=self.cluster_k,
                            _encoded=values[n:n + 2], _templates=(self.major, self.minor))

    def grid(self, max_clusters: Int32) -> tuple:
        """The launch grid (host): one CTA per tile up to ``max_clusters`` clusters, as
        (1, cluster_n · cluster_k, clusters), so a cluster's CTAs are neighbours along y;
        ``spare`` more CTAs before them (clusters of one, z < spare) that walk no tiles."""
        walkers = cutlass.min(cute.size(self.clusters), max_clusters)
        if cutlass.const_expr(self.spare):
            return (1, self.cluster_n, walkers + self.spare)
        return (1, self.cluster_n * self.cluster_k, walkers)

    def start(self) -> TileWalk:
        """This CTA's walk over the schedule, at its cluster's first work item (device
        side)."""
        bidx, bidy, bidz = cute.arch.block_idx()
        grid = cute.arch.grid_dim()
        stride = cute.size(grid) // cute.size((1, self.cluster_n * self.cluster_k))
        work = Int32(bidz)
        if cutlass.const_expr(self.spare):  # the spare CTAs come first: z < spare
            stride = stride - self.spare
            work = work - self.spare
        if cutlass.const_expr(self.cluster_k == 1):
            cta = (Int32(bidx % 1), Int32(bidy % self.cluster_n), Int32(0))
        else:  # rank s of a K-split cluster computes split s
            cta = (Int32(bidx % 1), Int32(0), Int32(bidy % self.cluster_k))
        return TileWalk(self, stride, work, cta)


class StreamKSchedule:
    """Static config: ``tiles`` = (m tiles, n tiles) and the raster order. Stream-K: the tiles'
    k-blocks form one sequence of T = tiles · k_tiles iterations (tile-major), and CTA c of the
    G = min(T, CTAs) in the grid takes iterations [⌊cT/G⌋, ⌊(c+1)T/G⌋), so every CTA runs
    ⌊T/G⌋ or ⌈T/G⌉ k-blocks whatever the tile count (no partial last wave). A tile is cut into
    ``segments`` consecutive CTAs' shares, indexed 0, 1, ... in CTA order: the epilogue adds the
    segments' partials in that order, so the bits depend on G (the launch's CTA budget) and
    never on timing. G <= T keeps every CTA's share non-empty, so every segment of a tile
    arrives. The host checks T · G < 2^31 (the kernel's 32-bit products)."""

    stream_k = True

    def __init__(self, tiles: tuple, raster_along_m: bool = True):
        self.tiles, self.raster_along_m = tiles, raster_along_m

    def __extract_mlir_values__(self) -> list:
        return extract_mlir_values(self.tiles)

    def __new_from_mlir_values__(self, values) -> StreamKSchedule:
        return StreamKSchedule(new_from_mlir_values(self.tiles, values), self.raster_along_m)

    def grid(self, k_tiles: Int32, max_ctas: Int32) -> tuple:
        """One CTA per k-block at most, up to ``max_ctas`` (host)."""
        return (1, 1, cutlass.min(self.tiles[0] * self.tiles[1] * k_tiles, max_ctas))


def max_stream_k_segments(tiles: int, k_tiles: int, ctas: int) -> int:
    """A bound on the CTAs that share one tile (host: the split-K workspace's depth): a tile's
    k_tiles iterations meet at most ⌈(k_tiles - 1) / ⌊T/G⌋⌉ + 1 of the CTAs' shares."""
    total = tiles * k_tiles
    ctas = min(ctas, total)
    return -(-(k_tiles - 1) // (total // ctas)) + 1


def stream_k_units(tiles: int, k_tiles: int, ctas: int) -> list:
    """The stream-K schedule on the host, the kernel's arithmetic line for line
    (:func:`_for_each_stream_k_unit`): per CTA its [(tile, segment, segments, k0, k1)]."""
    total = tiles * k_tiles
    ctas = min(ctas, total)
    out = []
    for cta in range(ctas):
        i, end, units = cta * total // ctas, (cta + 1) * total // ctas, []
        while i < end:
            t = i // k_tiles
            first = t * k_tiles
            k0 = i - first
            k1 = min(k_tiles, k0 + end - i)
            lead = ((first + 1) * ctas - 1) // total
            tail = ((first + k_tiles) * ctas - 1) // total
            units.append((t, cta - lead, tail - lead + 1, k0, k1))
            i = first + k1
        out.append(units)
    return out


class TileWalk:
    """Device side: one CTA's position in a :class:`TileSchedule`: its cluster's current work
    item ``work``, the work ``stride`` (clusters in the grid) and the CTA's (m, n, split) offset
    ``cta`` in its cluster. Loop-carried state of :func:`for_each_tile`."""

    def __init__(self, schedule: TileSchedule, stride, work, cta):
        self.schedule, self.stride, self.work, self.cta = schedule, stride, work, cta

    def __extract_mlir_values__(self) -> list:
        return extract_mlir_values((self.stride, self.work, self.cta, self.schedule))

    def __new_from_mlir_values__(self, values) -> TileWalk:
        stride, work, cta, schedule = new_from_mlir_values(
            (self.stride, self.work, self.cta, self.schedule), values)
        return TileWalk(schedule, stride, work, cta)

    def advance(self):
        self.work = self.work + self.stride

    def tile(self):
        """(m, n, split, valid) of the current work item for this CTA, warp-uniform."""
        s, work = self.schedule, self.work
        valid = cute.size(s.clusters) > work  # (the operand order CUTLASS's scheduler
        # compared in, so that the kernels' PTX stayed the same)
        rest, major = divmod(work, s.major)
        split, minor = divmod(rest, s.minor)
        m, n = (major, minor) if s.raster_along_m else (minor, major)
        mn = tuple(cute.arch.make_warp_uniform(Int32(c) * Int32(size) + Int32(offset))
                   for c, offset, size in zip((m, n, split), self.cta,
                                              (1, s.cluster_n, s.cluster_k)))
        return (*mn, Boolean(cute.arch.make_warp_uniform(valid)))


class TileLoop(NamedTuple):
    """What a role's tile loop walks (device side): the schedule and the K blocking."""
    schedule: TileSchedule
    k_tiles: Int32  # k-blocks of K
    k_per_split: Int32  # k-blocks of one K split (the last split may hold fewer, or none)


class Tile(NamedTuple):
    """One output tile of a role's loop: its (m, n) tile coordinates, its K split and that
    split's k-blocks [k0, k1); under stream-K also how many CTAs' ``segments`` the tile has
    (``split`` is then this CTA's segment), else None (the config's static split count)."""
    m: Int32
    n: Int32
    split: Int32
    k0: Int32
    k1: Int32
    segments: object = None


@cute.jit
def for_each_tile(loop: TileLoop, body, args):
    """The tile loop of every role: ``count = body(tile, args, count)`` for each of this CTA's
    tiles, in schedule order. ``count`` (0 at the start) is the role's running number of ring
    uses, which ``body`` advances per k-block it consumes or fills (its stage and phase:
    :func:`device.waits.ring_position`); ``args`` are the views ``body`` reads, built once
    before the loop."""
    if cutlass.const_expr(getattr(loop.schedule, "stream_k", False)):
        _for_each_stream_k_unit(loop, body, args)
    else:
        walk = loop.schedule.start()
        m, n, split, valid = walk.tile()
        count = Int32(0)
        while valid:
            k0 = split * loop.k_per_split
            k1 = cutlass.min(k0 + loop.k_per_split, loop.k_tiles)
            count = body(Tile(m, n, split, k0, k1), args, count)
            walk.advance()
            m, n, split, valid = walk.tile()


@cute.jit
def _for_each_stream_k_unit(loop: TileLoop, body, args):
    """:func:`for_each_tile` under a :class:`StreamKSchedule`: this CTA's iterations, one
    ``body`` call per tile they touch, with the tile's segment index and segment count."""
    s = loop.schedule
    m_tiles, n_tiles = s.tiles
    k_tiles = loop.k_tiles
    total = m_tiles * n_tiles * k_tiles
    _, _, ctas = cute.arch.grid_dim()
    _, _, cta = cute.arch.block_idx()
    ctas, cta = Int32(ctas), Int32(cta)
    i = cta * total // ctas
    end = (cta + 1) * total // ctas
    count = Int32(0)
    while i < end:
        t = i // k_tiles
        first = t * k_tiles
        k0 = i - first
        k1 = cutlass.min(k_tiles, k0 + end - i)
        lead = ((first + 1) * ctas - 1) // total  # the CTA that owns the tile's first k-block
        tail = ((first + k_tiles) * ctas - 1) // total  # and its last
        major = m_tiles if cutlass.const_expr(s.raster_along_m) else n_tiles
        slow = t // major
        fast = t - slow * major
        m, n = (fast, slow) if cutlass.const_expr(s.raster_along_m) else (slow, fast)
        count = body(Tile(*(cute.arch.make_warp_uniform(Int32(x))
                            for x in (m, n, cta - lead, k0, k1, tail - lead + 1))), args, count)
        i = first + k1
