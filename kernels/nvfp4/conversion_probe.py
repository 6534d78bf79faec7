"""Probe kernel: the issue rate of one conversion-path instruction on one SM.

P0's register-A mainloop turns packed e2m1 weights into f16 wgmma operands with a few
instruction kinds: ``cvt.rn.f16x2.e4m3x2`` (F2FP unpack), ``prmt.b32`` (PRMT), ``lop3.b32``
(LOP3) and ``mul.rn.f16x2`` (HMUL2). Which pipe each lands on, and at what rate, decides how many
weights a consumer warpgroup can convert under one wgmma. The probe runs ``CHAINS`` independent
dependency chains of one instruction per thread (enough to hide its latency), ``iters`` times,
between two ``clock64`` reads; experiments/conversion_rate.py turns the cycles into instructions
per clock per SM.

Roles: every thread of every CTA runs the same chains; one CTA per SM (``threads`` = 1024, 32
warps), so the SM's four schedulers always have a ready warp. No shared memory, no barriers but
the two that bracket the timed loop.
"""
from __future__ import annotations

from device.ptx import asm
from device.runtime import cute_modules

cutlass, cute = cute_modules()
from cutlass import Int64, Uint32  # noqa: E402
from cutlass.cutlass_dsl import T, dsl_user_op  # noqa: E402

CHAINS = 8

# op name -> (PTX, register operands, f16 elements or 32-bit words one instruction produces).
# Every op maps a 32-bit register to one, so a chain feeds itself; its other operands ($2, $3)
# are registers the loop never changes.
OPS = {
    "cvt_e4m3x2_f16x2": ("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $1; "
                         "cvt.rn.f16x2.e4m3x2 $0, lo; }", 1, 2),
    "prmt": ("prmt.b32 $0, $1, $2, 0x0321;", 2, 1),
    "lop3": ("lop3.b32 $0, $1, $2, $3, 0x96;", 3, 1),
    "hmul2": ("mul.rn.f16x2 $0, $1, $2;", 2, 2),
}


@dsl_user_op
def _step(op: str, x: Uint32, b: Uint32, c: Uint32, *, loc=None, ip=None) -> Uint32:
    text, operands, _ = OPS[op]
    args = [Uint32(x), Uint32(b), Uint32(c)][:operands]
    return Uint32(asm(T.i32(), args, text, "=r," + ",".join("r" * operands), loc, ip))


class ConversionRateProbe:
    """``CHAINS`` chains of ``op`` per thread, ``iters`` rounds, timed by clock64 per CTA."""

    def __init__(self, op: str, threads: int = 1024):
        if op not in OPS:
            raise ValueError(f"op must be one of {sorted(OPS)}, got {op!r}")
        self.op, self.threads = op, threads

    @cute.jit
    def __call__(self, out_ptr: cute.Pointer, cycles_ptr: cute.Pointer, iters: cutlass.Int32,
                 ctas: cutlass.Int32, stream):
        mOut = cute.make_tensor(out_ptr, cute.make_layout(ctas * self.threads))
        mCycles = cute.make_tensor(cycles_ptr, cute.make_layout(ctas))
        self.kernel(mOut, mCycles, iters).launch(grid=[ctas, 1, 1], block=[self.threads, 1, 1],
                                                 stream=stream)

    @cute.kernel
    def kernel(self, mOut: cute.Tensor, mCycles: cute.Tensor, iters: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        seed = Uint32(tidx) * Uint32(0x9E3779B1)
        b = seed ^ Uint32(0x3C003C00)
        c = seed + Uint32(0x0F0F0F0F)
        a0, a1, a2, a3 = seed + Uint32(1), seed + Uint32(2), seed + Uint32(3), seed + Uint32(4)
        a4, a5, a6, a7 = seed + Uint32(5), seed + Uint32(6), seed + Uint32(7), seed + Uint32(8)
        cute.arch.barrier()
        t0 = cute.arch.clock64()
        for _ in cutlass.range(iters, unroll=4):
            a0 = _step(self.op, a0, b, c)
            a1 = _step(self.op, a1, b, c)
            a2 = _step(self.op, a2, b, c)
            a3 = _step(self.op, a3, b, c)
            a4 = _step(self.op, a4, b, c)
            a5 = _step(self.op, a5, b, c)
            a6 = _step(self.op, a6, b, c)
            a7 = _step(self.op, a7, b, c)
        cute.arch.barrier()
        t1 = cute.arch.clock64()
        mOut[bidx * self.threads + tidx] = (a0 ^ a1 ^ a2 ^ a3) + (a4 ^ a5 ^ a6 ^ a7)
        if tidx == 0:
            mCycles[bidx] = Int64(t1 - t0)


PTRS = ((Uint32, 4), (Int64, 8))  # out, cycles
