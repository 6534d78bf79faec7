"""Tensor-level absolute maximum of a bf16/fp16 tensor: ``torch.amax(x.abs())``, exactly.

It feeds the NVFP4 tensor scale g = amax / 2688 (numerics.nvfp4.global_scale).

How: a 16-bit float's magnitude orders like its bit pattern with the sign cleared, and every NaN
pattern sorts above +inf. So the maximum of ``bits & 0x7FFF`` is the bit pattern of the exact
result, and a NaN anywhere makes the result a NaN, as torch's amax does. Integer max is
associative, so the atomic combine across CTAs gives the same answer in any order.

Warp roles: every warp is a loader/reducer. Each thread streams 16-byte vectors in a grid-stride
loop with ``unroll`` vectors in flight, reduces them with integer max, the warp reduces with
shuffles and lane 0 issues one ``atom.global.max.u32`` per warp into a zeroed 32-bit result.
Elements past the last whole vector are read one at a time by CTA 0.

The result buffer is four 32-bit words (:data:`WS_WORDS`): [G] the tensor scale g (fp32), [AMAX]
the amax's bit pattern (low half), [RUNNING] the running maximum and [ARRIVED] the count of CTAs
done, both zero between launches. The last CTA to arrive takes the running maximum (resetting
it), writes AMAX and G (device.nvfp4.global_scale_bits: numerics.nvfp4.global_scale_from_amax
on the device) and resets the count. So a buffer zeroed once serves every later launch on its
stream with no clearing in between, and g is ready for the quantize kernel and the GEMM with
no torch op between the launches (:class:`AmaxWorkspace`).
"""
from __future__ import annotations

import torch

from device import ffi
from device.ffi import plain_cuda, require_hopper
from device.runtime import check_cuda_tensor, cute_modules, sm_count

cutlass, cute = cute_modules()
from cutlass import Int32, Uint16, Uint32  # noqa: E402

from device.nvfp4 import global_scale_bits  # noqa: E402

VEC = 8  # 16-bit elements per 16-byte vector
X_DTYPES = (torch.bfloat16, torch.float16)
G, AMAX, RUNNING, ARRIVED = range(4)  # the result buffer's 32-bit words
WS_WORDS = 4


class TensorAbsMax:
    """Static config: threads per CTA, vectors in flight per thread, CTAs per SM."""

    def __init__(self, threads: int = 256, unroll: int = 4, ctas_per_sm: int = 4):
        self.threads = threads
        self.unroll = unroll
        self.ctas_per_sm = ctas_per_sm
        self.key = (threads, unroll, ctas_per_sm)

    def grid(self, n: int) -> int:
        per_cta = self.threads * self.unroll
        return max(1, min(-(-max(1, n // VEC) // per_cta), sm_count() * self.ctas_per_sm))

    @cute.jit
    def __call__(self, x, out, n: Int32, grid_x: Int32, is_bf16: Int32, stream):  # see ffi.pointer
        mX = cute.make_tensor(ffi.pointer(x, Uint16), cute.make_layout(n))  # raw 16-bit patterns
        mOut = cute.make_tensor(ffi.pointer(out, Uint32), cute.make_layout(WS_WORDS))
        self.kernel(mX, mOut, n, is_bf16).launch(grid=[grid_x, 1, 1],
                                                 block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mOut: cute.Tensor, n: Int32, is_bf16: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        gX = cute.zipped_divide(mX, (VEC,))  # ((VEC), n / VEC)
        nvec = n // VEC
        stride = gdim * self.threads
        i = bidx * self.threads + tidx
        best = Uint32(0)
        # Main loop: `unroll` independent 16-byte loads before the first use.
        while i + (self.unroll - 1) * stride < nvec:
            frgs = [cute.make_rmem_tensor((VEC,), Uint16) for _ in range(self.unroll)]
            for u in cutlass.range_constexpr(self.unroll):
                cute.autovec_copy(gX[(None, i + u * stride)], frgs[u])
            for u in cutlass.range_constexpr(self.unroll):
                for j in cutlass.range_constexpr(VEC):
                    best = cutlass.max(best, Uint32(frgs[u][j]) & Uint32(0x7FFF))
            i += self.unroll * stride
        while i < nvec:
            frg = cute.make_rmem_tensor((VEC,), Uint16)
            cute.autovec_copy(gX[(None, i)], frg)
            for j in cutlass.range_constexpr(VEC):
                best = cutlass.max(best, Uint32(frg[j]) & Uint32(0x7FFF))
            i += stride
        # Tail: the n % VEC elements after the last whole vector.
        tail = nvec * VEC + tidx
        if bidx == 0 and tail < n:
            best = cutlass.max(best, Uint32(mX[tail]) & Uint32(0x7FFF))
        best = cute.arch.warp_reduction_max(best)
        if tidx % 32 == 0:
            cute.arch.atomic_max(mOut.iterator + RUNNING, best)
        # The finish: this CTA's atomics are ordered before its arrival (barrier, then a
        # cumulative gpu-scope fence); the last CTA to arrive sees every CTA's.
        cute.arch.sync_threads()
        if tidx == 0:
            cute.arch.fence_acq_rel_gpu()
            arrived = cute.arch.atomic_add(mOut.iterator + ARRIVED, Uint32(1))
            if arrived == Uint32(gdim - 1):
                cute.arch.fence_acq_rel_gpu()
                bits = cute.arch.atomic_exch(mOut.iterator + RUNNING, Uint32(0))
                g_bits = Uint32(0)
                if is_bf16 != 0:
                    g_bits = global_scale_bits(bits, True)
                else:
                    g_bits = global_scale_bits(bits, False)
                mOut[AMAX] = bits
                mOut[G] = g_bits
                mOut[ARRIVED] = Uint32(0)


PTRS = ((Uint16, 16), (Uint32, 16))  # x (raw 16-bit patterns), the result buffer
# (x, out), (n, grid_x, is_bf16); out is an address (a result buffer its caller made and
# checked: an int costs less host time than a tensor's conversion, notes/p0-gemm.md session 27)
ENTRY = ffi.Entry("amax", PTRS, scalars=3, addresses=(1,))


def compile_args(dtype=None):
    """Arguments for cute.compile offline: the pointer path's, or with ``dtype`` (cutlass
    BFloat16 / Float16) the TVM-FFI path's (x 1-D; compile with options="--enable-tvm-ffi")."""
    return ENTRY.compile_args(None if dtype is None else [(dtype, 1), (dtype, 1)],
                              ffi=dtype is not None)


class AmaxWorkspace:
    """A result buffer for amax(x, out=) with its views made once: ``buf`` (x's dtype, 8
    elements = WS_WORDS words, zeroed once: the kernel leaves RUNNING and ARRIVED zero),
    ``amax`` (0-d, x's dtype: the result) and ``g`` (fp32 [1], 16-byte aligned: the tensor scale
    global_scale_from_amax(amax), for quantize_nvfp4 and gemm_nvfp4). One workspace per stream:
    launches of two streams into one buffer at once would mix their counts."""

    def __init__(self, dtype, device):
        if dtype not in X_DTYPES:
            raise TypeError(f"dtype {dtype}: the amax kernel takes bfloat16 or float16")
        self.dtype = dtype
        self.buf = torch.zeros(2 * WS_WORDS, dtype=dtype, device=device)
        self.device = self.buf.device
        self.amax = self.buf[2 * AMAX]  # the low half of word AMAX (little-endian)
        self.g = self.buf.view(torch.float32)[G:G + 1]


def _result(x):
    """A fresh zeroed result buffer (x's dtype, WS_WORDS words); element 2·AMAX is the answer."""
    return torch.zeros(2 * WS_WORDS, dtype=x.dtype, device=x.device)


class AmaxRunner:
    """Launch helper bound to one input tensor (its arguments and grid are computed once); each
    call returns the runner's one result view, overwritten by the next call (the buffer needs no
    clearing between calls: the kernel re-arms it)."""

    def __init__(self, x, config: TensorAbsMax | None = None):
        validate_input(x)
        self.config = config or TensorAbsMax()
        self.out = _result(x)
        self.result = self.out[2 * AMAX]
        n = x.numel()
        self.launch = ENTRY.bind(self.config, self.config.key, (x, self.out.data_ptr()),
                                 (n, self.config.grid(n), int(x.dtype == torch.bfloat16)))

    def __call__(self):
        self.launch()
        return self.result


def validate_input(x):
    require_hopper()
    plain_cuda(x, X_DTYPES, 16) or check_cuda_tensor("x", x, dtypes=X_DTYPES)
    if x.numel() == 0:
        raise ValueError("x is empty; the absolute maximum of no elements is undefined")
    if x.numel() >= 2**31:
        raise ValueError(f"x has {x.numel()} elements; this kernel indexes with int32 (< 2^31)")


def _check_workspace(out, x):
    if type(out) is not AmaxWorkspace:
        raise TypeError(f"out must be an AmaxWorkspace, got {type(out).__name__}")
    if out.dtype != x.dtype:
        raise TypeError(f"out is an AmaxWorkspace for {out.dtype}; x is {x.dtype}")
    if out.device != x.device:
        raise ValueError(f"out is on {out.device}; x is on {x.device}")


_DEFAULT = TensorAbsMax()
# validated signatures: (type, shape, dtype, device, contiguous, config, workspace dtype and
# device) -> the launch's scalars; what is not in the key (alignment) is checked every call
_PLANS = ffi.PlanCache()


def signature(x, out, config):
    """The cache key of a call: everything the slow checks read but x's address."""
    return (type(x), x.shape, x.dtype, x.device, x.is_contiguous(), config,
            type(out), None if out is None else (out.dtype, out.device))


def plan(x, out, config):
    """The slow path: every check, then the launch's scalars (cached by :func:`amax`)."""
    validate_input(x)
    if out is not None:
        _check_workspace(out, x)
    n = x.numel()
    return n, config.grid(n), int(x.dtype == torch.bfloat16)


def amax(x, config: TensorAbsMax | None = None, *, out: AmaxWorkspace | None = None):
    """``torch.amax(x.abs())`` (0-d, x's dtype) for a contiguous, 16-byte-aligned bf16/fp16 CUDA
    tensor. With ``out`` (an :class:`AmaxWorkspace` of x's dtype and device) it writes there and
    returns ``out.amax``; ``out.g`` then holds global_scale_from_amax of it, on the device.
    A signature seen before (shape, dtype, device, contiguity) skips the checks but alignment."""
    config = config or _DEFAULT
    try:
        key = signature(x, out, config)
        scalars = _PLANS.get(key)
    except (AttributeError, TypeError):  # not a tensor (no signature), or an unhashable config
        key = scalars = None
    if scalars is None or x.data_ptr() % 16:
        scalars = plan(x, out, config)
        if key is not None:
            _PLANS.put(key, scalars)
    if out is None:
        buf = _result(x)
        ENTRY(config, config.key, (x, buf.data_ptr()), scalars)
        return buf[2 * AMAX]
    ENTRY(config, config.key, (x, out.buf.data_ptr()), scalars)
    return out.amax
