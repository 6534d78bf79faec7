"""Dequantising WGMMA consumer (P0): packed NVFP4 stage -> exact f16 tiles in smem -> wgmma.

Hopper has no FP4 conversion and no block-scaled MMA, but every E2M1 x E4M3 product is exact in
f16 (at most 6 significant bits, 2^-10 .. 2688). So the two consumer warpgroups (256 threads)
expand each packed stage into f16 A [tile_m, 64] and B [tile_n, 64] tiles in the 128-byte-swizzled
K-major layout wgmma reads (device.nvfp4.expand_stage_rows), then run f16 x f16 -> fp32
wgmma (m64 x tile_n x k16) on them; the fp32 sums are the only rounding.

Role contract (kernels/nvfp4/gemm_shell.py): warpgroups 1-2 at 232 registers; reads the
producer's ring of ``stages`` stages: waits on its ``full``, arrives on its ``empty`` once per
warp and stage (8 arrivals). Its 256 threads (``threads``) call the epilogue after each tile;
``named_barriers`` declares the one they sync on themselves, which the epilogue must not use.

Buffering: three f16 buffers and one named barrier (NamedBarrier.CONSUMERS, 256 threads) per
k-block; each warpgroup keeps one commit group in flight (``wait_group(1)`` after issuing).
Iteration j writes buffer j % 3, last read by wgmma j-3; every warpgroup retired that group at
the end of iteration j-2 and then arrived at the barrier of iteration j-1, which the writer
passed. Four buffers (two groups in flight) changed nothing measurable (notes/p0-gemm.md v3):
expansion and MMA contend for issue slots and shared-memory bandwidth rather than wait on each
other.
"""
from __future__ import annotations

from configs.arch import K_BLOCK, WARP, WARPGROUP
from device.barriers import Barrier, NamedBarrier
from device.nvfp4 import expand_stage_rows, word_view
from device.runtime import cute_modules
from device.tiles import for_each_tile
from device.waits import ring_position, wait_parity
from epilogues import OutputTile

cutlass, cute = cute_modules()
from cutlass import Float16, Float32, Int32, Uint16  # noqa: E402
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup  # noqa: E402
from cutlass.utils import hopper_helpers as sm90_utils  # noqa: E402

F16_BUFFERS = 3  # see Buffering above


class DequantWgmmaConsumer:
    """Static config: CTA tile (tile_m, tile_n) in {(128, 128), (128, 256)}: the two warpgroups
    split M in 64-row slabs (128 accumulator registers per thread at most), and every tile covers
    whole 128-row scale tiles. 256 x 128 tiles were measured slower (notes/p0-gemm.md v2).
    ``stages``: the producer's ring depth. ``expand`` / ``mma``: the two halves of the mainloop,
    each off only in a measurement build (kernels.nvfp4.gemm_shell.P0Variant)."""

    TILE_M = 128
    TILE_NS = (128, 256)
    warpgroups, regs = 2, 232
    expand = mma = True

    def __init__(self, tile_m: int, tile_n: int, stages: int):
        if tile_m != self.TILE_M or tile_n not in self.TILE_NS:
            raise ValueError(f"tile ({tile_m}, {tile_n}) not supported; choose ({self.TILE_M}, "
                             f"n) with n in {self.TILE_NS}")
        self.buffers = F16_BUFFERS
        self.mma_in_flight = F16_BUFFERS - 2
        self.tile_m, self.tile_n, self.stages = tile_m, tile_n, stages
        self.threads = self.warpgroups * WARPGROUP

    # ---- the role contract ----------------------------------------------------------------
    def barriers(self) -> dict:
        return {}

    def arrivals(self) -> dict:
        return {"empty": self.threads // WARP}

    def waits(self) -> tuple:
        return ("full",)

    def named_barriers(self) -> dict:
        """{id: threads} of the named barriers the consumer syncs its threads on."""
        return {NamedBarrier.CONSUMERS: self.threads}  # a k-block's f16 tiles are written

    def smem_bytes(self) -> int:
        return (self.tile_m + self.tile_n) * K_BLOCK * 2 * self.buffers + 2048

    def allocate(self, alloc) -> dict:
        out = {}
        for name, lay, rows in zip(("f16_a", "f16_b"), self.smem_layouts(),
                                   (self.tile_m, self.tile_n)):
            raw = alloc.allocate(rows * K_BLOCK * 2 * self.buffers, 1024)
            out[name] = cute.make_tensor(cute.recast_ptr(raw, lay.inner, dtype=Float16),
                                         lay.outer)
            out[name + "_raw"] = raw  # the unswizzled address, for the expansion's stores
        return out

    # ---- host side ------------------------------------------------------------------------
    def tiled_mma(self):
        k_major = OperandMajorMode.K
        return sm90_utils.make_trivial_tiled_mma(Float16, Float16, k_major, k_major, Float32,
                                                 (2, 1, 1), tiler_mn=(64, self.tile_n))

    def smem_layouts(self):
        """f16 (A, B) layouts [rows, 64, buffers], 128-byte swizzle, K-major."""
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, Float16)
        return tuple(cute.tile_to_shape(atom, (rows, K_BLOCK, self.buffers), order=(0, 1, 2))
                     for rows in (self.tile_m, self.tile_n))

    # ---- device side ----------------------------------------------------------------------
    @cute.jit
    def run(self, ctx, ct: Int32):
        tiled_mma = ctx.tiled_mma
        sm = ctx.smem
        wg = ct // WARPGROUP
        lane = ct % WARP
        sA, sB = sm["f16_a"], sm["f16_b"]
        wg_mma = tiled_mma.get_slice(wg * WARPGROUP)  # smem descriptors: one per warpgroup
        thr_mma = tiled_mma.get_slice(ct)  # accumulator registers: one per thread
        tCrA = tiled_mma.make_fragment_A(wg_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(wg_mma.partition_B(sB))
        tile_mn = (self.tile_m, self.tile_n)
        acc = cute.make_rmem_tensor(
            thr_mma.partition_C(cute.make_identity_tensor(tile_mn)).shape, Float32)
        # raw word views for the dequant loads and swizzled stores
        q_a, q_b = word_view(sm["q_a"].iterator, cute.cosize(sm["q_a"].layout)), \
            word_view(sm["q_b"].iterator, cute.cosize(sm["q_b"].layout))
        sf_a = cute.make_tensor(cute.recast_ptr(sm["s_a"].iterator, dtype=Uint16),
                                cute.make_layout(cute.cosize(sm["s_a"].layout) // 2))
        sf_b = cute.make_tensor(cute.recast_ptr(sm["s_b"].iterator, dtype=Uint16),
                                cute.make_layout(cute.cosize(sm["s_b"].layout) // 2))
        f_a = word_view(sm["f16_a_raw"], self.tile_m * K_BLOCK * 2 * self.buffers)
        f_b = word_view(sm["f16_b_raw"], self.tile_n * K_BLOCK * 2 * self.buffers)
        n_tiles = (ctx.epi.d.shape[1] * 2 + self.tile_n - 1) // self.tile_n
        for_each_tile(ctx.tiles, self.consume_tile,
                      (tiled_mma, thr_mma, tCrA, tCrB, acc, q_a, q_b, sf_a, sf_b, f_a, f_b,
                       ctx.bars["full"], ctx.bars["empty"], ctx.epilogue, ctx.epi, ctx.mailbox,
                       n_tiles, ct, lane))

    @cute.jit
    def consume_tile(self, tile, args, count: Int32) -> Int32:
        """Per k-block of ``tile``: wait for the stage, expand it into the next f16 buffer,
        release it, and issue the k-block's wgmmas; then the epilogue."""
        (tiled_mma, thr_mma, tCrA, tCrB, acc, q_a, q_b, sf_a, sf_b, f_a, f_b, full, empty,
         epilogue, epi, mailbox, n_tiles, ct, lane) = args
        acc.fill(0.0)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        for kt in cutlass.range(tile.k0, tile.k1, unroll=1):
            s, ph = ring_position(count, self.stages)
            buf = count % self.buffers
            wait_parity(full + s, ph, Barrier.FULL, s, mailbox)
            if cutlass.const_expr(self.expand):
                expand_stage_rows(ct, self.threads, self.tile_m, q_a, sf_a, f_a, s, buf)
                expand_stage_rows(ct, self.threads, self.tile_n, q_b, sf_b, f_b, s, buf)
            # our f16 stores -> wgmma (async proxy); our packed reads -> the next TMA
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_warp()
            if lane == 0:
                cute.arch.mbarrier_arrive(empty + s)
            cute.arch.barrier(barrier_id=NamedBarrier.CONSUMERS, number_of_threads=self.threads)
            if cutlass.const_expr(self.mma):
                warpgroup.fence()
                for kb in cutlass.range_constexpr(K_BLOCK // 16):
                    cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, buf)],
                              tCrB[(None, None, kb, buf)], acc)
                warpgroup.commit_group()
                warpgroup.wait_group(self.mma_in_flight)
            count = count + 1
        warpgroup.wait_group(0)
        epilogue.store(self.output_pairs(acc, thr_mma, (self.tile_m, self.tile_n)), epi,
                       OutputTile(m0=tile.m * self.tile_m, n0=tile.n * self.tile_n,
                                  tile_id=tile.m * n_tiles + tile.n, split=tile.split, ct=ct,
                                  segments=tile.segments))
        return count

    @staticmethod
    def output_pairs(acc, thr_mma, tile_mn):
        """[(m, n, x0, x1)]: the thread's accumulators as D-row pairs in tile coordinates (the
        wgmma C layout: registers 2i, 2i+1 are columns n, n+1 of one row)."""
        coords = thr_mma.partition_C(cute.make_identity_tensor(tile_mn))
        out = []
        for i in range(0, cute.size(acc), 2):
            m, n = coords[i]
            out.append((m, n, acc[i], acc[i + 1]))
        return out


__all__ = ["DequantWgmmaConsumer", "F16_BUFFERS"]
