"""The depth frame's host layouts: the projection tiles' weights packed once for the page ring
(one region a distinct tile of the model, in the image the wgmmas read: projection.py), and the
chunk-major [K / 8][R8][8] bf16 image of activations in the arena."""
from __future__ import annotations

import numpy as np
import torch

from kernels.depth.frame.projection import TILE_FEATURES
from schedules import depth_frame as F


def pack_tile(w_tile):
    """A tile's weights [F, K'] (bf16) as the bytes the ring receives: [K' / 8][F][8]."""
    f, k = w_tile.shape
    return w_tile.reshape(f, k // 8, 8).permute(1, 0, 2).contiguous().view(-1).view(
        torch.uint8)


def chunk_major_rows(x, rows_padded: int):
    """x [R, K] (bf16) as chunk-major [K / 8][rows_padded][8] (rows R.. zero)."""
    r, k = x.shape
    out = torch.zeros(k // 8, rows_padded, 8, dtype=x.dtype, device=x.device)
    out[:, :r] = x.reshape(r, k // 8, 8).transpose(0, 1)
    return out


def from_chunk_major(buf, rows: int, k: int):
    """The inverse of :func:`chunk_major_rows`: [rows, k] from [k / 8][R8][8] storage."""
    return buf.reshape(k // 8, -1, 8)[:, :rows].transpose(0, 1).reshape(rows, k)


def tile_weights(type_: int, tile: int, half: int, w):
    """Rows and K range of tile ``tile`` (``half`` 0 / 1 of a split tile, -1 whole) of a
    projection of weight ``w`` [N, K] (gate/up: [2N, K], gate rows first)."""
    f = TILE_FEATURES[type_]
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
    out = np.full((opt.grid, opt.max_tasks_per_cta), -1, dtype=np.int64)
    where: dict = {}
    size = 0
    for c, lst in enumerate(schedule.ctas):
        for i, t in enumerate(lst):
            if t.n_pages == 0:
                continue
            ph = schedule.phases[t.phase]
            owner = ph.pos if t.type in (F.HEAD, F.PROJ) else ph.layer
            key = (t.type, owner, t.tile, t.half)
            if key not in where:
                where[key] = size
                size += t.n_pages * opt.page_bytes
            out[c, i] = where[key]
    return out, max(size, 16), where


def pack_frame_weights(schedule, projections: dict):
    """The ring's source buffer (uint8, on the projections' device) for ``schedule``: every
    region of :func:`weight_regions` filled with its tile, packed
    by :func:`pack_tile`. ``projections``: "qkv", "wo", "gate_up", "down" (one [N, K] bf16 a
    layer; gate_up [2N, K], gate rows first), "heads" (one a drawn group, for positions 1..15)
    and "proj" (the Talker-state projection, [1024, 2048])."""
    _, size, where = weight_regions(schedule)
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
        packed = pack_tile(tile_weights(type_, tile, half, w).contiguous())
        out[off: off + packed.numel()] = packed
    return out
