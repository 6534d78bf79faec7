"""The depth frame's embedding task: the code of a position, the next input rows and, last, the
Talker sum, for 8 rows of the step (tile g: rows 8g..8g + 7).

Embedding task at position p (1..16), in the reference's order (models.codepredictor.depth_loop):

* its code: at p = 1 the given g0 (codes column 0); at p >= 2 code column ``group`` = p - 1,
  drawn from head p - 2's logits (its counter wait) or given (``draw = "given"``, teacher
  forcing). The greedy draw is models.sampler.argmax_candidates: each row's first largest
  non-NaN logit, ``vocab`` where there is none. ``draw = "sample"``: the loop's sampled draw
  (kernels/depth/draw.py RowDraw, the one body: temperature, top-k, Philox Gumbel-max at the
  row's seed and offset + group - 1) on the row's bf16 logits widened to fp32, the values
  models.sampler.Sampler.sample() sees in the frame's fp32 logits; the row's parameters are
  the arena's ``draw`` region (DRAW_WORDS a row, right after the codes: DepthFrame fills it).
* p <= 15: the position's input rows, gathered from the pre-projected table
  (models.fast_loop.FastWeights.embed_proj / talker_embed_proj, the fast loop's own tables, so
  the gather gives its rows exactly; the reference projects inside its own GEMM) into h_p,
  chunk-major, with their ssq partials in the projection epilogue's order
  (device.rounding.tile_ssq), for the next RMSNorm;
* p = 16: the Talker sum of the 16 codes' Talker-space rows [g0: talker_embed, g_s:
  embeds[s - 1]], added in fp32 in slot order and rounded once. The fast loop sums its first
  15 slots with torch.sum in fp32 (an order torch does not document) and adds the last: the
  two gave the same bits on every element of the H200 runs (tests/test_depth_frame.py), which
  an fp32 sum of 16 bf16 rows does unless an addition rounds differently; it is measured, not
  guaranteed.

128 threads: thread 16·r + j takes row 8g + r and a 16th of the row's features. A sampled
build's task is one row (schedules.depth_frame.FrameOptions.embed_rows = 1, tile g: row g): the
128 threads draw it together (a draw needs the whole row and a block of threads), then threads
0..15 gather or sum as above. A code of
``vocab`` (no candidate) is written as such, and its rows are gathered from row vocab - 1 so
that nothing reads out of bounds (DepthFrame checks given codes outside graph capture; the
caller checks drawn ones for ``vocab``).
"""
from __future__ import annotations

LANES_PER_ROW = 16
ROWS_PER_TASK = 8
DRAWS = ("greedy", "given", "sample")
# the sampled draw's parameters, a row: T (fp32 bits), k (int32, 0..vocab; 0: off), seed (lo,
# hi), offset (lo, hi), two unused
DRAW_WORDS = 8
ARGMAX_PASSES = 2  # the greedy argmax's loads: two passes of 8 chunks a lane
DRAW_NOISE = "compact"  # the survivors drawn one a thread: no terms for the whole row


# ---- device -------------------------------------------------------------------------------------
from device.ptx import (bf16_hi, bf16_lo, ld_relaxed_gpu_u32,  # noqa: E402
                                ld_relaxed_gpu_v4)
from device.rounding import bf16x2_rn, tile_ssq  # noqa: E402
from device.runtime import cute_modules  # noqa: E402
from kernels.depth.draw import RowDraw, bits_f32  # noqa: E402

cutlass, cute = cute_modules()
from cutlass import Float32, Int32, Uint32, Uint64  # noqa: E402

DRAW_THREADS = 128  # the frame's consumer warpgroup (projection.CONSUMERS)
DRAW_BARRIER = 1  # its named barrier (projection.CONSUMER_BARRIER)


def _frame_column(tidx, j: int):
    """The column of a drawing thread's j-th logit: its chunks tidx and tidx + 128 of the
    chunk-major row, 8 columns each (increasing in j)."""
    return 8 * (tidx + DRAW_THREADS * (j // 8)) + j % 8


def frame_row_draw(vocab: int) -> RowDraw:
    """The loop's per-row choice as the frame's sampled embedding task runs it."""
    return RowDraw(vocab, DRAW_THREADS, "sample", DRAW_NOISE, column=_frame_column,
                   barrier=lambda: cute.arch.barrier(barrier_id=DRAW_BARRIER,
                                                     number_of_threads=DRAW_THREADS))


class EmbeddingBodies:
    """The embedding task's device code, mixed into the frame kernel (``rows``, ``r8``, ``draw``,
    ``vocab``, ``talker_vocab`` (g0's codebook), ``hidden``, ``talker_hidden``)."""

    @cute.jit
    def _embedding_task(self, tile: Int32, mArena: cute.Tensor, logits_word: Int32,
                        h_word: Int32, ssq_word: Int32, code_word: Int32, group: Int32,
                        table_word: Int32, talker_word: Int32, sum_word: Int32, dbuf=None):
        """``dbuf``: the sampled draw's shared memory (RowDraw.allocate; sampled builds)."""
        if cutlass.const_expr(self.draw == "sample"):
            self._sampled_embedding_task(tile, mArena, logits_word, h_word, ssq_word, code_word,
                                         group, table_word, talker_word, sum_word, dbuf)
        else:
            self._embedding_rows(tile, mArena, logits_word, h_word, ssq_word, code_word, group,
                                 table_word, talker_word, sum_word)

    @cute.jit
    def _sampled_embedding_task(self, tile: Int32, mArena: cute.Tensor, logits_word: Int32,
                                h_word: Int32, ssq_word: Int32, code_word: Int32, group: Int32,
                                table_word: Int32, talker_word: Int32, sum_word: Int32, dbuf):
        """One row (``tile``): its code drawn by all 128 threads (g0 at p = 1), then its
        gather or Talker sum by threads 0..15."""
        tidx, _, _ = cute.arch.thread_idx()
        row = tile
        at_code = code_word + row * 16 + group
        code = Int32(mArena[at_code])
        if logits_word >= 0:
            code = self._sampled_code(mArena, logits_word, code_word, group, row, dbuf, tidx)
            if tidx == 0:
                mArena[at_code] = Uint32(code)
        limit = cutlass.select_(group == 0, Int32(self.talker_vocab), Int32(self.vocab))
        safe = cutlass.select_((code >= 0) & (code < limit), code, limit - 1)
        live = tidx < LANES_PER_ROW
        if live:
            if table_word >= 0:
                self._gather(mArena, table_word, safe, h_word, ssq_word, self.r8, row, tidx,
                             live)
            else:
                self._talker_sum(mArena, code_word, group, code, talker_word, sum_word, row,
                                 tidx, live)

    @cute.jit
    def _sampled_code(self, mArena: cute.Tensor, logits_word: Int32, code_word: Int32,
                      group: Int32, row: Int32, dbuf, tidx) -> Int32:
        """Row ``row``'s code of column ``group`` (1..15), drawn as the loop's draw ``group -
        1`` (RowDraw.choose, the same in every thread): its parameters from the ``draw``
        region (DRAW_WORDS a row at code_word + 16 R8), its logits two 16-byte chunk-major
        loads a thread, widened to fp32."""
        r8 = self.r8
        pw = code_word + r8 * 16 + row * DRAW_WORDS  # written by the host before the launch
        t = bits_f32(Uint32(mArena[pw]))
        k = Int32(mArena[pw + 1])
        seed = (Uint64(Uint32(mArena[pw + 3])) << Uint64(32)) | Uint64(Uint32(mArena[pw + 2]))
        off = (Uint64(Uint32(mArena[pw + 5])) << Uint64(32)) | Uint64(Uint32(mArena[pw + 4]))
        params = (t, k, seed, off + Uint64(group - 1))
        rd = frame_row_draw(self.vocab)
        n = self.vocab // 8 // DRAW_THREADS
        loads = [ld_relaxed_gpu_v4(mArena.iterator + logits_word +
                                   ((i * DRAW_THREADS + tidx) * r8 + row) * 4) for i in range(n)]
        return rd.choose(lambda s: self._widen(s, loads), params, dbuf, None,
                         lambda point: None, tidx, tidx % 32, tidx // 32)

    @cute.jit
    def _widen(self, s: cute.Tensor, loads: list):
        """The row's bf16 pairs as fp32, chunk i's 8 columns at s[8 i ..]."""
        for i in cutlass.range_constexpr(len(loads)):
            for e in cutlass.range_constexpr(4):
                s[8 * i + 2 * e] = bf16_lo(loads[i][e])
                s[8 * i + 2 * e + 1] = bf16_hi(loads[i][e])

    @cute.jit
    def _embedding_rows(self, tile: Int32, mArena: cute.Tensor, logits_word: Int32,
                        h_word: Int32, ssq_word: Int32, code_word: Int32, group: Int32,
                        table_word: Int32, talker_word: Int32, sum_word: Int32):
        """The greedy and given builds' task: 8 rows, 16 threads a row."""
        tidx, _, _ = cute.arch.thread_idx()
        r8 = self.r8
        j = tidx % LANES_PER_ROW
        row = tile * ROWS_PER_TASK + tidx // LANES_PER_ROW
        live = row < self.rows
        at_code = code_word + row * 16 + group
        code = Int32(mArena[at_code])
        if cutlass.const_expr(self.draw == "greedy"):
            if logits_word >= 0:
                code = self._argmax(mArena, logits_word, r8, row, j)
                if live and j == 0:
                    mArena[at_code] = Uint32(code)
        # g0 is a Talker code (talker_vocab entries), the others the groups' (vocab)
        limit = cutlass.select_(group == 0, Int32(self.talker_vocab), Int32(self.vocab))
        safe = cutlass.select_((code >= 0) & (code < limit), code, limit - 1)
        if table_word >= 0:
            self._gather(mArena, table_word, safe, h_word, ssq_word, r8, row, j, live)
        else:
            self._talker_sum(mArena, code_word, group, code, talker_word, sum_word, row, j,
                             live)

    @cute.jit
    def _argmax(self, mArena: cute.Tensor, logits_word: Int32, r8: Int32, row: Int32,
                j: Int32) -> Int32:
        """The first largest non-NaN of the row's bf16 logits (chunk-major), vocab if none:
        lane j scans chunks j, j + 16, ... (indices increasing, so a strict > keeps the first;
        NaN never compares greater), then the lanes keep the larger value, on a tie the
        smaller index."""
        best = Float32(-float("inf"))
        idx = Int32(self.vocab)
        n = self.vocab // 8 // LANES_PER_ROW // ARGMAX_PASSES
        # a runtime loop of passes, each with its loads in flight at once: the frame's speed
        # follows its code size (notes/depth-frame.md, session 28)
        for p in cutlass.range(ARGMAX_PASSES, unroll=1):
            loads = [ld_relaxed_gpu_v4(mArena.iterator + logits_word +
                                       (((p * n + i) * LANES_PER_ROW + j) * r8 + row) * 4)
                     for i in range(n)]
            for i in cutlass.range_constexpr(n):
                c = (p * n + i) * LANES_PER_ROW + j
                w = loads[i]
                for e in cutlass.range_constexpr(8):
                    x = bf16_lo(w[e // 2]) if e % 2 == 0 else bf16_hi(w[e // 2])
                    take = x > best
                    best = cutlass.select_(take, x, best)
                    idx = cutlass.select_(take, c * 8 + e, idx)
        for k in cutlass.range_constexpr(4):
            b2 = cute.arch.shuffle_sync_bfly(best, offset=1 << k)
            i2 = cute.arch.shuffle_sync_bfly(idx, offset=1 << k)
            take = (b2 > best) | ((b2 == best) & (i2 < idx))
            best = cutlass.select_(take, b2, best)
            idx = cutlass.select_(take, i2, idx)
        return idx

    @cute.jit
    def _gather(self, mArena: cute.Tensor, table_word: Int32, code: Int32, h_word: Int32,
                ssq_word: Int32, r8: Int32, row: Int32, j: Int32, live):
        """Row ``code`` of the pre-projected table ([vocab][hidden] bf16, row-major) as this
        row of h (chunk-major), with its 16-feature tiles' ssq partials: lane j takes
        features 64j..64j + 63 (chunks 8j..8j + 7, tiles 4j..4j + 3)."""
        src = table_word + code * (self.hidden // 2) + 32 * j
        sS = cute.make_tensor(cute.recast_ptr(mArena.iterator + ssq_word, dtype=Float32),
                              cute.make_layout(64 * r8))
        rows_in = [ld_relaxed_gpu_v4(mArena.iterator + src + 4 * k) for k in range(8)]
        for t in cutlass.range_constexpr(4):
            x = []
            for half in cutlass.range_constexpr(2):
                w = rows_in[2 * t + half]
                c = 8 * j + 2 * t + half
                if live:
                    for i in cutlass.range_constexpr(4):
                        mArena[h_word + (c * r8 + row) * 4 + i] = w[i]
                for i in cutlass.range_constexpr(4):
                    x += [bf16_lo(w[i]), bf16_hi(w[i])]
            if live:
                sS[(4 * j + t) * r8 + row] = tile_ssq(x)

    @cute.jit
    def _talker_sum(self, mArena: cute.Tensor, code_word: Int32, group: Int32, code: Int32,
                    talker_word: Int32, sum_word: Int32, row: Int32, j: Int32, live):
        """The row's Talker sum: its 16 codes (column ``group``'s is ``code``, this task's own
        draw; the others other CTAs wrote) and their Talker-space rows (table 0, talker_embed,
        [talker_vocab][talker_hidden] bf16 from talker_word; then embeds[s - 1], [vocab][talker
        hidden] each) added in fp32 in slot
        order, rounded once to bf16 at sum_word ([R8][talker_hidden], row-major). Lane j
        takes elements 128j..128j + 127, 16 at a time."""
        tw = self.talker_hidden // 2  # words a table row
        rows_before = []  # table s's first row: talker_embed (talker_vocab rows), then embeds
        codes = []
        for s in cutlass.range_constexpr(16):
            n = self.talker_vocab if s == 0 else self.vocab
            rows_before.append(0 if s == 0 else self.talker_vocab + (s - 1) * self.vocab)
            c = cutlass.select_(s == group, code, Int32(ld_relaxed_gpu_u32(
                mArena.iterator + code_word + row * 16 + s)))
            codes.append(cutlass.select_((c >= 0) & (c < n), c, Int32(n - 1)))
        for part in cutlass.range(8, unroll=1):  # (unrolled, its loads would not fit)
            w0 = 64 * j + 8 * part  # this part's first word of a row
            acc = [Float32(0.0)] * 16
            for s in cutlass.range_constexpr(16):
                src = talker_word + (rows_before[s] + codes[s]) * tw + w0
                for q in cutlass.range_constexpr(2):
                    w = ld_relaxed_gpu_v4(mArena.iterator + src + 4 * q)
                    for i in cutlass.range_constexpr(4):
                        e = 8 * q + 2 * i
                        acc[e] = acc[e] + bf16_lo(w[i])
                        acc[e + 1] = acc[e + 1] + bf16_hi(w[i])
            if live:
                for i in cutlass.range_constexpr(8):
                    mArena[sum_word + row * tw + w0 + i] = bf16x2_rn(acc[2 * i],
                                                                     acc[2 * i + 1])
