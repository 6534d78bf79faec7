"""Philox4x32-10 in plain torch (int64 lanes holding uint32 values), CPU and CUDA alike.

A counter-based generator: the output depends only on (key, counter), so a draw for request r at
offset o and vocabulary index i is the same whatever else is in the batch.
"""
from __future__ import annotations

import torch

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF


def _mulhilo(a: int, b: torch.Tensor):
    p = b * a  # < 2^64 fits in int64 only up to 2^63: split to stay exact
    lo = p & MASK
    hi = ((b >> 16) * a + (((b & 0xFFFF) * a) >> 16)) >> 16
    return hi & MASK, lo


def philox4x32(counter: tuple, key: tuple, rounds: int = 10):
    """counter: 4 int64 tensors (uint32 values), key: 2 tensors -> 4 uint32 outputs."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(rounds):
        hi0, lo0 = _mulhilo(M0, c0)
        hi1, lo1 = _mulhilo(M1, c2)
        c0, c1, c2, c3 = (hi1 ^ c1 ^ k0) & MASK, lo1, (hi0 ^ c3 ^ k1) & MASK, lo0
        k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
    return c0, c1, c2, c3


def uniform(seed: torch.Tensor, offset: torch.Tensor, n: int) -> torch.Tensor:
    """[R, n] float64 uniforms in (0, 1), keyed by per-row seed (key) and offset (counter)."""
    dev = seed.device
    seed = seed.to(torch.int64).view(-1, 1)
    offset = offset.to(torch.int64).view(-1, 1)
    idx = torch.arange(n, device=dev, dtype=torch.int64).view(1, -1)
    shape = (seed.shape[0], n)
    c = (idx.expand(shape) & MASK, (offset & MASK).expand(shape),
         ((offset >> 32) & MASK).expand(shape), torch.zeros(shape, dtype=torch.int64, device=dev))
    k = ((seed & MASK).expand(shape), ((seed >> 32) & MASK).expand(shape))
    r0, r1, _, _ = philox4x32(c, k)
    bits53 = (r0 << 21) | (r1 >> 11)  # 53 random bits
    return (bits53.to(torch.float64) + 0.5) * 2.0**-53
