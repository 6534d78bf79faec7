"""The depth frame's protocol kernel (kernels/depth/frame_protocol.py): the schedule's waits,
cluster handoffs and signals in one persistent launch, without tile work.

Compile tests (CI) check the instructions the protocol rests on; GPU tests run the real
schedules at 1, 13 and 64 rows and check what a run must leave behind (every counter at its
expected count, every combine slot holding the partner's task) and that the per-task
timestamps respect every dependency edge. The stalled-counter test corrupts one task's expected
count after validation, so the wait can never complete: the kernel must trap within its 2 s
bound and the error must name the counter and the task.
"""
from __future__ import annotations

import functools
import re

import pytest

torch = pytest.importorskip("torch")

from schedules import depth_frame as F  # noqa: E402

ROWS = (1, 13, 64)


@functools.cache
def _build(trace: bool, pages: int = 0):
    from kernels.depth.frame_protocol import FrameProtocol, compile_args
    from workbench.compile import compile_report

    return compile_report(FrameProtocol(512, 2, trace, pages, 4096 if pages else 0),
                          *compile_args())


@pytest.mark.compile
@pytest.mark.parametrize("trace", [False, True])
def test_protocol_compiles_with_the_handoffs_we_meant(trace):
    r = _build(trace)
    ptx = r.ptx
    assert ptx.count("ld.acquire.gpu.global.b32") >= 1, "counter waits acquire"
    assert ptx.count("red.release.gpu.global.add.s32") == 1, "one release signal a task"
    assert ptx.count("st.shared::cluster.u32") == 1, "rank 1's partial into rank 0's slot"
    assert ptx.count("mbarrier.arrive.release.cluster.shared::cluster.b64") == 2
    assert re.search(r"mapa\.shared::cluster\.u32", ptx)
    assert ptx.count("mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64") >= 2
    assert "barrier.cluster.arrive.relaxed;" in ptx and "barrier.cluster.arrive;" in ptx
    # every wait is bounded (counter, partial, slot); the first to time out claims the report
    assert ptx.count("trap;") == 6
    assert ptx.count("atom.global.add.u32") == 4, "3 timeout claims + the mismatch count"
    assert r.frame_bytes == 0
    if r.sass is not None:
        assert r.spill_bytes == 0 and "CALL." not in r.sass


@pytest.mark.compile
def test_weight_streaming_build_adds_the_loader_and_the_page_waits():
    """One 1-D bulk copy a page, issued behind its page_empty wait; tasks wait on page_full:
    two more bounded waits, claiming the report (10 traps), nothing else changes."""
    r, plain = _build(False, 32), _build(False)
    assert r.ptx.count("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes") == 1
    assert plain.ptx.count("cp.async.bulk") == 0
    assert r.ptx.count("trap;") == 10 and r.ptx.count("mbarrier.arrive.expect_tx") == 1
    assert r.frame_bytes == 0
    if r.sass is not None:
        assert r.spill_bytes == 0 and "CALL." not in r.sass


def _schedule(rows: int, **kw) -> F.Schedule:
    return F.build(options=F.FrameOptions(rows=rows, **kw))


def test_a_schedule_validate_rejects_is_refused_before_anything_runs():
    from kernels.depth.frame_protocol import check_launchable

    s = _schedule(64)
    task = next(t for lst in s.ctas for t in lst if t.wait >= 0)
    task.wait_expect += 1  # can never be reached
    with pytest.raises(F.ScheduleError, match=r"waits for \d+ on"):
        check_launchable(s)


@pytest.mark.gpu
def test_launch_is_refused_without_guaranteed_coresidency(monkeypatch):
    from kernels.depth.frame_protocol import FrameRefused, check_launchable

    with pytest.raises(FrameRefused, match="needs 134 SMs"):
        check_launchable(_schedule(64, grid=134, max_coresident=200))
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/mps")
    with pytest.raises(FrameRefused, match="CUDA_MPS_PIPE_DIRECTORY"):
        check_launchable(_schedule(64))


def _edges_respected(s: F.Schedule, stamps) -> list[str]:
    """Every dependency edge: the waiter's "waits done" stamp is not before the moment its
    producer was ready to signal (program order: start after the previous task's end)."""
    bad = []
    ready_of_signal: dict[int, int] = {}
    for c, lst in enumerate(s.ctas):
        for i, t in enumerate(lst):
            if t.signal >= 0:
                ready_of_signal[t.signal] = max(ready_of_signal.get(t.signal, 0), stamps[c][i][1])
    for c, lst in enumerate(s.ctas):
        for i, t in enumerate(lst):
            start, ready, end = stamps[c][i]
            if not start <= ready <= end:
                bad.append(f"CTA {c} task {i}: stamps out of order {stamps[c][i]}")
            if i and start < stamps[c][i - 1][2]:
                bad.append(f"CTA {c} task {i} started before task {i - 1} ended")
            if t.wait >= 0 and ready < ready_of_signal[t.wait]:
                bad.append(f"CTA {c} task {i} passed its wait on {s.counter_names[t.wait]} "
                           "before the counter's last signaller was ready")
            if t.local_dep is not None:
                dc, di = t.local_dep
                if ready < stamps[dc][di][1]:
                    bad.append(f"CTA {c} task {i} passed its cluster wait before CTA {dc} "
                               f"task {di} was ready")
    return bad


def _traced_run_in_order(rows: int, weights: bool = False):
    """One traced launch at ``rows``: the run must leave every counter at its count, no
    combine mismatch, all three stamps of every task (poisoned before) and every edge kept."""
    from kernels.depth.frame_protocol import ProtocolRun

    s = _schedule(rows)
    run = ProtocolRun(s, trace=True, weights=weights)
    run.trace.fill_(-1)
    run.launch()
    run.synchronize()
    assert run.check() == {"counters_at_expected": True, "combine_mismatches": 0}
    stamps = run.task_stamps()
    assert all(v >= 0 for lst in stamps for st in lst for v in st)
    bad = _edges_respected(s, stamps)
    assert not bad, f"{len(bad)} edges broken; first: {bad[:3]}"
    return run


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [pytest.param(r, marks=pytest.mark.fast) if r == 64 else r
                                  for r in ROWS])
def test_protocol_runs_every_task_in_dependency_order(rows):
    _traced_run_in_order(rows)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 64])
def test_protocol_with_weight_streaming_keeps_every_edge(rows):
    """The loader streams every task's tile through the page ring while the tasks wait; the
    protocol's results and order are unchanged, and each task passes its page waits."""
    run = _traced_run_in_order(rows, weights=True)
    assert run.weight_bytes_per_frame > 2e9  # 16 positions x 5 layers + heads + proj


@pytest.mark.gpu
def test_protocol_replays_under_a_cuda_graph():
    from kernels.depth.frame_protocol import ProtocolRun

    run = ProtocolRun(_schedule(64))
    run.launch()  # compile outside the capture
    run.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            run.launch()
    for _ in range(3):
        run.errors.fill_(5)
        run.counters.fill_(-7)  # the graph's own zeroing must run first
        graph.replay()
        run.synchronize()
        assert run.check() == {"counters_at_expected": True, "combine_mismatches": 0}


_STALL = """
from schedules import depth_frame as F
from kernels.depth.frame_protocol import ProtocolRun
s = F.build(options=F.FrameOptions(rows={rows}))
table, counts = F.encode(s)
c, i = next((c, i) for c, lst in enumerate(s.ctas) for i, t in enumerate(lst)
            if t.signal >= 0 and s.counter_names[t.signal] == {counter!r})
table[c, i, F.FIELDS.index("signal")] = -1
run = ProtocolRun(s, table=(table, counts), weights={weights})
run.launch()
run.synchronize()
"""


def _stalled_run(rows: int, counter: str, weights: bool = False) -> str:
    """Output of a fresh process whose launch drops one signal of ``counter`` (a trapped
    kernel ends its CUDA context, so it cannot run in the test process); it must fail."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    script = _STALL.format(rows=rows, counter=counter, weights=weights)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=300, env=env)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-2000:]
    return out


@pytest.mark.gpu
def test_a_stalled_counter_traps_with_its_name_and_task():
    """A signal that never comes (one head tile of the last position: only the last draws
    wait on its counter): the waiters time out after 2 s, the kernel traps and the error names
    the counter, what it holds and the waiting CTA and task."""
    s = _schedule(8)
    waiters = {(c, i) for c, lst in enumerate(s.ctas) for i, t in enumerate(lst)
               if t.wait >= 0 and s.counter_names[t.wait] == "head[l-1,p15]"}
    out = _stalled_run(8, "head[l-1,p15]")
    m = re.search(r"in CTA (\d+), task (\d+), waiting on counter 'head\[l-1,p15\]' \(id \d+\) "
                  r"for (\d+) signals; it holds (\d+)", out)
    assert m, out[-2000:]
    cta, task, want, held = map(int, m.groups())
    assert (cta, task) in waiters and held == want - 1


@pytest.mark.gpu
def test_many_waiters_timing_out_together_leave_one_whole_report():
    """One attention task of layer 2, position 3 never signals: its 128 o tasks (and the
    loaders behind them) time out within microseconds of each other. The first claims the
    report, the others wait for its trap, so the error is one whole report on a counter of the
    stalled chain, short of its count."""
    out = _stalled_run(64, "attn[l2,p3]", weights=True)
    m = re.search(r"in CTA \d+, task \d+, waiting on counter '(\w+)\[l2,p3\]' \(id \d+\) "
                  r"for (\d+) signals; it holds (\d+)", out)
    assert m, out[-2000:]
    assert m.group(1) in ("attn", "o", "gateup", "down") and int(m.group(3)) < int(m.group(2))
