"""The weight producers of the swap-AB designs: one warp streams, per k-block, the CTA's two
64-row weight slabs of the register-order prepack (kernels/nvfp4/prepack.py) by 1-D bulk copies
into the weight ring; the subclasses say what else a ring stage holds of the activation.

Role contract (kernels/nvfp4/gemm_shell.py): warpgroup 0, only its warp 0 works, 24 registers.
Owns the weight ring (:class:`PackedRingOwner`): stage ``s`` holds per weight slab w (0, 1) its
codes [128 threads][16 B] (2048 B) and scales [32 groups][8 B] (256 B), both contiguous in the
prepack, so one bulk copy each. ``full[s]``: one arrive + the stage's bytes (a last tile's
missing slab is neither copied nor counted); waits on ``empty[s]`` (its readers' arrivals).
(The producer that also TMA'd the packed activation into each stage, for the packed swap-AB
design, lost to the f16 builds and left the code: notes/p0-gemm.md, session 27.)
"""
from __future__ import annotations

from configs.arch import K_BLOCK
from device.barriers import Barrier
from device.ptx import bulk_copy_g2s
from device.runtime import cute_modules
from device.tiles import for_each_tile
from device.waits import acquire_stage
from numerics.nvfp4 import PREPACK_GROUPS as GROUPS
from numerics.nvfp4 import PREPACK_SLAB_ROWS as SLAB_ROWS
from numerics.nvfp4 import PREPACK_THREADS as THREADS
from numerics.nvfp4 import SCALE_TILE_ROWS

cutlass, cute = cute_modules()
from cutlass import BFloat16, Float16, Int32, Uint8  # noqa: E402
from cutlass.cute.nvgpu import cpasync  # noqa: E402

SLAB_CODE_BYTES = THREADS * 16  # one slab's codes of one k-block
SLAB_SCALE_BYTES = GROUPS * 8


class PackedRingOwner:
    """The role contract of a producer that owns the weight ring: ``stages`` stages of
    ``stage_bytes``, ``full[s]`` completed by its one arrive and the TMA / bulk-copy bytes,
    ``empty[s]`` waited on before a stage is refilled (its readers declare their arrivals, and
    their own ``stages``, which the shell checks against ours).

    ``extra_tx_bytes``: bytes announced on ``full[s]`` beyond what the copies deliver. Only the
    stall study (kernels.nvfp4.gemm_shell.P0Variant) sets it: then the first ``full`` never
    completes and the bounded wait traps."""

    extra_tx_bytes = 0

    def barriers(self) -> dict:
        return {"full": self.stages, "empty": self.stages}

    def arrivals(self) -> dict:
        return {"full": 1}

    def waits(self) -> tuple:
        return ("empty",)

    def smem_bytes(self) -> int:
        return self.stages * self.stage_bytes + 4 * 128  # + alignment of up to four arrays


def weight_slab_views(b_ptr, sfb_ptr, N: Int32, k32: Int32):
    """(prepacked codes, prepacked scales, slab count): the register-order prepack's slabs of
    SLAB_ROWS weight rows x one k-block, as flat byte tensors."""
    n_slabs = (N + SLAB_ROWS - 1) // SLAB_ROWS
    k_tiles = (k32 + 1) // 2
    codes = cute.make_tensor(b_ptr, cute.make_layout(n_slabs * k_tiles * SLAB_CODE_BYTES))
    scales = cute.make_tensor(sfb_ptr, cute.make_layout(n_slabs * k_tiles * SLAB_SCALE_BYTES))
    return codes, scales, n_slabs

class RegisterOrderProducer(PackedRingOwner):
    """The weight ring of the register-order prepack's slabs, what its subclasses share.
    Static config: ``tile_m`` token rows, ``tile_n`` weight rows (two 64-row slabs) and the
    ring depth ``stages``; ``act_bytes``, what a stage holds of the activation (the
    subclass's)."""

    warpgroups, regs = 1, 24

    def __init__(self, tile_m: int, tile_n: int, stages: int):
        self.check_tile(tile_m, tile_n)
        self.tile_m, self.tile_n, self.stages = tile_m, tile_n, stages
        self.slabs = tile_n // SLAB_ROWS
        self.act_bytes = 0
        self.slab_bytes = SLAB_CODE_BYTES + SLAB_SCALE_BYTES
        self.stage_bytes = self.act_bytes + self.slabs * self.slab_bytes

    @staticmethod
    def check_tile(tile_m: int, tile_n: int) -> None:
        """Tokens in whole 128-row tiles (the f16 builds' TMA boxes); two weight slabs, one a
        consumer warpgroup."""
        if tile_m % SCALE_TILE_ROWS:
            raise ValueError(f"tokens = {tile_m}: use a multiple of {SCALE_TILE_ROWS}")
        if tile_n != 2 * SLAB_ROWS:
            raise ValueError(f"tile_n = {tile_n}: the consumer's two warpgroups take one "
                             f"{SLAB_ROWS}-row slab each")

    def allocate(self, alloc) -> dict:
        n = self.stages * self.slabs
        wq = alloc.allocate_tensor(Uint8, cute.make_layout(n * SLAB_CODE_BYTES), 128)
        ws = alloc.allocate_tensor(Uint8, cute.make_layout(n * SLAB_SCALE_BYTES), 128)
        return {"w_codes": wq, "w_scales": ws}

    @cute.jit
    def copy_slabs(self, codes, scales, wq, ws, slab0: Int32, valid: Int32, kt: Int32,
                   k_tiles: Int32, s: Int32, bar):
        """Bulk-copy k-block ``kt``'s weight slabs ``slab0 ..`` (the ``valid`` ones inside N)
        into stage ``s``, completing on ``bar``. Called by one elected thread."""
        for w in cutlass.range_constexpr(self.slabs):
            if w < valid:
                blk = (slab0 + w) * k_tiles + kt
                dst = s * self.slabs + w
                bulk_copy_g2s(wq + dst * SLAB_CODE_BYTES,
                              codes.iterator + blk * SLAB_CODE_BYTES, SLAB_CODE_BYTES, bar)
                bulk_copy_g2s(ws + dst * SLAB_SCALE_BYTES,
                              scales.iterator + blk * SLAB_SCALE_BYTES, SLAB_SCALE_BYTES, bar)


class WeightsOnlyRegisterOrderProducer(RegisterOrderProducer):
    """The f16 builds' producer (kernels.nvfp4.gemm_shell.BlockscaledGemmSm90.swap_ab_f16 and
    wide_f16; notes/p0-gemm.md, P0 v3 measurement 1(c), session 22): the ring holds only the two
    weight slabs; the activation comes already expanded to f16 by its own TMA role
    (:class:`producers.activation_stage.F16TmaActivationStage`), which reads the TMA atom this
    producer builds over the f16 activation [M, K] (the ``a`` buffer). ``full[s]``: one arrive
    + the slabs' bytes; ``empty[s]``: the consumers' 8 warp arrivals."""

    def global_views(self, a_ptr, sfa_ptr, b_ptr, sfb_ptr, M: Int32, N: Int32, k32: Int32):
        """(the f16 activation's TMA atom and tensor; (prepacked codes, scales, slab count))."""
        K = k32 * 32
        gA = cute.make_tensor(cute.recast_ptr(a_ptr, dtype=Float16),
                              cute.make_layout((M, K), stride=(K, 1)))
        tma = [cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), gA,
                                           f16_box_layout(self.tile_m), (self.tile_m, K_BLOCK))]
        return tma, weight_slab_views(b_ptr, sfb_ptr, N, k32)

    @cute.jit
    def run(self, ctx, rt: Int32):
        if rt // 32 == 0:
            sm = ctx.smem
            for_each_tile(ctx.tiles, self.fill_weights,
                          (ctx.globals, sm["w_codes"].iterator, sm["w_scales"].iterator,
                           ctx.bars["full"], ctx.bars["empty"], ctx.mailbox, ctx.tiles.k_tiles))

    @cute.jit
    def fill_weights(self, tile, args, count: Int32) -> Int32:
        """Per k-block of ``tile``: wait for the stage, announce and bulk-copy its weight slabs
        (those inside N)."""
        (codes, scales, n_slabs), wq, ws, full, empty, mailbox, k_tiles = args
        slab0 = tile.n * self.slabs
        valid = cutlass.min(n_slabs - slab0, self.slabs)
        tx = valid * self.slab_bytes
        for kt in cutlass.range(tile.k0, tile.k1, unroll=1):
            s, bar = acquire_stage(count, self.stages, empty, full, tx, Barrier.EMPTY, mailbox)
            with cute.arch.elect_one():
                self.copy_slabs(codes, scales, wq, ws, slab0, valid, kt, k_tiles, s, bar)
            count = count + 1
        return count


def f16_box_layout(rows: int, dtype=Float16):
    """The shared-memory image of one f16 activation tile: ``rows`` x 64 (one k-block), K-major
    in 8-row 128-byte-swizzled atoms (wgmma's SW128 K-major B, what the activation stage's
    expansion writes); with ``dtype`` BFloat16 the same bytes for a bf16 tile (P1's ring)."""
    atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
        cute.nvgpu.warpgroup.SmemLayoutAtomKind.K_SW128, dtype)
    return cute.tile_to_shape(atom, (rows, K_BLOCK), order=(0, 1))


class Bf16RegisterOrderProducer(RegisterOrderProducer):
    """P1's producer (kernels.nvfp4.gemm_shell.P1Study; notes/p1.md): stage ``s`` holds the
    token tile's k-block as **bf16** (``tile_m`` x 64, 128-byte-swizzled K-major, one TMA over
    the bf16 activation [M, K] in the ``a`` buffer) beside :class:`RegisterOrderProducer`'s two
    weight slabs; no packed activation or activation scale exists anywhere. ``full[s]``: one arrive + the bf16 tile's bytes + the slabs'; ``empty[s]``: the
    quantizing activation stage's 4 warps and the consumers' 8
    (producers.activation_stage.QuantizingActivationStage).

    ``peers`` C > 1 (P1's cluster, producers.activation_stage.
    ClusterQuantizingActivationStage): the bf16 tile of ring use ``count`` is loaded only by
    its owner, rank ``count`` mod C (the others' ``full[s]`` then expects the slabs alone), so
    the cluster reads the token tile once a K pass, as one CTA does."""

    def __init__(self, tile_m: int, tile_n: int, stages: int, peers: int = 1):
        super().__init__(tile_m, tile_n, stages)
        self.act_bytes = tile_m * K_BLOCK * 2
        self.stage_bytes = self.act_bytes + self.slabs * self.slab_bytes
        self.peers = peers

    @staticmethod
    def check_tile(tile_m: int, tile_n: int) -> None:
        """Tokens 64 or 128 (no scale tiles: the ring holds bf16); two weight slabs, or four
        for P1's N-group reuse (consumers.register_a_wgmma.GroupedRegisterAWgmmaConsumer)."""
        if tile_m not in (64, 128):
            raise ValueError(f"tokens = {tile_m}: P1's bf16 ring holds 64 or 128 rows")
        if tile_n not in (2 * SLAB_ROWS, 4 * SLAB_ROWS):
            raise ValueError(f"tile_n = {tile_n}: two {SLAB_ROWS}-row slabs, or four (N-group "
                             "reuse)")

    def allocate(self, alloc) -> dict:
        raw = alloc.allocate(self.stages * self.act_bytes, 1024)
        staged = cute.append(f16_box_layout(self.tile_m, BFloat16),
                             cute.make_layout(self.stages, stride=self.tile_m * K_BLOCK))
        n = self.stages * self.slabs
        wq = alloc.allocate_tensor(Uint8, cute.make_layout(n * SLAB_CODE_BYTES), 128)
        ws = alloc.allocate_tensor(Uint8, cute.make_layout(n * SLAB_SCALE_BYTES), 128)
        return {"x_bf16": raw,
                "x_bf16_tma": cute.make_tensor(cute.recast_ptr(raw, dtype=BFloat16), staged),
                "w_codes": wq, "w_scales": ws}

    def smem_bytes(self) -> int:
        return super().smem_bytes() + 1024  # the bf16 ring's 1024-byte alignment

    def global_views(self, a_ptr, sfa_ptr, b_ptr, sfb_ptr, M: Int32, N: Int32, k32: Int32):
        """(the bf16 activation's TMA atom and tensor; (prepacked codes, scales, slab count))."""
        K = k32 * 32
        gX = cute.make_tensor(cute.recast_ptr(a_ptr, dtype=BFloat16),
                              cute.make_layout((M, K), stride=(K, 1)))
        tma = [cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), gX,
                                           f16_box_layout(self.tile_m, BFloat16),
                                           (self.tile_m, K_BLOCK))]
        return tma, weight_slab_views(b_ptr, sfb_ptr, N, k32)

    @cute.jit
    def run(self, ctx, rt: Int32):
        if rt // 32 == 0:
            sm = ctx.smem
            atom, tensor = ctx.tma[0]
            tiles = cute.local_tile(tensor, (self.tile_m, K_BLOCK), (None, None))
            ts, tg = cpasync.tma_partition(atom, 0, cute.make_layout(1),
                                           cute.group_modes(sm["x_bf16_tma"], 0, 2),
                                           cute.group_modes(tiles, 0, 2))
            for_each_tile(ctx.tiles, self.fill_bf16_tile,
                          ((atom, tg, ts), ctx.globals, sm["w_codes"].iterator,
                           sm["w_scales"].iterator, ctx.bars["full"], ctx.bars["empty"],
                           ctx.mailbox, ctx.tiles.k_tiles))

    @cute.jit
    def fill_bf16_tile(self, tile, args, count: Int32) -> Int32:
        """Per k-block of ``tile``: wait for the stage to be free, announce its bytes, TMA the
        bf16 token tile's k-block and bulk-copy the weight slabs (those inside N)."""
        (atom, tg, ts), (codes, scales, n_slabs), wq, ws, full, empty, mailbox, k_tiles = args
        slab0 = tile.n * self.slabs
        valid = cutlass.min(n_slabs - slab0, self.slabs)
        tx = self.act_bytes + valid * self.slab_bytes + self.extra_tx_bytes
        rank = Int32(0)
        if cutlass.const_expr(self.peers > 1):
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        for kt in cutlass.range(tile.k0, tile.k1, unroll=1):
            if cutlass.const_expr(self.peers == 1):
                s, bar = acquire_stage(count, self.stages, empty, full, tx, Barrier.EMPTY,
                                       mailbox)
                cute.copy(atom, tg[(None, tile.m, kt)], ts[(None, s)], tma_bar_ptr=bar)
            else:
                owner = count % self.peers == rank
                s, bar = acquire_stage(count, self.stages, empty, full,
                                       cutlass.select_(owner, tx, tx - self.act_bytes),
                                       Barrier.EMPTY, mailbox)
                if owner:
                    cute.copy(atom, tg[(None, tile.m, kt)], ts[(None, s)], tma_bar_ptr=bar)
            with cute.arch.elect_one():
                self.copy_slabs(codes, scales, wq, ws, slab0, valid, kt, k_tiles, s, bar)
            count = count + 1
        return count
