"""The eager host path's fast path (issue #34 item 4): the device tensor scale and the caches.

CPU: the device rule for g (device.nvfp4.global_scale_bits, modelled op by op in torch) equals
numerics.nvfp4.global_scale_from_amax on every bf16 and fp16 amax; each entry's signature
cache never accepts a call its checks would refuse (the checks run with the CPU standing in for
the GPU, as in tests/test_entry_fuzz.py); the amax kernel still compiles with no spills.
GPU: the amax kernel's g bit for bit, amax into a workspace reused without clearing, and the p0
linear's output bit-identical to the composition it replaced. Host time per call is measured by
experiments/host_overhead.py (a summary with gates), never asserted here.
"""
import math
import struct

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from numerics import nvfp4
from tests.cpu_stand_in import cpu_as_gpu, misaligned

DTYPES = (torch.bfloat16, torch.float16)


def _device_rule_model(amax: torch.Tensor) -> torch.Tensor:
    """global_scale_bits' PTX sequence in torch: mul.rn.f32 by the kernel's RN(1/2688) constant,
    cvt.rn to the amax's dtype, back to fp32 (torch's fp32 multiply and casts round to nearest
    even, with subnormals, as those instructions do)."""
    from device.nvfp4 import _RCP_AMAX_TO_G

    rcp = struct.unpack(">f", bytes.fromhex(_RCP_AMAX_TO_G))[0]
    return (amax.to(torch.float32) * torch.tensor(rcp, dtype=torch.float32)).to(
        amax.dtype).to(torch.float32)


def _same_bits(a, b):
    """fp32 tensors equal bit for bit, any NaN equal to any NaN (the rule fixes no payload)."""
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(
        a[~nan].view(torch.int32), b[~nan].view(torch.int32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_device_g_rule_equals_the_host_rule_for_every_amax(dtype):
    from device.nvfp4 import _RCP_AMAX_TO_G

    assert _RCP_AMAX_TO_G == "39C30C31"  # RN_fp32(1/2688), the constant torch's CUDA path uses
    amax = torch.arange(0, 0x8000, dtype=torch.int32).to(torch.int16).view(dtype)  # every |x|
    assert _same_bits(_device_rule_model(amax), nvfp4.global_scale_from_amax(amax))


@given(st.sampled_from(DTYPES), st.floats(0, math.inf)
       | st.sampled_from([0.0, 2.0**-133, 2.0**-126, 21 * 2.0**-127, 2.0**-14, 2.0**-24,
                          65504.0, 3.0e38, math.inf, math.nan]))
def test_device_g_rule_on_adversarial_amax_values(dtype, v):
    """One value at a time (the 0-d path of the host rule), subnormal, tiny, huge, inf, NaN."""
    amax = torch.tensor(v).to(dtype)
    assert _same_bits(_device_rule_model(amax).reshape(1),
                      nvfp4.global_scale_from_amax(amax).reshape(1))


@pytest.mark.compile
def test_amax_kernel_writes_g_with_the_device_rule_and_no_spills():
    from kernels.nvfp4 import amax as mod
    from workbench.compile import compile_report

    r = compile_report(mod.TensorAbsMax(), *mod.compile_args(), arch="sm_90a")
    assert r.spill_bytes == 0 and 0 < r.registers <= 64
    for text in ("mul.rn.f32", "cvt.rn.bf16.f32", "cvt.rn.f16.f32", "fence.acq_rel.gpu",
                 "atom.global.add.u32", "atom.global.exch.b32", "atom.global.max.u32"):
        assert text in r.ptx, text
    assert ".ftz" not in r.ptx, "the g rule keeps subnormals"


# --- the caches, the CPU standing in for the GPU -------------------------------------------------
def _refused(fn) -> bool:
    try:
        fn()
    except (TypeError, ValueError):
        return True
    return False


def _variant(data, t, name):
    """t, or a tensor that differs from it in one property a check reads."""
    how = data.draw(st.sampled_from(["same", "copy", "dtype", "meta", "strided", "misaligned",
                                     "shape", "not a tensor", "flat"]), label=f"{name} variant")
    if how == "copy":
        return t.clone()
    if how == "dtype":
        other = data.draw(st.sampled_from([torch.float32, torch.int8, torch.float16,
                                           torch.bfloat16, torch.uint8, torch.int32]))
        return t.to(other) if t.dtype != other else t.to(torch.float64)
    if how == "meta":
        return t.to("meta")
    if how == "strided" and t.dim() == 2 and t.shape[1] > 1:
        wide = torch.zeros(t.shape[0], 2 * t.shape[1], dtype=t.dtype)
        wide[:, ::2] = t
        return wide[:, ::2]
    if how == "misaligned":
        return misaligned(t)
    if how == "shape" and t.dim() == 2:
        return torch.zeros(t.shape[0] + 1, t.shape[1], dtype=t.dtype)
    if how == "not a tensor":
        return t.tolist()
    if how == "flat":
        return t.reshape(-1)
    return t


def _accepted(cache_key, sig, aligned) -> bool:
    """Whether the fast path would take a call: its signature is the cached one and aligned."""
    try:
        return sig() == cache_key and aligned()
    except (AttributeError, TypeError):
        return False


@given(st.data())
def test_gemm_cache_never_accepts_what_the_checks_refuse(data):
    from kernels.nvfp4 import gemm as G

    M, N, K = 128 * data.draw(st.integers(1, 2)), 64, 64
    rows = data.draw(st.sampled_from([None, (0, M), (0, 100)]))
    m = M if rows is None else rows[1] - rows[0]
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
    args = dict(a_q=torch.randint(0, 256, (M, K // 2), generator=gen, dtype=torch.uint8),
                a_s=torch.zeros(nvfp4.scale_shape(M, K), dtype=torch.uint8),
                g_a=torch.ones(1), b_q=torch.randint(0, 256, (N, K // 2), dtype=torch.uint8),
                b_s=torch.zeros(nvfp4.scale_shape(N, K), dtype=torch.float8_e4m3fn),
                g_b=torch.ones(1), out=torch.empty(m, N, dtype=torch.bfloat16))

    def sig(a, rows):
        return G.signature(a["a_q"], a["a_s"], a["g_a"], a["b_q"], a["b_s"], a["g_b"],
                           a["out"], rows, None, None, None, None)

    def check(a, rows):
        return G.validate(a["a_q"], a["a_s"], a["g_a"], a["b_q"], a["b_s"], a["g_b"],
                          a["out"], rows)

    with cpu_as_gpu(G):
        assert not _refused(lambda: check(args, rows))
        key = sig(args, rows)
        name = data.draw(st.sampled_from(sorted(args)), label="changed")
        new = dict(args, **{name: _variant(data, args[name], name)})
        new_rows = data.draw(st.sampled_from([rows, (0.0, M), [0, M], (0, M + 1), (True, M)]),
                             label="rows")
        accepted = _accepted(key, lambda: sig(new, new_rows), lambda: G._aligned(
            new["a_q"], new["a_s"], new["g_a"], new["b_q"], new["b_s"], new["g_b"],
            new["out"], None, None, None))
        if accepted:
            assert check(new, new_rows)[:5] == check(args, rows)[:5]
        if _refused(lambda: check(new, new_rows)):
            assert not accepted


@given(st.data())
def test_quantize_cache_never_accepts_what_the_checks_refuse(data):
    from kernels.nvfp4 import quantize as Q

    M, K = data.draw(st.sampled_from([16, 128, 200])), 64
    args = dict(x=torch.randn(M, K).to(data.draw(st.sampled_from(DTYPES))),
                g=torch.ones(1), q=torch.zeros(M + 16, K // 2, dtype=torch.uint8),
                s=torch.zeros(nvfp4.scale_shape(M + 16, K), dtype=torch.uint8))
    offset = data.draw(st.sampled_from([0, 16]))

    def sig(a, off):
        return Q.signature(a["x"], a["g"], (a["q"], a["s"]), off, False, None)

    def check(a, off):
        return Q.plan(a["x"], a["g"], (a["q"], a["s"]), off, False, None)

    with cpu_as_gpu(Q):
        assert not _refused(lambda: check(args, offset))
        key = sig(args, offset)
        name = data.draw(st.sampled_from(sorted(args)), label="changed")
        new = dict(args, **{name: _variant(data, args[name], name)})
        new_offset = data.draw(st.sampled_from([offset, True, 1.0, -1, 10**6]), label="offset")
        accepted = _accepted(key, lambda: sig(new, new_offset), lambda: Q._aligned(
            new["x"], new["g"], (new["q"], new["s"])))
        if accepted:
            assert check(new, new_offset)[2] == check(args, offset)[2]
        if _refused(lambda: check(new, new_offset)):
            assert not accepted


@given(st.data())
def test_amax_cache_never_accepts_what_the_checks_refuse(data):
    from kernels.nvfp4 import amax as A

    x = torch.randn(8, 24).to(data.draw(st.sampled_from(DTYPES)))
    new = _variant(data, x, "x")
    with cpu_as_gpu(A):
        assert not _refused(lambda: A.validate_input(x))
        key = A.signature(x, None, A._DEFAULT)
        accepted = _accepted(key, lambda: A.signature(new, None, A._DEFAULT),
                             lambda: not new.data_ptr() % 16)
        if _refused(lambda: A.validate_input(new)):
            assert not accepted


def test_signatures_tell_apart_what_the_checks_read():
    """The cases named in issue #34 item 4, one by one: the same shape with another dtype,
    device or strides, and a view; alignment is no part of the key, so it is checked per call."""
    from kernels.nvfp4 import quantize as Q

    x = torch.zeros(32, 64, dtype=torch.bfloat16)
    g = torch.ones(1)
    key = Q.signature(x, g, None, 0, False, None)
    assert Q.signature(x.clone(), g.clone(), None, 0, False, None) == key
    for other in (x.half(), x.to("meta"), torch.zeros(64, 32, dtype=torch.bfloat16).t(),
                  torch.zeros(32, 128, dtype=torch.bfloat16)[:, ::2]):
        assert Q.signature(other, g, None, 0, False, None) != key
    assert Q.signature(x, g, None, True, False, None) != Q.signature(x, g, None, 1, False, None)
    mis = misaligned(x)
    assert Q.signature(mis, g, None, 0, False, None) == key and not Q._aligned(mis, g, None)


def test_p0_key_refuses_what_has_no_stream():
    from models.nvfp4_linear import _p0_key

    with pytest.raises(TypeError):
        _p0_key(torch.zeros(4, 32, dtype=torch.bfloat16), None, None, None)
    with pytest.raises(TypeError):
        _p0_key(torch.zeros(4, 32, dtype=torch.bfloat16), [0, 4], None, None)
    with pytest.raises(AttributeError):
        _p0_key([[0.0]], None, None, None)


# --- on the GPU ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_amax_kernel_g_matches_the_host_rule_bit_for_bit(dtype):
    """Adversarial amax values planted in a tensor: subnormal, tiny, huge, inf, NaN; the
    workspace reused without clearing (the kernel re-arms it), on grids of 1 and many CTAs."""
    from kernels.nvfp4.amax import AmaxWorkspace, amax

    ws = AmaxWorkspace(dtype, "cuda")
    fin = torch.finfo(dtype)
    values = [0.0, fin.smallest_normal / 8, fin.smallest_normal, 21 * 2.0**-127, 1e-3, 1.0,
              2688.0, fin.max, math.inf, math.nan]
    for n in (8, 1000, 4096 * 33 + 5):
        for v in values:
            x = torch.zeros(n, dtype=dtype, device="cuda")
            x[n // 3] = -v if not math.isnan(v) else v
            got = amax(x, out=ws)
            want = torch.amax(x.abs())
            assert _same_bits(got.float().reshape(1), want.float().reshape(1)), (n, v)
            assert _same_bits(ws.g, nvfp4.global_scale_from_amax(want).reshape(1)), (n, v)
            assert _same_bits(ws.g.cpu(),
                              nvfp4.global_scale_from_amax(want.cpu()).reshape(1)), (n, v)
    assert int(ws.buf.view(torch.int32)[2]) == 0 and int(ws.buf.view(torch.int32)[3]) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("M, rows", [(128, None), (40, None), (300, (128, 300)), (256, (0, 128))])
def test_p0_linear_bit_identical_to_the_composition_it_replaced(M, rows):
    """Output bits as before (torch g from the amax, allocating quantize, float g_w), on the
    first (checked) call and the cached ones, and with a row slice (gemm_nvfp4's conveniences
    expand the packed activation and prepack the weight per call: the linear's bits)."""
    from kernels.nvfp4.amax import amax
    from kernels.nvfp4.gemm import gemm_nvfp4
    from kernels.nvfp4.quantize import quantize_nvfp4
    from models.nvfp4_linear import Nvfp4Linear

    gen = torch.Generator(device="cuda").manual_seed(M)
    w = (torch.randn(256, 512, device="cuda", generator=gen) / 16).to(torch.bfloat16)
    lin = Nvfp4Linear(w, backend="p0")
    r0, r1 = rows or (0, M)
    for i in range(3):
        x = (torch.randn(M, 512, device="cuda", generator=gen) * (i + 1)).to(torch.bfloat16)
        g = nvfp4.global_scale_from_amax(amax(x)).reshape(1)
        q, s = quantize_nvfp4(x, g, pad_16x=True)
        want = gemm_nvfp4(q, s, g, lin.w_q, lin.w_s, lin.g_w, rows=(r0, r1))
        for _ in range(2):
            got = lin(x, rows)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
def test_p0_linear_under_cuda_graph_capture():
    """A capture after an eager call at the shape takes the checked path with its own buffers
    (no cached scratch inside a graph): replays give the eager bits, also after eager calls in
    between; a first call inside a capture is refused with a clear error, not recorded."""
    from models.nvfp4_linear import Nvfp4Linear

    gen = torch.Generator(device="cuda").manual_seed(5)
    w = (torch.randn(256, 512, device="cuda", generator=gen) / 16).to(torch.bfloat16)
    x = torch.randn(128, 512, device="cuda", generator=gen).to(torch.bfloat16)
    lin = Nvfp4Linear(w, backend="p0")
    want = lin(x).clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = lin(x)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y.view(torch.int16), want.view(torch.int16))
        assert torch.equal(lin(x).view(torch.int16), want.view(torch.int16))
    fresh = Nvfp4Linear(w, backend="p0")
    with pytest.raises(RuntimeError, match="outside CUDA-graph capture"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            fresh(x)
