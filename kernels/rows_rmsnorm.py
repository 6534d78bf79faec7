"""RMSNorm of M rows into a separate bf16 buffer, ``bf16(gamma * bf16(x * rsqrt(mean(x^2) + eps)))``
as the eager reference rounds: the prologue of the skinny tensor-core projections
(kernels/gemm_skinny.py), which each see only a K-slice of a row and so cannot normalise it
themselves. One CTA per row, 128 threads, each owning 16-byte chunks; PDL like its neighbours.

Chunk-major output (the wgmma projections' input, [K / 8][M][8]) is written by CTAs of
``rows_per_cta`` rows (default ``CHUNK_MAJOR_ROWS``): each row normalised exactly as alone
(the same threads' chunks, sums and roundings), then the rows go through shared memory so that
8 lanes store one chunk of 8 consecutive rows, 128 contiguous bytes; one row a CTA would store
16 bytes a lane, 1 KB apart (notes/fast-loop.md v11b).
"""
from __future__ import annotations

from kernels.nvfp4_device import add_squares, rms_factor, rmsnorm_pair
from kernels.runtime import (cached_compile, check_cuda_tensor, cute_modules, current_stream,
                             pointer_args, require_hopper)

cutlass, cute = cute_modules()
from cutlass import Float32, Uint32  # noqa: E402

THREADS = 128
CHUNK_MAJOR_ROWS = 8  # rows a CTA for chunk-major output: a chunk of 8 rows is 128 bytes


def default_rows_per_cta(M: int, chunk_major: bool) -> int:
    """``CHUNK_MAJOR_ROWS`` (or the largest power of two dividing M below it) for chunk-major
    output, else 1."""
    r = CHUNK_MAJOR_ROWS if chunk_major else 1
    while M % r:
        r //= 2
    return r


class RowsRmsNorm:
    def __init__(self, M: int, K: int, eps: float = 1e-6, pdl: bool = False,
                 chunk_major: bool = False, rows_per_cta: int = 1):
        if K % (8 * THREADS):
            raise ValueError(f"K = {K} must be a multiple of {8 * THREADS}")
        if rows_per_cta not in (1, 2, 4, 8) or M % rows_per_cta:
            raise ValueError(f"rows_per_cta = {rows_per_cta}: 1, 2, 4 or 8 dividing M = {M}")
        if rows_per_cta > 1 and not chunk_major:
            raise ValueError("rows_per_cta > 1: for chunk-major output only")
        self.M, self.K, self.eps, self.pdl = M, K, eps, pdl
        self.chunks = K // (8 * THREADS)
        self.chunk_major = chunk_major  # y as [K / 8][M][8] (runtime.activation_layout)
        self.rows = rows_per_cta

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, gamma_ptr: cute.Pointer, y_ptr: cute.Pointer,
                 stream):
        kc = self.K // 8
        mX = cute.make_tensor(x_ptr, cute.make_layout((4, self.M * kc), stride=(1, 4)))
        mG = cute.make_tensor(gamma_ptr, cute.make_layout((4, kc), stride=(1, 4)))
        mY = cute.make_tensor(y_ptr, cute.make_layout((4, self.M * kc), stride=(1, 4)))
        self.kernel(mX, mG, mY).launch(grid=[self.M // self.rows, 1, 1],
                                       block=[THREADS, 1, 1], stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mG: cute.Tensor, mY: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        kc, R = self.K // 8, self.rows
        m0 = cta * R
        smem = cutlass.memory.SmemAllocator()
        s_sum = smem.allocate_tensor(Float32, cute.make_layout((R, THREADS // 32)), 16)
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
        g = load_gamma(mG, tidx, self.K)
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()
        rows = []
        for r in cutlass.range_constexpr(R):
            xs = [cute.make_rmem_tensor((4,), Uint32) for _ in range(self.chunks)]
            for i in cutlass.range_constexpr(self.chunks):
                cute.autovec_copy(mX[(None, (m0 + r) * kc + tidx + THREADS * i)], xs[i])
            rows.append(xs)
        ys = normalize_rows(rows, g, tidx, s_sum, self.K, self.eps)
        if cutlass.const_expr(R == 1):
            for i in cutlass.range_constexpr(self.chunks):
                c = tidx + THREADS * i
                dst = c * self.M + m0 if cutlass.const_expr(self.chunk_major) else m0 * kc + c
                cute.autovec_copy(ys[0][i], mY[(None, dst)])
        else:  # through shared memory [chunk][row]: a lane stores (chunk u // R, row u % R)
            sY = smem.allocate_tensor(Uint32, cute.make_layout((4, kc * R), stride=(1, 4)), 16)
            for r in cutlass.range_constexpr(R):
                for i in cutlass.range_constexpr(self.chunks):
                    cute.autovec_copy(ys[r][i], sY[(None, (tidx + THREADS * i) * R + r)])
            cute.arch.sync_threads()
            for j in cutlass.range_constexpr(kc * R // THREADS):
                u = tidx + THREADS * j
                v = cute.make_rmem_tensor((4,), Uint32)
                cute.autovec_copy(sY[(None, u)], v)
                cute.autovec_copy(v, mY[(None, (u // R) * self.M + m0 + u % R)])


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
    s_rows = cute.make_tensor(s_sum.iterator, cute.make_layout((1, THREADS // 32)))
    return normalize_rows([xs], g, t, s_rows, K, eps)[0]


@cute.jit
def normalize_rows(rows: list, g: list, t, s_sum: cute.Tensor, K: cutlass.Constexpr[int],
                   eps: cutlass.Constexpr) -> list:
    """:func:`normalize_chunks` for several rows at once (``rows``: each row's xs), one CTA
    barrier for all; ``s_sum``: [rows, THREADS / 32] floats."""
    lane, warp = t % 32, t // 32
    for r in cutlass.range_constexpr(len(rows)):
        ss = Float32(0.0)
        for i in cutlass.range_constexpr(len(rows[r])):
            for e in cutlass.range_constexpr(4):
                ss = add_squares(ss, rows[r][i][e])
        ss = cute.arch.warp_reduction(ss, lambda a, b: a + b)
        if lane == 0 and t < THREADS:
            s_sum[r, warp] = ss
    cute.arch.sync_threads()
    out = []
    for r in cutlass.range_constexpr(len(rows)):
        tot = Float32(0.0)
        for w in cutlass.range_constexpr(THREADS // 32):
            tot = tot + s_sum[r, w]
        f = rms_factor(tot, K, eps)
        ys = [cute.make_rmem_tensor((4,), Uint32) for _ in range(len(rows[r]))]
        for i in cutlass.range_constexpr(len(rows[r])):
            for e in cutlass.range_constexpr(4):
                ys[i][e] = rmsnorm_pair(rows[r][i][e], g[i][e], f)
        out.append(ys)
    return out


PTRS = ((Uint32, 16),) * 3  # x, gamma, y


def compile_args():
    from cutlass.cute.runtime import make_fake_stream

    return (*pointer_args(PTRS), make_fake_stream())


def rows_rmsnorm(x, gamma, out, *, eps: float = 1e-6, pdl: bool = False,
                 chunk_major: bool = False, rows_per_cta: int | None = None):
    """x [M, K] bf16 -> out [M, K] bf16, RMS-normalised with weight gamma [K]. ``chunk_major``:
    out's storage laid out [K / 8][M][8] (kernels.runtime.activation_layout), written by CTAs
    of ``rows_per_cta`` rows (default :func:`default_rows_per_cta`; the same bits)."""
    import torch

    require_hopper()
    for name, t in (("x", x), ("gamma", gamma), ("out", out)):
        check_cuda_tensor(name, t, dtypes=(torch.bfloat16,))
    M, K = x.shape
    if tuple(gamma.shape) != (K,) or out.shape != x.shape:
        raise ValueError(f"x {tuple(x.shape)}, gamma {tuple(gamma.shape)}, out "
                         f"{tuple(out.shape)}: need [M, K], [K], [M, K]")
    rows = rows_per_cta or default_rows_per_cta(M, chunk_major)
    cfg = RowsRmsNorm(M, K, eps, pdl, chunk_major, rows)
    ptrs = pointer_args(PTRS, (x, gamma, out))
    compiled = cached_compile(("rows_rmsnorm", M, K, eps, pdl, chunk_major, rows),
                              lambda: cute.compile(cfg, *ptrs, current_stream()))
    compiled(*ptrs, current_stream())
    return out
