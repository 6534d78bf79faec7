"""Depth frame: the whole CodePredictor frame as one persistent launch beside the fast loop.

The frame kernel (kernels/depth/frame/, issue #26) runs the 16-position, 5-layer depth loop,
its heads and greedy draws, as one launch of 132 CTAs in 2-CTA clusters walking
schedules/depth_frame.py's task lists. Per row count (1, 8, 16, 32, 64), in the same run on the
same random 1.7B weights (bf16) and inputs:

* the frame (FastLoop(depth_kernel=True): the frame kernel's CUDA graph), the fast loop
  (FastLoop: its plan's kernels, one CUDA graph) and the captured reference
  (models.codepredictor.CapturedLoop), greedy, timed by workbench.timing.bench (median of
  replays after warm-up; the 2.5 GB of weights a frame stream from HBM, far beyond the L2);
* GB/s over the frame's weight bytes (the page ring's traffic) and the copy-ceiling floor;
* whether the frame's greedy codes equal the loop's (rows that differ, at near ties);
* from one traced frame (six %globaltimer stamps a task) the critical chain's split: handoff
  (a signaller ready -> the waiter through its counter wait), landing (-> stage 0's
  activations and weight pages), compute (-> the last wgmma), epilogue (the split handoff),
  signal (stores, fence, release) and program order; per-type medians;
* the dispatch rule: the frame at the row counts where it beat the loop (above the measured
  crossover), the loop elsewhere, and the dispatched time per row count;
* the sampled frame (FastLoop(depth_kernel=True, sampler=...): the draw inside the frame,
  ``draw = "sample"``, one embedding task a row) with the Sampler's default settings
  (temperature 0.9, top-k 50) and seeded rows, timed the same way, and its time over the
  greedy frame's (#37's 3 % budget for sampling at 64 rows).

The largest row count's traced frame is drawn beside the summary (``depth-frame.png``: every
CTA's tasks over time, by type).

Headline: ``frame_us``, ``loop_us``, ``dispatch_us`` and ``sampled_frame_us`` per row count,
``sampling_overhead_64`` (the sampled frame's time over the greedy frame's, less 1, at 64 rows).
"""
from __future__ import annotations

import torch

from experiments._common import need_gpu, parser, progress, run_main
from experiments.frame_protocol import _tile_times, critical_chain, stamps_timeline
from kernels.depth.frame import DepthFrame
from models.codepredictor import CapturedLoop, random_weights
from models.fast_loop import FastLoop, FastWeights
from models.sampler import Sampler
from workbench import WorkbenchError
from workbench import results as R
from workbench.plots import frame_timeline_png
from workbench.timing import COPY_CEILING_BPS, bench

ROWS = (1, 8, 16, 32, 64)
NOTES = {
    "prediction": "session 28, before this run (the frame under 8k instructions, #37 item 4; "
                  "notes/depth-frame.md): frame_bits_ab measured 2685 / 2828 / 3524 µs at 1 / "
                  "16 / 64 rows (greedy, launch only), so ~2.7-3.6 ms at 1-64 rows here, "
                  "against the loop's 1.25-1.92 ms: no crossover, the dispatch rule keeps the "
                  "loop at every row count; the sampled frame +1.1-1.4 % at 64 rows (the draw's "
                  "~15 embedding tasks of one row on the chain), inside the 3 % budget.",
    "outcome": "129a606 (H200, --quick): 2773 / 2778 / 2950 / 3217 / 3641 µs at 1 / 8 / 16 / "
               "32 / 64 rows against the loop's 1179-1940 µs (the prediction held); no "
               "crossover, the dispatch rule keeps the loop; sampling +0.1 % at 64 rows. "
               "Earlier: 69d87e0 3993-5791 µs (18.5k instructions of code), ad1357c "
               "5054-8779 µs (notes/depth-frame.md).",
}


def _inputs(rows: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(rows, 2048, device="cuda", generator=g).to(torch.bfloat16)
    g0 = torch.randint(0, 2048, (rows,), device="cuda", generator=g)
    return h, g0


def _case(w, fw, rows: int, quick: bool) -> dict:
    h, g0 = _inputs(rows, seed=rows)
    reps = dict(warmup_ms=50, rep_ms=150 if quick else 400)
    frame = FastLoop(fw, rows, depth_kernel=True)
    if frame.depth_frame is None:
        raise WorkbenchError(f"the frame kernel refused: {frame.depth_kernel_refused}")
    t_frame = bench(lambda: frame(h, g0), **reps)
    out_frame = frame(h, g0)
    seeds = torch.randint(-2**62, 2**62, (rows,), generator=torch.Generator().manual_seed(rows))
    sampler = Sampler(rows, seeds=seeds.tolist(), device="cuda")  # default T 0.9, top-k 50
    sampled = FastLoop(fw, rows, sampler, depth_kernel=True)
    if sampled.depth_frame is None:
        raise WorkbenchError(f"the sampled frame refused: {sampled.depth_kernel_refused}")
    t_sampled = bench(lambda: sampled(h, g0), **reps)  # offsets advance 15 a replay
    del sampled
    codes_frame = out_frame.codes.clone()
    run = frame.depth_frame.run
    run.synchronize()
    checks = run.check()
    weight_bytes = run.weight_bytes_per_frame
    loop = FastLoop(fw, rows)
    t_loop = bench(lambda: loop(h, g0), **reps)
    codes_loop = loop(h, g0).codes.clone()
    captured = CapturedLoop(w, rows)
    t_ref = bench(lambda: captured(h, g0), **reps)
    del captured, loop
    traced = DepthFrame(fw, rows, trace=True)
    traced(h, g0)
    traced.run.synchronize()
    stamps = traced.run.task_stamps()
    s = traced.schedule
    chain = critical_chain(s, stamps)
    t0 = min(st[0] for lst in stamps for st in lst)
    span = (max(st[5] for lst in stamps for st in lst) - t0) / 1e3
    differ = int((codes_frame != codes_loop).any(1).sum())
    out = {"rows": rows, "frame": t_frame.as_dict(), "loop": t_loop.as_dict(),
           "captured_reference": t_ref.as_dict(), "frame_us": t_frame.median_us,
           "loop_us": t_loop.median_us, "captured_us": t_ref.median_us,
           "sampled_frame": t_sampled.as_dict(), "sampled_frame_us": t_sampled.median_us,
           "weight_bytes": weight_bytes,
           "frame_gbps": weight_bytes / t_frame.median_us / 1e3,
           "weight_floor_us": weight_bytes / COPY_CEILING_BPS * 1e6,
           "checks": checks, "rows_with_other_codes_than_loop": differ,
           "traced_span_us": span, "critical_chain": chain,
           # what the traced frame's schedule ran (experiments/frame_schedule.py fits to it)
           "norm_once": s.options.norm_once, "chunk_waits": s.options.chunk_waits,
           "tile_times": _tile_times(s, stamps), "_timeline": stamps_timeline(s, stamps)}
    del traced, frame
    torch.cuda.empty_cache()
    return out


def dispatch(rows_out: list) -> dict:
    """The rule: the frame at row counts from the smallest one from which it beat the loop at
    every larger measured count (the crossover), the loop below; None: the loop everywhere."""
    crossover = None
    for x in sorted(rows_out, key=lambda x: -x["rows"]):
        if x["frame_us"] < x["loop_us"]:
            crossover = x["rows"]
        else:
            break
    return {"frame_from_rows": crossover,
            "dispatch_us": {str(x["rows"]): (x["frame_us"] if crossover is not None and
                                             x["rows"] >= crossover else x["loop_us"])
                            for x in rows_out}}


def _main(argv) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="*", default=list(ROWS))
    args = p.parse_args(argv)
    need_gpu("depth-frame")
    w = random_weights(seed=args.seed, dtype=torch.bfloat16).to(device="cuda")
    fw = FastWeights(w)
    rows_out = []
    for r in args.rows:
        progress(f"rows {r}")
        x = _case(w, fw, r, args.quick)
        rows_out.append(x)
        progress(f"  frame {x['frame_us']:.0f} us ({x['frame_gbps']:.0f} GB/s, floor "
                 f"{x['weight_floor_us']:.0f} us), sampled frame {x['sampled_frame_us']:.0f} us, "
                 f"loop {x['loop_us']:.0f} us, captured "
                 f"reference {x['captured_us']:.0f} us; {x['rows_with_other_codes_than_loop']} "
                 f"rows with other codes; chain {x['critical_chain']}")
    timeline = rows_out[-1].pop("_timeline")
    for x in rows_out[:-1]:
        x.pop("_timeline")
    rule = dispatch(rows_out)
    gates = {"protocol_correct": R.gate(
        all(x["checks"] == {"counters_at_expected": True, "combine_mismatches": 0}
            for x in rows_out), "every counter at its expected count, no combine mismatch"),
        "dispatch_no_slower_than_loop": R.gate(
            all(rule["dispatch_us"][str(x["rows"])] <= x["loop_us"] for x in rows_out),
            "the dispatched path no slower than the fast loop at any measured row count (it "
            "takes the frame only where the frame was faster, so it holds by construction on "
            "the measured row counts; the rule's use at others is what it claims)"),
        "sampling_within_3pct_at_64_rows": R.gate(
            all(x["sampled_frame_us"] <= 1.03 * x["frame_us"] for x in rows_out
                if x["rows"] == 64),
            "the issue's target: sampling adds <= 3 % to the 64-row frame"),
        "frame_64_rows_within_1p5_ms": R.gate(
            all(x["frame_us"] <= 1500 for x in rows_out if x["rows"] == 64),
            "the issue's target: <= 1.5 ms a frame at 64 rows")}
    summary = R.make_summary(
        "depth-frame", parameters={"rows": args.rows, "quick": args.quick, "seed": args.seed},
        measurements=rows_out, gates=gates, seeds={"weights": args.seed},
        headline={"frame_us": {str(x["rows"]): x["frame_us"] for x in rows_out},
                  "loop_us": {str(x["rows"]): x["loop_us"] for x in rows_out},
                  "dispatch_us": rule["dispatch_us"],
                  "frame_from_rows": rule["frame_from_rows"],
                  "sampled_frame_us": {str(x["rows"]): x["sampled_frame_us"] for x in rows_out},
                  "sampling_overhead_64": next((x["sampled_frame_us"] / x["frame_us"] - 1
                                                for x in rows_out if x["rows"] == 64), None)},
        notes=NOTES)
    path = R.write(summary, args.results_dir)
    try:
        png = frame_timeline_png(timeline, f"depth frame kernel, {rows_out[-1]['rows']} rows "
                                 "(one traced run, greedy)", path.with_suffix(".png"))
        progress(f"wrote {png}")
    except WorkbenchError as e:
        progress(f"no timeline plot: {e}")
    print(R.format_table([[x["rows"], f"{x['frame_us']:.0f}", f"{x['loop_us']:.0f}",
                           f"{x['captured_us']:.0f}", rule["dispatch_us"][str(x["rows"])],
                           f"{x['frame_gbps']:.0f}", x["rows_with_other_codes_than_loop"],
                           "/".join(f"{x['critical_chain'][k]:.0f}" for k in
                                    ("handoff_us", "landing_us", "compute_us", "epilogue_us",
                                     "signal_us", "program_order_us")),
                           f"{x['critical_chain'].get('cta_busy_edges', 0)} / "
                           f"{x['critical_chain'].get('cta_busy_us', 0.0):.0f}"]
                          for x in rows_out],
                         ["rows", "frame us", "loop us", "captured us", "dispatch us",
                          "frame GB/s", "rows other codes",
                          "chain handoff/landing/compute/epilogue/signal/order us",
                          "CTA busy steps / us"]))
    print(f"wrote {path} (verdict {summary['verdict']})")
    return 0


def main(argv=None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
