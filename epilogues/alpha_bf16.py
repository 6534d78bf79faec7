"""Epilogue: D = RN_bf16(fl32(alpha · acc)), alpha = fl32(gA · gB); rows past M and columns past N
are not written.

Contract: called by every consumer thread after the tile's last wgmma retired, with its fp32
accumulator fragment (wgmma C layout: registers 2i, 2i+1 are columns n, n+1 of one row). It
multiplies by ``alpha`` in fp32 (round to nearest, no flush to zero), rounds each pair with one
``cvt.rn.bf16x2.f32`` — the single bf16 rounding the oracle assumes — and stores the pair as one
32-bit word through a uint32 view of D (N is a multiple of 8, so pairs never straddle N).
"""
from __future__ import annotations

from kernels.nvfp4_device import bf16x2_rn
from kernels.runtime import cute_modules

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
