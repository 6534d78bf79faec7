"""The depth frame's projection tiles: one task's wgmma over weight pages from the ring.

A projection task of the frame (kernel.py walks them) computes
``F`` output features of the step's rows: Y[rows, F] = X[rows, K'] · W[F, K']^T, with K' the
whole K or, for a split tile's half, half of it. The tiles are those of the schedule
(schedules/depth_frame.py): qkv F = 32, gate/up F = 64 (32 gate and the 32 matching up rows),
o / down / proj / head F = 16. So the step's rows are wgmma's 64-row A operand and the weights
its N = F operand: ``wgmma.m64nFk16``, both from shared memory. (The swap-AB form of the fast
loop, weights as the 64-row A, would waste 48 of 64 A rows on the 16-feature tiles, and their
wgmmas are on the frame's critical path; at <= 64 rows this form wastes only A rows beyond the
step's.)

Operands, both in wgmma's canonical K-major, no-swizzle image (8-row x 16-byte core matrices):

* weights: each tile (each half of a split tile) packed once on the host as [K' / 8][F][8]
  bf16 (:func:`weights.pack_tile`), streamed by the loader through the ring's pages. A k16
  step reads two K chunks, 2·F·16 bytes, which never straddle a page (pages are multiples of
  STEP_BYTES_MAX), so each step's descriptor starts in one page: K-adjacent chunks F·16
  bytes apart (LBO), 8-row groups 128 (SBO).
* activations: chunk-major [K / 8][R8][8] bf16 in global memory (R8 = the step's rows rounded
  up to 8; :func:`weights.chunk_major_rows`), brought after the task's counter wait (a chunked
  task's: the stage's own chunk counter, FrameOptions.chunk_waits) by one bulk copy a K stage (k_stage elements: schedules.plan.frame_k_stage; the plan's FRAME_ACT_BUFFERS
  buffers) into the same image: LBO R8·16, SBO
  128. wgmma reads 64 rows; rows R8..63 fall on later chunks of the buffer (or the slack after
  it), rows nobody stores, whose products only reach accumulator rows that are not stored.

Per K stage: thread 0 waits for the activation stage and the stage's weight pages and the
warpgroup meets at a named barrier; all issue k_stage / 16 wgmmas, retire them, meet again,
and thread 0 frees the pages and refills the activation buffer with stage s + buffers (the
stages a runtime loop, one copy of it a tile width). Pages go back per stage, not per task, so
the loader streams the rest of a tile (a gate/up tile is the whole ring) while its first stages
compute.

Epilogues, from the m64nF fragment (warp w holds rows 16w + g and 16w + g + 8, thread q of its
quad columns 8j + 2q and 8j + 2q + 1 of each n8 block j):

* plain: bf16 pairs, chunk-major, into the phase's output;
* SwiGLU (gate/up): gate column c and up column 32 + c sit in the same thread, so
  ``bf16(bf16(silu(bf16(g))) * bf16(u))`` (device.rounding.swiglu_value) is local;
* split (o, down, proj): rank 1 stores its fp32 fragment into rank 0's combine slot
  (``st.shared::cluster``), meets its warpgroup at the named barrier, and thread 0 arrives
  (release, cluster scope); rank 0's thread 0 waits (acquire), the barrier passes that on, and
  every thread adds the pair's fragment to its own, rank 0's K half first: a fixed order, so
  every run gives the same bits.
"""
from __future__ import annotations

from configs.arch import SMEM_PER_CTA_MAX
from schedules import depth_frame as F

K_STAGE = 256  # K elements of an activation stage where the plan does not say (its minimum)
MAX_ACT_BUFFERS = 6  # the most K stages of a task (down's half: 1536 / 256)
SMEM_RESERVE = 2048  # the protocol's barriers and combine words, the ring's alignment
ACT_SLACK = 1024  # bytes after each activation buffer: wgmma's rows R8..63 of its last step
MAX_ROWS = 64  # the A operand's rows
STEP_BYTES_MAX = 2048  # a gate/up k16 step (64 x 16 bf16): pages hold whole steps of any tile
TILE_FEATURES = {F.QKV: 32, F.GATEUP: 64, F.HEAD: 16, F.O: 16, F.DOWN: 16, F.PROJ: 16}
PROJECTION_TYPES = tuple(TILE_FEATURES)
TILE_WIDTHS = tuple(sorted(set(TILE_FEATURES.values())))  # one mainloop each
# the tile widths of the consumers that may wait per K chunk (FrameOptions.chunk_waits: o and
# down): only their mainloops compile the chunk wait
CHUNK_WIDTHS = tuple(sorted({TILE_FEATURES[t] for t in F.CHUNKED}))


def rows8(rows: int) -> int:
    return -(-rows // 8) * 8


def act_stage_bytes(rows: int, k_stage: int = K_STAGE) -> int:
    return k_stage * rows8(rows) * 2


def act_buffers(rows: int, combine_slots: int, ring_bytes: int, k_stage: int = K_STAGE) -> int:
    """Activation stage buffers that fit beside the ring, the combine slots' fp32 partials
    (64 rows x 16 features each) and the norm buffers, at most MAX_ACT_BUFFERS (the kernel
    checks that the plan's FRAME_ACT_BUFFERS fit)."""
    free = (SMEM_PER_CTA_MAX - SMEM_RESERVE - ring_bytes - combine_slots * MAX_ROWS * 16 * 4
            - (MAX_ROWS + NORM_K // 2) * 4)  # the fused builds' row factors and gamma
    fit = free // (act_stage_bytes(rows, k_stage) + ACT_SLACK)
    if fit < 2:
        raise ValueError(f"rows {rows}: two activation stages of "
                         f"{act_stage_bytes(rows, k_stage)} B do not fit beside a {ring_bytes} B "
                         "ring")
    return min(MAX_ACT_BUFFERS, fit)


def check_rows(rows: int) -> None:
    if not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"rows {rows}: the frame's projection tiles take 1..{MAX_ROWS} rows "
                         "(the wgmma A operand)")


# ---- device -------------------------------------------------------------------------------------
from kernels.depth.gemm_skinny_wgmma import descriptor  # noqa: E402
from device.ptx import (bf16_hi, bf16_lo, bulk_copy_g2s,  # noqa: E402
                                fence_proxy_async_global, fence_proxy_async_shared_cta,
                                ld_relaxed_gpu_f32,
                                ld_relaxed_gpu_v4, ld_shared_v4,
                                smem_u32, st_cluster_f32x2, st_shared_v4)
from device.rounding import (bf16x2_rn, quad_ssq, rms_factor,  # noqa: E402
                                     rmsnorm_pair, round_bf16, swiglu_value)
from device.runtime import cute_modules  # noqa: E402
from device.barriers import Barrier  # noqa: E402
from device.waits import wait_counter, wait_parity  # noqa: E402
from device.wgmma import wgmma_ss_m64k16  # noqa: E402
from kernels.depth.frame.table import RESID_BIAS  # noqa: E402

cutlass, cute = cute_modules()
from cutlass import Float32, Int32, Uint32  # noqa: E402

CONSUMER_BARRIER = 1  # named barrier of the consumer warpgroup (0 is __syncthreads)
CONSUMERS = 128
# (tile features, the task's K range, split) per projection type, with the 1.7B shapes
TASK_SHAPES = {F.QKV: (32, 1024, False), F.GATEUP: (64, 1024, False),
               F.HEAD: (16, 1024, False), F.O: (16, 1024, True), F.PROJ: (16, 1024, True),
               F.DOWN: (16, 1536, True)}
SSQ_TILES = 64  # ssq partials a row: the hidden size in tiles of 16 features
NORM_K = 1024  # the K of every normalised input (qkv, gate/up, head: the hidden size)


def _sum_in_order(xs: list) -> Float32:
    """((0 + x0) + x1) + ...: a plain helper, its loop unrolled as it traces."""
    total = Float32(0.0)
    for x in xs:
        total = total + x
    return total


class ProjectionBodies:
    """The projection task's device code, mixed into the frame kernel (which provides
    ``rows``, ``r8`` (rows8 of them), ``pages``, ``page_bytes``, ``slots``, ``k_stage``,
    ``act_buffers``, ``fused``, ``eps``, ``ablate`` and the shared-memory objects passed in)."""

    @cute.jit
    def _chunk_wait(self, task, s: Int32, g):
        """Thread 0, before it copies K stage ``s`` of a chunked task (``task.wait_chunks``
        > 1: schedules.depth_frame.FrameOptions.chunk_waits): wait until the stage's chunk
        counter ``task.wait + s`` reaches ``task.wait_expect`` (a timeout reports that counter
        and the task), then order the stage's bulk copy (async proxy) after the acquire."""
        if task.wait_chunks > 1:
            wait_counter(g.mCounters, task.wait + s, task.wait_expect, task.i, g.mailbox,
                         g.claim)
            fence_proxy_async_global()

    @cute.jit
    def _first_stages(self, stages: Int32, a_word: Int32, au: Int32, task, g, smem):
        """Thread 0 (after the counter wait) starts the copies of a projection task's first
        activation stages, from arena word ``a_word`` on into buffer uses ``au`` on (the same
        for every tile width; :meth:`_mainloop` issues the later ones); a chunked ``task``
        (kernel.py's FrameTask) waits for each stage's chunk first. ``g``, ``smem``: the
        kernel's FrameTensors and FrameSmem (kernel.py)."""
        mArena, act_full, abuf = g.mArena, smem.act_full, smem.abuf
        tidx, _, _ = cute.arch.thread_idx()
        nb = self.act_buffers
        ab = act_stage_bytes(self.rows, self.k_stage)
        if tidx == 0:
            for s in cutlass.range_constexpr(nb):
                if s < stages:
                    self._chunk_wait(task, Int32(s), g)
                    b = (au + s) % nb
                    cute.arch.mbarrier_arrive_and_expect_tx(act_full + b, ab)
                    bulk_copy_g2s(abuf + b * (ab + ACT_SLACK),
                                  mArena.iterator + a_word + s * (ab // 4), ab, act_full + b)

    @cute.jit
    def _mainloop(self, f: cutlass.Constexpr[int], stages: Int32, a_word: Int32, at: Int32,
                  au: Int32, normalise, task, g, smem):
        """The task's accumulators (f / 2 fp32 a thread, the m64nF fragment) over ``stages``
        K stages, once :meth:`_first_stages` has started the first copies: activations from
        arena word ``a_word`` on, weights from the ring's pages ``at`` (unwrapped) on;
        activation buffer uses ``au`` on (the walk's cursor). The stages are a runtime loop,
        one copy of the stage's code a tile width: the frame's speed follows its code size
        (notes/depth-frame.md, session 28). Also returns the %globaltimer when stage 0 had
        landed and when the last wgmma retired. ``normalise`` (``fused`` builds, a runtime
        bool): rewrite each stage as RMSNorm's output (:meth:`_normalize_stage`, the row
        factors and gamma already in ``rbuf``: :meth:`_row_factors`). ``task``: kernel.py's
        FrameTask (a chunked one waits for stage s's chunk before its copy:
        :meth:`_chunk_wait`; compiled in the CHUNK_WIDTHS mainloops only). ``g``, ``smem``: the kernel's FrameTensors and FrameSmem
        (kernel.py)."""
        mArena, mailbox, claim = g.mArena, g.mailbox, g.claim
        ring, page_full, page_empty = smem.ring, smem.page_full, smem.page_empty
        act_full, abuf, rbuf = smem.act_full, smem.abuf, smem.rbuf
        tidx, _, _ = cute.arch.thread_idx()
        R, r8, nb, ks = self.pages, self.r8, self.act_buffers, self.k_stage
        ab = act_stage_bytes(self.rows, ks)
        buf = ab + ACT_SLACK
        P = self.page_bytes
        sb = f * ks * 2  # a stage's weight bytes: part of a page, or whole pages
        a_base, w_base = smem_u32(abuf), smem_u32(ring)
        acc = cute.make_rmem_tensor((f // 2,), Float32)
        for i in cutlass.range_constexpr(f // 2):
            acc[i] = Float32(0.0)
        gbuf = rbuf
        if cutlass.const_expr(self.fused):  # the gamma words after the row factors
            gbuf = cute.recast_ptr(rbuf + MAX_ROWS, dtype=Uint32)
        t_landed = cute.arch.globaltimer()
        for st in cutlass.range(stages, unroll=1):
            n = au + st
            b = n % nb
            # pages [w0, w1) land for this stage; pages [r0, r1) are done after it
            w0, w1 = (st * sb + P - 1) // P, ((st + 1) * sb + P - 1) // P
            r0, r1 = st * sb // P, (st + 1) * sb // P
            # one thread waits for the stage and the barrier passes the landing on: every
            # thread polling the mbarriers was 8-13 % slower a frame (notes/depth-frame.md)
            if tidx == 0:
                wait_parity(act_full + b, (n // nb) & 1, Barrier.ACT_FULL, b, mailbox, claim)
                if cutlass.const_expr(self.ablate != "no_page_wait"):
                    for j in cutlass.range(w0, w1, unroll=1):
                        wait_parity(page_full + (at + j) % R, ((at + j) // R) & 1,
                                    Barrier.PAGE_FULL, (at + j) % R, mailbox, claim)
            cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=CONSUMERS)
            if st == 0:
                t_landed = cute.arch.globaltimer()
            if cutlass.const_expr(self.fused):
                if normalise:
                    self._normalize_stage(abuf + b * buf, st, rbuf, gbuf)
            cute.nvgpu.warpgroup.fence()
            for k in cutlass.range_constexpr(ks // 16):
                off = st * sb + k * f * 32  # the step's bytes into the tile
                page = (at + off // P) % R
                desc_b = descriptor(w_base + page * P + off % P, f * 16, 128)
                desc_a = descriptor(a_base + b * buf + 2 * k * r8 * 16, r8 * 16, 128)
                if cutlass.const_expr(self.ablate != "no_mma"):
                    res = wgmma_ss_m64k16([acc[i] for i in range(f // 2)], desc_a, desc_b)
                    for i in cutlass.range_constexpr(f // 2):
                        acc[i] = res[i]
            cute.nvgpu.warpgroup.commit_group()
            cute.nvgpu.warpgroup.wait_group(0)
            # every warp has retired the wgmmas that read buffer b and the stage's pages
            cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=CONSUMERS)
            if tidx == 0:
                for j in cutlass.range(r0, r1, unroll=1):
                    cute.arch.mbarrier_arrive(page_empty + (at + j) % R)
                if st + nb < stages:
                    if cutlass.const_expr(f in CHUNK_WIDTHS):
                        self._chunk_wait(task, st + nb, g)
                    cute.arch.mbarrier_arrive_and_expect_tx(act_full + b, ab)
                    bulk_copy_g2s(abuf + b * buf,
                                  mArena.iterator + a_word + (st + nb) * (ab // 4), ab,
                                  act_full + b)
        return [acc[i] for i in range(f // 2)], t_landed, cute.arch.globaltimer()

    @cute.jit
    def _row_factors(self, mArena: cute.Tensor, ssq_in_word: Int32, gamma_word: Int32, rbuf,
                     gbuf):
        """RMSNorm's r = rsqrt(mean(x^2) + eps) of every row into shared memory: one thread a
        row loads the row's SSQ_TILES partials (all in flight at once) and sums them in tile
        order (a fixed order, so every run gives the same bits). Their writers' stores were
        acquired by thread 0's counter wait; the relaxed gpu-scope loads read them at L2,
        never from a stale L1 line. Also the task's gamma (K bf16, host data) into ``gbuf``,
        so the stage rewrite reads it from shared memory."""
        tidx, _, _ = cute.arch.thread_idx()
        r8 = self.r8
        sR = cute.make_tensor(rbuf, cute.make_layout(MAX_ROWS))
        sG = cute.make_tensor(gbuf, cute.make_layout(NORM_K // 2))
        for i in cutlass.range_constexpr(NORM_K // 2 // CONSUMERS):
            sG[i * CONSUMERS + tidx] = Uint32(mArena[gamma_word + i * CONSUMERS + tidx])
        cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=CONSUMERS)
        if tidx < r8:
            ssq = cute.recast_ptr(mArena.iterator + ssq_in_word, dtype=Float32)
            parts = [ld_relaxed_gpu_f32(ssq + j * r8 + tidx) for j in range(SSQ_TILES)]
            total = _sum_in_order(parts)
            sR[tidx] = rms_factor(total, SSQ_TILES * 16, self.eps)
        cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=CONSUMERS)

    @cute.jit
    def _norm_task(self, group: Int32, mArena: cute.Tensor, a_word: Int32, y_word: Int32,
                   gamma_word: Int32, ssq_in_word: Int32, rbuf):
        """A norm task (``FrameOptions.norm_once``): rows 8·group..8·group + 7 of the residual
        stream at ``a_word`` (chunk-major [128][R8][8] bf16), RMS-normalised once, into the
        same image at ``y_word``, which the projection's tiles then copy as their input. The
        same bits as the in-tile path: thread j < 8 makes row j's factor exactly as
        :meth:`_row_factors` does (its SSQ_TILES partials in tile order, ``rms_factor``), and
        every word is ``rmsnorm_pair`` as in :meth:`_normalize_stage`. Thread t takes row
        t % 8 of chunks t / 8 + 16n (n < 8): its 8 units of h and gamma are loaded first, all
        in flight while the factors are summed. The walk's proxy fence, barrier and signal
        publish the stores."""
        tidx, _, _ = cute.arch.thread_idx()
        r8 = self.r8
        sR = cute.make_tensor(rbuf, cute.make_layout(MAX_ROWS))
        row = group * 8 + tidx % 8
        units = NORM_K // 8 * 8 // CONSUMERS  # 8 units of 16 bytes a thread
        xs, gs = [], []
        for n in cutlass.range_constexpr(units):
            c = n * (CONSUMERS // 8) + tidx // 8  # the unit's chunk (8 features)
            xs.append(ld_relaxed_gpu_v4(mArena.iterator + a_word + (c * r8 + row) * 4))
            gs.append(ld_relaxed_gpu_v4(mArena.iterator + gamma_word + 4 * c))
        if tidx < 8:
            ssq = cute.recast_ptr(mArena.iterator + ssq_in_word, dtype=Float32)
            parts = [ld_relaxed_gpu_f32(ssq + j * r8 + row) for j in range(SSQ_TILES)]
            sR[tidx] = rms_factor(_sum_in_order(parts), SSQ_TILES * 16, self.eps)
        cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=CONSUMERS)
        r = sR[tidx % 8]
        for n in cutlass.range_constexpr(units):
            c = n * (CONSUMERS // 8) + tidx // 8
            for i in cutlass.range_constexpr(4):
                mArena[y_word + (c * r8 + row) * 4 + i] = rmsnorm_pair(xs[n][i], gs[n][i], r)

    @cute.jit
    def _normalize_stage(self, stage, st: Int32, rbuf, gbuf):
        """Rewrite landed activation stage ``st`` in place as ``bf16(gamma · bf16(x · r))``
        (device.rounding.rmsnorm_pair: the reference's order), 16 bytes at a time,
        then make the writes visible to the wgmmas (async proxy) and meet. Unit u of the
        stage's [k_stage / 8][R8][8] image is row u % R8 of chunk u / R8 (8 features, gamma
        words 4·(chunk + st·k_stage / 8) on in ``gbuf``)."""
        tidx, _, _ = cute.arch.thread_idx()
        r8, ks = self.r8, self.k_stage
        units = ks * r8 // 8  # 32 or 64 · R8: a multiple of 256
        sR = cute.make_tensor(rbuf, cute.make_layout(MAX_ROWS))
        base, g_base = smem_u32(stage), smem_u32(gbuf) + st * ks * 2
        # a loop, not unrolled: 26 stages of unrolled units tripled the kernel's code
        # (notes/depth-frame.md)
        for n in cutlass.range(units // CONSUMERS, unroll=2):
            u = n * CONSUMERS + tidx
            x = ld_shared_v4(base + 16 * u)
            g = ld_shared_v4(g_base + 16 * (u // r8))
            r = sR[u % r8]
            st_shared_v4(base + 16 * u, [rmsnorm_pair(x[i], g[i], r) for i in range(4)])
        fence_proxy_async_shared_cta()
        cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=CONSUMERS)

    @cute.jit
    def _store_residual(self, mArena: cute.Tensor, y_word: Int32, resid_word: Int32,
                        resid_kind: Int32, ssq_out_word: Int32, tile: Int32, vals: list):
        """A split tile's combined sums (16 features) as the residual stream's new values:
        ``bf16(resid + bf16(y))``, the projection's rounding first, as ``x + proj(a)`` rounds
        (resid_kind 1: the old value at the same place, updated in place; 2: a bias a
        feature); then the tile's row sums of squares of the stored values (quad-reduced in a
        fixed order) at ssq_out_word (when >= 0), for the next RMSNorm."""
        r0, r1, c = self._fragment_coords()
        lane = cute.arch.lane_idx()
        r8 = self.r8
        out = [Float32(0.0)] * 8
        for j in cutlass.range_constexpr(2):
            feat = tile * 16 + 8 * j
            for h, r in ((0, r0), (1, r1)):
                at_word = resid_word + ((feat // 8) * r8 + r) * 4 + c // 2  # RESID_ROWS
                if resid_kind == RESID_BIAS:
                    at_word = resid_word + (feat + c) // 2
                res = mArena[at_word]
                for e, part in ((0, bf16_lo), (1, bf16_hi)):
                    out[4 * j + 2 * h + e] = round_bf16(part(res) + round_bf16(
                        vals[4 * j + 2 * h + e]))
        self._store_pairs(mArena, y_word, tile * 16, out)
        if ssq_out_word >= 0:
            sS = cute.make_tensor(cute.recast_ptr(mArena.iterator + ssq_out_word,
                                                  dtype=Float32),
                                  cute.make_layout(SSQ_TILES * r8))
            for h, r in ((0, r0), (1, r1)):
                sq = quad_ssq(out[2 * h], out[2 * h + 1], out[4 + 2 * h], out[5 + 2 * h])
                sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=1)
                sq = sq + cute.arch.shuffle_sync_bfly(sq, offset=2)
                if lane % 4 == 0 and r < self.rows:  # rows R8..63 would overrun the tile
                    sS[tile * r8 + r] = sq

    @cute.jit
    def _fragment_coords(self):
        """(row of registers 0-1 of each n8 block, row of registers 2-3, column pair) of this
        thread in the m64nF fragment."""
        tidx, _, _ = cute.arch.thread_idx()
        lane = tidx % 32
        r0 = (tidx // 32) * 16 + lane // 4
        return r0, r0 + 8, 2 * (lane % 4)

    @cute.jit
    def _store_pairs(self, mArena: cute.Tensor, y_word: Int32, f0, vals: list):
        """bf16 pairs of ``vals`` (the fragment's order: per n8 block j, rows r0 and r1) at
        output features f0 + 8j + c, chunk-major [N / 8][R8][8] from arena word ``y_word``."""
        r0, r1, c = self._fragment_coords()
        r8 = self.r8
        if cutlass.const_expr(self.ablate != "no_store"):  # (a study's ablation)
            for j in cutlass.range_constexpr(len(vals) // 4):
                feat = f0 + 8 * j  # a multiple of 8: the pair's chunk
                for h, r in ((0, r0), (1, r1)):
                    if r < self.rows:
                        mArena[y_word + ((feat // 8) * r8 + r) * 4 + c // 2] = bf16x2_rn(
                            vals[4 * j + 2 * h], vals[4 * j + 2 * h + 1])

    @cute.jit
    def _store_swiglu(self, mArena: cute.Tensor, y_word: Int32, tile: Int32, acc: list):
        """gate/up tile: act features 32·tile + c from gate columns c and up columns 32 + c."""
        vals = [Float32(0.0)] * 16
        for j in cutlass.range_constexpr(4):
            for e in cutlass.range_constexpr(4):
                vals[4 * j + e] = swiglu_value(acc[4 * j + e], acc[4 * (j + 4) + e])
        self._store_pairs(mArena, y_word, tile * 32, vals)

    @cute.jit
    def _send_fragment(self, parts, slot: Int32, acc: list):
        """Rank 1: its fp32 fragment into rank 0's combine slot ([64 rows][16] fp32)."""
        r0, r1, c = self._fragment_coords()
        for j in cutlass.range_constexpr(2):
            for h, r in ((0, r0), (1, r1)):
                st_cluster_f32x2(parts + (slot * MAX_ROWS + r) * 16 + 8 * j + c, Int32(0),
                                 acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1])

    @cute.jit
    def _add_fragment(self, parts, slot: Int32, acc: list):
        """Rank 0: its own sums plus rank 1's (in that order) from the combine slot."""
        r0, r1, c = self._fragment_coords()
        out = [Float32(0.0)] * 8
        sP = cute.make_tensor(parts, cute.make_layout(self.slots * MAX_ROWS * 16))
        for j in cutlass.range_constexpr(2):
            for h, r in ((0, r0), (1, r1)):
                for e in cutlass.range_constexpr(2):
                    out[4 * j + 2 * h + e] = acc[4 * j + 2 * h + e] + sP[
                        (slot * MAX_ROWS + r) * 16 + 8 * j + c + e]
        return out
