"""One depth-loop draw per row in one CTA: temperature, top-k (ties at the k-th value kept),
Philox Gumbel-max, then the gathers the next position needs.

Bit-compatible with :func:`models.sampler.filtered_scores` + :func:`models.sampler.draw` on the
same fp32 logits: ``s = logits / t`` (IEEE division), the k-th largest s found exactly by a radix
select on order-preserving 32-bit keys (4 passes of 8 bits, double-buffered shared-memory
histograms: two barriers a pass), survivors ``s >= kth``, uniforms from Philox4x32-10 keyed by
(seed, offset + draw) exactly as
:func:`models.philox.uniform` (53 bits, ``(bits + 0.5)·2^-53`` in fp64), ``-log(-log u)`` in fp64
(the same libdevice-style ``log`` torch uses), argmax of ``s + g`` in fp64 with the first index
winning ties; T == 0 rows take the argmax of s. The NaN rule is the sampler's: a NaN score is
-inf, never drawn, and a row left without a candidate (every score NaN or -inf) draws the code V,
which no real code has (models.sampler refuses such a row on the host; inside a captured frame
nothing can, so the caller checks ``codes == V``) and gathers the last table row.

Modes: ``sample``, ``greedy`` (argmax of the logits) and ``forced`` (teacher forcing: the code
is read from ``codes_in``). Every mode then writes the code, copies the next position's input
row ``embed_proj[code]`` into ``x_next`` and the Talker-space row ``embeds[code]`` into ``used``,
and with ``qkv_width`` copies the row ``qkv_table[code]`` into ``qkv_next`` (the next position's
first QKV projection, precomputed per code: models.fast_loop.FastLoop._layer0_qkv_table). Where
the Gumbel terms are drawn (``noise``) changes timing only: by default every column's before the
dependency wait (notes/fast-loop.md v10q).
"""
from __future__ import annotations

import torch

from device.ptx import bf16_hi, bf16_lo, pdl_launch_dependents, pdl_wait, timing_perturbation
from device.rounding import bf16x2_rn
from device.runtime import (cached_compile, check_cuda_tensor, cute_modules,
                                    current_stream, pointer_args, require_hopper)

cutlass, cute = cute_modules()
from cutlass import Float32, Float64, Int32, Int64, Uint32, Uint64  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402
from cutlass.cute.runtime import make_fake_stream  # noqa: E402
from cutlass.cutlass_dsl import T, dsl_user_op  # noqa: E402

THREADS = 256
MODES = ("sample", "greedy", "forced")
# where the Gumbel terms log(-log u) are drawn: for every column before the dependency wait
# (they depend on seed, offset and column only), or for the survivors one a thread after the
# selection (notes/fast-loop.md v10p, v10q)
NOISE = ("early", "compact")
# trace=True builds: thread 0 of each row's CTA stamps %globaltimer (ns) at these points
DRAW_TRACE_POINTS = ("entry", "wait_done", "logits", "selected", "drawn", "gathered")
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
BINS = 256  # a radix pass's digits (8 bits)


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on Uint32 values (models.philox.philox4x32's device twin)."""
    for _ in range(10):
        hi0 = cute.arch.mul_hi(Uint32(PHILOX_M[0]), c0)
        lo0 = Uint32(PHILOX_M[0]) * c0
        hi1 = cute.arch.mul_hi(Uint32(PHILOX_M[1]), c2)
        lo1 = Uint32(PHILOX_M[1]) * c2
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = k0 + Uint32(PHILOX_W[0]), k1 + Uint32(PHILOX_W[1])
    return c0, c1


@dsl_user_op
def f32_bits(v: Float32, *, loc=None, ip=None) -> Uint32:
    return Uint32(llvm.bitcast(T.i32(), Float32(v).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def bits_f32(b: Uint32, *, loc=None, ip=None) -> Float32:
    return Float32(llvm.bitcast(T.f32(), Uint32(b).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


def order_key(v: Float32) -> Uint32:
    """fp32 -> uint32 with the same order (negatives flipped, positives with the sign set)."""
    b = f32_bits(v)
    return cutlass.select_(b >= Uint32(0x80000000), ~b, b | Uint32(0x80000000))


def nan_as_neg_inf(v: Float32) -> Float32:
    """The sampler's NaN rule (models.sampler): a NaN score is -inf, never drawn."""
    return cutlass.select_((f32_bits(v) & Uint32(0x7FFFFFFF)) > Uint32(0x7F800000),
                           Float32(float("-inf")), v)


def key_value(k: Uint32) -> Float32:
    b = cutlass.select_(k >= Uint32(0x80000000), k & Uint32(0x7FFFFFFF), ~k)
    return bits_f32(b)


class RowDraw:
    """The choice of one row's code by a group of ``threads`` threads, ``V // threads`` of the
    row's fp32 logits a thread: temperature, top-k by radix select, the Gumbel terms (``noise``)
    and the block argmax, or the greedy argmax (``mode``). The one body of the depth draw: the
    loop's DepthSampler (a CTA of THREADS a row, column tidx + THREADS j, ``bar.sync 0``) and
    the depth frame's sampled embedding task (kernels/depth/frame/embedding.py: the frame's 128
    consumer threads, its chunk-major columns, a named barrier) both call :meth:`choose`.

    ``column(tidx, j)``: the column of a thread's j-th value (None: tidx + threads j), in
    increasing order of j (the first index wins ties). ``barrier()``: the group's barrier (None:
    ``cute.arch.sync_threads``)."""

    def __init__(self, V: int, threads: int, mode: str, noise: str, column=None, barrier=None):
        if threads % 32 or BINS % threads or V % threads:
            raise ValueError(f"{threads} threads for a row of {V}: whole warps that divide "
                             f"the row and the {BINS} bins")
        self.V, self.threads, self.mode, self.noise = V, threads, mode, noise
        self.per_thread = V // threads
        self.column, self.barrier = column, barrier

    def _col(self, tidx, j: int):
        return tidx + self.threads * j if self.column is None else self.column(tidx, j)

    def _bin(self, tidx, z: int):
        """The z-th histogram bin a thread zeroes."""
        return tidx if z == 0 else tidx + z * self.threads

    def _sync(self):
        if self.barrier is None:
            cute.arch.sync_threads()
        else:
            self.barrier()

    def allocate(self, smem):
        """The shared memory :meth:`choose` takes: (histograms, selection, best values, best
        columns, survivors' count and columns, survivors' scores)."""
        s_hist = smem.allocate_tensor(Int32, cute.make_layout(2 * BINS), 16)
        s_sel = smem.allocate_tensor(Int32, cute.make_layout(4), 16)
        s_best = smem.allocate_tensor(Float64, cute.make_layout(self.threads // 32), 16)
        s_idx = smem.allocate_tensor(Int32, cute.make_layout(self.threads // 32 + 1), 16)
        # the survivors of top-k: count, columns, scores (16 KB at V = 2048: compact builds
        # only; the others get one-element stand-ins, of which only the count is zeroed)
        live = self.V if self.noise == "compact" else 1
        s_live = smem.allocate_tensor(Int32, cute.make_layout(1 + live), 16)
        s_live_s = smem.allocate_tensor(Float32, cute.make_layout(live), 16)
        return s_hist, s_sel, s_best, s_idx, s_live, s_live_s

    @staticmethod
    def smem_bytes(V: int, threads: int, noise: str) -> int:
        """What :meth:`allocate` takes, with each tensor's 16-byte alignment."""
        live = V if noise == "compact" else 1
        sizes = (8 * BINS, 16, 8 * (threads // 32), 4 * (threads // 32 + 1), 4 * (1 + live),
                 4 * live)
        return sum(-(-n // 16) * 16 for n in sizes)

    @cute.jit
    def kth_largest_key(self, keys, k, s_hist: cute.Tensor, s_sel: cute.Tensor, tidx):
        """The k-th largest of the group's keys (radix select, most significant byte first)."""
        prefix = Uint32(0)
        mask = Uint32(0)
        remaining = k
        lane, warp = tidx % 32, tidx // 32
        for z in cutlass.range_constexpr(BINS // self.threads):
            s_hist[self._bin(tidx, z)] = Int32(0)
        self._sync()
        for p in cutlass.range_constexpr(4):
            shift = 24 - 8 * p
            buf = p % 2
            for j in cutlass.range_constexpr(self.per_thread):
                if (keys[j] & mask) == prefix:
                    digit = Int32((keys[j] >> Uint32(shift)) & Uint32(255))
                    cute.arch.atomic_add((s_hist.iterator + buf * BINS + digit).llvm_ptr,
                                         Int32(1), scope="cta")
            self._sync()
            for z in cutlass.range_constexpr(BINS // self.threads):  # the next pass's
                s_hist[(1 - buf) * BINS + self._bin(tidx, z)] = Int32(0)
            if warp == 0:
                # lane l owns bins 8l..8l+7; counts above each lane's bins by a suffix scan
                own = Int32(0)
                for b in cutlass.range_constexpr(8):
                    own = own + s_hist[buf * BINS + 8 * lane + b]
                incl = own
                for o in cutlass.range_constexpr(5):
                    nb = cute.arch.shuffle_sync_down(incl, offset=1 << o)
                    if lane + (1 << o) < 32:
                        incl = incl + nb
                above = incl - own
                for bb in cutlass.range_constexpr(8):
                    b = 7 - bb
                    c = s_hist[buf * BINS + 8 * lane + b]
                    if above < remaining and remaining <= above + c:
                        s_sel[2 * buf] = Int32(8 * lane + b)
                        s_sel[2 * buf + 1] = remaining - above
                    above = above + c
            self._sync()
            prefix = prefix | (Uint32(s_sel[2 * buf]) << Uint32(shift))
            mask = mask | (Uint32(255) << Uint32(shift))
            remaining = s_sel[2 * buf + 1]
        return prefix

    @cute.jit
    def gumbel_term(self, col, seed, off) -> Float64:
        """log(-log u), u column col's Philox uniform (models.philox.uniform)."""
        r0, r1 = philox4x32_10(Uint32(col), Uint32(off), Uint32(off >> Uint64(32)), Uint32(0),
                               Uint32(seed), Uint32(seed >> Uint64(32)))
        bits = (Uint64(r0) << Uint64(21)) | Uint64(r1 >> Uint32(11))
        u = (Float64(bits) + Float64(0.5)) * Float64(2.0 ** -53)
        return cute.math.log(-cute.math.log(u))

    @cute.jit
    def perturbed(self, v, col, sampled, seed, off):
        """v - log(-log u) on sampled rows, else v."""
        if sampled:
            v = v - self.gumbel_term(col, seed, off)
        return v

    @cute.jit
    def early_terms(self, T, seed, off, tidx):
        """The Gumbel terms of this thread's columns (0 on T == 0 rows, whose draw is the
        argmax), before the dependency wait: they hide in the CTA's early residency."""
        terms = cute.make_rmem_tensor((self.per_thread,), Float64)
        for j in cutlass.range_constexpr(self.per_thread):
            terms[j] = Float64(0.0)
        if T > Float32(0.0):
            for j in cutlass.range_constexpr(self.per_thread):
                terms[j] = self.gumbel_term(self._col(tidx, j), seed, off)
        return terms

    @cute.jit
    def compact_survivors(self, s, kth, s_live: cute.Tensor, s_live_s: cute.Tensor, tidx, lane):
        """The scores s >= kth and their columns into shared memory (any order: the argmax
        breaks ties by column), one shared atomic per warp and element; returns their count.
        ``s_live[0]`` must be zero and visible (kth_largest_key's barriers see to it)."""
        for j in cutlass.range_constexpr(self.per_thread):
            keep = s[j] >= kth
            ballot = Uint32(cute.arch.vote_ballot_sync(keep))
            base = Int32(0)
            if lane == 0 and ballot != Uint32(0):
                base = cute.arch.atomic_add(s_live.iterator.llvm_ptr,
                                            Int32(cute.arch.popc(ballot)), scope="cta")
            base = cute.arch.shuffle_sync(base, 0)
            if keep:
                slot = base + Int32(cute.arch.popc(ballot & cute.arch.lanemask_lt()))
                s_live[1 + slot] = Int32(self._col(tidx, j))
                s_live_s[slot] = s[j]
        self._sync()
        return s_live[0]

    @cute.jit
    def choose(self, load, params, smem, terms, stamp, tidx, lane, warp):
        """The row's code, the same in every thread; ``load(s)`` fills the thread's fp32 logits
        (rmem [V // threads], column ``column(tidx, j)`` at j); ``params``: the row's (T, k,
        seed, offset + draw) (zeros in greedy mode); ``smem``: :meth:`allocate`'s; ``terms``:
        :meth:`early_terms`' (early noise); ``stamp(point)``: a trace hook (DRAW_TRACE_POINTS
        2 and 3)."""
        s_hist, s_sel, s_best, s_idx, s_live, s_live_s = smem
        V, E = self.V, self.per_thread
        greedy = cutlass.const_expr(self.mode == "greedy")
        T, k, seed, off = params
        t = cutlass.select_(T > Float32(0.0), T, Float32(1.0))
        s = cute.make_rmem_tensor((E,), Float32)
        keys = cute.make_rmem_tensor((E,), Uint32)
        # every load before the first division: the division's slow-path branch would
        # otherwise keep the next load behind it, E dependent L2 trips (v13a)
        load(s)
        if cutlass.const_expr(not greedy):
            for j in cutlass.range_constexpr(E):
                s[j] = nan_as_neg_inf(s[j] / t)
                keys[j] = order_key(s[j])
        stamp(2)
        no_candidate = Float64(-1.0e308) * Float64(10.0)  # -inf
        best = no_candidate
        best_i = Int32(V)  # a row without a candidate draws V, as models.sampler.draw
        if cutlass.const_expr(greedy):
            stamp(3)  # no selection
            for j in cutlass.range_constexpr(E):
                if Float64(s[j]) > best:
                    best = Float64(s[j])
                    best_i = Int32(self._col(tidx, j))
        else:
            k = cutlass.select_(k <= Int32(0), Int32(V), cutlass.min(k, Int32(V)))
            if tidx == 0:
                s_live[0] = Int32(0)
            kth = key_value(self.kth_largest_key(keys, k, s_hist, s_sel, tidx))
            stamp(3)
            sampled = T > Float32(0.0)
            if cutlass.const_expr(self.noise == "early"):
                for j in cutlass.range_constexpr(E):
                    if s[j] >= kth:
                        v = Float64(s[j]) - terms[j]  # 0 on T == 0 rows: v = s exactly
                        if v > best:
                            best = v
                            best_i = Int32(self._col(tidx, j))
            else:  # compact
                n = self.compact_survivors(s, kth, s_live, s_live_s, tidx, lane)
                for i in cutlass.range(tidx, n, self.threads):
                    col = s_live[1 + i]
                    v = self.perturbed(Float64(s_live_s[i]), col, sampled, seed, off)
                    # a -inf survivor is no candidate (V stays the answer, as in "early")
                    if v > best or (v == best and col < best_i and v > no_candidate):
                        best = v
                        best_i = col
        # block argmax, first index on ties
        for o in cutlass.range_constexpr(5):
            ov = cute.arch.shuffle_sync_bfly(best, offset=1 << o)
            oi = cute.arch.shuffle_sync_bfly(best_i, offset=1 << o)
            if ov > best or (ov == best and oi < best_i):
                best = ov
                best_i = oi
        if lane == 0:
            s_best[warp] = best
            s_idx[warp] = best_i
        self._sync()
        if tidx == 0:
            b, bi = s_best[0], s_idx[0]
            for w in cutlass.range_constexpr(1, self.threads // 32):
                if s_best[w] > b or (s_best[w] == b and s_idx[w] < bi):
                    b = s_best[w]
                    bi = s_idx[w]
            s_idx[self.threads // 32] = bi
        self._sync()
        return s_idx[self.threads // 32]


class DepthSampler:
    """Static config: rows M, vocab V (a multiple of 256), widths of the two gathered rows.
    ``trace``: stamp DRAW_TRACE_POINTS. ``noise`` (NOISE): "early" draws Philox and the two
    fp64 logs for all of a row's columns while the CTA waits for the logits (no parameter of a
    draw is written inside the frame: the sampler's tensors change between frames only);
    "compact" moves the top-k survivors to shared memory and draws one a thread.
    ``qkv_width``: also gather a row of that many bf16 from a per-code QKV table (0: none).
    ``talker_sum``: also write bf16(sum_in + the gathered Talker-space row), sum_in an fp32
    partial sum (the frame's last draw ends the talker sum: no kernel after it). ``advance``:
    then add that to the row's offset, as Sampler.advance_offsets does (the frame's last draw:
    no offset kernel after it either); written after the CTA's last read of it."""

    def __init__(self, M: int, V: int, hidden: int, talker_hidden: int, mode: str = "sample",
                 pdl: bool = True, trace: bool = False, noise: str = "early",
                 qkv_width: int = 0, talker_sum: bool = False, advance: int = 0):
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} not in {MODES}")
        if noise not in NOISE:
            raise ValueError(f"noise {noise!r} not in {NOISE}")
        if V % THREADS or hidden % 8 or talker_hidden % 8 or hidden // 8 > THREADS \
                or talker_hidden // 8 > THREADS:
            raise ValueError(f"unsupported V {V} / widths {hidden}, {talker_hidden}")
        if qkv_width % (8 * THREADS):
            raise ValueError(f"the draw gathers QKV rows of whole {8 * THREADS}-element runs, "
                             f"not {qkv_width}")
        if advance < 0:
            raise ValueError(f"advance {advance} < 0")
        self.qkv_width, self.talker_sum, self.advance = qkv_width, talker_sum, advance
        self.M, self.V, self.hidden, self.talker = M, V, hidden, talker_hidden
        self.mode, self.pdl, self.trace, self.noise = mode, pdl, trace, noise
        self.per_thread = V // THREADS
        self.row = RowDraw(V, THREADS, mode, noise)  # the per-row choice (shared with the frame)

    @cute.jit
    def __call__(self, logits_ptr: cute.Pointer, temp_ptr: cute.Pointer, topk_ptr: cute.Pointer,
                 seed_ptr: cute.Pointer, offset_ptr: cute.Pointer, codes_ptr: cute.Pointer,
                 codes_in_ptr: cute.Pointer, table_ptr: cute.Pointer, embed_ptr: cute.Pointer,
                 x_next_ptr: cute.Pointer, used_ptr: cute.Pointer, trace_ptr: cute.Pointer,
                 qkv_table_ptr: cute.Pointer, qkv_next_ptr: cute.Pointer,
                 sum_in_ptr: cute.Pointer, sum_out_ptr: cute.Pointer, ld_logits: Int32,
                 ld_codes: Int32, ld_used: Int32, draw: Int32, stream):
        M, V = self.M, self.V
        mL = cute.make_tensor(logits_ptr, cute.make_layout((M, V), stride=(ld_logits, 1)))
        per_row = cute.make_layout(M)
        mT = cute.make_tensor(temp_ptr, per_row)
        mK = cute.make_tensor(topk_ptr, per_row)
        mSeed = cute.make_tensor(seed_ptr, per_row)
        mOff = cute.make_tensor(offset_ptr, per_row)
        mCodes = cute.make_tensor(codes_ptr, cute.make_layout(M, stride=ld_codes))
        mCodesIn = cute.make_tensor(codes_in_ptr, cute.make_layout(M, stride=ld_codes))
        hw, tw = self.hidden // 2, self.talker // 2  # 32-bit words per gathered row
        mTable = cute.make_tensor(table_ptr, cute.make_layout((4, V * hw // 4), stride=(1, 4)))
        mEmbed = cute.make_tensor(embed_ptr, cute.make_layout((4, V * tw // 4), stride=(1, 4)))
        mX = cute.make_tensor(x_next_ptr, cute.make_layout((4, M * hw // 4), stride=(1, 4)))
        qw = max(self.qkv_width // 2, 4)  # (one 16-byte stand-in run when there is no table)
        mQkvT = cute.make_tensor(qkv_table_ptr, cute.make_layout((4, V * qw // 4), stride=(1, 4)))
        mQkv = cute.make_tensor(qkv_next_ptr, cute.make_layout((4, M * qw // 4), stride=(1, 4)))
        mUsed = cute.make_tensor(used_ptr, cute.make_layout((4, M, tw // 4),
                                                            stride=(1, ld_used // 2, 4)))
        # the talker sum's fp32 partial (4 fp32 a 16-byte run) and bf16 result, rows contiguous
        mSumIn = cute.make_tensor(sum_in_ptr, cute.make_layout((4, M * tw // 2), stride=(1, 4)))
        mSumOut = cute.make_tensor(sum_out_ptr, cute.make_layout((4, M * tw // 4), stride=(1, 4)))
        points = len(DRAW_TRACE_POINTS)
        mTr = cute.make_tensor(trace_ptr, cute.make_layout((M, points), stride=(points, 1)))
        self.kernel(mL, mT, mK, mSeed, mOff, mCodes, mCodesIn, mTable, mEmbed, mX, mUsed, mTr,
                    mQkvT, mQkv, mSumIn, mSumOut, draw).launch(
            grid=[M, 1, 1], block=[THREADS, 1, 1], stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, mL: cute.Tensor, mT: cute.Tensor, mK: cute.Tensor, mSeed: cute.Tensor,
               mOff: cute.Tensor, mCodes: cute.Tensor, mCodesIn: cute.Tensor,
               mTable: cute.Tensor, mEmbed: cute.Tensor, mX: cute.Tensor, mUsed: cute.Tensor,
               mTr: cute.Tensor, mQkvT: cute.Tensor, mQkv: cute.Tensor, mSumIn: cute.Tensor,
               mSumOut: cute.Tensor, draw: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        m, _, _ = cute.arch.block_idx()
        lane, warp = tidx % 32, tidx // 32
        smem = self.row.allocate(cutlass.memory.SmemAllocator())
        self._stamp(mTr, m, tidx, 0)
        hw4, tw4 = self.hidden // 8, self.talker // 8
        # the row's parameters before the wait, whatever the noise: like the early terms they
        # only change between frames, and after the wait each load is one more L2 trip
        params = (Float32(0.0), Int32(0), Uint64(0), Uint64(0))
        if cutlass.const_expr(self.mode == "sample"):
            params = (mT[m], Int32(mK[m]), Uint64(mSeed[m]), Uint64(mOff[m]) + Uint64(draw))
        off_next = Int64(0)
        if cutlass.const_expr(self.advance > 0):
            off_next = mOff[m] + Int64(self.advance)
        terms = None
        if cutlass.const_expr(self.mode == "sample" and self.noise == "early"):
            terms = self.row.early_terms(params[0], params[2], params[3], tidx)
        if cutlass.const_expr(self.pdl):
            # the next kernel (a GEMV) only prefetches weights before its own wait: let it in now
            pdl_launch_dependents()
            pdl_wait()
        self._stamp(mTr, m, tidx, 1)
        code = Int32(0)
        if cutlass.const_expr(self.mode == "forced"):
            code = Int32(mCodesIn[m])
            self._stamp(mTr, m, tidx, 2)
            self._stamp(mTr, m, tidx, 3)
        else:
            code = self.row.choose(lambda s: self._load_row(s, mL, m, tidx), params, smem,
                                   terms, lambda point: self._stamp(mTr, m, tidx, point), tidx,
                                   lane, warp)
        self._stamp(mTr, m, tidx, 4)
        if tidx == 0:
            mCodes[m] = Int64(code)
            if cutlass.const_expr(self.advance > 0):
                # every thread read the offset before the wait (and choose's barriers)
                mOff[m] = off_next
        # the gathers for the next position: every load before the first store (a store may
        # alias a later load, so the compiler keeps that order: one memory trip, not four)
        x_row = cute.make_rmem_tensor((4,), Uint32)
        for e in cutlass.range_constexpr(4):
            x_row[e] = Uint32(0)  # unused past the row (kept: dropping it changes the PTX)
        t_row = cute.make_rmem_tensor((4,), Uint32)
        part = [cute.make_rmem_tensor((4,), Float32) for _ in range(2)]
        qw4 = self.qkv_width // 8
        q_rows = [cute.make_rmem_tensor((4,), Uint32) for _ in range(qw4 // THREADS)]
        # a code V (no candidate) gathers the last row: memory-safe, its outputs meaningless
        row = cutlass.min(code, Int32(self.V - 1))
        if tidx < hw4:
            cute.autovec_copy(mTable[(None, row * hw4 + tidx)], x_row)
        if tidx < tw4:
            cute.autovec_copy(mEmbed[(None, row * tw4 + tidx)], t_row)
            if cutlass.const_expr(self.talker_sum):
                for h in cutlass.range_constexpr(2):
                    cute.autovec_copy(mSumIn[(None, 2 * (m * tw4 + tidx) + h)], part[h])
        for j in cutlass.range_constexpr(len(q_rows)):
            cute.autovec_copy(mQkvT[(None, row * qw4 + j * THREADS + tidx)], q_rows[j])
        if tidx < hw4:
            cute.autovec_copy(x_row, mX[(None, m * hw4 + tidx)])
        if tidx < tw4:
            cute.autovec_copy(t_row, mUsed[(None, m, tidx)])
            if cutlass.const_expr(self.talker_sum):
                self._end_talker_sum(t_row, part, mSumOut, m * tw4 + tidx)
        for j in cutlass.range_constexpr(len(q_rows)):
            cute.autovec_copy(q_rows[j], mQkv[(None, m * qw4 + j * THREADS + tidx)])
        self._stamp(mTr, m, tidx, 5)

    @cute.jit
    def _load_row(self, s: cute.Tensor, mL: cute.Tensor, m, tidx):
        """The CTA's row of fp32 logits, column tidx + THREADS j at s[j] (RowDraw.choose)."""
        for j in cutlass.range_constexpr(self.per_thread):
            s[j] = mL[m, tidx + THREADS * j]

    @cute.jit
    def _end_talker_sum(self, row: cute.Tensor, part: list, mSumOut: cute.Tensor, run):
        """A run of 8 talker-sum columns: the fp32 partial (``part``, two runs of 4) plus the
        gathered bf16 row, rounded once to nearest-even bf16 (the same bits as
        torch.add(partial, row, out=bf16))."""
        out = cute.make_rmem_tensor((4,), Uint32)
        for e in cutlass.range_constexpr(4):  # word e holds columns 2e and 2e + 1
            p = part[e // 2]
            out[e] = bf16x2_rn(p[2 * (e % 2)] + bf16_lo(row[e]),
                               p[2 * (e % 2) + 1] + bf16_hi(row[e]))
        cute.autovec_copy(out, mSumOut[(None, run)])

    @cute.jit
    def _stamp(self, mTr: cute.Tensor, m, tidx, point: cutlass.Constexpr[int]):
        """Thread 0's %globaltimer at DRAW_TRACE_POINTS[point] (traced builds only)."""
        if cutlass.const_expr(self.trace):
            if tidx == 0:
                mTr[m, point] = Int64(cute.arch.globaltimer())


def _ptr_specs():
    # logits, temperature, top_k, seed, offset, codes, codes_in, table, embeds, x_next, used,
    # trace stamps, qkv_table, qkv_next, talker-sum partial and result
    return ((Float32, 16), (Float32, 4), (Int64, 8), (Int64, 8), (Int64, 8), (Int64, 8), (Int64, 8),
            (Uint32, 16), (Uint32, 16), (Uint32, 16), (Uint32, 16), (Int64, 8), (Uint32, 16),
            (Uint32, 16), (Float32, 16), (Uint32, 16))


def compile_args():
    return (*pointer_args(_ptr_specs()), Int32(15 * 2048), Int32(15), Int32(16 * 2048), Int32(3),
            make_fake_stream())


def depth_draw(logits, codes, table, embeds, x_next, used, draw: int, *, mode: str,
               temperature=None, top_k=None, seed=None, offset=None, codes_in=None,
               pdl: bool = True, trace=None, noise: str = "early", qkv_table=None,
               qkv_next=None, sum_in=None, sum_out=None, advance: int = 0):
    """Draw (or take) one code per row and gather the next rows (see the module notes).
    ``trace``: int64 [M, len(DRAW_TRACE_POINTS)], each row's %globaltimer stamps (ns);
    ``noise``: where the Gumbel terms are drawn (NOISE; the same codes; DepthSampler);
    ``qkv_table`` [V, W] and ``qkv_next`` [M, W] bf16 (W a multiple of 8 x THREADS): also
    qkv_next = qkv_table[code]. ``sum_in`` [M, talker_hidden] fp32 and ``sum_out``
    [M, talker_hidden] bf16 (both contiguous): also sum_out = bf16(sum_in + embeds[code]).
    ``advance`` > 0: then offset += advance in place (Sampler.advance_offsets for the frame's
    draws; ``offset`` required, in any mode).

    logits [M, V] fp32 (rows may be strided); codes / codes_in [M] int64 (strided views of the
    [M, 15] code tensors); table [V, hidden] and embeds [V, talker_hidden] bf16; x_next
    [M, hidden] bf16; used [M, talker_hidden] bf16 (rows may be strided); temperature [M] fp32,
    top_k / seed / offset [M] int64 (the Sampler's tensors); ``draw``: this draw's offset."""
    require_hopper()
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} not in {MODES}")
    if noise not in NOISE:
        raise ValueError(f"noise {noise!r} not in {NOISE}")
    M, V = logits.shape
    hidden, talker = table.shape[1], embeds.shape[1]
    check_cuda_tensor("logits", logits, dtypes=(torch.float32,), contiguous=False)
    if logits.stride(1) != 1 or used.stride(1) != 1 or x_next.stride(1) != 1:
        raise ValueError("logits, x_next and used need unit column strides")
    for name, t in (("table", table), ("embeds", embeds), ("x_next", x_next)):
        check_cuda_tensor(name, t, dtypes=(torch.bfloat16,))
    check_cuda_tensor("used", used, dtypes=(torch.bfloat16,), contiguous=False)
    if tuple(table.shape) != (V, hidden) or tuple(embeds.shape) != (V, talker) \
            or tuple(x_next.shape) != (M, hidden) or tuple(used.shape) != (M, talker):
        raise ValueError("table [V, hidden], embeds [V, talker], x_next [M, hidden], "
                         "used [M, talker] expected")
    check_cuda_tensor("codes", codes, dtypes=(torch.int64,), contiguous=False, align=8)
    if mode == "sample":
        for name, t, dt in (("temperature", temperature, torch.float32),
                            ("top_k", top_k, torch.int64), ("seed", seed, torch.int64),
                            ("offset", offset, torch.int64)):
            check_cuda_tensor(name, t, dtypes=(dt,), align=4)
            if tuple(t.shape) != (M,):
                raise ValueError(f"{name} has shape {tuple(t.shape)}; need [{M}]")
    if advance < 0 or (advance and offset is None):
        raise ValueError(f"advance {advance}: >= 0, and > 0 only with the offset tensor")
    if advance and mode != "sample":
        check_cuda_tensor("offset", offset, dtypes=(torch.int64,), align=4)
        if tuple(offset.shape) != (M,):
            raise ValueError(f"offset has shape {tuple(offset.shape)}; need [{M}]")
    if mode == "forced":
        check_cuda_tensor("codes_in", codes_in, dtypes=(torch.int64,), contiguous=False, align=8)
        if codes_in.stride() != codes.stride():
            raise ValueError("codes_in must be laid out as codes")
    if (qkv_table is None) != (qkv_next is None):
        raise ValueError("qkv_table and qkv_next go together")
    qkv_width = 0
    if qkv_table is not None:
        check_cuda_tensor("qkv_table", qkv_table, dtypes=(torch.bfloat16,))
        check_cuda_tensor("qkv_next", qkv_next, dtypes=(torch.bfloat16,))
        qkv_width = qkv_table.shape[1]
        if qkv_table.shape[0] != V or tuple(qkv_next.shape) != (M, qkv_width) \
                or qkv_width % (8 * THREADS):
            raise ValueError(f"qkv_table {tuple(qkv_table.shape)}, qkv_next "
                             f"{tuple(qkv_next.shape)}: need [{V}, W], [{M}, W], W a multiple of "
                             f"{8 * THREADS}")
    if (sum_in is None) != (sum_out is None):
        raise ValueError("sum_in and sum_out go together")
    if sum_in is not None:
        check_cuda_tensor("sum_in", sum_in, dtypes=(torch.float32,))
        check_cuda_tensor("sum_out", sum_out, dtypes=(torch.bfloat16,))
        if tuple(sum_in.shape) != (M, talker) or tuple(sum_out.shape) != (M, talker):
            raise ValueError(f"sum_in {tuple(sum_in.shape)}, sum_out {tuple(sum_out.shape)}: "
                             f"need [{M}, {talker}]")
    if trace is not None:
        check_cuda_tensor("trace", trace, dtypes=(torch.int64,))
        if tuple(trace.shape) != (M, len(DRAW_TRACE_POINTS)):
            raise ValueError(f"trace {tuple(trace.shape)}: need ({M}, {len(DRAW_TRACE_POINTS)})")
    # modes without a sampler pass stand-in pointers the kernel never reads
    tensors = (logits, temperature if temperature is not None else logits,
               top_k if top_k is not None else codes, seed if seed is not None else codes,
               offset if offset is not None else codes, codes,
               codes_in if codes_in is not None else codes, table, embeds, x_next, used,
               trace if trace is not None else codes,
               table if qkv_table is None else qkv_table,
               x_next if qkv_next is None else qkv_next, logits if sum_in is None else sum_in,
               x_next if sum_out is None else sum_out)
    ptrs = pointer_args(_ptr_specs(), tensors)
    scalars = (Int32(logits.stride(0)), Int32(codes.stride(0)), Int32(used.stride(0)),
               Int32(draw))
    key = ("depth_draw", M, V, hidden, talker, mode, pdl, trace is not None, noise, qkv_width,
           sum_in is not None, advance, timing_perturbation())
    compiled = cached_compile(key, lambda: cute.compile(
        DepthSampler(M, V, hidden, talker, mode, pdl, trace is not None, noise, qkv_width,
                     sum_in is not None, advance),
        *ptrs, *scalars, current_stream()))
    compiled(*ptrs, *scalars, current_stream())
    return codes
