"""Depth-frame schedule: validate the seed's design and compare variants before writing kernels.

Builds the static task lists for the 1.7B CodePredictor at 64 rows on 132 CTAs (2-CTA
clusters, 32 x 4 KB weight ring), validates them, calibrates the simulator's per-task costs from
the split of the seed's 64-row trace (handoffs 470-480 µs, phase-slowest tasks 1620-1700 µs),
checks the prediction against the seed's 1- and 16-row frames (2127, 2192 µs: held out, not
fitted) and its 64-row frame (2218 µs, the fitted trace's own total), then predicts each variant.
Then the simulator calibrated from the frame kernel's own stamps: the projection frame
(results/frame-protocol.json, fitted at 64 rows) and the whole frame (results/depth-frame.json,
fitted at 1 and 64 rows), each predicting its held-out row counts. Each schedule is built and
validated once (the variants that change only the simulation share the seed's, the two
calibrations theirs). ``--quick`` (every gate still checked): only the seed at 64, 1 and 16
rows, calibrated in 12 bisection steps instead of 30, and the whole frame's handoff searched
coarse to fine (every third grid point, then the best one's neighbours: at most 9 evaluations
instead of 13, the same fit where the error is unimodal); the summary's ``quick_changes``
lists them. Progress lines (stderr) mark every long step.
CPU only: the figures are model predictions, not GPU measurements (the stamps they are fitted
to are the H200's).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from experiments._common import parser, progress, run_main
from schedules import depth_frame as D
from schedules import frame_sim as F
from schedules.depth_frame import topological_order
from schedules.plan import FRAME_RING, frame_chunk_waits, frame_norm_once
from workbench import results as R

SEED_MEASURED_US = 2218.0  # 64 rows: the trace calibrate() fits
HELD_OUT_US = {1: 2127.0, 16: 2192.0}  # rows: frame µs, not used to fit
SEED = "seed (per-head waits, split o/down, copies at task starts)"
VARIANTS = {  # name: (FrameOptions changes, SimOptions)
    SEED: ({}, F.SimOptions()),
    "whole-phase attention waits": ({"per_head_waits": False}, F.SimOptions()),
    "per-chunk waits": ({}, F.SimOptions(per_chunk_waits=True)),
    "producer warp (copies as soon as pages free)": ({}, F.SimOptions(producer_warp=True)),
    "producer warp + per-chunk waits": ({}, F.SimOptions(producer_warp=True,
                                                         per_chunk_waits=True)),
    "no o/down split": ({"split_o_down": False}, F.SimOptions()),
    "ring 34 pages (the most that fits)": ({"ring_pages": 34}, F.SimOptions()),
    "seed at 1 row": ({"rows": 1}, F.SimOptions()),
    "seed at 16 rows": ({"rows": 16}, F.SimOptions()),
}
HELD_OUT_VARIANT = {1: "seed at 1 row", 16: "seed at 16 rows"}
QUICK_VARIANTS = (SEED, *HELD_OUT_VARIANT.values())
QUICK_ITERATIONS, FULL_ITERATIONS = 12, 30
CALIBRATION_REPORT_EVERY = 5  # bisection steps between progress lines
NOTES = {
    "prediction": "the seed's own analysis: per-chunk waits ~1.8 ms, a producer warp with two row "
                  "groups 1.5-1.7 ms; frame time nearly independent of rows; whole-phase waits "
                  "slower than per-head waits.",
}


def main(argv=None) -> int:
    return run_main(_main, argv)


def _main(argv) -> int:
    args = parser(__doc__.splitlines()[0]).parse_args(argv)
    iterations = QUICK_ITERATIONS if args.quick else FULL_ITERATIONS
    names = QUICK_VARIANTS if args.quick else tuple(VARIANTS)
    quick_changes = _quick_changes(iterations, names) if args.quick else []
    if quick_changes:
        progress("quick: " + "; ".join(quick_changes))
    built: dict = {}  # FrameOptions -> (schedule, its topological order), each built once
    base = D.FrameOptions()
    seed, seed_order = _frame_schedule(built, base, "the seed schedule")
    progress(f"seed schedule: {len(seed.phases)} phases, {seed.n_tasks} tasks, "
             f"max {max(len(x) for x in seed.ctas)} per CTA; calibrating ({iterations} steps)")

    def on_step(step, total, lo, hi):
        if step % CALIBRATION_REPORT_EVERY == 0 or step == total:
            progress(f"  calibration step {step}/{total}: task scale {(lo + hi) / 2:.5f} "
                     f"± {(hi - lo) / 2:.1e}")

    costs = F.calibrate(seed, iterations=iterations, on_step=on_step, order=seed_order)
    rows, predicted = [], {}
    for name in names:
        changes, so = VARIANTS[name]
        opt = dataclasses.replace(base, **changes)
        s, order = _frame_schedule(built, opt, f"the schedule of {name!r}")
        r = F.simulate(s, costs, so, order=order)
        predicted[name] = round(r.makespan_us, 1)
        rows.append({"variant": name, "frame_options": dataclasses.asdict(opt),
                     "sim_options": dataclasses.asdict(so), "phases": len(s.phases),
                     "tasks": s.n_tasks, **r.as_dict()})
        progress(f"{name}: {r.makespan_us:.0f} µs")
    kernel = _kernel_calibration(built)
    whole = _whole_frame_calibration(built, coarse_to_fine=args.quick)
    err = (predicted[SEED] - SEED_MEASURED_US) / SEED_MEASURED_US
    gates = {f"held_out_{n}_rows_within_10pct": _gate(predicted[v], HELD_OUT_US[n])
             for n, v in HELD_OUT_VARIANT.items()}
    gates["fitted_64_rows_within_10pct"] = _gate(predicted[SEED], SEED_MEASURED_US)
    gates["all_variants_validate"] = R.gate(True, f"{len(names)} schedules, no rule broken")
    if kernel is not None:
        for r, x in kernel["held_out"].items():
            gates[f"frame_kernel_held_out_{r}_rows_within_10pct"] = _gate(x["predicted_us"],
                                                                          x["measured_us"])
    if whole is not None:
        for r, x in whole["held_out"].items():
            gates[f"whole_frame_held_out_{r}_rows_within_10pct"] = _gate(x["predicted_us"],
                                                                         x["measured_us"])
    summary = R.make_summary(
        "frame-schedule",
        parameters={"config": dataclasses.asdict(seed.config), "costs": dataclasses.asdict(costs),
                    "seed_measured_us": SEED_MEASURED_US, "held_out_us": HELD_OUT_US,
                    "quick": args.quick, "quick_changes": quick_changes,
                    "variants": list(names),
                    "calibration_iterations": iterations,
                    "kind": "model prediction on the CPU (no GPU involved)"},
        measurements=rows,
        headline={"phases": len(seed.phases), "predicted_us": predicted,
                  "seed_error": round(err, 4),
                  "frame_kernel_held_out_error": None if kernel is None else {
                      r: x["error"] for r, x in kernel["held_out"].items()},
                  "frame_kernel_calibration": kernel,
                  "whole_frame_held_out_error": None if whole is None else {
                      r: x["error"] for r, x in whole["held_out"].items()},
                  "whole_frame_calibration": whole},
        gates=gates, notes=dict(NOTES, outcome="; ".join(f"{k}: {v:.0f} µs"
                                                        for k, v in predicted.items())),
        quick=args.quick and (f"{len(names)} of {len(VARIANTS)} variants, {iterations} of "
                              f"{FULL_ITERATIONS} calibration steps, coarse-to-fine handoff fit"))
    path = R.write(summary, args.results_dir)
    print(R.format_table([[r["variant"], r["makespan_us"], r["critical_path_us"].get("handoff", 0),
                           r["critical_path_us"].get("weight", 0)] for r in rows],
                         ["variant", "predicted_us", "handoff_us", "weight_us"]))
    print(f"wrote {path} (verdict {R.verdict_text(summary)})")
    if quick_changes:
        print("quick: " + "; ".join(quick_changes))
    return 0 if summary["verdict"] == "pass" else 1


def _quick_changes(iterations: int, names) -> list[str]:
    coarse = len(range(0, len(HANDOFF_GRID), COARSE_STRIDE))
    return [f"{len(names)} of {len(VARIANTS)} variants (the gated ones)",
            f"seed calibration in {iterations} bisection steps, not {FULL_ITERATIONS}",
            f"whole-frame handoff searched coarse to fine ({coarse} grid points, then at most "
            f"{2 * (COARSE_STRIDE - 1)} neighbours of the best, not all {len(HANDOFF_GRID)})"]


def _frame_schedule(built: dict, options: D.FrameOptions, what: str):
    """(schedule, topological order) for ``options``, built and validated once into ``built``
    (variants that change only the simulation, and the two calibrations, share them)."""
    if options not in built:
        progress(f"building {what}")
        s = D.validate(D.build(options=options))
        built[options] = (s, topological_order(s))
    return built[options]


def _kernel_plan(built: dict, rows: int):
    """_frame_schedule of the frame kernel's plan (schedules.plan.FRAME_RING) at ``rows``."""
    return _frame_schedule(built, D.FrameOptions(rows=rows, **FRAME_RING),
                           f"the {rows}-row frame kernel schedule")


def _production_plan(built: dict, rows: int, measurement: dict):
    """_frame_schedule of the whole frame as ``measurement`` (a depth-frame summary's row)
    ran it: its norm_once and chunk_waits, else the plan's rules (summaries made before
    7ba4fc6 do not record them; the one published at 6a58e70 ran the plan's rules of today:
    republish after a rule changes)."""
    norm_once = measurement.get("norm_once", frame_norm_once(rows))
    chunk_waits = measurement.get("chunk_waits", frame_chunk_waits(rows))
    return _frame_schedule(built, D.FrameOptions(rows=rows, norm_once=norm_once,
                                                 chunk_waits=chunk_waits, **FRAME_RING),
                           f"the {rows}-row frame schedule (norm once {norm_once}, chunk waits "
                           f"{chunk_waits})")


# a chunked o task's stamped landing held its wait for the first chunk (the attention tasks
# of its first K stage) in traced runs before session 30's stamp fix (published summaries up
# to 14985c6); its copy is the one down's first stage makes (the same tile width and stage),
# and down's first chunk (gate/up) is done long before it starts, so down's landing stands in
# for both old and new stamps
CHUNKED_LANDING_AS = {"o": "down"}


def _whole_frame_costs(measured: dict) -> dict:
    """{rows: Costs} from the depth-frame summary's traced runs at WHOLE_FIT_ROWS
    (costs_from_stamps; a chunked frame's o tasks with down's landing)."""
    return {r: F.costs_from_stamps(measured[r], landing_as=CHUNKED_LANDING_AS if measured[r].get(
        "chunk_waits", frame_chunk_waits(r)) else None) for r in WHOLE_FIT_ROWS}


KERNEL_FIT_ROWS = 64  # the frame kernel's traced run the costs come from; the rest held out


def _published_stamps(name: str) -> tuple[dict, str]:
    """({rows: measurement} of the published summary ``results/<name>.json`` whose traced runs
    have per-type tile times, its source line); ({}, "") when there is none."""
    path = Path(__file__).resolve().parents[1] / "results" / f"{name}.json"
    try:
        summary = json.loads(path.read_text())
        rows = {m["rows"]: m for m in summary["measurements"] if "tile_times" in m}
        prov = summary["provenance"]
        return rows, f"results/{name}.json ({prov['commit'][:7]}, {prov['gpu']})"
    except (OSError, ValueError, KeyError, TypeError):
        return {}, ""


def _kernel_calibration(built: dict | None = None) -> dict | None:
    """The simulator calibrated from the frame kernel's own stamps (the published
    frame-protocol summary's traced runs of the projection tiles, measured on the H200): costs
    from the 64-row run (schedules.frame_sim.costs_from_stamps), the other row counts
    predicted and compared with their measured frames. None when no summary has the stamps.
    ``built``: schedules already made (:func:`_frame_schedule`), filled as they are made."""
    built = {} if built is None else built
    rows, source = _published_stamps("frame-protocol")
    if KERNEL_FIT_ROWS not in rows:
        return None
    costs = F.costs_from_stamps(rows[KERNEL_FIT_ROWS])
    so = F.SimOptions(producer_warp=True, cluster_wait_at_end=True)
    out = {"source": source, "fit_rows": KERNEL_FIT_ROWS,
           "costs": dataclasses.asdict(costs), "sim_options": dataclasses.asdict(so),
           "held_out": {}}
    for r, m in sorted(rows.items()):
        s, order = _kernel_plan(built, r)
        pred = F.simulate(s, costs, so, order=order)
        entry = {"predicted_us": round(pred.makespan_us, 1),
                 "measured_us": round(m["with_tiles_us"], 1),
                 "error": round(pred.makespan_us / m["with_tiles_us"] - 1, 4),
                 "critical_path_us": pred.critical_path}
        if r == KERNEL_FIT_ROWS:
            out["fitted"] = entry
        else:
            out["held_out"][str(r)] = entry
        progress(f"frame kernel, {r} rows: {entry['predicted_us']:.0f} µs predicted, "
                 f"{entry['measured_us']:.0f} measured ({entry['error']:+.1%})")
    return out


WHOLE_FIT_ROWS = (1, 64)  # the whole frame's traced runs the costs come from; the rest held out
HANDOFF_GRID = tuple(round(0.1 * k, 1) for k in range(0, 13))  # µs, the fitted handoff's range
COARSE_STRIDE = 3  # --quick: every third grid point first, then the best one's neighbours


def _coarse_to_fine(values: tuple, error):
    """The value of ``values`` (ascending) with the least ``error``, trying every
    COARSE_STRIDE-th one and then the best one's neighbours within a stride: the exhaustive
    answer when the error is unimodal over ``values`` (ties: the first, as min())."""
    coarse = range(0, len(values), COARSE_STRIDE)
    best = min(coarse, key=lambda i: error(values[i]))
    near = range(max(0, best - COARSE_STRIDE + 1), min(len(values), best + COARSE_STRIDE))
    return values[min(near, key=lambda i: error(values[i]))]


def _whole_frame_calibration(built: dict | None = None,
                             coarse_to_fine: bool = False) -> dict | None:
    """The simulator calibrated from the whole frame kernel's stamps (the published depth-frame
    summary, measured on the H200): per-type body costs from the traced runs at 1 and 64 rows
    (schedules.frame_sim.costs_from_stamps), linear in rows between them (costs_between); the
    counter handoff fitted on those two row counts (the grid value with the smallest largest
    error there). It is an effective figure, and the fit puts it near zero: the chain's signal
    time (~1-1.5 µs a task: stores, proxy fence, barrier, release), added to every body,
    already holds most of what the measured handoff (the waiter's wait minus the signaller's
    ready, 1.1-1.3 µs a counter edge) holds, so these stamps do not separate the two. The 8,
    16 and 32-row frames are held out: predicted, then compared with their measured frames.
    Each row count's schedule is the one its frame ran (:func:`_production_plan`), and a
    chunked frame's o tasks take down's landing (CHUNKED_LANDING_AS). ``coarse_to_fine``
    (--quick) searches the handoff grid with :func:`_coarse_to_fine`
    instead of trying every point; ``built`` as :func:`_kernel_calibration` takes it. None
    when no summary has the stamps."""
    built = {} if built is None else built
    rows, source = _published_stamps("depth-frame")
    lo, hi = WHOLE_FIT_ROWS
    if lo not in rows or hi not in rows:
        return None
    fitted = _whole_frame_costs(rows)
    so = F.SimOptions(producer_warp=True, cluster_wait_at_end=True)
    predicted: dict = {}  # (rows, handoff) -> SimResult: the fit's runs are reused below

    def predict(r: int, handoff: float) -> F.SimResult:
        if (r, handoff) not in predicted:
            s, order = _production_plan(built, r, rows[r])
            costs = F.costs_between((lo, fitted[lo]), (hi, fitted[hi]), r)
            predicted[r, handoff] = F.simulate(
                s, dataclasses.replace(costs, handoff_us=handoff), so, order=order)
        return predicted[r, handoff]

    errors: dict = {}  # handoff -> the fit's largest error

    def fit_error(handoff: float) -> float:
        if handoff not in errors:
            errors[handoff] = max(abs(predict(r, handoff).makespan_us / rows[r]["frame_us"] - 1)
                                  for r in WHOLE_FIT_ROWS)
            progress(f"  whole-frame fit: handoff {handoff:.1f} µs, worst error at "
                     f"{'/'.join(map(str, WHOLE_FIT_ROWS))} rows {errors[handoff]:.1%}")
        return errors[handoff]

    progress(f"whole frame: fitting the handoff on {len(HANDOFF_GRID)} grid points"
             + (" (coarse to fine)" if coarse_to_fine else ""))
    handoff = (_coarse_to_fine(HANDOFF_GRID, fit_error) if coarse_to_fine
               else min(HANDOFF_GRID, key=fit_error))
    out = {"source": source, "fit_rows": list(WHOLE_FIT_ROWS), "handoff_us": handoff,
           "sim_options": dataclasses.asdict(so), "fitted": {}, "held_out": {}}
    for r, m in sorted(rows.items()):
        pred = predict(r, handoff)
        entry = {"predicted_us": round(pred.makespan_us, 1), "measured_us": round(m["frame_us"], 1),
                 "error": round(pred.makespan_us / m["frame_us"] - 1, 4),
                 "critical_path_us": pred.critical_path}
        (out["fitted"] if r in WHOLE_FIT_ROWS else out["held_out"])[str(r)] = entry
        progress(f"whole frame, {r} rows: {entry['predicted_us']:.0f} µs predicted, "
                 f"{entry['measured_us']:.0f} measured ({entry['error']:+.1%})")
    return out


def _gate(predicted_us: float, measured_us: float) -> dict:
    err = (predicted_us - measured_us) / measured_us
    return R.gate(abs(err) <= 0.10, f"{predicted_us:.0f} µs predicted vs {measured_us:.0f} "
                                    f"measured ({err:+.1%})")


if __name__ == "__main__":
    raise SystemExit(main())
