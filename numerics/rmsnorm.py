"""RMSNorm's rounding rule in torch: the one definition the CodePredictor reference and the depth
frame's emulation share (the device side is device.rounding.rmsnorm_pair)."""
from __future__ import annotations

import torch


def rms_apply(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """RMSNorm's roundings given the factor r (fp32, broadcast over the last dim):
    ``w * bf16(fp32(x) * r)`` in x's dtype (the depth frame's emulation brings its own r)."""
    return w * (x.to(torch.float32) * r).to(x.dtype)
