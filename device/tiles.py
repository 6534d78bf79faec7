"""The persistent tile loop every role of a warp-specialised kernel walks (device side).

Each role builds its own iterator over the same static schedule (CUTLASS's static persistent
scheduler: CTA b takes tiles b, b + grid, ...), so producer, stages and consumers agree on the
tile sequence without talking to each other.
"""
from __future__ import annotations

from device.runtime import cute_modules

cutlass, cute = cute_modules()
import cutlass.utils as utils  # noqa: E402


def make_scheduler(sched_params):
    """This role's iterator over the CTA's tiles: ``initial_work_tile_info()``, then
    ``advance_to_next_work()`` / ``get_current_work()`` while ``is_valid_tile``."""
    return utils.StaticPersistentTileScheduler.create(sched_params, cute.arch.block_idx(),
                                                      cute.arch.grid_dim())


def k_range(k_per_split, k_tiles, split):
    """[kb0, kb1): the k-blocks of K split ``split``."""
    kb0 = split * k_per_split
    return kb0, cutlass.min(kb0 + k_per_split, k_tiles)
