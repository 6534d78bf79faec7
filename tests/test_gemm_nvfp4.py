"""P0 block-scaled NVFP4 GEMM: the dequant bit trick (CPU), compile checks (CI), exactness (GPU)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from numerics import gemm_oracle as G
from numerics.formats import e2m1_decode, e4m3_decode


def _e2m1_as_e4m3(nibble: int) -> int:
    """CPU model of kernels.nvfp4_device.e2m1_bytes_as_e4m3 on a nibble in bits 4-7."""
    w = nibble << 4
    return (w & 0x80) | ((w >> 2) & 0x1C)


def test_dequant_bit_trick_is_exact():
    codes = torch.arange(16, dtype=torch.uint8)
    e4 = torch.tensor([_e2m1_as_e4m3(c) for c in range(16)], dtype=torch.uint8)
    assert torch.equal(e4m3_decode(e4).double() * 64, e2m1_decode(codes, torch.float64))
    # x 64·scale in f16: 64·s exact, and every product exact and normal (or zero) in f16
    s = e4m3_decode(torch.arange(0x7F, dtype=torch.uint8)).double()
    s64 = (s * 64).to(torch.float16)
    assert torch.equal(s64.double(), s * 64)
    prod = (e4m3_decode(e4).double().view(-1, 1) * s64.double().view(1, -1))
    f16 = prod.to(torch.float16).double()
    assert torch.equal(f16, prod)
    nz = prod[prod != 0].abs()
    assert nz.min() >= 2.0**-14 and nz.max() <= 65504


def test_odd_nibble_path_shifts_into_place():
    # odd elements sit in the low nibble; `w << 4` moves them to bits 4-7 of the same byte
    for byte in range(256):
        lo = byte & 0xF
        assert (((byte << 4) & 0xF0) >> 4) == lo


@pytest.mark.compile
@pytest.mark.parametrize("tile_m,tile_n,stages,buffers,splits", [
    (128, 256, 4, 3, 1), (128, 128, 8, 3, 1), (256, 128, 4, 3, 1), (128, 256, 2, 4, 1),
    (128, 128, 8, 3, 3)])
def test_p0_compiles_with_the_instructions_we_meant(tile_m, tile_n, stages, buffers, splits):
    from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90, compile_args
    from workbench.compile import compile_report

    r = compile_report(BlockscaledGemmSm90(tile_n=tile_n, stages=stages, tile_m=tile_m,
                                           buffers=buffers, splits=splits), *compile_args())
    # split-K: one acq_rel arrival per tile, partials read back coherently
    assert r.census["atom"] == (1 if splits > 1 else 0)
    assert ("ld.relaxed.gpu" in r.ptx) == (splits > 1)
    assert r.census["wgmma.mma_async"] == 4 * tile_m // 128, "4 k16 per 64-row slab and k-block"
    assert f"m64n{tile_n}k16.f32.f16.f16" in r.ptx
    assert r.census["cp.async.bulk.tensor"] == 4, "TMA for codes A, B and scales A, B"
    assert r.census["setmaxnreg"] == 2 and r.census["fence.proxy.async"] >= 1
    assert r.ptx.count("cvt.rn.f16x2.e4m3x2") >= 16 and "ld.shared.v4" in r.ptx
    assert r.ptx.count("st.shared.v4") >= 4 and "st.global.b32" in r.ptx
    assert r.sass and r.spill_bytes == 0
    # no call in the kernel: ptxas would serialise every wgmma (a DEPBAR after each HGMMA)
    assert "CALL.ABS" not in r.sass and r.sass.count("WARPGROUP.DEPBAR") <= 2
    assert f"WARPGROUP.DEPBAR.LE gsb0, {buffers - 2:#x}" in r.sass, "wgmma groups in flight"
    assert r.registers <= 232
    if r.sass:
        assert f"HGMMA.64x{tile_n}x16.F32" in r.sass


# ---- GPU ------------------------------------------------------------------------------------
def _operands(kind_a, kind_b, M, N, K, seed):
    from validators.gemm_operands import make_operand

    a = make_operand(kind_a, M, K, seed, "cuda")
    b = make_operand(kind_b, N, K, seed + 1, "cuda")
    return a, b


def _check(out, a, b, M, N, K, row_ids=None):
    (aq, as_, ga), (bq, bs, gb) = a, b
    d, real, bound = G.reference_gemm(aq, as_, bq, bs, ga, gb, M, N, K, row_ids=row_ids)
    got = out.double() if row_ids is None else out[row_ids.to(out.device)].double()
    err = (got - real).abs()
    bad = ~(err <= bound)
    assert not bad.any(), (f"{int(bad.sum())} of {bad.numel()} elements outside the fp32 bound; "
                           f"first at {bad.nonzero()[0].tolist()}")
    return float((got == d.double()).float().mean())


@pytest.mark.gpu
@pytest.mark.parametrize("kinds", [("normal", "normal"), ("lognormal", "normal"), ("raw", "raw"),
                                   ("cancel", "cancel")])
@pytest.mark.parametrize("shape", [(1, 8, 32), (130, 264, 96), (300, 520, 1056),
                                   (256, 1024, 5376)])
@pytest.mark.parametrize("tile", [(128, 128, 3, 1), (128, 256, 3, 1), (256, 128, 3, 1),
                                  (128, 256, 4, 1), (128, 128, 4, 1), (128, 128, 3, 3),
                                  (128, 256, 3, 2)])
def test_p0_within_fp32_bound_and_deterministic(kinds, shape, tile):
    from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90
    from kernels.nvfp4.gemm import gemm_nvfp4

    M, N, K = shape
    a, b = _operands(*kinds, M, N, K, seed=M * 7 + N + K + tile[1] + tile[0] // 2)
    cfg = BlockscaledGemmSm90(tile_m=tile[0], tile_n=tile[1], buffers=tile[2], splits=tile[3],
                              stages=2 if tile[2] == 4 and tile[1] == 256 else 4)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")  # poison
    gemm_nvfp4(*a, *b, out=out, config=cfg)
    _check(out, a, b, M, N, K)
    again = gemm_nvfp4(*a, *b, config=cfg)
    assert torch.equal(out.view(torch.int16), again.view(torch.int16)), "two runs differ"


@pytest.mark.gpu
def test_p0_row_slices_without_copy():
    from kernels.nvfp4.gemm import gemm_nvfp4

    M, N, K = 700, 256, 512
    a, b = _operands("normal", "lognormal", M, N, K, seed=11)
    full = gemm_nvfp4(*a, *b)
    for r0, r1 in ((0, 128), (128, 700), (256, 257), (512, 700)):
        part = torch.full((r1 - r0, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        gemm_nvfp4(*a, *b, rows=(r0, r1), out=part)
        assert torch.equal(part.view(torch.int16), full[r0:r1].view(torch.int16)), (r0, r1)


@pytest.mark.gpu
@pytest.mark.parametrize("N,K", [(21504, 5376), (5376, 5376), (14336, 5376), (5376, 14336)])
@pytest.mark.parametrize("M", [128, 2048])
def test_p0_h3_projection_shapes(M, N, K):
    from kernels.nvfp4.gemm import gemm_nvfp4

    a, b = _operands("normal", "normal", M, N, K, seed=M + N + K)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_nvfp4(*a, *b, out=out)
    assert not torch.isnan(out).any(), "unwritten (poisoned) elements remain"
    rows = torch.randperm(M, generator=torch.Generator().manual_seed(M))[:128].sort().values
    _check(out, a, b, M, N, K, row_ids=rows.cuda())


@pytest.mark.gpu
@settings(max_examples=25, deadline=None)
@given(M=st.integers(1, 600), n8=st.integers(1, 80), k32=st.integers(1, 40),
       kinds=st.sampled_from([("normal", "normal"), ("raw", "raw"), ("lognormal", "cancel")]),
       seed=st.integers(0, 2**31 - 1))
def test_p0_drawn_shapes(M, n8, k32, kinds, seed):
    from kernels.nvfp4.gemm import gemm_nvfp4

    N, K = 8 * n8, 32 * k32
    a, b = _operands(*kinds, M, N, K, seed)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_nvfp4(*a, *b, out=out)
    _check(out, a, b, M, N, K)


@pytest.mark.gpu
def test_p0_rejects_bad_input_before_launch():
    from kernels.nvfp4.gemm import gemm_nvfp4

    a, b = _operands("normal", "normal", 128, 256, 256, seed=3)
    (aq, as_, ga), (bq, bs, gb) = a, b
    cases = {
        "dtype": ((aq.float(), as_, ga, bq, bs, gb), {}),
        "K mismatch": ((aq[:, :64].contiguous(), as_[:, :8].contiguous(), ga, bq, bs, gb), {}),
        "K multiple of 32": ((aq[:, :8].contiguous(), as_[:, :4].contiguous(), ga,
                              bq[:, :8].contiguous(), bs[:, :4].contiguous(), gb), {}),
        "scale shape": ((aq, as_[:, :4].contiguous(), ga, bq, bs, gb), {}),
        "device": ((aq.cpu(), as_, ga, bq, bs, gb), {}),
        "contiguous": ((aq, as_, ga, bq.t().contiguous().t(), bs, gb), {}),
        "rows start": ((aq, as_, ga, bq, bs, gb), {"rows": (64, 128)}),
        "rows range": ((aq, as_, ga, bq, bs, gb), {"rows": (0, 129)}),
        "out shape": ((aq, as_, ga, bq, bs, gb),
                      {"out": torch.empty(128, 255, dtype=torch.bfloat16, device="cuda")}),
        "out dtype": ((aq, as_, ga, bq, bs, gb),
                      {"out": torch.empty(128, 256, dtype=torch.float16, device="cuda")}),
        "g": ((aq, as_, torch.ones(2, device="cuda"), bq, bs, gb), {}),
        "N multiple of 8": ((aq, as_, ga, bq[:4].contiguous(), bs, gb), {}),
    }
    for name, (args, kw) in cases.items():
        with pytest.raises((ValueError, TypeError)):
            gemm_nvfp4(*args, **kw)
        torch.cuda.synchronize()


_STALL = """
import torch
from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90
from kernels.nvfp4.gemm import gemm_nvfp4
from kernels.device.waits import synchronize
from validators.gemm_operands import make_operand
a = make_operand("normal", 128, 256, 1, "cuda")
b = make_operand("normal", 256, 256, 2, "cuda")
gemm_nvfp4(*a, *b, config=BlockscaledGemmSm90(tile_n=128, ablate="stall_producer"))
synchronize()
"""


@pytest.mark.gpu
def test_p0_stalled_barrier_traps_with_a_message_naming_it():
    """A wait that can never complete must end the kernel (not hang) and say which barrier."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", _STALL], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode != 0
    assert "timed out after 2 s waiting on the" in r.stderr and "barrier (stage" in r.stderr, \
        r.stderr[-2000:]


@pytest.mark.compile
def test_default_config_matches_the_h200_measurements():
    from kernels.nvfp4.gemm import default_config

    def pick(M, N, K):
        c = default_config(M, N, K, sms=132)
        return c.tile_n, c.splits

    assert pick(128, 5376, 5376) == (128, 3) and pick(128, 5376, 14336) == (128, 3)  # out, fc2
    assert pick(128, 21504, 5376) == (128, 1) and pick(128, 14336, 5376) == (128, 1)  # qkv, fc1
    assert pick(2048, 21504, 5376) == (256, 1) and pick(37810, 5376, 14336) == (256, 1)


@pytest.mark.compile
@pytest.mark.parametrize("tile_m,tile_n,buffers", [(128, 256, 3), (256, 128, 3), (128, 128, 4)])
def test_f16_smem_layout_is_the_swizzle_the_dequant_writes(tile_m, tile_n, buffers):
    """dequant_rows writes 16-byte chunk c of row r of buffer b at byte
    (b·rows + r)·128 + (c ^ (r % 8))·16: that is the 128-byte swizzle (S<3,4,3> on byte
    addresses) over rows of 64 f16, stacked by rows then buffers. Pin the layout CuTe builds."""
    import cutlass.cute as cute

    from consumers.dequant_wgmma import DequantWgmmaConsumer

    seen = []

    @cute.jit
    def layouts():
        for lay in DequantWgmmaConsumer(tile_m, tile_n, buffers).smem_layouts():
            seen.append(str(lay))

    layouts()
    for rows, text in zip((tile_m, tile_n), seen):
        assert text == (f"S<3,4,3> o 0 o ((8,{rows // 8}),(64,1),(1,{buffers})):"
                        f"((64,512),(1,0),(0,{rows * 64}))"), text
