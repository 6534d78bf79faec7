"""One depth-loop attention step: q/k RMSNorm, RoPE, KV append and attention over <= 16 slots.

The CodePredictor attends over at most 16 positions, so the whole step for one (row, kv head)
fits one CTA of ``head_dim`` threads, thread d owning dimension d of every vector:

1. k and the ``rep`` query heads of this kv head are RMS-normalised (block reductions of their
   squares), rotated (RoPE; the partner dimension d ^ head_dim/2 comes through shared memory)
   and rounded where the eager reference rounds (norm, q·cos, rot·sin, their sum);
2. k and v are written into the cache at ``pos``;
3. scores over the 16 slots (slot ``pos`` from registers, the others from the cache: slots 1-15
   read before the dependency wait, slot 0, which another stream writes, after it; a thread only
   ever touches its own dimension, so there is no read/write race on the cache): each thread's
   32 (head, slot) products are summed over its warp by a butterfly reduce-scatter (31 shuffles
   leave lane i with pair i), then over the warps in shared memory; softmax in warp 0 (masked
   above ``pos``), p rounded to bf16 as the reference does, p·V summed in fp32.

Launched with programmatic stream serialisation like the GEMVs around it (it waits for the QKV
projection, then lets the output projection start streaming its weights).
"""
from __future__ import annotations

import torch

from device.ptx import pdl_launch_dependents, pdl_wait, timing_perturbation
from device.rounding import rms_factor, rmsnorm_value, round_bf16
from device.runtime import (activation_layout, cached_compile, check_cuda_tensor,
                                    cute_modules, current_stream, pointer_args, require_hopper)

cutlass, cute = cute_modules()
from cutlass import BFloat16, Float32, Int32, Int64  # noqa: E402
from cutlass.cute.runtime import make_fake_stream  # noqa: E402

SLOTS = 16
# trace=True builds: thread 0 of each (kv head, row) CTA stamps %globaltimer (ns) at these points
ATTN_TRACE_POINTS = ("entry", "wait_done", "normed", "rotated", "scored", "softmaxed", "stored")


class DepthAttention:
    """Static config: rows M, head counts, head_dim (128), eps. ``trace``: stamp
    ATTN_TRACE_POINTS (normed: after the norms' barrier, so it includes the qkv loads)."""

    def __init__(self, M: int, q_heads: int, kv_heads: int, head_dim: int = 128,
                 eps: float = 1e-6, pdl: bool = True, chunk_major: bool = False,
                 trace: bool = False):
        if q_heads % kv_heads or head_dim % 64 or head_dim > 1024 \
                or (q_heads // kv_heads) * SLOTS != 32:
            raise ValueError(f"unsupported heads {q_heads}/{kv_heads} x {head_dim}: the step "
                             f"needs head_dim a multiple of 64 and 32 (q head, slot) pairs")
        self.M, self.qh, self.kvh, self.D = M, q_heads, kv_heads, head_dim
        self.rep = q_heads // kv_heads
        self.eps, self.pdl = eps, pdl
        self.chunk_major = chunk_major  # out as [q·D / 8][M][8] (runtime.activation_layout)
        self.warps = head_dim // 32
        self.trace = trace

    @cute.jit
    def __call__(self, qkv_ptr: cute.Pointer, qn_ptr: cute.Pointer, kn_ptr: cute.Pointer,
                 cos_ptr: cute.Pointer, sin_ptr: cute.Pointer, kc_ptr: cute.Pointer,
                 vc_ptr: cute.Pointer, out_ptr: cute.Pointer, trace_ptr: cute.Pointer, pos: Int32,
                 stream):
        D, M = self.D, self.M
        width = (self.qh + 2 * self.kvh) * D
        mQKV = cute.make_tensor(qkv_ptr, cute.make_layout((M, width), stride=(width, 1)))
        mQn = cute.make_tensor(qn_ptr, cute.make_layout(D))
        mKn = cute.make_tensor(kn_ptr, cute.make_layout(D))
        mCos = cute.make_tensor(cos_ptr, cute.make_layout((SLOTS, D), stride=(D, 1)))
        mSin = cute.make_tensor(sin_ptr, cute.make_layout((SLOTS, D), stride=(D, 1)))
        cache = cute.make_layout((M, self.kvh, SLOTS, D),
                                 stride=(self.kvh * SLOTS * D, SLOTS * D, D, 1))
        mKc = cute.make_tensor(kc_ptr, cache)
        mVc = cute.make_tensor(vc_ptr, cache)
        mOut = cute.make_tensor(out_ptr, activation_layout(M, self.qh * D, self.qh * D,
                                                           self.chunk_major))
        points = len(ATTN_TRACE_POINTS)
        mTr = cute.make_tensor(trace_ptr, cute.make_layout((M, self.kvh, points),
                                                           stride=(self.kvh * points, points, 1)))
        self.kernel(mQKV, mQn, mKn, mCos, mSin, mKc, mVc, mOut, mTr, pos).launch(
            grid=[self.kvh, M, 1], block=[D, 1, 1], stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, mQKV: cute.Tensor, mQn: cute.Tensor, mKn: cute.Tensor, mCos: cute.Tensor,
               mSin: cute.Tensor, mKc: cute.Tensor, mVc: cute.Tensor, mOut: cute.Tensor,
               mTr: cute.Tensor, pos: Int32):
        d, _, _ = cute.arch.thread_idx()
        h, m, _ = cute.arch.block_idx()
        self._stamp(mTr, m, h, d, 0)
        D, rep, W = self.D, self.rep, self.warps
        nvec = rep + 1  # the rep query heads, then k
        smem = cutlass.memory.SmemAllocator()
        s_norm = smem.allocate_tensor(Float32, cute.make_layout((W, nvec)), 16)
        s_vec = smem.allocate_tensor(Float32, cute.make_layout((nvec, D), stride=(D, 1)), 16)
        s_part = smem.allocate_tensor(Float32, cute.make_layout((W, 32), stride=(32, 1)), 16)
        s_p = smem.allocate_tensor(Float32, cute.make_layout(32), 16)
        warp, lane = d // 32, d % 32
        # constants before the dependency wait: the tables, and the cache slots 1-15 (slot t
        # < pos written by this chain's attention at position t, which completed before the
        # attention between it and us passed its wait and released its successors); slot pos
        # and above are replaced or masked below
        c = mCos[pos, d].to(Float32)
        s = mSin[pos, d].to(Float32)
        gq = mQn[d].to(Float32)
        gk = mKn[d].to(Float32)
        kv_old = [cute.make_rmem_tensor((SLOTS,), Float32) for _ in range(2)]
        for t in cutlass.range_constexpr(1, SLOTS):
            kv_old[0][t] = mKc[m, h, t, d].to(Float32)
            kv_old[1][t] = mVc[m, h, t, d].to(Float32)
        if cutlass.const_expr(self.pdl):
            pdl_wait()
            pdl_launch_dependents()
        # slot 0 only after the wait: the fast loop writes it on a second stream (position 0
        # beside position 1), and position 1's attention may launch once position 0's has
        # released its dependents, before that one's cache store (a stale slot 0: the race
        # of notes/fast-loop.md v14a)
        kv_old[0][0] = mKc[m, h, 0, d].to(Float32)
        kv_old[1][0] = mVc[m, h, 0, d].to(Float32)
        self._stamp(mTr, m, h, d, 1)
        raw = [mQKV[m, (h * rep + r) * D + d].to(Float32) for r in range(rep)]
        raw.append(mQKV[m, (self.qh + h) * D + d].to(Float32))
        v_new = mQKV[m, (self.qh + self.kvh + h) * D + d]
        # 1. RMSNorm of each vector: block sums of squares
        for j in cutlass.range_constexpr(nvec):
            sq = cute.arch.warp_reduction(raw[j] * raw[j], lambda a, b: a + b)
            if lane == 0:
                s_norm[warp, j] = sq
        cute.arch.sync_threads()
        self._stamp(mTr, m, h, d, 2)
        normed = []
        for j in cutlass.range_constexpr(nvec):
            tot = Float32(0.0)
            for w in cutlass.range_constexpr(W):
                tot = tot + s_norm[w, j]
            r_ = rms_factor(tot, D, self.eps)
            g = gk if j == rep else gq
            y = rmsnorm_value(raw[j], g, r_)
            normed.append(y)
            s_vec[j, d] = y
        cute.arch.sync_threads()
        # 2. RoPE: rotate_half pairs d with d ^ D/2, negated in the first half
        sign = cutlass.select_(d < D // 2, Float32(-1.0), Float32(1.0))
        rot = []
        for j in cutlass.range_constexpr(nvec):
            partner = s_vec[j, d ^ (D // 2)] * sign
            rot.append(round_bf16(round_bf16(normed[j] * c) + round_bf16(partner * s)))
        k_new = rot[rep]
        mKc[m, h, pos, d] = k_new.to(BFloat16)
        mVc[m, h, pos, d] = v_new
        self._stamp(mTr, m, h, d, 3)
        keys = [cutlass.select_(t == pos, k_new, kv_old[0][t]) for t in range(SLOTS)]
        vals = [cutlass.select_(t == pos, v_new.to(Float32), kv_old[1][t]) for t in range(SLOTS)]
        # 3. the 32 (head, slot) dot products: this thread's terms, summed over each warp by a
        # butterfly reduce-scatter (lane i ends with pair i: 31 shuffles, not 32 x 5), then over
        # the warps through shared memory
        part = [rot[r] * keys[t] for r in range(rep) for t in range(SLOTS)]
        for step in cutlass.range_constexpr(5):
            o = 16 >> step
            upper = (lane & o) != 0
            nxt = []
            for i in cutlass.range_constexpr(o):
                send = cutlass.select_(upper, part[i], part[i + o])
                keep = cutlass.select_(upper, part[i + o], part[i])
                nxt.append(keep + cute.arch.shuffle_sync_bfly(send, offset=o))
            part = nxt
        s_part[warp, lane] = part[0]
        cute.arch.sync_threads()
        self._stamp(mTr, m, h, d, 4)
        # 4. softmax in warp 0, lane = head * 16 + slot; p rounded to bf16 as the reference
        if warp == 0:
            t = lane % SLOTS
            tot = Float32(0.0)
            for w in cutlass.range_constexpr(W):
                tot = tot + s_part[w, lane]
            live = t <= pos
            sc = cutlass.select_(live, tot * Float32(D ** -0.5), Float32(-3.0e38))
            best = sc
            for k in cutlass.range_constexpr(4):
                best = cute.arch.fmax(best, cute.arch.shuffle_sync_bfly(best, offset=8 >> k))
            e = cutlass.select_(live, cute.math.exp(sc - best), Float32(0.0))
            den = e
            for k in cutlass.range_constexpr(4):
                den = den + cute.arch.shuffle_sync_bfly(den, offset=8 >> k)
            s_p[lane] = round_bf16(e / den)
        cute.arch.sync_threads()
        self._stamp(mTr, m, h, d, 5)
        # 5. p·V for this thread's dimension (masked slots hold p = 0 but maybe junk V: select)
        for r in cutlass.range_constexpr(rep):
            acc = Float32(0.0)
            for t in cutlass.range_constexpr(SLOTS):
                acc = acc + cutlass.select_(t <= pos, s_p[r * SLOTS + t] * vals[t], Float32(0.0))
            mOut[m, (h * rep + r) * D + d] = acc.to(BFloat16)
        self._stamp(mTr, m, h, d, 6)

    @cute.jit
    def _stamp(self, mTr: cute.Tensor, m, h, d, point: cutlass.Constexpr[int]):
        """Thread 0's %globaltimer at ATTN_TRACE_POINTS[point] (traced builds only)."""
        if cutlass.const_expr(self.trace):
            if d == 0:
                mTr[m, h, point] = Int64(cute.arch.globaltimer())


# qkv, q_norm, k_norm, cos, sin, k cache, v cache, out, trace stamps
PTRS = ((BFloat16, 16),) * 8 + ((Int64, 8),)


def compile_args(M: int = 1):
    return (*pointer_args(PTRS), Int32(3), make_fake_stream())


def depth_attention(qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, pos: int, out, *,
                    q_heads: int, kv_heads: int, eps: float = 1e-6, pdl: bool = True,
                    chunk_major: bool = False, trace=None):
    """One position of attention for every row: qkv [M, (q+2kv)·D] bf16 -> out [M, q·D] bf16,
    appending k/v at ``pos`` to the caches [M, kv, 16, D]. ``chunk_major``: out's storage
    laid out [q·D / 8][M][8] (device.runtime.activation_layout), as the wgmma
    projection reads it.
    ``trace``: int64 [M, kv_heads, len(ATTN_TRACE_POINTS)], each CTA's %globaltimer stamps."""
    require_hopper()
    M = qkv.shape[0]
    D = q_norm.shape[0]
    shapes = {"qkv": (qkv, (M, (q_heads + 2 * kv_heads) * D)), "q_norm": (q_norm, (D,)),
              "k_norm": (k_norm, (D,)), "cos": (cos, (SLOTS, D)), "sin": (sin, (SLOTS, D)),
              "k_cache": (k_cache, (M, kv_heads, SLOTS, D)),
              "v_cache": (v_cache, (M, kv_heads, SLOTS, D)), "out": (out, (M, q_heads * D))}
    for name, (t, shape) in shapes.items():
        check_cuda_tensor(name, t, dtypes=(torch.bfloat16,))
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; need {list(shape)}")
    if not 0 <= pos < SLOTS:
        raise ValueError(f"pos = {pos} outside the {SLOTS} cache slots")
    if trace is not None:
        check_cuda_tensor("trace", trace, dtypes=(torch.int64,))
        if tuple(trace.shape) != (M, kv_heads, len(ATTN_TRACE_POINTS)):
            raise ValueError(f"trace {tuple(trace.shape)}: need ({M}, {kv_heads}, "
                             f"{len(ATTN_TRACE_POINTS)})")
    tensors = (qkv, q_norm, k_norm, cos, sin, k_cache, v_cache, out,
               trace if trace is not None else k_cache)
    ptrs = pointer_args(PTRS, tensors)
    key = ("depth_attention", M, q_heads, kv_heads, D, eps, pdl, chunk_major, trace is not None,
           timing_perturbation())
    compiled = cached_compile(key, lambda: cute.compile(
        DepthAttention(M, q_heads, kv_heads, D, eps, pdl, chunk_major, trace is not None),
        *ptrs, Int32(pos), current_stream()))
    compiled(*ptrs, Int32(pos), current_stream())
    return out
