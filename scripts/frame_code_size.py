"""The depth frame in parts (issue #37; notes/depth-frame.md, session 28): the code-size
hypothesis (does a task body run slower in the whole frame than in a build holding fewer
bodies?) and the ablations that bound what items 3 and 5 can save. Per row count, on the same
random 1.7B weights and inputs (greedy), one DepthFrame's schedule, arena and packed weights
launched as (experiments._frame_studies.FrameStudyKernel):

* ``whole``: the production kernel (every body);
* ``attention``: only the attention body compiled; the projection, norm and embedding tasks
  keep their waits, weight pages, pair handoff and signal, so the walk and the ring run as in
  the whole frame;
* ``projections``: only the six projection bodies;
* ``o_down``: only the o and down bodies (the two that neither normalise nor draw);
* ``no_store``: every body, the projection tiles' output stores left out (what one bulk store
  a tile, item 5, could save at most);
* ``no_mma``: every body, the projection tiles' wgmmas left out (the compute item 3 reshapes);
* ``no_page_wait``: every body, the tiles' waits on their weight pages left out (whether the
  ring runs behind the tasks).

Every arm is a traced build (six stamps a task), timed and traced alike. The ablated and
partial builds' outputs are not the frame's: only their times mean anything; the whole build's
codes are checked against a second run. The stamps do not cost every arm alike: a change to
the tiles' epilogue measured here as -117 µs at 1 row was -7 in untraced builds (session 29's
bulk store, notes/depth-frame.md), so a candidate for production is confirmed untraced
(scripts/ab_frame_option.py) before the plan takes it.

For each: the launch's median µs (workbench.timing.bench), its SASS instruction count (where
nvdisasm is installed: workbench.compile), the traced launch's critical chain and its per-type
medians of counter wait, landing, compute and epilogue, and ``body_us`` (counter waited ->
ready).

    python3 scripts/frame_code_size.py [--rows 64] [--arms whole no_store ...]

Writes the record ``depth-frame-code-size.json`` (workbench.results.write_record) and prints a
table.
"""
import argparse
import statistics

import torch

from configs.codepredictor import QWEN3_TTS_1P7B as CFG
from experiments._frame_studies import FrameStudyRun
from experiments.frame_protocol import _tile_times, critical_chain
from kernels.depth.frame import DepthFrame, compile_args
from models.codepredictor import random_weights
from models.fast_loop import FastWeights
from schedules import depth_frame as F
from schedules.depth_frame import TYPE_NAMES
from workbench.results import provenance_line, write_record
from workbench.timing import alternating_rounds

PROJECTIONS = (F.QKV, F.GATEUP, F.HEAD, F.O, F.DOWN, F.PROJ)
# arm: (bodies compiled (None: all), ablation of the projection tiles)
ARMS = {"whole": (None, ""), "attention": ((F.ATTN,), ""), "projections": (PROJECTIONS, ""),
        "o_down": ((F.O, F.DOWN), ""), "no_store": (None, "no_store"),
        "no_mma": (None, "no_mma"), "no_page_wait": (None, "no_page_wait")}
CHAIN = ("handoff_us", "landing_us", "compute_us", "epilogue_us", "signal_us")
PREDICTION = {  # notes/depth-frame.md, session 28, each written before its run
    "code_size": "if code size is the cause: the attention body (waited -> ready) falls from "
                 "~10 µs in the whole frame to <= 4 µs in the attention-only build (refuted at "
                 ">= 8 µs); o and down compute fall from the whole frame's to within 25 % of "
                 "the projection-study figures (2.2 / 3.7 µs at 64 rows, "
                 "results/frame-protocol.json) in the o/down-only build.",
    "ablations": "64 rows, after item 4 (3.51-3.64 ms): no_store -80..-150 µs (the chain's "
                 "~1.1 µs of signal a task, of which the stores ~0.3-0.5); no_mma -450..-650 "
                 "µs (most of the chain's 980 µs of compute, the stage waits stay); "
                 "no_page_wait within 3 % (the ring runs ahead of the tasks)."}


def _body_times(s, stamps) -> dict:
    """Median µs from counter waited to ready, per task type."""
    by: dict[str, list] = {}
    for c, lst in enumerate(s.ctas):
        for i, t in enumerate(lst):
            st = stamps[c][i]
            by.setdefault(TYPE_NAMES[t.type], []).append((st[4] - st[1]) / 1e3)
    return {k: statistics.median(v) for k, v in by.items()}


def _sass_count(kernel) -> int | None:
    from workbench.compile import compile_report

    try:
        r = compile_report(kernel, *compile_args())
    except Exception as e:  # noqa: BLE001 (a count is optional: say why it is missing)
        print(f"  SASS not counted: {e}")
        return None
    return r.sass_instructions


def _run(frame: DepthFrame, arm: str, trace: bool):
    """The frame's launch as ``arm`` builds it (whole: the production run)."""
    bodies, ablate = ARMS[arm]
    if bodies is None and not ablate:
        return frame.run
    return FrameStudyRun(frame.schedule, trace=trace, weights=frame.run.weights,
                         io=(frame.phases, frame.arena), fused=True, draw=frame.draw,
                         bodies=bodies, ablate=ablate)


def _case(fw, rows: int, arms: list, rounds: int, rep_ms: float, sass: bool) -> dict:
    g = torch.Generator(device="cuda").manual_seed(rows)
    h = torch.randn(rows, CFG.talker_hidden, generator=g, device="cuda").to(torch.bfloat16)
    g0 = torch.randint(0, CFG.talker_vocab, (rows,), generator=g, device="cuda")
    # traced builds throughout (one compile an arm): the stamps cost every arm alike. An arm
    # without the o and down bodies cannot wait per chunk (launch.check_chunk_waits), so then
    # every arm's frame waits per phase
    partial = any(ARMS[a][0] is not None and not {F.O, F.DOWN} <= set(ARMS[a][0]) for a in arms)
    frame = DepthFrame(fw, rows, trace=True, chunk_waits=False if partial else None)
    first = frame(h, g0).codes.clone()
    out = {"rows": rows, "rerun_codes_equal": bool(torch.equal(first, frame(h, g0).codes)),
           "chunk_waits": frame.schedule.options.chunk_waits, "arms": {}}
    runs = {}
    for name in arms:
        run = _run(frame, name, trace=True)
        run.launch()
        run.synchronize()
        check = run.check()
        assert check == {"counters_at_expected": True, "combine_mismatches": 0}, (name, check)
        runs[name] = run
    times = alternating_rounds({name: run.launch for name, run in runs.items()}, rounds,
                               warmup_ms=50, rep_ms=rep_ms)
    for name, run in runs.items():
        frame(h, g0)  # the production run refills the arena; a partial build reuses it
        run.launch()
        run.synchronize()
        stamps = run.task_stamps()
        out["arms"][name] = {
            "bodies": None if ARMS[name][0] is None else [TYPE_NAMES[t] for t in ARMS[name][0]],
            "ablate": ARMS[name][1],
            "frame_us": statistics.median(times[name]), "rounds_us": times[name],
            "sass": _sass_count(run.kernel) if sass else None,
            "tile_times": _tile_times(frame.schedule, stamps),
            "critical_chain": critical_chain(frame.schedule, stamps),
            "body_us": _body_times(frame.schedule, stamps)}
        print(f"rows {rows} {name}: {out['arms'][name]['frame_us']:.0f} µs, SASS "
              f"{out['arms'][name]['sass']}, body µs "
              + ", ".join(f"{k} {v:.2f}" for k, v in sorted(out["arms"][name]["body_us"].items())),
              flush=True)
    del runs, frame
    torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="*", default=[64])
    p.add_argument("--arms", nargs="*", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rep-ms", type=float, default=200)
    p.add_argument("--no-sass", action="store_true", help="skip the SASS counts (compiles)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if "whole" not in args.arms:
        p.error("--arms needs whole (the baseline of every comparison)")
    print(provenance_line())
    w = random_weights(CFG, seed=args.seed, dtype=torch.bfloat16).to(device="cuda")
    fw = FastWeights(w)
    cases = [_case(fw, r, args.arms, args.rounds, args.rep_ms, not args.no_sass)
             for r in args.rows]
    path = write_record("depth-frame-code-size", {
        "parameters": vars(args), "prediction": PREDICTION, "cases": cases},
        seeds={"weights": args.seed})
    types = ("attn", "qkv", "o", "gateup", "down", "head", "norm", "embed")
    print(f"{'rows':>4} {'arm':>12} {'µs':>6} {'SASS':>6}  body µs ({', '.join(types)})  chain "
          f"({'/'.join(k[:-3] for k in CHAIN)})")
    for x in cases:
        for name, a in x["arms"].items():
            c = a["critical_chain"]
            print(f"{x['rows']:>4} {name:>12} {a['frame_us']:>6.0f} {str(a['sass']):>6}  "
                  + " ".join(f"{a['body_us'].get(t, float('nan')):5.2f}" for t in types)
                  + "  chain " + "/".join(f"{c[k]:.0f}" for k in CHAIN))
    print(f"wrote {path}")
    return 0 if all(x["rerun_codes_equal"] for x in cases) else 1


if __name__ == "__main__":
    raise SystemExit(main())
