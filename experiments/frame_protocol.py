"""Frame protocol: the depth frame kernel in parts on the H200, synchronisation alone first.

The depth frame kernel (issue #26) walks schedules/depth_frame.py's per-CTA task lists: 432
phases for the 1.7B CodePredictor, each task waiting on a global counter (ld.acquire spin) or
its cluster pair (DSMEM mbarrier), then signalling (red.release). kernels/depth/frame/kernel.py
runs exactly that walk with no tile work. Its time is the floor the protocol puts under any
frame built on this schedule, and the per-task stamps give the handoff latency the simulator
(schedules/frame_sim.py) should charge per dependency.

Per row count (1, 8, 16, 32, 64): the frame's protocol time (CUDA-graph replay of the counter
reset + the launch, median), the same with every task's weight tile streamed through the
shared-memory page ring by a loader thread (the frame's ~2.6 GB of weight traffic, from a
synthetic buffer laid out like the model's) with its GB/s and the copy-ceiling floor, the schedule's critical path in phases (the longest chain of
dependencies through program order, counters and cluster waits), the time per phase on that
path, and from one traced run the span between the first task's start and the last task's
end, with the median wait of a task. Checks in the same run: every counter at its expected
count, no combine mismatch. Then the frame with its projection tiles
(kernels/depth/frame/projection.py) on random weights, the ring as schedules.plan.FRAME_RING: the
outputs against float64 within the derived bound, the time, and a traced run's critical chain
split into handoff, stage-0 landing, compute, epilogue and signal, with per-type medians; the
largest row count's traced frame is drawn beside the summary (``frame-protocol.png``: every
CTA's tasks over time, by type; the plots extra).
"""
from __future__ import annotations

import statistics

from experiments._common import need_gpu, parser, progress, run_main
from experiments._frame_studies import ProjectionStudy
from kernels.depth.frame import ProtocolRun
from schedules.depth_frame import TYPE_NAMES, FrameOptions, build, topological_order
from schedules.plan import FRAME_RING
from workbench import WorkbenchError
from workbench import results as R
from workbench.plots import frame_timeline_png
from workbench.timing import COPY_CEILING_BPS, bench

ROWS = (1, 8, 16, 32, 64)
NOTES = {
    "prediction": "session 17, before the first run: a handoff through L2 (red.release, then "
                  "an ld.acquire spin in another SM) costs ~1-2 µs, and the schedule's longest "
                  "chain is 592 tasks (432 phases, plus the per-CTA program order), so "
                  "~0.6-0.9 ms a frame at every row count (rows change task counts, not the "
                  "chain). If so, synchronisation alone takes most of the 1.5 ms "
                  "target and the weight floor of ~0.6 ms cannot be reached without "
                  "overlapping phases (splitting the chain per kv head / row group). With the "
                  "weights streamed (2.58 GB a frame at 64 rows; 0.61 ms at the 4.2 TB/s copy "
                  "ceiling): 0.75-1.1 ms, since the loader runs at most one ring (128 KB) "
                  "ahead of a CTA's tasks and stalls while they wait.",
    "outcome": "20e5028 (H200): 603-609 µs a frame at 1-64 rows, 1.02-1.03 µs per task on "
               "the 592-task critical path (prediction right, at its low end). e3337c9: with "
               "the weights 1760-1772 µs, 1.46 TB/s (prediction wrong by ~1.6x: the 128 KB "
               "ring lets a CTA prefetch one ring across each wait; notes/depth-frame.md). "
               "That build let a split tile's rank 1 send before its pages landed (fixed in "
               "a501cb8, not re-run).",
    "prediction_tiles": "session 18, before the first run: with the projection tiles (wgmma "
                        "over the ring's pages, pages freed per K stage) each phase on the "
                        "chain adds its tile: the first activation stage's copy from L2 "
                        "(~1-2 µs) and 4-6 stages of wgmma, retire and named barrier "
                        "(~0.2-0.5 µs each). So 1.3-1.9 ms a frame at 1 row and 1.5-2.8 ms "
                        "at 64, the weights hidden behind the chain; every output within "
                        "the bound.",
    "outcome_tiles": "session 18 (H200): correct at once (every output within the bound, "
                     "reruns bit-identical) but 4.0-4.6 ms with the seed's 4 KB pages "
                     "(d9340ca, 9621aa2): wrong by 2-3x. Ablations (ba84dab, d7ed49d) "
                     "located it: the weight pages land late once the wgmmas hold them, "
                     "since the one-thread loader's per-copy cost caps it at ~11 GB/s an "
                     "SM. 16 KB pages (657793b): 2674-2917 µs, with the weights alone at "
                     "1228-1244 µs (was 1690). notes/depth-frame.md.",
}


def _waited_counters(t) -> list[int]:
    """The counters a task waits on: ``wait`` (a chunked task, FrameOptions.chunk_waits: its
    chunks ``wait .. wait + wait_chunks - 1``) and ``wait2``."""
    out = [t.wait + j for j in range(max(t.wait_chunks, 1))] if t.wait >= 0 else []
    return out + ([t.wait2] if t.wait2 >= 0 else [])


def critical_path(s) -> int:
    """Tasks on the longest dependency chain (program order, counters, cluster waits)."""
    order = topological_order(s)
    depth = {}
    signallers: dict[int, list] = {}
    for c, lst in enumerate(s.ctas):
        for i, t in enumerate(lst):
            if t.signal >= 0:
                signallers.setdefault(t.signal, []).append((c, i))
    for c, i in order:
        t = s.ctas[c][i]
        preds = [(c, i - 1)] if i else []
        for w in _waited_counters(t):
            preds += signallers.get(w, [])
        if t.local_dep is not None:
            preds.append(t.local_dep)
        depth[(c, i)] = 1 + max((depth[p] for p in preds if p in depth), default=0)
    return max(depth.values())


def critical_chain(s, stamps) -> dict:
    """Walk back from the last task to end along whichever dependency released each task
    last (the previous task on its CTA, or its counter's last signaller; a chunked task's
    binding counter: the one of its chunks and wait2 whose last signaller was ready last) and
    split that chain's time: handoff (a signaller ready -> the waiter through its counter wait; with
    program order binding, the wait's own acquire), landing (waited -> stage 0's activations
    and weight pages landed), compute (-> the last wgmma retired: the other stages' waits
    included), epilogue (-> ready: the pair handoff), signal (ready -> signalled: the output
    stores, their proxy fence, the barrier and the red.release, where the next task on the CTA
    waited for it; on a counter edge the signaller's stores fall in the waiter's handoff),
    program order (the gap between a task's end and the next's start). ``signal_tasks``: the
    tasks whose signal span was counted. ``cta_busy_edges`` / ``cta_busy_us``: the program-order
    steps of the chain where the previous task on the CTA signals none of the counters the task
    waits on (its CTA was busy, not its inputs late) and a second lane (#37 item 3's two
    consumer warpgroups) would have let it start earlier, and by how much: from the later of
    its inputs being ready (its latest counter's last signaller; for a chunked task the latest
    chunk, though stage 0 needs only the first) and task i - 2's end, to task i - 1's end.
    Summed along this chain only: once these tasks start earlier another chain may bind, so
    the frame gains at most this much."""
    last_ready: dict[int, tuple] = {}
    for c, lst in enumerate(s.ctas):
        for i, t in enumerate(lst):
            if t.signal >= 0 and stamps[c][i][4] >= last_ready.get(t.signal, (-1,))[0]:
                last_ready[t.signal] = (stamps[c][i][4], c, i)
    node = max(((c, i) for c, lst in enumerate(s.ctas) for i in range(len(lst))),
               key=lambda n: stamps[n[0]][n[1]][5])
    t0 = min(st[0] for lst in stamps for st in lst)  # the launch's first task start
    split = {"handoff_us": 0.0, "landing_us": 0.0, "compute_us": 0.0, "epilogue_us": 0.0,
             "signal_us": 0.0, "program_order_us": 0.0, "cta_busy_us": 0.0}
    busy_edges = 0
    tasks, signal_tasks, count_signal = 0, 0, True
    while node is not None:
        c, i = node
        start, waited, landed, computed, ready, end = stamps[c][i]
        t = s.ctas[c][i]
        tasks += 1
        split["landing_us"] += (landed - waited) / 1e3
        split["compute_us"] += (computed - landed) / 1e3
        split["epilogue_us"] += (ready - computed) / 1e3
        if count_signal:
            split["signal_us"] += (end - ready) / 1e3
            signal_tasks += 1
        by_counter = max((last_ready[w] for w in _waited_counters(t) if w in last_ready),
                         default=None)
        by_order = stamps[c][i - 1][5] if i else None
        if by_counter is not None and (by_order is None or by_counter[0] > by_order):
            split["handoff_us"] += (waited - by_counter[0]) / 1e3
            node, count_signal = (by_counter[1], by_counter[2]), False
        elif by_order is not None:
            split["handoff_us"] += (waited - start) / 1e3
            split["program_order_us"] += (start - by_order) / 1e3
            # with two lanes the task could start once its inputs were ready and task i - 2
            # had ended, unless task i - 1 produces one of its inputs (the data's own order)
            inputs = by_counter[0] if by_counter is not None else t0
            lane_free = stamps[c][i - 2][5] if i >= 2 else t0
            early = by_order - max(inputs, lane_free)
            if early > 0 and s.ctas[c][i - 1].signal not in _waited_counters(t):
                busy_edges += 1
                split["cta_busy_us"] += early / 1e3
            node, count_signal = (c, i - 1), True
        else:
            split["handoff_us"] += (waited - start) / 1e3
            node = None
    split["tasks"], split["signal_tasks"] = tasks, signal_tasks
    split["cta_busy_edges"] = busy_edges
    return split


def stamps_timeline(s, stamps) -> list:
    """Per CTA, its tasks as (type name, start µs, end µs) from the frame's first start
    (workbench.plots.frame_timeline_png draws it)."""
    t0 = min(st[0] for lst in stamps for st in lst)
    return [[(TYPE_NAMES[t.type], (st[0] - t0) / 1e3, (st[5] - t0) / 1e3)
             for t, st in zip(lst, sts)] for lst, sts in zip(s.ctas, stamps)]


def _tile_times(s, stamps) -> dict:
    """Median µs of the tasks of each type: counter wait, stage 0 landing, compute (the rest
    of the mainloop), epilogue (the split handoff; the output stores come after "ready")."""
    by: dict[str, list] = {}
    for c, lst in enumerate(s.ctas):
        for i, t in enumerate(lst):
            st = stamps[c][i]
            by.setdefault(TYPE_NAMES[t.type], []).append(
                [(st[j + 1] - st[j]) / 1e3 for j in range(4)])
    names = ("wait_us", "landing_us", "compute_us", "epilogue_us")
    return {k: {n: statistics.median(x[j] for x in v) for j, n in enumerate(names)}
            for k, v in by.items()}


def _tiles_case(s, quick: bool) -> dict:
    """The frame with the projection tiles (kernels/depth/frame/projection.py) on random weights:
    the checks, the time, and one traced run's critical chain and per-type tile times."""
    study = ProjectionStudy(s, seed=0)
    run = ProtocolRun(s, weights=study.packed, io=study.io())
    run.launch()
    run.synchronize()
    checks = run.check()
    worst = study.check()
    t = bench(run.launch, graph=True, calls_per_graph=5, warmup_ms=20,
              rep_ms=100 if quick else 300).as_dict()
    del run
    traced = ProtocolRun(s, trace=True, weights=study.packed, io=study.io())
    traced.launch()
    traced.synchronize()
    stamps = traced.task_stamps()
    timeline = stamps_timeline(s, stamps)
    out = {"checks_with_tiles": checks, "tiles_within_bound": bool(worst.pop("ok")),
           "tiles_worst_error_ratio": max(worst.values()), "timing_with_tiles": t,
           "with_tiles_us": t["median_us"], "critical_chain": critical_chain(s, stamps),
           "tile_times": _tile_times(s, stamps), "_timeline": timeline}
    del traced, study
    return out


def _case(rows: int, quick: bool) -> dict:
    s = build(options=FrameOptions(rows=rows, **FRAME_RING))
    run = ProtocolRun(s)
    run.launch()
    run.synchronize()
    checks = run.check()
    t = bench(run.launch, graph=True, calls_per_graph=10, warmup_ms=20,
              rep_ms=100 if quick else 300).as_dict()
    streamed = ProtocolRun(s, weights=True)
    streamed.launch()
    streamed.synchronize()
    checks_w = streamed.check()
    tw = bench(streamed.launch, graph=True, calls_per_graph=5, warmup_ms=20,
               rep_ms=100 if quick else 300).as_dict()
    wbytes = streamed.weight_bytes_per_frame
    del streamed
    traced = ProtocolRun(s, trace=True)
    traced.launch()
    traced.synchronize()
    stamps = [st for lst in traced.task_stamps() for st in lst]
    span_us = (max(e for *_, e in stamps) - min(b for b, *_ in stamps)) / 1e3
    waits_us = [(st[4] - st[0]) / 1e3 for st in stamps]
    chain = critical_path(s)
    tiles = _tiles_case(s, quick)
    return {**tiles, "rows": rows, "tasks": s.n_tasks, "phases": len(s.phases), "grid": s.options.grid,
            "critical_path_tasks": chain, "checks": checks, "checks_with_weights": checks_w,
            "timing": t, "timing_with_weights": tw, "with_weights_us": tw["median_us"],
            "weight_bytes": wbytes, "weight_gbps": wbytes / tw["median_us"] / 1e3,
            "weight_floor_us": wbytes / COPY_CEILING_BPS * 1e6,
            "protocol_us": t["median_us"], "us_per_critical_task": t["median_us"] / chain,
            "traced_span_us": span_us, "median_task_wait_us": statistics.median(waits_us),
            "max_task_wait_us": max(waits_us)}


def _main(argv) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="*", default=list(ROWS))
    args = p.parse_args(argv)
    need_gpu("frame-protocol")
    rows = []
    for r in args.rows:
        progress(f"rows {r}")
        rows.append(_case(r, args.quick))
        x = rows[-1]
        progress(f"  {x['protocol_us']:.1f} us a frame, {x['critical_path_tasks']} tasks on "
                 f"the critical path ({x['us_per_critical_task']:.2f} us each), traced span "
                 f"{x['traced_span_us']:.1f} us; with weights {x['with_weights_us']:.1f} us "
                 f"({x['weight_gbps']:.0f} GB/s, floor {x['weight_floor_us']:.0f} us); with "
                 f"projection tiles {x['with_tiles_us']:.1f} us (worst error / bound "
                 f"{x['tiles_worst_error_ratio']:.3f}); chain {x['critical_chain']}")
    timeline = rows[-1].pop("_timeline")  # drawn below, not kept in the summary
    for x in rows[:-1]:
        x.pop("_timeline")
    gates = {"protocol_correct": R.gate(
        all(x[k] == {"counters_at_expected": True, "combine_mismatches": 0}
            for x in rows for k in ("checks", "checks_with_weights", "checks_with_tiles")),
        "every counter at its expected count, no combine mismatch (alone, with weights, with "
        "the projection tiles)"),
        "tiles_within_bound": R.gate(all(x["tiles_within_bound"] for x in rows),
                                     "every projection output within the derived bound of "
                                     "float64 (experiments._frame_studies.projection_error_ratio)")}
    summary = R.make_summary(
        "frame-protocol", parameters={"rows": args.rows, "quick": args.quick},
        measurements=rows, gates=gates, seeds={},
        headline={"protocol_us": {str(x["rows"]): x["protocol_us"] for x in rows},
                  "with_weights_us": {str(x["rows"]): x["with_weights_us"] for x in rows},
                  "with_tiles_us": {str(x["rows"]): x["with_tiles_us"] for x in rows},
                  "us_per_critical_task": {str(x["rows"]): x["us_per_critical_task"]
                                           for x in rows}},
        notes=NOTES)
    path = R.write(summary, args.results_dir)
    try:  # one traced frame with the projection tiles, the largest row count (plots extra)
        png = frame_timeline_png(timeline, f"depth frame with projection tiles, "
                                 f"{rows[-1]['rows']} rows (one traced run; attention and "
                                 "embedding tasks wait and signal only)",
                                 path.with_suffix(".png"))
        progress(f"wrote {png}")
    except WorkbenchError as e:
        progress(f"no timeline plot: {e}")
    print(R.format_table([[x["rows"], x["tasks"], x["critical_path_tasks"],
                           f"{x['protocol_us']:.1f}", f"{x['us_per_critical_task']:.2f}",
                           f"{x['traced_span_us']:.1f}", f"{x['median_task_wait_us']:.2f}",
                           f"{x['with_weights_us']:.1f}", f"{x['weight_gbps']:.0f}",
                           f"{x['weight_floor_us']:.0f}", f"{x['with_tiles_us']:.1f}",
                           "/".join(f"{x['critical_chain'][k]:.0f}" for k in
                                    ("handoff_us", "landing_us", "compute_us", "epilogue_us",
                                     "signal_us", "program_order_us"))]
                          for x in rows],
                         ["rows", "tasks", "critical", "frame us", "us/critical task",
                          "traced span us", "median wait us", "+weights us", "GB/s",
                          "floor us", "+tiles us", "chain handoff/landing/compute/epilogue/signal/order us"]))
    print(f"wrote {path} (verdict {summary['verdict']})")
    return 0


def main(argv=None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
