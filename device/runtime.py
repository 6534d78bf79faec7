"""Host-side glue between torch tensors and compiled CuTe DSL kernels.

Compiled kernels are cached per static configuration (:func:`cached_compile`); tensors are wrapped
as raw pointers with their alignment declared, and launches go on torch's current stream.
"""
from __future__ import annotations

import functools
import os

import torch
from cuda.bindings import driver

from workbench import WorkbenchError

_CACHE: dict = {}


def cute_modules():
    """Import cutlass with an arch set when there is no GPU to detect (compile-only machines)."""
    if "CUTE_DSL_ARCH" not in os.environ and not torch.cuda.is_available():
        os.environ["CUTE_DSL_ARCH"] = "sm_90a"
    try:  # here, not at the top: CuTe DSL reads its settings (the arch) when first imported
        import cutlass
        import cutlass.cute as cute
    except ImportError as e:  # pragma: no cover - environment problem
        raise WorkbenchError(f"CuTe DSL is not importable ({e}); install nvidia-cutlass-dsl==4.8.1") \
            from None
    return cutlass, cute


cutlass, cute = cute_modules()
from cutlass.cute.runtime import make_ptr  # noqa: E402


def cached_compile(key, build):
    """Return the compiled kernel for ``key``, building it with ``build()`` on first use."""
    if key not in _CACHE:
        _CACHE[key] = build()
    return _CACHE[key]


def pointer_args(specs, tensors=None) -> tuple:
    """Raw global-memory pointers for a kernel: ``specs`` = [(cutlass dtype, alignment)], one per
    pointer; ``tensors`` the torch tensors they point into, or None for offline compiles (the
    addresses are then placeholders that are never dereferenced)."""
    gmem = cutlass.AddressSpace.gmem
    addrs = [t.data_ptr() for t in tensors] if tensors is not None else \
        [(k + 1) << 20 for k in range(len(specs))]
    return tuple(make_ptr(dt, a, gmem, assumed_align=al) for (dt, al), a in zip(specs, addrs))


def current_stream():
    return driver.CUstream(torch.cuda.current_stream().cuda_stream)


def check_cuda_tensor(name: str, t, *, dtypes=None, contiguous=True, align=16):
    """One clear error per problem with an input tensor, before anything launches."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; expected {names}")
    if t.device.type != "cuda":
        raise ValueError(f"{name} is on {t.device}; this kernel needs a CUDA tensor")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first)")
    if align and t.data_ptr() % align:
        raise ValueError(f"{name} data pointer is not {align}-byte aligned "
                         f"(offset {t.data_ptr() % align}); pass a fresh or .clone()d tensor")


def activation_layout(M: int, N: int, ld, chunk_major: bool = False):
    """The layout of an [M, N] activation for (row, column) coordinates: row-major with row
    stride ``ld``, or chunk-major, [N / 8][M][8] (16-byte chunks of a column range holding every
    row in turn: what kernels/depth/gemm_skinny_wgmma.py bulk-copies into wgmma's canonical image)."""
    if chunk_major:
        return cute.make_layout((M, (8, N // 8)), stride=(8, (1, 8 * M)))
    return cute.make_layout((M, N), stride=(ld, 1))


@functools.lru_cache(maxsize=None)
def sm_count() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


@functools.lru_cache(maxsize=None)
def cluster_ctas(cluster_n: int) -> int:
    """The CTAs a persistent grid of ``cluster_n``-CTA clusters may launch so that every cluster
    is resident at once, at one CTA an SM (the driver's cuOccupancyMaxActiveClusters at full
    shared memory): a grid of sm_count() // C clusters can exceed what the GPCs hold (their
    SM counts are not multiples of 4 or 8), and the extra cluster then runs its whole share
    after the others (notes/p1.md, session 26)."""
    if cluster_n == 1:
        return sm_count()
    from cutlass.utils import HardwareInfo
    return min(HardwareInfo().get_max_active_clusters(cluster_n) * cluster_n, sm_count())


def require_hopper():
    if not torch.cuda.is_available():
        raise WorkbenchError("no CUDA GPU is visible; this kernel runs on Hopper (sm_90)")
    major, minor = torch.cuda.get_device_capability(0)
    if (major, minor) != (9, 0):
        raise WorkbenchError(f"this kernel is built for sm_90a (Hopper); the GPU is sm_{major}{minor}")
