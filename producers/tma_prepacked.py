"""TMA producer of prepacked NVFP4 operands (P0): one warp streams packed A, B and their scales.

Contract with the consumer (see :mod:`consumers.dequant_wgmma`):
* stage ``s`` of the packed ring holds, for one (tile, k-block): A codes [tile_m, 32 B], B codes
  [tile_n, 32 B] (row-major, 64 K-elements two per byte, Comfy's nibble order), and the scale
  bytes of those rows and 4 block columns: ``tile_m/128`` (resp. ``tile_n/128``) cuBLAS 128x4
  swizzle tiles of 512 B, exactly as they sit in Comfy's swizzled scale buffer;
* ``full[s]`` completes when all of the stage's bytes have landed (one arrive + transaction
  bytes); the producer waits on ``empty[s]`` before overwriting the stage.
Rows past M or N and K past the end are zero-filled by the TMA unit (zero codes -> zero
products), so partial tiles need no special case here.

Scale tiles are contiguous: tile (r, c) of a [R, C] swizzled buffer starts at byte
512·(r·C/4 + c/4). Viewing the buffer as [R/128, C/2, 256] makes a (tile_rows/128, 2, 256) TMA box
fetch the scale tiles of one k-block (a box dimension may not exceed 256 elements).
"""
from __future__ import annotations

from kernels.device.runtime import cute_modules
from kernels.device.waits import ring_position, wait_parity

cutlass, cute = cute_modules()
from cutlass import Int32  # noqa: E402
from cutlass.cute.nvgpu import cpasync  # noqa: E402

from numerics.nvfp4 import BLOCK, SCALE_TILE_BYTES, SCALE_TILE_COLS, SCALE_TILE_ROWS  # noqa: E402

TILE_K = BLOCK * SCALE_TILE_COLS  # K-elements per k-block: one 128x4 scale tile column group
PACKED_ROW_BYTES = TILE_K // 2
HALF_TILE = SCALE_TILE_BYTES // 2  # a TMA box dimension may not exceed 256 elements


class TmaPrepackedProducer:
    """Static config: CTA tile rows of A (``tile_m``) and B (``tile_n``), multiples of 128."""

    def __init__(self, tile_m: int, tile_n: int):
        for name, v in (("tile_m", tile_m), ("tile_n", tile_n)):
            if v % SCALE_TILE_ROWS:
                raise ValueError(f"{name} = {v}: scale tiles cover {SCALE_TILE_ROWS} rows, "
                                 "use a multiple")
        self.tile_m, self.tile_n = tile_m, tile_n
        self.a_bytes = tile_m * PACKED_ROW_BYTES
        self.b_bytes = tile_n * PACKED_ROW_BYTES
        self.sfa_bytes = tile_m // SCALE_TILE_ROWS * SCALE_TILE_BYTES
        self.sfb_bytes = tile_n // SCALE_TILE_ROWS * SCALE_TILE_BYTES
        self.stage_bytes = self.a_bytes + self.b_bytes + self.sfa_bytes + self.sfb_bytes

    # ---- host side ------------------------------------------------------------------------
    def smem_layouts(self, stages: int):
        """(A, B, SFA, SFB) staged smem layouts, in bytes; the last mode is the stage."""
        def codes(rows):
            return cute.make_layout((rows, PACKED_ROW_BYTES, stages),
                                    stride=(PACKED_ROW_BYTES, 1, rows * PACKED_ROW_BYTES))

        def scales(rows):
            t = rows // SCALE_TILE_ROWS
            return cute.make_layout((t, 2, HALF_TILE, stages),
                                    stride=(SCALE_TILE_BYTES, HALF_TILE, 1, t * SCALE_TILE_BYTES))

        return codes(self.tile_m), codes(self.tile_n), scales(self.tile_m), scales(self.tile_n)

    @staticmethod
    def global_views(a_ptr, sfa_ptr, b_ptr, sfb_ptr, M: Int32, N: Int32, k32: Int32):
        """Tensors over the caller's buffers: codes [rows, K/2], scales [rows/128, K/32, 256]
        (each 128x4 tile as two 256-byte halves)."""
        kh = k32 * 16  # K/2 bytes per row, a multiple of 16 by construction
        kb2 = (k32 + 1) // 2 * 2  # scale columns / 2: 4 per k-block, padded like the buffer
        mA = cute.make_tensor(a_ptr, cute.make_layout((M, kh), stride=(kh, 1)))
        mB = cute.make_tensor(b_ptr, cute.make_layout((N, kh), stride=(kh, 1)))

        def scales(ptr, rows):
            tiles = (rows + SCALE_TILE_ROWS - 1) // SCALE_TILE_ROWS
            return cute.make_tensor(ptr, cute.make_layout((tiles, kb2, HALF_TILE),
                                                          stride=(kb2 * HALF_TILE, HALF_TILE, 1)))

        return mA, mB, scales(sfa_ptr, M), scales(sfb_ptr, N)

    def make_tma(self, mA, mB, mSFA, mSFB, stages: int):
        """TMA atoms and the tensors the kernel tiles (one per operand)."""
        layouts = self.smem_layouts(stages)
        boxes = ((self.tile_m, PACKED_ROW_BYTES), (self.tile_n, PACKED_ROW_BYTES),
                 (self.tile_m // SCALE_TILE_ROWS, 2, HALF_TILE),
                 (self.tile_n // SCALE_TILE_ROWS, 2, HALF_TILE))
        out = []
        for t, lay, box in zip((mA, mB, mSFA, mSFB), layouts, boxes):
            one = cute.slice_(lay, (*([None] * len(box)), 0))
            out.append(cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), t, one, box))
        return out

    # ---- device side ----------------------------------------------------------------------
    @cute.jit
    def partition(self, tma, smem):
        """Per operand: (atom, global tiles indexed [(None, tile, k)], smem indexed [(None, s)])."""
        parts = []
        for (atom, t), s in zip(tma, smem):
            rank = cute.rank(s) - 1
            box = cute.slice_(s.layout.shape, (*([None] * rank), 0))
            g = cute.local_tile(t, box, (None,) * rank)
            # group the box modes into one TMA mode; the scale views carry a trailing 256 mode
            ts, tg = cpasync.tma_partition(atom, 0, cute.make_layout(1),
                                           cute.group_modes(s, 0, rank),
                                           cute.group_modes(g, 0, rank))
            parts.append((atom, tg, ts))
        return parts

    @cute.jit
    def load_tile(self, parts, full, empty, m_idx: Int32, n_idx: Int32, kb0: Int32, kb1: Int32,
                  count: Int32, stages: cutlass.Constexpr[int], mailbox: cute.Tensor,
                  extra_tx: cutlass.Constexpr[int] = 0) -> Int32:
        """Issue k-blocks [kb0, kb1) of one output tile; returns the ring use count after it.
        ``extra_tx`` > 0 only for fault-injection tests (the stage then never completes)."""
        (a_atom, a_g, a_s), (b_atom, b_g, b_s), (sa_atom, sa_g, sa_s), (sb_atom, sb_g, sb_s) = parts
        for kt in cutlass.range(kb0, kb1, unroll=1):
            s, ph = ring_position(count, stages)
            wait_parity(empty + s, ph ^ 1, 1, s, mailbox)
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(full + s, self.stage_bytes + extra_tx)
            bar = full + s
            cute.copy(a_atom, a_g[(None, m_idx, kt)], a_s[(None, s)], tma_bar_ptr=bar)
            cute.copy(b_atom, b_g[(None, n_idx, kt)], b_s[(None, s)], tma_bar_ptr=bar)
            cute.copy(sa_atom, sa_g[(None, m_idx, kt, 0)], sa_s[(None, s)], tma_bar_ptr=bar)
            cute.copy(sb_atom, sb_g[(None, n_idx, kt, 0)], sb_s[(None, s)], tma_bar_ptr=bar)
            count = count + 1
        return count

