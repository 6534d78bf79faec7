"""The depth frame's register-A projection tiles (issue #37 item 3; ``FrameBuild.register_a``).

The fast loop's measured projection body inside the frame: the weights are wgmma's A operand in
registers and the step's rows its N, ``wgmma.m64nR8k16`` with R8 = the rows rounded up to 8, so
no wgmma row is wasted at any row count and the weights never pass through shared memory. A
tile is 64 weight rows (qkv, o, down, proj, head: 64 output features; gate/up: 32 gate and the
32 matching up rows, i.e. 32 act features), and every tile's K is split across the CTA pair
(schedules.depth_frame.FrameOptions.register_a): rank 1 hands its fp32 fragment to rank 0,
which adds it after its own (a fixed order) and runs the epilogue.

Weights: each task's half packed once on the host (:func:`kernels.depth.frame.weights.
pack_tile_register_a`) as [K' / 16 steps][128 threads][8 bf16], so thread t of the warpgroup
loads its A fragment of step s (a0..a3: rows g and g + 8 of its warp's 16, k and k + 8 at
k = 16s + 2q) as one 16-byte unit at (s · 128 + t) · 16. A task loads its first two register
stages (RA_STAGE K elements each, 64 registers a thread) before its counter wait, so their
latency hides behind the wait (the loop's loads before ``griddepcontrol.wait``); stage s + 2
loads into stage s's registers once stage s's wgmmas have retired.

Activations: the chunk-major [K / 8][R8][8] image the frame already copies (projection.py) is
B's canonical K-major no-swizzle image with N = R8: K-adjacent core matrices R8 · 16 bytes
apart (LBO), 8-row groups 128 (SBO). The activation stage is RA_STAGE K elements too.

Fragment (m64nR8, per warp w, lane 4g + q): registers 4j + 2h + e hold feature 16w + g + 8h,
row 8j + 2q + e. Stores are chunk-major bf16 pairs of adjacent features, so lanes g and g ^ 1
swap one value a pair (one ``shfl.bfly`` 4): an even-g lane then holds features (m, m + 1) of
row 8j + 2q, an odd-g lane features (m - 1, m) of row 8j + 2q + 1. The residual epilogue's
sums of squares keep the frame's 16-feature partials (SSQ_TILES a row, partial 4 · tile + w):
four lanes of one parity hold a row's 16 features, summed in a fixed order (own four values,
then ``shfl.bfly`` 8 and 16), so every run gives the same bits.
"""
from __future__ import annotations

from device.ptx import (bf16_hi, bf16_lo, bulk_copy_g2s, fence_proxy_async_global,
                        ld_global_nc_v4, st_cluster_f32x2)
from device.rounding import bf16x2_rn, quad_ssq, round_bf16, swiglu_value
from device.runtime import cute_modules
from device.waits import wait_counter, wait_parity
from device.barriers import Barrier
from device.wgmma import wgmma_rs_m64k16
from kernels.depth.frame.projection import (ACT_SLACK, CONSUMER_BARRIER, CONSUMERS, MAX_ROWS,
                                            SSQ_TILES, TASK_SHAPES, act_stage_bytes)
from kernels.depth.frame.table import RESID_BIAS
from kernels.depth.gemm_skinny_wgmma import descriptor, smem_u32
from schedules.plan import FRAME_RA_STAGE

cutlass, cute = cute_modules()
from cutlass import Float32, Int32, Uint32  # noqa: E402

RA_ROWS = 64  # weight rows of a tile: wgmma's M
RA_STAGE = FRAME_RA_STAGE  # K elements of a stage: the activation stage, one register stage
RA_STEPS = RA_STAGE // 16  # k16 steps a stage (4 registers a thread each)
RA_UNIT = 16  # bytes of a thread's A fragment of one k16 step
# K of a task (its half of the tile's K) by projection type, the 1.7B shapes
RA_TASK_K = {t: k if split else k // 2 for t, (_, k, split) in TASK_SHAPES.items()}
# bytes of one combine slot: a thread's fp32 fragment (at most MAX_ROWS / 2) for each thread
RA_SLOT_FLOATS = CONSUMERS * MAX_ROWS // 2


def ra_weight_bytes(ty: int) -> int:
    """Bytes of a register-A task's packed weights (64 rows x its K half, bf16)."""
    return RA_ROWS * RA_TASK_K[ty] * 2


def ra_parts_bytes(combine_slots: int) -> int:
    return combine_slots * RA_SLOT_FLOATS * 4


def ra_pair_at(w, g, q, j, h):
    """Where the lane (warp ``w``, lane 4g + q) stores the pair it holds after the swap of
    :meth:`RegisterAProjectionBodies._ra_pair`, for n8 block ``j`` and feature half ``h``:
    (the pair's low feature within the tile, its row). Plain arithmetic: the device code and
    the tests share it (ints or DSL values)."""
    odd = g % 2
    return 16 * w + g + 8 * h - odd, 8 * j + 2 * q + odd


def ra_swiglu_pair_at(w, g, q, j):
    """:func:`ra_pair_at` for gate/up's act features (32 a tile: warp w's 8w + g)."""
    odd = g % 2
    return 8 * w + g - odd, 8 * j + 2 * q + odd


def ra_ssq_writer(g) -> bool:
    """Whether the lane writes its rows' 16-feature sums of squares (lanes g = 0 and 1, one of
    each parity, hold them after the two shuffles)."""
    return g < 2


class RegisterAProjectionBodies:
    """The register-A projection task's device code, mixed into the frame kernel (which
    provides ``rows``, ``r8``, ``slots``, ``act_buffers``, ``fused``, ``ablate`` and the
    shared-memory objects passed in; its K stage is RA_STAGE)."""

    @cute.jit
    def _ra_load_stage(self, w: cute.Tensor, wsrc: cute.Pointer, st: Int32):
        """This thread's A fragments of register stage ``st`` (RA_STEPS steps, 4 words each)
        into ``w`` from the task's packed weights at ``wsrc``."""
        tidx = self._thread()
        lt = tidx % CONSUMERS
        for s in cutlass.range_constexpr(RA_STEPS):
            words = ld_global_nc_v4(wsrc + ((st * RA_STEPS + s) * CONSUMERS + lt) * RA_UNIT)
            for i in cutlass.range_constexpr(4):
                w[4 * s + i] = words[i]

    @cute.jit
    def _ra_wait_inputs(self, task, g):
        """Thread 0, after the first weights are in flight: the task's counter wait (a chunked
        task's first chunk: its later chunks are waited stage by stage), then the proxy fence
        for its activation copies. Returns the %globaltimer after the wait."""
        tidx = self._thread()
        if tidx == 0:
            if task.wait >= 0:
                wait_counter(g.mCounters, task.wait, task.wait_expect, task.i, g.mailbox,
                             g.claim)
            fence_proxy_async_global()
        return cute.arch.globaltimer()

    @cute.jit
    def _ra_mainloop(self, wsrc: cute.Pointer, wA: cute.Tensor, wB: cute.Tensor,
                     stages: Int32, a_word: Int32, au: Int32, k_first: Int32, normalise,
                     task, g, smem):
        """The task's m64nR8 accumulators over ``stages`` (even) K stages, the first two
        register stages already loaded into ``wA`` / ``wB`` and the first activation copies
        started (:meth:`_first_stages`): stage s computes from wA (even) or wB (odd), then
        stage s + 2's weights load into the same registers. ``k_first``: the task's first K
        element (the gamma of its normalised stages). Returns the accumulators and the
        %globaltimer when stage 0 had landed and when the last wgmma retired."""
        mArena, mailbox, claim = g.mArena, g.mailbox, g.claim
        act_full, abuf, rbuf = smem.act_full, smem.abuf, smem.rbuf
        tidx = self._thread()
        r8, nb = self.r8, self.act_buffers
        ab = act_stage_bytes(self.rows, RA_STAGE)
        buf = ab + ACT_SLACK
        a_base = smem_u32(abuf)
        acc = cute.make_rmem_tensor((r8 // 2,), Float32)
        for i in cutlass.range_constexpr(r8 // 2):
            acc[i] = Float32(0.0)
        gbuf = rbuf
        if cutlass.const_expr(self.fused):  # the gamma words after the row factors
            gbuf = cute.recast_ptr(rbuf + MAX_ROWS, dtype=Uint32)
        t_landed = cute.arch.globaltimer()
        for pair in cutlass.range(stages // 2, unroll=1):
            for h in cutlass.range_constexpr(2):
                w = wA if h == 0 else wB
                st = 2 * pair + h
                n = au + st
                b = n % nb
                if tidx == 0:
                    wait_parity(act_full + b, (n // nb) & 1, Barrier.ACT_FULL, b, mailbox,
                                claim)
                self._sync()
                if st == 0:
                    t_landed = cute.arch.globaltimer()
                if cutlass.const_expr(self.fused):
                    if normalise:
                        self._normalize_stage(abuf + b * buf, st, rbuf, gbuf, k_first)
                cute.nvgpu.warpgroup.fence()
                for k in cutlass.range_constexpr(RA_STEPS):
                    desc_b = descriptor(a_base + b * buf + 2 * k * r8 * 16, r8 * 16, 128)
                    if cutlass.const_expr(self.ablate != "no_mma"):
                        res = wgmma_rs_m64k16([acc[i] for i in range(r8 // 2)],
                                              [w[4 * k + i] for i in range(4)], desc_b)
                        for i in cutlass.range_constexpr(r8 // 2):
                            acc[i] = res[i]
                cute.nvgpu.warpgroup.commit_group()
                cute.nvgpu.warpgroup.wait_group(0)
                # every warp has retired the wgmmas that read buffer b and these registers
                self._sync()
                if st + 2 < stages:
                    self._ra_load_stage(w, wsrc, st + 2)
                if tidx == 0:
                    if st + nb < stages:
                        self._chunk_wait(task, st + nb, g)
                        cute.arch.mbarrier_arrive_and_expect_tx(act_full + b, ab)
                        bulk_copy_g2s(abuf + b * buf,
                                      mArena.iterator + a_word + (st + nb) * (ab // 4), ab,
                                      act_full + b)
        return [acc[i] for i in range(r8 // 2)], t_landed, cute.arch.globaltimer()

    # ---- the pair's partial ---------------------------------------------------------------
    @cute.jit
    def _ra_send_fragment(self, parts, slot: Int32, acc: list):
        """Rank 1: its fp32 fragment into rank 0's combine slot, thread-major pairs
        ([pair][thread][2]: consecutive threads, consecutive 8 bytes)."""
        tidx = self._thread()
        lt = tidx % CONSUMERS
        for p in cutlass.range_constexpr(len(acc) // 2):
            st_cluster_f32x2(parts + slot * RA_SLOT_FLOATS + (p * CONSUMERS + lt) * 2, Int32(0),
                             acc[2 * p], acc[2 * p + 1])

    @cute.jit
    def _ra_add_fragment(self, parts, slot: Int32, acc: list):
        """Rank 0: its own sums plus rank 1's (in that order) from the combine slot."""
        tidx = self._thread()
        lt = tidx % CONSUMERS
        sP = cute.make_tensor(parts, cute.make_layout(self.slots * RA_SLOT_FLOATS))
        out = [Float32(0.0)] * len(acc)
        for p in cutlass.range_constexpr(len(acc) // 2):
            for e in cutlass.range_constexpr(2):
                out[2 * p + e] = acc[2 * p + e] + sP[slot * RA_SLOT_FLOATS
                                                      + (p * CONSUMERS + lt) * 2 + e]
        return out

    # ---- epilogues --------------------------------------------------------------------------
    @cute.jit
    def _ra_coords(self):
        """(warp, g, q, parity of g) of this thread in the m64nR8 fragment."""
        tidx = self._thread()
        lane = tidx % 32
        return (tidx % CONSUMERS) // 32, lane // 4, lane % 4, (lane // 4) % 2

    @cute.jit
    def _ra_pair(self, v0: Float32, v1: Float32, odd):
        """Lanes g and g ^ 1 swap one value: from this lane's (row n, row n + 1) values of one
        feature, the (feature, feature + 1) pair of one row (module notes): returns (lo,
        hi)."""
        send = cutlass.select_(odd, v0, v1)
        got = cute.arch.shuffle_sync_bfly(send, offset=4)
        return cutlass.select_(odd, got, v0), cutlass.select_(odd, v1, got)

    @cute.jit
    def _ra_pairs(self, vals: list, f0):
        """Per n8 block j and feature half h of a fragment-ordered ``vals`` (4 per j: features
        m and m + 8, rows n and n + 1), the stored pair: (feature of its low half, row, lo, hi),
        features counted from ``f0``."""
        w, gq, q, odd = self._ra_coords()
        out = []
        for j in cutlass.range_constexpr(len(vals) // 4):
            for h in cutlass.range_constexpr(2):
                lo, hi = self._ra_pair(vals[4 * j + 2 * h], vals[4 * j + 2 * h + 1], odd == 1)
                feat, row = ra_pair_at(w, gq, q, j, h)
                out.append((f0 + feat, row, lo, hi))
        return out

    @cute.jit
    def _ra_store_word(self, mArena: cute.Tensor, y_word: Int32, feat, row, word: Uint32):
        if cutlass.const_expr(self.ablate != "no_store"):
            if row < self.rows:
                mArena[y_word + ((feat // 8) * self.r8 + row) * 4 + (feat % 8) // 2] = word

    @cute.jit
    def _ra_store_plain(self, mArena: cute.Tensor, y_word: Int32, tile: Int32, vals: list):
        """Output features 64 · tile .. + 63 as bf16 pairs, chunk-major [N / 8][R8][8]."""
        for feat, row, lo, hi in self._ra_pairs(vals, tile * RA_ROWS):
            self._ra_store_word(mArena, y_word, feat, row, bf16x2_rn(lo, hi))

    @cute.jit
    def _ra_store_swiglu(self, mArena: cute.Tensor, y_word: Int32, tile: Int32, vals: list):
        """gate/up: act features 32 · tile + 8w + g from this thread's gate (feature g) and up
        (g + 8) rows, then the pairs as :meth:`_ra_store_plain`."""
        w, gq, q, odd = self._ra_coords()
        for j in cutlass.range_constexpr(len(vals) // 4):
            v0 = swiglu_value(vals[4 * j], vals[4 * j + 2])
            v1 = swiglu_value(vals[4 * j + 1], vals[4 * j + 3])
            lo, hi = self._ra_pair(v0, v1, odd == 1)
            feat, row = ra_swiglu_pair_at(w, gq, q, j)
            self._ra_store_word(mArena, y_word, tile * 32 + feat, row, bf16x2_rn(lo, hi))

    @cute.jit
    def _ra_store_residual(self, mArena: cute.Tensor, y_word: Int32, resid_word: Int32,
                           resid_kind: Int32, ssq_out_word: Int32, tile: Int32, vals: list):
        """The combined sums as the residual stream's new values, ``bf16(resid + bf16(y))``
        (resid_kind 1: the old value at the same place; 2: a bias a feature), then each row's
        16-feature sums of squares of the stored values (module notes) at ssq_out_word (when
        >= 0), for the next RMSNorm."""
        w, gq, q, odd = self._ra_coords()
        r8 = self.r8
        sS = cute.make_tensor(cute.recast_ptr(mArena.iterator + ssq_out_word, dtype=Float32),
                              cute.make_layout(SSQ_TILES * r8))
        pairs = self._ra_pairs(vals, tile * RA_ROWS)
        for j in cutlass.range_constexpr(len(vals) // 4):
            outs = []
            for h in cutlass.range_constexpr(2):
                feat, row, lo, hi = pairs[2 * j + h]
                at_word = resid_word + ((feat // 8) * r8 + row) * 4 + (feat % 8) // 2
                if resid_kind == RESID_BIAS:
                    at_word = resid_word + feat // 2
                res = Uint32(mArena[at_word])  # rows R..R8 - 1 exist in the image
                o_lo = round_bf16(bf16_lo(res) + round_bf16(lo))
                o_hi = round_bf16(bf16_hi(res) + round_bf16(hi))
                self._ra_store_word(mArena, y_word, feat, row, bf16x2_rn(o_lo, o_hi))
                outs += [o_lo, o_hi]
            if ssq_out_word >= 0:
                sq = quad_ssq(outs[0], outs[1], outs[2], outs[3])
                sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=8)
                sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=16)
                if ra_ssq_writer(gq) and row < self.rows:
                    sS[(tile * (RA_ROWS // 16) + w) * r8 + row] = sq

