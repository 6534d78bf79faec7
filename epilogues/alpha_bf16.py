"""Epilogue: D = RN_bf16(fl32(alpha · acc)), alpha = fl32(gA · gB); rows past M and columns past N
are not written.

Contract: called by every consumer thread after the tile's last wgmma retired, with its fp32
accumulator fragment (wgmma C layout: registers 2i, 2i+1 are columns n, n+1 of one row). It
multiplies by ``alpha`` in fp32 (round to nearest, no flush to zero), rounds each pair with one
``cvt.rn.bf16x2.f32`` — the single bf16 rounding the oracle assumes — and stores the pair as one
32-bit word through a uint32 view of D (N is a multiple of 8, so pairs never straddle N).
"""
from __future__ import annotations

from kernels.device.rounding import bf16x2_rn
from kernels.device.runtime import cute_modules
from kernels.device.waits import count_split_arrival

cutlass, cute = cute_modules()
from cutlass import Float32, Int32  # noqa: E402


class AlphaBf16Epilogue:
    @cute.jit
    def store(self, acc: cute.Tensor, alpha: Float32, thr_mma, tile_mn: cutlass.Constexpr,
              mD_pairs: cute.Tensor, m0: Int32, n0: Int32):
        """Write the tile at (m0, n0) of D, viewed as uint32 column pairs [M, N/2]."""
        M, N2 = mD_pairs.shape
        coords = thr_mma.partition_C(cute.make_identity_tensor(tile_mn))
        for i in cutlass.range_constexpr(0, cute.size(acc), 2):
            m, n = coords[i]
            row = m0 + m
            pair = (n0 + n) // 2
            if row < M and pair < N2:
                mD_pairs[row, pair] = bf16x2_rn(acc[i] * alpha, acc[i + 1] * alpha)


class SplitKAlphaBf16Epilogue:
    """Split-K version: each of ``splits`` CTAs of an output tile stores its fp32 partial sums
    to the workspace [splits, M, N]; the last to arrive (an acq_rel counter per tile) adds the
    partials in split order 0, 1, ..., so the result does not depend on arrival order (two runs
    are bit-identical), then applies alpha and the one bf16 rounding like
    :class:`AlphaBf16Epilogue`, and re-arms the counter to 0 for the next launch. Still an fp32
    accumulation of exact products in some fixed order: the oracle's bound holds unchanged.

    Synchronisation (all 256 consumer threads): stores -> ``fence.acq_rel.gpu`` -> named barrier
    2 -> one thread ``atom.add.acq_rel.gpu`` on the tile's counter and publishes "last" in smem
    -> barrier 2 -> the last CTA fences and reads the partials with ``ld.relaxed.gpu`` (coherent,
    not served from a stale L1). No CTA waits on another, so this cannot deadlock.
    """

    def __init__(self, splits: int):
        self.splits = splits

    @cute.jit
    def store(self, acc: cute.Tensor, alpha: Float32, thr_mma, tile_mn: cutlass.Constexpr,
              mD_pairs: cute.Tensor, m0: Int32, n0: Int32, mWork: cute.Tensor,
              mCount: cute.Tensor, tile_id: Int32, split: Int32, ct: Int32, flag: cute.Pointer):
        M, N2 = mD_pairs.shape
        coords = thr_mma.partition_C(cute.make_identity_tensor(tile_mn))
        for i in cutlass.range_constexpr(0, cute.size(acc), 2):
            m, n = coords[i]
            row = m0 + m
            col = n0 + n
            if row < M and col < N2 * 2:
                mWork[split, row, col] = acc[i]
                mWork[split, row, col + 1] = acc[i + 1]
        cute.arch.fence_acq_rel_gpu()
        cute.arch.barrier(barrier_id=2, number_of_threads=256)
        flag_t = cute.make_tensor(flag, cute.make_layout(1))
        if ct == 0:
            count_split_arrival(mCount, tile_id, self.splits, flag_t)
        cute.arch.barrier(barrier_id=2, number_of_threads=256)
        if flag_t[0] == Int32(1):
            cute.arch.fence_acq_rel_gpu()
            for i in cutlass.range_constexpr(0, cute.size(acc), 2):
                m, n = coords[i]
                row = m0 + m
                col = n0 + n
                if row < M and col < N2 * 2:
                    p = mWork.iterator + row * (N2 * 2) + col
                    lo = cute.arch.load(p.llvm_ptr, Float32, sem="relaxed", scope="gpu")
                    hi = cute.arch.load((p + 1).llvm_ptr, Float32, sem="relaxed", scope="gpu")
                    for sp in cutlass.range_constexpr(1, self.splits):
                        p = mWork.iterator + (sp * M + row) * (N2 * 2) + col
                        lo = lo + cute.arch.load(p.llvm_ptr, Float32, sem="relaxed", scope="gpu")
                        hi = hi + cute.arch.load((p + 1).llvm_ptr, Float32, sem="relaxed",
                                                 scope="gpu")
                    mD_pairs[row, col // 2] = bf16x2_rn(lo * alpha, hi * alpha)
