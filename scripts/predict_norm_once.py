"""The simulator's prediction for the depth frame's norm phase (FrameOptions(norm_once=True);
notes/depth-frame.md, session 21), CPU only: the whole-frame calibration (the published
depth-frame summary's stamps at 1 and 64 rows, costs linear in rows between, handoff 0 as the
fit puts it) for today's schedule against the norm_once schedule with
schedules.frame_sim.norm_once_costs, over the in-tile share ("high" / "low") and the norm task's
body (2 / 3 / 5 µs, plus the chain's signal and 1.1 µs of handoff the fit folds into bodies).

    python3 scripts/predict_norm_once.py [--rows 1 16 64]
"""
import argparse
import dataclasses

from experiments.frame_schedule import WHOLE_FIT_ROWS, _published_stamps
from schedules import depth_frame as D
from schedules import frame_sim as F
from schedules.plan import FRAME_RING

HANDOFF_IN_BODIES_US = 1.1  # the measured counter handoff, which the fit (handoff 0) folds in


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="*", default=[1, 16, 64])
    args = p.parse_args(argv)
    measured, source = _published_stamps("depth-frame")
    lo, hi = WHOLE_FIT_ROWS
    fitted = {r: F.costs_from_stamps(measured[r]) for r in (lo, hi)}
    so = F.SimOptions(producer_warp=True, cluster_wait_at_end=True)
    print(f"calibration: {source}")
    for r in args.rows:
        costs = dataclasses.replace(F.costs_between((lo, fitted[lo]), (hi, fitted[hi]), r),
                                    handoff_us=0.0)
        signal = costs.fixed_us["norm"] - F.NORM_BODY_US
        s0 = D.build(options=D.FrameOptions(rows=r, **FRAME_RING))
        base = F.simulate(s0, costs, so)
        s1 = D.validate(D.build(options=D.FrameOptions(rows=r, norm_once=True, **FRAME_RING)))
        order = D.topological_order(s1)
        cells = []
        for share in ("high", "low"):
            for body in (2.0, 3.0, 5.0):
                c = F.norm_once_costs(costs, r, share,
                                      norm_task_us=body + signal + HANDOFF_IN_BODIES_US)
                x = F.simulate(s1, c, so, order=order)
                cells.append(f"{share} {body:.0f} µs: {x.makespan_us:.0f} "
                             f"({x.makespan_us - base.makespan_us:+.0f})")
        print(f"rows {r}: today {base.makespan_us:.0f} µs (measured "
              f"{measured.get(r, {}).get('frame_us', float('nan')):.0f}); " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
