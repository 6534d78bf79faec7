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

cutlass, cute = cute_modules()
from cutlass import Float32, Int32, Uint32  # noqa: E402


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
            out.append(round_bf16(round_bf16(x[e] * cos[e]) + round_bf16(partner * sin[e])))
        return out
