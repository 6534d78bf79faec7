"""The device rounding rules (device/rounding.py) against their definitions, exhaustively
where the input space allows it (on the H200)."""
from __future__ import annotations

import pytest
import torch

from device.rounding import div_newton, round_bf16
from device.runtime import cute_modules

cutlass, cute = cute_modules()
from cutlass import Float32  # noqa: E402,I001


@cute.kernel
def _silu_both(mY: cute.Tensor, mIeee: cute.Tensor, mNewton: cute.Tensor):
    """bf16(y / (1 + exp(-y))) with the IEEE division and with div_newton (the same exp)."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    i = bidx * 256 + tidx
    y = mY[i]
    b = Float32(1.0) + cute.math.exp(-y)
    mIeee[i] = round_bf16(y / b)
    mNewton[i] = round_bf16(div_newton(y, b))


@cute.jit
def _launch(mY: cute.Tensor, mIeee: cute.Tensor, mNewton: cute.Tensor):
    _silu_both(mY, mIeee, mNewton).launch(grid=[mY.shape[0] // 256, 1, 1], block=[256, 1, 1])


@pytest.mark.compile
def test_silu_check_kernel_compiles_both_divisions():
    """The check below compares what it means to: an IEEE division (div.rn, with its slow-path
    call) beside div_newton's rcp.approx and two FMAs."""
    from cutlass.cute.runtime import from_dlpack

    from workbench.compile import compile_report

    args = [from_dlpack(torch.zeros(256)) for _ in range(3)]
    ptx = compile_report(_launch, *args).ptx
    assert "div.rn.f32" in ptx and "rcp.approx.f32" in ptx and ptx.count("fma.rn.f32") >= 2


@pytest.mark.gpu
def test_div_newton_gives_the_ieee_silu_for_every_bf16_gate():
    """SwiGLU's silu (device.rounding.swiglu_value) divides y / (1 + exp(-y)) for a bf16
    y and rounds to bf16: over all 65536 bf16 bit patterns (NaN, inf and subnormals included),
    div_newton's result is the IEEE division's, bit for bit, so the call-free division changes
    no SwiGLU output."""
    from cutlass.cute.runtime import from_dlpack

    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    y = bits.view(torch.bfloat16).float().cuda()
    ieee, newton = torch.full_like(y, 7.0), torch.full_like(y, 7.0)
    args = [from_dlpack(t) for t in (y, ieee, newton)]
    cute.compile(_launch, *args)(*args)
    torch.cuda.synchronize()
    same = (ieee.view(torch.int32) == newton.view(torch.int32)) | (ieee.isnan() & newton.isnan())
    bad = (~same).nonzero().flatten()
    assert len(bad) == 0, [(float(y[i]), float(ieee[i]), float(newton[i])) for i in bad[:8]]
