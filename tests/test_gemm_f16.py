"""The GEMM's f16 builds in production (notes/p0-gemm.md, session 22): the activation's exact f16
expansion read by TMA (``gemm_nvfp4(..., a16=)``, ``BlockscaledGemmSm90.swap_ab_f16`` and
``wide_f16``), the default chooser (every build it picks is an f16 build: the packed designs
left in session 27), the expanding quantize kernel's ``out=``, and the p0 linear on that
path."""
from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90, V3Study, compile_args
from workbench.compile import compile_report


# ---- compile (CPU): the production f16 builds are the studies the H200 verified ---------------
@pytest.mark.compile
@pytest.mark.parametrize("build, study", [
    (lambda: BlockscaledGemmSm90.swap_ab_f16(splits=1),
     lambda: V3Study(activation="f16_tma", buffers=4)),
    (lambda: BlockscaledGemmSm90.swap_ab_f16(splits=3),
     lambda: V3Study(splits=3, activation="f16_tma", buffers=4)),
    (lambda: BlockscaledGemmSm90.swap_ab_f16(stream_k=True),
     lambda: V3Study(stream_k=True, activation="f16_tma", buffers=4)),
    (lambda: BlockscaledGemmSm90.wide_f16(),
     lambda: V3Study(activation="f16_tma_3wg", tokens=256, consumer="pipelined", buffers=4)),
    (lambda: BlockscaledGemmSm90.swap_ab_f16(splits=2, cluster_splits=True),
     lambda: V3Study(splits=2, fixup="dsmem", activation="f16_tma", buffers=4)),
], ids=["swap-s1", "swap-s3", "swap-stream-k", "wide-t256", "swap-s2-cluster"])
def test_f16_builds_compile_to_the_measured_studies(build, study):
    """Each production f16 build compiles to the same PTX as the V3Study build that the H200
    A/B measured and the GPU tests verified (15fc61e), so those results carry over."""
    a = compile_report(build(), *compile_args())
    b = compile_report(study().build(), *compile_args())
    assert a.ptx == b.ptx
    assert a.spill_bytes == 0 and a.registers <= (168 if a.ptx.count(".reqntid 384") else 128)
    if a.sass is not None:  # ptxas kept every register hint: one USETMAXREG a setmaxnreg
        assert a.sass.count("USETMAXREG") == a.census["setmaxnreg"] > 0
        if a.ptx.count(".reqntid 384"):  # the wide build: producer 40, consumers 232
            assert re.search(r"USETMAXREG\.DEALLOC\S* (\w+, )?0x28\b", a.sass)
            assert re.search(r"USETMAXREG\.TRY_ALLOC\S* (\w+, )?0xe8\b", a.sass)


@pytest.mark.compile
def test_weight_conversion_sass_per_8_weights():
    """The weights' conversion recipe in the small-M production build, counted in the kernel's
    whole SASS (these two instructions appear only there): the mainloop body (4 HGMMA, one
    k-block, unrolled once) converts 4 code words (8 e2m1 weights each) a thread, each word as 4 F2FP.F16.E4M3.UNPACK_B (e2m1 read as e4m3 bytes) and 4 HMUL2
    (the block scale, exact: every product a normal f16), plus one of each a k16 step for the
    scale pair (e4m3x2 scales x 64): 5 + 5 per 8 weights (device.nvfp4.dequant_a_fragment).
    The conversion's pipes take ~20 % of the MMA's time (notes/p0-gemm.md, session 20)."""
    r = compile_report(BlockscaledGemmSm90.swap_ab_f16(), *compile_args())
    if r.sass is None:
        pytest.skip("nvdisasm not installed: no SASS to count")
    hgmma = len(re.findall(r"\bHGMMA\.64x128x16", r.sass))
    words = 4  # code words a consumer thread converts a k-block
    assert hgmma == 4
    assert r.sass.count("F2FP.F16.E4M3.UNPACK_B") == 5 * words
    assert len(re.findall(r"\bHMUL2\b", r.sass)) == 5 * words
    assert "HFMA2" not in r.sass  # no multiply turned into an FMA with a rounding of its own


def test_default_config_f16_branch():
    """The chooser (schedules/plan.py): the swap-AB f16 build at one token tile or within one
    wave of 128 x 128 tiles (stream-K where they pass one wave by at most half of one, the K
    split rule below a wave: v4 and v5's SMs // tiles), the three-warpgroup 256-token build
    beyond (stream-K where its last wave is at most a third full after at most ten whole
    ones)."""
    from kernels.nvfp4.gemm import default_config

    def pick(M, N, K=5376):
        c = default_config(M, N, K, 132)
        assert c.reads_f16_activation
        return ("wide" if c.threads == 384 else "swap", c.stream_k, c.splits)

    # session 23's measured cells (notes/p0-gemm.md): the pick is the best exact build but one
    assert pick(128, 21504) == ("swap", True, 1)  # 168 tiles: 1.27 waves
    assert pick(128, 14336) == ("swap", False, 1)
    assert pick(128, 5376) == ("swap", False, 3)
    assert pick(128, 5376, 14336) == ("swap", False, 3) and pick(128, 7168) == ("swap", False, 2)
    # two splits: one cluster a tile, reduced on chip (session 27); three: the global fixup
    two, three = (default_config(128, N, 5376, 132) for N in (7168, 5376))
    assert two.cluster_k == 2 and type(two.epilogue).__name__ == "ClusterSplitStore"
    assert three.cluster_k == 1 and type(three.epilogue).__name__ == "TileStore"
    assert two.workspace_floats(128, 7168, 5376, 132) == (0, 56)
    with pytest.raises(ValueError, match="two splits only"):  # three lost: a study's, not ours
        BlockscaledGemmSm90.swap_ab_f16(splits=3, cluster_splits=True)
    assert pick(256, 21504) == ("wide", True, 1)  # 168 wide tiles: last wave 36 of 132
    assert pick(256, 5376) == ("swap", False, 1)  # 84 tiles: within one wave
    assert pick(256, 5376, 14336) == ("swap", False, 1)
    assert pick(512, 21504) == ("wide", False, 1)  # 336: last wave 72
    assert pick(512, 5376) == ("wide", False, 1)  # 84 wide tiles: 0.64 of a wave
    assert pick(1024, 5376, 14336) == ("wide", True, 1)  # 168
    assert pick(2048, 21504) == ("wide", True, 1)  # 1344: last wave 24
    assert pick(2048, 14336) == ("wide", False, 1)  # 896: last wave 104
    assert pick(2048, 7168) == ("wide", False, 1)  # 448: last wave 52
    # session 24: 47 whole waves before a last one of 12 tiles, stream-K measured behind
    assert pick(37810, 5376) == ("wide", False, 1)
    assert pick(37810, 5376, 14336) == ("wide", False, 1)
    assert pick(3328, 14336) == ("wide", False, 1)  # 1456: 11 whole waves, last 4
    big = default_config(2048, 21504, 5376, 132)
    assert big.tile_m == 256
    # cached: one object per question (a plan keyed by the config hits; ~50 µs a build)
    assert default_config(2048, 21504, 5376, 132) is big
    ring = default_config(2048, 21504, 5376, 132, stream_k=False)
    assert not ring.stream_k and ring.threads == 384
    with pytest.raises(TypeError, match="prepacked"):
        default_config(128, 5376, 5376, 132, prepacked=True)  # every build reads the prepack


def test_launch_config_refuses_a_build_that_is_not_f16():
    """A config that does not read the activation's f16 expansion (P1's, which takes bf16) is
    refused before any launch."""
    from kernels.nvfp4.gemm import launch_config
    from kernels.nvfp4.gemm_shell import P1Study
    with pytest.raises(ValueError, match="config must be an f16 build"):
        launch_config(P1Study().build(), 128, 512, 256, "cpu")


# ---- exactness (GPU) ----------------------------------------------------------------------------
def _operands(M, N, K, seed, kind="normal", b_kind="lognormal"):
    from kernels.nvfp4.prepack import prepack
    from numerics import nvfp4
    from validators.gemm_operands import make_operand
    a = make_operand(kind, M, K, seed, "cuda")
    b = make_operand(b_kind, N, K, seed + 1, "cuda")
    a16 = nvfp4.dequantize(a[0], a[1], 1.0, (M, K), dtype=torch.float16).contiguous()
    g = [torch.tensor([float(x[2])], dtype=torch.float32, device="cuda") for x in (a, b)]
    return (a[0], a[1], g[0]), (b[0], b[1], g[1]), prepack(b[0], b[1]), a16, (a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 8, 32), (128, 512, 2048), (300, 520, 1056),
                                   (700, 384, 160)])
@pytest.mark.parametrize("splits", [1, 3])
def test_swap_ab_f16_on_the_expansion_kernel_equals_the_reference_a16(shape, splits):
    """gemm_nvfp4 on swap_ab_f16 without a16 (expand_nvfp4 into the scratch) and without the
    prepack (made per call) equals the call given the reference expansion (numerics'
    dequantize) and the prepack, bit for bit, into a NaN-poisoned output; within the oracle's
    bound; a rerun equal. (Before session 27 this compared the packed swap-AB build: the same
    bits, tested here on the H200 until that build left the code.)"""
    from kernels.nvfp4.gemm import gemm_nvfp4
    from tests.test_gemm_nvfp4 import _check
    M, N, K = shape
    a, b, pre, a16, (ra, rb) = _operands(M, N, K, seed=sum(shape) + splits)
    cfg = BlockscaledGemmSm90.swap_ab_f16(splits=splits)
    want = gemm_nvfp4(*a, *b, prepacked=pre, a16=a16, config=cfg)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_nvfp4(*a, *b, config=cfg, out=out)
    again = gemm_nvfp4(*a, *b, config=cfg)
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert torch.equal(again.view(torch.int16), out.view(torch.int16))
    _check(out, ra, rb, M, N, K)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(128, 19200, 256), (2048, 8192, 256), (700, 8192, 160),
                                   (1300, 8200, 512), (256, 19200, 256), (384, 4096, 1024),
                                   (300, 19200, 160)])
@pytest.mark.parametrize("kind", ["normal", "cancel"])
def test_f16_default_within_bound_and_row_slices(shape, kind):
    """The f16 default (swap-AB f16 on stream-K at 128 x 19200, and at M > 128 within one wave
    at 384 x 4096 (96 tiles); the 256-token build at 2048 x 8192, 1300 x 8200 and 700 x 8192 (a
    partial k-block), on stream-K at 256 x 19200 (150 tiles: last wave 18) and 300 x 19200 (a
    partial token tile over a partial k-block)):
    every element within the oracle's bound into a poisoned output, a rerun identical, and rows
    [128, M) through ``rows=`` with the whole call's config equal to the whole call's rows."""
    from kernels.nvfp4.gemm import default_config, gemm_nvfp4
    from tests.test_gemm_nvfp4 import _check
    M, N, K = shape
    a, b, pre, a16, (ra, rb) = _operands(M, N, K, seed=M + N + K, kind=kind)
    cfg = default_config(M, N, K)
    assert cfg.reads_f16_activation
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_nvfp4(*a, *b, prepacked=pre, a16=a16, out=out)
    again = gemm_nvfp4(*a, *b, prepacked=pre, a16=a16)
    torch.cuda.synchronize()
    assert not out.isnan().any()
    _check(out, ra, rb, M, N, K)
    assert torch.equal(again.view(torch.int16), out.view(torch.int16))
    if M > 128 and not cfg.stream_k:  # stream-K's bits depend on the call's tile count
        part = gemm_nvfp4(*a, *b, prepacked=pre, a16=a16, rows=(128, M), config=cfg)
        assert torch.equal(part.view(torch.int16), out[128:].view(torch.int16))


F16_BUILDS = {"swap_ab_f16": lambda: BlockscaledGemmSm90.swap_ab_f16(),
              "swap_ab_f16_split2": lambda: BlockscaledGemmSm90.swap_ab_f16(splits=2),
              "swap_ab_f16_split2_cluster": lambda: BlockscaledGemmSm90.swap_ab_f16(
                  splits=2, cluster_splits=True),
              "swap_ab_f16_stream_k": lambda: BlockscaledGemmSm90.swap_ab_f16(stream_k=True),
              "wide_f16": lambda: BlockscaledGemmSm90.wide_f16(),
              "wide_f16_stream_k": lambda: BlockscaledGemmSm90.wide_f16(stream_k=True)}


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(128, 512, 2048), (128, 7168, 2048), (300, 520, 1056),
                                   (700, 384, 160), (1000, 2056, 512)])
def test_cluster_splits_equal_the_global_fixup_bits(shape):
    """The K-split cluster (the plan's store at two splits) against the global fixup at two
    splits: the same bits into a NaN-poisoned output, plain and with P4's gated residual, on
    a row slice too; 3 reruns identical. (128, 512, 2048) and (128, 7168, 2048) take it as
    the default config; 1000 x 2056 x 512 has 136 tiles over 66 clusters (2-3 tiles a CTA)."""
    from kernels.nvfp4.gemm import default_config, gemm_nvfp4
    M, N, K = shape
    a, b, pre, a16, _ = _operands(M, N, K, seed=sum(shape) + 27)
    glob = BlockscaledGemmSm90.swap_ab_f16(splits=2)
    cfg = BlockscaledGemmSm90.swap_ab_f16(splits=2, cluster_splits=True)
    if M == 128:
        assert default_config(M, N, K).static_key() == \
            cfg.static_key()
    gate = torch.randn(N, device="cuda").to(torch.bfloat16)
    res = torch.randn(M, N, device="cuda").to(torch.bfloat16)
    for kw in ({}, {"gate": gate, "residual": res}):
        want = gemm_nvfp4(*a, *b, prepacked=pre, a16=a16, config=glob, **kw)
        outs = [gemm_nvfp4(*a, *b, prepacked=pre, a16=a16, config=cfg, out=torch.full(
            (M, N), float("nan"), dtype=torch.bfloat16, device="cuda"), **kw)
            for _ in range(3)]
        torch.cuda.synchronize()
        assert not outs[0].isnan().any()
        for out in outs:
            assert torch.equal(out.view(torch.int16), want.view(torch.int16)), kw
    if M > 128:  # rows [128, M): a slice starting on a scale tile
        want = gemm_nvfp4(*a, *b, prepacked=pre, a16=a16, config=glob, rows=(128, M))
        got = gemm_nvfp4(*a, *b, prepacked=pre, a16=a16, config=cfg, rows=(128, M))
        torch.cuda.synchronize()
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
@settings(max_examples=15, deadline=None)
@given(M=st.integers(1, 600), n8=st.integers(1, 80), k32=st.integers(1, 30),
       kinds=st.sampled_from([("normal", "lognormal"), ("raw", "raw"), ("lognormal", "cancel"),
                              ("cancel", "raw")]),
       build=st.sampled_from(sorted(F16_BUILDS)), seed=st.integers(0, 2**31 - 1))
def test_f16_builds_drawn_shapes_within_bound(M, n8, k32, kinds, build, seed):
    """Hypothesis shapes and operand kinds (raw: every code and scale byte drawn, the
    adversarial kind; cancel: sums that cancel) on each production f16 build, split-K and
    stream-K included: every element within the oracle's bound into a poisoned output, a rerun
    identical."""
    from kernels.nvfp4.gemm import gemm_nvfp4
    from tests.test_gemm_nvfp4 import _check
    N, K = 8 * n8, 32 * k32
    a, b, pre, a16, (ra, rb) = _operands(M, N, K, seed=seed, kind=kinds[0], b_kind=kinds[1])
    cfg = F16_BUILDS[build]()
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_nvfp4(*a, *b, prepacked=pre, a16=a16, config=cfg, out=out)
    again = gemm_nvfp4(*a, *b, prepacked=pre, a16=a16, config=cfg)
    torch.cuda.synchronize()
    assert not out.isnan().any()
    _check(out, ra, rb, M, N, K)
    assert torch.equal(again.view(torch.int16), out.view(torch.int16))


@pytest.mark.gpu
def test_a16_refused_before_the_launch():
    """a16 of the wrong dtype, width or too few rows: ValueError, the output untouched."""
    from kernels.nvfp4.gemm import gemm_nvfp4
    M, N, K = 256, 512, 256
    a, b, pre, a16, _ = _operands(M, N, K, seed=3)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    for bad in (a16.float(), a16[:, :128].contiguous(), a16[:128]):
        with pytest.raises((ValueError, TypeError)):
            gemm_nvfp4(*a, *b, prepacked=pre, a16=bad, out=out)
    torch.cuda.synchronize()
    assert out.isnan().all()


@pytest.mark.gpu
@pytest.mark.parametrize("M", [16, 300])
def test_quantize_expand_into_caller_buffers(M):
    """quantize_expand_nvfp4(out=(q, s, f16)) writes what the allocating call returns: packed
    bytes and scales equal quantize_nvfp4's, f16 equal numerics' dequantize, bit for bit."""
    from kernels.nvfp4.quantize import quantize_expand_nvfp4, quantize_nvfp4
    from numerics import nvfp4
    K = 1056
    gen = torch.Generator(device="cuda").manual_seed(M)
    x = (torch.randn(M, K, generator=gen, device="cuda")
         * torch.exp(2 * torch.randn(K, generator=gen, device="cuda"))).to(torch.bfloat16)
    g = nvfp4.global_scale(x).reshape(1)
    q0, s0 = quantize_nvfp4(x, g, pad_16x=True)
    Mp = q0.shape[0]
    q = torch.zeros(Mp, K // 2, dtype=torch.uint8, device="cuda")
    s = torch.zeros(nvfp4.scale_shape(Mp, K), dtype=torch.uint8, device="cuda")
    f16 = torch.full((M, K), float("nan"), dtype=torch.float16, device="cuda")
    rq, rs, rf = quantize_expand_nvfp4(x, g, out=(q, s, f16))
    torch.cuda.synchronize()
    assert rq is q and rf is f16
    assert torch.equal(q, q0) and torch.equal(rs.view(torch.uint8), s0.view(torch.uint8))
    want = nvfp4.dequantize(q0, s0, 1.0, (M, K), dtype=torch.float16)
    assert torch.equal(f16.view(torch.int16), want.view(torch.int16))


def test_activation_scratch_is_shared_per_stream_and_shape():
    """Planned p0 calls share one (packed, scales, f16) set per (device, stream, M, K), whichever
    linear makes them; another stream or shape gets its own; the pool is bounded."""
    from models import nvfp4_linear as L
    L._ACT_SCRATCH.clear()
    a = L.activation_scratch(40, 64, "cpu", 7)
    assert a is L.activation_scratch(40, 64, "cpu", 7)
    assert a is not L.activation_scratch(40, 64, "cpu", 8)
    assert a is not L.activation_scratch(48, 64, "cpu", 7)
    q, s, f16 = a
    assert q.shape == (48, 32) and f16.shape == (40, 64) and not q.any() and not s.any()
    for i in range(2 * L.ACT_SCRATCH_MAX):
        L.activation_scratch(16 * (i + 1), 64, "cpu", 7)
    assert len(L._ACT_SCRATCH) <= L.ACT_SCRATCH_MAX
    L._ACT_SCRATCH.clear()


@pytest.mark.gpu
def test_p0_linears_sharing_scratch_keep_their_bits():
    """Two p0 linears of the same K called alternately on one stream, without synchronising,
    on their cached plans (the shared activation scratch): every output equals that linear's
    first, checked call."""
    from models.nvfp4_linear import Nvfp4Linear
    gen = torch.Generator(device="cuda").manual_seed(11)
    lins = [Nvfp4Linear((torch.randn(n, 512, device="cuda", generator=gen) / 16).to(
        torch.bfloat16), backend="p0") for n in (256, 384)]
    xs = [torch.randn(300, 512, device="cuda", generator=gen).to(torch.bfloat16) * (i + 1)
          for i in range(2)]
    want = [lin(x).clone() for lin, x in zip(lins, xs)]
    got = []
    for _ in range(4):
        got += [(i, lins[i](xs[i])) for i in (0, 1)]
    torch.cuda.synchronize()
    for i, y in got:
        assert torch.equal(y.view(torch.int16), want[i].view(torch.int16))
