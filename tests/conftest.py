"""Shared pytest setup: compile target, gpu skipping, hypothesis profiles, the GPU suite's split.

The whole GPU suite runs in two parts (each within one 10-minute device call on the H200):
``--gpu-part depth`` (the depth loop: the fast loop, the CodePredictor, the depth kernels,
the frame protocol) and ``--gpu-part nvfp4`` (everything else: NVFP4 GEMM, quantize, amax,
numerics, ladder, workbench).
``-m fast`` is the fast GPU subset: each kernel's core exactness test once. Tests marked
``after_others`` run last in their session, and in both parts (they check that bits do not
depend on what ran before them in the process)."""
import os
import re

import pytest

# CuTe DSL snapshots its settings at import: name the target before anything imports cutlass.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from hypothesis import HealthCheck, settings  # noqa: E402

# print_blob: a failure on the GPU machine (a fresh one each call, no example database) prints
# the @reproduce_failure line that replays it anywhere
settings.register_profile("ci", max_examples=40, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=2000, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


HAVE_CUDA = _cuda()


# the depth part of the GPU suite, by file name; every other test file is the nvfp4 part
DEPTH_FILES = re.compile(r"test_(fast_loop\w*|codepredictor\w*|gemv_small_m|gemm_skinny\w*|"
                         r"rows_rmsnorm|depth_attention|depth_draw|depth_frame\w*|frame_protocol|"
                         r"device_rounding)\.py$")


def pytest_addoption(parser):
    parser.addoption("--gpu-part", choices=("depth", "nvfp4"), default=None,
                     help="run one part of the suite: the depth-loop files or the rest")


def pytest_collection_modifyitems(config, items):
    part = config.getoption("--gpu-part")
    if part:
        # the after_others tests close both parts: each part is a different process history
        keep = [i for i in items if bool(DEPTH_FILES.search(i.path.name)) == (part == "depth")
                or "after_others" in i.keywords]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep
    # tests that judge process history go last, in their collected order
    items.sort(key=lambda i: "after_others" in i.keywords)
    if HAVE_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def published(tmp_path, monkeypatch):
    """A published results/ of its own; runs write into its runs/ (WB_RESULTS_DIR unset)."""
    monkeypatch.setenv("WB_PUBLISHED_DIR", str(tmp_path / "results"))
    monkeypatch.delenv("WB_RESULTS_DIR", raising=False)
    (tmp_path / "results").mkdir()
    return tmp_path / "results"
