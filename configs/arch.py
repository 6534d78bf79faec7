"""Hopper (sm_90a) facts and the GEMM tile constants every floor above reads: one definition each.

The model's own sizes live in :mod:`configs.codepredictor` (CodePredictor) and models.h3 (H3)."""
from __future__ import annotations

SMEM_PER_CTA_MAX = 227 * 1024  # bytes of shared memory one CTA may opt into on sm_90 (232448)
WARP = 32
WARPGROUP = 128  # threads: the unit a wgmma issues from
NVFP4_BLOCK = 16  # elements per NVFP4 scale block
SCALE_TILE_COLS = 4  # scale blocks per k-block column group of the 128x4 swizzled scale tile
K_BLOCK = NVFP4_BLOCK * SCALE_TILE_COLS  # K elements per GEMM k-block (64)
