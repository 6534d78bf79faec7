"""What every depth projection shares at its edges: the shapes it takes (``projection_dims``),
the output / residual checks (``check_projection_out``) and the epilogue store with its
residual add and SwiGLU (``epilogue_store``), used by the GEMVs and the skinny GEMMs alike."""
from __future__ import annotations

import torch

from device.rounding import round_bf16, swiglu_value
from device.runtime import check_cuda_tensor, cute_modules

cutlass, cute = cute_modules()
from cutlass import BFloat16, Float32, Int32, Uint32  # noqa: E402,F401


def epilogue_store(mY: cute.Tensor, resid, m, n, t, *, swiglu: bool, residual: bool,
                   out_f32: bool):
    """Write y[m, n] from its fp32 sum(s) ``t`` (gate and up with SwiGLU), rounding where the
    eager reference rounds; shared by the GEMV and kernels/depth/gemm_skinny.py. Returns the value
    stored."""
    y = round_bf16(t[0])
    if cutlass.const_expr(swiglu):
        v = swiglu_value(t[0], t[1]).to(BFloat16)
    elif cutlass.const_expr(residual):
        v = (resid + y).to(BFloat16)
    elif cutlass.const_expr(out_f32):
        v = y
    else:
        v = t[0].to(BFloat16)
    mY[m, n] = v
    return v


def projection_dims(x, w, swiglu: bool):
    """Checks of a projection's operands shared by the GEMV and kernels/depth/gemm_skinny.py:
    x [M, K] and w [N, K] (SwiGLU: [2N, K]) bf16 CUDA tensors; returns (M, K, N)."""
    check_cuda_tensor("x", x, dtypes=(torch.bfloat16,))
    check_cuda_tensor("w", w, dtypes=(torch.bfloat16,))
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"shapes x {tuple(x.shape)}, w {tuple(w.shape)}: need [M, K], [N, K]")
    if swiglu and w.shape[0] % 2:
        raise ValueError(f"swiglu needs w with 2N rows (gate then up), got {w.shape[0]}")
    M, K = x.shape
    return M, K, (w.shape[0] // 2 if swiglu else w.shape[0])


def check_projection_out(out, resid, M: int, N: int, swiglu: bool) -> bool:
    """out [M, N] bf16 or fp32 with unit column stride (rows may be strided); resid bf16 laid
    out as out. Returns whether out is fp32."""
    check_cuda_tensor("out", out, dtypes=(torch.bfloat16, torch.float32), contiguous=False,
                      align=4)
    out_f32 = out.dtype == torch.float32
    if tuple(out.shape) != (M, N) or out.stride(1) != 1:
        raise ValueError(f"out has shape {tuple(out.shape)}, strides {out.stride()}; need "
                         f"[{M}, {N}] with unit column stride")
    if resid is not None:
        check_cuda_tensor("resid", resid, dtypes=(torch.bfloat16,), contiguous=False, align=2)
        if out_f32 or swiglu or resid.shape != out.shape or resid.stride() != out.stride():
            raise ValueError("resid must be a bf16 tensor laid out as out, without swiglu")
    if swiglu and out_f32:
        raise ValueError("swiglu writes bf16")
    return out_f32
