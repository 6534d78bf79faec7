"""Small-M bf16 projections y[M, N] = x[M, K] · W[N, K]^T for M <= 8 (the depth loop's GEMVs),
with the neighbours of a projection fused in: an RMSNorm prologue, a residual or SwiGLU epilogue.

cuBLAS picks tensor-core tiles for these shapes and streams the weights at 0.4-1.6 TB/s on the
H200 (measured in the fast loop's kernel breakdown, results/logs/*-fast-loop-v2.log); the work is
a pure weight stream (M·K·N·2 flops against 2·N·K bytes), so the floor is 2NK / 4.24 TB/s.

Work split: one warp per output column n (a row of W; two rows, gate n and up n, with SwiGLU).
Each lane loads 16-byte chunks of its row at k = 8·lane + 256·i, all K/256 of them issued before
anything else, multiplies them with the matching 8 elements of every x row, accumulates in fp32
and the warp reduces with butterfly shuffles; lane m writes y[m, n]. Four warps per CTA, N/4 CTAs.
Same arithmetic as cuBLAS (exact bf16 products, fp32 sums, one rounding) in another order.

Fusions, each rounding where the eager torch reference rounds (models.codepredictor):

* ``norm``: x is RMS-normalised on the way in, ``gamma * bf16(x * rsqrt(mean(x^2) + eps))``
  rounded to bf16; each CTA normalises the M rows into shared memory (one warp per row) before
  its warps read them;
* ``residual``: ``y = bf16(resid + bf16(x W^T))`` (resid may be y itself: each element is read
  and written by the same lane);
* ``swiglu``: W is [2N, K] (gate rows then up rows); ``y = bf16(bf16(silu(g)) * u)`` with g, u
  the bf16-rounded projections;
* ``out_f32``: the bf16-rounded result widened to fp32 (the logits).

``pdl``: launched with programmatic stream serialisation. The kernel lets its successor launch
at once (``launch_dependents`` first: a successor only reads constants before its own wait),
issues its weight loads (constants too), then ``griddepcontrol.wait`` holds everything that
reads the predecessor's output. A chain of these overlaps each launch and weight fetch with the
previous kernel's tail. (When a kernel passes its wait, every earlier kernel has completed; the
attention step, which reads older KV-cache slots before its wait, triggers only after its wait,
so no chain runs ahead of it.)
"""
from __future__ import annotations

import torch

from kernels.depth.projection_io import check_projection_out, epilogue_store, projection_dims
from device.rounding import add_squares, rms_factor, rmsnorm_pair
from device.ptx import bf16_hi, bf16_lo, pdl_launch_dependents, pdl_wait, timing_perturbation
from device.runtime import (cached_compile, check_cuda_tensor, cute_modules,
                                    current_stream, pointer_args, require_hopper)

cutlass, cute = cute_modules()
from cutlass import BFloat16, Float32, Int32, Uint32  # noqa: E402
from cutlass.cute.nvgpu import LoadCacheMode, cpasync  # noqa: E402
from cutlass.cute.runtime import make_fake_stream  # noqa: E402

MAX_M = 8
# how a projection without the norm prologue brings x in: "async", the CTA's cp.async copies
# of x into shared memory (all in flight at once, no registers held), or "direct", each warp
# loading its chunks into registers as it goes (the compiler keeps two or three of those in
# flight, so K / 512 dependent L2 trips: notes/fast-loop.md v13b)
X_COPIES = ("async", "direct")
X_SMEM_LIMIT = 48 * 1024  # static shared memory: x's rows (norm prologue or "async" copy)
WARPS = 4


class GemvSmallM:
    """Static config: rows M (1..8), K (a multiple of 256) and the fused neighbours."""

    def __init__(self, M: int, K: int, *, norm: bool = False, residual: bool = False,
                 swiglu: bool = False, out_f32: bool = False, pdl: bool = False,
                 eps: float = 1e-6, x_copy: str = "async"):
        if x_copy not in X_COPIES:
            raise ValueError(f"x_copy {x_copy!r}: one of {X_COPIES}")
        if not 1 <= M <= MAX_M:
            raise ValueError(f"M = {M}: this kernel takes 1..{MAX_M} rows")
        if K % 256:
            raise ValueError(f"K = {K} must be a multiple of 256")
        if sum((residual, swiglu, out_f32)) > 1:
            raise ValueError("residual, swiglu and out_f32 are alternative epilogues")
        self.M, self.K = M, K
        self.norm, self.residual, self.swiglu, self.out_f32 = norm, residual, swiglu, out_f32
        self.pdl, self.eps, self.x_copy = pdl, eps, x_copy
        if (norm or x_copy == "async") and M * K * 2 > X_SMEM_LIMIT:
            raise ValueError(f"{M} rows of K = {K} in shared memory exceed {X_SMEM_LIMIT} bytes "
                             "(norm, or x_copy 'async': take 'direct' without the norm)")
        self.w_rows = 2 if swiglu else 1

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, w_ptr: cute.Pointer, y_ptr: cute.Pointer,
                 gamma_ptr: cute.Pointer, resid_ptr: cute.Pointer, N: Int32, ldy: Int32,
                 stream):
        kw = self.K // 2  # words per row
        mX = cute.make_tensor(x_ptr, cute.make_layout((4, self.M * kw // 4), stride=(1, 4)))
        mW = cute.make_tensor(w_ptr, cute.make_layout((4, self.w_rows * N * kw // 4),
                                                      stride=(1, 4)))
        mG = cute.make_tensor(gamma_ptr, cute.make_layout((4, kw // 4), stride=(1, 4)))
        mY = cute.make_tensor(y_ptr, cute.make_layout((self.M, N), stride=(ldy, 1)))
        mR = cute.make_tensor(resid_ptr, cute.make_layout((self.M, N), stride=(ldy, 1)))
        self.kernel(mX, mW, mY, mG, mR, N).launch(grid=[N // WARPS, 1, 1],
                                                  block=[32 * WARPS, 1, 1], stream=stream,
                                                  use_pdl=self.pdl)

    @cute.jit
    def normalize_rows(self, mX: cute.Tensor, gs: list, sX: cute.Tensor, warp, lane):
        """sX <- bf16(gamma * bf16(x * rsqrt(mean(x^2) + eps))), one warp per row; ``gs``: the
        lane's gamma chunks (loaded before the wait: a constant)."""
        chunks = self.K // 256
        row_chunks = self.K // 8
        for m in cutlass.range_constexpr(self.M):
            if warp == m % WARPS:
                xs = [cute.make_rmem_tensor((4,), Uint32) for _ in range(chunks)]
                ss = Float32(0.0)
                for i in cutlass.range_constexpr(chunks):
                    cute.autovec_copy(mX[(None, m * row_chunks + i * 32 + lane)], xs[i])
                    for e in cutlass.range_constexpr(4):
                        ss = add_squares(ss, xs[i][e])
                ss = cute.arch.warp_reduction(ss, lambda a, b: a + b)
                r = rms_factor(ss, self.K, self.eps)
                for i in cutlass.range_constexpr(chunks):
                    out = cute.make_rmem_tensor((4,), Uint32)
                    for e in cutlass.range_constexpr(4):
                        out[e] = rmsnorm_pair(xs[i][e], gs[i][e], r)
                    cute.autovec_copy(out, sX[(None, m * row_chunks + i * 32 + lane)])

    @cute.jit
    def copy_rows_async(self, mX: cute.Tensor, tidx) -> cute.Tensor:
        """x's M rows into shared memory by the CTA's threads, one 16-byte cp.async a chunk,
        all in flight at once; returns the copy once it has landed and the CTA has synced."""
        total = self.M * self.K // 8  # 16-byte chunks
        sX = cutlass.memory.SmemAllocator().allocate_tensor(
            Uint32, cute.make_layout((4, total), stride=(1, 4)), 16)
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(LoadCacheMode.GLOBAL), Uint32,
                                   num_bits_per_copy=128)
        threads = 32 * WARPS
        for j in cutlass.range_constexpr((total + threads - 1) // threads):
            idx = tidx + threads * j
            if cutlass.const_expr(total % threads == 0):
                cute.copy(atom, mX[(None, idx)], sX[(None, idx)])
            elif idx < total:
                cute.copy(atom, mX[(None, idx)], sX[(None, idx)])
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()
        return sX

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mG: cute.Tensor,
               mR: cute.Tensor, N: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        warp = tidx // 32
        n = bidx * WARPS + warp
        chunks = self.K // 256  # 16-byte chunks per lane
        row_chunks = self.K // 8
        if cutlass.const_expr(self.pdl):
            # let the next kernel launch as soon as this grid is resident: before its own wait
            # it only reads constants (weights), and it cannot pass that wait before we finish
            pdl_launch_dependents()
        # the weight stream first: constants, so legal before the grid dependency resolves
        w = [[cute.make_rmem_tensor((4,), Uint32) for _ in range(chunks)]
             for _ in range(self.w_rows)]
        for r in cutlass.range_constexpr(self.w_rows):
            for i in cutlass.range_constexpr(chunks):
                cute.autovec_copy(mW[(None, (n + r * N) * row_chunks + i * 32 + lane)], w[r][i])
        gs = []
        if cutlass.const_expr(self.norm):  # gamma is a constant too
            gs = [cute.make_rmem_tensor((4,), Uint32) for _ in range(chunks)]
            for i in cutlass.range_constexpr(chunks):
                cute.autovec_copy(mG[(None, i * 32 + lane)], gs[i])
        if cutlass.const_expr(self.pdl):
            pdl_wait()
        resid = Float32(0.0)
        if cutlass.const_expr(self.residual):
            # lane m adds and stores y[m, n]: fetch its residual now, off the tail's critical path
            if lane < self.M:
                resid = mR[lane, n].to(Float32)
        src = mX
        if cutlass.const_expr(self.norm):
            smem = cutlass.memory.SmemAllocator()
            src = smem.allocate_tensor(Uint32, cute.make_layout((4, self.M * row_chunks),
                                                                stride=(1, 4)), 16)
            self.normalize_rows(mX, gs, src, warp, lane)
            cute.arch.sync_threads()
        elif cutlass.const_expr(self.x_copy == "async"):
            src = self.copy_rows_async(mX, tidx)
        acc = [[Float32(0.0) for _ in range(self.M)] for _ in range(self.w_rows)]
        for i in cutlass.range_constexpr(chunks):
            wf = [[] for _ in range(self.w_rows)]
            for r in cutlass.range_constexpr(self.w_rows):
                for e in cutlass.range_constexpr(4):
                    wf[r].append(bf16_lo(w[r][i][e]))
                    wf[r].append(bf16_hi(w[r][i][e]))
            for m in cutlass.range_constexpr(self.M):
                xv = cute.make_rmem_tensor((4,), Uint32)
                cute.autovec_copy(src[(None, m * row_chunks + i * 32 + lane)], xv)
                for e in cutlass.range_constexpr(4):
                    xl, xh = bf16_lo(xv[e]), bf16_hi(xv[e])
                    for r in cutlass.range_constexpr(self.w_rows):
                        acc[r][m] = acc[r][m] + wf[r][2 * e] * xl
                        acc[r][m] = acc[r][m] + wf[r][2 * e + 1] * xh
        for m in cutlass.range_constexpr(self.M):
            t = [cute.arch.warp_reduction(acc[r][m], lambda a, b: a + b)
                 for r in range(self.w_rows)]
            if lane == m:
                epilogue_store(mY, resid, m, n, t, swiglu=self.swiglu, residual=self.residual,
                               out_f32=self.out_f32)


def _ptr_specs(out_f32: bool):
    # x, W, gamma as 16-byte-aligned words; y; resid
    return ((Uint32, 16), (Uint32, 16), (Float32 if out_f32 else BFloat16, 4), (Uint32, 16),
            (BFloat16, 2))


def compile_args(M: int = 4, K: int = 1024, out_f32: bool = False):
    return (*pointer_args(_ptr_specs(out_f32)), Int32(4096), Int32(4096), make_fake_stream())


def gemv_small_m(x, w, out=None, *, gamma=None, resid=None, swiglu: bool = False,
                 pdl: bool = False, eps: float = 1e-6, x_copy: str = "async"):
    """x [M, K] bf16 (M <= 8) times w [N, K]^T -> [M, N] (see the module notes for the fusions).

    ``gamma`` [K]: RMS-normalise x first. ``resid`` [M, N] bf16 (may be ``out``): add it.
    ``swiglu``: w is [2N, K], gate rows then up rows. ``out``: bf16, or fp32 for widened bf16
    results; its rows may be strided (row stride ``out.stride(0)``, unit column stride).
    ``x_copy``: how x comes in without gamma (X_COPIES; the same bits)."""
    require_hopper()
    M, K, N = projection_dims(x, w, swiglu)
    if not 1 <= M <= MAX_M or K % 256:
        raise ValueError(f"M = {M} (1..{MAX_M}) and K = {K} (multiple of 256) required")
    if N % WARPS:
        raise ValueError(f"N = {N} must be a multiple of {WARPS}")
    if out is None:
        out = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    out_f32 = check_projection_out(out, resid, M, N, swiglu)
    if gamma is not None:
        check_cuda_tensor("gamma", gamma, dtypes=(torch.bfloat16,))
        if tuple(gamma.shape) != (K,):
            raise ValueError(f"gamma has shape {tuple(gamma.shape)}; need [{K}]")
    ptrs = pointer_args(_ptr_specs(out_f32), (x, w, out, gamma if gamma is not None else x,
                                              resid if resid is not None else out))
    if x_copy not in X_COPIES:
        raise ValueError(f"x_copy {x_copy!r}: one of {X_COPIES}")
    # the norm prologue reads x itself; x too large for shared memory comes direct
    x_copy = "direct" if gamma is not None or M * K * 2 > X_SMEM_LIMIT else x_copy
    key = ("gemv_small_m", M, K, gamma is not None, resid is not None, swiglu, out_f32, pdl, eps,
           x_copy, timing_perturbation())
    compiled = cached_compile(key, lambda: cute.compile(
        GemvSmallM(M, K, norm=gamma is not None, residual=resid is not None, swiglu=swiglu,
                   out_f32=out_f32, pdl=pdl, eps=eps, x_copy=x_copy),
        *ptrs, Int32(N), Int32(out.stride(0)), current_stream()))
    compiled(*ptrs, Int32(N), Int32(out.stride(0)), current_stream())
    return out

