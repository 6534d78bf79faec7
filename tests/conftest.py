"""Shared pytest setup: compile target, gpu skipping, hypothesis profiles."""
import os

import pytest

# CuTe DSL snapshots its settings at import: name the target before anything imports cutlass.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", max_examples=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


HAVE_CUDA = _cuda()


def pytest_collection_modifyitems(config, items):
    if HAVE_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
