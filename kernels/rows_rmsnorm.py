"""RMSNorm of M rows into a separate bf16 buffer, ``bf16(gamma * bf16(x * rsqrt(mean(x^2) + eps)))``
as the eager reference rounds: the prologue of the skinny tensor-core projections
(kernels/gemm_skinny.py), which each see only a K-slice of a row and so cannot normalise it
themselves. One CTA per row, 128 threads, each owning 16-byte chunks; PDL like its neighbours.
"""
from __future__ import annotations

from kernels.nvfp4_device import add_squares, rms_factor, rmsnorm_pair
from kernels.runtime import (cached_compile, check_cuda_tensor, cute_modules, current_stream,
                             pointer_args, require_hopper)

cutlass, cute = cute_modules()
from cutlass import Float32, Uint32  # noqa: E402

THREADS = 128


class RowsRmsNorm:
    def __init__(self, M: int, K: int, eps: float = 1e-6, pdl: bool = False,
                 chunk_major: bool = False):
        if K % (8 * THREADS):
            raise ValueError(f"K = {K} must be a multiple of {8 * THREADS}")
        self.M, self.K, self.eps, self.pdl = M, K, eps, pdl
        self.chunks = K // (8 * THREADS)
        self.chunk_major = chunk_major  # y as [K / 8][M][8] (runtime.activation_layout)

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, gamma_ptr: cute.Pointer, y_ptr: cute.Pointer,
                 stream):
        kc = self.K // 8
        mX = cute.make_tensor(x_ptr, cute.make_layout((4, self.M * kc), stride=(1, 4)))
        mG = cute.make_tensor(gamma_ptr, cute.make_layout((4, kc), stride=(1, 4)))
        mY = cute.make_tensor(y_ptr, cute.make_layout((4, self.M * kc), stride=(1, 4)))
        self.kernel(mX, mG, mY).launch(grid=[self.M, 1, 1], block=[THREADS, 1, 1],
                                       stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mG: cute.Tensor, mY: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        m, _, _ = cute.arch.block_idx()
        lane, warp = tidx % 32, tidx // 32
        kc = self.K // 8
        s_sum = cutlass.memory.SmemAllocator().allocate_tensor(
            Float32, cute.make_layout(THREADS // 32), 16)
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
        g = [cute.make_rmem_tensor((4,), Uint32) for _ in range(self.chunks)]
        for i in cutlass.range_constexpr(self.chunks):
            cute.autovec_copy(mG[(None, tidx + THREADS * i)], g[i])
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()
        xs = [cute.make_rmem_tensor((4,), Uint32) for _ in range(self.chunks)]
        ss = Float32(0.0)
        for i in cutlass.range_constexpr(self.chunks):
            cute.autovec_copy(mX[(None, m * kc + tidx + THREADS * i)], xs[i])
            for e in cutlass.range_constexpr(4):
                ss = add_squares(ss, xs[i][e])
        ss = cute.arch.warp_reduction(ss, lambda a, b: a + b)
        if lane == 0:
            s_sum[warp] = ss
        cute.arch.sync_threads()
        tot = Float32(0.0)
        for w in cutlass.range_constexpr(THREADS // 32):
            tot = tot + s_sum[w]
        r = rms_factor(tot, self.K, self.eps)
        for i in cutlass.range_constexpr(self.chunks):
            out = cute.make_rmem_tensor((4,), Uint32)
            for e in cutlass.range_constexpr(4):
                out[e] = rmsnorm_pair(xs[i][e], g[i][e], r)
            c = tidx + THREADS * i
            dst = c * self.M + m if cutlass.const_expr(self.chunk_major) else m * kc + c
            cute.autovec_copy(out, mY[(None, dst)])


PTRS = ((Uint32, 16),) * 3  # x, gamma, y


def compile_args():
    from cutlass.cute.runtime import make_fake_stream

    return (*pointer_args(PTRS), make_fake_stream())


def rows_rmsnorm(x, gamma, out, *, eps: float = 1e-6, pdl: bool = False,
                 chunk_major: bool = False):
    """x [M, K] bf16 -> out [M, K] bf16, RMS-normalised with weight gamma [K]. ``chunk_major``:
    out's storage laid out [K / 8][M][8] (kernels.runtime.activation_layout)."""
    import torch

    require_hopper()
    for name, t in (("x", x), ("gamma", gamma), ("out", out)):
        check_cuda_tensor(name, t, dtypes=(torch.bfloat16,))
    M, K = x.shape
    if tuple(gamma.shape) != (K,) or out.shape != x.shape:
        raise ValueError(f"x {tuple(x.shape)}, gamma {tuple(gamma.shape)}, out "
                         f"{tuple(out.shape)}: need [M, K], [K], [M, K]")
    ptrs = pointer_args(PTRS, (x, gamma, out))
    compiled = cached_compile(("rows_rmsnorm", M, K, eps, pdl, chunk_major), lambda: cute.compile(
        RowsRmsNorm(M, K, eps, pdl, chunk_major), *ptrs, current_stream()))
    compiled(*ptrs, current_stream())
    return out
