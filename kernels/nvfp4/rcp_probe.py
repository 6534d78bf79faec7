"""Probe kernel: ``rcp.approx.ftz.f32`` applied elementwise, to measure the hardware's table.

``rcp_approx_device(x)`` returns what the GPU's MUFU.RCP gives for every fp32 element of ``x``;
experiments/rcp_table.py runs it over all 2^23 mantissas at several exponents and compares the
result with numerics.rcp's shipped table.
"""
from __future__ import annotations

import torch

from device.ptx import rcp_approx_ftz
from device.runtime import (cached_compile, check_cuda_tensor, cute_modules, current_stream,
                                    pointer_args, require_hopper)

cutlass, cute = cute_modules()
from cutlass import Float32, Int32  # noqa: E402
from cutlass.cute.runtime import make_fake_stream  # noqa: E402

VEC = 4


class RcpProbe:
    def __init__(self, threads: int = 256):
        self.threads = threads

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, y_ptr: cute.Pointer, n: Int32, grid_x: Int32,
                 stream):
        mX = cute.make_tensor(x_ptr, cute.make_layout(n))
        mY = cute.make_tensor(y_ptr, cute.make_layout(n))
        self.kernel(mX, mY, n).launch(grid=[grid_x, 1, 1], block=[self.threads, 1, 1],
                                      stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mY: cute.Tensor, n: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * self.threads + tidx
        if i < n:
            mY[i] = rcp_approx_ftz(Float32(mX[i]))


PTRS = ((Float32, 4), (Float32, 4))  # x, y


def compile_args():
    return (*pointer_args(PTRS), Int32(0), Int32(1), make_fake_stream())


def rcp_approx_device(x):
    """MUFU.RCP of every element of a contiguous fp32 CUDA tensor (returns a new tensor)."""
    require_hopper()
    check_cuda_tensor("x", x, dtypes=(torch.float32,), align=4)
    y = torch.empty_like(x)
    cfg = RcpProbe()
    args = pointer_args(PTRS, (x, y))
    compiled = cached_compile(("rcp_probe",), lambda: cute.compile(
        cfg, *args, Int32(0), Int32(1), current_stream()))
    n = x.numel()
    compiled(*args, Int32(n), Int32(-(-n // cfg.threads)), current_stream())
    return y
