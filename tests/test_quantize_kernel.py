"""The CuTe DSL NVFP4 quantize kernel: offline compile checks and bit-exactness on the GPU."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from numerics import nvfp4


@pytest.mark.compile
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_quantize_compiles_with_the_instructions_we_meant(dtype):
    from kernels.nvfp4 import quantize as Q
    from workbench.compile import compile_report

    r = compile_report(Q.QuantizeNvfp4Kernel(str(dtype)[6:]), *Q.compile_args(), arch="sm_90a")
    assert r.census["ld.global.v4"] >= 2, "16-byte loads of each block"
    assert r.census["rcp.approx.ftz.f32"] >= 2 and r.census["cvt.e4m3x2"] >= 1
    assert "st.global.v2.b32" in r.ptx, "packed bytes stored 8 at a time"
    assert r.spill_bytes == 0
    assert r.registers <= 64, f"{r.registers} registers limit occupancy"


@pytest.mark.compile
def test_quantize_expand_compiles_with_the_f16_stores():
    """The expanding variant: the same quantizer, plus per block one scale convert, 8 code
    converts and two 16-byte f16 stores (2 rows a thread: 4); no spill, <= 64 registers."""
    from kernels.nvfp4 import quantize as Q
    from workbench.compile import compile_report

    r = compile_report(Q.QuantizeExpandNvfp4Kernel(), *Q.ENTRY_F16.compile_args(ffi=False),
                       arch="sm_90a")
    assert r.census["st.global.v4"] == 4
    assert r.ptx.count("cvt.rn.f16x2.e4m3x2") == 2 * (1 + 1 + 8)
    assert r.spill_bytes == 0 and r.registers <= 64


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["normal", "lognormal", "ties", "special"])
@pytest.mark.parametrize("shape", [(16, 16), (48, 16 * 37), (300, 512), (2048, 5376)])
def test_quantize_expand_writes_the_exact_f16_expansion(kind, shape):
    """Packed bytes and scales as quantize_nvfp4's; the f16 tensor equals
    numerics.nvfp4.dequantize(q, s, 1.0, dtype=float16) bit for bit (NaN where it has NaN)."""
    from kernels.nvfp4.quantize import quantize_expand_nvfp4, quantize_nvfp4
    from validators.tiles import make_tile, tensor_scale_for

    M, K = shape
    x = make_tile(kind, M, K, torch.bfloat16, seed=M + K + 1, device="cuda")
    g = torch.tensor([tensor_scale_for(x)], device="cuda")
    q, s, f16 = quantize_expand_nvfp4(x, g, pad_16x=True)
    q0, s0 = quantize_nvfp4(x, g, pad_16x=True)
    assert torch.equal(q, q0) and torch.equal(s.view(torch.uint8), s0.view(torch.uint8))
    want = nvfp4.dequantize(q, s, 1.0, (M, K), dtype=torch.float16)
    nan = want.isnan()
    assert torch.equal(f16.isnan(), nan)
    assert torch.equal(f16[~nan].view(torch.int16), want[~nan].view(torch.int16))


@pytest.mark.compile
def test_expand_compiles_with_the_f16_stores():
    """expand_nvfp4's kernel: per block one 8-byte code load, one scale byte, one scale convert,
    8 code converts and two 16-byte f16 stores (2 rows a thread); no spill, <= 64 registers."""
    from kernels.nvfp4 import quantize as Q
    from workbench.compile import compile_report

    r = compile_report(Q.EXPAND, *Q.ENTRY_EXPAND.compile_args(ffi=False), arch="sm_90a")
    assert r.census["st.global.v4"] == 4
    assert r.ptx.count("ld.global.v2.u32") + r.ptx.count("ld.global.v2.b32") == 2
    assert r.ptx.count("cvt.rn.f16x2.e4m3x2") == 2 * (1 + 8)
    assert r.spill_bytes == 0 and r.registers <= 64


def _expand_reference(q, s):
    """numerics.nvfp4.dequantize at g = 1 in f16 on the CPU: e2m1 · s, one exact product."""
    M, K = q.shape[0], 2 * q.shape[1]
    return nvfp4.dequantize(q.cpu(), s.cpu(), 1.0, (M, K), dtype=torch.float16)


def _assert_same_f16(got, want):
    """Bit equality, NaN where the reference has NaN (a NaN-poisoned out must be overwritten)."""
    got = got.cpu()
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), f"{int((got.isnan() != nan).sum())} NaN mismatches"
    bad = (got[~nan].view(torch.int16) != want[~nan].view(torch.int16)).sum()
    assert int(bad) == 0, f"{int(bad)} f16 values differ"


def _random_codes(M, K, seed, nan_scales=False):
    """Every code byte, scale bytes over the whole E4M3 range but NaN (0x7F / 0xFF: then some
    too), in the swizzled shape; on the GPU."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 256, (M, K // 2), generator=gen, dtype=torch.int32).to(torch.uint8)
    s = torch.randint(0, 0x7F, nvfp4.scale_shape(M, K), generator=gen, dtype=torch.int32)
    s = s | (torch.randint(0, 2, s.shape, generator=gen, dtype=torch.int32) << 7)  # signs
    if nan_scales:
        s[torch.rand(s.shape, generator=gen) < 0.05] = 0x7F
    return q.cuda(), s.to(torch.uint8).view(torch.float8_e4m3fn).cuda()


def test_expand_reference_is_the_exact_product_on_every_code_and_scale():
    """The CPU reference the GPU tests hold expand_nvfp4 to: every code byte against every
    scale byte (signed zeros, subnormal scales, 448, NaN), e2m1 x s exactly, in f16 (no
    rounding: every finite product an f16 normal or zero)."""
    from numerics.formats import e2m1_decode, e4m3_decode
    q = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(256, 8)  # [256, 2048]
    s8 = torch.arange(256, dtype=torch.int32).to(torch.uint8)  # row r: scale byte r
    blocks = s8.view(-1, 1).expand(256, 4096 // 16)
    s = nvfp4.to_blocked(blocks).view(torch.float8_e4m3fn)
    got = _expand_reference(q, s)
    exact = (e2m1_decode(nvfp4.unpack_codes(q), torch.float64)
             * e4m3_decode(s8).double().view(-1, 1))
    nan = exact.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].double(), exact[~nan])
    assert torch.equal(got[~nan].signbit(), exact[~nan].signbit())


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["normal", "lognormal", "ties", "special"])
@pytest.mark.parametrize("shape", [(16, 16), (48, 16 * 37), (300, 512), (2048, 5376)])
def test_expand_equals_quantize_expand_and_the_reference(kind, shape):
    """expand_nvfp4 of quantize_nvfp4's codes: quantize_expand_nvfp4's f16 bit for bit, and
    the CPU reference (numerics.nvfp4.dequantize at g = 1)."""
    from kernels.nvfp4.quantize import expand_nvfp4, quantize_expand_nvfp4
    from validators.tiles import make_tile, tensor_scale_for

    M, K = shape
    x = make_tile(kind, M, K, torch.bfloat16, seed=M + K + 2, device="cuda")
    g = torch.tensor([tensor_scale_for(x)], device="cuda")
    q, s, f16 = quantize_expand_nvfp4(x, g, pad_16x=True)
    got = expand_nvfp4(q, s)
    assert got.dtype == torch.float16 and tuple(got.shape) == (q.shape[0], K)
    _assert_same_f16(got[:M], f16.cpu())
    _assert_same_f16(got, _expand_reference(q, s))


@pytest.mark.gpu
@pytest.mark.parametrize("nan_scales", [False, True])
@pytest.mark.parametrize("shape", [(1, 16), (129, 48), (256, 5376)])
def test_expand_adversarial_codes_into_a_poisoned_out(shape, nan_scales):
    """Every code byte and scale byte (signed zeros, subnormal scales, 448, NaN scales), into a
    NaN-poisoned caller-owned out: the reference's bits everywhere."""
    from kernels.nvfp4.quantize import expand_nvfp4

    M, K = shape
    q, s = _random_codes(M, K, seed=M * 7 + K, nan_scales=nan_scales)
    out = torch.full((M, K), float("nan"), dtype=torch.float16, device="cuda")
    assert expand_nvfp4(q, s.view(torch.uint8), out=out) is out
    _assert_same_f16(out, _expand_reference(q, s))


@pytest.mark.gpu
@given(rows=st.integers(1, 700), kb=st.integers(1, 80), seed=st.integers(0, 2**30))
def test_expand_matches_the_reference_on_drawn_shapes(rows, kb, seed):
    """Hypothesis shapes (rows across scale tiles, K = 16 kb across padded scale columns), a
    NaN-poisoned out: every element written, the reference's bits."""
    from kernels.nvfp4.quantize import expand_nvfp4

    K = 16 * kb
    q, s = _random_codes(rows, K, seed)
    out = torch.full((rows, K), float("nan"), dtype=torch.float16, device="cuda")
    expand_nvfp4(q, s, out=out)
    _assert_same_f16(out, _expand_reference(q, s))


@pytest.mark.gpu
def test_expand_rejects_bad_input_before_launch():
    from kernels.nvfp4.quantize import expand_nvfp4

    q, s = _random_codes(128, 64, seed=1)
    poison = torch.full((128, 64), float("nan"), dtype=torch.float16, device="cuda")
    bad = [((q.float(), s), {}, TypeError, "a_q has dtype"),
           ((q[:, :4].contiguous(), s), {}, ValueError, "K a positive multiple of 16"),
           ((q.view(-1), s), {}, ValueError, "2-D"),
           ((q, s[:, :1].contiguous()), {}, ValueError, "swizzled scale shape"),
           ((q, s[:, :1]), {}, ValueError, "contiguous"),
           ((q, s.float()), {}, TypeError, "a_s has dtype"),
           ((q.cpu(), s), {}, ValueError, "CUDA"),
           ((q, s), {"out": poison[:, :32].clone()}, ValueError, "float16 \\[128, 64\\]"),
           ((q, s), {"out": poison.to(torch.bfloat16)}, TypeError, "out has dtype"),
           ((q, s), {"out": poison.t()}, ValueError, "contiguous")]
    for args, kw, exc, match in bad:
        with pytest.raises(exc, match=match):
            expand_nvfp4(*args, **kw)
    assert poison.isnan().all(), "a refused call launched"


@pytest.mark.compile
def test_rcp_probe_compiles():
    from kernels.nvfp4 import rcp_probe
    from workbench.compile import compile_report

    r = compile_report(rcp_probe.RcpProbe(), *rcp_probe.compile_args())
    assert r.census["rcp.approx.ftz.f32"] == 1 and r.spill_bytes == 0


def _ref(x, g, pad):
    return nvfp4.quantize(x, g, pad_16x=pad)


@pytest.mark.gpu
@pytest.mark.fast
@pytest.mark.parametrize("kind", ["normal", "lognormal", "ties", "special"])
@pytest.mark.parametrize("shape", [(16, 16), (48, 16 * 37), (300, 512), (2048, 5376)])
def test_kernel_is_bit_exact(kind, shape):
    from kernels.nvfp4.quantize import quantize_nvfp4
    from validators.tiles import make_tile, tensor_scale_for

    M, K = shape
    x = make_tile(kind, M, K, torch.bfloat16, seed=M + K, device="cuda")
    g = tensor_scale_for(x)
    q, s = quantize_nvfp4(x, torch.tensor([g], device="cuda"), pad_16x=True)
    qr, sr = _ref(x, g, True)
    assert torch.equal(q, qr)
    assert torch.equal(s.view(torch.uint8), sr.view(torch.uint8))


@pytest.mark.gpu
def test_kernel_fp16_and_rung1_cases():
    from kernels.nvfp4.quantize import quantize_nvfp4
    from validators import rung1_adversarial

    r = rung1_adversarial.run(quick=True, device="cuda", quantize=lambda x, g: quantize_nvfp4(
        x, torch.tensor([float(g)], dtype=torch.float32, device="cuda")))
    assert r.status == "pass", {k: v for k, v in r.checks.items() if not v["pass"]}


@pytest.mark.gpu
def test_into_buffers_at_row_offset_touches_nothing_else():
    from kernels.nvfp4.quantize import quantize_nvfp4

    M, K, off = 64, 256, 32
    x = torch.randn(M, K, device="cuda").bfloat16()
    g = nvfp4.global_scale(x).reshape(1)
    q = torch.full((off + M + 16, K // 2), 0xAB, dtype=torch.uint8, device="cuda")
    s = torch.full(nvfp4.scale_shape(off + M + 16, K), 0xCD, dtype=torch.uint8, device="cuda")
    quantize_nvfp4(x, g, out=(q, s), row_offset=off)
    qr, sr = nvfp4.quantize(x, g)
    assert torch.equal(q[off:off + M], qr)
    assert (q[:off] == 0xAB).all() and (q[off + M:] == 0xAB).all()
    sv = nvfp4.from_blocked(s, s.shape[0], K // 16)
    assert torch.equal(sv[off:off + M], nvfp4.from_blocked(sr.view(torch.uint8), M, K // 16))
    assert (sv[:off] == 0xCD).all() and (sv[off + M:] == 0xCD).all()


@pytest.mark.gpu
def test_kernel_rejects_bad_input_before_launch():
    from kernels.nvfp4.quantize import quantize_nvfp4

    g = torch.ones(1, device="cuda")
    x = torch.randn(32, 64, device="cuda").bfloat16()
    with pytest.raises(TypeError):
        quantize_nvfp4(x.float(), g)
    with pytest.raises(ValueError):
        quantize_nvfp4(x[:, :40].contiguous(), g)  # K % 16
    with pytest.raises(ValueError):
        quantize_nvfp4(x.cpu(), g)
    with pytest.raises(ValueError):
        quantize_nvfp4(x[:30], g)  # M % 16 without pad_16x
    with pytest.raises(ValueError):
        quantize_nvfp4(x, g, out=(torch.zeros(8, 32, dtype=torch.uint8, device="cuda"),
                                  torch.zeros(128, 4, dtype=torch.uint8, device="cuda")))


@pytest.mark.gpu
def test_shipped_rcp_table_equals_the_hardware():
    from kernels.nvfp4.rcp_probe import rcp_approx_device
    from numerics.rcp import rcp_approx

    m = torch.arange(0, 1 << 23, dtype=torch.int32, device="cuda")  # every mantissa
    x = ((127 << 23) | m).view(torch.float32)
    assert torch.equal(rcp_approx_device(x).view(torch.int32), rcp_approx(x).view(torch.int32))


def _e2m1_fast_model(v: torch.Tensor) -> torch.Tensor:
    """The fast path's arithmetic (device/{ptx,rounding,nvfp4}.py::_E2M1_FAST), modelled exactly."""
    from numerics.formats import FP32, round_to_format

    b = v.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    a_bits = b & 0x7FFFFFFF
    e = torch.clamp(a_bits >> 23, 127, 129)
    m = ((255 - e) << 23).to(torch.int32).view(torch.float32).to(torch.float64)
    a = a_bits.to(torch.int32).view(torch.float32).to(torch.float64)
    r = round_to_format(a * m + 12582658.0, FP32)  # FFMA: one rounding of the exact a*m + C'
    r_bits = r.to(torch.float32).view(torch.int32).to(torch.int64)
    c = torch.clamp(r_bits + 2 * e, max=0x4B400007) & 7
    return (c | ((b >> 28) & 8)).to(torch.uint8)


def test_fast_e2m1_path_equals_the_reference_encoder():
    from numerics.formats import e2m1_encode

    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 2.0, 4.0, 6.0, 7.0, 1.0, 0.5])
    near = torch.cat([ties, torch.nextafter(ties, torch.zeros_like(ties)),
                      torch.nextafter(ties, torch.full_like(ties, 100.0))])
    rnd = torch.rand(2_000_000, generator=torch.Generator().manual_seed(0)) * 8
    wide = torch.exp2(torch.linspace(-126, 127, 50_000))
    v = torch.cat([near, rnd, wide, torch.tensor([0.0, float("inf"), 3e38, 1e-30])])
    v = torch.cat([v, -v]).to(torch.float32)
    assert torch.equal(_e2m1_fast_model(v), e2m1_encode(v))


@pytest.mark.gpu
@given(kind=st.sampled_from(["normal", "lognormal", "ties", "special"]),
       dtype=st.sampled_from([torch.bfloat16, torch.float16]), rows=st.integers(1, 512),
       kb=st.integers(1, 128), seed=st.integers(0, 2**30), pad=st.booleans())
def test_kernel_matches_reference_on_drawn_tiles(kind, dtype, rows, kb, seed, pad):
    """Rung 2 on the GPU, hypothesis-driven: the `ci` profile draws 40 tiles, `deep`
    (HYPOTHESIS_PROFILE=deep) 2000 tiles, tens of millions of 16-element blocks."""
    from kernels.nvfp4.quantize import quantize_nvfp4
    from validators.tiles import make_tile, tensor_scale_for

    rows = rows if pad else -(-rows // 16) * 16
    x = make_tile(kind, rows, 16 * kb, dtype, seed, device="cuda")
    g = tensor_scale_for(x)
    q, s = quantize_nvfp4(x, torch.tensor([g], device="cuda"), pad_16x=pad)
    qr, sr = nvfp4.quantize(x, g, pad_16x=pad)
    assert torch.equal(q, qr), f"{int((q != qr).sum())} packed bytes differ"
    assert torch.equal(s.view(torch.uint8), sr.view(torch.uint8))
