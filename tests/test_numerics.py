"""numerics/: codecs, rounding, rcp model, swizzle, quantize/dequantize against independent forms."""
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from numerics import nvfp4
from numerics.formats import (BF16, FP16, Format, e2m1_decode, e2m1_encode, e4m3_decode,
                              e4m3_encode, fmul_ftz, round_to_format)
from numerics.rcp import correction_table, rcp_approx

finite32 = st.floats(allow_nan=False, allow_infinity=False, width=32)


@given(st.lists(finite32, min_size=1, max_size=64))
def test_round_to_format_matches_torch_casts(vals):
    x = torch.tensor(vals, dtype=torch.float32)
    for dtype, fmt in ((torch.bfloat16, BF16), (torch.float16, FP16)):
        want = x.to(dtype).to(torch.float64)
        got = round_to_format(x, fmt)
        assert torch.equal(got, want), (dtype, x[got != want])


@given(st.lists(st.floats(min_value=-448, max_value=448, width=32), min_size=1, max_size=64))
def test_e4m3_encode_matches_torch_in_range(vals):
    x = torch.tensor(vals, dtype=torch.float32)
    assert torch.equal(e4m3_encode(x), x.to(torch.float8_e4m3fn).view(torch.uint8))


def test_e4m3_saturates_and_handles_ties_to_zero():
    x = torch.tensor([1e6, -1e6, 464.0, 2.0**-10, 2.0**-10 * 1.0001, float("inf"), float("nan")])
    assert e4m3_encode(x).tolist() == [0x7E, 0xFE, 0x7E, 0x00, 0x01, 0x7E, 0x7F]
    codes = torch.arange(256, dtype=torch.uint8)
    vals = e4m3_decode(codes)
    ok = ~torch.isnan(vals)
    assert torch.equal(e4m3_encode(vals[ok]), codes[ok])  # every finite code round-trips


E2M1 = Format("e2m1", 1, 0, 6.0, True)


@given(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=64))
def test_e2m1_thresholds_are_rne_onto_the_grid(vals):
    v = torch.tensor(vals, dtype=torch.float32)
    want = e2m1_encode(round_to_format(v, E2M1))  # grid values encode exactly
    assert torch.equal(e2m1_encode(v), want)
    assert torch.equal(e2m1_decode(e2m1_encode(round_to_format(v, E2M1))).to(torch.float64),
                       round_to_format(v, E2M1).abs().copysign(
                           torch.tensor(vals, dtype=torch.float64)))


def test_e2m1_specials():
    v = torch.tensor([-0.0, 0.0, float("nan"), -float("nan"), float("inf"), -float("inf"), -0.1])
    assert e2m1_encode(v).tolist() == [8, 0, 7, 7, 7, 15, 8]


def test_fmul_ftz_flushes():
    assert fmul_ftz(torch.tensor(1e-39), 1.0).item() == 0.0
    assert math.copysign(1, fmul_ftz(torch.tensor(-2.0**-70), 2.0**-70).item()) == -1
    assert fmul_ftz(torch.tensor(3.0), 5.0).item() == 15.0


def test_rcp_table_counts_and_exact_cases():
    c = correction_table()
    assert int((c > 0).sum()) == 733_799 and int((c < 0).sum()) == 374_723
    # every value with <= 5 significant bits has MUFU == RN (all E4M3 values, powers of two)
    vals = e4m3_decode(torch.arange(1, 0x7F, dtype=torch.uint8))
    assert torch.equal(rcp_approx(vals), 1.0 / vals)


@given(st.floats(min_value=2.0**-125, max_value=2.0**125, width=32))
def test_rcp_within_one_ulp(x):
    t = torch.tensor([x, -x], dtype=torch.float32)
    r, rn = rcp_approx(t).view(torch.int32), (1.0 / t).view(torch.int32)
    assert ((r - rn).abs() <= 1).all()


def test_rcp_specials():
    t = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, 2.0**127 * 1.5])
    r = rcp_approx(t)
    assert r[0] == float("inf") and r[1] == -float("inf") and r[2] == 0 and r[3] == 0
    assert math.copysign(1, r[3].item()) == -1 and torch.isnan(r[4])
    assert r[5] == float("inf") and r[6] == 0  # denormal input acts as 0; denormal result flushes


def _to_blocked_by_reshape(s):
    """torchao-style to_blocked, written independently: (128, 4) tiles rearranged to 32x16."""
    R, C = s.shape
    Rp, Cp = -(-R // 128) * 128, -(-C // 4) * 4
    p = torch.zeros(Rp, Cp, dtype=s.dtype)
    p[:R, :C] = s
    blocks = p.view(Rp // 128, 128, Cp // 4, 4).permute(0, 2, 1, 3)
    tiles = blocks.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1, 32, 16)
    return tiles.reshape(Rp, Cp)


@pytest.mark.parametrize("R,C", [(300, 37), (128, 4), (1, 1), (129, 5)])
def test_swizzle_matches_independent_layout_and_round_trips(R, C):
    s = torch.randint(1, 255, (R, C), dtype=torch.uint8)
    b = nvfp4.to_blocked(s)
    assert torch.equal(b, _to_blocked_by_reshape(s))
    assert torch.equal(nvfp4.from_blocked(b, R, C), s)
    mask = torch.ones_like(b, dtype=torch.bool)
    mask.view(-1)[nvfp4.swizzle_offset(torch.arange(R).view(-1, 1), torch.arange(C).view(1, -1),
                                       C).reshape(-1)] = False
    assert (b[mask] == 0).all()  # padding is zero


@given(R=st.integers(1, 700), C=st.integers(1, 90))
def test_every_swizzle_form_is_the_independent_layout(R, C):
    """The host offset, the device helper (its shifts and masks evaluated on torch integers)
    and scale_shape all agree with the reshape-built layout, byte for byte."""
    pytest.importorskip("cutlass")
    from device.nvfp4 import scale_swizzle_offset

    ids = torch.arange(1, R * C + 1, dtype=torch.int64).view(R, C)  # unique, never 0 (padding)
    b = _to_blocked_by_reshape(ids)
    assert tuple(b.shape) == nvfp4.scale_shape(R, 16 * C)
    where = torch.empty(R * C, dtype=torch.int64)
    flat = b.reshape(-1)
    where[flat[flat > 0] - 1] = torch.nonzero(flat > 0).view(-1)  # id -> byte offset
    r, c = torch.arange(R).view(-1, 1).expand(R, C), torch.arange(C).view(1, -1).expand(R, C)
    want = where.view(R, C)
    assert torch.equal(nvfp4.swizzle_offset(r, c, C), want)
    assert torch.equal(scale_swizzle_offset(r, c, -(-C // 4)), want)


def test_pad_16x_shapes_and_nibble_order():
    x = torch.randn(100, 200).bfloat16()
    g = nvfp4.global_scale(x)
    q, s = nvfp4.quantize(x, g, pad_16x=True)
    assert q.shape == (112, 104) and s.shape == (128, 16)
    q2, s2 = nvfp4.quantize(x, g, pad_16x=True, hi_first=False)
    assert torch.equal(q2, nvfp4.swap_nibbles(q)) and torch.equal(s2.view(torch.uint8),
                                                                 s.view(torch.uint8))
    with pytest.raises(ValueError):
        nvfp4.quantize(x, g)
    with pytest.raises(TypeError):
        nvfp4.quantize(x.int(), g)
    with pytest.raises(ValueError):
        nvfp4.quantize(x.view(-1), g)


def test_global_scale_is_bf16_rounded_for_every_bf16_value():
    from validators.rung1_adversarial import all_values

    v = all_values(torch.bfloat16)
    v = v[v > 0]
    got = (v / 2688.0).to(torch.float32)  # what global_scale computes, elementwise
    want = round_to_format(v.double() / 2688.0, BF16).float()
    assert torch.equal(got, want)
    x = torch.tensor([[-3.5, 1.0]], dtype=torch.bfloat16)
    assert nvfp4.global_scale(x).item() == round_to_format(torch.tensor(3.5 / 2688), BF16).item()


def test_dequantize_single_and_double_rounding():
    torch.manual_seed(0)
    x = torch.randn(256, 512).bfloat16()
    g = torch.tensor(0.0123457, dtype=torch.float32)  # many significant bits: products inexact
    q, s = nvfp4.quantize(x, g)
    one = nvfp4.dequantize(q, s, g, x.shape, torch.bfloat16)
    two = nvfp4.dequantize(q, s, g, x.shape, torch.bfloat16, mode="eager")
    codes = e2m1_decode(nvfp4.unpack_codes(q), torch.float64)
    sv = e4m3_decode(nvfp4.from_blocked(s.view(torch.uint8), 256, 32)).double()
    exact = codes * (sv * float(g)).float().double().repeat_interleave(16, 1)
    assert torch.equal(one.double(), round_to_format(exact, BF16))
    assert 0 < (one != two).float().mean() < 0.5  # eager rounds twice: some elements differ
    rel = ((one.float() - x.float()).norm() / x.float().norm()).item()
    assert rel < 0.12  # NVFP4's usual ~0.09 relative error on Gaussian data


def test_eager_and_cuda_modes_agree_away_from_ties():
    torch.manual_seed(1)
    x = torch.randn(128, 256).bfloat16()
    g = nvfp4.global_scale(x)
    qc, sc = nvfp4.quantize(x, g)
    qe, se = nvfp4.quantize(x, g, mode="eager")
    assert (qc != qe).float().mean() < 0.01
    assert (sc.view(torch.uint8) != se.view(torch.uint8)).float().mean() < 0.01


@pytest.mark.gpu
@pytest.mark.fast
def test_reference_cuda_equals_cpu():
    from validators.tiles import KINDS, make_tile, tensor_scale_for

    for kind in KINDS:
        x = make_tile(kind, 512, 1024, torch.bfloat16, seed=5)
        g = tensor_scale_for(x)
        qc, sc = nvfp4.quantize(x, g)
        qg, sg = nvfp4.quantize(x.cuda(), g)
        assert torch.equal(qc, qg.cpu()) and torch.equal(sc.view(torch.uint8),
                                                        sg.cpu().view(torch.uint8))


def test_dequantize_refuses_the_issue_cases():
    x = torch.randn(32, 64).bfloat16()
    g = nvfp4.global_scale(x)
    q, s = nvfp4.quantize(x, g)
    cases = {  # each of these returned a wrong tensor or ended in a raw torch error
        "shape": (ValueError, (q, s, g, (48, 64))),  # larger than the data
        "scales": (ValueError, (q, torch.cat([s, s], 1), g, (32, 64))),  # oversized: zeros
        "packed": (TypeError, (q.float(), s, g, (32, 64))),
        "2-D": (ValueError, (q.view(-1), s, g, (32, 64))),
        "dtype": (TypeError, (q, s, g, (32, 64), torch.float64)),
        "empty": (ValueError, (q[:0], s, g, (0, 64))),
    }
    for match, (error, args) in cases.items():
        with pytest.raises(error, match=match):
            nvfp4.dequantize(*args)
    with pytest.raises(ValueError, match="16-padding"):
        nvfp4.dequantize(q, s, g, (16, 64))  # crops real rows, not padding
    with pytest.raises(ValueError, match="shape"):
        nvfp4.dequantize_operand(q, s, (33, 64))


@pytest.mark.parametrize("g,error", [(torch.ones(2), ValueError), (-1.0, ValueError),
                                     (-0.0, ValueError), (math.nan, ValueError),
                                     (math.inf, ValueError), (1e39, ValueError),
                                     (torch.tensor(1), TypeError), (True, TypeError)])
def test_quantize_refuses_what_cannot_be_a_tensor_scale(g, error):
    x = torch.randn(16, 32).bfloat16()
    with pytest.raises(error, match="g"):
        nvfp4.quantize(x, g)
    with pytest.raises(error, match="g"):
        nvfp4.dequantize(*nvfp4.quantize(x, 1.0), g, (16, 32))


def test_nonfinite_g_models_the_kernel_as_rung1_pins_it():
    x = torch.zeros(16, 16, dtype=torch.bfloat16)
    x[0, :2] = torch.tensor([1.0, -2.0])
    for g, scale in ((math.nan, 0x7E), (math.inf, 0x00)):  # validators/rung1_adversarial.py
        q, s = nvfp4.quantize(x, g, nonfinite_g=True)
        assert nvfp4.unpack_codes(q)[0, :2].tolist() == [7, 0xF]  # ±6
        assert int(nvfp4.from_blocked(s.view(torch.uint8), 16, 1)[0, 0]) == scale
