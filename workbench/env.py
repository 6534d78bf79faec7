"""What machine this is: GPU, versions, and the compile target.

Every results/ summary embeds :func:`environment` in its provenance, and ``wb env`` prints it.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform

import torch
from cuda.bindings import driver

from workbench import WorkbenchError

DEFAULT_ARCH = "sm_90a"
SUPPORTED_ARCHS = ("sm_90a", "sm_120a")


def compile_target() -> str:
    """The arch CuTe DSL compiles for: ``CUTE_DSL_ARCH`` if set, else the GPU's, else sm_90a."""
    arch = os.environ.get("CUTE_DSL_ARCH")
    if arch:
        return arch
    gpu = gpu_info()
    if gpu is not None:
        major, minor = gpu["compute_capability"]
        return f"sm_{major}{minor}a"
    return DEFAULT_ARCH


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cute_dsl_version() -> str | None:
    """Installed nvidia-cutlass-dsl version, or None (e.g. on a GPU host using PYTHONPATH)."""
    v = _version("nvidia-cutlass-dsl")
    if v is not None:
        return v
    try:  # unpacked archive on the GPU host: no dist-info for the meta package
        for name in ("nvidia-cutlass-dsl-libs-base", "nvidia-cutlass-dsl-libs-core"):
            v = _version(name)
            if v is not None:
                return v
    except Exception:  # pragma: no cover - metadata quirks
        pass
    return None


def gpu_info() -> dict | None:
    """Name, compute capability, SM count, memory and driver of GPU 0, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    info = {
        "name": props.name,
        "compute_capability": [props.major, props.minor],
        "sm_count": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "driver": _driver_version(),
    }
    return info


def _driver_version() -> str | None:
    try:
        err, v = driver.cuDriverGetVersion()
        if int(err) == 0:
            return f"{v // 1000}.{(v % 1000) // 10}"
    except Exception:
        pass
    return None


def environment() -> dict:
    """Everything provenance needs about the machine and software."""
    gpu = gpu_info()
    return {
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cute_dsl": cute_dsl_version(),
        "gpu": gpu if gpu is not None else "none",
        "compile_target": compile_target(),
    }


def require_gpu(what: str) -> None:
    """Raise a WorkbenchError naming ``what`` when no CUDA GPU is present."""
    if gpu_info() is None:
        raise WorkbenchError(f"{what} needs a CUDA GPU and none is visible (torch.cuda.is_available() is False)")
