"""The depth frame's per-chunk waits (FrameOptions(chunk_waits=True), issue #37 item 5, first
half): o and down wait, K stage by K stage, for the attention / gate-up tasks that write that
stage's K range instead of the whole producer phase (schedules/depth_frame.py builds and
validates the chunk counters: tests/test_depth_frame_schedule.py). Here: the plan's rule and
DepthFrame's keyword, the launch's refusals and the traced chain's reading of chunked tasks
(CPU); the build's chunk path (compile: runtime-selected, so the production kernel carries it);
and on the H200 the chunked frame's bits against the whole-phase frame's."""
from __future__ import annotations

import inspect

import pytest
import torch

from configs.codepredictor import QWEN3_TTS_1P7B
from schedules import depth_frame as D
from schedules.plan import FRAME_RING

CFG = QWEN3_TTS_1P7B


def _schedule(rows, chunk_waits=True, **kw):
    return D.build(CFG, D.FrameOptions(rows=rows, chunk_waits=chunk_waits, **FRAME_RING, **kw))


# ---- CPU -------------------------------------------------------------------------------------
def test_the_plan_takes_chunk_waits_at_every_row_count():
    """DepthFrame's chunk_waits=None takes the plan's rule, which the H200 A/B
    (scripts/ab_frame_option.py, 23c1df6) set to every row count."""
    from kernels.depth.frame import DepthFrame
    from schedules import plan

    assert plan.FRAME_CHUNK_WAITS_FROM_ROWS == 1
    assert all(plan.frame_chunk_waits(r) for r in range(1, 65))
    assert inspect.signature(DepthFrame).parameters["chunk_waits"].default is None


def test_launch_refuses_chunk_waits_where_no_body_waits_per_stage():
    """A chunked schedule needs a build whose o and down bodies wait per K stage, with the
    schedule's chunk as the K stage: the protocol alone, a study without those bodies or
    another K stage would wait on the first chunk only (check_chunk_waits refuses them)."""
    from experiments._frame_studies import FrameStudyKernel, TileStudy, TileStudyKernel
    from kernels.depth.frame import FrameBuild, FrameKernel, check_chunk_waits

    for rows in (1, 64):
        s = _schedule(rows)
        build = FrameBuild(512, 2, False, *FRAME_RING.values(), rows=rows, fused=True)
        check_chunk_waits(s, FrameKernel(build))  # the frame's own build
        check_chunk_waits(_schedule(rows, chunk_waits=False),
                          FrameKernel(FrameBuild(512, 2, False)))  # unchunked: anything
        with pytest.raises(ValueError, match="o and down bodies"):
            check_chunk_waits(s, FrameKernel(FrameBuild(512, 2, False, *FRAME_RING.values())))
        with pytest.raises(ValueError, match="o and down bodies"):
            check_chunk_waits(s, FrameStudyKernel(build, bodies=(D.QKV, D.GATEUP)))
    other = TileStudyKernel(FrameBuild(512, 2, False, *FRAME_RING.values(), rows=1, fused=True),
                            study=TileStudy(k_stage=256))
    with pytest.raises(ValueError, match="K stage"):
        check_chunk_waits(_schedule(1), other)


def test_traced_chain_binds_a_chunked_task_to_its_latest_chunk():
    """experiments/frame_protocol.py reads a chunked task's counters as all its chunks: the
    dependency depth counts every chunk's signallers, and the chain walks back to the chunk
    whose last signaller was ready last."""
    from experiments.frame_protocol import _waited_counters, critical_chain, critical_path

    s = D.validate(_schedule(1))
    c, i, t = next((c, i, t) for c, lst in enumerate(s.ctas) for i, t in enumerate(lst)
                   if t.wait_chunks > 1)
    assert _waited_counters(t) == [t.wait + j for j in range(t.wait_chunks)]
    assert critical_path(s) == critical_path(_schedule(1, chunk_waits=False))
    # every task at 0 but the chunked task (the last to end, waited at 5 µs) and one signaller
    # of its first chunk (ready at 1 µs), on another CTA: the chain's handoff is 4 µs only if
    # it binds the task to that chunk (its other chunks' signallers were ready at 0)
    stamps = [[(0,) * 6 for _ in lst] for lst in s.ctas]
    lc, li = next((c2, i2) for c2, lst in enumerate(s.ctas) for i2, u in enumerate(lst)
                  if u.signal == t.wait and c2 != c)
    stamps[lc][li] = (0, 0, 0, 0, 1000, 1000)
    stamps[c][i] = (5000, 5000, 5000, 5000, 5000, 10_000)
    chain = critical_chain(s, stamps)
    assert chain["handoff_us"] == pytest.approx(4.0) and chain["program_order_us"] == 0
    assert chain["epilogue_us"] == pytest.approx(1.0)  # the signaller's ready, then back to 0


def test_traced_chain_counts_the_steps_a_second_lane_could_start_earlier():
    """A chain step bound by program order counts as a busy CTA (``cta_busy_edges``) only where
    the previous task on the CTA signals none of the task's counters; its ``cta_busy_us`` is
    how much earlier a second lane could have started it: from the later of its inputs ready
    and task i - 2's end, to task i - 1's end. Where the previous task signals one of its
    counters (even one whose last signaller is another task), the order is the data's: 0."""
    from experiments.frame_protocol import critical_chain

    s = D.validate(_schedule(1, chunk_waits=False))
    blank = [[(0,) * 6 for _ in lst] for lst in s.ctas]
    # a task with two predecessors on its CTA, neither of which signals its counter
    c, i, t = next((c, i, t) for c, lst in enumerate(s.ctas) for i, t in enumerate(lst)
                   if i >= 2 and t.wait >= 0 and t.wait2 < 0 and lst[i - 1].signal != t.wait)
    lc, li = next((c2, i2) for c2, lst in enumerate(s.ctas) for i2, u in enumerate(lst)
                  if u.signal == t.wait and c2 != c)
    stamps = [list(row) for row in blank]
    stamps[lc][li] = (0, 0, 0, 0, 2000, 2000)  # inputs ready at 2 µs
    stamps[c][i - 1] = (1000, 1000, 1000, 1000, 6000, 7000)  # the CTA busy until 7 µs
    stamps[c][i] = (7000, 7000, 7000, 7000, 8000, 20_000)  # the last task to end
    chain = critical_chain(s, stamps)
    assert chain["cta_busy_edges"] == 1
    assert chain["cta_busy_us"] == pytest.approx(5.0)  # could have started at 2, not 7
    stamps[c][i - 2] = (0, 0, 0, 0, 3000, 4000)  # the second lane free only at 4 µs
    assert critical_chain(s, stamps)["cta_busy_us"] == pytest.approx(3.0)
    # the previous task signals the counter, another signaller of it is ready later: data order
    d, j, u = next((d, j, u) for d, lst in enumerate(s.ctas) for j, u in enumerate(lst)
                   if j and u.wait >= 0 and u.wait2 < 0 and lst[j - 1].signal == u.wait
                   and sum(w.signal == u.wait for x in s.ctas for w in x) > 1)
    other = next((d2, j2) for d2, lst in enumerate(s.ctas) for j2, w in enumerate(lst)
                 if w.signal == u.wait and (d2, j2) != (d, j - 1))
    stamps = [list(row) for row in blank]
    stamps[other[0]][other[1]] = (0, 0, 0, 0, 3000, 3000)
    stamps[d][j - 1] = (1000, 1000, 1000, 1000, 2000, 7000)
    stamps[d][j] = (7000, 7000, 7000, 7000, 8000, 20_000)
    chain = critical_chain(s, stamps)
    assert chain["program_order_us"] == 0
    assert chain["cta_busy_edges"] == 0 and chain["cta_busy_us"] == 0


# ---- compile (CI) ----------------------------------------------------------------------------
@pytest.mark.compile
def test_the_frame_build_carries_the_chunk_path():
    """The chunk waits are runtime-selected from the table: the production build at 64 rows
    (norm once, given codes) is the one a chunked schedule runs. It keeps its 48 wgmmas (one
    256-K stage a tile width), no spills, under 8k SASS instructions, and has the chunk path:
    more ld.acquire sites than the walk's (an up-front wait and wait2: the chunk waits of the
    first stages and of the o / down mainloop) and a proxy fence after each chunk wait."""
    from kernels.depth.frame import FrameBuild, FrameKernel, compile_args
    from kernels.depth.frame.projection import CHUNK_WIDTHS
    from schedules.plan import FRAME_ACT_BUFFERS
    from tests.test_depth_frame import assert_small_frame_code
    from workbench.compile import compile_report

    r = compile_report(FrameKernel(FrameBuild(512, 2, False, *FRAME_RING.values(), rows=64,
                                              fused=True, draw="given", norm_once=True)),
                       *compile_args())
    ptx = r.ptx
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n") == 48
    assert ptx.count("ld.acquire.gpu.global.b32") > 4  # (4 without the chunk path, 07a1fb2)
    assert ptx.count("fence.proxy.async.global;") == 2 + FRAME_ACT_BUFFERS + len(CHUNK_WIDTHS)
    assert_small_frame_code(r)


# ---- on the H200 -----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("teacher_forced", [True, False], ids=["given", "greedy"])
@pytest.mark.parametrize("rows", [1, 13, 64])
def test_chunked_frame_bits_equal_the_whole_phase_frame(rows, teacher_forced):
    """The frame with per-chunk waits gives the same bits as with whole-phase waits (codes,
    Talker sum, KV, logits; given codes and greedy draws): the same arithmetic, only the
    waits differ. Every counter (the chunk counters too) at its count, no combine mismatch,
    and a rerun of the chunked frame is bit-identical."""
    from tests.test_depth_frame import _option_outputs, _same

    outs, runs = _option_outputs(rows, teacher_forced, "chunk_waits", 100 + rows, rerun=True)
    for on, run in runs.items():
        assert any(t.wait_chunks > 1 for lst in run.schedule.ctas for t in lst) == on
    assert torch.isfinite(outs[True].logits).all()
    assert _same(outs[False], outs[True])
