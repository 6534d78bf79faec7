"""Register-order prepack of NVFP4 weights for a swap-AB, register-A wgmma consumer (issue #24).

The GEMM's swap-AB design reads this layout (producers/register_order.py copies its slabs,
consumers/register_a_wgmma.py loads them as wgmma A fragments); the p0 design reads Comfy's
packing by TMA.

Swap-AB computes D^T = W·x^T, so the weights W [N, K] sit on wgmma's M side as the
register-sourced A operand of ``wgmma.mma_async.m64nNk16.f32.f16.f16``: per k16 step a warpgroup
holds a 64-row slab of W as four f16x2 registers per thread. That fragment layout (PTX ISA,
"Register fragments and shared memory matrix layouts", wgmma .m64nNk16 matrix A in registers;
the same as CuTe's ``ALayout_64x16`` in ``cute/atom/mma_traits_sm90_gmma.hpp``) is, for thread t
of the warpgroup (warp w = t // 32, groupID = t % 32 // 4, tig = t % 4) and register j = 0..3:

    row = 16·w + groupID + 8·(j & 1),   k = 2·tig + 8·(j >> 1)  (and k + 1, the f16x2 pair)

k even, so each register's pair is exactly one byte of Comfy's packing (element k in the high
nibble): the prepack moves bytes and never touches nibbles, so its values are Comfy's.
Byte j of the thread's 32-bit word for step s is register j, and ``STEPS`` = 4 consecutive k16
steps (one 64-wide k-block, one 128x4 scale-tile column group) fill 16 bytes: one 128-bit load.

A k16 step is one 16-element scale block, and a thread's registers cover rows groupID and
groupID + 8 of its slab, so it needs two scale bytes per step, the same for the 4 threads of a
group: 8 bytes per (group, k-block), step-major, row groupID first (one 16-bit load per step
gives both rows to ``cvt.rn.f16x2.e4m3x2``).

Prepacked tensors, N and K zero-padded to multiples of 64 (zero codes times zero scales add 0):

    codes  uint8 [N64/64, K64/64, 128 threads, 16]  byte 4·s + j = register j of step s
    scales uint8 [N64/64, K64/64, 32 groups,    8]  byte 2·s + h = row groupID + 8·h, block s

so a warp's 32 loads cover 512 contiguous bytes (coalesced from global, conflict-free in smem).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from configs.arch import K_BLOCK
from numerics import nvfp4

SLAB_ROWS = nvfp4.PREPACK_SLAB_ROWS  # wgmma M: weight rows per warpgroup fragment
K_STEP = nvfp4.BLOCK  # wgmma K for f16 is 16 too: one scale block per k16 step
STEPS = nvfp4.PREPACK_STEPS  # k16 steps per 128-bit load (one k-block): 4 x 4 registers x 1 byte
assert K_STEP * STEPS == K_BLOCK
THREADS = nvfp4.PREPACK_THREADS  # one warpgroup
REGISTERS = 4  # f16x2 registers of A per thread and k16 step
GROUPS = nvfp4.PREPACK_GROUPS  # quads of threads sharing rows (and so scales)
ROW_HALVES = 2  # rows groupID and groupID + 8 of a thread


def fragment_coords(thread, register):
    """(row in the 64-row slab, k in the k16 step) of the first element of the f16x2 pair that
    A register ``register`` of warpgroup thread ``thread`` holds (ints or integer tensors)."""
    warp, lane = thread // 32, thread % 32
    group, tig = lane // 4, lane % 4
    return 16 * warp + group + 8 * (register % 2), 2 * tig + 8 * (register // 2)


def _code_index(n_slabs: int, n_kblocks: int):
    """(row, packed byte column) of every prepacked code byte, shaped like the codes tensor."""
    slab, kb, t, s, j = torch.meshgrid(
        torch.arange(n_slabs), torch.arange(n_kblocks), torch.arange(THREADS),
        torch.arange(STEPS), torch.arange(REGISTERS), indexing="ij")
    row, k = fragment_coords(t, j)
    shape = (n_slabs, n_kblocks, THREADS, STEPS * REGISTERS)
    return ((slab * SLAB_ROWS + row).reshape(shape),
            ((kb * K_BLOCK + s * K_STEP + k) // 2).reshape(shape))


def _scale_index(n_slabs: int, n_kblocks: int):
    """(row, block column) of every prepacked scale byte, shaped like the scales tensor."""
    slab, kb, grp, s, h = torch.meshgrid(
        torch.arange(n_slabs), torch.arange(n_kblocks), torch.arange(GROUPS),
        torch.arange(STEPS), torch.arange(ROW_HALVES), indexing="ij")
    row, _ = fragment_coords(4 * grp, h)  # register h: row groupID + 8·h
    shape = (n_slabs, n_kblocks, GROUPS, STEPS * ROW_HALVES)
    return (slab * SLAB_ROWS + row).reshape(shape), (kb * STEPS + s).reshape(shape)


@dataclass(frozen=True, eq=False)
class PrepackedWeights:
    """Register-order codes and scales (module docstring) of a [rows, cols] NVFP4 weight."""

    codes: torch.Tensor  # uint8 [N64/64, K64/64, 128, 16]
    scales: torch.Tensor  # uint8 [N64/64, K64/64, 32, 8]
    rows: int  # N
    cols: int  # K (elements)


def weight_rows(prepacked, K: int) -> int:
    """N of the prepacked weight an entry that reads only the prepack (P1, P2's work queue)
    multiplies an activation of K columns by; TypeError / ValueError (the host checks, before any
    launch) unless it is a PrepackedWeights of K columns and N is whole 16-byte output rows."""
    if not isinstance(prepacked, PrepackedWeights):
        raise TypeError("prepacked must be the weight's register-order prepack "
                        f"(kernels.nvfp4.prepack.prepack), got {type(prepacked).__name__}")
    N = prepacked.rows
    if prepacked.cols != K:
        raise ValueError(f"prepacked holds a [{N}, {prepacked.cols}] weight; x has K = {K}")
    if N % 8:
        raise ValueError(f"N = {N} must be a multiple of 8 (16-byte output rows)")
    return N


def _padded(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    out = torch.zeros(rows, cols, dtype=torch.uint8, device=t.device)
    out[:t.shape[0], :t.shape[1]] = t
    return out


def prepack(packed: torch.Tensor, scales: torch.Tensor) -> PrepackedWeights:
    """Comfy-packed weight codes uint8 [N, K/2] and their swizzled E4M3 scales
    [roundup(N,128), roundup(K/16,4)] -> :class:`PrepackedWeights` (same device).

    Raises (before any work) as :func:`numerics.nvfp4.dequantize` does for packed and scales:
    TypeError for a wrong dtype, ValueError for not 2-D, empty, off CPU/CUDA, on two devices,
    K not a multiple of 16 or scales not exactly the swizzled shape.
    """
    nvfp4._check_tensor("packed", packed, (torch.uint8,))
    N, K = packed.shape[0], 2 * packed.shape[1]
    nvfp4._check_packed(packed, scales, (N, K))
    n_slabs, n_kb = -(-N // SLAB_ROWS), -(-K // K_BLOCK)
    q = _padded(packed, n_slabs * SLAB_ROWS, n_kb * K_BLOCK // 2)
    s = _padded(nvfp4.from_blocked(scales.view(torch.uint8), N, K // nvfp4.BLOCK),
                n_slabs * SLAB_ROWS, n_kb * STEPS)
    rows, cols = (i.to(packed.device) for i in _code_index(n_slabs, n_kb))
    srows, scols = (i.to(packed.device) for i in _scale_index(n_slabs, n_kb))
    return PrepackedWeights(q[rows, cols], s[srows, scols], N, K)


def unpack(prepacked: PrepackedWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`prepack`: (packed uint8 [N, K/2], float8_e4m3fn scales in the 128x4
    swizzle, zero padded). Raises TypeError for anything but a :class:`PrepackedWeights`."""
    if not isinstance(prepacked, PrepackedWeights):
        raise TypeError(f"prepacked must be a PrepackedWeights, got {type(prepacked).__name__}")
    n_slabs, n_kb = prepacked.codes.shape[:2]
    device = prepacked.codes.device
    q = torch.zeros(n_slabs * SLAB_ROWS, n_kb * K_BLOCK // 2, dtype=torch.uint8, device=device)
    s = torch.zeros(n_slabs * SLAB_ROWS, n_kb * STEPS, dtype=torch.uint8, device=device)
    rows, cols = (i.to(device) for i in _code_index(n_slabs, n_kb))
    srows, scols = (i.to(device) for i in _scale_index(n_slabs, n_kb))
    q[rows, cols] = prepacked.codes
    s[srows, scols] = prepacked.scales
    N, K = prepacked.rows, prepacked.cols
    blocked = nvfp4.to_blocked(s[:N, :K // nvfp4.BLOCK].contiguous())
    return q[:N, :K // 2].contiguous(), blocked.view(torch.float8_e4m3fn)


@dataclass(frozen=True, eq=False)
class Nvfp4Weight:
    """One NVFP4 weight in every form a kernel may want, prepacked once: Comfy's packed codes
    [N, K/2] and swizzled scales (the p0 design's), the fp32 tensor scale g and the
    register-order prepack (the swap-AB design's: ``gemm_nvfp4(..., prepacked=)``)."""

    packed: torch.Tensor
    scales: torch.Tensor
    g: float
    prepacked: PrepackedWeights

    @classmethod
    def from_packed(cls, packed: torch.Tensor, scales: torch.Tensor, g) -> Nvfp4Weight:
        """Wrap Comfy-packed operands; raises as :func:`prepack` does, and for g as
        :func:`numerics.nvfp4.quantize` does (one finite real number >= +0)."""
        g = float(nvfp4._as_g(g, "cpu"))
        return cls(packed, scales, g, prepack(packed, scales))

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Nvfp4Weight:
        """Quantize a bf16/fp16 weight [N, K] (multiples of 16) with the reference quantizer
        (Comfy's CUDA kernel, bit for bit) and its own tensor scale; raises as
        :func:`numerics.nvfp4.quantize` does for x."""
        nvfp4._check_input(weight, pad_16x=False, mode="cuda")
        g = nvfp4.global_scale(weight)
        packed, scales = nvfp4.quantize(weight, g)
        return cls.from_packed(packed, scales, g)
