"""The CuTe DSL NVFP4 quantize kernel: offline compile checks and bit-exactness on the GPU."""
import pytest
import torch

from numerics import nvfp4


@pytest.mark.compile
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_quantize_compiles_with_the_instructions_we_meant(dtype):
    from kernels import quantize_nvfp4 as Q
    from workbench.compile import compile_report

    r = compile_report(Q.QuantizeNvfp4Kernel(), *Q.compile_args(dtype), arch="sm_90a")
    assert r.census["ld.global.v4"] >= 2, "16-byte loads of each block"
    assert r.census["rcp.approx.ftz.f32"] >= 2 and r.census["cvt.e4m3x2"] >= 1
    assert "st.global.v2.b32" in r.ptx, "packed bytes stored 8 at a time"
    assert r.spill_bytes == 0
    assert r.registers <= 64, f"{r.registers} registers limit occupancy"


@pytest.mark.compile
def test_rcp_probe_compiles():
    from kernels import rcp_probe
    from workbench.compile import compile_report

    r = compile_report(rcp_probe.RcpProbe(), *rcp_probe.compile_args())
    assert r.census["rcp.approx.ftz.f32"] == 1 and r.spill_bytes == 0


def _ref(x, g, pad):
    return nvfp4.quantize(x, g, pad_16x=pad)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["normal", "lognormal", "ties", "special"])
@pytest.mark.parametrize("shape", [(16, 16), (48, 16 * 37), (300, 512), (2048, 5376)])
def test_kernel_is_bit_exact(kind, shape):
    from kernels.quantize_nvfp4 import quantize_nvfp4
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
    from kernels.quantize_nvfp4 import quantize_nvfp4
    from validators import rung1_adversarial

    r = rung1_adversarial.run(quick=True, device="cuda", quantize=lambda x, g: quantize_nvfp4(
        x, torch.tensor([float(g)], dtype=torch.float32, device="cuda")))
    assert r.status == "pass", {k: v for k, v in r.checks.items() if not v["pass"]}


@pytest.mark.gpu
def test_into_buffers_at_row_offset_touches_nothing_else():
    from kernels.quantize_nvfp4 import quantize_nvfp4

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
    from kernels.quantize_nvfp4 import quantize_nvfp4

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
def test_rcp_probe_matches_shipped_table_on_a_slice():
    from kernels.rcp_probe import rcp_approx_device
    from numerics.rcp import rcp_approx

    m = torch.arange(0, 1 << 23, 97, dtype=torch.int32, device="cuda")
    x = ((127 << 23) | m).view(torch.float32)
    assert torch.equal(rcp_approx_device(x).view(torch.int32), rcp_approx(x).view(torch.int32))
