"""P0 v3's study builds (kernels.nvfp4.gemm_shell.V3Study; notes/p0-gemm.md, P0 v3 1(a), 1(c)):
their arguments (CPU), the instructions each build is meant to have (compile), and the exact
ones' bits against the production build (GPU). The per-k16 interleaved consumer measured
beside them lost and left with its tests: ``git show 8438956:tests/test_p0_v3_studies.py``."""
import functools
import re

import pytest
import torch

from consumers.register_a_wgmma import RegisterAWgmmaConsumer
from epilogues.tile_store import SplitFixupStudy, TileStore
from kernels.nvfp4.gemm_shell import BlockscaledGemmSm90, V3Study, compile_args
from producers.activation_stage import F16TmaActivationStage
from workbench.compile import compile_report


# ---- arguments (CPU) --------------------------------------------------------------------------
@pytest.mark.parametrize("kw,match", [
    (dict(fixup="scalar"), "fixup"), (dict(activation="bf16"), "activation"),
    (dict(fixup="vector"), "fixup"), (dict(fixup="skip", splits=1), "splits")])
def test_v3_study_refuses_what_it_cannot_build(kw, match):
    with pytest.raises(ValueError, match=match):
        V3Study(**kw)


def test_v3_study_parts_refuse_bad_arguments():
    with pytest.raises(ValueError, match="buffers"):
        F16TmaActivationStage(128, 8, buffers=1)
    with pytest.raises(ValueError, match="tokens"):
        F16TmaActivationStage(256, 8)
    with pytest.raises(ValueError, match="fixup"):
        SplitFixupStudy(256, splits=2, fixup="dsmem")
    with pytest.raises(ValueError, match="splits"):
        SplitFixupStudy(256, splits=1)


def test_v3_study_barriers_keys_and_exactness():
    """The f16-TMA builds' ring is the weights' alone (empty[s]: the consumers' 8 warps) and
    their f16 tiles complete by TMA bytes (one arrive); every knob changes the compile key;
    the production build is the swap-AB default; only skip is inexact."""
    f16 = V3Study(activation="f16_tma").build()
    assert f16.barrier_table["empty"][1] == 8 and f16.barrier_table["act_full"][1] == 1
    assert f16.barrier_table["act_empty"][1] == 8 and f16.barrier_table["full"][1] == 1
    assert isinstance(f16.consumer, RegisterAWgmmaConsumer)
    expand = V3Study().build()
    assert expand.barrier_table["empty"][1] == 12 and expand.barrier_table["act_full"][1] == 4
    assert V3Study().build().static_key() == BlockscaledGemmSm90.swap_ab().static_key()
    assert V3Study(splits=3).build().static_key() == \
        BlockscaledGemmSm90.swap_ab(splits=3).static_key()
    studies = [V3Study(splits=2), V3Study(splits=2, fixup="skip"), V3Study(activation="f16_tma"),
               V3Study(splits=2, activation="f16_tma")]
    keys = {s.build().static_key() for s in studies}
    assert len(keys) == len(studies)
    assert [s.exact for s in studies] == [True, False, True, True]
    assert TileStore(256, splits=2).key() == SplitFixupStudy(256, splits=2).key()[:5]


# ---- compile (CI) -----------------------------------------------------------------------------
BUILDS = {
    "production-s3": V3Study(splits=3),
    "skip-s3": V3Study(splits=3, fixup="skip"),
    "f16-serial": V3Study(activation="f16_tma"),
}


@functools.cache
def _build(name):
    return compile_report(BUILDS[name].build(), *compile_args())


@pytest.mark.compile
@pytest.mark.parametrize("name", BUILDS)
def test_v3_builds_compile_without_spills(name):
    r = _build(name)
    assert r.frame_bytes == 0 and r.registers <= 128
    assert r.census["wgmma.mma_async"] == 4 and r.census["setmaxnreg"] == 3
    if r.sass is None:
        pytest.skip("nvdisasm is not installed (pip nvidia-cuda-nvdisasm): SASS not checked")
    assert r.spill_bytes == 0 and "CALL.ABS" not in r.sass
    assert r.sass.count("HGMMA.64x128x16.F32") == 4


@pytest.mark.compile
def test_split_fixup_stores_and_reads_16_byte_partials():
    """The production split-K store: 32 accumulator pairs a thread, 16 vector stores; the last
    CTA 16 vector loads per split, no scalar partial access, one acq_rel arrival per tile."""
    r = _build("production-s3")
    assert r.census["st.global.v4"] == 16 and r.census["atom"] == 1
    assert r.ptx.count("ld.relaxed.gpu.global.v4.f32") == 16 * 3
    assert "ld.relaxed.gpu.global.f32" not in r.ptx and "st.global.f32" not in r.ptx
    if r.sass is not None:
        assert r.sass.count("STG.E.128") == 16
        assert len(re.findall(r"LDG\.E\.128\.STRONG\.GPU", r.sass)) == 48


@pytest.mark.compile
def test_skipped_fixup_has_no_partials_and_no_counter():
    r = _build("skip-s3")
    assert r.census["atom"] == 0 and r.census["st.global.v4"] == 0
    assert "ld.relaxed.gpu" not in r.ptx and "fence.acq_rel.gpu" not in r.ptx


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
def test_production_swap_ab_ptx_is_the_studies_baseline():
    """The study's production build is the swap-AB default, the same PTX."""
    a = compile_report(BlockscaledGemmSm90.swap_ab(splits=3), *compile_args()).ptx
    b = compile_report(V3Study(splits=3).build(), *compile_args()).ptx
    assert a == b


# ---- exactness (GPU) ----------------------------------------------------------------------------
@pytest.mark.gpu
def test_v3_exact_studies_equal_production_bits():
    """On one small shape (whole tiles), every exact study equals the production build's bits
    at the same split, fills a NaN-poisoned output, and reruns identically."""
    from scripts.p0_v3_ab import StudyLaunch, operands
    M, N, K = 128, 512, 2048
    a, b, pre, x16 = operands(M, N, K, seed=7)
    for splits, studies in ((1, [V3Study(activation="f16_tma")]),
                            (2, [
                                 V3Study(splits=2, activation="f16_tma")])):
        base = StudyLaunch(V3Study(splits=splits).build(), M, N, K)(
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
