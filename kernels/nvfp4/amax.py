"""Tensor-level absolute maximum of a bf16/fp16 tensor: ``torch.amax(x.abs())``, exactly.

It feeds the NVFP4 tensor scale g = amax / 2688 (numerics.nvfp4.global_scale).

How: a 16-bit float's magnitude orders like its bit pattern with the sign cleared, and every NaN
pattern sorts above +inf. So the maximum of ``bits & 0x7FFF`` is the bit pattern of the exact
result, and a NaN anywhere makes the result a NaN, as torch's amax does. Integer max is
associative, so the atomic combine across CTAs gives the same answer in any order.

Warp roles: every warp is a loader/reducer. Each thread streams 16-byte vectors in a grid-stride
loop with ``unroll`` vectors in flight, reduces them with integer max, the warp reduces with
shuffles and lane 0 issues one ``atom.global.max.u32`` per warp into a zeroed 32-bit result.
Elements past the last whole vector are read one at a time by CTA 0.
"""
from __future__ import annotations

from kernels.device.runtime import (cached_compile, check_cuda_tensor, cute_modules, current_stream,
                                    pointer_args, require_hopper, sm_count)

cutlass, cute = cute_modules()
from cutlass import Int32, Uint16, Uint32  # noqa: E402

VEC = 8  # 16-bit elements per 16-byte vector


class TensorAbsMax:
    """Static config: threads per CTA, vectors in flight per thread, CTAs per SM."""

    def __init__(self, threads: int = 256, unroll: int = 4, ctas_per_sm: int = 4):
        self.threads = threads
        self.unroll = unroll
        self.ctas_per_sm = ctas_per_sm

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, out_ptr: cute.Pointer, n: Int32, grid_x: Int32,
                 stream):
        mX = cute.make_tensor(x_ptr, cute.make_layout(n))  # raw 16-bit patterns
        mOut = cute.make_tensor(out_ptr, cute.make_layout(1))  # uint32, zero on entry
        self.kernel(mX, mOut, n).launch(grid=[grid_x, 1, 1], block=[self.threads, 1, 1],
                                        stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mOut: cute.Tensor, n: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        gX = cute.zipped_divide(mX, (VEC,))  # ((VEC), n / VEC)
        nvec = n // VEC
        stride = gdim * self.threads
        i = bidx * self.threads + tidx
        best = Uint32(0)
        # Main loop: `unroll` independent 16-byte loads before the first use.
        while i + (self.unroll - 1) * stride < nvec:
            frgs = [cute.make_rmem_tensor((VEC,), Uint16) for _ in range(self.unroll)]
            for u in cutlass.range_constexpr(self.unroll):
                cute.autovec_copy(gX[(None, i + u * stride)], frgs[u])
            for u in cutlass.range_constexpr(self.unroll):
                for j in cutlass.range_constexpr(VEC):
                    best = cutlass.max(best, Uint32(frgs[u][j]) & Uint32(0x7FFF))
            i += self.unroll * stride
        while i < nvec:
            frg = cute.make_rmem_tensor((VEC,), Uint16)
            cute.autovec_copy(gX[(None, i)], frg)
            for j in cutlass.range_constexpr(VEC):
                best = cutlass.max(best, Uint32(frg[j]) & Uint32(0x7FFF))
            i += stride
        # Tail: the n % VEC elements after the last whole vector.
        tail = nvec * VEC + tidx
        if bidx == 0 and tail < n:
            best = cutlass.max(best, Uint32(mX[tail]) & Uint32(0x7FFF))
        best = cute.arch.warp_reduction_max(best)
        if tidx % 32 == 0:
            cute.arch.atomic_max(mOut.iterator, best)


PTRS = ((Uint16, 16), (Uint32, 4))  # x (raw 16-bit patterns), the 32-bit result


def compile_args():
    """Arguments for cute.compile offline."""
    from cutlass.cute.runtime import make_fake_stream

    return (*pointer_args(PTRS), Int32(0), Int32(1), make_fake_stream())


class AmaxRunner:
    """Launch helper bound to one input tensor (its pointers and grid are computed once)."""

    def __init__(self, x, config: TensorAbsMax | None = None):
        import torch

        validate_input(x)
        self.config = config or TensorAbsMax()
        self.x = x
        self.n = x.numel()
        self.out = torch.zeros(1, dtype=torch.int32, device=x.device)
        self.ptrs = pointer_args(PTRS, (x, self.out))
        self.compiled = cached_compile(("amax", self._key()), lambda: cute.compile(
            self.config, *self.ptrs, Int32(0), Int32(1), current_stream()))
        nvec = max(1, self.n // VEC)
        per_cta = self.config.threads * self.config.unroll
        self.grid = max(1, min(-(-nvec // per_cta), sm_count() * self.config.ctas_per_sm))

    def _key(self):
        c = self.config
        return (c.threads, c.unroll, c.ctas_per_sm)

    def __call__(self):
        import torch

        self.out.zero_()
        self.compiled(*self.ptrs, Int32(self.n), Int32(self.grid), current_stream())
        return self.out.to(torch.int16).view(self.x.dtype).reshape(())


def validate_input(x):
    import torch

    require_hopper()
    check_cuda_tensor("x", x, dtypes=(torch.bfloat16, torch.float16))
    if x.numel() == 0:
        raise ValueError("x is empty; the absolute maximum of no elements is undefined")
    if x.numel() >= 2**31:
        raise ValueError(f"x has {x.numel()} elements; this kernel indexes with int32 (< 2^31)")


def amax(x):
    """``torch.amax(x.abs())`` for a contiguous, 16-byte-aligned bf16/fp16 CUDA tensor."""
    return AmaxRunner(x)()
