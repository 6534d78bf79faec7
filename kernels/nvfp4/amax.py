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

import torch

from device import ffi
from device.ffi import plain_cuda, require_hopper
from device.runtime import check_cuda_tensor, cute_modules, sm_count

cutlass, cute = cute_modules()
from cutlass import Int32, Uint16, Uint32  # noqa: E402

VEC = 8  # 16-bit elements per 16-byte vector
X_DTYPES = (torch.bfloat16, torch.float16)


class TensorAbsMax:
    """Static config: threads per CTA, vectors in flight per thread, CTAs per SM."""

    def __init__(self, threads: int = 256, unroll: int = 4, ctas_per_sm: int = 4):
        self.threads = threads
        self.unroll = unroll
        self.ctas_per_sm = ctas_per_sm
        self.key = (threads, unroll, ctas_per_sm)

    def grid(self, n: int) -> int:
        per_cta = self.threads * self.unroll
        return max(1, min(-(-max(1, n // VEC) // per_cta), sm_count() * self.ctas_per_sm))

    @cute.jit
    def __call__(self, x, out, n: Int32, grid_x: Int32, stream):  # x, out: see ffi.pointer
        mX = cute.make_tensor(ffi.pointer(x, Uint16), cute.make_layout(n))  # raw 16-bit patterns
        mOut = cute.make_tensor(ffi.pointer(out, Uint32), cute.make_layout(1))  # zero on entry
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
ENTRY = ffi.Entry("amax", PTRS, scalars=2)  # (x, out), (n, grid_x)


def compile_args(dtype=None):
    """Arguments for cute.compile offline: the pointer path's, or with ``dtype`` (cutlass
    BFloat16 / Float16) the TVM-FFI path's (x 1-D; compile with options="--enable-tvm-ffi")."""
    return ENTRY.compile_args(None if dtype is None else [(dtype, 1), (dtype, 1)],
                              ffi=dtype is not None)


def _result(x):
    """The zeroed result buffer: two x-dtype elements, one uint32 to the kernel; the maximum bit
    pattern is < 2^16, so element 0 (the low half) is the answer and element 1 stays zero."""
    return torch.zeros(2, dtype=x.dtype, device=x.device)


class AmaxRunner:
    """Launch helper bound to one input tensor (its arguments and grid are computed once); each
    call returns a view of the runner's one result buffer, overwritten by the next call."""

    def __init__(self, x, config: TensorAbsMax | None = None):
        validate_input(x)
        self.config = config or TensorAbsMax()
        self.out = _result(x)
        n = x.numel()
        self.launch = ENTRY.bind(self.config, self.config.key, (x, self.out),
                                 (n, self.config.grid(n)))

    def __call__(self):
        self.out.zero_()
        self.launch()
        return self.out[0]


def validate_input(x):
    require_hopper()
    plain_cuda(x, X_DTYPES, 16) or check_cuda_tensor("x", x, dtypes=X_DTYPES)
    if x.numel() == 0:
        raise ValueError("x is empty; the absolute maximum of no elements is undefined")
    if x.numel() >= 2**31:
        raise ValueError(f"x has {x.numel()} elements; this kernel indexes with int32 (< 2^31)")


_DEFAULT = TensorAbsMax()


def amax(x, config: TensorAbsMax | None = None):
    """``torch.amax(x.abs())`` (0-d, x's dtype) for a contiguous, 16-byte-aligned bf16/fp16 CUDA
    tensor."""
    validate_input(x)
    config = config or _DEFAULT
    out = _result(x)
    n = x.numel()
    ENTRY(config, config.key, (x, out), (n, config.grid(n)))
    return out[0]
