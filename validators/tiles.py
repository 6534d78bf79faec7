"""Random NVFP4 test tiles: the classes rungs 1-2 and the Comfy parity run draw from.

Kinds: ``normal`` (randn), ``lognormal`` (per-block magnitudes log-normal with σ=4, so some blocks
get zero or subnormal scales), ``ties`` (values on a 0.25·g·s grid, E2M1 ties everywhere),
``special`` (normal data sprinkled with ±0, NaN, ±inf and denormals).
"""
from __future__ import annotations

import torch

from numerics.nvfp4 import global_scale

KINDS = ("normal", "lognormal", "ties", "special")


def make_tile(kind: str, rows: int, cols: int, dtype=torch.bfloat16, seed: int = 0,
              device="cpu") -> torch.Tensor:
    if kind not in KINDS:
        raise ValueError(f"unknown tile kind {kind!r}; choose from {KINDS}")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen)
    if kind == "lognormal":
        mag = torch.exp(4.0 * torch.randn(rows, cols // 16, 1, generator=gen))
        x = (x.view(rows, cols // 16, 16) * mag).view(rows, cols)
    elif kind == "ties":
        k = torch.randint(-24, 25, (rows, cols), generator=gen).float()
        k.view(-1, 16)[:, 0] = 24.0 * torch.where(torch.rand(rows * cols // 16, generator=gen)
                                                  < 0.5, -1.0, 1.0)
        scale = 2.0 ** torch.randint(-8, 8, (rows, cols // 16, 1), generator=gen).float()
        x = (k.view(rows, cols // 16, 16) * 0.25 * scale).view(rows, cols)
    elif kind == "special":
        r = torch.rand(rows, cols, generator=gen)
        specials = torch.tensor([0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e-39,
                                 -3e-40])
        pick = specials[torch.randint(0, len(specials), (rows, cols), generator=gen)]
        x = torch.where(r < 0.05, pick, x)
    x = x.to(dtype)
    return x.to(device)


def tensor_scale_for(x: torch.Tensor) -> float:
    """g the way a user would compute it, ignoring NaN/inf so special tiles still get a finite g."""
    finite = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    return float(global_scale(finite))
