"""The depth frame's attention task: one q head for 8 rows of the step, over <= 16 cache slots.

A task of the frame's attention phase (tile t: q head ``t % 16``, row group ``t // 16``) waits
on its kv head's qkv tiles only (the schedule's per-head counters), so the qkv output is laid
out by kv head: feature ``512·kv + i`` holds, for i < 256, q head 2kv + i // 128; for i <
384, k head kv; else v head kv (:func:`qkv_rows_by_kv_head` permutes the weight rows to
match). Everything is chunk-major [N / 8][R8][8] bf16, like the projections' inputs.

128 threads: thread 16·r + j takes row 8g + r and dimensions 8j..8j + 7 of the head (one
16-byte chunk); the 16 threads of a row reduce with xor shuffles 1, 2, 4, 8 (every lane ends
with the same sum, since each pairwise add is commutative). In the reference's order
(models.codepredictor._layer):

1. q and k RMS-normalised over the head's 128 dimensions (device.rounding), then RoPE
   with three bf16 roundings ``bf16(bf16(x·cos) + bf16(rot(x)·sin))``, rot's partner
   dimension d ^ 64 from lane j ^ 8;
2. the even q head of a kv head writes k and v at the position's cache slot; both use their
   own registers for that slot and the cache for earlier ones (every slot's load is issued,
   that one too, but a slot at or past the position is discarded, so no value of the
   sibling's store is used);
3. fp32 scores ``q·k · 128^-0.5`` over slots 0..pos, fp32 softmax, p rounded to bf16, then
   ``bf16(sum_s p_s · v_s)`` with fp32 adds in slot order.

Data another CTA wrote in this launch (qkv, the cache) is read with ``ld.relaxed.gpu`` (at
L2, never a stale L1 line); thread 0's counter wait acquired it and a named barrier passes
that on. The sum orders differ from cuBLAS's, so the frame's attention is not bit-identical
to the loop's (the issue's tolerances cover it).

``kv_attention`` builds (schedules.depth_frame.FrameOptions, a study switch) run
:meth:`AttentionBodies._kv_attention_task` instead: one task a (kv head, 8 rows), both q heads
of the pair from one load of k, v and the cache, the loop's reduce-scatter and softmax
(kernels/depth/attention_math.py); its docstring says what differs.
"""
from __future__ import annotations

HEAD_DIM = 128
Q_HEADS, KV_HEADS = 16, 8
SLOTS = 16
LANES_PER_ROW = HEAD_DIM // 8  # a 16-byte chunk a lane
ROWS_PER_TASK = 8


def qkv_rows_by_kv_head(cfg) -> list:
    """Row order of the fused [q; k; v] weight (models.fast_loop.FastWeights.qkv) that makes
    the frame's qkv output per kv head: [q 2kv, q 2kv + 1, k kv, v kv] for kv = 0..7."""
    d, rep = cfg.head_dim, cfg.q_heads // cfg.kv_heads
    k0, v0 = cfg.q_heads * d, (cfg.q_heads + cfg.kv_heads) * d
    order = []
    for kv in range(cfg.kv_heads):
        for r in range(rep):
            order += range((kv * rep + r) * d, (kv * rep + r + 1) * d)
        order += range(k0 + kv * d, k0 + (kv + 1) * d)
        order += range(v0 + kv * d, v0 + (kv + 1) * d)
    return order


def kv_cache_words(rows8: int) -> int:
    """32-bit words of one layer's K cache (the V cache follows it): [kv][slot][R8][128] bf16."""
    return KV_HEADS * SLOTS * rows8 * HEAD_DIM // 2


# ---- device -------------------------------------------------------------------------------------
from device.ptx import bf16_hi, bf16_lo, ld_relaxed_gpu_v4  # noqa: E402
from device.rounding import (bf16x2_rn, div_newton, rms_factor,  # noqa: E402
                                     rmsnorm_value, round_bf16)
from device.runtime import cute_modules  # noqa: E402
from device.waits import wait_counter  # noqa: E402
from kernels.depth.attention_math import reduce_scatter, rope_value, slot_softmax  # noqa: E402
from kernels.depth.frame_tiles import CONSUMER_BARRIER, CONSUMERS  # noqa: E402

cutlass, cute = cute_modules()
from cutlass import Float32, Int32, Int64, Uint32  # noqa: E402


def _floats(words: list) -> list:
    """Eight fp32 values of four packed bf16 pairs, in dimension order."""
    out = []
    for w in words:
        out += [bf16_lo(w), bf16_hi(w)]
    return out


def _row_sum(x: Float32) -> Float32:
    """The sum over the 16 lanes of a row (xor shuffles: every lane gets the same bits)."""
    for k in range(4):  # (a plain helper: the loop unrolls as it traces)
        x = x + cute.arch.shuffle_sync_bfly(x, offset=1 << k)
    return x


class AttentionBodies:
    """The attention task's device code, mixed into the frame kernel (``rows``, ``r8``: rows
    rounded up to 8, ``eps``)."""

    @cute.jit
    def _attention_task(self, tile: Int32, mArena: cute.Tensor, qkv_word: Int32,
                        out_word: Int32, norm_word: Int32, kv_word: Int32, rope_word: Int32,
                        slot: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        r8 = self.r8
        hq, group = tile % Q_HEADS, tile // Q_HEADS
        kvh, sub = hq // 2, hq % 2
        j = tidx % LANES_PER_ROW
        row = group * ROWS_PER_TASK + tidx // LANES_PER_ROW
        live = row < self.rows

        # this row's 16-byte chunk c of the qkv output is at word qkv_word + (c·R8 + row)·4;
        # the kv head's 64 chunks are q 2kv, q 2kv + 1, k, v (16 each)
        at = qkv_word + ((kvh * 64 + j) * r8 + row) * 4
        q = _floats(ld_relaxed_gpu_v4(mArena.iterator + at + sub * 16 * r8 * 4))
        k = _floats(ld_relaxed_gpu_v4(mArena.iterator + at + 32 * r8 * 4))
        v_words = ld_relaxed_gpu_v4(mArena.iterator + at + 48 * r8 * 4)
        # the cache's earlier slots (K now, V below); slot s of this row and lane at
        # K + s·R8·64 + mine
        K = kv_word + kvh * SLOTS * r8 * 64
        V = K + KV_HEADS * SLOTS * r8 * 64
        mine = row * 64 + 4 * j
        # every slot's load in flight at once: unconditional, whatever a slot holds (those at
        # and past the position are masked below; a load waited on before the next one
        # issued cost ~7 µs a task, notes/depth-frame.md)
        kc = [ld_relaxed_gpu_v4(mArena.iterator + K + s * r8 * 64 + mine)
              for s in range(SLOTS - 1)]
        gq = _floats([Uint32(mArena[norm_word + 4 * j + i]) for i in range(4)])
        gk = _floats([Uint32(mArena[norm_word + 64 + 4 * j + i]) for i in range(4)])
        cos = _floats([Uint32(mArena[rope_word + 4 * j + i]) for i in range(4)])
        sin = _floats([Uint32(mArena[rope_word + 64 + 4 * j + i]) for i in range(4)])
        qr = self._rope(self._head_norm(q, gq), cos, sin, j)
        kr = self._rope(self._head_norm(k, gk), cos, sin, j)
        if sub == 0 and live:  # the kv head's new slot (the odd q head uses its registers)
            for i in cutlass.range_constexpr(4):
                mArena[K + slot * r8 * 64 + mine + i] = bf16x2_rn(kr[2 * i], kr[2 * i + 1])
                mArena[V + slot * r8 * 64 + mine + i] = v_words[i]
        # fp32 scores over slots 0..slot; masked slots get 0 weight below
        scores = []
        for s in cutlass.range_constexpr(SLOTS):
            dot_new = Float32(0.0)
            dot_old = Float32(0.0)
            for e in cutlass.range_constexpr(8):
                dot_new = dot_new + qr[e] * kr[e]
            if cutlass.const_expr(s < SLOTS - 1):
                old = _floats(kc[s])
                for e in cutlass.range_constexpr(8):
                    dot_old = dot_old + qr[e] * old[e]
            dot = _row_sum(cutlass.select_(s == slot, dot_new, dot_old))
            scores.append(cutlass.select_(s <= slot, dot * Float32(HEAD_DIM ** -0.5),
                                          Float32(-3.0e38)))
        best = scores[0]
        for s in cutlass.range_constexpr(1, SLOTS):
            best = cute.arch.fmax(best, scores[s])
        ex = [cutlass.select_(s <= slot, cute.math.exp(scores[s] - best), Float32(0.0))
              for s in range(SLOTS)]
        den = ex[0]
        for s in cutlass.range_constexpr(1, SLOTS):
            den = den + ex[s]
        vc = [ld_relaxed_gpu_v4(mArena.iterator + V + s * r8 * 64 + mine)
              for s in range(SLOTS - 1)]
        v_new = _floats(v_words)
        acc = [Float32(0.0)] * 8
        for s in cutlass.range_constexpr(SLOTS):
            p = round_bf16(div_newton(ex[s], den))
            vals = v_new
            if cutlass.const_expr(s < SLOTS - 1):
                old = _floats(vc[s])
                vals = [cutlass.select_(s == slot, v_new[e], old[e]) for e in range(8)]
            for e in cutlass.range_constexpr(8):
                acc[e] = acc[e] + cutlass.select_(s <= slot, p * vals[e], Float32(0.0))
        if live:
            for i in cutlass.range_constexpr(4):
                mArena[out_word + ((hq * 16 + j) * r8 + row) * 4 + i] = bf16x2_rn(
                    acc[2 * i], acc[2 * i + 1])

    @cute.jit
    def _kv_attention_task(self, tile: Int32, mArena: cute.Tensor, qkv_word: Int32,
                           out_word: Int32, norm_word: Int32, kv_word: Int32, rope_word: Int32,
                           slot: Int32, mCounters: cute.Tensor, wait: Int32, wait_expect: Int32,
                           wait2: Int32, wait2_expect: Int32, task: Int32, mailbox, claim
                           ) -> Int64:
        """Attention for kv head ``tile % 8`` and rows 8 · (tile // 8) .., both its q heads
        (FrameOptions.kv_attention), with the task's own waits; returns the %globaltimer stamp
        after the qkv wait. Thread 16r + j: row r of the group, dimensions 8j..8j + 7.

        1. Thread 0 waits on ``wait2``, the attention of (layer, pos - 1); a barrier. Then every
           thread loads slots 0..14 of its K and V cache lines (those >= pos are junk, masked
           below). These loads come before the qkv wait, since the chain already orders the
           older slots: slot s < pos - 1 was written by the attention of (layer, s), complete
           before (layer, pos - 1)'s attention passed its waits (position s + 1's qkv is
           downstream of position s's head, which is downstream of every attention at s;
           position 1 waits on position 0's by wait2), and slot pos - 1 by that attention
           itself, so wait2's acquire orders them all. On the chain that counter is usually
           complete before this task starts (its qkv is downstream of it too), so the wait
           costs one acquire that succeeds; it is there so that a CTA that reaches this task
           early still reads complete slots. V is loaded before this task's own K / V stores
           too (a load the compiler cannot move past a store that may alias it).
        2. Thread 0 waits on its kv head's qkv counter; a barrier.
        3. q of both heads, k and v of the row, and the norms' and RoPE's constants: q and k
           normalised and rotated by the q-head task's _head_norm and _rope (the same bits).
        4. K and V of slot ``pos`` stored (rows < rows only).
        5. 32 partial dot products a lane (index 2·slot + head: the new slot's k from
           registers, the rest from the cache), summed over the row's 16 lanes by the loop's
           reduce-scatter (30 shuffles): lane j ends with slot j of both heads. Softmax over
           the 16 lanes (slot_softmax with div_newton: no division call), p broadcast by
           indexed shuffles, ``bf16(sum_s p_s · v_s)`` with fp32 adds in slot order (today's
           order). The scores' and the denominator's sums are trees over lanes, not today's
           in-lane order, so the bits differ from the q-head task's (within the tolerances).
        """
        tidx, _, _ = cute.arch.thread_idx()
        r8 = self.r8
        kvh, group = tile % KV_HEADS, tile // KV_HEADS
        j = tidx % LANES_PER_ROW
        lane = tidx % 32
        seg = lane - j  # the row's first lane in the warp (0 or 16)
        row = group * ROWS_PER_TASK + tidx // LANES_PER_ROW
        live = row < self.rows
        self._task_wait(mCounters, wait2, wait2_expect, task, mailbox, claim)
        K = kv_word + kvh * SLOTS * r8 * 64
        V = K + KV_HEADS * SLOTS * r8 * 64
        mine = row * 64 + 4 * j
        kc = [ld_relaxed_gpu_v4(mArena.iterator + K + s * r8 * 64 + mine)
              for s in range(SLOTS - 1)]
        vc = [ld_relaxed_gpu_v4(mArena.iterator + V + s * r8 * 64 + mine)
              for s in range(SLOTS - 1)]
        self._task_wait(mCounters, wait, wait_expect, task, mailbox, claim)
        t_waited = cute.arch.globaltimer()
        # chunk c of this row's qkv output: word qkv_word + (c·R8 + row)·4; the kv head's 64
        # chunks are q 2kv, q 2kv + 1, k, v (16 each)
        at = qkv_word + ((kvh * 64 + j) * r8 + row) * 4
        q0 = _floats(ld_relaxed_gpu_v4(mArena.iterator + at))
        q1 = _floats(ld_relaxed_gpu_v4(mArena.iterator + at + 16 * r8 * 4))
        k = _floats(ld_relaxed_gpu_v4(mArena.iterator + at + 32 * r8 * 4))
        v_words = ld_relaxed_gpu_v4(mArena.iterator + at + 48 * r8 * 4)
        # the constants with them (after the wait: the registers held across it are the
        # cache's)
        gq = _floats([Uint32(mArena[norm_word + 4 * j + i]) for i in range(4)])
        gk = _floats([Uint32(mArena[norm_word + 64 + 4 * j + i]) for i in range(4)])
        cos = _floats([Uint32(mArena[rope_word + 4 * j + i]) for i in range(4)])
        sin = _floats([Uint32(mArena[rope_word + 64 + 4 * j + i]) for i in range(4)])
        qr = [self._rope(self._head_norm(q, gq), cos, sin, j) for q in (q0, q1)]
        kr = self._rope(self._head_norm(k, gk), cos, sin, j)
        if live:  # the kv head's new slot
            for i in cutlass.range_constexpr(4):
                mArena[K + slot * r8 * 64 + mine + i] = bf16x2_rn(kr[2 * i], kr[2 * i + 1])
                mArena[V + slot * r8 * 64 + mine + i] = v_words[i]
        dot_new = []  # q·k of the new slot, each head (today's in-lane order)
        for h in cutlass.range_constexpr(2):
            dn = Float32(0.0)
            for e in cutlass.range_constexpr(8):
                dn = dn + qr[h][e] * kr[e]
            dot_new.append(dn)
        part = []
        for s in cutlass.range_constexpr(SLOTS):
            for h in cutlass.range_constexpr(2):
                dot = dot_new[h]
                if cutlass.const_expr(s < SLOTS - 1):
                    old = _floats(kc[s])
                    dot = Float32(0.0)
                    for e in cutlass.range_constexpr(8):
                        dot = dot + qr[h][e] * old[e]
                    dot = cutlass.select_(s == slot, dot_new[h], dot)
                part.append(dot)
        dots = reduce_scatter(part, lane, LANES_PER_ROW)  # lane j: slot j, heads 0 and 1
        p = [slot_softmax(dots[h], j <= slot, HEAD_DIM ** -0.5, div_newton) for h in range(2)]
        v_new = _floats(v_words)
        acc = [[Float32(0.0)] * 8 for _ in range(2)]
        for s in cutlass.range_constexpr(SLOTS):
            vals = v_new
            if cutlass.const_expr(s < SLOTS - 1):
                old = _floats(vc[s])
                vals = [cutlass.select_(s == slot, v_new[e], old[e]) for e in range(8)]
            for h in cutlass.range_constexpr(2):
                ps = cute.arch.shuffle_sync(p[h], offset=seg + s)
                for e in cutlass.range_constexpr(8):
                    acc[h][e] = acc[h][e] + cutlass.select_(s <= slot, ps * vals[e],
                                                            Float32(0.0))
        if live:
            for h in cutlass.range_constexpr(2):
                for i in cutlass.range_constexpr(4):
                    mArena[out_word + (((2 * kvh + h) * 16 + j) * r8 + row) * 4 + i] = \
                        bf16x2_rn(acc[h][2 * i], acc[h][2 * i + 1])
        return t_waited

    @cute.jit
    def _task_wait(self, mCounters: cute.Tensor, cid: Int32, expect: Int32, task: Int32,
                   mailbox, claim):
        """Thread 0 waits until counter ``cid`` reaches ``expect`` (cid < 0: no wait); the
        consumers' named barrier passes its acquire on to every thread."""
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            if cid >= 0:
                wait_counter(mCounters, cid, expect, task, mailbox, claim)
        cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=CONSUMERS)

    @cute.jit
    def _head_norm(self, x: list, gamma: list) -> list:
        """RMSNorm over the head's 128 dimensions (8 a lane), rounded as the reference."""
        sq = Float32(0.0)
        for e in cutlass.range_constexpr(8):
            sq = sq + x[e] * x[e]
        r = rms_factor(_row_sum(sq), HEAD_DIM, self.eps)
        return [rmsnorm_value(x[e], gamma[e], r) for e in range(8)]

    @cute.jit
    def _rope(self, x: list, cos: list, sin: list, j: Int32) -> list:
        """``bf16(bf16(x·cos) + bf16(rotate_half(x)·sin))``: dimension d's partner d ^ 64 sits
        in lane j ^ 8, negated in the first half."""
        sign = cutlass.select_(j < LANES_PER_ROW // 2, Float32(-1.0), Float32(1.0))
        out = []
        for e in cutlass.range_constexpr(8):
            partner = cute.arch.shuffle_sync_bfly(x[e], offset=LANES_PER_ROW // 2) * sign
            out.append(rope_value(x[e], partner, cos[e], sin[e]))
        return out
