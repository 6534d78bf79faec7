"""The depth frame's projection tiles with one bulk store a tile (issue #37 item 5, second half;
notes/depth-frame.md, session 29), a study build (experiments._frame_studies.FrameStudyKernel
``bulk_store``) timed against the production frame by scripts/frame_code_size.py.

Compile tests (CI): the study build sends each epilogue's tile with one
``cp.async.bulk.global.shared::cta`` and completes it before the signal; the production build
has none. GPU tests: the study build's outputs equal the production frame's bit for bit (codes,
Talker sum, KV, logits) at 1, 13 and 64 rows, given codes and greedy draws.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from configs.codepredictor import QWEN3_TTS_1P7B as CFG  # noqa: E402
from schedules.plan import FRAME_RING  # noqa: E402

BULK_STORE = "cp.async.bulk.global.shared::cta.bulk_group"
# the epilogues that store a tile: SwiGLU, the residual, a split tile's plain sums, a whole
# width-16 tile's (head) and a width-32 tile's (qkv)
STORE_SITES = 5


@pytest.mark.compile
def test_bulk_store_build_sends_each_tile_once_and_completes_it_before_the_signal():
    """Five epilogue sites, each one bulk store and one full completion wait (not ``.read``:
    the writes must be performed before the release); fewer per-thread global stores (the
    attention, embedding and ssq stores stay); the same 48 wgmmas, no spills; the production
    build has no bulk store and takes no bulk_store knob."""
    import inspect

    from experiments._frame_studies import FrameStudyKernel
    from kernels.depth.frame import FrameBuild, FrameKernel, compile_args
    from workbench.compile import compile_report

    build = FrameBuild(512, 2, False, *FRAME_RING.values(), rows=64, fused=True, draw="given",
                       norm_once=True)
    assert FrameKernel.bulk_store is False
    assert "bulk_store" not in inspect.signature(FrameKernel.__init__).parameters
    whole = compile_report(FrameKernel(build), *compile_args())
    bulk = compile_report(FrameStudyKernel(build, bulk_store=True), *compile_args())
    assert BULK_STORE not in whole.ptx
    assert bulk.ptx.count(BULK_STORE) == STORE_SITES
    assert bulk.ptx.count("cp.async.bulk.wait_group 0;") == STORE_SITES
    assert "cp.async.bulk.wait_group.read" not in bulk.ptx
    assert bulk.ptx.count("st.global.b32") < whole.ptx.count("st.global.b32")
    assert bulk.ptx.count("wgmma.mma_async.sync.aligned.m64n") == 48
    assert bulk.spill_bytes == 0 and bulk.frame_bytes == 0


# ---- on the H200 -----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("teacher_forced", [True, False], ids=["given", "greedy"])
@pytest.mark.parametrize("rows", [1, 13, 64])
def test_bulk_store_frame_bits_equal_the_production_frame(rows, teacher_forced):
    """The same arithmetic, another store path: every output equal bit for bit, both runs on
    a poisoned arena; every counter at its count and no combine mismatch."""
    from experiments._frame_studies import FrameStudyRun, same_bits, snapshot_outputs
    from kernels.depth.frame import DepthFrame
    from tests.test_depth_frame import _inputs, _weights

    _, fw = _weights()
    h, g0 = _inputs(rows, seed=rows)
    g = torch.Generator(device="cuda").manual_seed(200 + rows)
    codes = (torch.randint(0, CFG.vocab, (rows, CFG.heads_drawn), generator=g, device="cuda")
             if teacher_forced else None)
    frame = DepthFrame(fw, rows, teacher_forced=teacher_forced)
    frame.poison()
    want = snapshot_outputs(frame(h, g0, codes))
    frame.run.synchronize()
    production = frame.run
    frame.run = FrameStudyRun(frame.schedule, weights=production.weights,
                              io=(frame.phases, frame.arena), fused=True, draw=frame.draw,
                              bulk_store=True)
    frame.poison()
    got = snapshot_outputs(frame(h, g0, codes))
    frame.run.synchronize()
    assert frame.run.check() == {"counters_at_expected": True, "combine_mismatches": 0}
    assert torch.isfinite(got.logits).all()
    assert same_bits(got, want)
