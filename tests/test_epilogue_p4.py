"""P4, the exact epilogue (epilogues/gate_residual.py): the gated residual add fused into P0's
store must be bit-identical to numerics.epilogue.gate_residual of P0's plain output, for every
tile config and split count, on random and adversarial gates and residuals. The reference order
itself (CPU), the instructions (compile) and the bits (GPU)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from epilogues.gate_residual import GateResidualBf16
from kernels.nvfp4.gemm import gemm_nvfp4
from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90, compile_args
from models.nvfp4_linear import Nvfp4Linear
from numerics.epilogue import gate_residual
from validators.gemm_operands import make_operand
from workbench.compile import compile_report


def _bf16(x) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float32).to(torch.bfloat16)


# ---- the reference order (CPU) ---------------------------------------------------------------
def test_reference_is_an_fp32_product_an_fp32_sum_and_one_bf16_rounding():
    """numpy float32 arithmetic (IEEE, denormals kept) on random and adversarial bf16 operands:
    subnormal products, overflow to inf, exact cancellation, ±0."""
    gen = torch.Generator().manual_seed(0)
    n = 1 << 16
    y, gate, res = [(torch.randn(n, generator=gen) * torch.exp2(torch.randint(
        -140, 120, (n,), generator=gen).float())).to(torch.bfloat16) for _ in range(3)]
    res[: n // 4] = (-(gate[: n // 4].float() * y[: n // 4].float())).to(torch.bfloat16)
    y[:8] = _bf16([0.0, -0.0, 3.3895e38, 2**-133, 1.0, 2**-70, -(2**-80), 65504.0])
    gate[:8] = _bf16([-1.0, 0.0, 3.3895e38, 2**-10, -0.0, 2**-79, 2**-69, 2**120])
    f = [t.float().numpy() for t in (y, gate, res)]
    with np.errstate(over="ignore", invalid="ignore"):
        want = torch.from_numpy((f[2] + (f[1] * f[0]).astype(np.float32)).astype(np.float32))
    got = gate_residual(y[None], gate, res[None])[0]
    want = want.to(torch.bfloat16)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


@pytest.mark.parametrize("kw,exc,match", [
    (dict(y=torch.zeros(2, 4)), TypeError, r"y must be a bf16 torch\.Tensor, got torch\.float32"),
    (dict(gate=torch.zeros(3, dtype=torch.bfloat16)), ValueError, r"gate \(3,\)"),
    (dict(residual=torch.zeros(4, 2, dtype=torch.bfloat16)), ValueError, r"residual \(4, 2\)"),
], ids=["dtype", "gate shape", "residual shape"])
def test_reference_refuses_bad_operands(kw, exc, match):
    args = dict(y=torch.zeros(2, 4, dtype=torch.bfloat16),
                gate=torch.zeros(4, dtype=torch.bfloat16),
                residual=torch.zeros(2, 4, dtype=torch.bfloat16))
    args.update(kw)
    with pytest.raises(exc, match=match):
        gate_residual(**args)


# ---- compile (CI) ----------------------------------------------------------------------------
F16_BUILDS = {"swap-s3": lambda: BlockscaledGemmSm90.swap_ab_f16(splits=3),
              "wide": lambda: BlockscaledGemmSm90.wide_f16()}


@pytest.mark.compile
@pytest.mark.parametrize("build", F16_BUILDS)
def test_p4_f16_build_has_two_separate_roundings_per_element(build):
    plain = F16_BUILDS[build]()
    p4 = plain.with_output(GateResidualBf16())
    assert p4.static_key() != plain.static_key()
    r0, r = (compile_report(c, *compile_args()) for c in (plain, p4))
    per_thread = plain.tile_m * plain.tile_n // 256  # accumulators of one consumer thread
    assert r.ptx.count("mul.rn.f32") == per_thread and r.ptx.count("add.rn.f32") == per_thread
    assert "fma.rn.f32" not in r.ptx, "the gate multiply and residual add must not fuse"
    cvt = "cvt.rn.bf16x2.f32"
    assert r.ptx.count(cvt) == 2 * r0.ptx.count(cvt), "y's rounding, then the output's"
    assert r.census["wgmma.mma_async"] == r0.census["wgmma.mma_async"]
    assert r.frame_bytes == 0 and r.registers <= 232
    if r.sass is not None:
        assert r.spill_bytes == 0


# ---- GPU -------------------------------------------------------------------------------------
def _operands(M, N, K, seed):
    return make_operand("normal", M, K, seed, "cuda"), make_operand("lognormal", N, K, seed + 1,
                                                                     "cuda")


def _vectors(kind: str, y: torch.Tensor, seed: int):
    """(gate [N], residual [M, N]) of one adversarial kind, bf16 on y's device."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    M, N = y.shape
    gate = (0.2 * torch.randn(N, generator=gen, device="cuda")).to(torch.bfloat16)
    res = (3.0 * torch.randn(M, N, generator=gen, device="cuda")).to(torch.bfloat16)
    if kind == "cancel":  # residual = -RN(gate·y): sums of exactly 0 and of one rounding error
        res = (-(gate.float() * y.float())).to(torch.bfloat16)
    elif kind == "extremes":  # bf16 max, subnormals, ±0 and inf in both operands
        pool = _bf16([3.3895e38, -3.3895e38, 2**-133, -(2**-130), 0.0, -0.0, float("inf"),
                      1e-38, 65504.0, 1.0])
        pick = torch.randint(0, len(pool), (N,), generator=gen, device="cuda")
        gate = torch.where(torch.rand(N, generator=gen, device="cuda") < 0.5, gate,
                           pool.cuda()[pick])
        pick = torch.randint(0, len(pool), (M, N), generator=gen, device="cuda")
        res = torch.where(torch.rand(M, N, generator=gen, device="cuda") < 0.5, res,
                          pool.cuda()[pick])
    elif kind == "nan":  # NaN in the residual and the gate: the output is NaN there
        res = res.clone()
        res[0, : min(N, 8)] = float("nan")
        gate = gate.clone()
        gate[-1] = float("nan")
    return gate, res


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit-identical, NaN compared as NaN (payloads are not part of the contract)."""
    nan = torch.isnan(want)
    return bool(torch.equal(torch.isnan(got), nan)) and torch.equal(
        got[~nan].view(torch.int16), want[~nan].view(torch.int16))


def _fused_equals_reference_order(M, N, K, seed, kind, config=None, in_place=False):
    a, b = _operands(M, N, K, seed)
    y = gemm_nvfp4(*a, *b, config=config)
    gate, res = _vectors(kind, y, seed)
    want = gate_residual(y, gate, res)
    if in_place:
        out = res.clone()
        got = gemm_nvfp4(*a, *b, out=out, gate=gate, residual=out, config=config)
        assert got.data_ptr() == out.data_ptr()
    else:
        got = torch.full_like(y, float("nan"))  # poison
        gemm_nvfp4(*a, *b, out=got, gate=gate, residual=res, config=config)
    assert _same(got, want), (f"{int((got.view(torch.int16) != want.view(torch.int16)).sum())} "
                              f"of {got.numel()} differ ({kind}, {M}x{N}x{K})")
    again = gemm_nvfp4(*a, *b, gate=gate, residual=res, config=config)
    assert _same(again, got), "a rerun differs"


@pytest.mark.gpu
@pytest.mark.fast
def test_p4_fused_equals_reference_order_default_config():
    _fused_equals_reference_order(130, 264, 96, seed=4, kind="random")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["random", "cancel", "extremes", "nan"])
@pytest.mark.parametrize("build,splits", [("wide", 1), ("swap", 1), ("swap", 3)])
def test_p4_fused_equals_reference_order(kind, build, splits):
    cfg = (BlockscaledGemmSm90.wide_f16() if build == "wide" else
           BlockscaledGemmSm90.swap_ab_f16(splits=splits))
    _fused_equals_reference_order(300, 520, 1056, seed=cfg.tile_m + splits, kind=kind,
                                  config=cfg)


@pytest.mark.gpu
def test_p4_in_place_residual_and_row_slices():
    _fused_equals_reference_order(256, 1024, 512, seed=9, kind="random", in_place=True)
    M, N, K = 700, 256, 512
    a, b = _operands(M, N, K, seed=12)
    y = gemm_nvfp4(*a, *b)
    gate, res = _vectors("random", y, 12)
    full = gemm_nvfp4(*a, *b, gate=gate, residual=res)
    for r0, r1 in ((128, 700), (256, 257)):
        part = gemm_nvfp4(*a, *b, rows=(r0, r1), gate=gate, residual=res[r0:r1])
        assert torch.equal(part.view(torch.int16), full[r0:r1].view(torch.int16)), (r0, r1)


@pytest.mark.gpu
@settings(max_examples=12, deadline=None)
@given(M=st.integers(1, 400), n8=st.integers(1, 64), k32=st.integers(1, 24),
       kind=st.sampled_from(["random", "cancel", "extremes"]), seed=st.integers(0, 2**20))
def test_p4_drawn_shapes(M, n8, k32, kind, seed):
    _fused_equals_reference_order(M, 8 * n8, 32 * k32, seed, kind)


@pytest.mark.gpu
def test_nvfp4_linear_p0_fused_equals_its_plain_output_then_the_reference_order():
    gen = torch.Generator().manual_seed(5)
    w = (torch.randn(384, 256, generator=gen) / 16).to(torch.bfloat16)
    x = torch.randn(200, 256, generator=gen).to(torch.bfloat16).cuda()
    lin = Nvfp4Linear(w, backend="p0", role="out")
    gate, res = _vectors("random", lin(x), 5)
    assert torch.equal(lin(x, gate=gate, residual=res).view(torch.int16),
                       gate_residual(lin(x), gate, res).view(torch.int16))
