"""P1, the activation quantized inside the GEMM (kernels.nvfp4.gemm_shell.P1Study,
kernels.nvfp4.gemm_p1): its build (CPU), the instructions it was meant to have (compile), and
its bits against P0's production swap-AB build on the quantize kernel's output (GPU), with no
packed activation or scale tensor allocated on its path."""
import functools
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90, P0Variant, P1Study, compile_args
from producers.activation_stage import (ClusterQuantizingActivationStage,
                                        QuantizingActivationStage)
from workbench.compile import compile_report


def _p0_bits(x, g_x, pre, w_q, w_s, g_w, splits):
    """The production swap-AB bits P1 must equal: quantize_expand_nvfp4(x, g_x), then the f16
    swap-AB build at ``splits`` (the same wgmmas on the same values as the packed swap-AB
    build P1 was first compared with, which left the code: notes/p0-gemm.md, session 27)."""
    from kernels.nvfp4.gemm import gemm_nvfp4
    from kernels.nvfp4.quantize import quantize_expand_nvfp4
    q, s, a16 = quantize_expand_nvfp4(x, g_x, pad_16x=True)
    return gemm_nvfp4(q, s, g_x, w_q, w_s, g_w, prepacked=pre, rows=(0, x.shape[0]), a16=a16,
                      config=BlockscaledGemmSm90.swap_ab_f16(splits=splits))


def test_p1_build_rings_and_barriers():
    """The ring stage holds the bf16 token tile and the weight slabs; ``empty[s]`` counts the
    quantizing stage's 4 warps and the consumers' 8; the f16 tiles are the production ones."""
    cfg = P1Study().build()
    assert cfg.barrier_table["full"][1] == 1 and cfg.barrier_table["empty"][1] == 12
    assert cfg.barrier_table["act_full"][1] == 4 and cfg.barrier_table["act_empty"][1] == 8
    assert cfg.producer.act_bytes == 128 * 64 * 2
    assert cfg.static_key() != BlockscaledGemmSm90.swap_ab_f16(stages=6).static_key()
    assert P1Study(splits=3).build().splits == 3
    with pytest.raises(ValueError, match="tokens"):
        QuantizingActivationStage(256, 6)


@functools.cache
def _report():
    return compile_report(P1Study().build(), *compile_args())


@pytest.mark.compile
def test_p1_ablation_builds_leave_out_their_half():
    """The ablations compile: without the quantizer no expansion converts are left but the
    consumer's 20; without the wgmmas none is left; production is neither."""
    noq = compile_report(P1Study(variant=P0Variant(skip_dequant=True)).build(), *compile_args())
    nomma = compile_report(P1Study(variant=P0Variant(skip_mma=True)).build(), *compile_args())
    assert noq.ptx.count("cvt.rn.f16x2.e4m3x2") == 20 and noq.census["wgmma.mma_async"] == 4
    assert nomma.census["wgmma.mma_async"] == 0
    assert P1Study().build().variant is None


@pytest.mark.compile
def test_p1_compiles_with_one_bf16_tma_and_the_quantizer():
    """One TMA (the bf16 tile) and the weight slabs' bulk copies; e4m3x2 converts: the
    consumer's 20, and per block of the stage's row pass 10 (the quantizer's scale read back
    as fp32, the scale as f16x2, 8 for the two code words' expansion); no spill, no local
    memory."""
    r = _report()
    assert r.frame_bytes == 0 and r.registers <= 128
    assert r.census["wgmma.mma_async"] == 4 and r.census["setmaxnreg"] == 3
    assert r.census["cp.async.bulk.tensor"] == 1
    assert r.ptx.count("cp.async.bulk.shared::cluster.global.mbarrier") == 4
    assert r.ptx.count("cvt.rn.f16x2.e4m3x2") == 20 + 4 * (1 + 1 + 2 * 4)
    assert r.ptx.count("rcp.approx.ftz.f32") >= 2  # rcp(g) once, enc per block
    if r.sass is not None:
        assert r.spill_bytes == 0 and "CALL.ABS" not in r.sass


@pytest.mark.compile
@pytest.mark.parametrize("cluster", [2, 4, 8])
def test_p1_cluster_compiles_with_bulk_sends_and_cta_scope_handshakes(cluster):
    """C CTAs sharing each quantized tile: per owner warp and peer one remote
    ``arrive.expect_tx`` and one ``cp.async.bulk.shared::cluster.shared::cta`` (C - 1 of each),
    no DSMEM store, no cluster-scope release or acquire (the handshakes at CTA scope, as
    CUTLASS's multicast pipelines: the bytes' arrival is the transaction count's), the
    consumers' one remote release on the buffer's owner; act_empty counts every CTA's
    consumer warps; 128 registers, no spills."""
    from workbench.compile import compile_report
    cfg = P1Study.of_cluster(cluster).build()
    assert cfg.cluster_n == cluster
    bars = cfg.describe()["barriers"]
    assert (bars["act_full"]["arrive_count"], bars["act_empty"]["arrive_count"],
            bars["empty"]["arrive_count"]) == (4, 8 * cluster, 12)
    r = compile_report(cfg, *compile_args())
    assert r.frame_bytes == 0 and r.registers <= 128
    assert r.ptx.count("cp.async.bulk.shared::cluster.shared::cta") == cluster - 1
    assert r.ptx.count("mbarrier.arrive.expect_tx.shared::cluster") == cluster - 1
    assert "st.shared::cluster" not in r.ptx and ".cluster.shared::cluster" not in r.ptx
    assert "try_wait.parity.acquire.cluster" not in r.ptx
    assert "arrive.release.cluster" not in r.ptx and "expect_tx.release.cluster" not in r.ptx
    if r.sass is not None:
        assert r.spill_bytes == 0


def test_p1_cluster_refuses_what_it_cannot_share():
    """Refused before compiling: the debug dump or an ablation with a cluster, C outside
    (1, 2, 4, 8), the local-only ablation without a cluster, a buffer count C does not divide
    (two writers a buffer), and a producer loading for another cluster size than the stage
    shares in."""
    for bad in (dict(cluster=2, dump=True), dict(cluster=4, variant=P0Variant(skip_mma=True)),
                dict(cluster=3), dict(cluster=16), dict(pair_local_only=True),
                dict(cluster=2, buffers=3), dict(cluster=4, buffers=2)):
        with pytest.raises(ValueError):
            P1Study(**bad).build()
    with pytest.raises(ValueError, match="a multiple of 4"):
        ClusterQuantizingActivationStage(128, 6, buffers=6, peers=4)
    from consumers.register_a_wgmma import PeerFedRegisterAWgmmaConsumer
    from producers.register_order import Bf16RegisterOrderProducer
    stage = ClusterQuantizingActivationStage(128, 6, buffers=4, peers=4)
    with pytest.raises(ValueError, match="loads for a cluster of 2"):
        BlockscaledGemmSm90.from_roles(
            "swap_ab", Bf16RegisterOrderProducer(128, 128, 6, peers=2),
            PeerFedRegisterAWgmmaConsumer(128, 6, stage.tiles, peers=4), stage)
    assert P1Study().build().cluster_n == 1  # production: no cluster


@pytest.mark.compile
def test_p1_cluster_ablation_sends_nothing_and_keeps_the_barriers():
    """The cluster's timing ablation (P1Study(pair_local_only=True)): the same barriers and
    remote arrivals, nothing sent to a peer CTA; its own compile key."""
    from workbench.compile import compile_report
    study = P1Study.of_cluster(4)
    cfg = replace(study, pair_local_only=True).build()
    assert cfg.static_key() != study.build().static_key()
    r = compile_report(cfg, *compile_args())
    assert r.frame_bytes == 0 and r.registers <= 128
    assert "st.shared::cluster" not in r.ptx
    assert "cp.async.bulk.shared::cluster.shared::cta" not in r.ptx
    assert "mbarrier.arrive.shared::cluster" in r.ptx


# ---- exactness (GPU) ----------------------------------------------------------------------------
def _operands(M, N, K, seed, kind="normal"):
    from kernels.nvfp4.amax import amax
    from kernels.nvfp4.prepack import prepack
    from numerics import nvfp4
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, generator=gen, device="cuda")
    if kind == "lognormal":
        x = x.sign() * torch.exp(2.0 * torch.randn(M, K, generator=gen, device="cuda"))
    x = x.to(torch.bfloat16)
    w = torch.randn(N, K, generator=gen, device="cuda").to(torch.bfloat16)
    g_w = float(nvfp4.global_scale_from_amax(w.abs().max()))
    w_q, w_s = nvfp4.quantize(w, g_w, pad_16x=True)  # N may be 8: scales padded, codes cut
    w_q = w_q[:N].contiguous()
    g_x = nvfp4.global_scale_from_amax(amax(x)).reshape(1)
    return x, g_x, prepack(w_q, w_s), w_q, w_s, torch.tensor([g_w], device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 8, 32), (128, 512, 2048), (300, 520, 1056),
                                   (700, 384, 160)])
@pytest.mark.parametrize("kind", ["normal", "lognormal"])
@pytest.mark.parametrize("splits", [1, 3])
def test_p1_bits_equal_p0_on_the_quantize_kernels_output(shape, kind, splits):
    """P1 on bf16 x equals the production swap-AB GEMM (same splits: :func:`_p0_bits`) on
    quantize_expand_nvfp4(x, g)'s output, bit for bit, into a NaN-poisoned output; a rerun
    equal; and the P1 call allocates no [M, K/2] codes or swizzled scale tensor (it allocates
    nothing but its output, given one)."""
    from kernels.nvfp4.gemm_p1 import gemm_nvfp4_p1
    M, N, K = shape
    x, g_x, pre, w_q, w_s, g_w = _operands(M, N, K, seed=sum(shape) + splits, kind=kind)
    want = _p0_bits(x, g_x, pre, w_q, w_s, g_w, splits)
    cfg = P1Study(splits=splits).build()
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_nvfp4_p1(x, g_x, pre, g_w, out=out, config=cfg)  # compiles; allocations counted next
    torch.cuda.synchronize()
    again = torch.empty_like(out)  # the caller's output, allocated before the count starts
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    gemm_nvfp4_p1(x, g_x, pre, g_w, out=again, config=cfg)
    torch.cuda.synchronize()
    allocs = torch.cuda.memory_stats()["allocation.all.allocated"] - before
    assert allocs <= (2 if splits > 1 else 0), allocs  # the split-K workspace and counters
    # and no buffer the kernel is given is a packed activation or its scales: every argument
    # (tensor or address) is x, the weight's prepack, a tensor scale, the output, the
    # diagnostics mailbox, an absent operand (0) or the split-K workspace
    from kernels.nvfp4 import gemm_p1
    seen = []
    entry = gemm_p1.ENTRY
    real = entry.__call__

    class Spy:
        def __call__(self, config, key, tensors, scalars):
            seen.extend(t.data_ptr() if isinstance(t, torch.Tensor) else t for t in tensors)
            return real(config, key, tensors, scalars)

    gemm_p1.ENTRY = Spy()
    try:
        gemm_nvfp4_p1(x, g_x, pre, g_w, out=again, config=cfg)
    finally:
        gemm_p1.ENTRY = entry
    torch.cuda.synchronize()
    allowed = {x.data_ptr(), pre.codes.data_ptr(), pre.scales.data_ptr(), g_x.data_ptr(),
               g_w.data_ptr(), again.data_ptr(), gemm_p1._mailbox_address(), 0}
    extra = set(seen) - allowed
    assert len(extra) <= (2 if splits > 1 else 0), extra  # the workspace and counters only
    assert not out.isnan().any()
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert torch.equal(again.view(torch.int16), out.view(torch.int16))


@pytest.mark.gpu
@settings(max_examples=12, deadline=None)
@given(M=st.integers(1, 500), n8=st.integers(1, 70), k32=st.integers(1, 30),
       kind=st.sampled_from(["normal", "lognormal"]), splits=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**31 - 1))
def test_p1_drawn_shapes_bits_equal_p0(M, n8, k32, kind, splits, seed):
    """Hypothesis shapes (ragged M, N down to 8, K down to 32): P1's bits equal the production
    swap-AB GEMM's on the quantize kernel's output, into a NaN-poisoned output, a rerun
    equal."""
    from kernels.nvfp4.gemm_p1 import gemm_nvfp4_p1
    N, K = 8 * n8, 32 * k32
    x, g_x, pre, w_q, w_s, g_w = _operands(M, N, K, seed=seed, kind=kind)
    want = _p0_bits(x, g_x, pre, w_q, w_s, g_w, splits)
    cfg = P1Study(splits=splits).build()
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_nvfp4_p1(x, g_x, pre, g_w, out=out, config=cfg)
    again = gemm_nvfp4_p1(x, g_x, pre, g_w, config=cfg)
    torch.cuda.synchronize()
    assert not out.isnan().any()
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert torch.equal(again.view(torch.int16), out.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(128, 512, 2048), (300, 1024, 1056), (700, 256, 160),
                                   (1100, 2048, 320)])
@pytest.mark.parametrize("kind", ["normal", "lognormal"])
@pytest.mark.parametrize("splits, buffers", [(1, 2), (2, 2), (1, 4)])
def test_p1_pair_bits_equal_p0(shape, kind, splits, buffers):
    """C = 2 (each k-block quantized by one CTA of the pair for both): P0's bits on the
    quantize kernel's output, into a NaN-poisoned output, a rerun equal. 1100 x 2048 x 320 is
    72 clusters (more than the 66 an H200 runs at once: some CTAs take two tiles) of 5
    k-blocks (the second tile starts on an odd ring count, so the owners swap); K splits and
    four f16 buffers too."""
    from kernels.nvfp4.gemm_p1 import gemm_nvfp4_p1
    M, N, K = shape
    x, g_x, pre, w_q, w_s, g_w = _operands(M, N, K, seed=sum(shape) + 2 * splits + buffers,
                                           kind=kind)
    want = _p0_bits(x, g_x, pre, w_q, w_s, g_w, splits)
    cfg = P1Study(cluster=2, splits=splits, buffers=buffers).build()
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_nvfp4_p1(x, g_x, pre, g_w, out=out, config=cfg)
    again = gemm_nvfp4_p1(x, g_x, pre, g_w, config=cfg)
    odd = _operands(M, 384, K, seed=1)  # three weight tiles: the pair cannot cover them
    with pytest.raises(ValueError, match="not a multiple of 2"):
        gemm_nvfp4_p1(odd[0], odd[1], odd[2], odd[5], config=cfg)
    torch.cuda.synchronize()
    assert not out.isnan().any()
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert torch.equal(again.view(torch.int16), out.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("cluster, shape", [(4, (128, 1024, 2048)), (4, (300, 2048, 1056)),
                                            (8, (200, 1024, 704)), (8, (1100, 2048, 320))])
@pytest.mark.parametrize("splits", [1, 2])
def test_p1_cluster_of_4_and_8_bits_equal_p0_every_run(cluster, shape, splits):
    """C = 4 and 8 (each k-block quantized by one CTA, sent to the others by bulk DSMEM
    copies): P0's bits on the quantize kernel's output in every one of 8
    runs into NaN-poisoned outputs (the DSMEM stores' race, session 25, showed in 10-45 % of
    runs at these shapes). K = 704 is 11 k-blocks (owners wrap unevenly); 1100 x 2048 x 320
    at C = 8 is 9 x 16 tiles in 18 clusters of 5 k-blocks; a weight-tile count C does not
    divide is refused."""
    from kernels.nvfp4.gemm_p1 import gemm_nvfp4_p1
    M, N, K = shape
    x, g_x, pre, w_q, w_s, g_w = _operands(M, N, K, seed=sum(shape) + cluster + splits,
                                           kind="lognormal")
    want = _p0_bits(x, g_x, pre, w_q, w_s, g_w, splits)
    cfg = P1Study.of_cluster(cluster, splits=splits).build()
    odd = _operands(M, 128 * (cluster + 2), K, seed=1)
    with pytest.raises(ValueError, match=f"not a multiple of {cluster}"):
        gemm_nvfp4_p1(odd[0], odd[1], odd[2], odd[5], config=cfg)
    outs = []
    for _ in range(8):
        out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        outs.append(gemm_nvfp4_p1(x, g_x, pre, g_w, out=out, config=cfg))
    torch.cuda.synchronize()
    wrong = [i for i, out in enumerate(outs)
             if not torch.equal(out.view(torch.int16), want.view(torch.int16))]
    assert not wrong, f"runs {wrong} of 8 differ from P0's bits"


@pytest.mark.gpu
def test_cluster_grid_fits_the_gpu_at_once():
    """The persistent grid of C-CTA clusters (device.runtime.cluster_ctas): a multiple of C, at
    most one CTA an SM, and every cluster resident at once by the driver's count."""
    from device.runtime import cluster_ctas, sm_count
    for c in (1, 2, 3, 4, 8):  # 3: the K-split cluster of the DSMEM fixup study
        n = cluster_ctas(c)
        assert n % c == 0 and c <= n <= sm_count(), (c, n)
    assert cluster_ctas(1) == sm_count()


@pytest.mark.gpu
def test_p1_entry_refuses_bad_input_before_launch():
    """Each bad argument named before any launch."""
    from kernels.nvfp4.gemm_p1 import gemm_nvfp4_p1
    x, g_x, pre, _, _, g_w = _operands(128, 256, 512, seed=3)
    bad = [((x.float(), g_x, pre, g_w), "x"), ((x[:, :500], g_x, pre, g_w), "x"),
           ((x.t(), g_x, pre, g_w), "x"), ((x, g_x.double(), pre, g_w), "g_x"),
           ((x, g_x, (pre.codes, pre.scales), g_w), "prepack"),
           ((x[:, :256].contiguous(), g_x, pre, g_w), "K"),
           ((x, torch.ones(2, device="cuda"), pre, g_w), "g_x"),
           ((x.cpu(), g_x, pre, g_w), "x")]
    for args, match in bad:
        with pytest.raises((TypeError, ValueError), match=match):
            gemm_nvfp4_p1(*args)
    with pytest.raises(ValueError, match="out"):
        gemm_nvfp4_p1(x, g_x, pre, g_w, out=torch.empty(128, 255, dtype=torch.bfloat16,
                                                        device="cuda"))


# ---- the debug build: every consumed tile's quantizer bytes against Comfy's -------------------
@pytest.mark.compile
def test_p1_debug_build_compiles_and_leaves_production_alone():
    """P1Study(dump=True) compiles without spills and with global stores the production build
    does not have; it refuses K splits (it writes through the split-K workspace)."""
    r = compile_report(P1Study(dump=True).build(), *compile_args())
    assert r.frame_bytes == 0 and r.registers <= 128 and r.census["wgmma.mma_async"] == 4
    assert r.ptx.count("st.global") > _report().ptx.count("st.global")
    assert r.ptx != _report().ptx
    with pytest.raises(ValueError, match="splits 1"):
        P1Study(dump=True, splits=2).build()
    with pytest.raises(ValueError, match="not without it"):
        P1Study(dump=True, variant=P0Variant(skip_dequant=True)).build()


def _adversarial(M, K, gen):
    """bf16 [M, K]: normal rows with blocks replaced, cycling through: E2M1 midpoints of an
    amax-6 block (ties), a NaN among finite values, all NaN, ±inf, signed zeros, all zero,
    huge values (saturating scales), tiny ones (subnormal scales)."""
    x = torch.randn(M, K, generator=gen, device="cuda")
    ties = torch.tensor([6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -1.25, -1.75,
                         -2.5, -3.5, -5, -6], device="cuda")
    nan, inf = float("nan"), float("inf")
    patterns = [ties, torch.tensor([nan, 6.0] + [1.0] * 14, device="cuda"),
                torch.full((16,), nan, device="cuda"),
                torch.tensor([inf, -inf, 1.0] + [0.5] * 13, device="cuda"),
                torch.tensor([0.0, -0.0] * 8, device="cuda"), torch.zeros(16, device="cuda"),
                torch.full((16,), 3e4, device="cuda") * torch.linspace(-1, 1, 16, device="cuda"),
                torch.full((16,), 1e-6, device="cuda") * torch.linspace(-1, 1, 16, device="cuda")]
    blocks = x.view(M, K // 16, 16)
    for i in range(M):
        for j in range(K // 16):
            if (i + j) % 3 == 0:
                blocks[i, j] = patterns[(i * 7 + j) % len(patterns)]
    return x.to(torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 8, 32), (128, 512, 2048), (300, 264, 1056)])
@pytest.mark.parametrize("kind", ["normal", "lognormal", "adversarial"])
def test_p1_debug_dump_equals_comfys_bits(shape, kind):
    """Every consumed tile (one copy per weight tile: every output-N CTA quantizes its tile
    again) holds numerics.nvfp4.quantize's packed bytes and scale bytes (Comfy's bits) for x
    and the given g: 0 differing bytes, and no word left unwritten. The adversarial kind uses a
    quarter of the amax rule's g, so its large blocks saturate the E4M3 scale."""
    from kernels.nvfp4.gemm_p1 import gemm_nvfp4_p1_dump
    from numerics import nvfp4
    M, N, K = shape
    _, _, pre, _, _, g_w = _operands(M, N, K, seed=sum(shape))
    gen = torch.Generator(device="cuda").manual_seed(sum(shape) + len(kind))
    if kind == "adversarial":
        x = _adversarial(M, K, gen)
        finite = torch.where(x.isfinite(), x, torch.zeros_like(x))
        g_x = (nvfp4.global_scale_from_amax(finite.abs().max()) / 4).reshape(1).float()
    else:
        x = torch.randn(M, K, generator=gen, device="cuda")
        if kind == "lognormal":
            x = x.sign() * torch.exp(2.0 * torch.randn(M, K, generator=gen, device="cuda"))
        x = x.to(torch.bfloat16)
        g_x = nvfp4.global_scale_from_amax(x.abs().max()).reshape(1).float()
    _, codes, scales, unwritten = gemm_nvfp4_p1_dump(x, g_x, pre, g_w)
    torch.cuda.synchronize()
    q, s = nvfp4.quantize(x, g_x, pad_16x=True)
    Mp = q.shape[0]
    want_s = nvfp4.from_blocked(s.view(torch.uint8), Mp, K // 16)[:M, :K // 16]
    n_tiles = -(-N // 128)
    assert codes.shape == (n_tiles, M, K // 2) and scales.shape == (n_tiles, M, K // 16)
    bad_codes = int((codes != q[:M].unsqueeze(0)).sum())
    bad_scales = int((scales != want_s.unsqueeze(0)).sum())
    assert bad_codes == 0 and bad_scales == 0, (bad_codes, bad_scales)
    assert int(unwritten) == 0


# ---- the p1 backend of Nvfp4Linear and P1's config chooser ------------------------------------
def test_p1_config_follows_p0s_split_and_says_where_its_bits_are_p0s():
    """choose_config: P1's baseline at the K split of the 128 x 128 builds; its bits are
    p0's default call's where p0 runs the swap-AB f16 build without stream-K."""
    from kernels.nvfp4.gemm import default_config, k_splits
    from kernels.nvfp4.gemm_p1 import choose_config
    for M, N, K, same in ((128, 14336, 5376, True),   # p0: swap-AB f16, one split
                          (128, 5376, 5376, True),    # p0: swap-AB f16, three splits
                          (128, 21504, 5376, False),  # p0: stream-K
                          (2048, 21504, 5376, False),  # p0: the 256-token build
                          (256, 5376, 14336, True)):
        cfg, got_same = choose_config(M, N, K, 132)
        p0 = default_config(M, N, K, 132)
        assert got_same == same and cfg.splits == k_splits(M, N, K, 132)
        if same:
            assert (p0.threads, p0.stream_k, p0.splits) == (cfg.threads, False, cfg.splits)
        assert isinstance(cfg.activation, QuantizingActivationStage)


@pytest.mark.compile
def test_p1_with_the_gated_residual_epilogue_compiles_without_spills():
    """The p1 backend's out projection: P1's build with P4's gated residual store."""
    from kernels.nvfp4.gemm import GATE_RESIDUAL
    cfg = P1Study().build().with_output(GATE_RESIDUAL)
    assert cfg.epilogue.operands == ("gate", "residual")
    r = compile_report(cfg, *compile_args())
    assert r.frame_bytes == 0 and r.spill_bytes == 0 and r.registers <= 128


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K", [(128, 512, 2048), (256, 1024, 1024), (300, 528, 1056),
                                     (1, 64, 64)])
def test_nvfp4_linear_p1_equals_p0(M, N, K):
    """Nvfp4Linear's p1 backend: p0's bits where p0 runs the swap-AB f16 build without
    stream-K (these shapes), with P4's gated residual (in place too), on a row slice, into a
    poisoned ``out``; two calls equal; FC2 stays on p0."""
    from kernels.nvfp4.gemm_p1 import choose_config
    from models.nvfp4_linear import Nvfp4Linear
    gen = torch.Generator(device="cuda").manual_seed(M + N + K)
    w = (torch.randn(N, K, generator=gen, device="cuda") / K**0.5).to(torch.bfloat16)
    x = (torch.randn(M, K, generator=gen, device="cuda")
         * torch.exp(torch.randn(K, generator=gen, device="cuda"))).to(torch.bfloat16)
    p0 = Nvfp4Linear(w, backend="p0", role="qkv")
    p1 = p0.with_backend("p1")
    assert p1.backend == "p1" and p0.with_backend("p1").with_backend("p0").backend == "p0"
    assert Nvfp4Linear(w, backend="p1", role="fc2").backend == "p0"
    assert choose_config(M, N, K)[1]
    want = p0(x)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    got = p1(x, out=out)
    assert got is out and not out.isnan().any()
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert torch.equal(p1(x).view(torch.int16), out.view(torch.int16))
    gate = torch.randn(N, generator=gen, device="cuda").to(torch.bfloat16)
    res = torch.randn(M, N, generator=gen, device="cuda").to(torch.bfloat16)
    want_g = p0(x, gate=gate, residual=res.clone())
    assert torch.equal(p1(x, gate=gate, residual=res.clone()).view(torch.int16),
                       want_g.view(torch.int16))
    in_place = res.clone()
    p1(x, gate=gate, residual=in_place, out=in_place)
    assert torch.equal(in_place.view(torch.int16), want_g.view(torch.int16))
    if M > 128:  # a row slice: the whole x's tensor scale, the slice's rows
        assert torch.equal(p1(x, rows=(128, M)).view(torch.int16),
                           p0(x, rows=(128, M)).view(torch.int16))


@pytest.mark.gpu
def test_p1_entry_refuses_half_an_epilogue():
    from kernels.nvfp4.gemm_p1 import gemm_nvfp4_p1
    x, g_x, pre, _, _, g_w = _operands(128, 256, 512, seed=4)
    gate = torch.ones(256, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="gate and residual"):
        gemm_nvfp4_p1(x, g_x, pre, g_w, gate=gate)
    with pytest.raises(ValueError, match="gate"):
        gemm_nvfp4_p1(x, g_x, pre, g_w, gate=gate[:128],
                      residual=torch.ones(128, 256, dtype=torch.bfloat16, device="cuda"))


# ---- N-group reuse, G = 2 at 64 tokens (notes/p1.md) -------------------------------------------
@pytest.mark.compile
def test_p1_group_reuse_compiles_two_accumulator_sets_without_spills():
    """P1Study(groups=2, tokens=64): a 64 x 256 tile, four weight slabs a stage, each consumer
    warpgroup two m64n64 accumulator sets on one f16 B tile (8 wgmmas a k-block), inside
    ptxas's 128-register cap of the 512-thread CTA without spills; refused where not built."""
    cfg = P1Study(groups=2, tokens=64).build()
    assert (cfg.tile_m, cfg.tile_n, cfg.threads) == (64, 256, 512)
    r = compile_report(cfg, *compile_args())
    assert r.frame_bytes == 0 and r.spill_bytes == 0 and r.registers <= 128
    assert r.ptx.count("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16") == 8
    for bad in (dict(groups=2), dict(groups=2, tokens=64, cluster=2),
                dict(groups=2, tokens=64, dump=True), dict(tokens=64), dict(groups=3)):
        with pytest.raises(ValueError):
            P1Study(**bad).build()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 8, 32), (64, 256, 256), (200, 520, 1056),
                                   (300, 384, 1056), (150, 704, 512), (700, 1024, 160),
                                   (128, 4096, 2048), (1100, 2048, 320)])
@pytest.mark.parametrize("splits", [1, 2])
def test_p1_group_reuse_within_bound(shape, splits):
    """G = 2: every element within the oracle's bound into a NaN-poisoned output, a rerun
    equal. The shapes: a partial token tile; a last 256-row weight tile with one, two and three
    valid slabs (N = 520, 384, 704); a partial k-block; CTAs that take several tiles (1100 x
    2048: 144 tiles, so accumulators, ring and tile phases carry over). The contract is the
    oracle's bound, not P0's bits: another wgmma shape (m64n64) may round its sums in its own
    order (p1_ab.py --groups 2 reports whether they happen to be equal)."""
    from kernels.nvfp4.gemm_p1 import gemm_nvfp4_p1
    from kernels.nvfp4.quantize import quantize_nvfp4
    from tests.test_gemm_nvfp4 import _check
    M, N, K = shape
    x, g_x, pre, w_q, w_s, g_w = _operands(M, N, K, seed=sum(shape) + splits, kind="lognormal")
    cfg = P1Study(groups=2, tokens=64, splits=splits).build()
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_nvfp4_p1(x, g_x, pre, g_w, out=out, config=cfg)
    again = gemm_nvfp4_p1(x, g_x, pre, g_w, config=cfg)
    q, s = quantize_nvfp4(x, g_x, pad_16x=True)
    torch.cuda.synchronize()
    assert not out.isnan().any()
    _check(out, (q[:M], s, g_x), (w_q, w_s, g_w), M, N, K)
    assert torch.equal(again.view(torch.int16), out.view(torch.int16))
