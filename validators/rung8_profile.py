"""Rung 8: a per-kernel profile of one complete block and the peak memory of that block,
backend under test against the reference backend (CUDA only: torch.profiler's CUDA kernel
times and torch.cuda.max_memory_allocated; on a CPU machine it does not run, and says so).

Gates: the profile captured the block's CUDA kernels, and the backend's peak memory is no more
than the reference's. The kernel table and both peaks go into the rung's checks and headline.
"""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from models.h3 import H3Model, initial_latent
from models.nvfp4_linear import BackendUnavailable
from validators.base import RungResult, check
from validators.rung3_projections import model_under_test, not_run

NAME = "profile + peak memory"
TOP = 8


def profile_block(model: H3Model, b: int, x) -> tuple[list, int]:
    """([(kernel, calls, cuda us)] top TOP by CUDA time, peak bytes) of model.block(b, x)."""
    model.block(b, x)  # warm: compile and cache outside the measurement
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model.block(b, x)
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    rows = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)
    kernels = [(e.key, e.count, round(e.device_time_total, 1)) for e in rows
               if e.device_time_total > 0][:TOP]
    return kernels, peak


def run(reference: H3Model, backend: str = "reference", wrap=None, log=print) -> RungResult:
    if reference.device.type != "cuda":
        return RungResult(8, NAME, "not-run", "needs CUDA: the kernel profile and "
                          "torch.cuda.max_memory_allocated (the reference runs on CPU here)")
    try:
        model = model_under_test(reference, backend, wrap)
    except BackendUnavailable as e:
        return not_run(8, NAME, e)
    x = reference.embed(initial_latent(reference.cfg, reference.seed).to(reference.device), 0)
    k_got, peak_got = profile_block(model, 0, x)
    _, peak_ref = profile_block(reference, 0, x)
    table = "; ".join(f"{name[:48]} x{n} {us:.0f}us" for name, n, us in k_got)
    log(f"    rung 8 block 0 {backend}: peak {peak_got / 2**20:.1f} MiB, kernels: {table}")
    checks = {
        "profile": check(bool(k_got), f"{len(k_got)} CUDA kernels: {table}"),
        "peak memory": check(peak_got <= peak_ref, f"block 0 peak {peak_got / 2**20:.1f} MiB "
                             f"({backend}) vs {peak_ref / 2**20:.1f} MiB (reference)"),
    }
    return RungResult.from_checks(8, NAME, checks, x.numel(), headline={
        "peak_bytes": peak_got, "reference_peak_bytes": peak_ref, "kernels": k_got})
