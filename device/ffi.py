"""The TVM-FFI host path: compiled kernels called with torch tensors and ints (issue #24).

Why: on the pointer path every launch builds a cute Pointer per tensor (runtime.pointer_args:
make_ptr), an Int32 per scalar and a driver.CUstream, and the compiled function packs them in
Python: 70-100 µs of host time per call. Compiled with ``--enable-tvm-ffi`` the same @cute.jit
function also gets a native entry, a ``tvm_ffi.Function``, that takes the torch tensors themselves
(read through torch's DLPack C exchange API, nothing per tensor in Python) and plain ints. Before
launching it checks natively each tensor's dtype, rank, device and declared alignment, and it
launches on torch's current stream of the first CUDA tensor's device (tvm_ffi asks torch for it
during the call: the stream is no argument at all).

How a kernel takes part: its @cute.jit ``__call__`` takes one argument per global buffer, a cute
Pointer (pointer path) or a cute Tensor (FFI path), turns it into the kernel's typed pointer with
:func:`pointer` while tracing, then Int32 scalars, then the stream. On the FFI path the tensors are
compiled against fake tensors of the torch tensor's dtype and rank, every extent and stride
dynamic (unused: the kernel builds its own layouts, as before) and the alignment of the pointer
spec. The kernel's parameters are built the same way on both paths, so its PTX is the same;
tests/test_ffi_host.py compares them.

:class:`Entry` holds one kernel's pointer specs [(cutlass dtype, alignment)], compiles on first use
per static key (on the FFI path also per (dtype, rank) of each tensor: the native entry checks
dtypes exactly) and launches. Which path: the FFI one when ``tvm_ffi`` imports, otherwise the
pointer path (slow, same kernels, same bits). :func:`path` names the active one for tests and
benchmarks to report; ``WB_TVM_FFI=0`` or ``with pointer_path():`` force the pointer path;
:func:`require` raises a WorkbenchError naming the package when only the FFI path will do.

The entries' input checks are host time too: :func:`require_hopper` asks the driver once per
process, and :func:`plain_cuda` passes the common case of a tensor check in one expression.
"""
from __future__ import annotations

import contextlib
import functools
import os

import torch
from torch import Tensor as _Tensor

from device.runtime import cached_compile, current_stream, cute_modules, pointer_args
from device.runtime import require_hopper as _require_hopper
from workbench import WorkbenchError

cutlass, cute = cute_modules()
from cutlass import Int32  # noqa: E402
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor, make_ptr  # noqa: E402

PACKAGE = "apache-tvm-ffi==0.1.15.post2"  # the version nvidia-cutlass-dsl 4.8.1 was checked with
try:
    import tvm_ffi  # noqa: F401
    _IMPORT_ERROR = None
except (ImportError, OSError) as e:  # not installed, or a build whose library does not load
    _IMPORT_ERROR = f"{type(e).__name__}: {e}"
_forced_pointers = os.environ.get("WB_TVM_FFI", "1") == "0"
_FFI: dict = {}  # (name, key, ((torch dtype, rank), ...)) -> (compiled, its tvm_ffi.Function)


def active() -> bool:
    """True when launches take the TVM-FFI path."""
    return not _forced_pointers and _IMPORT_ERROR is None


def path() -> str:
    """The active host path, in words: ``tvm-ffi`` or ``pointers (why)``."""
    if active():
        if hasattr(_Tensor, "__dlpack_c_exchange_api__"):
            return "tvm-ffi"
        return "tvm-ffi (torch lacks the DLPack C exchange API: slow tensor conversion)"
    if _forced_pointers:
        return "pointers (forced: WB_TVM_FFI=0 or pointer_path())"
    return f"pointers (tvm_ffi does not import: {_IMPORT_ERROR}; pip install {PACKAGE})"


def require() -> None:
    """Raise unless the TVM-FFI path can be taken (for tests and benchmarks that measure it)."""
    if _IMPORT_ERROR is not None:
        raise WorkbenchError(f"the fast host path needs the {PACKAGE.split('==')[0]} package "
                             f"({_IMPORT_ERROR}); pip install {PACKAGE}")


@contextlib.contextmanager
def pointer_path():
    """Launch through the pointer path inside the block (A/B comparisons)."""
    global _forced_pointers
    old, _forced_pointers = _forced_pointers, True
    try:
        yield
    finally:
        _forced_pointers = old


_hopper_seen = False


def require_hopper() -> None:
    """runtime.require_hopper, checked once per process (the GPU does not change under it)."""
    global _hopper_seen
    if not _hopper_seen:
        _require_hopper()
        _hopper_seen = True


def plain_cuda(t, dtypes, align: int) -> bool:
    """The common case of runtime.check_cuda_tensor in one cheap test (a plain, contiguous CUDA
    tensor of one of ``dtypes``, ``align``-byte aligned): validators call check_cuda_tensor, which
    names the problem, only when this is False."""
    return (type(t) is _Tensor and t.is_cuda and t.dtype in dtypes and t.is_contiguous()
            and not t.data_ptr() % align)


class PlanCache:
    """An entry's validated call signatures -> what its launch needs (the fast path's cache).
    The last hit is compared first with ``==`` (a signature of shapes, dtypes and devices
    compares in ~0.5 µs but hashes in ~1 µs), then the dict; at ``size`` entries it starts over."""

    __slots__ = ("plans", "size", "last_key", "last_plan")

    def __init__(self, size: int = 256):
        self.plans: dict = {}
        self.size = size
        self.last_key = self.last_plan = None

    def get(self, key):
        if key == self.last_key:
            return self.last_plan
        plan = self.plans.get(key)
        if plan is not None:
            self.last_key, self.last_plan = key, plan
        return plan

    def put(self, key, plan) -> None:
        if len(self.plans) >= self.size:
            self.plans.clear()
        self.plans[key] = plan
        self.last_key, self.last_plan = key, plan

    def clear(self) -> None:
        self.plans.clear()
        self.last_key = self.last_plan = None

    def __len__(self) -> int:
        return len(self.plans)


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_handle(device_index: int) -> int:
    """torch's current stream on ``device_index`` as an int (the raw cudaStream_t), cheaply: a
    key for per-stream scratch buffers (torch.cuda.current_stream builds a Stream object)."""
    if _raw_stream is not None:
        return _raw_stream(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def pointer(arg, dtype):
    """While tracing: the typed global pointer behind a jit argument, a Pointer or a Tensor (its
    iterator: the declared alignment and address space carry over)."""
    p = arg.iterator if isinstance(arg, cute.Tensor) else arg
    return p if p.dtype is dtype else cute.recast_ptr(p, dtype=dtype)


@functools.cache
def _cutlass_dtypes() -> dict:
    c = cutlass
    return {torch.bfloat16: c.BFloat16, torch.float16: c.Float16, torch.float32: c.Float32,
            torch.uint8: c.Uint8, torch.int8: c.Int8, torch.int16: c.Int16, torch.int32: c.Int32,
            torch.int64: c.Int64, torch.float8_e4m3fn: c.Float8E4M3FN}


def fake_tensor(dtype, rank: int, align: int):
    """A fake global tensor for cute.compile: ``dtype`` (cutlass), ``rank`` dynamic extents and
    strides (64-bit, never checked), the base ``align``-byte aligned (checked by the entry)."""
    return make_fake_tensor(dtype, tuple(cute.sym_int64() for _ in range(rank)),
                            tuple(cute.sym_int64() for _ in range(rank)), assumed_align=align)


class Entry:
    """One kernel's host side: ``specs`` = [(cutlass dtype, alignment)] per global buffer, in the
    order of the jit function's arguments, then ``scalars`` Int32 arguments, then the stream.

    A buffer is passed as a torch tensor, or, in the slots named by ``addresses``, as an int
    address on both paths (a cute Pointer argument, not a tensor, in the FFI build: for memory the
    native tensor check would refuse, such as a pinned host buffer the kernel writes through UVA,
    or placeholders that are never dereferenced; nothing checks such an address natively)."""

    def __init__(self, name: str, specs, scalars: int, addresses=()):
        self.name = name
        self.specs = tuple(specs)
        self.scalars = scalars
        self.addresses = frozenset(addresses)
        self._last: dict = {}  # static key -> the FFI function its last call took

    def compile_args(self, types=None, *, ffi: bool = True) -> tuple:
        """Arguments for cute.compile (offline too): on the FFI path fake tensors of ``types`` =
        [(cutlass dtype, rank)] (default: each spec's dtype, rank 1; ignored in address slots)
        and the environment stream; else placeholder pointers and a fake stream."""
        zeros = (Int32(0),) * self.scalars
        ptrs = pointer_args(self.specs)
        if not ffi:
            return (*ptrs, *zeros, make_fake_stream())
        types = types or [(dt, 1) for dt, _ in self.specs]
        bufs = (ptrs[i] if i in self.addresses else fake_tensor(*t, al)
                for i, (t, (_, al)) in enumerate(zip(types, self.specs)))
        return (*bufs, *zeros, make_fake_stream(use_tvm_ffi_env_stream=True))

    def function(self, config, key, tensors):
        """The FFI function for ``config`` (static ``key``) and these tensors' dtypes and ranks."""
        k = (self.name, key, tuple(None if i in self.addresses else (t.dtype, t.dim())
                                   for i, t in enumerate(tensors)))
        hit = _FFI.get(k)
        if hit is None:
            try:
                types = [None if t is None else (_cutlass_dtypes()[t[0]], t[1]) for t in k[2]]
            except KeyError as e:
                raise TypeError(f"{self.name}: no cutlass dtype for torch {e.args[0]}") from None
            compiled = cute.compile(config, *self.compile_args(types), options="--enable-tvm-ffi")
            hit = _FFI[k] = (compiled, compiled.__tvm_ffi_object__())
        return hit[1]

    def bind(self, config, key, tensors, scalars):
        """A no-argument launcher of these tensors and scalars (the same every call)."""
        if active():
            return functools.partial(self.function(config, key, tensors), *tensors, *scalars)
        fn = self._pointer_function(config, key, tensors)
        args = (*self._pointers(tensors), *(Int32(v) for v in scalars))
        return lambda: fn(*args, current_stream())

    def __call__(self, config, key, tensors, scalars) -> None:
        """Launch on torch's current stream: ``tensors`` (torch, validated by the caller) and
        ``scalars`` (ints) in the jit function's order.

        The FFI path first tries the function the last call with this ``key`` took, without
        looking at the tensors: its native entry checks their dtypes and ranks and refuses others
        before launching, and only then is the right function looked up (or compiled)."""
        if _forced_pointers or _IMPORT_ERROR is not None:
            self._pointer_function(config, key, tensors)(
                *self._pointers(tensors), *(Int32(v) for v in scalars), current_stream())
            return
        fn = self._last.get(key)
        if fn is not None:
            try:
                fn(*tensors, *scalars)
                return
            except (TypeError, ValueError):
                pass  # another dtype or rank: raised again below if it was not that
        fn = self._last[key] = self.function(config, key, tensors)
        fn(*tensors, *scalars)

    def _pointers(self, tensors):
        return tuple(make_ptr(dt, t if isinstance(t, int) else t.data_ptr(),
                              cutlass.AddressSpace.gmem, assumed_align=al)
                     for (dt, al), t in zip(self.specs, tensors))

    def _pointer_function(self, config, key, tensors):
        return cached_compile((self.name, key, "pointers"), lambda: cute.compile(
            config, *self._pointers(tensors), *(Int32(0),) * self.scalars, current_stream()))
