"""The depth frame's host layouts: the projection tiles' weights packed once for the page ring
(one region a distinct tile of the model, in the image the wgmmas read: projection.py; or, for
the register-A tiles, in the order their threads load them: projection_ra.py), and the
chunk-major [K / 8][R8][8] bf16 image of activations in the arena."""
from __future__ import annotations

import numpy as np
import torch

from kernels.depth.frame.projection import TILE_FEATURES
from kernels.depth.frame.projection_ra import RA_ROWS
from kernels.depth.gemm_skinny import weight_groups
from schedules import depth_frame as F


def pack_tile(w_tile):
    """A tile's weights [F, K'] (bf16) as the bytes the ring receives: [K' / 8][F][8]."""
    f, k = w_tile.shape
    return w_tile.reshape(f, k // 8, 8).permute(1, 0, 2).contiguous().view(-1).view(
        torch.uint8)


def pack_tile_register_a(w_tile, swiglu: bool):
    """A register-A task's weights [64, K'] (bf16; gate/up: 32 gate rows then their 32 up
    rows) as the bytes its warpgroup loads (projection_ra.py): [K' / 16 steps][4 warps][32
    lanes][8], lane 4g + q of warp w holding a0..a3 = the bf16 pairs (row g, k), (g + 8, k),
    (g, k + 8), (g + 8, k + 8) at k = 16·step + 2q of its 16-row group (gate/up: group w's 8
    gate rows, then their 8 up rows, so one thread has a feature's gate and up)."""
    rows, k = w_tile.shape
    grouped = weight_groups(w_tile, swiglu, 16)  # [4, 16, K']
    # [group, h, g, step, j, q, e] -> [step, group, g, q, j, h, e]: row 8h + g, k = 16·step +
    # 8j + 2q + e
    packed = grouped.reshape(rows // 16, 2, 8, k // 16, 2, 4, 2).permute(3, 0, 2, 5, 4, 1, 6)
    return packed.contiguous().view(-1).view(torch.uint8)


def chunk_major_rows(x, rows_padded: int):
    """x [R, K] (bf16) as chunk-major [K / 8][rows_padded][8] (rows R.. zero)."""
    r, k = x.shape
    out = torch.zeros(k // 8, rows_padded, 8, dtype=x.dtype, device=x.device)
    out[:, :r] = x.reshape(r, k // 8, 8).transpose(0, 1)
    return out


def from_chunk_major(buf, rows: int, k: int):
    """The inverse of :func:`chunk_major_rows`: [rows, k] from [k / 8][R8][8] storage."""
    return buf.reshape(k // 8, -1, 8)[:, :rows].transpose(0, 1).reshape(rows, k)


def tile_weights(type_: int, tile: int, half: int, w, register_a: bool = False):
    """Rows and K range of tile ``tile`` (``half`` 0 / 1 of a split tile, -1 whole) of a
    projection of weight ``w`` [N, K] (gate/up: [2N, K], gate rows first); ``register_a``: the
    register-A tiles' 64 rows (gate/up: 32 gate and 32 up rows, as the ring's tiles)."""
    f = RA_ROWS if register_a else TILE_FEATURES[type_]
    if type_ == F.GATEUP:
        n = w.shape[0] // 2
        rows = torch.cat([w[32 * tile: 32 * tile + 32], w[n + 32 * tile: n + 32 * tile + 32]])
    else:
        rows = w[f * tile: f * (tile + 1)]
    if half >= 0:
        k2 = w.shape[1] // 2
        rows = rows[:, half * k2: (half + 1) * k2]
    return rows


def weight_regions(schedule: F.Schedule) -> tuple:
    """(int64 [grid, max_tasks] byte offset of each task's weight tile, -1 for none; the
    buffer's size; {(type, owner, tile, half): offset}). One region per distinct tile of the
    model: a layer's tiles are shared by every position, each head's by its one position (the
    owner is the layer, or the position for heads and proj); a split tile's halves are
    adjacent."""
    opt = schedule.options
    register_a = opt.register_a
    out = np.full((opt.grid, opt.max_tasks_per_cta), -1, dtype=np.int64)
    where: dict = {}
    size = 0
    for c, lst in enumerate(schedule.ctas):
        for i, t in enumerate(lst):
            if (t.weight_bytes if register_a else t.n_pages) == 0:
                continue
            ph = schedule.phases[t.phase]
            owner = ph.pos if t.type in (F.HEAD, F.PROJ) else ph.layer
            key = (t.type, owner, t.tile, t.half)
            if key not in where:
                where[key] = size
                # register-A tiles: their bytes (registers take them, 16 at a time); else
                # whole pages of the ring
                size += t.weight_bytes if register_a else t.n_pages * opt.page_bytes
            out[c, i] = where[key]
    return out, max(size, 16), where


def pack_frame_weights(schedule, projections: dict):
    """The ring's source buffer (uint8, on the projections' device) for ``schedule``: every
    region of :func:`weight_regions` filled with its tile, packed
    by :func:`pack_tile`. ``projections``: "qkv", "wo", "gate_up", "down" (one [N, K] bf16 a
    layer; gate_up [2N, K], gate rows first), "heads" (one a drawn group, for positions 1..15)
    and "proj" (the Talker-state projection, [1024, 2048])."""
    _, size, where = weight_regions(schedule)
    register_a = schedule.options.register_a
    dev = projections["proj"].device
    out = torch.zeros(size, dtype=torch.uint8, device=dev)
    by_type = {F.QKV: "qkv", F.O: "wo", F.GATEUP: "gate_up", F.DOWN: "down"}
    for (type_, owner, tile, half), off in where.items():
        if type_ == F.HEAD:
            w = projections["heads"][owner - 1]
        elif type_ == F.PROJ:
            w = projections["proj"]
        else:
            w = projections[by_type[type_]][owner]
        rows = tile_weights(type_, tile, half, w, register_a).contiguous()
        packed = pack_tile_register_a(rows, type_ == F.GATEUP) if register_a else pack_tile(rows)
        out[off: off + packed.numel()] = packed
    return out
