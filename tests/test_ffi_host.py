"""The TVM-FFI host path (device/ffi.py, issue #24).

Offline: each FFI build compiles to the pointer build's PTX, its native entry refuses bad
arguments before anything launches, and the dispatch and the fallback do what ffi.py says.
On the GPU: the same bits as the pointer path, and launches on torch's current stream (a CUDA
graph captures them). Host time per call is a benchmark, not a test: experiments/host_overhead.py
(its targets are the summary's gates; a timing asserted here would fail on a busy machine).
"""
import re

import pytest
import torch

from device import ffi

needs_tvm_ffi = pytest.mark.skipif(
    not ffi.active(), reason=f"TVM-FFI path not active: {ffi.path()}")


def _norm(ptx: str) -> str:
    """PTX without comments and with the kernel's mangled name (it embeds the argument types)."""
    return re.sub(r"//[^\n]*", "", re.sub(r"kernel_cutlass_kernel_\w+", "KERNEL", ptx))


@needs_tvm_ffi
@pytest.mark.compile
@pytest.mark.parametrize("name", ["amax", "quantize_nvfp4"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_ffi_build_has_the_pointer_builds_ptx(name, dtype):
    import cutlass

    from kernels.nvfp4 import amax as A
    from kernels.nvfp4 import quantize as Q
    from workbench.compile import compile_report

    mod, config = (A, A.TensorAbsMax()) if name == "amax" else (Q, Q.QuantizeNvfp4Kernel(dtype))
    ptr = compile_report(config, *mod.compile_args())
    fast = compile_report(config, *mod.compile_args({"bfloat16": cutlass.BFloat16,
                                                     "float16": cutlass.Float16}[dtype]),
                          options="--enable-tvm-ffi")
    assert _norm(fast.ptx) == _norm(ptr.ptx), "the kernel must not change with the host path"
    assert fast.census == ptr.census and fast.registers == ptr.registers
    assert fast.spill_bytes == ptr.spill_bytes == 0
    assert fast.compiled.__tvm_ffi_object__() is not None


@needs_tvm_ffi
@pytest.mark.compile
@pytest.mark.parametrize("scales", ["uint8", "float8_e4m3fn"])
def test_gemm_f16_ffi_build_has_the_pointer_builds_ptx(scales):
    """P0's f16 build through the FFI entry: tensors for the activation, its scales, the tensor
    scales and the output, addresses for the rest (ENTRY's ADDRESS_SLOTS: the prepack, the
    mailbox, the split-K pair, the epilogue pair); the f16 activation as bytes [M, 2K], the
    never-read activation scales as uint8 or as E4M3 tensors (what quantize returns:
    gemm_nvfp4 passes them as they are); the same kernel either way."""
    import cutlass

    from kernels.nvfp4.gemm_shell import ENTRY, BlockscaledGemmSm90, compile_args
    from workbench.compile import compile_report

    c = cutlass
    sc = {"uint8": c.Uint8, "float8_e4m3fn": c.Float8E4M3FN}[scales]
    cfg = BlockscaledGemmSm90.swap_ab_f16(splits=3)
    ptr = compile_report(cfg, *compile_args())
    types = [(c.Uint8, 2), (sc, 2), None, None, (c.Float32, 1), (c.Float32, 1),
             (c.BFloat16, 2), None, None, None, None, None]  # None: ENTRY's address slots
    fast = compile_report(cfg, *ENTRY.compile_args(types), options="--enable-tvm-ffi")
    assert _norm(fast.ptx) == _norm(ptr.ptx), "the kernel must not change with the host path"
    assert fast.registers == ptr.registers and fast.spill_bytes == ptr.spill_bytes == 0


@needs_tvm_ffi
@pytest.mark.compile
def test_native_entry_refuses_bad_arguments_before_launching():
    """Compiled per (dtype, rank) from example tensors (CPU ones will do offline); the native
    entry checks arity, device, dtype and rank itself, so these raise with no GPU."""
    from kernels.nvfp4 import quantize as Q

    cfg = Q.QuantizeNvfp4Kernel("float16")
    x = torch.zeros(16, 64, dtype=torch.float16)
    q, s = torch.zeros(16, 32, dtype=torch.uint8), torch.zeros(128, 4, dtype=torch.float8_e4m3fn)
    g = torch.ones(())  # 0-d g and fp8 scales are variants of their own
    fn = Q.ENTRY.function(cfg, cfg.key, (x, q, s, g))
    assert fn is Q.ENTRY.function(cfg, cfg.key, (x, q, s, g)), "compiled once per variant"
    with pytest.raises(TypeError, match="Expects 10 parameters"):
        fn(x, q, s, g, 16, 4, 0, 512, 1)
    with pytest.raises(ValueError, match="device_type=cuda"):
        fn(x, q, s, g, 16, 4, 0, 512, 1, 1)


@needs_tvm_ffi
@pytest.mark.compile
def test_an_address_slot_is_a_pointer_argument_with_the_same_ptx():
    """Slots named in ``addresses`` stay cute Pointers (ints at run time, e.g. gemm's pinned host
    mailbox); the kernel still compiles to the pointer build's PTX."""
    import cutlass

    from kernels.nvfp4 import amax as A
    from workbench.compile import compile_report

    entry = ffi.Entry("amax-address-probe", A.PTRS, scalars=3, addresses=(1,))
    config = A.TensorAbsMax()
    fast = compile_report(config, *entry.compile_args([(cutlass.BFloat16, 2), None]),
                          options="--enable-tvm-ffi")
    assert _norm(fast.ptx) == _norm(compile_report(config, *A.compile_args()).ptx)
    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    fn = entry.function(config, config.key, (x, 1 << 20))
    with pytest.raises(ValueError, match=r"out: DataPointer.*device_type=cuda"):
        fn(x, 1 << 20, 32, 1, 1)


def test_dispatch_retries_once_with_the_right_variant(monkeypatch):
    """A call first tries the last function of its key; one the native entry refuses (another
    dtype or rank) is replaced by the tensors' own variant, and a refusal of that one stands."""
    entry = ffi.Entry("probe", [], scalars=1)
    calls = []

    def refuses(*args):
        calls.append("old")
        raise ValueError("Mismatched Tensor")

    def takes(*args):
        calls.append(("new", args))

    monkeypatch.setattr(ffi, "_IMPORT_ERROR", None)
    monkeypatch.setattr(ffi, "_forced_pointers", False)
    monkeypatch.setattr(entry, "function", lambda config, key, tensors: takes)
    entry._last["k"] = refuses
    entry(None, "k", (), (7,))
    assert calls == ["old", ("new", (7,))] and entry._last["k"] is takes
    monkeypatch.setattr(entry, "function", lambda config, key, tensors: refuses)
    entry._last["k"] = refuses
    with pytest.raises(ValueError):
        entry(None, "k", (), (7,))


def test_path_names_the_fallback_and_how_to_leave_it(monkeypatch):
    from workbench import WorkbenchError

    monkeypatch.setattr(ffi, "_IMPORT_ERROR", "ModuleNotFoundError: No module named 'tvm_ffi'")
    assert not ffi.active()
    assert "pip install apache-tvm-ffi" in ffi.path()
    with pytest.raises(WorkbenchError, match="pip install apache-tvm-ffi"):
        ffi.require()
    monkeypatch.setattr(ffi, "_IMPORT_ERROR", None)
    assert ffi.active() and ffi.path().startswith("tvm-ffi")
    with ffi.pointer_path():
        assert not ffi.active() and ffi.path().startswith("pointers (forced")
    assert ffi.active()


# --- on the GPU (host time per call: experiments/host_overhead.py, a summary with gates) ------
def _quantize_case(M=128, K=256, dtype=torch.bfloat16, seed=0):
    from numerics import nvfp4

    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(M, K, device="cuda", generator=gen) * 3).to(dtype)
    g = nvfp4.global_scale(x).reshape(1).float()
    q = torch.zeros(M, K // 2, dtype=torch.uint8, device="cuda")
    s = torch.zeros(nvfp4.scale_shape(M, K), dtype=torch.uint8, device="cuda")
    return x, g, q, s


@pytest.mark.gpu
def test_gemm_bits_match_the_pointer_path():
    """P0 at a tiny shape, into a given output and allocating: the same bits on both paths."""
    from kernels.nvfp4.gemm import gemm_nvfp4
    from validators.gemm_operands import make_operand

    ffi.require()
    a = make_operand("normal", 128, 256, 1, "cuda")
    b = make_operand("normal", 256, 256, 2, "cuda")
    ga, gb = (torch.tensor([float(o[2])], device="cuda") for o in (a, b))
    out = torch.empty(128, 256, dtype=torch.bfloat16, device="cuda")
    args = (a[0], a[1], ga, b[0], b[1], gb)
    gemm_nvfp4(*args, out=out)
    got, allocated = out.clone(), gemm_nvfp4(*args)
    with ffi.pointer_path():
        want = gemm_nvfp4(*args)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert torch.equal(allocated.view(torch.int16), want.view(torch.int16))


def _bits_equal(a, b):
    bits = {1: torch.uint8, 2: torch.int16}[a.element_size()]
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(bits), b.view(bits))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ffi_path_gives_the_pointer_paths_bits(dtype):
    from kernels.nvfp4.amax import amax
    from kernels.nvfp4.quantize import quantize_nvfp4
    from numerics import nvfp4

    def both(fn, *args, **kw):  # (pointer path's result, FFI path's)
        with ffi.pointer_path():
            ref = fn(*args, **kw)
        return ref, fn(*args, **kw)

    def into(x, g, M, K):  # fp8 scale buffers at a row offset, a 0-d g: variants of their own
        q = torch.full((32 + M + 16, K // 2), 0xAB, dtype=torch.uint8, device="cuda")
        s = torch.full(nvfp4.scale_shape(32 + M + 16, K), 0xCD, dtype=torch.uint8,
                       device="cuda").view(torch.float8_e4m3fn)
        return quantize_nvfp4(x, g.reshape(()), out=(q, s), row_offset=32)

    ffi.require()
    for M, K in [(16, 16), (48, 16 * 37), (300, 512), (256, 1024)]:
        x, g, _, _ = _quantize_case(M, K, dtype, seed=M + K)
        for t in (x, x.reshape(-1), x.reshape(M, K // 16, 16)):  # amax takes any rank
            assert _bits_equal(*both(amax, t))
        y = x.clone()
        y[M // 2, 3] = float("nan")
        assert _bits_equal(*both(amax, y))
        for (q0, s0), (q1, s1) in (both(quantize_nvfp4, x, g, pad_16x=True),
                                   both(into, x, g, M, K)):
            assert _bits_equal(q0, q1) and _bits_equal(s0, s1)


@pytest.mark.gpu
def test_launches_go_on_torchs_current_stream():
    """A CUDA graph captures only work on its capture stream (a launch elsewhere breaks the
    capture), and a side stream's result is right once that stream is synchronised."""
    from kernels.nvfp4.amax import amax
    from kernels.nvfp4.quantize import quantize_nvfp4

    ffi.require()
    x, g, q, s = _quantize_case(256, 512)
    want_q, want_s = quantize_nvfp4(x, g)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got_amax = amax(x)
        quantize_nvfp4(x, g, out=(q, s))
    side.synchronize()
    assert _bits_equal(got_amax, torch.amax(x.abs())) and torch.equal(q, want_q)
    q.zero_()
    s.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        quantize_nvfp4(x, g, out=(q, s))
    torch.cuda.synchronize()
    assert not q.any(), "capturing must not run the kernel"
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(q, want_q) and torch.equal(s, want_s.view(torch.uint8))
