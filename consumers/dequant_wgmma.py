"""Dequantising WGMMA consumer (P0): packed NVFP4 stage -> exact f16 tiles in smem -> wgmma.

Hopper has no FP4 conversion and no block-scaled MMA, but every E2M1 x E4M3 product is exact in
f16 (at most 6 significant bits, 2^-10 .. 2688). So the two consumer warpgroups (256 threads)
expand each packed stage into f16 A [tile_m, 64] and B [tile_n, 64] tiles in the 128-byte-swizzled
K-major layout wgmma reads, then run f16 x f16 -> fp32 wgmma (m64 x tile_n x k16) on them; the
fp32 sums are the only rounding. Both operands come from smem because B must (wgmma has no
register-sourced B) and each B tile is shared by both warpgroups.

Per k-block and thread: one 16-byte chunk of packed A (32 codes of one row) and tile_n/128 chunks
of B, each: ``ld.shared.v4``, one 16-bit scale-pair load from the swizzled scale tile, 4 x 8 codes
through :func:`kernels.device.nvfp4.dequant_e2m1_word` (~17 instructions per 8 codes), four
``st.shared.v4`` at swizzled addresses (conflict-free: the 8 lanes of a store phase hit 8
different 16-byte columns).

Buffering: three f16 buffers and one named barrier per k-block; each warpgroup keeps one
commit group in flight (``wait_group(1)`` after issuing). Iteration j writes buffer j % 3, last
read by wgmma j-3; every warpgroup retired that group at the end of iteration j-2 and then
arrived at the barrier of iteration j-1, which the writer passed. So the expansion of k-block j+1
waits for wgmma j-1 to finish. Four buffers (two groups in flight) removed that wait and changed
nothing measurable (notes/p0-gemm.md v3): expansion and MMA contend for issue slots and
shared-memory bandwidth rather than wait on each other, so the option left the code.
"""
from __future__ import annotations

from kernels.device.nvfp4 import dequant_e2m1_word, e4m3x2_scales_x64, scale_tile_offset
from kernels.device.ptx import prmt
from kernels.device.runtime import cute_modules

cutlass, cute = cute_modules()
from cutlass import Float16, Float32, Int32, Uint32  # noqa: E402
from cutlass.cute.nvgpu import warpgroup  # noqa: E402
from cutlass.utils import hopper_helpers as sm90_utils  # noqa: E402

from numerics.nvfp4 import SCALE_TILE_BYTES, SCALE_TILE_ROWS  # noqa: E402

TILE_K = 64
F16_BUFFERS = 3  # see Buffering above
CONSUMER_THREADS = 256
ROW_WORDS = TILE_K * 2 // 4  # one 64-element f16 row = 128 B = 32 words = 8 swizzle chunks


class DequantWgmmaConsumer:
    """Static config: CTA tile (tile_m, tile_n) in {(128, 128), (128, 256)}: the two warpgroups
    split M in 64-row slabs (128 accumulator registers per thread at most), and every tile covers
    whole 128-row scale tiles. 256 x 128 tiles were measured slower (notes/p0-gemm.md v2)."""

    TILES = ((128, 128), (128, 256))

    def __init__(self, tile_m: int, tile_n: int):
        if (tile_m, tile_n) not in self.TILES:
            raise ValueError(f"tile ({tile_m}, {tile_n}) not supported; choose from {self.TILES}")
        self.buffers = F16_BUFFERS
        self.mma_in_flight = F16_BUFFERS - 2
        self.tile_m, self.tile_n = tile_m, tile_n
        self.threads = CONSUMER_THREADS

    # ---- host side ------------------------------------------------------------------------
    def tiled_mma(self):
        k_major = warpgroup.OperandMajorMode.K
        return sm90_utils.make_trivial_tiled_mma(Float16, Float16, k_major, k_major, Float32,
                                                 (2, 1, 1), tiler_mn=(64, self.tile_n))

    def smem_layouts(self):
        """f16 (A, B) layouts [rows, 64, buffers], 128-byte swizzle, K-major."""
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, Float16)
        return tuple(cute.tile_to_shape(atom, (rows, TILE_K, self.buffers), order=(0, 1, 2))
                     for rows in (self.tile_m, self.tile_n))

    # ---- device side ----------------------------------------------------------------------
    @cute.jit
    def dequant_rows(self, ct: Int32, rows: cutlass.Constexpr[int], q_words: cute.Tensor,
                     sf_pairs: cute.Tensor, f16_words: cute.Tensor, stage: Int32, buf: Int32):
        """Expand ``rows`` x 64 codes of packed stage ``stage`` into f16 buffer ``buf``.

        ``q_words``: packed ring as (4 words, 16-byte chunk) — chunk (s·rows + r)·2 + half.
        ``sf_pairs``: scale ring as uint16 pairs. ``f16_words``: f16 ring as (4 words, chunk).
        """
        for i in cutlass.range_constexpr(rows // 128):
            r = i * 128 + (ct >> 1)
            half = ct & 1
            frag = cute.make_rmem_tensor((4,), Uint32)
            cute.autovec_copy(q_words[(None, (stage * rows + r) * 2 + half)], frag)
            # the scales of block columns 2·half, 2·half + 1 of row r: one 16-bit pair of tile i
            tile = stage * (rows // SCALE_TILE_ROWS) + i
            in_tile = scale_tile_offset(r & (SCALE_TILE_ROWS - 1), half * 2)
            pair = tile * (SCALE_TILE_BYTES // 2) + (in_tile >> 1)
            sv = e4m3x2_scales_x64(Uint32(sf_pairs[pair]))
            scales = (prmt(sv, sv, 0x1010), prmt(sv, sv, 0x3232))
            out_row = (buf * rows + r) * (ROW_WORDS // 4)
            for j in cutlass.range_constexpr(4):
                words = dequant_e2m1_word(frag[j], scales[j // 2])
                out = cute.make_rmem_tensor((4,), Uint32)
                for e in cutlass.range_constexpr(4):
                    out[e] = words[e]
                chunk = (half * 4 + j) ^ (r & 7)
                cute.autovec_copy(out, f16_words[(None, out_row + chunk)])

    @cute.jit
    def mma(self, tiled_mma, acc, tCrA, tCrB, buf: Int32):
        """Issue the 4 k16 wgmmas of one k-block on f16 buffer ``buf`` as one commit group."""
        warpgroup.fence()
        for kb in cutlass.range_constexpr(TILE_K // 16):
            cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, buf)], tCrB[(None, None, kb, buf)],
                      acc)
        warpgroup.commit_group()


__all__ = ["DequantWgmmaConsumer", "F16_BUFFERS", "TILE_K"]
