"""P0 v3's study builds (kernels.nvfp4.gemm_shell.V3Study; notes/p0-gemm.md, P0 v3 1(a), 1(c)):
their arguments (CPU), the instructions each build is meant to have (compile), and the exact
ones' bits against the production build (GPU). The per-k16 interleaved consumer measured
beside them lost and left with its tests: ``git show 8438956:tests/test_p0_v3_studies.py``;
the studies on the packed activation expanded in every CTA left in session 27 (``git show
e8e774c:tests/test_p0_v3_studies.py``): every build here reads the f16 activation."""
import functools
import re

import pytest
import torch

from consumers.register_a_wgmma import RegisterAWgmmaConsumer
from epilogues.tile_store import ClusterSplitStore, SplitFixupStudy, TileStore
from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90, V3Study, compile_args
from producers.activation_stage import F16TmaActivationStage
from workbench.compile import compile_report


# ---- arguments (CPU) --------------------------------------------------------------------------
@pytest.mark.parametrize("kw,match", [
    (dict(fixup="scalar"), "fixup"), (dict(activation="bf16"), "activation"),
    (dict(activation="expand"), "activation"),
    (dict(fixup="vector"), "fixup"), (dict(fixup="skip", splits=1), "splits"),
    (dict(stream_k=True, splits=2), "stream_k"), (dict(stream_k=True, fixup="skip"), "stream_k"),
    (dict(consumer="interleaved"), "consumer")])
def test_v3_study_refuses_what_it_cannot_build(kw, match):
    with pytest.raises(ValueError, match=match):
        V3Study(**kw)


def test_v3_study_parts_refuse_bad_arguments():
    with pytest.raises(ValueError, match="buffers"):
        F16TmaActivationStage(128, 8, buffers=1)
    with pytest.raises(ValueError, match="tokens"):
        F16TmaActivationStage(384, 8)
    with pytest.raises(ValueError, match="fixup"):
        SplitFixupStudy(256, splits=2, fixup="vector")
    with pytest.raises(ValueError, match="splits"):
        SplitFixupStudy(256, splits=1)


def test_three_warpgroup_build_roles_and_budget():
    """The f16 TMA in the producer's warpgroup: 384 threads, 40 + 232 + 232 registers at 256
    tokens (over the file with a fourth warpgroup), the f16 tiles the consumer reads are the
    producer's, and 256 tokens refused beside an activation warpgroup."""
    cfg = V3Study(activation="f16_tma_3wg", tokens=256, consumer="pipelined", buffers=4).build()
    assert cfg.threads == 384 and cfg.tile_m == 256
    assert [r.regs for r in cfg.roles] == [40, 232]
    assert cfg.consumer.act_tiles == cfg.producer.tiles
    assert cfg.barrier_table["empty"][1] == 8 and cfg.barrier_table["act_empty"][1] == 8
    with pytest.raises(ValueError, match="registers"):
        V3Study(activation="f16_tma", tokens=256).build()


def test_v3_study_barriers_keys_and_exactness():
    """The f16-TMA builds' ring is the weights' alone (empty[s]: the consumers' 8 warps) and
    their f16 tiles complete by TMA bytes (one arrive); every knob changes the compile key;
    at 4 buffers the study's build is the production swap-AB f16 build; only skip is
    inexact."""
    f16 = V3Study().build()
    assert f16.barrier_table["empty"][1] == 8 and f16.barrier_table["act_full"][1] == 1
    assert f16.barrier_table["act_empty"][1] == 8 and f16.barrier_table["full"][1] == 1
    assert isinstance(f16.consumer, RegisterAWgmmaConsumer) and f16.reads_f16_activation
    assert V3Study(buffers=4).build().static_key() == \
        BlockscaledGemmSm90.swap_ab_f16().static_key()
    assert V3Study(splits=3, buffers=4).build().static_key() == \
        BlockscaledGemmSm90.swap_ab_f16(splits=3).static_key()
    studies = [V3Study(splits=2), V3Study(splits=2, fixup="skip"), V3Study(),
               V3Study(stream_k=True), V3Study(consumer="pipelined", buffers=4),
               V3Study(activation="f16_tma_3wg", consumer="pipelined", buffers=4)]
    keys = {s.build().static_key() for s in studies}
    assert len(keys) == len(studies)
    assert [s.exact for s in studies] == [True, False, True, True, True, True]
    assert TileStore(256, splits=2).key() == SplitFixupStudy(256, splits=2).key()[:5]


@pytest.mark.parametrize("kw,match", [
    (dict(fixup="dsmem", splits=1), "splits"), (dict(fixup="dsmem", splits=4), "dsmem"),
    (dict(fixup="dsmem", stream_k=True), "stream_k")])
def test_dsmem_fixup_refuses_what_it_cannot_build(kw, match):
    """The K-split cluster is built for 2 and 3 splits (#34 1(a)), never under stream-K."""
    with pytest.raises(ValueError, match=match):
        V3Study(**kw)


def test_dsmem_fixup_parts_refuse_bad_arguments():
    """The epilogue refuses other cluster sizes; the shell refuses a K-split cluster whose
    split count differs from the config's, or on the M-major raster (the epilogue counts a
    CTA's tiles by tile id, which is the work item only under the N-major raster)."""
    with pytest.raises(ValueError, match="K-split cluster"):
        ClusterSplitStore(256, splits=4)
    with pytest.raises(ValueError, match="K-split cluster"):
        ClusterSplitStore(256, splits=1)
    with pytest.raises(ValueError, match="stream_k"):  # stream-K's tiles are not clusters
        ClusterSplitStore(256, splits=2, stream_k=True)
    cfg = V3Study(splits=2).build()
    epi = ClusterSplitStore(cfg.consumer.threads, splits=2)
    with pytest.raises(ValueError, match="K-split cluster"):
        BlockscaledGemmSm90.from_roles("swap_ab", cfg.producer, cfg.consumer, cfg.activation,
                                       splits=2, raster_along_m=True, epilogue=epi)
    with pytest.raises(ValueError, match="fixup"):
        SplitFixupStudy(256, splits=2, fixup="dsmem")  # the study keeps "skip" only


@pytest.mark.parametrize("splits", [2, 3])
def test_dsmem_fixup_config(splits):
    """The DSMEM build: its two mbarriers (one each, S - 1 arrivals: one thread of each
    peer), its receive buffer ((S - 1) slots of ceil(16 / S) vectors x 256 threads x 16 B)
    beside production's shared memory, no global workspace, clusters of S along K, its own
    compile key, exact."""
    prod, study = V3Study(splits=splits).build(), V3Study(splits=splits, fixup="dsmem")
    cfg = study.build()
    assert study.exact and cfg.cluster_k == splits and cfg.cluster_n == 1
    assert prod.cluster_k == 1 and "fix_full" not in prod.barrier_table
    assert cfg.barrier_table["fix_full"][:2] == (1, splits - 1)
    assert cfg.barrier_table["fix_free"][:2] == (1, splits - 1)
    recv = (splits - 1) * -(-16 // splits) * 256 * 16
    assert cfg.smem_bytes == prod.smem_bytes + recv + 16  # + the two mbarriers
    assert cfg.workspace_floats(128, 5376, 5376, 132) == (0, 42)
    assert prod.workspace_floats(128, 5376, 5376, 132)[0] > 0
    assert cfg.static_key() != prod.static_key()
    assert cfg.describe()["cluster_k"] == splits and cfg.describe()["fixup"] == "cluster"


def test_p0_v3_ab_part_a_rows(monkeypatch):
    """scripts/p0_v3_ab.py part a (CPU: launches stubbed): per split 2 and 3 the production
    store, counters kept, the DSMEM cluster (exact: checked against production's bits) and the
    skip build (inexact); fixup_us = each row minus the skip build of its shape and split."""
    import scripts.p0_v3_ab as ab
    monkeypatch.setattr(ab, "StudyLaunch", lambda cfg, M, N, K: ("launch", cfg))
    rows = ab.variants("a", 128, 5376, 5376)
    labels = [label for label, *_ in rows]
    assert labels == ["s1 production"] + [
        f"s{sp} {v}" for sp in (2, 3) for v in (
            "production", "production, counters kept", "fixup dsmem cluster", "fixup skip")]
    for label, cfg, _call, exact in rows:
        assert exact == ("skip" not in label)
        assert (cfg.cluster_k > 1) == ("dsmem" in label)
    timed = [{"part": "a", "projection": "out", "config": label, "splits": cfg.splits,
              "us": us, "ns_per_kblock": 1.0, "exact_promised": exact}
             for (label, cfg, _c, exact), us in zip(rows, (55, 36, 35, 25, 30, 29, 28, 24, 22))]
    ab.derive(timed)
    fix = {r["config"]: r.get("fixup_us") for r in timed}
    assert fix["s1 production"] is None
    assert fix["s2 fixup dsmem cluster"] == 25 - 30 and fix["s3 fixup dsmem cluster"] == 24 - 22
    assert fix["s3 production"] == 29 - 22 and fix["s3 fixup skip"] == 0
    assert "dsmem" in ab.table(timed)


# ---- compile (CI) -----------------------------------------------------------------------------
# (the f16 names of the production, fixup and stream-K builds: their packed-activation builds
# of the same names before session 27 left the code, so PTX dumps do not pair them)
BUILDS = {
    "production-f16-s3": V3Study(splits=3, buffers=4),
    "skip-f16-s3": V3Study(splits=3, fixup="skip", buffers=4),
    "dsmem-f16-s2": V3Study(splits=2, fixup="dsmem", buffers=4),
    "dsmem-f16-s3": V3Study(splits=3, fixup="dsmem", buffers=4),
    "f16-serial": V3Study(activation="f16_tma"),
    "f16-stream-k": V3Study(stream_k=True, buffers=4),
    "f16-pipelined": V3Study(consumer="pipelined", activation="f16_tma", buffers=4),
    "3wg-128": V3Study(consumer="pipelined", activation="f16_tma_3wg", buffers=4),
    "3wg-256": V3Study(consumer="pipelined", activation="f16_tma_3wg", buffers=4, tokens=256),
    "3wg-256-stream-k": V3Study(consumer="pipelined", activation="f16_tma_3wg", buffers=4,
                                tokens=256, stream_k=True),
}


@functools.cache
def _build(name):
    return compile_report(BUILDS[name].build(), *compile_args())


@pytest.mark.compile
@pytest.mark.parametrize("name", BUILDS)
def test_v3_builds_compile_without_spills(name):
    r = _build(name)
    three = name.startswith("3wg")  # 384 threads: ptxas's cap is 168 registers, not 128
    assert r.frame_bytes == 0 and r.registers <= (168 if three else 128)
    assert r.census["wgmma.mma_async"] == 4 and r.census["setmaxnreg"] == (2 if three else 3)
    if r.sass is None:
        pytest.skip("nvdisasm is not installed (pip nvidia-cuda-nvdisasm): SASS not checked")
    assert r.spill_bytes == 0 and "CALL.ABS" not in r.sass
    assert r.sass.count(f"HGMMA.64x{256 if name.startswith('3wg-256') else 128}x16.F32") == 4


@pytest.mark.compile
def test_split_fixup_stores_and_reads_16_byte_partials():
    """The production split-K store: 32 accumulator pairs a thread, 16 vector stores; the last
    CTA 16 vector loads per split, no scalar partial access, one acq_rel arrival per tile."""
    r = _build("production-f16-s3")
    assert r.census["st.global.v4"] == 16 and r.census["atom"] == 1
    assert r.ptx.count("ld.relaxed.gpu.global.v4.f32") == 16 * 3
    assert "ld.relaxed.gpu.global.f32" not in r.ptx and "st.global.f32" not in r.ptx
    if r.sass is not None:
        assert r.sass.count("STG.E.128") == 16
        assert len(re.findall(r"LDG\.E\.128\.STRONG\.GPU", r.sass)) == 48


@pytest.mark.compile
def test_stream_k_reduces_a_counted_number_of_segments():
    """Stream-K: the same 16-byte partial stores and one arrival; the reduce reads segment 0's
    16 vectors, then each further segment's 16 in a loop the tile's segment count bounds (not
    unrolled: 32 vector loads in the PTX); a tile inside one CTA's share stores directly."""
    r = _build("f16-stream-k")
    assert r.census["st.global.v4"] == 16 and r.census["atom"] == 1
    assert r.ptx.count("ld.relaxed.gpu.global.v4.f32") == 32
    assert "ld.relaxed.gpu.global.f32" not in r.ptx and "st.global.f32" not in r.ptx


def _instructions(text: str) -> list:
    """SASS instruction texts (no addresses, no trailing ';')."""
    out = []
    for ln in text.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;", ln)
        if m:
            out.append(m.group(1))
    return out


def _k_loop(sass: str) -> list:
    """The consumer's k-block loop: from the label the branch after the last HGMMA jumps back
    to, through that branch."""
    lines = sass.splitlines()
    last = max(i for i, ln in enumerate(lines) if "HGMMA" in ln)
    j = next(i for i in range(last, len(lines)) if "BRA" in lines[i])
    label = re.search(r"\(\.(L_x_\d+)\)", lines[j]).group(1)
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith(f".{label}:"))
    return _instructions("\n".join(lines[start:j + 1]))


_NO_REGISTER_DEST = ("ST", "RED", "BRA", "BAR", "SYNCS", "WARPGROUP", "HGMMA", "EXIT", "CCTL",
                     "BPT", "NOP", "WARPSYNC", "BSSY", "BSYNC", "MEMBAR", "FENCE", "CALL", "RET",
                     "UTMA", "UBLKCP", "DEPBAR")


def _a_register_hazards(loop: list) -> list:
    """Instructions of the k-loop (run twice, for the wrap-around) that write a register an
    in-flight HGMMA reads as its A operand: an HGMMA stays in flight until a
    ``WARPGROUP.DEPBAR.LE gsb0, n`` leaves fewer than its place in the queue."""
    pending, bad = [], []
    for ins in loop + loop:
        ins = re.sub(r"^@!?U?P\w+\s+", "", ins)
        op = ins.split()[0]
        m = re.match(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x(\d+)", ins)
        if m:
            n = int(m.group(1))
            pending = pending[len(pending) - n:] if n else []
        elif op.startswith("HGMMA"):
            a = re.match(r"HGMMA\S*\s+R\d+, R(\d+),", ins)
            if a:
                pending.append(set(range(int(a.group(1)), int(a.group(1)) + 4)))
        elif not op.startswith(_NO_REGISTER_DEST) and (d := re.match(r"\S+\s+R(\d+)\b", ins)):
            width = 4 if ".128" in op else 2 if (".64" in op or "WIDE" in op) else 1
            if any(set(range(int(d.group(1)), int(d.group(1)) + width)) & p for p in pending):
                bad.append(ins)
    return bad


@pytest.mark.compile
@pytest.mark.parametrize("name", ["f16-pipelined", "3wg-128", "3wg-256"])
def test_pipelined_consumer_keeps_two_wgmmas_in_flight(name):
    """Each k16 wgmma its own group followed by ``wait_group(2)``; in the SASS k-loop four
    HGMMAs each followed by ``DEPBAR.LE gsb0, 0x2`` (no 0x0: ptxas did not serialise them),
    conversions between them, and no register an in-flight HGMMA reads rewritten before the
    DEPBAR that retires it."""
    r = _build(name)
    assert r.ptx.count("wgmma.commit_group") == 4
    assert len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+2;", r.ptx)) == 4
    if r.sass is None:
        pytest.skip("nvdisasm is not installed (pip nvidia-cuda-nvdisasm): SASS not checked")
    loop = _k_loop(r.sass)
    hgmma = [i for i, ins in enumerate(loop) if ins.startswith("HGMMA")]
    assert len(hgmma) == 4 and all("gsb0" in loop[i] for i in hgmma)
    depbars = [ins for ins in loop if ins.startswith("WARPGROUP.DEPBAR")]
    assert depbars == ["WARPGROUP.DEPBAR.LE gsb0, 0x2"] * 4
    between = [sum(ins.startswith("F2FP") for ins in loop[i + 1:j])
               for i, j in zip(hgmma, hgmma[1:])]
    assert all(between), f"an HGMMA pair with no F2FP between them: {between}"
    assert _a_register_hazards(loop) == []


@pytest.mark.compile
def test_skipped_fixup_has_no_partials_and_no_counter():
    r = _build("skip-f16-s3")
    assert r.census["atom"] == 0 and r.census["st.global.v4"] == 0
    assert "ld.relaxed.gpu" not in r.ptx and "fence.acq_rel.gpu" not in r.ptx


@pytest.mark.compile
@pytest.mark.parametrize("splits", [2, 3])
def test_dsmem_fixup_exchanges_partials_on_chip(splits):
    """The K-split cluster's fixup: each thread's 16 vectors sent as 16-byte
    ``st.shared::cluster`` stores (one code path per receiving rank, 16 in all), its share read
    back from its own shared memory (S - 1 peers' vectors of each rank's share), two
    handshakes of S - 1 cluster-scope release arrives (S sites each, one skipped at run time)
    and cluster-scope acquires, the cluster's arm and exit barriers; no global workspace store
    or load, no atomic, no gpu-scope fence; production's registers, no spill."""
    r = _build(f"dsmem-f16-s{splits}")
    assert r.ptx.count("st.shared::cluster.v4.f32") == 16
    assert r.ptx.count("ld.shared.v4.f32") == 16 * (splits - 1)
    assert r.ptx.count("mbarrier.arrive.release.cluster.shared::cluster") == 2 * splits
    assert r.ptx.count("mbarrier.try_wait.parity.acquire.cluster") == 4  # 2 waits, 2 sites
    assert r.ptx.count("barrier.cluster.arrive") == 2 and r.ptx.count("barrier.cluster.wait") == 2
    assert r.census["atom"] == 0 and r.census["st.global.v4"] == 0
    assert "ld.relaxed.gpu" not in r.ptx and "fence.acq_rel.gpu" not in r.ptx
    assert r.registers == _build("production-f16-s3").registers and r.frame_bytes == 0
    if r.sass is not None:
        assert r.spill_bytes == 0


@pytest.mark.compile
def test_f16_activation_comes_by_tma_unexpanded():
    """One TMA (the f16 tile), two weight slabs by bulk copy, no activation expansion: the only
    conversions left are the consumer's 4 k16 steps x (4 + 1)."""
    r = _build("f16-serial")
    assert r.census["cp.async.bulk.tensor"] == 1
    assert r.ptx.count("cp.async.bulk.shared::cluster.global.mbarrier") == 4
    assert r.ptx.count("cvt.rn.f16x2.e4m3x2") == 20
    assert "st.shared.v4" not in r.ptx


@pytest.mark.compile
def test_production_swap_ab_f16_ptx_is_the_studies_baseline():
    """The study's build at 4 buffers is the production swap-AB f16 build, the same PTX."""
    a = compile_report(BlockscaledGemmSm90.swap_ab_f16(splits=3), *compile_args()).ptx
    b = compile_report(V3Study(splits=3, buffers=4).build(), *compile_args()).ptx
    assert a == b


# ---- exactness (GPU) ----------------------------------------------------------------------------
@pytest.mark.gpu
def test_v3_exact_studies_equal_production_bits():
    """On one small shape (whole tiles), every exact study equals the production build's bits
    at the same split, fills a NaN-poisoned output, and reruns identically."""
    from scripts.p0_v3_ab import StudyLaunch, operands
    M, N, K = 128, 512, 2048
    a, b, pre, x16 = operands(M, N, K, seed=7)
    pipelined = dict(consumer="pipelined", buffers=4)
    for splits, studies in ((1, [V3Study(), V3Study(**pipelined),
                                 V3Study(activation="f16_tma_3wg", **pipelined)]),
                            (2, [V3Study(splits=2), V3Study(splits=2, **pipelined)])):
        base = StudyLaunch(BlockscaledGemmSm90.swap_ab_f16(splits=splits), M, N, K)(
            a, b, pre, x16, torch.empty(M, N, dtype=torch.bfloat16, device="cuda"))
        for study in studies:
            launch = StudyLaunch(study.build(), M, N, K)
            out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
            launch(a, b, pre, x16, out)
            again = launch(a, b, pre, x16, torch.empty_like(out))
            torch.cuda.synchronize()
            assert not out.isnan().any(), study
            assert torch.equal(out.view(torch.int16), base.view(torch.int16)), study
            assert torch.equal(again.view(torch.int16), out.view(torch.int16)), study


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(128, 512, 2048), (128, 5376, 1024), (300, 520, 1056),
                                   (700, 384, 160), (1000, 2056, 512)])
@pytest.mark.parametrize("splits", [2, 3])
def test_dsmem_fixup_equals_production_bits(shape, splits):
    """The K-split cluster's DSMEM fixup against the production (vectorised, global) fixup at
    the same split: the same bits into a NaN-poisoned output, and 4 reruns identical. Shapes:
    whole tiles; out's N at M = 128 (42 clusters); ragged M and N; 3 k-blocks over the splits
    (s3: one each); 136 tiles, more clusters than the grid holds (66 at s2, 44 at s3), so a
    CTA takes 2-4 tiles and the handshakes' phases turn over."""
    from scripts.p0_v3_ab import StudyLaunch, operands
    M, N, K = shape
    a, b, pre, x16 = operands(M, N, K, seed=sum(shape) + splits)
    base = StudyLaunch(BlockscaledGemmSm90.swap_ab_f16(splits=splits), M, N, K)(
        a, b, pre, x16, torch.empty(M, N, dtype=torch.bfloat16, device="cuda"))
    launch = StudyLaunch(V3Study(splits=splits, fixup="dsmem", buffers=4).build(), M, N, K)
    assert launch.work is None  # no global workspace or counters on this path
    outs = [launch(a, b, pre, x16, torch.full((M, N), float("nan"), dtype=torch.bfloat16,
                                               device="cuda")) for _ in range(4)]
    torch.cuda.synchronize()
    assert not outs[0].isnan().any()
    assert torch.equal(outs[0].view(torch.int16), base.view(torch.int16))
    for again in outs[1:]:
        assert torch.equal(again.view(torch.int16), outs[0].view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 8, 32), (128, 512, 2048), (300, 520, 1056),
                                   (700, 384, 160)])
@pytest.mark.parametrize("splits", [1, 3])
def test_pipelined_consumer_within_bound_on_ragged_shapes(shape, splits):
    """One k-block (the prologue alone), splits with one k-block each or none (700 x 384 x 160:
    3 k-blocks over 3 splits), ragged M, N and K: every element within the oracle's bound,
    reruns identical, P4's fused output exact."""
    from tests.test_gemm_nvfp4 import _swap_ab_within_bound
    cfg = V3Study(consumer="pipelined", buffers=4, splits=splits).build()
    _swap_ab_within_bound(*shape, seed=sum(shape) + splits + 5, cfg=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 8, 32), (300, 520, 1056), (512, 1024, 2048),
                                   (700, 384, 160)])
@pytest.mark.parametrize("splits", [1, 2, 0])
def test_256_token_build_within_bound(shape, splits):
    """The large-M candidate (three warpgroups, 256 tokens, m64n256k16, pipelined; ``splits``
    0: on stream-K): every element within the oracle's bound into a NaN-poisoned output, a
    rerun identical (its bits may differ from the 128-token build's: another wgmma shape)."""
    from numerics import nvfp4
    from scripts.p0_v3_ab import StudyLaunch
    from tests.test_gemm_nvfp4 import _check, _operands
    from kernels.nvfp4.prepack import prepack
    M, N, K = shape
    a, b = _operands("normal", "lognormal", M, N, K, seed=sum(shape) + splits)
    x16 = nvfp4.dequantize(a[0], a[1], 1.0, (M, K), dtype=torch.float16).contiguous()
    g = [torch.tensor([float(x[2])], dtype=torch.float32, device="cuda") for x in (a, b)]
    cfg = V3Study(activation="f16_tma_3wg", tokens=256, consumer="pipelined", buffers=4,
                  splits=max(splits, 1), stream_k=splits == 0).build()
    launch = StudyLaunch(cfg, M, N, K)
    args = ((a[0], a[1], g[0]), (b[0], b[1], g[1]), prepack(b[0], b[1]), x16)
    out = launch(*args, torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda"))
    again = launch(*args, torch.empty(M, N, dtype=torch.bfloat16, device="cuda"))
    torch.cuda.synchronize()
    assert not out.isnan().any()
    _check(out, a, b, M, N, K)
    assert torch.equal(again.view(torch.int16), out.view(torch.int16))
