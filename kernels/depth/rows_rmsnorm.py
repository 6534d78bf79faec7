"""RMSNorm of M rows into a separate bf16 buffer, ``bf16(gamma * bf16(x * rsqrt(mean(x^2) + eps)))``
as the eager reference rounds: the prologue of the skinny tensor-core projections
(kernels/depth/gemm_skinny.py), which each see only a K-slice of a row and so cannot normalise it
themselves. One CTA per row, 128 threads, each owning 16-byte chunks; PDL like its neighbours.
"""
from __future__ import annotations

import torch

from device.ptx import pdl_launch_dependents, pdl_wait, timing_perturbation
from device.rounding import add_squares, rms_factor, rmsnorm_pair
from device.runtime import (cached_compile, check_cuda_tensor, cute_modules,
                                    current_stream, pointer_args, require_hopper)

cutlass, cute = cute_modules()
from cutlass import Float32, Uint32  # noqa: E402
from cutlass.cute.runtime import make_fake_stream  # noqa: E402

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
        kc = self.K // 8
        s_sum = cutlass.memory.SmemAllocator().allocate_tensor(
            Float32, cute.make_layout(THREADS // 32), 16)
        if cutlass.const_expr(self.pdl):
            pdl_launch_dependents()
        g = load_gamma(mG, tidx, self.K)
        if cutlass.const_expr(self.pdl):
            pdl_wait()
        xs = [cute.make_rmem_tensor((4,), Uint32) for _ in range(self.chunks)]
        for i in cutlass.range_constexpr(self.chunks):
            cute.autovec_copy(mX[(None, m * kc + tidx + THREADS * i)], xs[i])
        ys = normalize_chunks(xs, g, tidx, s_sum, self.K, self.eps)
        for i in cutlass.range_constexpr(self.chunks):
            c = tidx + THREADS * i
            dst = c * self.M + m if cutlass.const_expr(self.chunk_major) else m * kc + c
            cute.autovec_copy(ys[i], mY[(None, dst)])


@cute.jit
def load_gamma(mG: cute.Tensor, t, K: cutlass.Constexpr[int]) -> list:
    """Thread t's 16-byte chunks t, t + THREADS, ... of gamma [K / 8 chunks], for
    :func:`normalize_chunks`."""
    g = [cute.make_rmem_tensor((4,), Uint32) for _ in range(K // (8 * THREADS))]
    for i in cutlass.range_constexpr(len(g)):
        cute.autovec_copy(mG[(None, t + THREADS * i)], g[i])
    return g


@cute.jit
def normalize_chunks(xs: list, g: list, t, s_sum: cute.Tensor, K: cutlass.Constexpr[int],
                     eps: cutlass.Constexpr) -> list:
    """A row's RMSNorm by THREADS threads, thread t holding its chunks t, t + THREADS, ... (xs,
    gamma's in g): thread sums, warp butterflies, the warps' sums in order (the one rounding
    every row norm of the loop shares). ``s_sum``: THREADS / 32 floats. Every thread of the CTA
    calls it (one CTA barrier); threads t >= THREADS only take part in the barrier."""
    lane, warp = t % 32, t // 32
    ss = Float32(0.0)
    for i in cutlass.range_constexpr(len(xs)):
        for e in cutlass.range_constexpr(4):
            ss = add_squares(ss, xs[i][e])
    ss = cute.arch.warp_reduction(ss, lambda a, b: a + b)
    if lane == 0 and t < THREADS:
        s_sum[warp] = ss
    cute.arch.sync_threads()
    tot = Float32(0.0)
    for w in cutlass.range_constexpr(THREADS // 32):
        tot = tot + s_sum[w]
    r = rms_factor(tot, K, eps)
    ys = [cute.make_rmem_tensor((4,), Uint32) for _ in range(len(xs))]
    for i in cutlass.range_constexpr(len(xs)):
        for e in cutlass.range_constexpr(4):
            ys[i][e] = rmsnorm_pair(xs[i][e], g[i][e], r)
    return ys


PTRS = ((Uint32, 16),) * 3  # x, gamma, y


def compile_args():
    return (*pointer_args(PTRS), make_fake_stream())


def rows_rmsnorm(x, gamma, out, *, eps: float = 1e-6, pdl: bool = False,
                 chunk_major: bool = False):
    """x [M, K] bf16 -> out [M, K] bf16, RMS-normalised with weight gamma [K]. ``chunk_major``:
    out's storage laid out [K / 8][M][8] (device.runtime.activation_layout)."""
    require_hopper()
    for name, t in (("x", x), ("gamma", gamma), ("out", out)):
        check_cuda_tensor(name, t, dtypes=(torch.bfloat16,))
    M, K = x.shape
    if tuple(gamma.shape) != (K,) or out.shape != x.shape:
        raise ValueError(f"x {tuple(x.shape)}, gamma {tuple(gamma.shape)}, out "
                         f"{tuple(out.shape)}: need [M, K], [K], [M, K]")
    ptrs = pointer_args(PTRS, (x, gamma, out))
    compiled = cached_compile(("rows_rmsnorm", M, K, eps, pdl, chunk_major,
                               timing_perturbation()), lambda: cute.compile(
        RowsRmsNorm(M, K, eps, pdl, chunk_major), *ptrs, current_stream()))
    compiled(*ptrs, current_stream())
    return out
