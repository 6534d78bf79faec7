"""TMA producer of prepacked NVFP4 operands (P0): one warp streams packed A, B and their scales.

Role contract (kernels/nvfp4/gemm_shell.py): warpgroup 0, only its warp 0 works. Owns the packed
ring: stage ``s`` holds, for one (tile, k-block), A codes [tile_m, 32 B], B codes [tile_n, 32 B]
(row-major, 64 K-elements two per byte, Comfy's nibble order) and the scale bytes of those rows
and 4 block columns: ``rows/128`` cuBLAS 128x4 swizzle tiles of 512 B, exactly as they sit in
Comfy's swizzled scale buffer. ``full[s]`` completes when all of the stage's bytes have landed
(one arrive + transaction bytes); the producer waits on ``empty[s]`` (its readers' arrivals)
before overwriting the stage. Rows past M or N and K past the end are zero-filled by the TMA
unit (zero codes -> zero products), so partial tiles need no special case.

Scale tiles are contiguous: tile (r, c) of a [R, C] swizzled buffer starts at byte
512·(r·C/4 + c/4). Viewing the buffer as [R/128, C/2, 256] makes a (rows/128, 2, 256) TMA box
fetch the scale tiles of one k-block (a box dimension may not exceed 256 elements). The helpers
below do this per operand; :mod:`producers.register_order` uses them for its activation.
"""
from __future__ import annotations

from configs.arch import K_BLOCK
from device.barriers import Barrier
from device.runtime import cute_modules
from device.tiles import for_each_tile
from device.waits import acquire_stage
from numerics.nvfp4 import SCALE_TILE_BYTES, SCALE_TILE_ROWS

cutlass, cute = cute_modules()
from cutlass import Int32, Uint8  # noqa: E402
from cutlass.cute.nvgpu import cpasync  # noqa: E402

PACKED_ROW_BYTES = K_BLOCK // 2
HALF_TILE = SCALE_TILE_BYTES // 2  # a TMA box dimension may not exceed 256 elements


# ---- one TMA-fed NVFP4 operand (codes + swizzled scales) -----------------------------------
def check_rows(name: str, rows: int):
    if rows % SCALE_TILE_ROWS:
        raise ValueError(f"{name} = {rows}: scale tiles cover {SCALE_TILE_ROWS} rows, use a "
                         "multiple")


def codes_layout(rows: int, stages: int):
    """Staged smem layout (bytes) of ``rows`` packed rows of one k-block: [rows, 32, stages]."""
    return cute.make_layout((rows, PACKED_ROW_BYTES, stages),
                            stride=(PACKED_ROW_BYTES, 1, rows * PACKED_ROW_BYTES))


def scales_layout(rows: int, stages: int):
    """Staged smem layout (bytes) of the scale tiles of ``rows`` rows and one k-block."""
    t = rows // SCALE_TILE_ROWS
    return cute.make_layout((t, 2, HALF_TILE, stages),
                            stride=(SCALE_TILE_BYTES, HALF_TILE, 1, t * SCALE_TILE_BYTES))


def operand_views(q_ptr, s_ptr, rows: Int32, k32: Int32):
    """Global tensors over one operand: codes [rows, K/2], scales [rows/128, K/32, 256]."""
    kh = k32 * 16  # K/2 bytes per row, a multiple of 16 by construction
    kb2 = (k32 + 1) // 2 * 2  # scale columns / 2: 4 per k-block, padded like the buffer
    codes = cute.make_tensor(q_ptr, cute.make_layout((rows, kh), stride=(kh, 1)))
    tiles = (rows + SCALE_TILE_ROWS - 1) // SCALE_TILE_ROWS
    scales = cute.make_tensor(s_ptr, cute.make_layout((tiles, kb2, HALF_TILE),
                                                      stride=(kb2 * HALF_TILE, HALF_TILE, 1)))
    return codes, scales


def operand_tma(codes, scales, rows: int, stages: int):
    """[(atom, tensor)] for the codes and the scales of one operand."""
    op = cpasync.CopyBulkTensorTileG2SOp()
    out = []
    for t, lay, box in ((codes, codes_layout(rows, stages), (rows, PACKED_ROW_BYTES)),
                        (scales, scales_layout(rows, stages),
                         (rows // SCALE_TILE_ROWS, 2, HALF_TILE))):
        one = cute.slice_(lay, (*([None] * len(box)), 0))
        out.append(cpasync.make_tiled_tma_atom(op, t, one, box, num_multicast=1))
    return out


def operand_smem(alloc, rows: int, stages: int):
    """(codes, scales) staged smem tensors of one operand."""
    lq, ls = codes_layout(rows, stages), scales_layout(rows, stages)
    return (alloc.allocate_tensor(Uint8, lq, 128), alloc.allocate_tensor(Uint8, ls, 128))


def operand_bytes(rows: int) -> int:
    """Bytes one stage holds of one operand: codes and scale tiles."""
    return rows * PACKED_ROW_BYTES + rows // SCALE_TILE_ROWS * SCALE_TILE_BYTES


@cute.jit
def partition_tma(tma, smem):
    """Per TMA'd tensor: (atom, global tiles indexed [(None, tile, k, ...)], smem [(None, s)])."""
    parts = []
    for (atom, t), s in zip(tma, smem):
        rank = cute.rank(s) - 1
        box = cute.slice_(s.layout.shape, (*([None] * rank), 0))
        g = cute.local_tile(t, box, (None,) * rank)
        # group the box modes into one TMA mode; the scale views carry a trailing 256 mode
        ts, tg = cpasync.tma_partition(atom, 0, cute.make_layout(1),
                                       cute.group_modes(s, 0, rank), cute.group_modes(g, 0, rank))
        parts.append((atom, tg, ts))
    return parts


@cute.jit
def copy_operand(parts, tile: Int32, kt: Int32, s: Int32, bar):
    """TMA of one operand's codes and scales for (row tile, k-block) into stage ``s``."""
    (q_atom, q_g, q_s), (f_atom, f_g, f_s) = parts
    cute.copy(q_atom, q_g[(None, tile, kt)], q_s[(None, s)], tma_bar_ptr=bar)
    cute.copy(f_atom, f_g[(None, tile, kt, 0)], f_s[(None, s)], tma_bar_ptr=bar)


class PackedRingOwner:
    """The role contract of a producer that owns the packed ring: ``stages`` stages of
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


class TmaPrepackedProducer(PackedRingOwner):
    """Static config: CTA tile rows of A (``tile_m``) and B (``tile_n``), multiples of 128, and
    the ring depth."""

    warpgroups, regs = 1, 40

    def __init__(self, tile_m: int, tile_n: int, stages: int):
        check_rows("tile_m", tile_m)
        check_rows("tile_n", tile_n)
        self.tile_m, self.tile_n, self.stages = tile_m, tile_n, stages
        self.stage_bytes = operand_bytes(tile_m) + operand_bytes(tile_n)

    def allocate(self, alloc) -> dict:
        qa, sa = operand_smem(alloc, self.tile_m, self.stages)
        qb, sb = operand_smem(alloc, self.tile_n, self.stages)
        return {"q_a": qa, "q_b": qb, "s_a": sa, "s_b": sb}

    # ---- host side ------------------------------------------------------------------------
    def global_views(self, a_ptr, sfa_ptr, b_ptr, sfb_ptr, M: Int32, N: Int32, k32: Int32):
        """(TMA atoms and tensors: A codes, A scales, B codes, B scales; no other views)."""
        a = operand_tma(*operand_views(a_ptr, sfa_ptr, M, k32), self.tile_m, self.stages)
        b = operand_tma(*operand_views(b_ptr, sfb_ptr, N, k32), self.tile_n, self.stages)
        return [a[0], a[1], b[0], b[1]], ()

    # ---- device side ----------------------------------------------------------------------
    @cute.jit
    def run(self, ctx, rt: Int32):
        if rt // 32 == 0:
            sm = ctx.smem
            parts = partition_tma(ctx.tma, (sm["q_a"], sm["s_a"], sm["q_b"], sm["s_b"]))
            for_each_tile(ctx.tiles, self.fill_tile,
                          (parts, ctx.bars["full"], ctx.bars["empty"], ctx.mailbox))

    @cute.jit
    def fill_tile(self, tile, args, count: Int32) -> Int32:
        """Per k-block of ``tile``: wait for the stage to be free, announce its bytes and TMA
        A's and B's codes and scales into it."""
        parts, full, empty, mailbox = args
        for kt in cutlass.range(tile.k0, tile.k1, unroll=1):
            s, bar = acquire_stage(count, self.stages, empty, full,
                                   self.stage_bytes + self.extra_tx_bytes, Barrier.EMPTY, mailbox)
            copy_operand(parts[0:2], tile.m, kt, s, bar)
            copy_operand(parts[2:4], tile.n, kt, s, bar)
            count = count + 1
        return count
