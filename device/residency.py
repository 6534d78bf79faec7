"""Co-residency before a launch whose CTAs wait on each other: if any CTA of such a grid is not
resident while another spins on its work, the grid hangs (the bounded waits then trap after
device.waits.TIMEOUT_NS). Two conditions, checked on the host before the launch: the occupancy
API fits every cluster of the grid at once, and no MPS server shares the GPU (under MPS another
client's kernels may hold SMs, so the occupancy answer is no guarantee)."""
from __future__ import annotations

import functools
import os

import torch

from device.runtime import cute_modules

cutlass, cute = cute_modules()
from cutlass.utils import HardwareInfo  # noqa: E402


class NotCoResident(RuntimeError):
    """A grid whose CTAs wait on each other cannot be guaranteed resident here (the message
    says why); nothing was launched."""


@functools.cache
def max_active_clusters(device: int, cluster_size: int) -> int:
    """Clusters of ``cluster_size`` max-shared-memory CTAs the occupancy API says fit at once."""
    torch.zeros(1, device=f"cuda:{device}")  # the driver API needs torch's context current
    try:
        return HardwareInfo(device).get_max_active_clusters(cluster_size)
    except RuntimeError as e:  # no answer: co-residency cannot be guaranteed
        raise NotCoResident(f"the occupancy API did not answer ({e}): cannot guarantee that "
                            "every CTA is resident") from None


def refuse_mps(what: str) -> None:
    """NotCoResident when an MPS client pipe is configured (``CUDA_MPS_PIPE_DIRECTORY``)."""
    if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        raise NotCoResident(f"CUDA_MPS_PIPE_DIRECTORY is set: under MPS {what}'s CTAs may not "
                            "all be resident, and CTAs that wait on each other would hang")


def check_co_resident(ctas: int, what: str, cluster_size: int = 1) -> None:
    """Refuse (NotCoResident) a grid of ``ctas`` max-shared-memory CTAs in clusters of
    ``cluster_size`` unless all of them fit at once and no MPS server shares the GPU."""
    refuse_mps(what)
    fit = max_active_clusters(torch.cuda.current_device(), cluster_size)
    if fit * cluster_size < ctas:
        raise NotCoResident(f"the occupancy API fits {fit} clusters of {cluster_size} at once; "
                            f"{what} needs {ctas} CTAs resident together")
