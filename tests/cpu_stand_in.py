"""The CPU standing in for the GPU in host-side tests (tests/test_host_fast_path.py,
tests/test_entry_fuzz.py): the kernel entries' validators and caches run on CPU tensors that
their device checks see as cuda:0, with the Hopper check off."""
from __future__ import annotations

import contextlib

import pytest
import torch


class AsCuda(torch.Tensor):
    """A CPU tensor as check_cuda_tensor's device test sees it: on cuda:0."""

    @property
    def device(self):
        real = torch.Tensor.device.__get__(self)
        return torch.device("cuda", 0) if real.type == "cpu" else real


@contextlib.contextmanager
def cpu_as_gpu(*modules):
    """Within it, each of ``modules`` checks CPU tensors as CUDA ones and skips require_hopper."""
    from device import runtime

    def check(name, t, **kw):
        return runtime.check_cuda_tensor(
            name, t.as_subclass(AsCuda) if isinstance(t, torch.Tensor) else t, **kw)

    with pytest.MonkeyPatch.context() as mp:
        for m in modules:
            mp.setattr(m, "require_hopper", lambda: None)
            mp.setattr(m, "check_cuda_tensor", check)
        yield


def misaligned(t):
    """The same shape and dtype, its data 1 element past a 16-byte boundary (ragged storage)."""
    flat = torch.zeros(t.numel() + 16, dtype=t.dtype)
    return flat[1:1 + t.numel()].view(t.shape)
