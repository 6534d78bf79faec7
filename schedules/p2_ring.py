"""P2's chunk plan: rows [r0, r1) of a projection as chunks of at most ``capacity`` rows, each
quantized into a bounded ring of packed activation and consumed there (kernels/nvfp4/ring.py).

Pure arithmetic, no torch: what a ring of C rows holds, how many bytes it takes, where each
chunk starts. Capacities are multiples of 128 because the E4M3 scales are swizzled in 128-row
tiles: a chunk starting inside a tile would need the scales of rows that belong to another
chunk (notes/p2.md, "what bit-identity requires").
"""
from __future__ import annotations

from dataclasses import dataclass

ROW_TILE = 128  # rows of a swizzled scale tile: a chunk starts on one
BLOCK = 16  # elements per E4M3 block scale
SCALE_COLS = 4  # scale columns of a swizzled tile: K/16 is padded to a multiple of this
CAPACITIES = (128, 512, 1024, 2048, 4096)  # the sweep (experiments/p2_ring_capacity.py)
# the capacity Nvfp4Linear's p2 backend uses: the seed's pick (GB10, 2048 rows), kept until the
# H200 sweep says otherwise (notes/p2.md predicts 4096 there, by 1-5 %)
DEFAULT_CAPACITY = 2048


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_capacity(capacity) -> int:
    """``capacity`` as an int: a positive multiple of 128 rows. TypeError / ValueError else."""
    if not _is_int(capacity):
        raise TypeError(f"capacity must be an int (rows), got {capacity!r}")
    if capacity <= 0 or capacity % ROW_TILE:
        raise ValueError(f"capacity = {capacity} rows must be a positive multiple of {ROW_TILE} "
                         "(scales are swizzled in 128-row tiles: a chunk starts on one)")
    return capacity


def ring_bytes(capacity: int, K: int, f16: bool = False) -> int:
    """Bytes of a ring of ``capacity`` rows of K elements: packed codes (K/2 a row) and the
    swizzled scales (roundup(K/16, 4) a row; capacity is already a multiple of 128), and with
    ``f16`` the rows' f16 expansion (2K a row) that the GEMM's f16 builds read."""
    check_capacity(capacity)
    if not _is_int(K) or K <= 0 or K % BLOCK:
        raise ValueError(f"K = {K!r} must be a positive multiple of {BLOCK}")
    scale_cols = -(-(K // BLOCK) // SCALE_COLS) * SCALE_COLS
    return capacity * (K // 2) + capacity * scale_cols + (capacity * K * 2 if f16 else 0)


@dataclass(frozen=True)
class Chunk:
    """Rows [start, stop) of the activation; ``index`` counts chunks from 0."""
    index: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def chunk_plan(r0: int, r1: int, capacity: int) -> list[Chunk]:
    """Rows [r0, r1) as consecutive chunks of ``capacity`` rows, the last one partial when
    capacity does not divide r1 - r0. r0 must be a multiple of 128 (as gemm_nvfp4's ``rows``),
    so every chunk starts on a scale tile."""
    check_capacity(capacity)
    if not (_is_int(r0) and _is_int(r1)):
        raise TypeError(f"rows must be ints, got ({r0!r}, {r1!r})")
    if not 0 <= r0 < r1:
        raise ValueError(f"rows ({r0}, {r1}) must satisfy 0 <= r0 < r1")
    if r0 % ROW_TILE:
        raise ValueError(f"r0 = {r0} must be a multiple of {ROW_TILE} (a chunk starts on a "
                         "scale tile)")
    return [Chunk(i, c0, min(c0 + capacity, r1))
            for i, c0 in enumerate(range(r0, r1, capacity))]


def rounds(rows: int, n_tiles: int, sms: int, tile_m: int = ROW_TILE) -> int:
    """Persistent-schedule rounds of one GEMM launch over ``rows`` rows: ceil(tiles / sms),
    tiles = ceil(rows / tile_m) x n_tiles (the model behind notes/p2.md's prediction)."""
    tiles = -(-rows // tile_m) * n_tiles
    return -(-tiles // sms)


def chunked_rounds(r0: int, r1: int, capacity: int, n_tiles: int, sms: int,
                   tile_m: int = ROW_TILE) -> int:
    """Rounds of the chunked ring: each chunk's launch ends in its own partial round."""
    return sum(rounds(c.rows, n_tiles, sms, tile_m) for c in chunk_plan(r0, r1, capacity))
