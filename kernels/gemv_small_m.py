"""Small-M bf16 projection y[M, N] = x[M, K] · W[N, K]^T for M <= 8 (the depth loop's GEMVs).

cuBLAS picks tensor-core tiles for these shapes and streams the weights at 0.4-1.6 TB/s on the
H200 (measured in the fast loop's kernel breakdown, results/logs/*-fast-loop-v2.log); the work is
a pure weight stream (M·K·N·2 flops against 2·N·K bytes), so the floor is 2NK / 4.24 TB/s.

Work split: one warp per output column n (a row of W). Each lane streams 16-byte chunks of that
row at k = 8·lane + 256·i (all K/256 loads issued before the first use), multiplies them with the
matching 8 elements of every x row (x is tiny and stays in L1), accumulates in fp32 and the warp
reduces with butterfly shuffles; lane m writes y[m, n] rounded once to bf16 (cvt.rn). Four warps
per CTA, N/4 CTAs. Same arithmetic as cuBLAS (exact bf16 products, fp32 sums, one rounding) in
another order.
"""
from __future__ import annotations

from kernels.nvfp4_device import bf16_hi, bf16_lo
from kernels.runtime import (cached_compile, check_cuda_tensor, cute_modules, current_stream,
                             pointer_args, require_hopper)

cutlass, cute = cute_modules()
from cutlass import BFloat16, Float32, Int32, Uint32  # noqa: E402

MAX_M = 8
WARPS = 4


class GemvSmallM:
    """Static config: rows M (1..8) and K (a multiple of 256)."""

    def __init__(self, M: int, K: int):
        if not 1 <= M <= MAX_M:
            raise ValueError(f"M = {M}: this kernel takes 1..{MAX_M} rows")
        if K % 256:
            raise ValueError(f"K = {K} must be a multiple of 256")
        self.M, self.K = M, K

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, w_ptr: cute.Pointer, y_ptr: cute.Pointer, N: Int32,
                 stream):
        kw = self.K // 2  # words per row
        mX = cute.make_tensor(x_ptr, cute.make_layout((4, self.M * kw // 4), stride=(1, 4)))
        mW = cute.make_tensor(w_ptr, cute.make_layout((4, N * kw // 4), stride=(1, 4)))
        mY = cute.make_tensor(y_ptr, cute.make_layout((self.M, N), stride=(N, 1)))
        self.kernel(mX, mW, mY, N).launch(grid=[(N + WARPS - 1) // WARPS, 1, 1],
                                          block=[32 * WARPS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, N: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        n = bidx * WARPS + tidx // 32
        chunks = self.K // 256  # 16-byte chunks per lane
        row_chunks = self.K // 8
        if n < N:
            w = [cute.make_rmem_tensor((4,), Uint32) for _ in range(chunks)]
            for i in cutlass.range_constexpr(chunks):
                cute.autovec_copy(mW[(None, n * row_chunks + i * 32 + lane)], w[i])
            acc = [Float32(0.0) for _ in range(self.M)]
            for i in cutlass.range_constexpr(chunks):
                wf = []
                for e in cutlass.range_constexpr(4):
                    wf.append(bf16_lo(w[i][e]))
                    wf.append(bf16_hi(w[i][e]))
                for m in cutlass.range_constexpr(self.M):
                    xv = cute.make_rmem_tensor((4,), Uint32)
                    cute.autovec_copy(mX[(None, m * row_chunks + i * 32 + lane)], xv)
                    for e in cutlass.range_constexpr(4):
                        acc[m] = acc[m] + wf[2 * e] * bf16_lo(xv[e])
                        acc[m] = acc[m] + wf[2 * e + 1] * bf16_hi(xv[e])
            for m in cutlass.range_constexpr(self.M):
                total = cute.arch.warp_reduction(acc[m], lambda a, b: a + b)
                if lane == m:
                    mY[m, n] = total.to(BFloat16)


PTRS = ((Uint32, 16), (Uint32, 16), (BFloat16, 2))  # x, W (as words), y


def compile_args(M: int = 4, K: int = 1024):
    from cutlass.cute.runtime import make_fake_stream

    return (*pointer_args(PTRS), Int32(4096), make_fake_stream())


def gemv_small_m(x, w, out=None):
    """x [M, K] bf16 (M <= 8) times w [N, K]^T -> bf16 [M, N]."""
    import torch

    require_hopper()
    check_cuda_tensor("x", x, dtypes=(torch.bfloat16,))
    check_cuda_tensor("w", w, dtypes=(torch.bfloat16,))
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"shapes x {tuple(x.shape)}, w {tuple(w.shape)}: need [M, K], [N, K]")
    M, K = x.shape
    N = w.shape[0]
    if not 1 <= M <= MAX_M or K % 256:
        raise ValueError(f"M = {M} (1..{MAX_M}) and K = {K} (multiple of 256) required")
    if out is None:
        out = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    else:
        check_cuda_tensor("out", out, dtypes=(torch.bfloat16,), align=2)
        if tuple(out.shape) != (M, N):
            raise ValueError(f"out has shape {tuple(out.shape)}; need [{M}, {N}]")
    ptrs = pointer_args(PTRS, (x, w, out))
    compiled = cached_compile(("gemv_small_m", M, K), lambda: cute.compile(
        GemvSmallM(M, K), *ptrs, Int32(N), current_stream()))
    compiled(*ptrs, Int32(N), current_stream())
    return out


def register_torch_op():
    """``torch.ops.wb.gemv_small_m``: opaque to torch.compile, capturable in CUDA graphs."""
    import torch

    if hasattr(torch.ops, "wb") and hasattr(torch.ops.wb, "gemv_small_m"):
        return torch.ops.wb.gemv_small_m

    @torch.library.custom_op("wb::gemv_small_m", mutates_args=(),
                             schema="(Tensor x, Tensor w) -> Tensor")
    def _op(x, w):
        return gemv_small_m(x.contiguous(), w)

    @_op.register_fake
    def _fake(x, w):
        return x.new_empty(x.shape[0], w.shape[0])

    return torch.ops.wb.gemv_small_m
