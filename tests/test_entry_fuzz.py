"""Hypothesis fuzz of the public entry points' input checks (issue #23), CPU only.

Each draw is a valid input, or a valid input with one defect. A defect must raise the error type
its entry point documents (TypeError: a wrong type or dtype; ValueError: a wrong value, shape,
stride or device; KeyError: a missing checkpoint tensor; FileNotFoundError: no file), with
nothing else escaping; a valid draw, special values (NaN, ±inf, -0.0, huge, tiny, denormals) and
strided views included, must match an independent reference. The kernels' validators run with
the CPU standing in for the GPU: ``require_hopper`` is a no-op and ``check_cuda_tensor`` sees a
CPU tensor as a CUDA one (every other check of it, dtype, contiguity, alignment, is the real
one; a meta tensor stands in for a tensor on the wrong device).
"""
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from models.codepredictor import checkpoint_shapes, load_checkpoint, random_weights
from configs.codepredictor import CodePredictorConfig
from models.sampler import Sampler, SamplerSettings, draw, filtered_scores
from numerics import nvfp4, scalar_spec
from tests.cpu_stand_in import cpu_as_gpu, misaligned
from numerics.formats import E2M1_VALUES, FLT_MAX, FORMATS, e4m3_decode, round_to_format

NAN, INF = math.nan, math.inf
# fp32 specials; each dtype rounds them its own way (huge overflows bf16/fp16 to inf)
SPECIALS = (NAN, -NAN, INF, -INF, -0.0, 0.0, 3.0e38, -3.0e38, 1e-30, 1e-40, -1e-45, 2.0**-126)
# tensor scales a caller may pass: finite, >= +0 (fp32 denormals and the fp32 maximum included)
GOOD_G = (0.0, 1e-40, 2.0**-126, 1 / 2688, 0.013, 1.0, 77.0, 3.0e38)
BAD_G_VALUE = (NAN, INF, -INF, -1.0, -0.0, -1e-40, 1e39)  # 1e39 is inf in fp32
BAD_G_TYPE = ("1.0", True, complex(1, 0), torch.tensor(1, dtype=torch.int32))
BAD_G_SHAPE = (torch.ones(2), torch.ones(0), torch.ones(1, 2))


# more draws than the ci profile's 40 (each is cheap): the file takes ~20 s at 200
FUZZ = settings(max_examples=max(200, settings().max_examples))


def _outcome(expected, fn):
    """fn() when the draw is valid, else the documented error (any other one escapes)."""
    if expected is None:
        return fn()
    with pytest.raises(expected):
        fn()
    return None


def _special_values(data, shape, dtype, scale=3.0):
    """Fresh normal values with special ones planted at random places."""
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen) * scale
    n = x.numel()
    if n:
        k = data.draw(st.integers(0, min(n, 8)), label="specials")
        for _ in range(k):
            i = data.draw(st.integers(0, n - 1))
            x.view(-1)[i] = data.draw(st.sampled_from(SPECIALS))
    return x.to(dtype)


def _strided(data, t):
    """t, or a view with the same values and other strides (transposed or every other column)."""
    how = data.draw(st.sampled_from(["contiguous", "transposed", "every_other"]), label="layout")
    if how == "transposed" and t.dim() == 2:
        return t.t().contiguous().t()
    if how == "every_other" and t.dim() == 2:
        wide = torch.zeros(t.shape[0], 2 * t.shape[1], dtype=t.dtype)
        wide[:, ::2] = t
        return wide[:, ::2]
    return t


def _g(data):
    """A valid tensor scale: a number, a 0-d or a one-element tensor."""
    v = data.draw(st.sampled_from(GOOD_G) | st.floats(0, FLT_MAX, width=32), label="g")
    form = data.draw(st.sampled_from(["float", "0-d", "[1]"]), label="g form")
    return v if form == "float" else torch.tensor(v if form == "0-d" else [v])


def _g_defect(data, defect):
    if defect == "g value":
        return data.draw(st.sampled_from(BAD_G_VALUE)), ValueError
    if defect == "g type":
        return data.draw(st.sampled_from(BAD_G_TYPE)), TypeError
    if defect == "g shape":
        return data.draw(st.sampled_from(BAD_G_SHAPE)), ValueError
    return torch.ones((), device="meta"), ValueError  # "g device"


G_DEFECTS = ["g value", "g type", "g shape", "g device"]
BAD_FLAGS = ("yes", 1, 0, None, 1.0)  # a flag is True or False: truthy look-alikes are refused
HAVE_CUDA = torch.cuda.is_available()
# devices refused before any work: a CUDA index past the visible ones, and "cuda" itself where
# this torch has no CUDA GPU (it was torch's "Torch not compiled with CUDA enabled" assertion)
BAD_DEVICES = ["meta", "no such device", f"cuda:{torch.cuda.device_count()}"] \
    + ([] if HAVE_CUDA else ["cuda"])


# --- numerics.nvfp4.quantize ---------------------------------------------------------------------
def _reference_quantize(x: torch.Tensor, g: float, Mp: int, Kp: int, hi_first: bool):
    """numerics.scalar_spec, a block at a time, on the zero-padded x; packed by hand."""
    xf = torch.zeros(Mp, Kp, dtype=torch.float32)
    xf[:x.shape[0], :x.shape[1]] = x.float()
    codes = torch.zeros(Mp, Kp, dtype=torch.uint8)
    s8 = torch.zeros(Mp, Kp // 16, dtype=torch.uint8)
    for r in range(Mp):
        for b in range(Kp // 16):
            s, c = scalar_spec.quantize_block(xf[r, 16 * b:16 * b + 16].tolist(), g)
            s8[r, b] = s
            codes[r, 16 * b:16 * b + 16] = torch.tensor(c, dtype=torch.uint8)
    first, second = codes[:, 0::2], codes[:, 1::2]
    packed = (first << 4) | second if hi_first else (second << 4) | first
    return packed, nvfp4.to_blocked(s8)


QUANTIZE_DEFECTS = ["dtype", "dims", "empty", "not 16", "device", "mode", "flag", *G_DEFECTS]


@FUZZ
@given(st.data())
def test_quantize_refuses_each_defect_and_matches_the_scalar_spec(data):
    mode = data.draw(st.sampled_from(nvfp4.MODES), label="mode")
    dtype = data.draw(st.sampled_from([torch.bfloat16, torch.float16]
                                      + ([torch.float32] if mode == "eager" else [])))
    pad = data.draw(st.booleans(), label="pad_16x")
    M = data.draw(st.integers(1, 40) if pad else st.sampled_from([16, 32]), label="M")
    K = data.draw(st.integers(1, 40) if pad else st.sampled_from([16, 32, 48]), label="K")
    x = _strided(data, _special_values(data, (M, K), dtype))
    g = _g(data)
    hi_first = data.draw(st.booleans(), label="hi_first")
    defect = data.draw(st.sampled_from([None] * 4 + QUANTIZE_DEFECTS), label="defect")
    expected, flags = None, {}
    if defect == "dtype":
        x, expected = x.to(data.draw(st.sampled_from(
            [torch.int32, torch.uint8, torch.bool, torch.float64]))), TypeError
    elif defect == "dims":
        x, expected = data.draw(st.sampled_from([x.reshape(-1), x.unsqueeze(0)])), ValueError
    elif defect == "empty":
        x, expected = data.draw(st.sampled_from([x[:0], x[:, :0]])), ValueError
    elif defect == "not 16":
        assume(not pad)
        x, expected = data.draw(st.sampled_from([x[:M - 1], x[:, :K - 3]])), ValueError
    elif defect == "device":
        x, expected = x.to("meta"), ValueError
    elif defect == "mode":
        mode, expected = "fast", ValueError
    elif defect == "flag":
        flag = data.draw(st.sampled_from(["hi_first", "pad_16x", "nonfinite_g"]))
        flags, expected = {flag: data.draw(st.sampled_from(BAD_FLAGS))}, TypeError
    elif defect is not None:
        g, expected = _g_defect(data, defect)
    kw = {"hi_first": hi_first, "pad_16x": pad, "mode": mode, **flags}
    got = _outcome(expected, lambda: nvfp4.quantize(x, g, **kw))
    if got is None:
        return
    q, s = got
    Mp, Kp = -(-M // 16) * 16, -(-K // 16) * 16
    assert q.shape == (Mp, Kp // 2) and s.shape == nvfp4.scale_shape(Mp, Kp)
    if mode == "cuda":
        want_q, want_s = _reference_quantize(x, float(torch.tensor(float(g))), Mp, Kp, hi_first)
    else:  # the eager model has no second transcription: it must not depend on x's strides
        want_q, want_s = nvfp4.quantize(x.contiguous(), float(g), hi_first=hi_first,
                                        pad_16x=pad, mode=mode)
    assert torch.equal(q, want_q)
    assert torch.equal(s.view(torch.uint8), want_s.view(torch.uint8))


# --- numerics.nvfp4.dequantize -------------------------------------------------------------------
def _reference_dequantize(packed, scales, g: float, M, K, dtype, hi_first):
    """Nibbles by hand, each block's scale byte through from_blocked, fmul from scalar_spec,
    the one rounding (exact float64 product -> dtype) by round_to_format."""
    Mp, Kp = packed.shape[0], packed.shape[1] * 2
    hi, lo = (packed >> 4).long(), (packed & 0xF).long()
    codes = torch.stack([hi, lo] if hi_first else [lo, hi], dim=-1).reshape(Mp, Kp)
    lut = torch.tensor(list(E2M1_VALUES) + [-v for v in E2M1_VALUES], dtype=torch.float64)
    lut[8] = -0.0
    sv = e4m3_decode(nvfp4.from_blocked(scales.contiguous().view(torch.uint8), Mp, Kp // 16))
    p = torch.tensor([[scalar_spec.fmul(s, g) for s in row] for row in sv.tolist()],
                     dtype=torch.float64)
    exact = lut[codes] * p.repeat_interleave(16, dim=1)
    return round_to_format(exact, FORMATS[dtype]).to(dtype)[:M, :K]


DEQUANTIZE_DEFECTS = ["packed dtype", "packed dims", "packed empty", "K not 16", "scales dtype",
                      "scales shape", "shape beyond", "shape crops", "shape type", "dtype",
                      "packed device", "scales device", "mode", "flag", *G_DEFECTS]


@FUZZ
@given(st.data())
def test_dequantize_refuses_each_defect_and_matches_the_reference(data):
    Mp = data.draw(st.integers(1, 40), label="Mp")
    Kp = 16 * data.draw(st.integers(1, 4), label="K blocks")
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    packed = torch.randint(0, 256, (Mp, Kp // 2), generator=gen, dtype=torch.uint8)
    scales = torch.randint(0, 256, nvfp4.scale_shape(Mp, Kp), generator=gen, dtype=torch.uint8)
    scales = scales.view(torch.float8_e4m3fn) if data.draw(st.booleans()) else scales
    packed, scales = _strided(data, packed), _strided(data, scales)
    M = Mp - data.draw(st.integers(0, min(Mp - 1, 15)), label="M crop")
    K = Kp - data.draw(st.integers(0, 15), label="K crop")
    assume(-(-M // 16) * 16 >= Mp)
    g = _g(data)
    dtype = data.draw(st.sampled_from(list(FORMATS)), label="dtype")
    mode = data.draw(st.sampled_from(nvfp4.MODES), label="mode")
    hi_first = data.draw(st.booleans(), label="hi_first")
    shape = (M, K)
    defect = data.draw(st.sampled_from([None] * 4 + DEQUANTIZE_DEFECTS), label="defect")
    expected = ValueError
    if defect is None:
        expected = None
    elif defect == "packed dtype":
        packed, expected = packed.to(data.draw(st.sampled_from(
            [torch.float32, torch.int8, torch.int32]))), TypeError
    elif defect == "packed dims":
        packed = data.draw(st.sampled_from([packed.reshape(-1), packed.unsqueeze(0)]))
    elif defect == "packed empty":
        packed = packed[:0]
    elif defect == "K not 16":
        packed = packed[:, :-1] if Kp > 16 else torch.cat([packed, packed[:, :1]], 1)
    elif defect == "scales dtype":
        scales, expected = scales.view(torch.uint8).to(torch.float32), TypeError
    elif defect == "scales shape":  # oversized, as the issue found, or short
        scales = data.draw(st.sampled_from([torch.cat([scales, scales[:, :4]], 1),
                                            torch.cat([scales, scales], 0), scales[:, :-1]]))
    elif defect == "shape beyond":
        shape = data.draw(st.sampled_from([(Mp + 1, K), (M, Kp + 16), (Mp + 16, Kp)]))
    elif defect == "shape crops":
        shape = data.draw(st.sampled_from([(0, K), (M, 0), (-1, K), (M, K - 16), (M - 16, K)]))
    elif defect == "shape type":
        shape, expected = data.draw(st.sampled_from([(M,), (M, K, 1), (M + 0.5, K), "MK",
                                                     None])), TypeError
    elif defect == "dtype":
        dtype, expected = data.draw(st.sampled_from([torch.float64, torch.int32, "bf16"])), \
            TypeError
    elif defect == "packed device":
        packed = packed.to("meta")
    elif defect == "scales device":
        scales = scales.to("meta")
    elif defect == "mode":
        mode = "fast"
    elif defect == "flag":
        hi_first, expected = data.draw(st.sampled_from(BAD_FLAGS)), TypeError
    else:
        g, expected = _g_defect(data, defect)
    got = _outcome(expected, lambda: nvfp4.dequantize(packed, scales, g, shape, dtype,
                                                      hi_first=hi_first, mode=mode))
    if got is None:
        return
    assert got.shape == (M, K) and got.dtype == dtype
    g32 = float(torch.tensor(float(g)))
    if mode == "cuda":
        want = _reference_dequantize(packed, scales, g32, M, K, dtype, hi_first)
    else:  # eager: no second transcription; it must not depend on the operands' strides
        want = nvfp4.dequantize(packed.contiguous(), scales.contiguous(), g32, shape, dtype,
                                hi_first=hi_first, mode=mode)
    assert _same_values(got, want)


def _same_values(a, b) -> bool:
    """Equal values, signed zeros told apart, NaN where the other has NaN (any payload)."""
    nan = torch.isnan(a)
    return (torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan])
            and torch.equal(torch.signbit(a[~nan]), torch.signbit(b[~nan])))


# --- the kernels' validators, the CPU standing in for the GPU ------------------------------------
def _fp8(shape, gen):
    return torch.randint(0, 0x7F, shape, generator=gen, dtype=torch.uint8).view(
        torch.float8_e4m3fn)


GEMM_DEFECTS = ["a_q dtype", "a_s dtype", "a_q type", "b_q strides", "a_q aligned", "a_q device",
                "b_s device", "a_q dims", "K mismatch", "K not 32", "K zero", "no rows",
                "scale shape", "N not 8", "rows start", "rows range", "rows type", "g shape",
                "g dtype", "g type", "out shape", "out dtype", "out device", "out strides"]


@FUZZ
@given(st.data())
def test_gemm_nvfp4_validate_refuses_each_defect(data):
    from kernels.nvfp4 import gemm

    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    M = data.draw(st.integers(1, 300), label="M")
    N = 8 * data.draw(st.integers(1, 6), label="N/8")
    K = 32 * data.draw(st.integers(1, 3), label="K/32")
    a_q = torch.randint(0, 256, (M, K // 2), generator=gen, dtype=torch.uint8)
    b_q = torch.randint(0, 256, (N, K // 2), generator=gen, dtype=torch.uint8)
    a_s, b_s = _fp8(nvfp4.scale_shape(M, K), gen), _fp8(nvfp4.scale_shape(N, K), gen)
    g_a, g_b = _g(data), torch.tensor([data.draw(st.floats(0, 1e3, width=32))])
    rows = None
    if data.draw(st.booleans(), label="row slice"):
        r0 = 128 * data.draw(st.integers(0, (M - 1) // 128))
        rows = (r0, data.draw(st.integers(r0 + 1, M)))
    m = M if rows is None else rows[1] - rows[0]
    out = torch.empty(m, N, dtype=torch.bfloat16) if data.draw(st.booleans()) else None
    defect = data.draw(st.sampled_from([None] * 6 + GEMM_DEFECTS), label="defect")
    expected = ValueError
    if defect is None:
        expected = None
    elif defect == "a_q dtype":
        a_q, expected = a_q.to(torch.int8), TypeError
    elif defect == "a_s dtype":
        a_s, expected = a_s.to(torch.bfloat16), TypeError
    elif defect == "a_q type":
        a_q, expected = a_q.tolist(), TypeError
    elif defect == "b_q strides":
        b_q = _strided(data, b_q)
        assume(not b_q.is_contiguous())
    elif defect == "a_q aligned":
        a_q = misaligned(a_q)
    elif defect == "a_q device":
        a_q = a_q.to("meta")
    elif defect == "b_s device":
        b_s = b_s.to("meta")
    elif defect == "a_q dims":
        a_q = a_q.reshape(-1)
    elif defect == "K mismatch":
        b_q, b_s = torch.cat([b_q, b_q], 1), _fp8(nvfp4.scale_shape(N, 2 * K), gen)
    elif defect == "K not 32":
        a_q, a_s = a_q[:, :8].contiguous(), _fp8(nvfp4.scale_shape(M, 16), gen)
    elif defect == "K zero":  # on both operands: no K mismatch to catch it
        a_q, a_s = a_q[:, :0].contiguous(), _fp8(nvfp4.scale_shape(M, 0), gen)
        b_q, b_s = b_q[:, :0].contiguous(), _fp8(nvfp4.scale_shape(N, 0), gen)
    elif defect == "no rows":
        b_q, b_s = b_q[:0].contiguous(), _fp8(nvfp4.scale_shape(0, K), gen)
    elif defect == "scale shape":
        a_s = _fp8((a_s.shape[0], a_s.shape[1] + 4), gen)
    elif defect == "N not 8":
        b_q = b_q[:N - 1].contiguous()
    elif defect == "rows start":
        assume(M > 64)
        rows = (64, M)
    elif defect == "rows range":
        rows = data.draw(st.sampled_from([(0, M + 1), (0, 0), (128, 128), (-128, M)]))
    elif defect == "rows type":
        rows, expected = data.draw(st.sampled_from([M, (0,), (0, M, 1), (0.0, M)])), TypeError
    elif defect == "g shape":
        g_a = torch.ones(2)
    elif defect == "g dtype":
        g_b, expected = data.draw(st.sampled_from([torch.ones(1, dtype=torch.float64),
                                                   torch.ones(1, dtype=torch.int32)])), TypeError
    elif defect == "g type":
        g_a, expected = data.draw(st.sampled_from(["1.0", True, None])), TypeError
    elif defect == "out shape":
        out = torch.empty(m, N + 8, dtype=torch.bfloat16)
    elif defect == "out dtype":
        out, expected = torch.empty(m, N, dtype=torch.float16), TypeError
    elif defect == "out device":
        out = torch.empty(m, N, dtype=torch.bfloat16, device="meta")
    elif defect == "out strides":
        out = torch.empty(N, m, dtype=torch.bfloat16).t()
        assume(not out.is_contiguous())
    with cpu_as_gpu(gemm):
        got = _outcome(expected, lambda: gemm.validate(a_q, a_s, g_a, b_q, b_s, g_b, out, rows))
    if got is not None:
        r0, r1 = (0, M) if rows is None else rows
        assert got[:5] == (M, N, K, r0, r1)
        assert float(got[5]) == float(torch.tensor(float(g_a))) and got[6] is g_b


QUANTIZE_KERNEL_DEFECTS = ["x dtype", "x strides", "x aligned", "x dims", "K not 16", "x empty",
                           "x device", "g type", "g shape", "g dtype", "g device", "out type",
                           "out packed shape", "out scales shape", "out dtype", "out device",
                           "row_offset"]


@FUZZ
@given(st.data())
def test_quantize_nvfp4_validate_refuses_each_defect(data):
    from kernels.nvfp4 import quantize as Q

    M = data.draw(st.integers(1, 200), label="M")
    K = 16 * data.draw(st.integers(1, 4), label="K/16")
    x = _special_values(data, (M, K), data.draw(st.sampled_from([torch.bfloat16,
                                                                 torch.float16])))
    g = torch.tensor([data.draw(st.sampled_from(GOOD_G))])
    row_offset = data.draw(st.integers(0, 300), label="row_offset")
    out = None
    if data.draw(st.booleans(), label="out"):
        need = nvfp4.scale_shape(row_offset + M, K)
        extra = data.draw(st.integers(0, 2))
        out = (torch.zeros(row_offset + M + extra, K // 2, dtype=torch.uint8),
               torch.zeros(need[0] + 128 * extra, need[1], dtype=torch.uint8))
    defect = data.draw(st.sampled_from([None] * 4 + QUANTIZE_KERNEL_DEFECTS), label="defect")
    expected = ValueError
    if defect is None:
        expected = None
    elif defect == "x dtype":
        x, expected = x.float(), TypeError
    elif defect == "x strides":
        x = _strided(data, x)
        assume(not x.is_contiguous())
    elif defect == "x aligned":
        x = misaligned(x)
    elif defect == "x dims":
        x = x.reshape(-1)
    elif defect == "K not 16":
        x = x[:, :K - 8].contiguous()
    elif defect == "x empty":
        x = data.draw(st.sampled_from([x[:0], x[:, :0]])).contiguous()
    elif defect == "x device":
        x = x.to("meta")
    elif defect == "g type":
        g, expected = 1.0, TypeError
    elif defect == "g shape":
        g = torch.ones(2)
    elif defect == "g dtype":
        g, expected = torch.ones(1, dtype=torch.float64), TypeError
    elif defect == "g device":
        g = torch.ones(1, device="meta")
    elif defect == "out type":
        out, expected = data.draw(st.sampled_from([torch.zeros(2, 8, dtype=torch.uint8),
                                                   (torch.zeros(1),)])), TypeError
    elif defect == "out packed shape":
        out = (torch.zeros(row_offset + M - 1, K // 2, dtype=torch.uint8),
               torch.zeros(nvfp4.scale_shape(row_offset + M, K), dtype=torch.uint8))
    elif defect == "out scales shape":
        need = nvfp4.scale_shape(row_offset + M, K)
        out = (torch.zeros(row_offset + M, K // 2, dtype=torch.uint8),
               torch.zeros(need[0] + data.draw(st.sampled_from([-128, 64])), need[1],
                           dtype=torch.uint8))
    elif defect == "out dtype":
        out, expected = (torch.zeros(row_offset + M, K // 2, dtype=torch.int8),
                         torch.zeros(nvfp4.scale_shape(row_offset + M, K),
                                     dtype=torch.uint8)), TypeError
    elif defect == "out device":
        out = (torch.zeros(row_offset + M, K // 2, dtype=torch.uint8, device="meta"),
               torch.zeros(nvfp4.scale_shape(row_offset + M, K), dtype=torch.uint8))
    elif defect == "row_offset":
        row_offset = data.draw(st.sampled_from([-1, 1.5, True]))
    with cpu_as_gpu(Q):
        assert _outcome(expected, lambda: Q._validate(x, g, out, row_offset)) is None


@FUZZ
@given(st.data())
def test_amax_validate_refuses_each_defect(data):
    from kernels.nvfp4 import amax as A

    shape = data.draw(st.lists(st.integers(1, 20), min_size=1, max_size=3), label="shape")
    x = _special_values(data, shape, data.draw(st.sampled_from([torch.bfloat16, torch.float16])))
    defect = data.draw(st.sampled_from([None, None, "dtype", "type", "empty", "strides",
                                        "aligned", "device"]), label="defect")
    expected = {None: None, "dtype": TypeError, "type": TypeError}.get(defect, ValueError)
    if defect == "dtype":
        x = x.to(data.draw(st.sampled_from([torch.float32, torch.int16, torch.uint8])))
    elif defect == "type":
        x = x.tolist()
    elif defect == "empty":
        x = x.reshape(-1)[:0]
    elif defect == "strides":
        x = torch.stack([x, x], -1)[..., 0]
        assume(not x.is_contiguous())
    elif defect == "aligned":
        x = misaligned(x)
    elif defect == "device":
        x = x.to("meta")
    with cpu_as_gpu(A):
        assert _outcome(expected, lambda: A.validate_input(x)) is None


# --- the sampler -------------------------------------------------------------------------------
def _settings(data, V):
    return SamplerSettings(
        temperature=data.draw(st.sampled_from([0.0, 0.5, 0.9, 1.3])),
        top_k=data.draw(st.integers(0, V + 3)), top_p=data.draw(st.sampled_from([1.0, 0.8, 0.3])),
        min_p=data.draw(st.sampled_from([0.0, 0.1])),
        repetition_penalty=data.draw(st.sampled_from([1.0, 1.2])))


BAD_SETTINGS = [("temperature", NAN, ValueError), ("temperature", -1.0, ValueError),
                ("temperature", INF, ValueError), ("temperature", "hot", TypeError),
                ("top_k", -1, ValueError), ("top_k", 2.5, TypeError), ("top_k", True, TypeError),
                ("top_p", 0.0, ValueError), ("top_p", 1.5, ValueError), ("top_p", NAN, ValueError),
                ("min_p", 1.0, ValueError), ("min_p", -0.1, ValueError),
                ("repetition_penalty", 0.0, ValueError), ("repetition_penalty", NAN, ValueError),
                ("top_k", 2**63, ValueError), ("top_k", 2**70, ValueError),  # past int64
                ("temperature", 1e39, ValueError), ("top_p", 1e-50, ValueError)]  # inf, 0 in fp32
SAMPLER_DEFECTS = ["setting", "settings count", "settings type", "rows", "seeds shape",
                   "seeds dtype", "seeds range", "device", "logits dims", "logits rows",
                   "logits dtype", "logits type", "logits empty", "logits device",
                   "history dtype", "history rows", "history ids"]


def _candidates(f32, settings, history) -> torch.Tensor:
    """[R] bool: the row keeps a score above -inf after the penalty and 1/T in fp32 (NaN is
    none). The later filters (top-k, top-p, min-p) always keep a row's best score."""
    s = f32.clone()
    if history is not None:
        pen = torch.tensor([x.repetition_penalty for x in settings]).view(-1, 1)
        seen = torch.zeros_like(s, dtype=torch.bool).scatter_(1, history, True)
        s = torch.where(seen, torch.where(s > 0, s / pen, s * pen), s)
    t = torch.tensor([x.temperature if x.temperature > 0 else 1.0 for x in settings])
    return (s / t.view(-1, 1) > -INF).any(dim=1)


def _first_greedy(row: list[float]) -> int:
    """The first largest non-NaN value's index (V when there is none above -inf)."""
    best, arg = -INF, len(row)
    for i, v in enumerate(row):
        if not math.isnan(v) and v > best:
            best, arg = v, i
    return arg


@FUZZ
@given(st.data())
def test_sampler_refuses_each_defect_and_never_draws_nan(data):
    R = data.draw(st.integers(1, 4), label="rows")
    V = data.draw(st.integers(1, 40), label="vocab")
    settings = [_settings(data, V) for _ in range(R)]
    seeds = data.draw(st.lists(st.integers(-2**40, 2**40), min_size=R, max_size=R))
    dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16,
                                       torch.float64]), label="dtype")
    logits = _strided(data, _special_values(data, (R, V), dtype))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    history = torch.randint(0, V, (R, data.draw(st.integers(0, 5))), generator=gen) \
        if data.draw(st.booleans()) else None
    ctor = {"rows": R, "settings": settings, "seeds": seeds}
    defect = data.draw(st.sampled_from([None] * 8 + SAMPLER_DEFECTS), label="defect")
    expected = ValueError
    if defect is None:
        expected = None
    elif defect == "setting":
        name, value, expected = data.draw(st.sampled_from(BAD_SETTINGS))
        setattr(settings[data.draw(st.integers(0, R - 1))], name, value)
    elif defect == "settings count":
        ctor["settings"] = settings + settings[:1]
    elif defect == "settings type":
        ctor["settings"], expected = [{"temperature": 1.0}] * R, TypeError
    elif defect == "rows":
        ctor["rows"], expected = data.draw(st.sampled_from([(0, ValueError), (float(R), TypeError),
                                                            ("2", TypeError)]))
    elif defect == "seeds shape":
        ctor["seeds"] = seeds + [1]
    elif defect == "seeds dtype":
        ctor["seeds"], expected = [0.5] * R, TypeError
    elif defect == "seeds range":  # said "seeds must be R integers"
        ctor["seeds"] = list(seeds)
        ctor["seeds"][data.draw(st.integers(0, R - 1))] = data.draw(
            st.integers(2**63, 2**80) | st.integers(-2**80, -2**63 - 1))
    elif defect == "device":
        ctor["device"] = data.draw(st.sampled_from(BAD_DEVICES))
    elif defect == "logits dims":
        logits = data.draw(st.sampled_from([logits.reshape(-1), logits.unsqueeze(0)]))
    elif defect == "logits rows":  # one row into a 4-row sampler returned 4 tokens (the issue)
        logits = data.draw(st.sampled_from([logits[:1], torch.cat([logits, logits[:1]])]))
        assume(logits.shape[0] != R)
    elif defect == "logits dtype":
        logits, expected = logits.to(data.draw(st.sampled_from([torch.int32, torch.bool]))), \
            TypeError
    elif defect == "logits type":
        logits, expected = logits.tolist(), TypeError
    elif defect == "logits empty":
        logits = logits[:, :0]
    elif defect == "logits device":
        logits = logits.to("meta")
    elif defect == "history dtype":
        assume(history is not None)
        history, expected = history.float(), TypeError
    elif defect == "history rows":
        assume(history is not None)
        history = torch.cat([history, history[:1]])
    elif defect == "history ids":
        assume(history is not None and history.shape[1] > 0)
        settings[0].repetition_penalty = 1.2  # ids are checked where the penalty reads them
        history[0, 0] = data.draw(st.sampled_from([-1, V]))
    if defect in ("setting", "settings count", "settings type", "rows", "seeds shape",
                  "seeds dtype", "seeds range", "device"):
        _outcome(expected, lambda: Sampler(**ctor))
        return
    smp = Sampler(**ctor)
    f32 = logits.float() if isinstance(logits, torch.Tensor) and logits.is_floating_point() \
        else None
    if expected is None and not bool(_candidates(f32, settings, history).all()):
        expected = ValueError  # the rule: a row with no candidate is refused
    offset0 = smp.offset.clone()
    tok = _outcome(expected, lambda: smp.sample(logits, history))
    if tok is None:
        assert torch.equal(smp.offset, offset0)  # a refused call moves nothing
        return
    assert tok.shape == (R,) and bool(((tok >= 0) & (tok < V)).all())
    assert not bool(torch.isnan(f32.gather(1, tok.view(-1, 1))).any()), "a NaN was drawn"
    twin = Sampler(**ctor)  # NaN read as -inf: the same draw
    clean = torch.where(torch.isnan(f32), torch.full_like(f32, -INF), f32)
    assert torch.equal(twin.sample(clean, history), tok)
    for r, x in enumerate(settings):
        if x.temperature == 0 and not smp.uses["penalty"]:
            assert int(tok[r]) == _first_greedy(f32[r].tolist())


DRAW_DEFECTS = ["scores dims", "scores dtype", "temperature rows", "temperature dtype",
                "top_k dtype", "top_p rows", "seed dtype", "offset device", "kmax"]


@FUZZ
@given(st.data())
def test_draw_functions_refuse_each_defect_and_follow_the_nan_rule(data):
    R = data.draw(st.integers(1, 4), label="rows")
    V = data.draw(st.integers(1, 40), label="vocab")
    logits = _special_values(data, (R, V), torch.float32)
    T = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 0.7, 1.0]), min_size=R,
                                        max_size=R)))
    k = torch.tensor(data.draw(st.lists(st.integers(0, V + 2), min_size=R, max_size=R)))
    p = torch.tensor(data.draw(st.lists(st.sampled_from([1.0, 0.5]), min_size=R, max_size=R)))
    seed, offset = torch.arange(R) * 7, torch.arange(R) + 3
    k_eff = torch.where((k == 0) | (k > V), V, k)  # kmax must be >= every row's k
    kmax = data.draw(st.one_of(st.none(), st.integers(int(k_eff.max()), V + 4)))
    defect = data.draw(st.sampled_from([None] * 4 + DRAW_DEFECTS), label="defect")
    expected = {None: None, "scores dtype": TypeError, "temperature dtype": TypeError,
                "top_k dtype": TypeError, "seed dtype": TypeError}.get(defect, ValueError)
    if defect == "scores dims":
        logits = logits.reshape(-1)
    elif defect == "scores dtype":
        logits = logits.to(torch.int64)
    elif defect == "temperature rows":
        T = torch.cat([T, T[:1]])
    elif defect == "temperature dtype":
        T = T.to(torch.int64)
    elif defect == "top_k dtype":
        k = k.float()
    elif defect == "top_p rows":
        p = p[:0]
    elif defect == "seed dtype":
        seed = seed.float()
    elif defect == "offset device":
        offset = offset.to("meta")
    elif defect == "kmax":
        kmax = data.draw(st.sampled_from([0, -1, 2.0]))

    def run():
        s = filtered_scores(logits, T, k, p, kmax=kmax)
        return s, draw(s, T, seed, offset)

    got = _outcome(expected, run)
    if got is None:
        return
    s, tok = got
    assert not bool(torch.isnan(s).any()), "NaN survives the filters"
    alive = (s > -INF).any(dim=1)
    assert torch.equal(alive, (logits / torch.where(T > 0, T, 1).view(-1, 1) > -INF).any(1))
    assert bool((tok[~alive] == V).all()), "a row with no candidate must give V, no token"
    assert bool(((tok[alive] >= 0) & (tok[alive] < V)).all())
    assert not bool(torch.isnan(logits[alive].gather(1, tok[alive].view(-1, 1))).any())


# --- load_checkpoint ---------------------------------------------------------------------------
TINY = CodePredictorConfig(hidden=32, intermediate=64, layers=1, q_heads=2, kv_heads=1,
                           head_dim=16, talker_hidden=16, vocab=8)
_TINY_TENSORS = {}


def _tiny_tensors() -> dict:
    """One set of TINY's tensors by checkpoint name (made once; copies are mutated)."""
    if not _TINY_TENSORS:
        w = random_weights(TINY, seed=9, dtype=torch.float32, talker_vocab=TINY.vocab + 3)
        flat = [t for lw in w.layers for t in vars(lw).values()]
        flat += [w.final_norm, w.proj_w, w.proj_b, w.talker_embed, *w.embeds, *w.heads]
        _TINY_TENSORS.update(zip(checkpoint_shapes(TINY), flat))
    return {k: v.clone() for k, v in _TINY_TENSORS.items()}


def _changed_shape(data, t):
    shape = list(t.shape)
    how = data.draw(st.sampled_from(["grow", "drop", "add", "transpose"]))
    if how == "transpose" and t.dim() == 2 and shape[0] != shape[1]:
        return t.t().contiguous()
    if how == "drop" and t.dim() == 2:
        return t[0].contiguous()
    if how == "add":
        return t.unsqueeze(0).contiguous()
    shape[-1] += 1
    return torch.zeros(shape, dtype=t.dtype)


CHECKPOINT_DEFECTS = ["shape", "dtype", "missing", "truncated", "garbage", "no file",
                      "talker rows", "dtype argument", "device argument"]


@FUZZ
@given(data=st.data())
def test_load_checkpoint_refuses_each_defect_naming_file_and_tensor(tmp_path_factory, data):
    from safetensors.torch import save_file

    tensors = _tiny_tensors()
    names = list(tensors)
    stored = data.draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16,
                                        torch.float64]), label="stored dtype")
    tensors = {k: v.to(stored) for k, v in tensors.items()}
    tensors["talker.model.layers.0.mlp.up_proj.weight"] = torch.zeros(3)  # unrelated: ignored
    dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16]), label="load dtype")
    device = "cpu"
    name = data.draw(st.sampled_from(names), label="tensor")
    defect = data.draw(st.sampled_from([None] * 3 + CHECKPOINT_DEFECTS), label="defect")
    expected = {None: None, "dtype": TypeError, "missing": KeyError, "no file": FileNotFoundError,
                "dtype argument": TypeError}.get(defect, ValueError)
    if defect == "shape":
        tensors[name] = _changed_shape(data, tensors[name])
    elif defect == "dtype":  # int32 was cast to bf16 silently (the issue)
        tensors[name] = tensors[name].to(data.draw(st.sampled_from(
            [torch.int32, torch.int64, torch.int8, torch.uint8, torch.bool])))
    elif defect == "missing":
        del tensors[name]
    elif defect == "talker rows":
        name = "talker.model.codec_embedding.weight"
        tensors[name] = tensors[name][:TINY.vocab - 1].contiguous()
    elif defect == "dtype argument":
        dtype = data.draw(st.sampled_from([torch.int32, "bf16"]))
    elif defect == "device argument":
        device = data.draw(st.sampled_from(BAD_DEVICES))
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    save_file(tensors, str(path))
    if defect == "truncated":
        raw = path.read_bytes()
        path.write_bytes(raw[:data.draw(st.integers(0, len(raw) - 1))])
    elif defect == "garbage":
        path.write_bytes(bytes(data.draw(st.binary(min_size=0, max_size=64))))
    elif defect == "no file":
        path = path.with_name("absent.safetensors")
    if expected is not None:
        with pytest.raises(expected) as err:
            load_checkpoint(path, TINY, device=device, dtype=dtype)
        if "argument" not in defect:
            assert str(path) in str(err.value)
        if defect in ("shape", "dtype", "talker rows"):
            assert name in str(err.value)
        return
    w = load_checkpoint(path, TINY, dtype=dtype)
    loaded = [t for lw in w.layers for t in vars(lw).values()]
    loaded += [w.final_norm, w.proj_w, w.proj_b, w.talker_embed, *w.embeds, *w.heads]
    for n, t in zip(names, loaded):
        assert t.dtype == dtype and torch.equal(t, tensors[n].to(dtype)), n
