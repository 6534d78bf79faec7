"""Formats and references, pure torch (CPU and CUDA): the single definition of every rounding rule.

``numerics.nvfp4`` — the Comfy-exact NVFP4 quantizer and friends; ``numerics.rcp_approx`` — the
H200's rcp.approx.ftz.f32; ``numerics.gemm_oracle`` — exact block-scaled GEMM and its error bound.
"""
from numerics.rcp import rcp_approx  # noqa: F401
