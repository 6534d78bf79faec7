"""The depth frame's projection tiles with one bulk store a tile (issue #37 item 5, second half;
notes/depth-frame.md, session 29): kernels.depth.frame.FrameBuild.bulk_store, chosen by
schedules.plan.frame_bulk_store (below 64 rows, where the 995e356 A/B measured it faster).

CPU: the plan's rule and DepthFrame's default. Compile tests (CI): the bulk build sends each
epilogue's tile with one ``cp.async.bulk.global.shared::cta`` and completes it before the
signal; the store-a-thread build has none. GPU tests: the two builds' outputs equal bit for bit
(codes, Talker sum, KV, logits) at 1, 13 and 64 rows, given codes and greedy draws.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from schedules.plan import FRAME_RING  # noqa: E402

BULK_STORE = "cp.async.bulk.global.shared::cta.bulk_group"
# the epilogues that store a tile: SwiGLU, the residual, a split tile's plain sums, a whole
# width-16 tile's (head) and a width-32 tile's (qkv)
STORE_SITES = 5


def test_the_plan_takes_the_bulk_store_below_64_rows():
    """DepthFrame's bulk_store=None takes the plan's rule: bulk below 64 rows, where it won."""
    import inspect

    from kernels.depth.frame import DepthFrame
    from schedules import plan

    assert plan.FRAME_BULK_STORE_BELOW_ROWS == 64
    assert all(plan.frame_bulk_store(r) for r in range(1, 64)) and not plan.frame_bulk_store(64)
    assert inspect.signature(DepthFrame).parameters["bulk_store"].default is None


@pytest.mark.compile
def test_bulk_store_build_sends_each_tile_once_and_completes_it_before_the_signal():
    """Five epilogue sites, each one bulk store and one full completion wait (not ``.read``:
    the writes must be performed before the release); fewer per-thread global stores (the
    attention, embedding and ssq stores stay); the same 48 wgmmas, no spills, under 8k SASS
    instructions; the store-a-thread build has no bulk store. The protocol alone (no rows)
    never takes the bulk store."""
    from kernels.depth.frame import FrameBuild, FrameKernel, compile_args
    from tests.test_depth_frame import assert_small_frame_code
    from workbench.compile import compile_report

    def build(bulk, rows=64):
        return FrameBuild(512, 2, False, *FRAME_RING.values(), rows=rows, fused=True,
                          draw="given", norm_once=True, bulk_store=bulk)

    assert FrameKernel(build(True, rows=0)).bulk_store is False
    thread = compile_report(FrameKernel(build(False)), *compile_args())
    bulk = compile_report(FrameKernel(build(True)), *compile_args())
    assert BULK_STORE not in thread.ptx
    assert bulk.ptx.count(BULK_STORE) == STORE_SITES
    assert bulk.ptx.count("cp.async.bulk.wait_group 0;") == STORE_SITES
    assert "cp.async.bulk.wait_group.read" not in bulk.ptx
    assert bulk.ptx.count("st.global.b32") < thread.ptx.count("st.global.b32")
    assert bulk.ptx.count("wgmma.mma_async.sync.aligned.m64n") == 48
    assert_small_frame_code(bulk)


# ---- on the H200 -----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("teacher_forced", [True, False], ids=["given", "greedy"])
@pytest.mark.parametrize("rows", [1, 13, 64])
def test_bulk_store_frame_bits_equal_the_store_a_thread_frame(rows, teacher_forced):
    """The same arithmetic, another store path: every output equal bit for bit, each frame on
    a poisoned arena; every counter at its count, no combine mismatch, and a rerun of the
    bulk frame is bit-identical."""
    from tests.test_depth_frame import _option_outputs, _same

    outs, runs = _option_outputs(rows, teacher_forced, "bulk_store", 200 + rows, rerun=True)
    for on, run in runs.items():
        assert run.kernel.bulk_store == on
    assert torch.isfinite(outs[True].logits).all()
    assert _same(outs[False], outs[True])
